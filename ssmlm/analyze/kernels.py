"""`analyze kernels`: the forward and backward SSM kernels K̄ of a BiGS run (paper Figure 3), and how they
change between two runs of the same encoder, e.g. after MNLI finetuning (paper Figure 4, ``--compare``).

Every gated (or stacked) SSM layer has two static kernels of length L: the forward SSM's K̄_f[j] weighs the
token j positions back, the backward SSM's K̄_b[j] the token j positions ahead. Figure 3 draws |K̄| at relative
positions -N..N (forward kernel on the negative side), min-max scaled per layer; Figure 4 draws K̄ itself of a
few layers over all relative positions -(L-1)..L-1 for both runs, one panel per layer. The kernels are those of
the encoder, so a finetuned run (a classifier, span or choice head on the same encoder) compares with its
pretrained source; ``for_report`` does that comparison on its own for a finetuned run whose source is on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.errors import UserError
from ssmlm.models.config import facts

NAME = "kernels"
FIGURE = "BiGS Figure 3"
FIGURE_COMPARE = "BiGS Figure 4"
PAPER_LAYERS = (14, 17, 18)  # the layers of the 23-layer BiGS the paper's Figure 4 shows


def command(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory of a BiGS model.")],
    crop: Annotated[
        int | None, typer.Option("--crop", help="Relative positions -N..N shown in the map (paper: 10).")
    ] = None,
    window: Annotated[int, typer.Option("--window", help="Older name of --crop (used when --crop is not given).")] = 10,
    layers: Annotated[
        str | None, typer.Option("--layers", help="Comma-separated layer numbers, e.g. 0,3,5 (default: all).")
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option("--compare", help="Second run with the same encoder (e.g. finetuned on MNLI): BiGS Figure 4."),
    ] = None,
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: RUN/analysis).")] = None,
):
    """Plot every layer's forward and backward SSM kernel (BiGS Figure 3); with --compare RUN2, the kernels of
    chosen layers of both runs over all relative positions and their relative change (BiGS Figure 4).

    Figure 3 writes kernels.png/.svg (|K| at -N..N, min-max scaled per layer), kernels_full.png, kernels.npz
    (every layer, every lag) and kernels.csv. Figure 4 writes kernels_compare.png/.svg and kernels_compare.csv
    (K of both runs per layer, direction and lag) and the per-layer relative change |K2-K1|/|K1| in the summary.
    Default layers for --compare: the paper's 14, 17, 18 for a 23-layer model, else three spread over the depth.

    Example: ssmlm analyze kernels --ckpt runs/default --crop 10 --layers 0,3

    Example: ssmlm analyze kernels --ckpt runs/default --compare runs/default-mnli
    """
    checks.run_dir(ckpt, "--ckpt")
    if crop is not None:
        checks.option("--crop", crop, checks.POSITIVE)
    else:
        checks.option("--window", window, checks.POSITIVE)
    if compare is not None:
        checks.run_dir(compare, "--compare")
    from ssmlm.runs import open_run

    run = open_run(ckpt)
    out_dir = Path(out) if out else run.dir / "analysis"
    if compare is None:
        result = analyze_kernels(run, out_dir, window=crop if crop is not None else window, layers=layers)
    else:
        result = compare_kernels(run, open_run(compare), out_dir, layers=layers)
    return result  # printed by the CLI: tables, or JSON with --json


# ----------------------------------------------------------------------------- the kernels of a run


def run_kernels(run, length: int | None = None):
    """(forward, backward, step): each layer's kernels K̄ as numpy (num_layers, L) at ``length`` (default: the
    run's max_seq_length), of the encoder of a pretraining or finetuned run. Per-channel kernels are averaged
    over channels. The kernels are read off a forward pass of a dummy sequence of that length."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    if not facts(run.recipe.model.arch).ssm_kernels:
        raise UserError(f"{run.dir}: architecture '{run.recipe.model.arch}' has no SSM kernels to plot")
    model, meta = run.load_model()
    length = length or run.recipe.model.max_seq_length
    ids = jnp.ones((1, length), jnp.int32)
    _, aux = nnx.jit(lambda enc, ids: enc(ids, intermediates=True))(model.encoder, ids)
    if "ssm_kernel_forward" not in aux:
        raise UserError(f"{run.dir}: architecture '{run.recipe.model.arch}' has no SSM kernels to plot")
    fwd, bwd = (
        np.asarray(k if k.ndim == 2 else k.mean(1)) for k in (aux["ssm_kernel_forward"], aux["ssm_kernel_backward"])
    )
    return fwd, bwd, int(meta["step"])


