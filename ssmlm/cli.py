"""The `ssmlm` command line. Heavy libraries (jax, flax, datasets) are imported inside commands so that
`ssmlm --help` answers at once."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import inspect
import json
import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer
from typer.core import TyperGroup

from ssmlm import checks, paths, staging
from ssmlm.data.finetune_task import check_encoder_task, check_lm_task, task_name, with_task_options
from ssmlm.data.lm_tasks import default_recipe, evaluation_tasks, finetuning_tasks
from ssmlm.data.sources import check_inputs
from ssmlm.data.tasks import TASKS
from ssmlm.display.printouts import (
    print_best_validation,
    print_plan,
    print_result,
    print_summary,
    write_result,
    write_seeds,
)
from ssmlm.errors import Interrupted, UserError
from ssmlm.models.config import is_lm
from ssmlm.objectives.config import MIXTURES
from ssmlm.run_recipe import check_max_tokens, run_arch

# What Typer raises for a command-line mistake: Click's ClickException (recent Typer versions vendor Click).
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class OneLineErrors(TyperGroup):
    """Command-line mistakes (unknown option, missing or malformed value) as one line, like every other user
    error, instead of Click's usage text and framed box."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        argv = kwargs.get("args", args[0] if args else None)
        _COMMAND_LINE[:] = ["ssmlm", *(sys.argv[1:] if argv is None else argv)]  # for the line after a Ctrl-C
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except _CLICK_ERROR as e:
            msg = e.format_message().strip().rstrip(".")
            if msg:  # (none when no arguments asked for the help, which is already printed)
                ctx = getattr(e, "ctx", None)
                _err(msg + (f"; see '{ctx.command_path} --help'" if ctx is not None else ""))
            sys.exit(e.exit_code)
        except typer.Abort:  # Click's word for a Ctrl-C outside a command
            _interrupted("stopped; run the same command again")
            sys.exit(130)
        # Outside standalone mode Click returns a command's exit code (typer.Exit) instead of exiting with it.
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Pretrain, length-extend, finetune, evaluate and analyse the models of three papers: BiGS and its "
    "ablations (MLM encoders, 'Pretraining Without Attention'), gMLP/aMLP (MLM encoders, 'Pay Attention to "
    "MLPs'), and Birdie's language models (Gated SSM, Gated SSM+, Hawk, Transformer) trained on mixtures of objectives "
    "chosen by a reward-driven controller. 'ssmlm recipes' lists the paper setups.",
)
analyze_app = typer.Typer(
    no_args_is_help=True,
    help="The three papers' figures and tables from trained runs (PNG/SVG plus CSV/JSON in RUN/analysis), "
    "and one HTML report of one or more runs.",
)
app.add_typer(analyze_app, name="analyze")

SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a recipe field, e.g. --set model.hidden_size=256 (repeatable)."),
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Run name (directory under train.out_dir).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
DryOpt = Annotated[
    bool, typer.Option("--dry-run", help="Validate, build the model abstractly, print size/FLOPs/memory, exit.")
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="With --dry-run: compile the training step for a TPU slice or GPU node from this machine (e.g. "
        "v5e:4x4, v5p-8, h100-80gb:8, a100-80gb:4x5; paper: the hardware the recipe's paper used) and report "
        "memory per chip, fit, collectives and a roofline estimate. Needs pip install 'ssmlm\\[tpu]' / "
        "'ssmlm\\[gpu-aot]'.",
        # \\[ : rich (typer's help renderer) would read [tpu] as a style tag and drop it
    ),
]
FitOpt = Annotated[
    bool,
    typer.Option(
        "--fit",
        help="With --target: search train.grad_accum, model.remat and the mesh for the setting that fits with the "
        "best estimated throughput, and print it as --set overrides.",
    ),
]
TargetJsonOpt = Annotated[bool, typer.Option("--json", help="With --target: print the report as JSON.")]
StopOpt = Annotated[
    int | None,
    typer.Option(
        "--stop-after", help="Stop after N more steps with a checkpoint (time-limited job slots); re-run to go on."
    ),
]


_COMMAND_LINE: list[str] = []  # this invocation's arguments, as the command that runs it again


def _err(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)


def _interrupted(msg: str) -> None:
    """After Ctrl-C: what was kept, and the exact command that goes on from there."""
    again = f": {shlex.join(str(a) for a in _COMMAND_LINE)}" if _COMMAND_LINE else ""
    typer.echo(f"interrupted: {msg}{again}", err=True)


UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOSPC}


def user_errors(fn):
    """Print a user's mistake as one line and exit non-zero, with no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Interrupted as e:
            _interrupted(str(e))
            raise typer.Exit(130) from None
        except UserError as e:
            _err(str(e))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            _interrupted("stopped; run the same command again")
            raise typer.Exit(130) from None
        except OSError as e:  # a place that could not be checked beforehand: still one line, not a traceback
            if e.errno not in UNWRITABLE or not e.filename:
                raise
            _err(f"cannot write '{e.filename}': {e.strerror}")
            raise typer.Exit(2) from None

    wrapper.__doc__ = flowing(fn.__doc__)
    return wrapper


def flowing(doc: str | None) -> str | None:
    """A docstring as --help shows it: typer keeps every line break, so a paragraph wrapped at the source's width
    would break mid-sentence on an 80-column terminal. Lines of a paragraph are joined; an 'Example:' line keeps
    its own line."""
    if not doc:
        return doc
    paragraphs = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines: list[str] = []
        for line in para.splitlines():
            if lines and not line.startswith("Example:"):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _load(recipe: str | None, overrides: list[str] | None, default: str):
    from ssmlm.recipe import load_recipe

    return load_recipe(recipe, overrides or [], default=default)


def _run_dir(recipe, name: str | None) -> Path | str:
    """RUN under train.out_dir: a local path, or a gs:// URL (never a local folder named 'gs:')."""
    if paths.is_remote(recipe.train.out_dir):
        return paths.join(recipe.train.out_dir, name or recipe.name)
    return Path(recipe.train.out_dir) / (name or recipe.name)


