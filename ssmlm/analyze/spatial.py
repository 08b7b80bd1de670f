"""`analyze spatial`: the learned spatial projection weights W of a gMLP / aMLP run (gMLP Figures 3 and 4).

Every block's spatial gating unit mixes tokens with one n×n matrix W (f(Z) = WZ + b, gMLP eq. 2). Row i of W
is token i's filter: how much of every position j it reads. Two views, as the paper draws them:

  Figure 4 (MLM): for every layer, the row of W of the token in the middle of the sequence, plotted over the
      n positions, one small panel per layer laid out in a grid.
  Figure 3: the filters of a selected set of tokens, one row of panels per layer. The paper's tokens there
      are image patches on a 2-D grid, so it reshapes each row into 2-D; our tokens are a 1-D text sequence,
      so each selected token's row is drawn against the relative position j - i (the 1-D form of the same
      picture: a shift-invariant, Toeplitz-like W gives the same curve for every token).

For the Toeplitz parameterisation (model.spatial = toeplitz, the paper's MLM setting) the full matrix is built
from the 2n-1 diagonals first, W[i, j] = w[i - j + n - 1] (and lower-triangular for causal models), exactly as
the model applies it (``ssmlm.models.gmlp.spatial_matrix``).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.errors import UserError

NAME = "spatial"
FIGURE = "gMLP Figures 3 and 4"
ARCHS = ("gmlp", "amlp")
LOCAL = 8  # offsets |j - i| <= LOCAL count as "local" in the headline numbers


def command(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory of a gMLP or aMLP model.")],
    layer: Annotated[
        list[int] | None,
        typer.Option("--layer", help="Layer(s) of the Figure 3 panels, 0-based (repeat; default: up to 4, spread)."),
    ] = None,
    token: Annotated[
        list[int] | None,
        typer.Option("--token", help="Token position(s) whose filters Figure 3 draws (repeat; default: 6, spread)."),
    ] = None,
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: RUN/analysis).")] = None,
):
    """Plot the learned spatial projection weights W of a gMLP / aMLP run (gMLP Figures 3 and 4).

    Figure 4: every layer's row of W for the middle token. Figure 3: the filters (rows of W) of selected
    tokens against relative position, one row of panels per layer. Writes PNG, SVG and the values (NPZ, CSV).
    Example: ssmlm analyze spatial --ckpt runs/gmlp_base --layer 0 --layer 11 --token 32 --token 64
    """
    checks.run_dir(ckpt, "--ckpt")
    from ssmlm.runs import open_run

    run = open_run(ckpt)
    result = analyze_spatial(run, Path(out) if out else run.dir / "analysis", layers=layer, tokens=token)
    return result  # printed by the CLI: tables, or JSON with --json


def for_report(run, out_dir: Path) -> dict | None:
    """The one-page report's entry: both figures with default options, for gMLP / aMLP runs with a checkpoint."""
    ckpts = run.dir / "checkpoints"
    if run.recipe.model.arch not in ARCHS or not (ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())):
        return None
    r = analyze_spatial(run, out_dir)
    numbers = {"layers": r["layers"], "length n": r["length"], "middle token": r["middle"]}
    for i, (peak, local) in enumerate(zip(r["peak_offset"], r["local_mass"], strict=True)):
        numbers[f"layer {i}: peak offset / |W| share within ±{LOCAL}"] = f"{peak:+d} / {local:.3f}"
    return {
        "title": "Spatial projection weights W (gMLP)",
        "figure": FIGURE,
        "images": [r["plot_middle"], r["plot_tokens"]],
        "data": [r["data"], r["data_middle"], r["data_tokens"]],
        "numbers": numbers,
    }


def spread(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), ends included (all of them when k >= n)."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [n // 2]