def parse_layers(text: str | None, num_layers: int) -> list[int] | None:
    """``--layers 0,3,5`` as sorted distinct layer numbers, each in 0..num_layers-1 (None: not given)."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or not all(p.isdigit() for p in parts) or any(int(p) >= num_layers for p in parts):
        raise UserError(f"--layers = {text!r}: expected comma-separated layer numbers in 0..{num_layers - 1}, e.g. 0,1")
    return sorted({int(p) for p in parts})


def default_compare_layers(num_layers: int) -> list[int]:
    """Figure 4's layers: the paper's 14, 17, 18 at its depth of 23, else three spread over the depth."""
    if num_layers == 23:
        return list(PAPER_LAYERS)
    return sorted({round(x) for x in (0, (num_layers - 1) / 2, num_layers - 1)})


def relative_row(fwd_row, bwd_row):
    """One layer's kernels on relative positions -(L-1)..L-1: forward K̄_f[j] at -j, backward K̄_b[j] at +j;
    position 0 holds the forward K̄_f[0] (the backward K̄_b[0] is in the CSV)."""
    import numpy as np

    return np.concatenate([fwd_row[::-1], bwd_row[1:]])


def analyze_kernels(run, out_dir: Path, window: int = 10, length: int | None = None, layers=None) -> dict:
    """BiGS Figure 3 for ``run``: the map of |K̄| at -window..window for ``layers`` (a list or "0,3"; None:
    all), the same over all offsets, and the kernels themselves (npz: every layer; csv: the chosen ones)."""
    import numpy as np

    fwd, bwd, step = run_kernels(run, length)
    num_layers, length = fwd.shape
    chosen = parse_layers(",".join(map(str, layers)) if isinstance(layers, list) else layers, num_layers)
    chosen = chosen if chosen is not None else list(range(num_layers))
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / "kernels.npz", forward=fwd, backward=bwd)
    csv = out_dir / "kernels.csv"
    _write_kernel_csv(csv, {"kernel": (fwd, bwd)}, chosen)
    title = f"SSM kernels of {run.dir.name} (step {step}, L={length})"
    png = plot_kernel_map(fwd[chosen], bwd[chosen], window, title, out_dir / "kernels.png", chosen)
    full = plot_kernel_map(
        fwd[chosen],
        bwd[chosen],
        length - 1,
        f"SSM kernels of {run.dir.name}, all offsets",
        out_dir / "kernels_full.png",
        chosen,
        svg=False,
    )
    return {
        "plot": str(png),
        "svg": str(png.with_suffix(".svg")),
        "plot_full": str(full),
        "data": str(out_dir / "kernels.npz"),
        "csv": str(csv),
        "layers": num_layers,
        "shown_layers": chosen,
        "crop": min(window, length - 1),
    }


def compare_kernels(run1, run2, out_dir: Path, layers=None, length: int | None = None) -> dict:
    """BiGS Figure 4: K̄ of ``run1`` (e.g. after pretraining) and ``run2`` (e.g. after MNLI finetuning) for
    ``layers`` (None: ``default_compare_layers``) over all relative positions, and per layer the relative
    change ‖K2 − K1‖ / ‖K1‖ over both directions and every lag (also per direction)."""
    import numpy as np

    a1, a2 = run1.recipe.model.arch, run2.recipe.model.arch
    if a1 != a2:
        raise UserError(f"--compare {run2.dir}: architecture '{a2}', {run1.dir} is '{a1}'; expected the same encoder")
    length = length or run1.recipe.model.max_seq_length
    f1, b1, step1 = run_kernels(run1, length)
    f2, b2, step2 = run_kernels(run2, length)
    if f1.shape != f2.shape:
        raise UserError(
            f"--compare {run2.dir}: its encoder has {f2.shape[0]} SSM layers, {run1.dir} has {f1.shape[0]}; "
            "expected the same encoder (e.g. a run finetuned from it)"
        )
    num_layers = f1.shape[0]
    chosen = parse_layers(",".join(map(str, layers)) if isinstance(layers, list) else layers, num_layers)
    chosen = chosen if chosen is not None else default_compare_layers(num_layers)

    def rel(a, b):
        return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-30))

    change = {
        layer: {
            "both": rel(np.concatenate([f1[layer], b1[layer]]), np.concatenate([f2[layer], b2[layer]])),
            "forward": rel(f1[layer], f2[layer]),
            "backward": rel(b1[layer], b2[layer]),
        }
        for layer in chosen
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / "kernels_compare.csv"
    _write_kernel_csv(csv, {"kernel_1": (f1, b1), "kernel_2": (f2, b2)}, chosen)
    change_csv = out_dir / "kernels_change.csv"
    lines = ["layer,relative_change,relative_change_forward,relative_change_backward"]
    lines += [f"{k},{v['both']:.8g},{v['forward']:.8g},{v['backward']:.8g}" for k, v in change.items()]
    change_csv.write_text("\n".join(lines) + "\n")
    labels = (f"{run1.dir.name} (step {step1})", f"{run2.dir.name} (step {step2})")
    png = plot_kernel_compare(
        {k: (relative_row(f1[k], b1[k]), relative_row(f2[k], b2[k])) for k in chosen},
        change,
        labels,
        f"Change in SSM kernels: {run1.dir.name} → {run2.dir.name} (L={length})",
        out_dir / "kernels_compare.png",
    )
    return {
        "plot": str(png),
        "svg": str(png.with_suffix(".svg")),
        "data": str(csv),
        "change_csv": str(change_csv),
        "runs": [str(run1.dir), str(run2.dir)],
        "layers": chosen,
        "relative_change": {str(k): round(v["both"], 6) for k, v in change.items()},
    }


def _write_kernel_csv(path: Path, kernels: dict, layers: list[int]) -> None:
    """One row per (layer, direction, lag): the lag j, its relative position (-j forward, +j backward) and
    the value of each named kernel set {name: (forward, backward)}."""
    names = list(kernels)
    rows = ["layer,direction,lag,relative_position," + ",".join(names)]
    length = next(iter(kernels.values()))[0].shape[1]
    for layer in layers:
        for d, (direction, sign) in enumerate((("forward", -1), ("backward", 1))):
            for j in range(length):
                values = ",".join(f"{float(kernels[n][d][layer, j]):.9g}" for n in names)
                rows.append(f"{layer},{direction},{j},{sign * j},{values}")
    path.write_text("\n".join(rows) + "\n")


# ----------------------------------------------------------------------------- plots


def plot_kernel_map(fwd, bwd, window: int, title: str, out: Path, layer_ids: list[int], svg: bool = True) -> Path:
    """BiGS Figure 3: per layer (row), |K̄| at relative positions -window..window, min-max scaled per row.

    The forward SSM reads the past, so its K̄[j] is drawn at -j; the backward SSM reads the future, so its
    K̄[j] is drawn at +j. Position 0 shows the larger of the two |K̄[0]|."""
    import numpy as np

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    w = min(window, fwd.shape[1] - 1)
    f, b = np.abs(fwd[:, : w + 1]), np.abs(bwd[:, : w + 1])
    rows = np.concatenate([f[:, :0:-1], np.maximum(f[:, :1], b[:, :1]), b[:, 1:]], axis=1)
    lo, hi = rows.min(1, keepdims=True), rows.max(1, keepdims=True)
    scaled = (rows - lo) / np.where(hi > lo, hi - lo, 1.0)
    n = rows.shape[0]
    fig, ax = plt.subplots(figsize=(min(16, max(6, 0.35 * (2 * w + 1))), max(3, 0.3 * n + 1.4)))
    im = ax.imshow(scaled, aspect="auto", cmap="viridis", interpolation="nearest")
    step = max(1, (2 * w + 1) // 21)
    ticks = list(range(w % step, 2 * w + 1, step))  # keeps 0 among the ticks
    ax.set_xticks(ticks, [str(t - w) for t in ticks])
    ax.set_yticks(range(n), [str(i) for i in layer_ids])
    ax.set_xlabel("relative position (tokens)\n← forward kernel (past)  |  backward kernel (future) →")
    ax.set_ylabel("layer")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="|K̄| (min-max scaled per layer)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    if svg:
        fig.savefig(out.with_suffix(".svg"))
    plt.close(fig)
    return out


def plot_kernel_compare(rows: dict, change: dict, labels: tuple[str, str], title: str, out: Path) -> Path:
    """BiGS Figure 4: one panel per layer, K̄ of both runs against relative position -(L-1)..L-1."""
    import numpy as np

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    n = len(rows)
    fig, axes = plt.subplots(n, 1, figsize=(9, 2.4 * n + 0.8), sharex=True, squeeze=False)
    for ax, (layer, (k1, k2)) in zip(axes[:, 0], rows.items(), strict=True):
        w = (len(k1) - 1) // 2
        x = np.arange(-w, w + 1)
        ax.plot(x, k1, lw=1.2, color="tab:blue", label=labels[0])
        ax.plot(x, k2, lw=1.0, color="tab:red", ls="--", label=labels[1])
        ax.axvline(0, color="grey", lw=0.5)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylabel("K̄")
        ax.set_title(f"layer {layer}: relative change ‖K2−K1‖/‖K1‖ = {change[layer]['both']:.3g}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("relative position (tokens)\n← forward kernel (past)  |  backward kernel (future) →")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    fig.savefig(out.with_suffix(".svg"))
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- report


def for_report(run, out_dir: Path) -> dict | None:
    """Figure 3 for a BiGS-family run (arch bigs or stack_ssm), plus Figure 4 for a finetuned run whose
    pretrained source run is still on disk; None for every other architecture (no model is loaded)."""
    if not facts(run.recipe.model.arch).ssm_kernels:
        return None
    result = analyze_kernels(run, out_dir)
    report = {
        "title": f"SSM kernels of {run.dir.name}",
        "figure": FIGURE,
        "images": [result["plot"]],
        "data": [result["data"], result["csv"]],
        "numbers": {"layers": result["layers"], "crop": result["crop"]},
    }
    # (a random initialisation changed no source's kernels: its source run gave the architecture only)
    source = Path(run.weights_from) if run.kind == "finetune" and run.weights_from else None
    if source is not None and (source / "run.json").is_file() and (source / "recipe.yaml").is_file():
        from ssmlm.runs import open_run

        src = open_run(source)
        if src.recipe.model.arch == run.recipe.model.arch:
            cmp = compare_kernels(src, run, out_dir)
            report["figure"] = f"{FIGURE} and {FIGURE_COMPARE}"
            report["images"].append(cmp["plot"])
            report["data"] += [cmp["data"], cmp["change_csv"]]
            report["numbers"].update({f"relative change, layer {k}": v for k, v in cmp["relative_change"].items()})
    return report