def _check_run_dir(recipe, run_dir: Path | str) -> None:
    if paths.is_remote(run_dir):
        paths.check_url(str(run_dir), f"train.out_dir '{recipe.train.out_dir}': run directory")
    else:
        checks.output_dir(run_dir, f"train.out_dir '{recipe.train.out_dir}': run directory")


@contextlib.contextmanager
def _in_bucket(run_dir: Path | str, write: bool = True):
    """A run directory to work in: itself, or a gs:// run staged in a local folder (ssmlm.staging: its records
    uploaded by process 0 as they change and at the end, the folder removed; its checkpoints stay in the bucket)."""
    if not paths.is_remote(run_dir):
        yield Path(run_dir)
        return

    def lead() -> bool:
        import jax

        return write and jax.process_index() == 0

    with staging.staged(str(run_dir), lead=lead) as local:
        yield local


def _check_training_options(name: str | None, stop_after: int | None) -> None:
    checks.option("--name", name, checks.RUN_NAME)
    checks.option("--stop-after", stop_after, checks.POSITIVE)


def _check_target_options(dry_run: bool, target: str | None, fit: bool, as_json: bool) -> None:
    """--target, --fit and --json go with --dry-run; the target's name is checked before jax loads."""
    if target is None:
        if fit or as_json:
            raise UserError(f"{'--fit' if fit else '--json'} goes with --target NAME (and --dry-run)")
        return
    if not dry_run:
        raise UserError("--target compiles for the target without training: add --dry-run")
    if target != "paper":
        from ssmlm.targets import parse_target

        parse_target(target)


def _dry_run_on_target(command: str, r, make_work, target: str, fit: bool, as_json: bool, quiet: bool) -> None:
    """`--dry-run --target`: the step compiled for the target (``make_work()``: ssmlm.train.aot.Work), reported as a
    table or JSON; ``fit``: the search for a setting that fits (ssmlm.train.fit)."""
    with _starting(f"{command} --dry-run --target {target}", quiet):
        from ssmlm.train import aot

        work = make_work()
    if fit:
        from ssmlm.display.printouts import print_fit
        from ssmlm.train.fit import fit_on_target

        found = fit_on_target(r, work, target, quiet=quiet or as_json)
        if as_json:
            typer.echo(json.dumps(found, indent=2, default=str))
        else:
            print_fit(found)
        return
    report = aot.dry_run_on_target(r, work, target, quiet=quiet or as_json)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        from ssmlm.display.printouts import print_target_report

        print_target_report(report)


def _dry_run_extend(r, target: str | None, fit: bool, as_json: bool, quiet: bool) -> None:
    """extend-length --dry-run: the source run's model at the new length (its plan, or compiled for --target)."""
    from ssmlm.runs import open_run

    src = open_run(r.train.init_from)
    model = dataclasses.replace(src.recipe.model, max_seq_length=r.model.max_seq_length)
    r = dataclasses.replace(r, model=model)
    if target:
        return _dry_run_on_target("extend-length", r, lambda: _pretraining_work(r), target, fit, as_json, quiet)
    with _starting("extend-length --dry-run", quiet):
        from ssmlm.train.plan import plan

        the_plan = plan(r, "extend-length")
    print_plan(the_plan)


def _dry_run_finetune(r, ckpt: str, num_labels: int, target, fit: bool, as_json: bool, quiet: bool) -> None:
    """finetune --dry-run: the plan of finetuning the run at ``ckpt``, or its step compiled for --target."""
    if target:
        work = lambda: _finetune_work(r, ckpt, num_labels)  # noqa: E731
        return _dry_run_on_target("finetune", r, work, target, fit, as_json, quiet)
    with _starting("finetune --dry-run", quiet):
        from ssmlm.train.plan import plan_finetune

        the_plan = plan_finetune(r, ckpt, num_labels, _train_rows(r, ckpt) if r.train.epochs else None)
    print_plan(the_plan)


def _train_rows(r, ckpt: str) -> int | None:
    """A local or built-in encoder task's training rows (read as finetuning will; the files were just checked),
    None for a hub task's or a language model's (their size is known only once downloaded or built)."""
    from ssmlm.data.tasks import BUILTIN, TASKS, load_task

    local = r.task.train_file and r.task.name not in TASKS
    if is_lm(run_arch(ckpt)) or not (local or r.task.name in BUILTIN):
        return None
    train = load_task(r.task, r.train.seed).splits.get("train") or {}
    return len(next(iter(train.values()), []))


def _finetune_work(r, ckpt: str, num_labels: int):
    """ssmlm.train.aot.Work of finetuning the run at ``ckpt`` on ``r``'s task."""
    from ssmlm.data.tasks import TASKS
    from ssmlm.runs import open_run
    from ssmlm.train import aot

    src = open_run(ckpt)
    head = TASKS[r.task.name].head if r.task.name in TASKS else "classify"
    model = dataclasses.replace(src.recipe.model, dropout=r.model.dropout)
    return aot.finetune_work(r, model, num_labels, head)


def _pretraining_work(r):
    """ssmlm.train.aot.Work of pretraining ``r`` (the vocabulary from the recipe or its tokenizer)."""
    from ssmlm.train import aot
    from ssmlm.train.plan import vocab_size

    return aot.pretraining_work(r, vocab_size(r))


