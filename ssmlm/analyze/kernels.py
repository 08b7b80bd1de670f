"""`analyze kernels`: every layer's forward and backward SSM kernel of a BiGS run (paper Figure 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ssmlm.analyze.plots import plot_kernels
from ssmlm.errors import UserError


def analyze_kernels(run, out_dir: Path, window: int = 10, length: int | None = None) -> dict:
    model, meta = run.load_model()
    encoder = model.encoder
    if not hasattr(encoder, "kernels"):
        raise UserError(f"{run.dir}: architecture '{run.recipe.model.arch}' has no SSM kernels to plot")
    length = length or run.recipe.model.max_seq_length
    fwd, bwd = (np.asarray(k) for k in encoder.kernels(length))
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / "kernels.npz", forward=fwd, backward=bwd)
    png = plot_kernels(
        fwd, bwd, window, f"SSM kernels of {run.dir.name} (step {meta['step']}, L={length})", out_dir / "kernels.png"
    )
    full = plot_kernels(
        fwd, bwd, length - 1, f"SSM kernels of {run.dir.name}, all offsets", out_dir / "kernels_full.png"
    )
    return {"plot": str(png), "plot_full": str(full), "data": str(out_dir / "kernels.npz"), "layers": fwd.shape[0]}
