"""The experiment file (YAML) and its checks. Everything here is checked before jax is imported: every arm's
recipes are loaded with their overrides (and every grid point's), so a mistake is reported at once, in one line
that names the file and the field, e.g. ``smoke.yaml: arms.random.finetune.init = 'rand': expected pretrained or
random``.

    seeds: [0, 1]                      # one run per seed per stage (train.seed); arms are paired by seed
    stages: [pretrain, finetune]       # consecutive, from pretrain or finetune: pretrain, finetune, evaluate, analyze
    metric: finetune:accuracy          # STAGE:FIELD (pretrain/finetune: final validation; evaluate: its metrics)
    goal: max                          # optional: max or min (default: min for *loss*/perplexity, else max)
    bounds: [0, 1]                     # optional: the metric's range, where results.md and the plot cut its
                                       # intervals (default [0, 1] for *accuracy, else none; null: none)
    reference: random                  # the arm the others are compared with, paired by seed; or a mapping
                                       # ARM: ITS_REFERENCE (e.g. hawk-birdie: hawk-clm; others: no difference);
                                       # a file of one arm needs none (no comparisons)
    arms:
      pretrained:
        pretrain: {recipe: default, set: [train.steps=40]}
        finetune: {task: builtin-order, set: [train.steps=30]}
      random:
        pretrain: {recipe: default, set: [train.steps=40]}   # not run: the architecture and tokenizer only
        finetune: {task: builtin-order, init: random, set: [train.steps=30]}
    grid:                              # optional: selected per arm on validation, reported on a test split
      finetune: {train.learning_rate: [1.0e-4, 5.0e-4]}

A budget sweep (experiments/birdie_budget.yaml) pretrains each arm × seed once, to the largest budget, keeping the
checkpoint at every budget, and runs every probe (a finetuning and its evaluations, the same for every arm) from
each of them; arms then give only their pretrain section:

    budgets: [200, 400, 800, 1600]     # pretraining steps (train.steps and train.keep_steps are set from them)
    probes:
      copy:
        finetune: {recipe: phonebook_tiny, task: phonebook, set: [...]}
        evaluate:                      # one or more, each named; chance: the metric of a baseline (plotted)
          copy: {task: phonebook, split: test, limit: 100, chance: 0.0001}
          copy-digits: {task: phonebook, split: test, limit: 100, metric: digit_accuracy, chance: 0.1}
      lookup:
        finetune: {...}
        evaluate:
          lookup2: {task: phonebook, split: test, limit: 100, chance: 0.5}
          lookup4: {task: phonebook, split: test, limit: 100, entries: 4, chance: 0.25}   # 4-entry books

An evaluation's ``metric`` scores it by another field of its result than the file's metric; evaluations of a probe
that differ only in their metric and chance share one evaluation run.

Top-level keys starting with ``x-`` are ignored (a place for YAML anchors), a list inside ``set`` is spliced in
(``set: [*model, *task, train.steps=20]``), and ``${NAME}`` in ``set`` and ``ckpt`` is the environment variable
NAME (data written by a script, e.g. benchmarks/transfer.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from pathlib import Path

import yaml

from ssmlm import yamlfile
from ssmlm.data.lm_tasks import finetuning_tasks
from ssmlm.data.phonebook import SPLIT_SEEDS
from ssmlm.errors import UserError

STAGES = ("pretrain", "finetune", "evaluate", "analyze")
DEFAULT_RECIPE = {"pretrain": "default", "finetune": "finetune_default"}
STAGE_KEYS = {
    "pretrain": {"recipe", "set"},
    "finetune": {"recipe", "set", "task", "init", "ckpt", "step"},
    "evaluate": {"split", "batch_size", "task", "limit", "entries"},
}
TOP_KEYS = {"description", "seeds", "stages", "metric", "goal", "bounds", "reference", "arms", "grid"}
TOP_KEYS |= {"budgets", "probes"}  # a budget sweep
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a metric field of a result, e.g. digit_accuracy
ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
LOWER_IS_BETTER = ("loss", "perplexity", "error")


class ExperimentError(UserError):
    """A mistake in an experiment file: one line naming the file and the field."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of an arm: a recipe and its --set overrides (finetune: task, init, ckpt; evaluate: split)."""

    recipe: str | None = None
    set: tuple[str, ...] = ()
    task: str | None = None
    init: str = "pretrained"
    ckpt: str | None = None
    split: str = "validation"
    batch_size: int = 32
    limit: int | None = None  # evaluate: at most this many items (a language model's phone books: how many)
    step: int | None = None  # finetune: start from the pretraining checkpoint at this step (train.init_step)
    entries: tuple[int, int] | None = None  # evaluate: phone books of this many entries, not the finetuning books'
    chance: float | None = None  # a probe's evaluation: the metric of a baseline that does not retrieve
    metric: str | None = None  # a probe's evaluation: the result field it is scored by (None: the file's metric's)
    analyses: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()  # analyze: (NAME, its options)