def _starting(command: str, quiet: bool = False, what: str = "loading jax"):
    """A command's start, once its cheap checks passed: its imports (seconds) and opening the run, up to its first
    bar. A spinner with the elapsed time on a terminal, nothing with --quiet; without a terminal a line (and one
    per new ``.label``): at once while jax is still to be loaded (none when it is, e.g. in-process), or for an
    analysis once it has run a while (a quick refusal stays one line)."""
    from ssmlm.progress import PLAIN_AFTER_S, activity

    if what == "loading jax":
        plain_after = None if "jax" in sys.modules else 0.0
    else:
        plain_after = PLAIN_AFTER_S
    return activity(f"{command}: {what}", quiet, background=True, plain_after=plain_after)


def _renamed(result, local: str, url: str):
    """``result`` with every string naming a file under the staging folder ``local`` naming it under ``url``."""
    if isinstance(result, dict):
        return {k: _renamed(v, local, url) for k, v in result.items()}
    if isinstance(result, list):
        return [_renamed(v, local, url) for v in result]
    if isinstance(result, str) and (result == local or result.startswith(f"{local}/")):
        return url + result[len(local) :]
    return result


def _train(kind: str, recipe, run_dir: Path | str, quiet: bool, **kw) -> dict:
    """pretrain, extend-length or finetune of one run (ssmlm.train.drive), with its loss plot; shown from the start."""
    with _starting(kind, quiet) as start, _in_bucket(run_dir) as local:
        from ssmlm.analyze.plots import LossPlot
        from ssmlm.train.drive import drive

        start.label = f"{kind}: preparing the data and the model"
        started = SimpleNamespace(on_start=lambda *_: start())  # the loop has begun: the start is over
        summary = drive(kind, recipe, local, quiet=quiet, hooks=[LossPlot(local), started], **kw)
        # a staged run's summary names the bucket's files, not the staging folder's (removed at the end)
        return summary if local == run_dir else _renamed(summary, str(local), str(run_dir))


# ----------------------------------------------------------------------------- help from the registries
# The names a command's help lists come from the registries (mixtures, tasks), so a new one is in `--help` at once.


def _names(names, last: str = "or") -> str:
    """'a, b or c'."""
    names = list(names)
    return ", ".join(names[:-1]) + f" {last} {names[-1]}" if len(names) > 1 else "".join(names)


def _help_lists(**lists: str):
    """Fill the {placeholders} of a command's docstring (its --help) with ``lists``."""

    def fill(fn):
        fn.__doc__ = fn.__doc__.format(**lists)
        return fn

    return fill


# ----------------------------------------------------------------------------- commands


@app.command()
@user_errors
def preprocess(
    recipe: Annotated[
        str | None, typer.Argument(help="Recipe path or shipped name (default: the embedded default).")
    ] = None,
    set_: SetOpt = None,
    quiet: QuietOpt = False,
):
    """Tokenize a corpus once into token shards (reused when the same inputs come again).

    Encoders (MLM): a WordPiece tokenizer and unmasked rows packed to the full length.

    Language models (objective.kind: lm): a byte-level BPE and whole documents, packed into rows at training time.

    Streams the corpus in bounded memory; running an interrupted command again resumes at its last finished shard.

    Masking and the objective mixture are applied at training time: their settings do not change what is written.

    Example: ssmlm preprocess recipes/bigs_full.yaml --set 'data.source=corpus/*.txt'
    """
    r = _load(recipe, set_, "default")
    check_inputs(r)
    from ssmlm.data.preprocess import preprocess as run_preprocess
    from ssmlm.data.preprocess import read_metadata

    layout = "documents" if r.objective.kind == "lm" else "rows"  # language models pack at training time
    out = run_preprocess(r.data, r.seq_len, quiet=quiet, layout=layout)
    meta = read_metadata(out)
    keys = ("documents", "tokens", "max_seq_length", "vocab_size", "layout", "fill_rate", "splits")
    typer.echo(json.dumps({"path": str(out), **{k: meta[k] for k in keys}, "shards": len(meta["shards"])}, indent=2))


@app.command()
@user_errors
@_help_lists(mixtures=_names(MIXTURES))
def pretrain(
    recipe: Annotated[
        str | None, typer.Argument(help="Recipe path or shipped name (default: the embedded default).")
    ] = None,
    set_: SetOpt = None,
    name: NameOpt = None,
    quiet: QuietOpt = False,
    stop_after: StopOpt = None,
    dry_run: DryOpt = False,
    target: TargetOpt = None,
    fit: FitOpt = False,
    as_json: TargetJsonOpt = False,
):
    """Pretrain on the recipe's objective: MLM (encoders) or an objective mixture (language models).

    Encoders (BiGS and its ablations, BERT, gMLP/aMLP): masked-language modelling with static or dynamic masks.

    Language models (Gated SSM, Hawk, Transformer): objective.mixture {mixtures}.

    The birdie mixture's controller changes the mixture while training runs. Re-running the same command resumes.

    Example: ssmlm pretrain recipes/bigs_full.yaml
    Example: ssmlm pretrain birdie_gated_ssm
    Example: ssmlm pretrain birdie_gated_ssm_1b4 --dry-run --target paper
    """
    r = _load(recipe, set_, "default")
    _check_training_options(name, stop_after)
    _check_target_options(dry_run, target, fit, as_json)
    check_inputs(r)
    if target:
        return _dry_run_on_target("pretrain", r, lambda: _pretraining_work(r), target, fit, as_json, quiet)
    if dry_run:
        with _starting("pretrain --dry-run", quiet):
            from ssmlm.train.plan import plan

            the_plan = plan(r)
        return print_plan(the_plan)
    run_dir = _run_dir(r, name)
    _check_run_dir(r, run_dir)
    summary = _train("pretrain", r, run_dir, quiet=quiet, stop_after=stop_after)
    print_summary(summary, run_dir)


