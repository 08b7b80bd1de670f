"""Progress bars (ssmlm.progress): whole columns at 80 columns, an ETA that leaves compilation out, and plain lines
on a time cadence where there is no terminal."""

from __future__ import annotations

import io
import random
import re
import time

import pytest
from rich.console import Console

from ssmlm.progress import Clock, activity, phase, progress_bar

TRAIN_FIELDS = ("loss", "lr", "tok/s", "mfu")  # what the training loop shows (ssmlm.train.loop)


def render(bar, width: int) -> list[str]:
    con = Console(width=width, record=True, force_terminal=True, file=io.StringIO())
    con.print(bar.get_renderable())
    return con.export_text().splitlines()


def training_bar(total: int, done: int, width: int):
    con = Console(width=width, force_terminal=True, file=io.StringIO())
    bar = progress_bar(False, *TRAIN_FIELDS, console=con)
    task = bar.add_task("pretrain", total=total, loss="-", lr="-", mfu="-", **{"tok/s": "-"})
    for step in range(1, done + 1):
        bar.update(task, completed=step)
    bar.update(task, loss="3.2104", lr="1.23e-03", mfu="41.2%", **{"tok/s": "1,234,567"})
    return bar


def test_training_bar_fits_80_columns_whole():
    for total, done in ((60, 59), (100_000, 59_999), (2_000_000, 3)):
        for width in (80, 60, 120):
            lines = render(training_bar(total, done, width), width)
            assert lines and all(len(line) <= width for line in lines), lines
            text = "\n".join(lines)
            assert "…" not in text, text  # no column cut ("59/…", "0:0…"): columns are left out whole
            assert f"{done}/{total}" in text and re.search(r"eta (\d+:\d\d:\d\d|-:--:--)", text), text
            assert "loss 3.2104" in text, text  # the fields go after the percentage, the elapsed time and the rate
        wide = "\n".join(render(training_bar(total, done, 200), 200))
        assert all(f in wide for f in ("loss 3.2104", "lr 1.23e-03", "1,234,567 tok/s", "mfu 41.2%", "━")), wide


def test_eta_leaves_compilation_out():
    """Two slow first steps (compiling), then 0.1 s a step: the ETA is the remaining steps at 0.1 s, not at the
    average that compilation inflates."""
    clock = Clock(added=0.0, start=0, skip=2)
    clock.see(1, 20.0)  # the first step compiles for 20 s
    clock.see(2, 23.0)  # the second recompiles a part
    assert clock.eta(2, 100) is None  # unknown until a second of steps is measured
    for step in range(3, 43):
        clock.see(step, 23.0 + 0.1 * (step - 2))
    assert clock.eta(42, 100) == pytest.approx(58 * 0.1)
    assert clock.rate() == pytest.approx(10.0)
    assert clock.eta(100, 100) == 0.0


class FakeTime:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def eta_of(bar) -> float | None:
    """The ETA the bar shows, in seconds (None: "-:--:--")."""
    text = "\n".join(render(bar, 200))
    h, m, s = re.search(r"eta (\S+)", text).group(1).split(":")
    return None if h == "-" else int(h) * 3600 + int(m) * 60 + int(s)


def simulate(durations: list[float], burst: int, evaluate_at: int | None = None):
    """A training bar driven by simulated time: a 30 s compile (a phase), then steps of ``durations`` whose count
    moves ``burst`` at a time (dispatched together, shown when the device is done); at step ``evaluate_at`` a
    3-minute evaluation (a phase). The ETA shown (seconds) after each move, and those shown during the evaluation."""
    fake = FakeTime()
    bar = progress_bar(
        False, "loss", console=Console(width=200, force_terminal=True, file=io.StringIO()), get_time=fake
    )
    task = bar.add_task("pretrain", total=len(durations), loss="-")
    with phase(bar, task, "compiling the training step"):
        fake.now += 30.0
    shown, held, step = [], [], 0
    while step < len(durations):
        fake.now += sum(durations[step : step + burst])
        step = min(step + burst, len(durations))
        bar.update(task, completed=step)
        shown.append((step, eta_of(bar)))
        if step == evaluate_at:
            with phase(bar, task, "evaluating"):
                for _ in range(36):
                    fake.now += 5.0
                    held.append(eta_of(bar))
                assert "pretrain: evaluating" in "\n".join(render(bar, 200))
    return shown, held


