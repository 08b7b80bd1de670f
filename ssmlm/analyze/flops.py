"""`analyze flops`: training FLOPs of BiGS against BERT by input length, next to the paper's numbers (BiGS
Table 6).

For each length L, one sequence (batch 1), the MLM pretraining model's loss and gradient:
  analytic   ssmlm.models.flops.flops_per_token · L: 6 FLOPs per dense parameter per token (2 forward, 4
             backward) plus each family's mixing term (attention 12·L·d per layer; two S4D FFT convolutions,
             ≈ 60·log2(2L)·d per layer) plus the tied decoder at the masked slots.
  xla        the FLOPs XLA's cost analysis counts in the compiled loss+grad
             (``jax.jit(grad).lower(...).compile().cost_analysis()['flops']``). XLA counts a scanned layer stack
             once (a while loop's body is not multiplied by its trip count), so the model is compiled unrolled
             with 1 and with 2 layers at full width and length, and the count is extended linearly to the real
             depth: flops(n) = flops(1) + (n - 1) · (flops(2) - flops(1)). That is exact for identical layers
             and keeps the command fast on CPU (each compile takes seconds, independent of L up to 8192).
             XLA also counts element-wise work (GELU, LayerNorm, softmax, the loss), which the 6N rule leaves
             out: the two agree within a few percent at d ≥ 256 and differ by ~10% at d = 64.
  paper      BiGS Table 6, typed in from the paper: "FLOP with a batch size of 1 and considered both the forward
             and backward passes", for 128, 512, 1024 and 4096 tokens; the paper does not name the sizes.

What the paper's numbers are. Its BiGS column grows linearly in L and its BERT column as a·L + b·L², with
a ≈ 2 × (non-embedding parameters) and b ≈ 4·d·layers for the large models of its Table 1 (BiGS 23 layers,
BERT-large 24 layers, d = 1024; no base size gives BiGS/BERT = 8.1/7.9 at 128, the ratio of their
non-embedding parameters, ≈315M / 302M). 2 FLOPs per parameter per token and 4·L·d per layer for attention
are the FLOPs of the *forward* pass alone, although the paper says forward and backward: the training FLOPs
(the 6N count and XLA's) are ≈ 3× its numbers. The table gives both ratios: ``train_over_paper`` (≈ 3) and
``forward_over_paper`` (the analytic training count / 3), which is 1.00-1.03 at every length of Table 6 with
the paper's configurations (recipes bigs_full and bert_large). Its BiGS column grows exactly linearly in L, so
its counter left out the FFT convolutions (1-3% here). Measured: the default command compiles 16 programs,
about 50 s of CPU time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.errors import UserError
from ssmlm.models.config import FAMILIES, facts

NAME = "flops"
FIGURE = "BiGS Table 6"

# BiGS Table 6 (FLOPs, batch 1, "forward and backward"): length -> {column: FLOPs}
PAPER_TABLE6 = {
    128: {"BiGS": 8.1e10, "BERT": 7.9e10},
    512: {"BiGS": 3.2e11, "BERT": 3.4e11},
    1024: {"BiGS": 6.5e11, "BERT": 7.2e11},
    4096: {"BiGS": 2.6e12, "BERT": 4.1e12},
}
# The configurations Table 6's numbers fit (see the module docstring): (hidden_size, num_layers, intermediate_size)
PAPER_CONFIGS = {"BiGS": (1024, 23, 3072), "BERT": (1024, 24, 4096)}


def table6_columns() -> dict[str, str]:
    """arch -> the Table 6 column its family declares (ssmlm.models.config.ArchFacts.table6), in FAMILIES order."""
    return {arch: facts(arch).table6 for arch in FAMILIES if facts(arch).table6}


COLUMNS = (
    "model",
    "arch",
    "length",
    "predictions",
    "analytic_train_flops",
    "xla_train_flops",
    "xla_over_analytic",
    "analytic_forward_flops",
    "paper_flops",
    "train_over_paper",
    "forward_over_paper",
    "paper_config",
    "size",
)


def command(
    lengths: Annotated[
        str, typer.Option("--lengths", help="Comma-separated input lengths (default: the paper's).")
    ] = "128,512,1024,4096",
    recipe_bigs: Annotated[str, typer.Option("--recipe-bigs", help="Recipe of the BiGS model.")] = "bigs_full",
    recipe_bert: Annotated[str, typer.Option("--recipe-bert", help="Recipe of the BERT model.")] = "bert_large",
    ckpt: Annotated[
        str | None, typer.Option("--ckpt", help="Run whose model replaces its column's recipe (BiGS or BERT).")
    ] = None,
    xla: Annotated[bool, typer.Option("--xla/--no-xla", help="Also count with XLA's cost analysis.")] = True,
    out: Annotated[
        str | None, typer.Option("--out", help="Output directory (default: RUN/analysis, or ./analysis).")
    ] = None,
):
    """Count training FLOPs of BiGS and BERT by input length, next to the paper's (BiGS Table 6).

    Batch 1, loss and gradient of the MLM pretraining model: the analytic count (6 per parameter per token
    plus attention / FFT terms, ssmlm.models.flops) and XLA's cost analysis of the compiled step (compiled
    with 1 and 2 unrolled layers, extended linearly to the full depth), beside Table 6. The paper's numbers
    match a forward pass of the large models (a third of the training FLOPs): see forward_over_paper.
    Writes flops.csv, flops.json, flops.png and flops.svg.

    Example: ssmlm analyze flops --lengths 128,512,1024,4096,8192
    """
    parsed = parse_lengths(lengths)
    if ckpt is not None:
        checks.run_dir(ckpt, "--ckpt")
    from ssmlm.recipe import load_recipe

    models = {"BiGS": model_config(load_recipe(recipe_bigs)), "BERT": model_config(load_recipe(recipe_bert))}
    out_dir = Path(out) if out else Path(ckpt) / "analysis" if ckpt else Path("analysis")
    if ckpt is not None:
        from ssmlm.runs import open_run

        run = open_run(ckpt)
        arch, column = run.recipe.model.arch, table6_columns()
        if arch not in column:
            raise UserError(
                f"--ckpt {ckpt}: architecture '{arch}' is neither BiGS-family nor BERT ({', '.join(column)})"
            )
        models[column[arch]] = model_config(run.recipe)
    result = analyze_flops(models, parsed, out_dir, xla=xla)
    return result  # printed by the CLI: tables, or JSON with --json


def parse_lengths(text: str) -> list[int]:
    parts = [p.strip() for p in str(text).split(",")]
    if not all(p.isdigit() and int(p) >= 2 for p in parts):
        raise UserError(f"--lengths = {text!r}: expected comma-separated lengths of at least 2, e.g. 128,512,1024")
    return sorted({int(p) for p in parts})


@dataclasses.dataclass(frozen=True)
class Counted:
    """A model to count: its config (vocab filled in) and the MLM prediction slots at its own length."""

    cfg: object
    masked_lm_prob: float = 0.15
    max_predictions: int | None = None

    def predictions(self, length: int) -> int:
        """Slots at ``length``: the recipe's max_predictions scaled from its training length (20 at 128 stays
        20 · L/128), else round(masked_lm_prob · L)."""
        if self.max_predictions is None:
            return max(1, round(self.masked_lm_prob * length))
        return max(1, round(self.max_predictions * length / self.cfg.max_seq_length))


def model_config(recipe) -> Counted:
    """The model (and masking) of a recipe or run, with vocab_size from data.vocab_size when unset."""
    cfg = recipe.model
    if facts(cfg.arch).table6 is None:
        raise UserError(f"model.arch = {cfg.arch!r}: `analyze flops` counts BiGS-family and BERT models")
    if cfg.vocab_size is None:
        cfg = dataclasses.replace(cfg, vocab_size=recipe.data.vocab_size)
    return Counted(cfg, recipe.objective.masked_lm_prob, recipe.objective.max_predictions)


def at_length(cfg, length: int, num_layers: int | None = None):
    """The config counted at ``length``: a position table that long, layers unrolled (XLA counts a scanned
    stack once), no rematerialisation (it adds a recomputation the analytic count does not have)."""
    return dataclasses.replace(
        cfg, max_seq_length=length, num_layers=num_layers or cfg.num_layers, scan_layers=False, remat=False
    )


def analytic_flops(cfg, length: int, predictions: int) -> float:
    """Training (forward + backward) FLOPs of one sequence of ``length``: ssmlm.models.flops, no allocation."""
    from ssmlm.models.flops import flops_per_token

    return flops_per_token(_abstract(cfg), cfg, length, predictions) * length


@functools.cache
def _abstract(cfg):
    """The MLM model of ``cfg`` as shapes. Built once per config: the counted (non-embedding) parameters do
    not depend on the length, only the position table does, and it is not counted."""
    from ssmlm.models import build_pretraining_model
    from ssmlm.models.flops import abstract

    return abstract(lambda: build_pretraining_model(cfg))


def xla_step_flops(cfg, length: int, predictions: int) -> float:
    """FLOPs XLA's cost analysis counts in the compiled loss+grad of the MLM model on one sequence (the
    layers as ``cfg`` has them, unrolled). Nothing is allocated: the parameters are shapes."""
    import jax
    import numpy as np
    from flax import nnx

    from ssmlm.models import build_pretraining_model
    from ssmlm.models.flops import abstract
    from ssmlm.objectives.batch import make_batch
    from ssmlm.objectives.losses import token_prediction_loss

    graphdef, params = nnx.split(abstract(lambda: build_pretraining_model(cfg)), nnx.Param)
    # every token real (no padding), the masked slots spread over the sequence
    slots = np.linspace(0, length - 1, predictions).astype(np.int32)[None]
    batch = make_batch(
        np.full((1, length), 5, np.int32),
        np.ones((1, predictions), np.int32),
        np.ones((1, predictions), np.float32),
        target_positions=slots,
    )

    def loss(p, b):
        return token_prediction_loss(nnx.merge(graphdef, p), b, None)[0]

    cost = jax.jit(jax.grad(loss)).lower(params, batch).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost  # older jax: one dict per program
    if not cost or "flops" not in cost:
        raise UserError("XLA's cost analysis gave no FLOP count on this backend; run with --no-xla")
    return float(cost["flops"])


def xla_flops(cfg, length: int, predictions: int) -> float:
    """XLA's training FLOPs at the full depth: compiled with 1 and 2 layers, extended linearly (docstring)."""
    one = xla_step_flops(at_length(cfg, length, 1), length, predictions)
    if cfg.num_layers == 1:
        return one
    two = xla_step_flops(at_length(cfg, length, 2), length, predictions)
    return one + (cfg.num_layers - 1) * (two - one)