@app.command("extend-length")
@user_errors
def extend_length(
    recipe: Annotated[str | None, typer.Argument(help="Recipe for the longer stage (default: default_extend).")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="The pretrained run directory to extend.")] = None,
    set_: SetOpt = None,
    name: NameOpt = None,
    quiet: QuietOpt = False,
    stop_after: StopOpt = None,
    dry_run: DryOpt = False,
    target: TargetOpt = None,
    fit: FitOpt = False,
    as_json: TargetJsonOpt = False,
):
    """Continue an encoder's MLM training at a longer max_seq_length (language models: not applicable).

    SSM kernels are evaluated at the new length, the position table is extended, the optimizer restarts.

    Example: ssmlm extend-length recipes/bigs_512.yaml --from runs/bigs_full
    """
    r = _load(recipe, set_, "default_extend")
    _check_training_options(name, stop_after)
    if from_:
        r = dataclasses.replace(r, train=dataclasses.replace(r.train, init_from=from_))
    if not r.train.init_from:
        raise UserError("extend-length needs a pretrained run: pass --from RUN_DIR (or set train.init_from)")
    checks.run_dir(r.train.init_from, "--from" if from_ else "train.init_from")
    checks.checkpoint_step(r.train.init_from, r.train.init_step, "train.init_step")
    _check_target_options(dry_run, target, fit, as_json)
    check_inputs(r, tokenizer=False)  # the tokenizer is the source run's
    if dry_run:
        return _dry_run_extend(r, target, fit, as_json, quiet)
    src = Path(r.train.init_from)
    run_dir = _run_dir(r, name or f"{src.name}-L{r.model.max_seq_length}")
    _check_run_dir(r, run_dir)
    summary = _train("extend-length", r, run_dir, quiet=quiet, stop_after=stop_after)
    print_summary(summary, run_dir)


FinetuneTaskOpt = Annotated[
    str | None,
    typer.Option(
        "--task",
        help=f"Encoders: {', '.join(TASKS)}; with --train-file any name names your own task (default: the file's "
        "name, polarity-train.csv: polarity), a known one keeps its columns. "
        f"Language models: {', '.join(finetuning_tasks())}.",
    ),
]
EvaluateTaskOpt = Annotated[
    str | None,
    typer.Option(
        "--task",
        help="Default: the run's own (MLM or LM validation rows, or its finetuning task). Encoders: a finetune "
        f"task name. Language models: {', '.join(evaluation_tasks())}, lm-eval:TASKS (e.g. "
        "lm-eval:hellaswag,arc_easy).",
    ),
]
TrainFileOpt = Annotated[
    str | None,
    typer.Option(
        "--train-file",
        help="Encoders: a local csv/tsv/jsonl/parquet training file (without --validation-file, "
        "task.validation_fraction of it is held out for validation). Language models (--task instruct): a JSONL of "
        "prompt/response pairs, or flan / openhermes from the hub.",
    ),
]
ValFileOpt = Annotated[
    str | None,
    typer.Option(
        "--validation-file",
        help="Local validation file: a table for an encoder task, JSONL pairs for instruct, the stories JSONL for "
        "evaluate --task infilling.",
    ),
]
FieldsOpt = Annotated[
    str | None,
    typer.Option(
        "--text-fields",
        help="Encoders: text column(s), comma-separated (one or two; default sentence; "
        "--no-header: 0-based positions, default all but the last).",
    ),
]
LabelOpt = Annotated[
    str | None,
    typer.Option(
        "--label-field",
        help="Encoders: label column (default label; --no-header: its 0-based position, "
        "default the last). Any values: classes are the training file's sorted distinct labels.",
    ),
]
NumLabelsOpt = Annotated[
    int | None,
    typer.Option(
        "--num-labels",
        help="Encoders: number of classes, checked against the training file's distinct "
        "labels (default: their count); 1 = regression.",
    ),
]
NoHeaderOpt = Annotated[
    bool,
    typer.Option(
        "--no-header",
        help="Encoders: the csv/tsv files have no header row; columns by 0-based position (task.header: false).",
    ),
]
TEXT_FIELDS = checks.Rule(
    lambda v: 1 <= len([f for f in v.split(",") if f.strip()]) == len(v.split(",")) <= 2,
    "one or two comma-separated column names",
)
DataDirOpt = Annotated[
    str | None,
    typer.Option(
        "--data-dir",
        help="Task files in their original layout (GLUE TSVs, SQuAD JSON, SCROLLS JSONL); language models: "
        "the folder of dev-v2.0.json (squad_v2) or of lm-eval task YAMLs.",
    ),
]

InitOpt = Annotated[
    str,
    typer.Option(
        "--init",
        help="pretrained: the --ckpt run's weights; random: its architecture at a fresh initialisation "
        "(the baseline; seed train.seed), or without --ckpt --recipe's model.",
    ),
]
INIT = checks.Rule(lambda v: v in ("pretrained", "random"), "pretrained or random")
StepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        help="Start from the --ckpt run's checkpoint at this step instead of its newest (train.init_step); "
        "pretraining with train.keep_steps keeps the steps to pick from.",
    ),
]


def _with_source(r, ckpt: str | None, step: int | None, init: str):
    """finetune's recipe with its source run (train.init_from) and the step it starts from (--step, else the
    recipe's train.init_step), a step the run kept: checked on its checkpoint folders, before jax loads."""
    opt = "--step" if step is not None else "train.init_step"
    step = r.train.init_step if step is None else step
    if step is not None and init == "random":
        raise UserError(f"{opt} {step} picks the weights to load; --init random loads none")
    if ckpt:
        checks.checkpoint_step(ckpt, step, opt)
    return dataclasses.replace(r, train=dataclasses.replace(r.train, init_from=ckpt, init_step=step))


