"""`--dry-run --target NAME --fit`: the setting a user would change that makes the step fit the target, with the best
estimated throughput, printed as `--set` overrides.

The settings searched: the mesh (the recipe's own, and parameters fully sharded over every chip: fsdp), model.remat
(tried only where the step does not fit without it: it costs a second forward pass) and train.grad_accum over the
values that keep every micro-batch divisible over the batch axes. Memory falls as grad_accum grows (a micro-batch's
activations shrink; parameters, optimizer state and gradients stay), so per mesh and remat the smallest grad_accum
that fits is wanted: after two compiles the search fits memory(g) = fixed + per_rows / g to them, compiles the
predicted smallest fitting g and walks from there. The meshes are tried in turn until one fits at the compute bound
(no other layout can then raise the estimate). Every setting is compiled for real (ssmlm.train.aot) and compiled
once; the search stops after MAX_COMPILES. Among the settings that fit, the best roofline tokens/s wins (ties: the
smaller grad_accum, then no remat).
"""

from __future__ import annotations

import dataclasses
import math

from ssmlm.errors import UserError
from ssmlm.recipe import Recipe
from ssmlm.targets import Target, devices
from ssmlm.train.aot import Work, check_on_target, resolve_target

MAX_COMPILES = 12
HEADROOM = 0.97  # a predicted fit needs this share of the HBM at most (the prediction is a straight-line fit)


@dataclasses.dataclass(frozen=True)
class Setting:
    mesh: tuple[int, int, int]  # data, fsdp, tensor
    remat: bool
    grad_accum: int

    def overrides(self) -> list[str]:
        data, fsdp, tensor = self.mesh
        return [
            f"train.grad_accum={self.grad_accum}",
            f"model.remat={str(self.remat).lower()}",
            f"mesh.data={data}",
            f"mesh.fsdp={fsdp}",
            f"mesh.tensor={tensor}",
        ]

    def label(self) -> str:
        data, fsdp, tensor = self.mesh
        return f"data {data} × fsdp {fsdp} × tensor {tensor}, remat {'on' if self.remat else 'off'}, " + (
            f"grad_accum {self.grad_accum}"
        )


