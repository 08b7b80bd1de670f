"""Fit before you rent: compile a recipe's training step for a named TPU slice or GPU node from this machine
(`ssmlm pretrain RECIPE --dry-run --target v5e:4x4`) and report what it needs there.

The step is the run's own (ssmlm.train.step.StepSpec: model, loss, optimizer, mesh, shardings, grad_accum, remat,
dtypes) around an abstract model, so nothing is allocated at full size and no data is read; the devices are the
target's abstract ones (ssmlm.targets). XLA's compiler for that platform then gives, per chip:

- memory: arguments (parameters and optimizer state, donated: updated in place), outputs, temporaries and
  generated code, against the chip's HBM. An out-of-memory compile is a result (the TPU compiler refuses a
  program that cannot fit and says how much it needed), not an error;
- the collectives in the compiled program, each counted as often as it runs: an op inside a loop (the layer scan,
  gradient accumulation) runs once per trip, read from the loop's known trip count where the compiler wrote one
  (the GPU compiler), else from the loop's condition, start and step (libtpu's programs); a loop of another form
  is counted once and named in the report;
- a roofline estimate: the step cannot be faster than its FLOPs at peak, its unavoidable HBM traffic at full
  bandwidth, or its collective bytes at full interconnect bandwidth; so tokens/s and MFU have upper bounds.
  FLOPs are ssmlm's analytic count (ssmlm.models.flops): XLA's cost analysis counts a loop's body once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
import warnings
from collections import defaultdict
from collections.abc import Callable

from flax import nnx

from ssmlm.errors import UserError
from ssmlm.recipe import Recipe
from ssmlm.targets import Target, devices
from ssmlm.train.mesh import check_batch, make_mesh
from ssmlm.train.step import StepSpec

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")


@dataclasses.dataclass
class Work:
    """What kind of step: the model (its config and builder), its loss and its batch layout
    (ssmlm.objectives.shapes)."""

    cfg: object  # the model's config (ssmlm.models.config)
    build: Callable  # cfg -> the model (called under nnx.eval_shape: nothing is allocated)
    loss_fn: Callable
    layout: str
    seq_len: int
    predictions: int | None  # scored positions per row (MLM), for the FLOPs and the batch

    @functools.cached_property
    def model(self):
        return nnx.eval_shape(lambda: self.build(self.cfg))

    def with_model(self, **changes) -> Work:
        """The same work on a model whose config has ``changes`` (e.g. remat=True)."""
        return dataclasses.replace(self, cfg=dataclasses.replace(self.cfg, **changes))


def pretraining_work(recipe: Recipe, vocab_size: int) -> Work:
    """Pretraining (and extend-length) of ``recipe``'s model: MLM for encoders, the LM objective for LMs."""
    from ssmlm.models import build_pretraining_model, is_lm, with_vocab
    from ssmlm.objectives import objective_class, predictions_per_row

    cfg = with_vocab(recipe.model, vocab_size)
    build = lambda cfg: build_pretraining_model(cfg, recipe.train.seed)  # noqa: E731
    if is_lm(cfg.arch):
        return Work(cfg, build, objective_class("lm").loss, "lm", recipe.seq_len, None)
    preds = predictions_per_row(recipe.objective, recipe.seq_len)
    return Work(cfg, build, objective_class(recipe.objective.kind).loss, "mlm", recipe.seq_len, preds)


def step_spec(recipe: Recipe, work: Work, devs: list, hosts: int, platform: str) -> StepSpec:
    """The run's step for ``recipe`` over ``devs`` (fed by ``hosts`` processes; compiled for ``platform``), with
    the abstract model's parameters (UserError when its batch does not split there)."""
    from ssmlm.objectives.shapes import batch_shapes
    from ssmlm.train.optim import make_optimizer

    t = recipe.train
    mesh = make_mesh(recipe.mesh, devs)
    if t.batch_size % t.grad_accum:
        raise UserError(f"train.batch_size = {t.batch_size} is not divisible by train.grad_accum = {t.grad_accum}")
    check_batch(t.batch_size, mesh, processes=hosts, grad_accum=t.grad_accum)
    graphdef, params = nnx.split(work.model, nnx.Param)
    tx = make_optimizer(t, max(t.steps, 1), params, work.cfg).tx  # the schedule's length changes no shape
    batch = batch_shapes(work.layout, t.batch_size, work.seq_len, work.predictions)
    return StepSpec(work.loss_fn, tx, graphdef, params, mesh, batch, t.seed, t.grad_accum, platform)