@app.command()
@user_errors
def finetune(
    ckpt: Annotated[
        str | None, typer.Option("--ckpt", help="Pretrained (or extended) run: an encoder or a language model.")
    ] = None,
    task: FinetuneTaskOpt = None,
    init_from: Annotated[
        str | None,
        typer.Option(
            "--init-from",
            help="Encoders: a finetuned run (e.g. MNLI) to start from instead: encoder, pooler and "
            "classifier (when the label space matches) are copied — the paper's RTE/MRPC/STS-B convention.",
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    seeds: Annotated[
        str | None,
        typer.Option("--seeds", help="Comma-separated seeds: one run each (encoders: mean and std reported)."),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            "--recipe",
            help="Finetuning recipe (default: finetune_default; language models: "
            f"{', '.join(dict.fromkeys(map(default_recipe, finetuning_tasks())))}).",
        ),
    ] = None,
    train_file: TrainFileOpt = None,
    validation_file: ValFileOpt = None,
    text_fields: FieldsOpt = None,
    label_field: LabelOpt = None,
    num_labels: NumLabelsOpt = None,
    no_header: NoHeaderOpt = False,
    set_: SetOpt = None,
    name: NameOpt = None,
    quiet: QuietOpt = False,
    stop_after: StopOpt = None,
    dry_run: DryOpt = False,
    init: InitOpt = "pretrained",
    step: StepOpt = None,
    target: TargetOpt = None,
    fit: FitOpt = False,
    as_json: TargetJsonOpt = False,
):
    """Finetune a pretrained run: an encoder on a task, a language model on prompt/response pairs.

    Encoders: classification or regression (pooler + classifier), span extraction (SQuAD), multiple choice (QuALITY).

    Language models: phone-book retrieval (Birdie) or instruction tuning, prompt as prefix, response as target.

    Random-initialisation baseline: --init random (the architecture of --ckpt RUN, its weights not loaded).

    Without --ckpt, --init random builds --recipe's model (e.g. --recipe default), tokenised as its data says.

    Example: ssmlm finetune --ckpt runs/default --task builtin-order
    Example: ssmlm finetune --ckpt runs/birdie_gated_ssm --task phonebook --recipe phonebook_tiny
    Example: ssmlm finetune --ckpt runs/default --task builtin-order --init random
    """
    checks.option("--init", init, INIT)
    ckpt = init_from or ckpt
    if not ckpt and init != "random":
        raise UserError("finetune needs a checkpoint: pass --ckpt RUN_DIR (or --init-from FINETUNED_RUN)")
    if ckpt:
        checks.run_dir(ckpt, "--init-from" if init_from else "--ckpt")
    lm = is_lm(run_arch(ckpt)) if ckpt else False
    r = _load(recipe, set_, default_recipe(task) if lm else "finetune_default")
    _check_training_options(name, stop_after)
    if not ckpt and is_lm(r.model.arch):
        raise UserError(f"--init random of a language model ({r.model.arch}) needs --ckpt RUN (its tokenizer)")
    if not ckpt:
        check_inputs(r)  # the recipe's own corpus and tokenizer give the vocabulary
    if dry_run and not ckpt:
        raise UserError("--dry-run with --init random needs --ckpt RUN (the architecture to plan)")
    _check_target_options(dry_run, target, fit, as_json)
    seed_list = checks.seeds(seeds) or [None]
    checks.option("--num-labels", num_labels, checks.POSITIVE)
    checks.option("--text-fields", text_fields, TEXT_FIELDS)
    r = with_task_options(
        r, task, train_file, validation_file, text_fields, label_field, num_labels, data_dir, no_header
    )
    num_labels = check_lm_task(r, ckpt) if lm else check_encoder_task(r)
    r = _with_source(r, ckpt, step, init)
    if dry_run:
        return _dry_run_finetune(r, ckpt, num_labels, target, fit, as_json, quiet)
    start = Path(ckpt).name + (f"-step{r.train.init_step}" if r.train.init_step else "") if ckpt else r.name
    base_name = name or f"{start}-{'random-' if init == 'random' else ''}{task_name(r.task)}"
    _check_run_dir(r, _run_dir(r, base_name))
    results = []
    for seed in seed_list:
        rs = r if seed is None else dataclasses.replace(r, train=dataclasses.replace(r.train, seed=seed))
        run_dir = _run_dir(rs, base_name if seed is None else f"{base_name}-seed{seed}")
        summary = _train("finetune", rs, run_dir, quiet=quiet, stop_after=stop_after, init=init)
        _finetuned(summary, run_dir, rs, ckpt, init, lm)
        results.append(summary)
    if seeds:
        from ssmlm.experiment.stats import over_seeds

        write_seeds(over_seeds(results, seed_list), _run_dir(r, f"{base_name}-seeds.json"))


def _finetuned(summary: dict, run_dir: Path, r, ckpt: str | None, init: str, lm: bool) -> None:
    """A finetuning run's closing lines: its summary (saying so when it started from random weights), an
    encoder's best validation, and where a test file was given, how to score it (training scores validation)."""
    arch = f" (the architecture of {ckpt})" if ckpt else f" (the architecture of recipe {r.name})"
    print_summary(summary, run_dir, start=f"random initialisation{arch}" if init == "random" else None)
    if not lm:
        print_best_validation(summary)
    if r.task.test_file:
        typer.echo(
            f"the table is the validation split; score the test split: ssmlm evaluate --ckpt {run_dir} --split test"
        )


@app.command()
@user_errors
def evaluate(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory to evaluate.")],
    task: EvaluateTaskOpt = None,
    validation_file: ValFileOpt = None,
    data_dir: DataDirOpt = None,
    split: Annotated[str, typer.Option("--split", help="Split to score.")] = "validation",
    submission: Annotated[
        str | None,
        typer.Option("--submission", help="Also write the split's predictions as GLUE leaderboard files here."),
    ] = None,
    predictions: Annotated[
        str | None,
        typer.Option(
            "--predictions",
            help="Encoders: also write the split's predicted labels, as the task's files "
            "spell them (e.g. -1/1, pos/neg), to this .csv, .tsv or .jsonl file.",
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 32,
    out: Annotated[
        str | None, typer.Option("--out", help="Metrics JSON path (default: RUN/eval/TASK-SPLIT.json).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Language models: score only this many items (books, questions).")
    ] = None,
    entries: Annotated[
        str | None,
        typer.Option(
            "--entries",
            help="--task phonebook: books of N (or LO-HI) entries instead of the finetuning books' "
            "task.phonebook.entries; the default --out is then RUN/eval/phonebook-eN-SPLIT.json.",
        ),
    ] = None,
    trust_task_code: Annotated[
        bool,
        typer.Option(
            "--trust-task-code",
            help="--task lm-eval:… with --data-dir: run the Python its task YAMLs name (!function, class:), which "
            "runs inside ssmlm with your permissions; without it such a folder is refused. Read the code first.",
        ),
    ] = False,
):
    """Score a run (encoder or language model); the metrics go to RUN/eval/TASK-SPLIT.json (or --out).

    Encoders: MLM loss/accuracy of a pretraining run, task metrics of a finetuning run (--submission: GLUE files).

    Language models: loss on their own validation rows, or Birdie's evaluations (phone book, SQuAD v2, infilling).

    Language models also run lm-evaluation-harness tasks: --task lm-eval:TASKS (needs ssmlm's 'harness' extra).

    Example: ssmlm evaluate --ckpt runs/default-builtin-order
    Example: ssmlm evaluate --ckpt runs/birdie_gated_ssm-phonebook --task phonebook
    """
    checks.option("--batch-size", batch_size, checks.POSITIVE)
    checks.run_dir(ckpt, "--ckpt")
    for opt, path in (("--validation-file", validation_file), ("--data-dir", data_dir)):
        if path and not Path(path).expanduser().exists():
            raise UserError(f"{opt} '{path}': no such file or directory")
    checks.option("--limit", limit, checks.POSITIVE)
    if task and task.startswith("lm-eval:"):  # before the run is opened: the folder's code is not imported
        from ssmlm.data.task_code import check_task_folder

        check_task_folder(data_dir, trust_task_code)
    span = checks.entries(entries)
    if span and task != "phonebook":
        raise UserError(f"--entries {entries} goes with --task phonebook (the size of its phone books)")
    if out:
        checks.output_file(out, "--out")
    elif not paths.is_remote(ckpt):  # a bucket's run: RUN/eval is written there (reached: checks.run_dir)
        checks.output_dir(Path(ckpt) / "eval", "--ckpt")
    if submission:
        checks.output_dir(paths.local(submission, "--submission"), "--submission")
    if predictions:
        checks.output_file(paths.local(predictions, "--predictions"), "--predictions")
    with (
        _starting("evaluate") as start,
        _in_bucket(ckpt) as local,
        staging.output(out) if out else contextlib.nullcontext() as out_local,
    ):
        from ssmlm.checkpoint_eval.run import evaluate_run
        from ssmlm.runs import open_run

        start.label = f"evaluate: opening {ckpt}"
        run = open_run(local)
        result = evaluate_run(
            run,
            task,
            split=split,
            batch_size=batch_size,
            data_dir=data_dir,
            validation_file=validation_file,
            limit=limit,
            submission=Path(submission) if submission else None,
            predictions_file=Path(predictions) if predictions else None,
            entries=span,
            trust_task_code=trust_task_code,
        )
        # RUN/eval or --out: staged, then uploaded (a bucket's)
        write_result(result, out_local, run, entries=span, shown=out)


@app.command()
@user_errors
def results(
    runs: Annotated[list[str], typer.Argument(help="Run directories (their eval/*.json) or result JSON files.")],
    long: Annotated[bool, typer.Option("--long", help="SQuAD / QuALITY / ContractNLI columns (Tables 2-3).")] = False,
    split: Annotated[str, typer.Option("--split")] = "validation",
    out: Annotated[str | None, typer.Option("--out", help="Save as .csv or .md.")] = None,
):
    """Gather encoder runs' `evaluate` results into one table laid out like BiGS Table 1 (rows: arch / route).

    Example: ssmlm results runs/*-mnli runs/*-sst2 --out table1.md
    """
    from ssmlm.evaluate.tables import GLUE_TABLE1, LONG_TASKS, results_table, save_table, to_markdown

    if out:
        checks.output_file(out, "--out")
    files = []
    for given in runs:
        if paths.is_remote(given):  # a run in a bucket: its records' local copy (result objects: not read yet)
            paths.check_url(given, "results")
            given = staging.records(given)
        r = Path(given)
        files += sorted((r / "eval").glob("*.json")) if r.is_dir() else [r]
    if not files:
        raise UserError("no result files found: run `ssmlm evaluate --ckpt RUN` first (it writes RUN/eval/*.json)")
    df = results_table(files, LONG_TASKS if long else GLUE_TABLE1, split=split)
    typer.echo(f"{split} split")  # (the scores of that split only: --split picks another)
    typer.echo(to_markdown(df))
    if out:
        with staging.output(out) as local:
            written = save_table(df, local)
        typer.echo(f"wrote {out if paths.is_remote(out) else written}")


@app.command()
@user_errors
def generate(
    ckpt: Annotated[str, typer.Option("--ckpt", help="A language-model run directory.")],
    prompt: Annotated[str | None, typer.Option("--prompt", help="The prompt text.")] = None,
    file: Annotated[str | None, typer.Option("--file", help="Read the prompt from this file instead.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Most tokens to generate.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Sample only from the k likeliest tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1: off).")] = 1.0,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop at this string (repeatable).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    mode: Annotated[
        str,
        typer.Option(
            "--mode", help="prefix: the prompt is the bidirectional prefix; causal: after START; auto: by mixture."
        ),
    ] = "auto",
    step: Annotated[int | None, typer.Option("--step", help="Checkpoint step (default: the latest).")] = None,
):
    """Generate text from a language-model run (greedy, or sampled with temperature / top-k / top-p).

    Example: ssmlm generate --ckpt runs/birdie_gated_ssm --prompt "It is a truth universally" --max-tokens 40
    """
    checks.option("--max-tokens", max_tokens, checks.POSITIVE)
    checks.option("--temperature", temperature, checks.Rule(lambda v: v >= 0, "at least 0 (0 = greedy)"))
    checks.option("--top-k", top_k, checks.NON_NEGATIVE)
    checks.option("--top-p", top_p, checks.Rule(lambda v: 0 < v <= 1, "a number in (0, 1]"))
    if (prompt is None) == (file is None):
        raise UserError("give the prompt as exactly one of --prompt TEXT or --file FILE")
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise UserError(f"--file {file}: no such file")
        prompt = path.read_text(encoding="utf-8")
    checks.run_dir(ckpt, "--ckpt")
    check_max_tokens(ckpt, max_tokens)
    from ssmlm.progress import activity

    with activity(f"loading {ckpt}"):
        from ssmlm.models.decode import Sampling
        from ssmlm.runs.generate import load_generator

        gen = load_generator(ckpt, mode, step, max_new_tokens=max_tokens)
    sampling = Sampling(max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    with activity("compiling the decoder") as started:

        def show(piece: str) -> None:  # the text as it comes (echo flushes), once the first token is out
            started()
            typer.echo(piece, nl=False)

        gen(prompt, sampling, stop or (), on_text=show)
    typer.echo()


def _register_analyses() -> None:
    """One `ssmlm analyze NAME` command per module of ssmlm.analyze that defines one (the registry)."""
    from ssmlm.analyze import registry

    for name, module in registry().items():
        command = _shown(f"analyze {name}", module.command, f"{name}: {getattr(module, 'FIGURE', name)}")
        analyze_app.command(name, help=flowing(module.command.__doc__))(user_errors(command))


JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON instead of tables.")]


def _shown(command: str, fn, title: str):
    """``fn`` under _starting's spinner from its start (its own bars take over; --quiet, when it has one, hides it),
    then the result it returns as tables under ``title`` (they fit 80 columns), or with --json (an option added to
    every analysis here) as JSON."""
    import inspect
    import typing

    @functools.wraps(fn)
    def wrapper(*args, as_json: bool = False, **kwargs):
        out = kwargs.get("out")
        if out:
            checks.output_dir(out, "--out")
        runs = kwargs.get("ckpt")
        runs = runs if isinstance(runs, list) else [runs] if runs else []
        for run in runs:  # a run in a bucket: reachable, before any work
            if paths.is_remote(run):
                checks.run_dir(run, "--ckpt")
        with _starting(command, bool(kwargs.get("quiet")), "working"), contextlib.ExitStack() as stack:
            local = [stack.enter_context(_in_bucket(run)) if paths.is_remote(run) else run for run in runs]
            if runs:  # (an analysis without a run, `flops`, has none)
                kwargs["ckpt"] = local if isinstance(kwargs["ckpt"], list) else local[0]
            if out and paths.is_remote(out):  # written in a temporary folder, uploaded when the analysis is done
                kwargs["out"] = str(stack.enter_context(staging.output(out, folder=True)))
            result = fn(*args, **kwargs)
            # the staging folders are removed at the end: name what was written by its place in the bucket
            for run, folder in zip([*runs, out], [*local, kwargs.get("out")], strict=True):
                if folder != run:
                    result = _renamed(result, str(folder), str(run))
        if result is not None:
            print_result(result, title, as_json)

    signature = inspect.signature(fn, eval_str=True)
    json_option = inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOpt)
    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), json_option])
    wrapper.__annotations__ = {**typing.get_type_hints(fn, include_extras=True), "as_json": JsonOpt}
    return wrapper