def accums(batch_size: int, ways: int) -> list[int]:
    """grad_accum values whose micro-batch splits evenly over ``ways`` batch shards, ascending."""
    return [g for g in range(1, batch_size + 1) if batch_size % g == 0 and (batch_size // g) % ways == 0]


def meshes(recipe: Recipe, chips: int, hosts: int = 1) -> list[tuple[int, int, int]]:
    """The recipe's own mesh on ``chips``, parameters sharded within each host and replicated across hosts (fsdp
    over the fast links, data parallel over the network: with several hosts), and fully sharded over every chip.
    A dimension that the fsdp size does not divide stays whole (ssmlm.train.mesh): d 2048 splits over 4 GPUs,
    not over 20."""
    m = recipe.mesh
    sizes = [m.data, m.fsdp, m.tensor]
    if sizes.count(-1) == 1:
        known = math.prod(s for s in sizes if s != -1)
        sizes[sizes.index(-1)] = chips // known if chips % known == 0 else 0
    own = tuple(sizes) if math.prod(sizes) == chips else None
    per_host = (hosts, chips // hosts, 1) if hosts > 1 and chips % hosts == 0 else None
    return list(dict.fromkeys(x for x in (own, per_host, (1, chips, 1)) if x is not None))


class Search:
    """Compiles settings once each, up to MAX_COMPILES, with a spinner naming each."""

    def __init__(self, recipe: Recipe, work: Work, target: Target, quiet: bool):
        self.recipe, self.work, self.target, self.quiet = recipe, work, target, quiet
        self.reports: dict[Setting, dict] = {}

    @property
    def exhausted(self) -> bool:
        return len(self.reports) >= MAX_COMPILES

    def applied(self, s: Setting) -> tuple[Recipe, Work]:
        r = self.recipe
        data, fsdp, tensor = s.mesh
        train = dataclasses.replace(r.train, grad_accum=s.grad_accum)
        mesh = dataclasses.replace(r.mesh, data=data, fsdp=fsdp, tensor=tensor)
        model = dataclasses.replace(r.model, remat=s.remat)
        return dataclasses.replace(r, train=train, mesh=mesh, model=model), self.work.with_model(remat=s.remat)

    def report(self, s: Setting) -> dict | None:
        """The compiled report of ``s`` (None once the compile budget is spent)."""
        if s not in self.reports:
            if self.exhausted:
                return None
            from ssmlm.progress import activity

            n = len(self.reports) + 1
            with activity(f"--fit: compile {n} (at most {MAX_COMPILES}): {s.label()}", self.quiet):
                self.reports[s] = check_on_target(*self._args(s))
        return self.reports[s]

    def _args(self, s: Setting):
        recipe, work = self.applied(s)
        return recipe, self.target, work

    def fits(self, s: Setting) -> bool | None:
        rep = self.report(s)
        return None if rep is None else rep["memory"]["fits"]

    def memory(self, s: Setting) -> float:
        total = self.reports[s]["memory"]["total"]
        return math.inf if total is None else float(total)


def smallest_fitting(search: Search, mesh, remat: bool, values: list[int]) -> Setting | None:
    """The smallest grad_accum of ``values`` at which (mesh, remat) fits (None: none, or the budget ran out)."""
    at = lambda g: Setting(mesh, remat, g)  # noqa: E731
    if not search.fits(at(values[-1])):  # the least memory this mesh and remat can take
        return None
    if len(values) == 1:
        return at(values[0])
    probe = values[0]
    if search.fits(at(probe)):
        return at(probe)
    i = _predicted(search, at(probe), at(values[-1]), values)
    while 0 < i < len(values):  # walk down while the one below fits, up while this one does not
        fit = search.fits(at(values[i]))
        if fit is None:
            return None
        if fit and (i == 0 or at(values[i - 1]) in search.reports):
            return at(values[i])
        i = i - 1 if fit else i + 1
    return at(values[min(i, len(values) - 1)])


def _predicted(search: Search, lo: Setting, hi: Setting, values: list[int]) -> int:
    """Index of the smallest g in ``values`` that memory(g) = fixed + per_rows / g, fitted through the two compiled
    settings, puts under the HBM (with HEADROOM)."""
    m_lo, m_hi = search.memory(lo), search.memory(hi)
    hbm = search.target.accelerator.hbm_bytes * HEADROOM
    if not math.isfinite(m_lo):
        return len(values) // 2
    inv = 1 / lo.grad_accum - 1 / hi.grad_accum
    per_rows = (m_lo - m_hi) / inv if inv else 0.0
    fixed = m_hi - per_rows / hi.grad_accum
    for i, g in enumerate(values):
        if fixed + per_rows / g <= hbm:
            return max(i, 1)
    return len(values) - 1


def fit_on_target(recipe: Recipe, work: Work, target_text: str, quiet: bool = False) -> dict:
    """Search (module docstring); {target, chosen setting and its report, every compiled setting, why none fits}."""
    target = resolve_target(target_text, recipe)
    devices(target)
    b = recipe.train.batch_size
    if not any(accums(b, m[0] * m[1]) for m in meshes(recipe, target.num_devices, target.hosts)):
        raise UserError(batch_advice(b, target))
    search = Search(recipe, work, target, quiet)
    candidates = []
    for mesh in meshes(recipe, target.num_devices, target.hosts):
        values = accums(b, mesh[0] * mesh[1])
        if not values:
            continue
        for remat in dict.fromkeys((bool(work.cfg.remat), True)):
            found = smallest_fitting(search, mesh, remat, values)
            if found is not None:
                candidates.append(found)
                break  # remat only where the step does not fit without it
        if candidates and search.reports[candidates[-1]]["roofline"]["bound_by"] == "compute":
            break  # already at the compute bound: no other mesh can raise the estimate
    tried = [{"setting": s.label(), "fits": r["memory"]["fits"], "memory": r["memory"]["total"]} for s, r in
             search.reports.items()]  # fmt: skip
    out = {"recipe": recipe.name, "target": target.name, "tried": tried, "compile_budget_spent": search.exhausted}
    if not candidates:
        return {**out, "chosen": None, "why": why_nothing_fits(search)}
    best = max(candidates, key=lambda s: (tokens_per_s(search.reports[s]), -s.grad_accum, not s.remat))
    return {**out, "chosen": best.label(), "overrides": best.overrides(), "report": search.reports[best]}


def tokens_per_s(report: dict) -> float:
    return report["roofline"]["tokens_per_second_at_most"]


def batch_advice(batch_size: int, target: Target) -> str:
    """One line: the batch does not split over the target's devices; the nearest batch sizes that would, and the
    slices of the same kind whose device count divides it."""
    n = target.num_devices
    below, above = batch_size // n * n, -(-batch_size // n) * n
    sizes = " or ".join(str(x) for x in dict.fromkeys(x for x in (below, above) if x))
    acc = target.accelerator
    if acc.tpu is not None:  # the slice sizes Cloud offers, by their names
        unit = acc.tpu.cores_per_chip if acc.tpu.slice_counts_cores else 1
        per = acc.tpu.devices_per_chip
        slices = [f"{acc.name}-{c * unit}" for c, _ in acc.tpu.shapes if batch_size % (c * per) == 0]
    else:  # GPUs: hosts of chips_per_host
        slices = [f"{acc.name}:{k}" for k in range(1, acc.chips_per_host + 1) if batch_size % k == 0]
    where = f"; or a slice it divides over: {', '.join(slices[-3:])}" if slices else ""
    return (
        f"train.batch_size = {batch_size} does not split over {target.name}'s {n} devices: use a batch of {sizes} "
        f"(--set train.batch_size=N){where}"
    )


def why_nothing_fits(search: Search) -> str:
    """Why no setting fits: what the least memory-hungry compiled setting still needs, and the parameters' and
    optimizer state's share of it."""
    hbm = search.target.accelerator.hbm_bytes
    least = min(search.reports, key=search.memory)
    rep = search.reports[least]
    gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
    need = search.memory(least)
    text = f"the least memory of the settings compiled ({least.label()}) is "
    text += f"{gib(need)} per chip, the chip has {gib(hbm)}" if math.isfinite(need) else "above the chip's HBM"
    args = rep["memory"].get("arguments")
    if args is not None:
        text += f"; parameters, optimizer state and batch alone take {gib(args)}"
        chips = search.target.num_devices
        if math.isfinite(need):
            text += (
                f"; at the same sharding about {math.ceil(need * chips / hbm)} chips of this kind would be needed "
                "(an estimate: activations do not shrink with more chips at a fixed micro-batch per chip)"
            )
    return text