def analyze_spatial(run, out_dir: Path, layers: list[int] | None = None, tokens: list[int] | None = None) -> dict:
    import numpy as np

    cfg = run.recipe.model
    if cfg.arch not in ARCHS:
        raise UserError(f"{run.dir}: architecture '{cfg.arch}' has no spatial projection (gMLP / aMLP only)")
    model, meta = run.load_model()
    n = cfg.max_seq_length
    # (num_layers, n, n), Toeplitz already expanded; float32 holds the stored parameters (f32 or bf16) exactly
    W = np.asarray(model.encoder.spatial_weights(n), np.float32)
    num_layers = W.shape[0]
    layers = spread(num_layers, 4) if not layers else layers
    tokens = spread(n, 6) if not tokens else tokens
    for opt, values, limit in (("--layer", layers, num_layers), ("--token", tokens, n)):
        bad = [v for v in values if not 0 <= v < limit]
        if bad:
            raise UserError(f"{opt} {bad[0]}: expected 0..{limit - 1} (this run has {limit})")
    mid = n // 2  # "the token in the middle of the sequence" (Figure 4)
    middle = W[:, mid, :]  # (num_layers, n)

    out_dir.mkdir(parents=True, exist_ok=True)
    npz = out_dir / "spatial.npz"
    # compressed: each row of a Toeplitz W is the previous one shifted, which deflate finds (48×512×512: ~1 MB)
    np.savez_compressed(npz, W=W, middle_rows=middle, middle=mid, layers=np.array(layers), tokens=np.array(tokens))
    mid_csv = out_dir / "spatial_middle.csv"
    _write_csv(
        mid_csv,
        ("layer", "position", "offset", "weight"),
        [(i, j, j - mid, repr(float(middle[i, j]))) for i in range(num_layers) for j in range(n)],
    )
    tok_csv = out_dir / "spatial_tokens.csv"
    _write_csv(
        tok_csv,
        ("layer", "token", "position", "offset", "weight"),
        [(li, t, j, j - t, repr(float(W[li, t, j]))) for li in layers for t in tokens for j in range(n)],
    )

    title = f"{run.dir.name} (step {meta['step']}, {cfg.spatial} W, n={n})"
    png_mid = plot_middle_rows(middle, mid, f"Row of W for the middle token (gMLP Figure 4), {title}", out_dir)
    png_tok = plot_token_filters(W, layers, tokens, f"Filters of selected tokens (gMLP Figure 3), {title}", out_dir)

    # headline numbers: where each layer's middle filter peaks, and how local it is
    absmid = np.abs(middle.astype(np.float64))
    offsets = np.arange(n) - mid
    peak = [int(offsets[k]) for k in absmid.argmax(1)]
    local = absmid[:, np.abs(offsets) <= LOCAL].sum(1) / np.maximum(absmid.sum(1), 1e-30)
    return {
        "plot_middle": str(png_mid),
        "plot_tokens": str(png_tok),
        "data": str(npz),
        "data_middle": str(mid_csv),
        "data_tokens": str(tok_csv),
        "layers": num_layers,
        "length": n,
        "middle": mid,
        "peak_offset": peak,
        "local_mass": [round(float(v), 6) for v in local],
    }


def _write_csv(path: Path, header: tuple, rows: list) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _small_ticks(ax) -> None:
    ax.tick_params(labelsize=6)
    ax.yaxis.get_offset_text().set_fontsize(6)  # the "1e-5" multiplier, clear of the panel title


def _save(fig, plt, out_dir: Path, stem: str) -> Path:
    png = out_dir / f"{stem}.png"
    fig.savefig(png, dpi=110)
    fig.savefig(out_dir / f"{stem}.svg")
    plt.close(fig)
    return png


def plot_middle_rows(middle, mid: int, title: str, out_dir: Path) -> Path:
    """Figure 4: one small panel per layer, W[mid, j] against position j (x-axis: the n positions)."""
    import math

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    num_layers, n = middle.shape
    cols = min(num_layers, 6)
    rows = math.ceil(num_layers / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.3 * cols + 0.6, 1.7 * rows + 1.0), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= num_layers:
            ax.axis("off")
            continue
        ax.plot(range(n), middle[i], lw=1)
        ax.axvline(mid, color="tab:red", lw=0.6, ls=":")
        ax.set_title(f"layer {i}", fontsize=8, pad=9)
        _small_ticks(ax)
        ax.set_xlim(0, n - 1)
    for ax in axes[-1]:
        ax.set_xlabel("position j", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"W[{mid}, j]", fontsize=7)
    fig.suptitle(title + "\n(dotted: the middle token itself)", fontsize=9)
    fig.tight_layout()
    return _save(fig, plt, out_dir, "spatial_middle")


def plot_token_filters(W, layers: list[int], tokens: list[int], title: str, out_dir: Path) -> Path:
    """Figure 3: rows = layers, columns = selected tokens; each panel W[t, j] against relative position j - t."""
    import numpy as np

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    n = W.shape[1]
    fig, axes = plt.subplots(
        len(layers),
        len(tokens),
        figsize=(2.1 * len(tokens) + 0.8, 1.7 * len(layers) + 1.0),
        squeeze=False,
        sharex=True,
    )
    for r, li in enumerate(layers):
        for c, t in enumerate(tokens):
            ax = axes[r, c]
            ax.plot(np.arange(n) - t, W[li, t], lw=1)
            ax.axvline(0, color="tab:red", lw=0.6, ls=":")
            ax.set_xlim(-(n - 1), n - 1)
            _small_ticks(ax)
            if r == 0:
                ax.set_title(f"token {t}", fontsize=8, pad=9)
            if c == 0:
                ax.set_ylabel(f"layer {li}\nW[t, j]", fontsize=7)
            if r == len(layers) - 1:
                ax.set_xlabel("relative position j - t", fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, plt, out_dir, "spatial_tokens")