_register_analyses()


@app.command("import-bigs")
@user_errors
def import_bigs(
    src: Annotated[
        str, typer.Argument(help="Directory with config.json + flax_model.msgpack, or hub:JunxiongWang/BiGS_512.")
    ],
    out: Annotated[str, typer.Option("--out", help="Run directory to create.")],
    task: Annotated[
        str | None, typer.Option("--task", help="Task of a classification checkpoint (default: its finetuning_task).")
    ] = None,
):
    """Import a released BiGS checkpoint (Hugging Face Flax layout) as an ssmlm run, to finetune or analyse.

    Example: ssmlm import-bigs hub:JunxiongWang/BiGS_512 --out runs/bigs_512_official
    """
    checks.output_dir(out, "--out")
    from ssmlm.runs import open_run
    from ssmlm.runs.importing import import_bigs as run_import

    if paths.is_remote(out) and paths.listing(out):
        raise UserError(f"--out {out}: already exists and is not empty; choose another output directory")
    with _in_bucket(out) as local:  # in a bucket: its records staged, its checkpoint written there by Orbax
        run = open_run(run_import(src, local, task=task))
        info = {
            "run": staging.location(run.dir),
            "kind": run.kind,
            "source": run.info["source"],
            "max_seq_length": run.recipe.model.max_seq_length,
        }
    typer.echo(json.dumps(info, indent=2))