@dataclasses.dataclass(frozen=True)
class Probe:
    """A budget sweep's probe: one finetuning from each budget's checkpoint, scored by named evaluations."""

    finetune: Stage
    evaluations: dict[str, Stage]


@dataclasses.dataclass(frozen=True)
class Metric:
    stage: str
    field: str
    goal: str  # max | min
    bounds: tuple[float, float] | None = None  # the metric's range (an accuracy's [0, 1]); None: unbounded

    def __str__(self) -> str:
        return f"{self.stage}:{self.field}"


@dataclasses.dataclass(frozen=True)
class Experiment:
    path: Path
    seeds: tuple[int, ...]
    stages: tuple[str, ...]
    metric: Metric
    reference: str | dict[str, str] | None  # one arm, or arm -> the arm it is compared with; None: no comparisons
    arms: dict[str, dict[str, Stage]]  # arm -> stage name -> Stage (a stage not in `stages` may give architecture)
    grid: dict[str, dict[str, list]]  # stage -> dotted key -> values
    description: str = ""
    budgets: tuple[int, ...] = ()  # a budget sweep: the pretraining steps every probe starts from (ascending)
    probes: dict[str, Probe] = dataclasses.field(default_factory=dict)

    def reference_of(self, arm: str) -> str | None:
        """The arm ``arm`` is compared with (None: the reference itself, or an arm the mapping leaves out)."""
        ref = self.reference.get(arm) if isinstance(self.reference, dict) else self.reference
        return None if ref == arm else ref

    @property
    def name(self) -> str:
        return self.path.stem

    def points(self) -> list[dict[str, dict]]:
        """Every grid point: stage -> {dotted key: value} (one empty point without a grid)."""
        axes = [(stage, key, values) for stage, keys in self.grid.items() for key, values in keys.items()]
        out = []
        for combo in itertools.product(*(values for _, _, values in axes)):
            point: dict[str, dict] = {}
            for (stage, key, _), value in zip(axes, combo, strict=True):
                point.setdefault(stage, {})[key] = value
            out.append(point)
        return out

    def evaluations(self) -> dict[str, tuple[str, Stage]]:
        """A budget sweep's evaluations, in the file's order: name -> (its probe, its Stage)."""
        return {e: (p, st) for p, probe in self.probes.items() for e, st in probe.evaluations.items()}

    def runs_pretrain(self, arm: str) -> bool:
        """Whether the arm's pretrain stage is run (not when its finetune starts from random init or a --ckpt)."""
        ft = self.arms[arm].get("finetune")
        starts_elsewhere = "finetune" in self.stages and ft is not None and (ft.init == "random" or ft.ckpt)
        return "pretrain" in self.stages and not starts_elsewhere


def point_overrides(point: dict[str, dict], stage: str) -> list[str]:
    """A grid point's --set overrides for one stage."""
    return [f"{k}={json.dumps(v)}" for k, v in point.get(stage, {}).items()]


def point_label(point: dict[str, dict]) -> str:
    return ", ".join(f"{k}={v}" for keys in point.values() for k, v in keys.items())


