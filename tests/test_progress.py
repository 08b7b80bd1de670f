"""Progress bars (ssmlm.progress): whole columns at 80 columns, an ETA that leaves compilation out, and plain lines
on a time cadence where there is no terminal."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from ssmlm.progress import Clock, activity, progress_bar

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
        assert all(f in wide for f in ("loss 3.2104", "lr 1.23e-03", "tok/s 1,234,567", "mfu 41.2%", "━")), wide


def test_eta_leaves_compilation_out():
    """Two slow first steps (compiling), then 0.1 s a step: the ETA is the remaining steps at 0.1 s, not at the
    average that compilation inflates."""
    clock = Clock(added=0.0, start=0, skip=2)
    clock.see(1, 20.0)  # the first step compiles for 20 s
    clock.see(2, 23.0)  # the second recompiles a part
    for step in range(3, 13):
        clock.see(step, 23.0 + 0.1 * (step - 2))
    assert clock.eta(12, 100, now=24.0) == 88 / 10.0  # 10 steps in 1 s since the mark
    assert clock.rate(24.0) == 10.0
    assert clock.eta(12, 100, now=26.0) == 88 / (10 / 3.0)  # waiting on the device reads as a slower rate
    assert Clock(0.0, 0, 2).eta(0, 100, now=5.0) is None  # unknown until measured
    assert clock.eta(100, 100, now=30.0) == 0.0


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
