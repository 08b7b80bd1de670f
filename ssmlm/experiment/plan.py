"""The plan of an experiment: every stage of every arm × seed (× grid point) as a job whose run directory is
OUT/runs/ARM/seedS/STAGE, in the order of work.

Seed by seed: every stage of seed 0 of every arm (pretrain → finetune → evaluate → analyze; arms that pretrain
identically share the run) before anything of seed 1, so that an experiment stopped early already holds complete
pairs to compare. With a grid, the evaluations and analyses are planned only after the selection (later_jobs).
A budget sweep pretrains each arm × seed once (OUT/runs/ARM/seedS/pretrain, to the largest budget) and runs every
probe from each budget's checkpoint (OUT/runs/ARM/seedS/PROBE-stepB), each followed by its evaluations.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ssmlm.experiment.spec import (
    DEFAULT_RECIPE,
    Experiment,
    point_label,
    point_overrides,
    stage_overrides,
)


@dataclasses.dataclass
class Job:
    """One run: a training stage (recipe → run_dir) or an evaluation of run_dir."""

    key: str
    kind: str  # pretrain | finetune | evaluate | analyze
    label: str
    run_dir: Path
    recipe: Any = None
    init: str = "pretrained"
    split: str = "validation"
    batch_size: int = 32
    task: str | None = None  # evaluate: a language model's task (phonebook, …); None: the run's own metrics
    limit: int | None = None
    entries: tuple[int, int] | None = None  # evaluate: phone books of this many entries (None: the run's own)
    analysis: tuple = ()  # analyze: (NAME, its options)
    deps: tuple[str, ...] = ()
    arm: str = ""  # the arm and seed it was planned for (a pretraining run shared by arms: the first)
    seed: int | None = None


@dataclasses.dataclass
class Plan:
    jobs: list[Job]  # in the order of work: seed by seed, each arm's chain of stages
    chains: dict[tuple[str, int, int], dict[str, str]]  # (arm, seed, point) -> stage -> job key
    by_key: dict[str, Job] = dataclasses.field(default_factory=dict)
    sweep: dict[tuple[str, int, str, int], str] = dataclasses.field(default_factory=dict)  # a budget sweep's
    # (arm, seed, evaluation, budget) -> its evaluation's job key

    def of_kind(self, kind: str) -> list[Job]:
        return [j for j in self.jobs if j.kind == kind]


def build_plan(exp: Experiment, out: Path) -> Plan:
    """Every run of every seed × arm × grid point, seed by seed (evaluations and analyses too, except with a
    grid: those come after the selection, see later_jobs)."""
    from ssmlm.recipe import load_recipe

    if exp.budgets:
        return _sweep_plan(exp, out)
    pre_by_recipe: dict[str, Job] = {}
    plan = Plan([], {})
    for seed in exp.seeds:
        for arm, stages in exp.arms.items():
            seed_dir = out / "runs" / arm / f"seed{seed}"
            for pi, point in enumerate(exp.points()):
                chain: dict[str, str] = {}
                plan.chains[(arm, seed, pi)] = chain
                pre = None
                if "pretrain" in stages:
                    s = stages["pretrain"]
                    sets = [*stage_overrides(s), *point_overrides(point, "pretrain"), f"train.seed={seed}"]
                    pre = load_recipe(s.recipe or DEFAULT_RECIPE["pretrain"], sets)
                if pre is not None and exp.runs_pretrain(arm):
                    name = f"pretrain{_suffix(exp, 'pretrain', pi)}"
                    job = pre_by_recipe.get(pre.to_yaml())  # the seed is in the recipe (train.seed)
                    if job is None:
                        label = f"pretrain {arm} seed {seed}{_at(point, 'pretrain')}"
                        job = Job(
                            f"{arm}/seed{seed}/{name}", "pretrain", label, seed_dir / name, pre, arm=arm, seed=seed
                        )
                        pre_by_recipe[pre.to_yaml()] = job
                        _add(plan, job)
                    chain["pretrain"] = job.key
                if "finetune" in exp.stages:
                    name = f"finetune{_suffix(exp, 'finetune', pi)}"
                    pre_dir = pre_by_recipe[pre.to_yaml()].run_dir if "pretrain" in chain else None
                    job = _finetune_job(exp, arm, seed, point, pre, pre_dir)
                    job.key, job.run_dir = f"{arm}/seed{seed}/{name}", seed_dir / name
                    job.label = f"finetune {arm} seed {seed}{_at(point, 'finetune')}"
                    job.deps = (chain["pretrain"],) if "pretrain" in chain else ()
                    job.arm, job.seed = arm, seed
                    _add(plan, job)
                    chain["finetune"] = job.key
                if not exp.grid:
                    for job in _later(exp, plan, arm, seed, pi):
                        _add(plan, job)
    return plan


def _sweep_plan(exp: Experiment, out: Path) -> Plan:
    """A budget sweep: per seed and arm, one pretraining run to the largest budget that keeps every budget's
    checkpoint, then each budget's probes (finetuning from that step, then its evaluations). The per-arm table's
    chain is the first evaluation at the largest budget."""
    from ssmlm.recipe import load_recipe

    plan, top = Plan([], {}), max(exp.budgets)
    for seed in exp.seeds:
        for arm, stages in exp.arms.items():
            seed_dir = out / "runs" / arm / f"seed{seed}"
            s = stages["pretrain"]
            sets = [*stage_overrides(s), f"train.steps={top}", f"train.keep_steps={json.dumps(list(exp.budgets))}"]
            pre = load_recipe(s.recipe or DEFAULT_RECIPE["pretrain"], [*sets, f"train.seed={seed}"])
            label = f"pretrain {arm} seed {seed} ({top:,} steps)"
            pj = Job(f"{arm}/seed{seed}/pretrain", "pretrain", label, seed_dir / "pretrain", pre, arm=arm, seed=seed)
            _add(plan, pj)
            chain = plan.chains[(arm, seed, 0)] = {"pretrain": pj.key}
            for budget in exp.budgets:
                for name, probe in exp.probes.items():
                    ft = probe.finetune
                    sets = [*stage_overrides(ft), f"train.seed={seed}"]
                    r = load_recipe(ft.recipe or DEFAULT_RECIPE["finetune"], sets)
                    r = dataclasses.replace(
                        r, train=dataclasses.replace(r.train, init_from=str(pj.run_dir), init_step=budget)
                    )
                    run = f"{name}-step{budget}"
                    label = f"{name} probe {arm} seed {seed} from step {budget:,}"
                    fj = Job(f"{arm}/seed{seed}/{run}", "finetune", label, seed_dir / run, r, arm=arm, seed=seed)
                    fj.deps = (pj.key,)
                    _add(plan, fj)
                    shared: dict[tuple, str] = {}  # the same evaluation scored by another metric: one run
                    for ename, ev in probe.evaluations.items():
                        same = (ev.split, ev.batch_size, ev.task, ev.limit, ev.entries)
                        if same in shared:
                            plan.sweep[(arm, seed, ename, budget)] = shared[same]
                            continue
                        ej = Job(
                            f"{fj.key}/evaluate-{ename}",
                            "evaluate",
                            f"evaluate {ename} {arm} seed {seed} step {budget:,}",
                            fj.run_dir,
                            split=ev.split,
                            batch_size=ev.batch_size,
                            task=ev.task,
                            limit=ev.limit,
                            entries=ev.entries,
                            deps=(fj.key,),
                            arm=arm,
                            seed=seed,
                        )
                        _add(plan, ej)
                        plan.sweep[(arm, seed, ename, budget)] = shared[same] = ej.key
            first = next(iter(exp.evaluations()))
            chain["evaluate"] = plan.sweep[(arm, seed, first, top)]
            chain["finetune"] = plan.by_key[chain["evaluate"]].deps[0]
    return plan


def _add(plan: Plan, job: Job) -> None:
    plan.jobs.append(job)
    plan.by_key[job.key] = job


def _suffix(exp: Experiment, stage: str, pi: int) -> str:
    return f"-g{pi}" if stage in exp.grid else ""


def _at(point: dict, stage: str) -> str:
    return f" [{point_label({stage: point[stage]})}]" if stage in point else ""


def _finetune_job(exp: Experiment, arm: str, seed: int, point: dict, pre, pre_dir: Path | None) -> Job:
    from ssmlm.recipe import load_recipe

    s = exp.arms[arm]["finetune"]
    sets = [*stage_overrides(s), *point_overrides(point, "finetune"), f"train.seed={seed}"]
    r = load_recipe(s.recipe or DEFAULT_RECIPE["finetune"], sets)
    init_from = s.ckpt or (str(pre_dir) if pre_dir is not None else None)
    if s.init == "random" and not s.ckpt and pre is not None:
        # the architecture and data (tokenizer) of the arm's pretrain section, which is not run; the dropout is
        # the finetuning recipe's, as a pretrained start's would be
        r = dataclasses.replace(r, model=dataclasses.replace(pre.model, dropout=r.model.dropout), data=pre.data)
    r = dataclasses.replace(r, train=dataclasses.replace(r.train, init_from=init_from))
    return Job("", "finetune", "", Path(), r, init=s.init)


def later_jobs(exp: Experiment, plan: Plan, chosen: dict[str, int]) -> list[Job]:
    """With a grid: the evaluations and analyses at each arm's chosen point, seed by seed."""
    jobs = [job for seed in exp.seeds for arm, pi in chosen.items() for job in _later(exp, plan, arm, seed, pi)]
    for job in jobs:
        plan.by_key[job.key] = job
    return jobs