def load_experiment(path: str | Path) -> Experiment:
    """Read and check an experiment file (recipes included); ExperimentError names the file and the field."""
    p = Path(path).expanduser()
    where = str(path)
    if not p.is_file():
        raise ExperimentError(f"{where}: no such experiment file")
    try:
        raw = yamlfile.load(p.read_text(encoding="utf-8"))
    except yamlfile.DuplicateKeyError as e:
        raise ExperimentError(f"{where}: {e}; the second would silently replace the first: keep one") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise ExperimentError(f"{where}{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    except UnicodeDecodeError:
        raise ExperimentError(f"{where}: not a UTF-8 text file") from None
    if not isinstance(raw, dict) or not raw:
        raise ExperimentError(f"{where}: expected a mapping with arms, seeds, stages, metric and reference")
    fail = lambda field, msg: ExperimentError(f"{where}: {field}: {msg}")  # noqa: E731
    _unknown({k: v for k, v in raw.items() if not str(k).startswith("x-")}, TOP_KEYS, "", fail)  # x-*: anchors
    for key in ("arms", "seeds", "stages", "metric"):
        if key not in raw:
            raise fail(key, "missing")
    arms_raw = _mapping(raw["arms"], "arms", fail)  # before `reference`: with no arms, that is the mistake
    if "reference" not in raw and len(arms_raw) != 1:
        raise fail("reference", "missing: the arm the others are compared with (only a file of one arm has none)")
    seeds = _seeds(raw["seeds"], fail)
    stages = _stages(raw["stages"], fail)
    budgets, probes = _sweep(raw, stages, fail)
    arm_stages = ("pretrain",) if budgets else stages  # a sweep's arms give only their pretraining
    arms = {name: _arm(name, body, arm_stages, bool(budgets), fail) for name, body in arms_raw.items()}
    metric = _metric(raw["metric"], raw.get("goal"), raw.get("bounds", "default"), stages, fail)
    reference = _reference(raw.get("reference"), arms, fail)
    grid = _grid(raw.get("grid"), stages, fail)
    if budgets and metric.stage != "evaluate":
        raise fail("metric", f"{str(metric)!r}: a budget sweep's metric is its probes' evaluations': evaluate:FIELD")
    if budgets and grid:
        raise fail("grid", "a budget sweep has no grid: its probes are fixed, the same for every arm")
    description = str(raw.get("description") or "")
    exp = Experiment(p, seeds, stages, metric, reference, arms, grid, description, budgets, probes)
    check_recipes(exp, fail)
    return exp


def _sweep(raw: dict, stages: tuple[str, ...], fail) -> tuple[tuple[int, ...], dict[str, Probe]]:
    """``budgets`` and ``probes`` (both or neither): the pretraining steps, and each probe's finetuning and named
    evaluations; an arm of a sweep gives only its pretrain section."""
    if "budgets" not in raw and "probes" not in raw:
        return (), {}
    for key in ("budgets", "probes"):
        if key not in raw:
            raise fail(key, "missing: a budget sweep has both budgets (pretraining steps) and probes")
    if list(stages) != ["pretrain", "finetune", "evaluate"]:
        raise fail("stages", f"{list(stages)!r}: a budget sweep's stages are [pretrain, finetune, evaluate]")
    b = raw["budgets"]
    if not (isinstance(b, list) and b and all(map(_positive, b)) and len(set(b)) == len(b)):
        raise fail("budgets", f"{b!r}: expected distinct pretraining steps, e.g. [200, 400, 800, 1600]")
    probes, names = {}, set()
    for name, body in _mapping(raw["probes"], "probes", fail).items():
        field = f"probes.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            raise fail(field, "a probe's name is a directory name: letters, digits, '.', '_', '-'")
        body = _mapping(body, field, fail)
        _unknown(body, {"finetune", "evaluate"}, f"{field}.", fail)
        for key in ("finetune", "evaluate"):
            if key not in body:
                raise fail(f"{field}.{key}", "missing: a probe is a finetuning and its named evaluations")
        ft = _section("finetune", body["finetune"], f"{field}.finetune", fail)
        if ft.ckpt or ft.init != "pretrained" or ft.step:
            raise fail(f"{field}.finetune", "a probe starts from each budget's checkpoint: no ckpt, init or step")
        evals = {}
        for ename, ebody in _mapping(body["evaluate"], f"{field}.evaluate", fail).items():
            efield = f"{field}.evaluate.{ename}"
            if not isinstance(ename, str) or not NAME.match(ename) or ename in names:
                raise fail(efield, "expected a name of its own (letters, digits, '.', '_', '-'), once in the file")
            names.add(ename)
            chance = ebody.pop("chance", None) if isinstance(ebody, dict) else None
            if chance is not None and not (isinstance(chance, int | float) and not isinstance(chance, bool)):
                raise fail(f"{efield}.chance", f"{chance!r}: expected a number (the metric of a baseline)")
            field_name = ebody.pop("metric", None) if isinstance(ebody, dict) else None
            if field_name is not None and not (isinstance(field_name, str) and FIELD.match(field_name)):
                raise fail(f"{efield}.metric", f"{field_name!r}: expected a result field, e.g. digit_accuracy")
            st = _section("evaluate", ebody, efield, fail)
            evals[ename] = dataclasses.replace(st, chance=None if chance is None else float(chance), metric=field_name)
        probes[name] = Probe(ft, evals)
    return tuple(sorted(b)), probes


def _reference(v, arms: dict, fail) -> str | dict[str, str]:
    pairs = v.items() if isinstance(v, dict) and v else [(None, v)]
    for arm, ref in pairs:
        for field, name in ((f"reference.{arm}", arm), ("reference" if arm is None else f"reference.{arm}", ref)):
            if name is not None and (not isinstance(name, str) or name not in arms):
                raise fail(field, f"{name!r} is not an arm (arms: {', '.join(arms)})")
    return dict(v) if isinstance(v, dict) else v


def _unknown(d: dict, allowed: set[str], prefix: str, fail) -> None:
    extra = [k for k in d if k not in allowed]
    if extra:
        raise fail(f"{prefix}{extra[0]}", f"unknown key; expected one of {', '.join(sorted(allowed))}")


def _mapping(v, field: str, fail) -> dict:
    if not isinstance(v, dict) or not v:
        raise fail(field, f"expected a non-empty mapping, got {v!r}")
    return v


def _seeds(v, fail) -> tuple[int, ...]:
    ok = isinstance(v, list) and v and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v)
    if not ok:
        raise fail("seeds", f"{v!r}: expected a non-empty list of non-negative integers, e.g. [0, 1, 2]")
    if len(set(v)) != len(v):
        raise fail("seeds", f"{v!r}: expected distinct seeds (each gets its own runs)")
    return tuple(v)