@app.command()
@user_errors
def experiment(
    file: Annotated[str, typer.Argument(help="Experiment file (YAML): arms, seeds, stages, metric, reference.")],
    out: Annotated[
        str | None, typer.Option("--out", help="Output directory (default: runs/experiments/FILE_STEM).")
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Runs at a time, each in its own process (default 1: in this one).")
    ] = 1,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show each run's own output too.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Check the file, list the runs, estimate the time left from those done; exit."),
    ] = False,
    seeds: Annotated[
        int | None, typer.Option("--seeds", help="Only the file's first N seeds (a quick look; more later reuse them).")
    ] = None,
):
    """Run arms × seeds (× a grid) as ordinary runs; report each arm's mean, 95% CI and paired difference.

    Every stage (pretrain → finetune → evaluate → analyze) of every arm and seed is a run directory under --out;
    finished runs are reused and interrupted ones resume, so running the same command again continues.

    Writes OUT/results.md, .csv, .json and results.png; prints the table.

    Example: ssmlm experiment experiments/smoke.yaml
    """
    checks.option("--jobs", jobs, checks.POSITIVE)
    checks.option("--seeds", seeds, checks.POSITIVE)
    from ssmlm.experiment.spec import load_experiment

    exp = load_experiment(file)
    if seeds is not None:
        exp = dataclasses.replace(exp, seeds=exp.seeds[:seeds])
    out_dir = out if out else Path("runs") / "experiments" / exp.name
    remote = paths.is_remote(out_dir)
    checks.output_dir(out_dir, "--out" if out else "experiment directory")
    if dry_run:
        from ssmlm.experiment.plan import dry_run_lines
        from ssmlm.experiment.runner import dry_run_time

        local = staging.fetched(str(out_dir)) if remote else Path(out_dir).expanduser()  # runs done: their costs
        for line in dry_run_lines(exp, local):
            typer.echo(line.replace(str(local), str(out_dir)))
        typer.echo(dry_run_time(exp, local, jobs))
        return
    from ssmlm.experiment.report import markdown, write
    from ssmlm.experiment.runner import run_experiment

    # in a bucket: one staging folder for the experiment; each run in it is a run in the bucket (ssmlm.staging)
    with (
        staging.staged(str(out_dir), runs_inside=True)
        if remote
        else contextlib.nullcontext(Path(out_dir).expanduser()) as local
    ):

        def echo(line: str = "") -> None:  # name what is written by its place in the bucket
            typer.echo(line.replace(str(local), str(out_dir)))

        res = run_experiment(exp, local, jobs=jobs, verbose=verbose, echo=echo)
        res = _renamed(res, str(local), str(out_dir)) if remote else res
        md = staging.location(write(res, local)["md"])  # (in a bucket: by its URL)
    typer.echo("")
    typer.echo(markdown(res, warnings=False), nl=False)  # the runs' warnings were printed as each finished
    warned = len({w["run_dir"] for w in res["warnings"]})
    if warned:
        typer.echo(
            f"\n{warned} run{'s' if warned > 1 else ''} gave warnings: above, under each run's line, and in results.md"
        )
    typer.echo(f"wrote {md}, results.csv, results.json, results.png")
    if any(a["status"] != "ok" for a in res["arms"].values()):
        raise typer.Exit(1)