def paper_size(column: str) -> str:
    d, layers, _ = PAPER_CONFIGS[column]
    return f"{layers} layers × d {d}"


def is_paper_config(column: str, cfg) -> bool:
    return (cfg.hidden_size, cfg.num_layers, cfg.intermediate_size) == PAPER_CONFIGS[column]


def flops_table(models: dict[str, Counted], lengths: list[int], xla: bool | set[int] = True) -> list[dict]:
    """One row per (model, length) with the columns of COLUMNS (None where not available). ``xla``: count
    with XLA too (at every length, or at the lengths of a set)."""
    rows = []
    for column, m in models.items():
        for length in lengths:
            p = m.predictions(length)
            train = analytic_flops(m.cfg, length, p)
            measured = xla_flops(m.cfg, length, p) if xla is True or (xla and length in xla) else None
            paper = PAPER_TABLE6.get(length, {}).get(column)
            forward = train / 3  # the 6N convention: forward 2, backward 4 per parameter (every term ×3)
            rows.append(
                {
                    "model": column,
                    "arch": m.cfg.arch,
                    "length": length,
                    "predictions": p,
                    "analytic_train_flops": train,
                    "xla_train_flops": measured,
                    "xla_over_analytic": measured / train if measured else None,
                    "analytic_forward_flops": forward,
                    "paper_flops": paper,
                    "train_over_paper": train / paper if paper else None,
                    "forward_over_paper": forward / paper if paper else None,
                    "paper_config": is_paper_config(column, m.cfg),
                    "size": f"{m.cfg.num_layers} layers × d {m.cfg.hidden_size}",
                }
            )
    return rows