def _later(exp: Experiment, plan: Plan, arm: str, seed: int, pi: int) -> list[Job]:
    """The evaluation of one arm × seed's last training run, then its analyses (each run's own, in RUN/analysis)."""
    chain = plan.chains[(arm, seed, pi)]
    target = chain.get("finetune") or chain.get("pretrain")
    run_dir = plan.by_key[target].run_dir
    out = []
    if "evaluate" in exp.stages:
        ev = exp.arms[arm]["evaluate"]
        key = f"{target}/evaluate-{ev.split}"
        out.append(
            Job(
                key,
                "evaluate",
                f"evaluate {arm} seed {seed} ({ev.task or ev.split})",
                run_dir,
                split=ev.split,
                batch_size=ev.batch_size,
                task=ev.task,
                limit=ev.limit,
                deps=(target,),
                arm=arm,
                seed=seed,
            )
        )
        chain["evaluate"] = key
    if "analyze" in exp.stages:
        deps = tuple(k for k in (target, chain.get("evaluate")) if k)
        for name, opts in exp.arms[arm]["analyze"].analyses:
            key = f"{target}/analyze-{name}"
            out.append(
                Job(
                    key,
                    "analyze",
                    f"analyze {name} {arm} seed {seed}",
                    run_dir,
                    analysis=(name, opts),
                    deps=deps,
                    arm=arm,
                    seed=seed,
                )
            )
            chain[f"analyze-{name}"] = key
    return out