def _stages(v, fail) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise fail("stages", f"{v!r}: expected a list, e.g. [pretrain, finetune, evaluate]")
    unknown = [s for s in v if s not in STAGES]
    if unknown:
        raise fail("stages", f"unknown stage {unknown[0]!r}; expected some of {', '.join(STAGES)}")
    ok = [list(STAGES[i:j]) for i in (0, 1) for j in range(i + 1, len(STAGES) + 1)]
    if v not in ok:
        raise fail(
            "stages", f"{v!r}: expected consecutive stages in the order {' → '.join(STAGES)}, from pretrain or finetune"
        )
    return tuple(v)


def _arm(name, body, stages: tuple[str, ...], sweep: bool, fail) -> dict[str, Stage]:
    if not isinstance(name, str) or not NAME.match(name):
        raise fail(f"arms.{name}", "an arm's name is a directory name: letters, digits, '.', '_', '-'")
    body = _mapping(body, f"arms.{name}", fail)
    _unknown(body, set(STAGES), f"arms.{name}.", fail)
    if sweep and set(body) != {"pretrain"}:
        raise fail(
            f"arms.{name}", "a budget sweep's arms give only pretrain: finetuning and evaluation are the probes'"
        )
    out = {}
    for stage, section in body.items():
        out[stage] = _section(stage, section, f"arms.{name}.{stage}", fail)
    for k in ("train.steps", "train.keep_steps"):
        if sweep and any(x.split("=")[0].strip() == k for x in out["pretrain"].set):
            raise fail(f"arms.{name}.pretrain.set", f"{k}: a budget sweep sets it from budgets; drop it")
    if "evaluate" in stages:
        out.setdefault("evaluate", Stage())
    for stage in stages:
        if stage not in out and not (stage == "pretrain" and _starts_elsewhere(out)):
            raise fail(f"arms.{name}", f"has no {stage} section (stages: {', '.join(stages)})")
    if "pretrain" not in stages and "finetune" in stages and not _starts_elsewhere(out):
        raise fail(f"arms.{name}.finetune", "stages start at finetune: give ckpt: RUN_DIR or init: random")
    for stage in out:
        if stage not in stages and stage != "pretrain":
            raise fail(f"arms.{name}.{stage}", f"given, but {stage} is not in stages ({', '.join(stages)})")
    return out