NOTE = (
    "analytic: 6 FLOPs per dense parameter per token + attention (12·L·d per layer) or S4D FFT terms + tied "
    "decoder at the masked slots; xla: XLA cost analysis of the compiled loss+grad, compiled with 1 and 2 "
    "unrolled layers and extended linearly to the full depth (XLA also counts element-wise work); paper: BiGS "
    "Table 6, which matches the forward-pass FLOPs of the large models (BiGS 23x1024, BERT-large 24x1024): "
    "training FLOPs are ~3x the paper's numbers, forward_over_paper should be within 10% of 1 where "
    "paper_config is true; the paper's BiGS numbers leave out the FFT convolutions (they grow exactly linearly)."
)


SUMMARY = ("model", "length", "analytic_train_flops", "xla_train_flops", "paper_flops", "forward_over_paper")


def analyze_flops(models: dict[str, Counted], lengths: list[int], out_dir: Path, xla: bool | set[int] = True) -> dict:
    """Table 6 for ``models`` ({"BiGS": ..., "BERT": ...}, either may be missing) at ``lengths``: CSV, JSON
    (the rows and the note on what the paper counts), PNG and SVG."""
    import csv as csvlib

    rows = flops_table(models, lengths, xla)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "flops.csv"
    with csv_path.open("w", newline="") as f:
        w = csvlib.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows({k: ("" if r[k] is None else r[k]) for k in COLUMNS} for r in rows)
    configs = {
        k: {f: getattr(m.cfg, f) for f in ("arch", "hidden_size", "num_layers", "intermediate_size", "vocab_size")}
        for k, m in models.items()
    }
    json_path = out_dir / "flops.json"
    json_path.write_text(json.dumps({"note": NOTE, "configs": configs, "paper": PAPER_TABLE6, "rows": rows}, indent=2))
    png = plot_flops(rows, out_dir / "flops.png")
    matched = [r["forward_over_paper"] for r in rows if r["paper_config"] and r["forward_over_paper"]]
    return {
        "plot": str(png),
        "svg": str(png.with_suffix(".svg")),
        "data": str(csv_path),
        "json": str(json_path),
        "note": NOTE,
        "table": [{k: _short(r[k]) for k in SUMMARY} for r in rows],
        "forward_over_paper_range": [round(min(matched), 3), round(max(matched), 3)] if matched else None,
    }


