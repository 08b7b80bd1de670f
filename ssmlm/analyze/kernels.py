"""`analyze kernels`: every layer's forward and backward SSM kernel of a BiGS run (paper Figure 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.errors import UserError

NAME = "kernels"
FIGURE = "BiGS Figure 3"


def command(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory of a BiGS model.")],
    window: Annotated[int, typer.Option("--window", help="Relative positions shown on each side (paper: 10).")] = 10,
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: RUN/analysis).")] = None,
):
    """Plot every layer's forward and backward SSM kernel (BiGS Figure 3).

    Example: ssmlm analyze kernels --ckpt runs/default
    """
    checks.option("--window", window, checks.POSITIVE)
    checks.run_dir(ckpt, "--ckpt")
    from ssmlm.runs import open_run

    run = open_run(ckpt)
    result = analyze_kernels(run, Path(out) if out else run.dir / "analysis", window=window)
    typer.echo(json.dumps(result, indent=2))


def analyze_kernels(run, out_dir: Path, window: int = 10, length: int | None = None) -> dict:
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from ssmlm.analyze.plots import plot_kernels

    model, meta = run.load_model()
    length = length or run.recipe.model.max_seq_length
    # the kernels are evaluated at the input length: one forward pass of a dummy sequence of that length
    ids = jnp.ones((1, length), jnp.int32)
    _, aux = nnx.jit(lambda enc, ids: enc(ids, intermediates=True))(model.encoder, ids)
    if "ssm_kernel_forward" not in aux:
        raise UserError(f"{run.dir}: architecture '{run.recipe.model.arch}' has no SSM kernels to plot")
    # (num_layers, L) shared kernels; per-channel ones (num_layers, d, L) are averaged over channels
    fwd, bwd = (
        np.asarray(k if k.ndim == 2 else k.mean(1)) for k in (aux["ssm_kernel_forward"], aux["ssm_kernel_backward"])
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / "kernels.npz", forward=fwd, backward=bwd)
    png = plot_kernels(
        fwd, bwd, window, f"SSM kernels of {run.dir.name} (step {meta['step']}, L={length})", out_dir / "kernels.png"
    )
    full = plot_kernels(
        fwd, bwd, length - 1, f"SSM kernels of {run.dir.name}, all offsets", out_dir / "kernels_full.png"
    )
    return {"plot": str(png), "plot_full": str(full), "data": str(out_dir / "kernels.npz"), "layers": fwd.shape[0]}