def _section(stage: str, section, field: str, fail) -> Stage:
    """One stage's section (an arm's, or a probe's finetune or evaluation) as a Stage."""
    section = {} if section is None else section
    if not isinstance(section, dict):
        raise fail(field, f"expected a mapping (recipe, set, ...), got {section!r}")
    if stage == "analyze":
        return Stage(analyses=_analyses(section, field, fail))
    _unknown(section, STAGE_KEYS[stage], f"{field}.", fail)
    sets = section.get("set", [])
    sets = [sets] if isinstance(sets, str) else sets
    if isinstance(sets, list):  # lists in the list are spliced in (YAML anchors: set: [*model, *task, x=1])
        sets = [x for item in sets for x in (item if isinstance(item, list) else [item])]
    if not isinstance(sets, list) or not all(isinstance(s, str) and "=" in s for s in sets):
        raise fail(f"{field}.set", f"{sets!r}: expected a list of KEY=VALUE overrides, e.g. [train.steps=20]")
    sets = [_expand(x, f"{field}.set", fail) for x in sets]
    kw = {k: v for k, v in section.items() if k != "set"}
    if isinstance(kw.get("ckpt"), str):
        kw["ckpt"] = _expand(kw["ckpt"], f"{field}.ckpt", fail)
    for k in ("recipe", "task", "ckpt", "split"):
        if k in kw and not (isinstance(kw[k], str) and kw[k]):
            raise fail(f"{field}.{k}", f"{kw[k]!r}: expected a non-empty string")
    if kw.get("init", "pretrained") not in ("pretrained", "random"):
        raise fail(f"{field}.init", f"{kw['init']!r}: expected pretrained or random")
    for k, default in (("batch_size", 32), ("limit", 1), ("step", 1)):
        v = kw.get(k, default)
        if not _positive(v):
            raise fail(f"{field}.{k}", f"{v!r}: expected a positive integer")
    if "entries" in kw:
        kw["entries"] = _entries(kw["entries"], f"{field}.entries", fail)
    if kw.get("ckpt") and not (Path(kw["ckpt"]).expanduser() / "run.json").is_file():
        raise fail(f"{field}.ckpt", f"{kw['ckpt']!r}: not an ssmlm run directory (expected run.json)")
    return Stage(set=tuple(sets), **kw)


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _entries(v, field: str, fail) -> tuple[int, int]:
    """``entries: 4`` or ``[2, 8]``: phone books of that many entries."""
    lo_hi = [v, v] if not isinstance(v, list) else v
    if len(lo_hi) != 2 or not all(map(_positive, lo_hi)) or lo_hi[0] > lo_hi[1]:
        raise fail(field, f"{v!r}: expected a number of entries (4) or a range [LO, HI]")
    return (lo_hi[0], lo_hi[1])


def _analyses(section: dict, field: str, fail) -> tuple:
    """``analyze: {NAME: {option: value}}``: `ssmlm analyze NAME`'s options but --ckpt and --out (each run's own
    analysis goes to RUN/analysis); checked against the command's parameters."""
    import inspect

    from ssmlm.analyze import registry

    known = registry()
    out = []
    for name, opts in section.items():
        if name not in known:
            raise fail(f"{field}.{name}", f"unknown analysis; expected one of {', '.join(sorted(known))}")
        opts = {} if opts is None else opts
        if not isinstance(opts, dict):
            raise fail(f"{field}.{name}", f"{opts!r}: expected a mapping of the command's options (or {{}})")
        params = set(inspect.signature(known[name].command).parameters) - {"ckpt", "out"}
        for k in opts:
            if k not in params:
                raise fail(f"{field}.{name}.{k}", f"unknown option; expected one of {', '.join(sorted(params))}")
        out.append((name, tuple(opts.items())))
    return tuple(out)


def _expand(value: str, field: str, fail) -> str:
    """``${NAME}`` from the environment (data prepared elsewhere, e.g. benchmarks/transfer.py's task files)."""
    missing = [m for m in ENV_VAR.findall(value) if m not in os.environ]
    if missing:
        raise fail(field, f"{value!r}: environment variable {missing[0]} is not set")
    return ENV_VAR.sub(lambda m: os.environ[m.group(1)], value)


def _starts_elsewhere(arm: dict[str, Stage]) -> bool:
    ft = arm.get("finetune")
    return ft is not None and (ft.init == "random" or bool(ft.ckpt))


def _metric(v, goal, bounds, stages, fail) -> Metric:
    if not isinstance(v, str) or v.count(":") != 1 or not all(v.split(":")):
        raise fail("metric", f"{v!r}: expected STAGE:FIELD, e.g. finetune:accuracy or evaluate:accuracy")
    stage, field = v.split(":")
    if stage == "analyze":
        raise fail("metric", f"{v!r}: an analysis has no metric; expected pretrain, finetune or evaluate")
    if stage not in stages:
        raise fail("metric", f"{v!r}: stage {stage!r} is not in stages ({', '.join(stages)})")
    if goal is None:
        goal = "min" if any(w in field.lower() for w in LOWER_IS_BETTER) else "max"
    if goal not in ("max", "min"):
        raise fail("goal", f"{goal!r}: expected max or min")
    if bounds == "default":  # ssmlm's accuracies are fractions
        bounds = (0.0, 1.0) if field.lower().endswith("accuracy") else None
    elif bounds is not None:
        number = lambda b: isinstance(b, int | float) and not isinstance(b, bool)  # noqa: E731
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(map(number, bounds)) and bounds[0] < bounds[1]):
            raise fail("bounds", f"{bounds!r}: expected [LOW, HIGH] with LOW < HIGH (e.g. [0, 1]), or null")
        bounds = (float(bounds[0]), float(bounds[1]))
    return Metric(stage, field, goal, bounds)