def assert_steady(shown, durations, error: float, jump: float):
    """From step 20 until the last tenth, the ETA is within ``error`` of the true time left; from step 40 no move
    changes the time it foresees the end at by more than ``jump`` of the time left."""
    total = len(durations)
    for (step, eta), (before_step, before) in zip(shown[1:], shown, strict=False):
        true = sum(durations[step:])
        if 20 <= step <= 0.9 * total:
            assert abs(eta - true) <= error * true, (step, eta, true)
        if before_step >= 40 and step <= 0.9 * total:
            foreseen = before - sum(durations[before_step:step])  # the ETA had it not changed its mind
            assert abs(eta - foreseen) <= jump * before + 1, (step, eta, foreseen)
    assert shown[-1] == (total, 0)


def test_eta_is_steady_through_noise_bursts_stalls_and_an_evaluation():
    """400 simulated steps of 0.5-1.5 s on a busy machine, shown eight at a time (asynchronous dispatch), two stalls
    of 20 s (another process) and a 3-minute evaluation at step 104: the ETA stays within 20% of the true time
    left, no move changes it by more than a quarter, and it holds still through the evaluation."""
    rng = random.Random(0)
    durations = [20.0 if i in (150, 300) else rng.uniform(0.5, 1.5) for i in range(400)]
    shown, held = simulate(durations, burst=8, evaluate_at=104)
    assert_steady(shown, durations, error=0.2, jump=0.25)  # a stall moves it once: it may come again
    before = next(eta for step, eta in shown if step == 104)
    assert held == [before] * 36  # held through the evaluation: not recomputed, not growing


def test_eta_counts_a_slowness_that_recurs():
    """Steps of 0.05 s with a 1 s wait every tenth (a sync at each logging step), shown one at a time or in bursts
    of eight: the waits are part of the pace (a median of step times would leave them out, 3x too hopeful)."""
    durations = [1.0 if i % 10 == 9 else 0.05 for i in range(600)]
    for burst in (1, 8):
        shown, _ = simulate(durations, burst)
        assert_steady(shown, durations, error=0.2, jump=0.15)


def test_a_rate_field_reads_value_then_unit_and_the_count_rate_can_go():
    con = Console(width=120, force_terminal=True, file=io.StringIO())
    bar = progress_bar(False, "tokens/s", console=con, rate=False)
    task = bar.add_task("tokenizing (MB)", total=10.0, **{"tokens/s": "-"})
    assert "tokens/s" not in "\n".join(render(bar, 120))  # not "- tokens/s" before it is measured
    bar.update(task, completed=3.0, **{"tokens/s": "294,129"})
    text = "\n".join(render(bar, 120))
    assert "294,129 tokens/s" in text and "tokens/s 294" not in text and "-/s" not in text, text


def test_plain_lines_without_a_terminal_come_on_time():
    out = io.StringIO()
    con = Console(file=out, width=80, force_terminal=False)
    t0 = time.monotonic()
    with progress_bar(False, "loss", console=con, log_every=0.3) as bar:
        task = bar.add_task("pretrain", total=20, loss="-")
        for step in range(1, 21):
            time.sleep(0.05)
            bar.update(task, completed=step, loss=f"{1 / step:.3f}")
    took = time.monotonic() - t0
    lines = out.getvalue().splitlines()
    # one every 0.3 s of a 1 s loop, and the last step's; never a bar
    assert 3 <= len(lines) <= took / 0.3 + 2, lines
    assert all(re.match(r"pretrain +\d+/20 .*loss .* eta ", line) for line in lines), lines
    assert lines[-1].startswith("pretrain 20/20") and "━" not in out.getvalue()

    quick = io.StringIO()  # a short loop at the default 30 s cadence prints nothing
    with progress_bar(False, console=Console(file=quick, force_terminal=False)) as bar:
        task = bar.add_task("books", total=5)
        for _ in range(5):
            bar.advance(task)
    quiet = io.StringIO()
    with progress_bar(True, console=Console(file=quiet, force_terminal=False), log_every=0.0) as bar:
        task = bar.add_task("books", total=5)
        for _ in range(5):
            bar.advance(task)
    assert quick.getvalue() == quiet.getvalue() == ""


def test_first_update_after_a_slow_start_gets_a_line():
    out = io.StringIO()
    with progress_bar(False, console=Console(file=out, width=80, force_terminal=False)) as bar:
        task = bar.add_task("evaluating", total=3)
        time.sleep(2.1)  # compiling
        bar.advance(task)
        bar.advance(task)
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]
    assert out.getvalue().startswith("evaluating 1/3")


def test_activity_spins_on_a_terminal_only():
    term = io.StringIO()
    with activity("loading", console=Console(file=term, force_terminal=True, width=80)) as done:
        time.sleep(0.3)
        done()
    assert "loading 0:00:00" in term.getvalue()
    plain = io.StringIO()
    with activity("loading", console=Console(file=plain, force_terminal=False)):
        pass
    assert plain.getvalue() == ""