@app.command()
def recipes():
    """List the shipped recipes with their first comment line."""
    from ssmlm.recipe import builtin_recipes

    for stem, path in builtin_recipes().items():
        first = next((ln[1:].strip() for ln in path.read_text().splitlines() if ln.startswith("#")), "")
        typer.echo(f"{stem:24s} {first}")


def cpu_only_host() -> bool:
    """No accelerator device nodes here (NVIDIA, TPU, AMD). jax would still try the accelerator plugins a user
    installed for `--dry-run --target` (libtpu, the CUDA plugin) and print their failures at the first jax call."""
    nodes = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/accel0", "/dev/vfio/vfio", "/dev/kfd")
    tpu_vm = any(os.environ.get(k) for k in ("TPU_NAME", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES"))
    return not tpu_vm and not any(os.path.exists(n) for n in nodes)


def main() -> None:
    if "JAX_PLATFORMS" not in os.environ and cpu_only_host():
        os.environ["JAX_PLATFORMS"] = "cpu"  # a CPU machine: the CPU backend, without probing the others
    from ssmlm.targets import quiet_cuda_plugin

    quiet_cuda_plugin()  # the gpu-aot extra on a CPU-only process (JAX_PLATFORMS=cpu, set here or by the user)
    try:
        app()
    except SystemExit as e:
        several = "jax" in sys.modules and sys.modules["jax"].distributed.is_initialized()
        if e.code not in (0, None) and several:
            from ssmlm.hosts import leave  # one of several hosts stops, its one line printed

            leave(e.code if isinstance(e.code, int) else 1)
        if e.code == 130:  # Ctrl-C: what is kept is saved and closed by now
            # Leave at once: work dropped on a worker thread (an evaluation, a compile) cannot be stopped, and a
            # normal exit would wait for it or abort inside it while the interpreter shuts down.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        raise
    except UserError as e:  # raised outside a command (should not happen, but never show a traceback)
        _err(str(e))
        sys.exit(2)
