"""Nothing a user waits on is silent: a command's start (imports, opening the run) shows a spinner on a
terminal and a line without one; a training bar names what it waits on between steps (compiling, evaluating, the
controller's update) and, without a terminal, prints a line when that takes long. (Decoding's compiles per prompt
length: tests/test_decode.py.)"""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time

import numpy as np
from rich.console import Console

from ssmlm.progress import activity, phase, progress_bar


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=120)


def plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=120), out


def shown(bar) -> str:
    con = Console(width=120, record=True, force_terminal=True, file=io.StringIO())
    con.print(bar.get_renderable())
    return con.export_text()


def test_a_phase_names_the_wait_on_a_terminal():
    with progress_bar(False, "loss", console=terminal()) as bar:
        task = bar.add_task("pretrain", total=6, loss="-")
        bar.update(task, completed=2)
        with phase(bar, task, "evaluating") as now:
            assert "pretrain: evaluating" in shown(bar) and "2/6" in shown(bar)
            now.set("controller update (reward model)")
            assert "pretrain: controller update (reward model)" in shown(bar)
        assert bar.tasks[0].description == "pretrain"
        now.set("late")  # work dropped on a Ctrl-C may still call it: nothing changes
        assert bar.tasks[0].description == "pretrain"


def test_a_slow_phase_prints_a_line_without_a_terminal():
    con, out = plain()
    with progress_bar(False, console=con, log_every=1000) as bar:
        task = bar.add_task("pretrain", total=6)
        bar.update(task, completed=2)
        with phase(bar, task, "compiling", after=0.05):
            pass  # quick: no line
        with phase(bar, task, "evaluating", after=0.2) as now:
            time.sleep(0.4)
            now.set("controller update")  # quick after this: its own line never comes
    lines = out.getvalue().splitlines()
    assert lines[0] == "pretrain 2/6: evaluating…", lines
    assert lines[1].startswith("pretrain 2/6: evaluating took 0.") and lines[1].endswith(" s"), lines
    assert len(lines) == 2, lines
    quiet = io.StringIO()
    with progress_bar(True, console=Console(file=quiet, force_terminal=False)) as bar:
        with phase(bar, bar.add_task("pretrain", total=6), "evaluating", after=0.0):
            time.sleep(0.1)
    assert quiet.getvalue() == ""


def test_a_start_spinner_steps_aside_while_bars_and_spinners_are_up():
    con = terminal()
    with activity("pretrain: loading jax", console=con, background=True) as start:
        assert start.live.is_started
        with progress_bar(False, console=con) as bar:
            bar.add_task("tokenizing", total=3)
            assert not start.live.is_started  # one live display at a time: the bar's
        assert start.live.is_started
        with activity("loading runs/x", console=con):
            assert not start.live.is_started
        start.label = "pretrain: preparing the data and the model"
        assert start.live.is_started
        start()  # the run's loop began: it does not come back after its bar
        with progress_bar(False, console=con):
            pass
        assert not start.live.is_started
    assert "pretrain: loading jax 0:00:00" in con.file.getvalue()


def test_a_start_prints_its_lines_without_a_terminal():
    con, out = plain()
    with activity("pretrain: loading jax", console=con, background=True, plain_after=0.1) as start:
        time.sleep(0.3)
        start.label = "pretrain: preparing the data and the model"
    assert out.getvalue().splitlines() == ["pretrain: loading jax…", "pretrain: preparing the data and the model…"]
    con, out = plain()
    with activity("analyze mixture: working", console=con, background=True):
        pass  # a quick command (or a quick refusal) stays without it
    with activity("pretrain: loading jax", quiet=True, console=con, background=True, plain_after=0.0):
        time.sleep(0.2)
    with activity("pretrain: loading jax", console=con, background=True, plain_after=None):
        time.sleep(0.2)
    assert out.getvalue() == ""


IMPORT_WATCHER = """
import sys


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    sys.stderr.write("imported jax\\n")
                    sys.stderr.flush()

                spec.loader.exec_module = exec_module
                return spec
        return None


sys.meta_path.insert(0, Watch())
"""


def test_a_command_says_it_is_starting_before_its_imports_end(tmp_path, corpus_file):
    """A fresh `ssmlm pretrain` spends seconds importing jax and flax before it can say anything of its run: its
    first line comes at once, not after them (here --dry-run, which then plans the model and exits)."""
    from conftest import tiny_recipe

    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # A watcher on the import system says on stderr when jax's import has ended: the command's first line must come
    # before it (an order of events, not a time, which a busy machine would upset).
    watch = tmp_path / "watch"
    watch.mkdir()
    (watch / "sitecustomize.py").write_text(IMPORT_WATCHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(watch), root])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssmlm", "pretrain", str(recipe), "--dry-run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    first = proc.stderr.readline()
    out, rest = proc.communicate(timeout=300)
    assert proc.returncode == 0, rest
    assert first == "pretrain --dry-run: loading jax…\n", first + rest
    assert "imported jax\n" in rest  # the watcher worked, and after the first line
    assert "dry run" in out