def _grid(v, stages, fail) -> dict[str, dict[str, list]]:
    if v is None:
        return {}
    grid = _mapping(v, "grid", fail)
    out = {}
    for stage, keys in grid.items():
        if stage not in ("pretrain", "finetune") or stage not in stages:
            raise fail(f"grid.{stage}", f"expected a training stage of this experiment ({', '.join(stages)})")
        keys = _mapping(keys, f"grid.{stage}", fail)
        for key, values in keys.items():
            if not isinstance(values, list) or not values:
                raise fail(f"grid.{stage}.{key}", f"{values!r}: expected a non-empty list of values")
        out[stage] = dict(keys)
    return out


def check_recipes(exp: Experiment, fail) -> None:
    """Load every recipe an arm runs, at every grid point (instant: no data is read); the grid's rules."""
    from ssmlm.recipe import load_recipe

    for arm, stages in exp.arms.items():
        for point in exp.points():
            for stage in ("pretrain", "finetune"):
                if stage not in stages:
                    continue
                s = stages[stage]
                sets = [*stage_overrides(s), *point_overrides(point, stage), f"train.seed={exp.seeds[0]}"]
                try:
                    r = load_recipe(s.recipe or DEFAULT_RECIPE[stage], sets)
                except UserError as e:
                    raise fail(f"arms.{arm}.{stage}", str(e)) from None
                if stage == "finetune":
                    _check_task(r, exp, f"arms.{arm}.finetune", fail)
    for name, probe in exp.probes.items():
        sets = [*stage_overrides(probe.finetune), f"train.seed={exp.seeds[0]}"]
        try:
            r = load_recipe(probe.finetune.recipe or DEFAULT_RECIPE["finetune"], sets)
        except UserError as e:
            raise fail(f"probes.{name}.finetune", str(e)) from None
        _check_task(r, exp, f"probes.{name}.finetune", fail)
    for arm, stages in exp.arms.items():
        for key, ev in [(f"arms.{arm}.evaluate", stages.get("evaluate"))] + [
            (f"probes.{p}.evaluate.{e}", st) for e, (p, st) in exp.evaluations().items()
        ]:
            if ev is not None and ev.entries and ev.task != "phonebook":
                raise fail(f"{key}.entries", "only phone books have entries: give task: phonebook")
            if ev is not None and ev.task == "phonebook" and ev.split not in SPLIT_SEEDS:
                raise fail(f"{key}.split", f"{ev.split!r}: phone books are drawn for {' or '.join(SPLIT_SEEDS)}")


def stage_overrides(s: Stage) -> list[str]:
    step = [f"train.init_step={s.step}"] if s.step else []
    return [*s.set, *([f"task.name={json.dumps(s.task)}"] if s.task else []), *step]


def _check_task(r, exp: Experiment, field: str, fail) -> None:
    if not (r.task.name or r.task.train_file):
        raise fail(field, "no task: give task: NAME (e.g. builtin-order) or set task.train_file=...")
    # a language model's task is checked by its training code; a local task (task.train_file) may have any name
    if r.task.name and r.task.name not in finetuning_tasks() and not r.task.train_file:
        from ssmlm.data.tasks import get_task

        try:
            get_task(r.task.name)
        except UserError as e:
            raise fail(f"{field}.task", str(e)) from None
    if not exp.grid:
        return
    if exp.metric.stage != "evaluate" or "evaluate" not in exp.stages:
        raise fail(
            "grid",
            "the best point is selected on validation, so the reported metric must come from a "
            "separate test split: stages ending in evaluate, metric evaluate:FIELD",
        )
    arm = field.split(".")[1]
    split = exp.arms[arm]["evaluate"].split
    if split.startswith("validation"):
        raise fail(
            f"arms.{arm}.evaluate.split",
            f"{split!r}: a grid is selected on validation; report it on a test split (split: test)",
        )
    if split == "test" and r.task.name != "phonebook" and not (r.task.test_file or r.task.data_dir):
        raise fail(field, "a grid needs a test split to report on: set task.test_file=FILE (with labels)")