def _short(v):
    return float(f"{v:.4g}") if isinstance(v, float) else v


def other_sizes(rows: list[dict]) -> list[str]:
    """The models of ``rows`` that Table 6 has numbers for but that are not the paper's size."""
    models = dict.fromkeys(r["model"] for r in rows)
    return [m for m in models if any(r["model"] == m and r["paper_flops"] and not r["paper_config"] for r in rows)]


def flops_panels(rows: list[dict]) -> list[str]:
    """The figure's panels: "flops" (absolute; the paper's crosses only beside a model of its size), "growth"
    (normalised, for a model of another size), "ratio" (BERT / BiGS, when both are counted)."""
    models = {r["model"] for r in rows}
    return ["flops"] + (["growth"] if other_sizes(rows) else []) + (["ratio"] if {"BiGS", "BERT"} <= models else [])


def plot_flops(rows: list[dict], out: Path) -> Path:
    """FLOPs against length (log-log): ours (training: analytic line, XLA dots; forward = training/3, dashed)
    and, for a model of the paper's size, the paper's (crosses). A model of another size is not set beside
    the paper's numbers: a second panel compares how the FLOPs grow with length, each series divided by its
    value at the shortest length both have, and says which sizes they are. With BiGS and BERT both, a panel
    of BERT/BiGS."""
    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    by_model: dict[str, list[dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    panels = flops_panels(rows)
    other_size = other_sizes(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels) + 0.6, 4.6), squeeze=False)
    axes = dict(zip(panels, axes[0], strict=True))
    ticks = sorted({r["length"] for r in rows})
    for model, rs in by_model.items():
        _draw_flops(axes["flops"], model, rs)
    ax = axes["flops"]
    ax.set_yscale("log")
    ax.set_ylabel("training FLOPs per sequence (batch 1)")
    sizes = ", ".join(f"{m}: {rs[0]['size']}" for m, rs in by_model.items())
    ax.set_title(
        "BiGS Table 6: FLOPs by input length" if not other_size else f"FLOPs by input length ({sizes})", fontsize=10
    )
    if other_size:
        _draw_growth(axes["growth"], {m: by_model[m] for m in other_size})
    if "ratio" in axes:
        _draw_ratio(axes["ratio"], by_model)
    for ax in axes.values():
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("input length (tokens)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)


COLORS = {"BiGS": "tab:blue", "BERT": "tab:orange"}


def _draw_flops(ax, model: str, rs: list[dict]) -> None:
    x = [r["length"] for r in rs]
    c = COLORS.get(model, "black")
    ax.plot(x, [r["analytic_train_flops"] for r in rs], "-", color=c, label=f"{model}: training (analytic)")
    xs = [(r["length"], r["xla_train_flops"]) for r in rs if r["xla_train_flops"]]
    if xs:
        ax.plot(*zip(*xs, strict=True), "o", color=c, ms=5, mfc="none", label=f"{model}: training (XLA)")
    ax.plot(x, [r["analytic_forward_flops"] for r in rs], "--", color=c, lw=1, label=f"{model}: forward (÷3)")
    paper = [(r["length"], r["paper_flops"]) for r in rs if r["paper_flops"]]
    if paper and rs[0]["paper_config"]:  # the paper's numbers only beside a model of the paper's size
        ax.plot(*zip(*paper, strict=True), "x", color=c, ms=8, mew=2, label=f"{model}: paper Table 6 (same size)")


def _draw_growth(ax, by_model: dict[str, list[dict]]) -> None:
    """Each series ÷ its value at the shortest length with a paper number: how FLOPs grow with length."""
    for model, rs in by_model.items():
        c = COLORS.get(model, "black")
        paper = [r for r in rs if r["paper_flops"]]
        base = paper[0]
        ours = [(r["length"], r["analytic_forward_flops"] / base["analytic_forward_flops"]) for r in rs]
        ax.plot(*zip(*ours, strict=True), "-o", ms=3, color=c, label=f"{model} here, {rs[0]['size']}")
        theirs = [(r["length"], r["paper_flops"] / base["paper_flops"]) for r in paper]
        size = paper_size(model)
        ax.plot(*zip(*theirs, strict=True), "x", ms=8, mew=2, color=c, label=f"{model}, paper Table 6 ({size})")
        ax.set_ylabel(f"FLOPs ÷ FLOPs at {base['length']} tokens")
    ax.set_yscale("log", base=2)
    ax.set_title("a different size from the paper's:\ngrowth with length only (normalised)", fontsize=10)


def _draw_ratio(ax, by_model: dict[str, list[dict]]) -> None:
    bigs = {r["length"]: r for r in by_model["BiGS"]}
    both = [(r, bigs[r["length"]]) for r in by_model["BERT"] if r["length"] in bigs]
    x = [a["length"] for a, _ in both]
    ax.plot(
        x, [a["analytic_train_flops"] / b["analytic_train_flops"] for a, b in both], "-o", ms=4, label="ours (analytic)"
    )
    paper = [
        (a["length"], a["paper_flops"] / b["paper_flops"])
        for a, b in both
        if a["paper_flops"] and a["paper_config"] and b["paper_config"]
    ]
    if paper:
        ax.plot(*zip(*paper, strict=True), "x", ms=8, mew=2, color="black", label="paper Table 6")
    ax.axhline(1, color="grey", lw=0.6)
    ax.set_ylabel("FLOPs BERT / BiGS")
    ax.set_title("BERT's extra cost grows with length", fontsize=10)


# ----------------------------------------------------------------------------- report

REPORT_LENGTHS = (128, 512, 1024)


def for_report(run, out_dir: Path) -> dict | None:
    """Table 6 for the run's own model (BiGS-family or BERT MLM encoder runs; None otherwise, nothing loaded)
    at 128, 512, 1024 and the run's length: the analytic count at every length, XLA's at the run's own length
    (each XLA count compiles the model twice; the command counts every length). Beside the paper's numbers
    only when the model has the paper's size; otherwise normalised (see plot_flops)."""
    arch = run.recipe.model.arch
    column = facts(arch).table6
    if column is None:
        return None
    models = {column: model_config(run.recipe)}
    own = run.recipe.model.max_seq_length
    result = analyze_flops(models, sorted({*REPORT_LENGTHS, own}), out_dir, xla={own})
    cfg = models[column].cfg
    same = is_paper_config(column, cfg)
    paper = paper_size(column)
    table = result["table"]
    base = next((r for r in table if r["paper_flops"]), table[0])
    rows, columns = [], ["length", "training FLOPs (analytic)", "training FLOPs (XLA)"]
    for r in table:
        row = [
            f"{r['length']:,}",
            f"{r['analytic_train_flops']:.3g}",
            f"{r['xla_train_flops']:.3g}" if r["xla_train_flops"] else "–",
        ]
        if same:
            row.append(f"{r['paper_flops']:.2g}" if r["paper_flops"] else "–")
        else:  # growth from the shortest paper length, ours beside the paper's
            row.append(f"{r['analytic_train_flops'] / base['analytic_train_flops']:.3g}")
            row.append(f"{r['paper_flops'] / base['paper_flops']:.3g}" if r["paper_flops"] else "–")
        rows.append(row)
    if same:
        columns.append("paper Table 6 (forward)")
    else:
        columns += [f"÷ at {base['length']}: this model", f"÷ at {base['length']}: paper ({paper})"]
    size = f"{cfg.num_layers} layers × d {cfg.hidden_size}"
    note = (
        f"This model has the paper's size ({size}): its FLOPs are set beside Table 6's (which match the "
        "forward pass, a third of training)."
        if same
        else f"This model ({size}) is not the size of the paper's {column} ({paper}): its FLOPs are not "
        "set beside the paper's; the normalised panel and columns compare only how the counts grow with length."
    )
    note += f" XLA's count is made at the run's own length ({own}) only; `ssmlm analyze flops` counts every length."
    numbers = {}  # for programmatic use; the page shows the table
    for r in table:
        numbers[f"{r['model']} training FLOPs at {r['length']} (analytic)"] = r["analytic_train_flops"]
        if r["xla_train_flops"]:
            numbers[f"{r['model']} training FLOPs at {r['length']} (XLA)"] = r["xla_train_flops"]
    return {
        "title": f"Training FLOPs by input length of {run.dir.name}'s model",
        "figure": FIGURE,
        "images": [result["plot"]],
        "data": [result["data"], result["json"]],
        "note": note,
        "numbers": numbers,
        "table": {"columns": columns, "rows": rows},
    }