def compile_step(spec: StepSpec, what: str = "the step") -> tuple[object | None, str | None, float]:
    """(compiled executable or None, XLA's out-of-memory message or None, compile seconds). With jax's persistent
    compilation cache on, jax stores a compile-only program but cannot load it back (it needs a device client),
    warns and compiles again: that warning says nothing here and is not shown."""
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Error reading persistent compilation cache entry")
            compiled = spec.lower().compile()
    except Exception as e:  # XLA's errors are one RuntimeError class; only running out of memory is a result
        message = str(e)
        if "RESOURCE_EXHAUSTED" in message or "exceeds available" in message or "Ran out of memory" in message:
            return None, message, time.perf_counter() - start
        raise UserError(f"XLA could not compile {what}: {first_line(message)}") from None
    return compiled, None, time.perf_counter() - start


def first_line(message: str) -> str:
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    return lines[0][:300] if lines else "(no message)"


# ---- memory


def memory_of(compiled, oom: str | None, hbm: int) -> dict:
    """Per-chip bytes of the compiled step, and whether they fit ``hbm``. ``total`` counts donated arguments once
    (their outputs reuse them: XLA's alias bytes)."""
    if compiled is None:
        return {"fits": False, "total": needed_bytes(oom), "hbm": hbm, "oom_message": first_line(oom or "")}
    m = compiled.memory_analysis()
    out = {
        "arguments": int(m.argument_size_in_bytes),
        "outputs": int(m.output_size_in_bytes),
        "aliased": int(m.alias_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
        "generated_code": int(m.generated_code_size_in_bytes),
    }
    out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"] + out["generated_code"]
    out.update(hbm=hbm, fits=out["total"] <= hbm)
    return out


_SIZE = re.compile(r"\(([\d.]+)([KMGT]?)\)")


def needed_bytes(message: str | None) -> int | None:
    """The memory XLA said the program needs, from its out-of-memory message ("... temporaries (48.65G) exceeds
    available HBM (15.75G)"): the first figure, None when there is none."""
    for value, unit in _SIZE.findall(message or ""):
        return int(float(value) * 1024 ** " KMGT".index(unit or " "))
    return None


# ---- collectives, counted as often as they run


_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_CALLEE = re.compile(r"(?:body|to_apply|calls|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OP = re.compile(r"=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_SHAPE = re.compile(r"(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4}
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    comps: dict[str, list[str]] = {}
    entry, name = "", None
    for line in hlo.splitlines():
        m = _COMPUTATION.match(line)
        if m and "=" not in line.split("(")[0]:
            name = m.group(1)
            comps[name] = []
            if line.lstrip().startswith("ENTRY"):
                entry = name
        elif name is not None:
            comps[name].append(line)
    return comps, entry


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([\w\-]+)\(([^)]*)\)(.*)$")
_INDEX = re.compile(r"\bindex=(\d+)")
_DIRECTION = re.compile(r"\bdirection=(\w+)")
_CONDITION = re.compile(r"\bcondition=%?([\w.\-]+)")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_FUSED = re.compile(r"\bcalls=%?([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_PASS_THROUGH = ("copy", "bitcast", "convert")  # value-preserving for a scalar counter
_FLIPPED = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}


@dataclasses.dataclass(frozen=True)
class _Instr:
    op: str
    operands: tuple[str, ...]
    inside: str  # the text inside the parentheses: a constant's value, a parameter's number
    attrs: str  # the text after them (index=, direction=, calls=, backend_config=...)


class _Program:
    """A compiled program's computations, their instructions parsed on demand, and the values of the scalars a
    loop is counted by: ("const", n), ("counter", i) (element i of the loop's tuple), (op, direction, operands)
    for compare/add/subtract, None for anything else. Fusions are looked into (the GPU compiler fuses a loop's
    compare and its counter's add), copies and bitcasts looked through."""

    def __init__(self, comps: dict[str, list[str]]):
        self.comps = comps
        self._parsed: dict[str, tuple[dict[str, _Instr], str | None]] = {}

    def instructions(self, comp: str) -> tuple[dict[str, _Instr], str | None]:
        """``comp``'s instructions by name, and its root's name."""
        if comp not in self._parsed:
            self._parsed[comp] = self._parse(comp)
        return self._parsed[comp]

    def _parse(self, comp: str) -> tuple[dict[str, _Instr], str | None]:
        out, root = {}, None
        for line in self.comps.get(comp, []):
            if m := _INSTR.match(line):
                name, op, inside, rest = m.groups()
                out[name] = _Instr(op, tuple(re.findall(r"%([\w.\-]+)", inside)), inside, rest)
                if line.lstrip().startswith("ROOT"):
                    root = name
        return out, root

    def value(self, comp: str, name: str, args: tuple | None = None, depth: int = 0):
        """The value of ``name`` in ``comp``; ``args``: a fusion's operands' values, for its parameters."""
        ins = self.instructions(comp)[0].get(name)
        if ins is None or depth > 64:
            return None
        at = lambda o: self.value(comp, o, args, depth + 1)  # noqa: E731
        if ins.op in _PASS_THROUGH and len(ins.operands) == 1:
            return at(ins.operands[0])
        if ins.op == "constant":
            try:
                return ("const", int(ins.inside.strip()))
            except ValueError:  # a float, an array, true/false: no loop's bound
                return None
        if ins.op == "parameter":  # the loop's own tuple, or a fusion's operand
            k = int(ins.inside.strip())
            return ("tuple",) if args is None else args[k] if k < len(args) else None
        if ins.op == "get-tuple-element" and (m := _INDEX.search(ins.attrs)) and len(ins.operands) == 1:
            return ("counter", int(m.group(1))) if at(ins.operands[0]) == ("tuple",) else None
        if ins.op == "fusion" and (m := _FUSED.search(ins.attrs)):
            root = self.instructions(m.group(1))[1]
            inner = tuple(at(o) for o in ins.operands)
            return self.value(m.group(1), root, inner, depth + 1) if root else None
        if ins.op in ("compare", "add", "subtract") and len(ins.operands) == 2:
            d = _DIRECTION.search(ins.attrs)
            return (ins.op, d.group(1) if d else "", tuple(at(o) for o in ins.operands))
        return None

    def trip_count(self, caller: str, while_line: str) -> int | None:
        """How many times a while loop runs, read as XLA's own loop analysis reads it, for the compilers that write
        no known_trip_count (libtpu): the condition compares a counter (element i of the loop's tuple) with a
        constant, the tuple the loop starts from holds a constant there and the body adds a constant to it. None
        when the loop is not of that form."""
        cond, body, w = _CONDITION.search(while_line), _BODY.search(while_line), _INSTR.match(while_line)
        if not (cond and body and w and len(w.group(3).split(",")) == 1):
            return None
        cond_root = self.instructions(cond.group(1))[1]
        test = self.value(cond.group(1), cond_root) if cond_root else None
        if not (test and test[0] == "compare"):
            return None
        direction, (a, b) = test[1], test[2]
        if b and b[0] == "counter" and a and a[0] == "const":  # N > i: i < N
            direction, a, b = _FLIPPED.get(direction, direction), b, a
        if not (a and a[0] == "counter" and b and b[0] == "const"):
            return None
        index, bound = a[1], b[1]
        # the counter's start: element ``index`` of the tuple the loop is given
        caller_ins = self.instructions(caller)[0]
        init = caller_ins.get(w.group(3).strip().lstrip("%"))
        while init is not None and init.op in _PASS_THROUGH and len(init.operands) == 1:
            init = caller_ins.get(init.operands[0])
        if init is None or init.op != "tuple" or index >= len(init.operands):
            return None
        start = self.value(caller, init.operands[index])
        # its step: the body's result holds counter + constant (or counter - constant) at ``index``
        body_ins, body_root = self.instructions(body.group(1))
        out = body_ins.get(body_root) if body_root else None
        if not (start and start[0] == "const" and out and out.op == "tuple" and index < len(out.operands)):
            return None
        upd = self.value(body.group(1), out.operands[index])
        if not (upd and upd[0] in ("add", "subtract")):
            return None
        x, y = upd[2]
        if upd[0] == "add" and y == ("counter", index) and x and x[0] == "const":
            x, y = y, x
        if x != ("counter", index) or not (y and y[0] == "const"):
            return None
        return _trips(start[1], bound, y[1] if upd[0] == "add" else -y[1], direction)


def _trips(start: int, bound: int, step: int, direction: str) -> int | None:
    """Iterations of ``for (i = start; i DIRECTION bound; i += step)``; None for a loop that never ends."""
    if direction in ("LT", "LE") and step > 0:
        last = bound - 1 if direction == "LT" else bound
        return max(0, (last - start) // step + 1)
    if direction in ("GT", "GE") and step < 0:
        last = bound + 1 if direction == "GT" else bound
        return max(0, (start - last) // -step + 1)
    if direction == "NE" and step and (bound - start) % step == 0 and (bound - start) // step >= 0:
        return (bound - start) // step
    return None


def while_loops(hlo: str) -> list[dict]:
    """Each while loop of a compiled program: its op name, the compiler's known_trip_count (None where it wrote
    none) and the count read from the loop itself (None where it is not of the form read)."""
    comps, _ = _computations(hlo)
    program = _Program(comps)
    out = []
    for caller, lines in comps.items():
        for line in lines:
            if " while(" in line:
                known, name = _TRIP.search(line), _OP_NAME.search(line)
                out.append({
                    "op_name": name.group(1) if name else line.split("=")[0].strip(),
                    "known_trip_count": int(known.group(1)) if known else None,
                    "read": program.trip_count(caller, line),
                })  # fmt: skip
    return out


def _callees(line: str) -> list[str]:
    """The computations an instruction calls (a while's body, a fusion's, a conditional's branches; not a while's
    condition: it holds no collective)."""
    out = _CALLEE.findall(line)
    if b := _BRANCHES.search(line):
        out += [c.strip().lstrip("%") for c in b.group(1).split(",")]
    return out


def _runs(comps: dict[str, list[str]], entry: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """How many times each computation runs per step (a while body its trip count times its caller's; nested loops
    multiply), and the loops whose trip count could not be read ((body, the loop's op name)): counted once. A
    loop's count is the compiler's known_trip_count where it wrote one (the GPU compiler does), else read from the
    loop itself (_Program.trip_count)."""
    program = _Program(comps)
    callers: dict[str, list[tuple[str, int]]] = defaultdict(list)
    unknown = []
    for caller, lines in comps.items():
        for line in lines:
            trip = 1
            if " while(" in line:
                if m := _TRIP.search(line):
                    trip = int(m.group(1))
                elif (found := program.trip_count(caller, line)) is not None:
                    trip = found
                elif body := _BODY.search(line):
                    name = _OP_NAME.search(line)
                    unknown.append((body.group(1), name.group(1) if name else line.split("=")[0].strip()))
            for callee in _callees(line):
                if callee in comps:
                    callers[callee].append((caller, trip))

    @functools.cache
    def runs(name: str) -> int:  # a sum over every call site: a computation called from two places runs twice
        return 1 if name == entry else sum(runs(c) * trip for c, trip in callers[name])

    return {name: runs(name) for name in comps}, unknown


_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")


def _group_size(line: str, chips: int) -> int:
    """Devices in each group of a collective, from its replica_groups in any of XLA's three spellings."""
    if m := _GROUPS_MESH.search(line):  # mesh['axis_0'=4,'axis_1'=2] {'axis_0'}: the named axes' sizes
        sizes = {k.strip("' "): int(v) for k, v in (kv.split("=") for kv in m.group(1).split(","))}
        return math.prod(sizes[a.strip("' ")] for a in m.group(2).split(",") if a.strip())
    if m := _GROUPS_IOTA.search(line):  # [groups, size]<=[devices]
        return int(m.group(2))
    if m := _GROUPS.search(line):  # {{0,1,2,3},{4,5,6,7}}
        return len([x for x in m.group(1).split(",") if x])
    return chips


def collectives(hlo: str, chips: int) -> tuple[dict[str, dict], list[str]]:
    """{kind: {ops, runs, bytes}} per chip: ``ops`` in the program text, ``runs`` per step (loops unrolled by
    their trip counts), ``bytes`` each chip sends per step (ring algorithms: an all-gather or reduce-scatter of
    S bytes over n chips moves S·(n−1)/n, an all-reduce twice that, a permute S). The TPU compiler writes a
    reduce-scatter as an all-reduce inside a fusion named all-reduce-scatter: counted as the reduce-scatter it is.
    Second: the loops holding collectives whose trip count could not be read (their op names): each counted once,
    so the counts are then lower bounds."""
    comps, entry = _computations(hlo)
    runs, unknown = _runs(comps, entry)
    out = {k: {"ops": 0, "runs": 0, "bytes": 0} for k in COLLECTIVES}
    with_ops = set()
    for name, lines in comps.items():
        for line in lines:
            m = _OP.search(line)
            if not m or "-done(" in line:
                continue
            with_ops.add(name)
            kind, n = m.group(2), _group_size(line, chips)
            if kind == "all-reduce" and name.startswith("all-reduce-scatter"):
                kind = "reduce-scatter"  # the TPU compiler's reduce-scatter: an all-reduce fused with its slice
            # the result: the gathered tensor, the scattered shard (an async start's tuple holds its operand and
            # its result, and bookkeeping scalars: the largest is the result)
            sizes = [_BYTES.get(dt, 8) * _prod(dims) for dt, dims in _SHAPE.findall(m.group(1))]
            size = (max(sizes) if "-start(" in line else sum(sizes)) if sizes else 0
            # a reduce-scatter's result is its shard, but the size taken is the whole tensor where the line shows it:
            # an async start's operand, the fused TPU form's all-reduce
            whole = "-start(" in line or name.startswith("all-reduce-scatter")
            moved = {
                "all-gather": size * (n - 1) / n,
                "reduce-scatter": size * (n - 1) / (n if whole else 1),
                "all-reduce": 2 * size * (n - 1) / n,
            }.get(kind, size)
            times = runs.get(name, 0)
            out[kind]["ops"] += 1
            out[kind]["runs"] += times
            out[kind]["bytes"] += int(moved * times)
    return out, [label for body, label in unknown if runs.get(body) and _reaches(comps, body, with_ops)]


def _reaches(comps: dict[str, list[str]], start: str, targets: set[str]) -> bool:
    """Whether ``start`` or a computation it calls (at any depth) is one of ``targets``."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in targets:
            return True
        if name not in seen:
            seen.add(name)
            for line in comps.get(name, []):
                todo += _callees(line)
    return False


def _prod(dims: str) -> int:
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n


# ---- the roofline


def per_device(target: Target) -> float:
    """The share of a chip one jax device is (1/2 where libtpu counts TensorCores: v3, v4)."""
    return target.chips / target.num_devices


def roofline(target: Target, model_flops: float, remat: bool, memory: dict, comm_bytes: int, tokens: int) -> dict:
    """Lower bounds on the step time (seconds) and so upper bounds on tokens/s and MFU: an estimate from the
    target's datasheet figures (ssmlm.targets), not a measurement. Compute: the step's FLOPs (with remat the
    forward runs twice: 8 of every 6 model FLOPs) spread evenly at peak; memory: each device reads and writes its
    parameters and optimizer state once (the arguments), at full HBM bandwidth; interconnect: each device's
    collective bytes at full bandwidth. The bound assumes all three overlap perfectly."""
    acc, share = target.accelerator, per_device(target)
    peak = target.chips * acc.peak_bf16_flops
    bounds = {"compute": model_flops * (8 / 6 if remat else 1.0) / peak}
    if memory.get("arguments") is not None:
        bounds["memory"] = 2 * memory["arguments"] / (acc.hbm_bandwidth * share)
    if target.num_devices > 1:
        bounds["interconnect"] = comm_bytes / (acc.interconnect_bandwidth * share)
    step = max(bounds.values())
    note = None
    if acc.platform == "gpu" and target.hosts > 1:
        note = "NVLink figures for every collective: traffic between hosts runs on the network, slower"
    return {
        "note": note,
        "step_seconds_at_least": step,
        "bound_by": max(bounds, key=bounds.get),
        "bounds_seconds": bounds,
        "tokens_per_second_at_most": tokens / step,
        "mfu_at_most": model_flops / (step * peak),
    }


# ---- the report


def check_on_target(recipe: Recipe, target: Target, work: Work) -> dict:
    """Compile ``recipe``'s training step of ``work`` for ``target`` and report it (module docstring)."""
    from ssmlm.models.flops import flops_per_token, param_counts

    spec = step_spec(recipe, work, devices(target), target.hosts, target.accelerator.platform)
    compiled, oom, seconds = compile_step(spec, f"{recipe.name}'s training step for {target.name}")
    acc = target.accelerator
    memory = memory_of(compiled, oom, int(acc.hbm_bytes * per_device(target)))
    comm, unknown = collectives(compiled.as_text(), target.num_devices) if compiled is not None else ({}, [])
    t = recipe.train
    tokens = t.batch_size * work.seq_len
    model_flops = flops_per_token(work.model, work.cfg, work.seq_len, work.predictions) * tokens
    comm_bytes = sum(c["bytes"] for c in comm.values())
    mesh = dict(spec.mesh.shape)
    return {
        "recipe": recipe.name,
        "kind": work.layout,
        "target": target.name,
        "topology": target.topology,
        "accelerator": acc.name,
        "chips": target.chips,
        "devices": target.num_devices,
        "hosts": target.hosts,
        "mesh": mesh,
        "batch_size": t.batch_size,
        "grad_accum": t.grad_accum,
        "micro_batch_per_device": t.batch_size // t.grad_accum / (mesh["data"] * mesh["fsdp"]),
        "remat": bool(work.cfg.remat),
        "seq_len": work.seq_len,
        "params": param_counts(work.model)["total"],
        "compile_seconds": round(seconds, 1),
        "memory": memory,
        "model_flops_per_step": model_flops,
        "collectives": comm,
        "loops_of_unknown_count": unknown,
        "roofline": roofline(target, model_flops, bool(work.cfg.remat), memory, comm_bytes, tokens),
        "paths": spec.traced(lambda: compiled_paths(work.cfg)),
    }


def compiled_paths(cfg) -> dict[str, str]:
    """What a language model's ``auto`` choices became for the platform compiled for (read in its context): the
    recurrences' scan, the Transformer's attention (per kind of layer), each with the reason."""
    from ssmlm.models import is_lm
    from ssmlm.models.layers import DTYPES

    if not is_lm(cfg.arch):
        return {}
    if cfg.arch != "transformer_lm":
        from ssmlm.models.scan import scan_choice

        return {"scan": "{} ({})".format(*scan_choice(cfg.scan_impl))}
    from ssmlm.models.attention import attention_choice
    from ssmlm.models.lm import layer_is_bidirectional

    head = cfg.hidden_size // cfg.num_heads
    kinds = sorted({layer_is_bidirectional(cfg, i) for i in range(cfg.num_layers)})
    return {
        ("attention, prefix-LM layers" if bidir else "attention, causal layers"): "{} ({})".format(
            *attention_choice(cfg.attention, DTYPES[cfg.compute_dtype], head, bidir)
        )
        for bidir in kinds
    }


def resolve_target(text: str, recipe: Recipe) -> Target:
    """``--target``: a name ssmlm.targets knows, or ``paper``: the hardware the recipe's paper trained on."""
    from ssmlm.targets import parse_target

    if text == "paper":
        if not recipe.mesh.paper_target:
            raise UserError(
                f"--target paper: recipe {recipe.name} records no paper hardware (mesh.paper_target); name a target"
            )
        text = recipe.mesh.paper_target
    return parse_target(text)


def finetune_work(recipe: Recipe, source_model, num_labels: int, head: str) -> Work:
    """Finetuning a source run's model (``source_model``: its model config): an encoder with the task's ``head``
    (ssmlm.objectives.tasks.HEADS: classify, span), or a language model on prompt/response rows."""
    from ssmlm.models import build_pretraining_model, is_lm
    from ssmlm.objectives import objective_class
    from ssmlm.objectives.tasks import HEADS

    seq_len = recipe.task.max_seq_length or source_model.max_seq_length
    seed = recipe.train.seed
    if is_lm(source_model.arch):
        build = lambda cfg: build_pretraining_model(cfg, seed)  # noqa: E731
        return Work(source_model, build, objective_class("lm").loss, "lm", seq_len, None)
    if head not in ("classify", "span"):
        raise UserError(f"--target: a {head} head (multiple choice) is not compiled ahead of time yet")
    layout = "span" if head == "span" else "regression" if num_labels == 1 else "classification"
    build = lambda cfg: HEADS[head].build(cfg, num_labels, seed)  # noqa: E731
    return Work(source_model, build, HEADS[head].loss, layout, seq_len, None)


def dry_run_on_target(recipe: Recipe, work: Work, target_text: str, quiet: bool = False) -> dict:
    """`--dry-run --target`: the report of ``recipe``'s step of ``work`` compiled for the target, each phase
    shown with a spinner and its elapsed time (a compile takes seconds to minutes on a small CPU machine)."""
    from ssmlm.progress import activity

    target = resolve_target(target_text, recipe)
    with activity(f"{target.name}: getting its {target.num_devices} compile-only devices", quiet):
        devices(target)
    with activity(f"compiling {recipe.name}'s training step for {target.name} ({target.chips} chips)", quiet):
        return check_on_target(recipe, target, work)