def read_pty(args: list[str], timeout: float = 60.0) -> str:
    """What a command writes to a pseudo-terminal (stdout and stderr both), to its end."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the command closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=10)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def test_output_on_the_same_terminal_is_not_drawn_over():
    """A command's result written (click's echo) while its start spinner is up: the spinner ends first, so the
    result starts on a line of its own (click writes past rich's own redirection, to the terminal's buffer)."""
    script = (
        "import time, typer\n"
        "from ssmlm.progress import activity\n"
        "with activity('analyze x: working', background=True):\n"
        "    time.sleep(0.5)\n"
        "    typer.echo('{\"result\": 1}')\n"
        "    time.sleep(0.3)\n"
        "typer.echo('after')\n"
    )
    out = read_pty([sys.executable, "-c", script])
    assert "analyze x: working 0:00:00" in out, out  # the spinner was up
    before = out[: out.index('{"result": 1}')]
    assert before.endswith(("\x1b[2K", "\n")), repr(before[-80:])  # its line was erased: the result is not after it
    assert "\r\n" + "after" in out.replace("\x1b[2K", ""), repr(out[-200:])


class SlowToyController:
    """A controller whose update takes a while (as Birdie's reward model does, 14-16 s on 2 CPU cores)."""

    update_label = "toy update"

    def init_state(self):
        return {"weight": np.float32(0.5)}

    def update(self, state, step, metrics):
        time.sleep(0.3)
        return {"weight": np.float32(state["weight"] * 0.9)}


class SlowEnd:
    def on_end(self, summary):
        time.sleep(0.3)


def test_training_names_what_it_waits_on(tmp_path, corpus_file, monkeypatch, capsys):
    """Without a terminal, a training run says when it compiles its step, evaluates, updates its controller and
    finishes, once each takes longer than progress.SLOW_START_S (2 s; here 0.1 s)."""
    import dataclasses

    from conftest import tiny_recipe

    from ssmlm.data.loader import Batches, TokenRows
    from ssmlm.data.preprocess import preprocess, read_metadata
    from ssmlm.models import build_mlm, with_vocab
    from ssmlm.objectives import build
    from ssmlm.recipe import ObjectiveConfig, load_recipe
    from ssmlm.train import loop
    from ssmlm.train.parts.mlm import token_eval_data

    monkeypatch.setattr("ssmlm.progress.bars.SLOW_START_S", 0.1)
    path = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 4, "eval_every": 2, "log_every": 2})
    recipe = load_recipe(str(path))
    data_dir = preprocess(recipe.data, recipe.seq_len, quiet=True)
    meta = read_metadata(data_dir)
    recipe = dataclasses.replace(recipe, model=with_vocab(recipe.model, meta["vocab_size"]))
    obj = build(ObjectiveConfig(masking="dynamic"), meta["special_ids"], meta["vocab_size"], 32, 0)
    sampler = Batches(TokenRows(data_dir, "train"), recipe.train.batch_size, 0)
    batches = lambda s, _: obj.train_batch(sampler(s), s, None)  # noqa: E731
    stage = loop.Stage(
        "pretrain",
        build_mlm(recipe.model, 0),
        obj.loss,
        batches,
        4,
        recipe.train.batch_size * 32,
        obj.eval,
        token_eval_data(data_dir, obj, 8, 2),
        obj.score,
        hooks=[SlowEnd()],
        controller=SlowToyController(),
    )
    capsys.readouterr()
    loop.run(stage, recipe, tmp_path / "run")
    lines = capsys.readouterr().err.splitlines()
    for line in (
        "pretrain 0/4: compiling the training step…",
        "pretrain 2/4: evaluating…",
        "pretrain 2/4: toy update…",
        "pretrain 4/4: finishing (plots)…",
    ):
        assert line in lines, "\n".join(lines)
    took = [line for line in lines if " took " in line]
    assert any(line.startswith("pretrain 2/4: toy update took 0.") for line in took), took


def test_a_hidden_bar_leaves_the_start_spinner_up():
    """Work that runs its bar hidden (progress off) is still waited on: the start spinner stays."""
    con = terminal()
    with activity("evaluate: opening runs/x", console=con, background=True) as start:
        with progress_bar(True, console=con) as bar:
            bar.add_task("phone books", total=3)
            assert start.live.is_started