def _serves(plan: Plan, pre: Job) -> str:
    """A sweep's pretraining run: the finetunings it serves, and from which steps."""
    served = [j for j in plan.jobs if j.kind == "finetune" and pre.key in j.deps]
    steps = sorted({j.recipe.train.init_step for j in served})
    return f"; serves {len(served)} finetunings, from steps {', '.join(f'{s:,}' for s in steps)}"


def _scored(exp: Experiment, plan: Plan, job: Job) -> str:
    """ "; also scored as NAME (FIELD)": the other evaluations of a sweep that read this evaluation's run."""
    stages = exp.evaluations()
    names = [e for (_, _, e, _), k in plan.sweep.items() if k == job.key]
    also = [f"{e} ({stages[e][1].metric or exp.metric.field})" for e in names[1:]]
    return f"; also scored as {', '.join(also)}" if also else ""


def dry_run_lines(exp: Experiment, out: Path) -> list[str]:
    """`ssmlm experiment --dry-run`: the runs in the order of work (seed by seed), what waits for a grid's
    selection, the metric and the reference."""
    lines = []
    plan = build_plan(exp, out)
    for job in plan.jobs:
        train = job.recipe.train if job.recipe is not None else None
        start = f" from {train.init_from}" if job.kind == "finetune" and train.init_from else ""
        start += f" at step {train.init_step:,}" if start and train.init_step else ""
        init = " (init: random)" if job.init == "random" else ""
        where = {"evaluate": "/eval", "analyze": "/analysis"}.get(job.kind, "")
        lo, hi = job.entries or (0, 0)
        books = f" (books of {lo}{f'-{hi}' if hi > lo else ''} entries)" if job.entries else ""
        serves = _serves(plan, job) if exp.budgets and job.kind == "pretrain" else ""
        serves += _scored(exp, plan, job) if exp.budgets and job.kind == "evaluate" else ""
        lines.append(f"{job.label}: {job.run_dir}{where}{start}{init}{books}{serves}")
    if "evaluate" in exp.stages and exp.grid:
        splits = ", ".join(sorted({a["evaluate"].split for a in exp.arms.values()}))
        lines.append(
            f"then evaluate ({splits}): {len(exp.arms) * len(exp.seeds)} runs at each arm's selected grid point"
        )
    if "analyze" in exp.stages and exp.grid:
        names = sorted({n for a in exp.arms.values() for n, _ in a["analyze"].analyses})
        lines.append(f"then analyze ({', '.join(names)}) each arm × seed's last run, in RUN/analysis")
    if exp.reference is None:
        ref = "none (one arm: no comparisons)"
    else:
        ref = (
            exp.reference
            if isinstance(exp.reference, str)
            else "per arm (" + ", ".join(f"{a} vs {r}" for a, r in exp.reference.items()) + ")"
        )
    lines.append(f"metric {exp.metric} ({exp.metric.goal}), reference {ref}")
    return lines
