"""ssmlm's Hawk recurrent block against DeepMind's recurrentgemma (the Griffin authors' JAX/Flax-linen code):
do both compute the same function, and how fast is a training step through each?

recurrentgemma is no dependency of ssmlm and this script installs nothing; run it from a throwaway venv:

    python3.11 -m venv /tmp/rgvenv
    /tmp/rgvenv/bin/pip install -e /work/main recurrentgemma==1.0.1
    /tmp/rgvenv/bin/python benchmarks/hawk_parity.py [--batch 4 --length 512 --width 256 --lru-width 256
                                                      --heads 2 --steps 5 --passes 2]

(recurrentgemma 1.0.1 wants jax>=0.9 and flax>=0.12 only in its `jax` extra, so pip keeps ssmlm's jax 0.10.2 and
flax 0.12.8; its own pins numpy<2.4, absl-py<2 and typeguard<3 resolve to numpy 2.3.5, absl-py 1.4.0 and
typeguard 2.13.3 there, against numpy 2.4.x and absl-py 2.x in ssmlm's venv. No --no-deps needed.)

What is compared: recurrentgemma's ``modules.ResidualBlock`` with ``temporal_block_type=RECURRENT`` and
``use_mlp=False`` (x + RecurrentBlock(RMSNorm(x)): its norm lives in the residual block) against ssmlm's
``HawkBlock.mix`` (the same, without the MLP), causal, one segment per row, float32. recurrentgemma's parameters
are initialised, then randomised where their init is trivial (norm scale, conv and gate biases), and mapped:

    temporal_pre_norm.scale s       -> norm.scale = 1 + s        (recurrentgemma's RMSNorm multiplies by 1 + s)
    linear_y / linear_x / linear_out -> w_gate / w_input / w_output  (kernels as they are; ssmlm has no biases
                                                                  there, so recurrentgemma's are set to 0)
    conv_1d.w (W, N), w[-1] = now   -> conv.kernel = w[::-1]     (ssmlm's kernel[k] multiplies x_{t-k})
    conv_1d.b                       -> conv.bias
    rg_lru.a_gate / input_gate      -> rg_lru.w_a / w_x: the (heads, N/h, N/h) blocks on the diagonal of the
                                       dense (N, N) kernel, zeros elsewhere; biases flattened
    rg_lru.a_param                  -> rg_lru.a_param (the same Λ)

Both use the tanh-approximated GeLU (ssmlm: model.gelu = tanh; recurrentgemma: jax.nn.gelu's default). Printed:
the largest absolute and relative (max |Δ| / max |reference|) differences of the output, of the block's branch
(output − x), of the RG-LRU states h, and of the gradients of a scalar loss (for every parameter, in
recurrentgemma's layout, and for x); the compile time (lower + compile) and the step time of a jitted
value_and_grad through each, timed in one process with steps interleaved (ssmlm, recurrentgemma, ssmlm, …) over
--passes passes of --steps steps after two warm-up steps each. "ratio" is ssmlm / recurrentgemma (> 1: ssmlm
slower); the paired ratios are of consecutive (ssmlm, recurrentgemma) steps.

Exit status: 0 the two agree (every relative difference <= --tol); 1 they do not; 2 recurrentgemma is not
importable (one line on stderr, nothing else run).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ssmlm.models.config import ModelConfig
from ssmlm.models.hawk import HawkBlock, init_lambda
from ssmlm.models.lm_context import make_context

try:
    from recurrentgemma import common as rg_common
    from recurrentgemma.jax import layers as rg_layers
    from recurrentgemma.jax import modules as rg_modules
    from recurrentgemma.jax import scan as rg_scan
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"hawk_parity: recurrentgemma is not importable ({e}); see this script's docstring", file=sys.stderr)
    sys.exit(2)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def rg_block(args) -> rg_modules.ResidualBlock:
    return rg_modules.ResidualBlock(
        width=args.width,
        mlp_expanded_width=3 * args.width,  # unused: use_mlp=False
        num_heads=args.heads,
        attention_window_size=1,  # unused: a recurrent block
        temporal_block_type=rg_common.TemporalBlockType.RECURRENT,
        lru_width=args.lru_width,
        conv1d_temporal_width=args.conv,
        use_mlp=False,
    )


def randomise(params: dict, key) -> dict:
    """recurrentgemma's init with the zero-initialised norm scale, conv bias and gate biases drawn at random (so
    the mapping of each is tested) and the Dense biases ssmlm lacks set to 0."""
    k = iter(jax.random.split(key, 8))
    p = jax.tree.map(lambda v: v, params)  # copy the nesting
    rb = p["recurrent_block"]
    p["temporal_pre_norm"]["scale"] = 0.3 * jax.random.normal(next(k), p["temporal_pre_norm"]["scale"].shape)
    rb["conv_1d"]["b"] = 0.3 * jax.random.normal(next(k), rb["conv_1d"]["b"].shape)
    for gate in ("a_gate", "input_gate"):
        rb["rg_lru"][gate]["b"] = jax.random.normal(next(k), rb["rg_lru"][gate]["b"].shape)
    for dense in ("linear_y", "linear_x", "linear_out"):
        rb[dense]["bias"] = jnp.zeros_like(rb[dense]["bias"])
    return p


def block_diagonal(w) -> jax.Array:
    """(heads, i, j) diagonal blocks -> the dense (heads·i, heads·j) kernel, zeros off the diagonal."""
    return jax.scipy.linalg.block_diag(*w)


def map_onto(block: HawkBlock, params: dict) -> None:
    rb = params["recurrent_block"]
    block.norm.scale[...] = 1.0 + params["temporal_pre_norm"]["scale"]
    block.w_gate.kernel[...] = rb["linear_y"]["kernel"]
    block.w_input.kernel[...] = rb["linear_x"]["kernel"]
    block.w_output.kernel[...] = rb["linear_out"]["kernel"]
    block.conv.kernel[...] = rb["conv_1d"]["w"][::-1]
    block.conv.bias[...] = rb["conv_1d"]["b"]
    lru = rb["rg_lru"]
    block.rg_lru.a_param[...] = lru["a_param"]
    for ours, theirs in ((block.rg_lru.w_a, lru["a_gate"]), (block.rg_lru.w_x, lru["input_gate"])):
        ours.kernel[...] = block_diagonal(theirs["w"])
        ours.bias[...] = theirs["b"].reshape(-1)


def grads_in_rg_layout(g, heads: int) -> dict:
    """ssmlm's parameter gradients (an nnx.State of HawkBlock) in recurrentgemma's layout: the blocks on the
    diagonal of the dense gate kernels, the conv taps reversed (the norm's 1 + s shift leaves ∂/∂s unchanged)."""

    def diag_blocks(w):
        n = w.shape[0] // heads
        return jnp.stack([w[h * n : (h + 1) * n, h * n : (h + 1) * n] for h in range(heads)])

    lru = g["rg_lru"]
    return {
        "temporal_pre_norm/scale": g["norm"]["scale"][...],
        "linear_y/kernel": g["w_gate"]["kernel"][...],
        "linear_x/kernel": g["w_input"]["kernel"][...],
        "linear_out/kernel": g["w_output"]["kernel"][...],
        "conv_1d/w": g["conv"]["kernel"][...][::-1],
        "conv_1d/b": g["conv"]["bias"][...],
        "rg_lru/a_param": lru["a_param"][...],
        "rg_lru/a_gate/w": diag_blocks(lru["w_a"]["kernel"][...]),
        "rg_lru/a_gate/b": lru["w_a"]["bias"][...].reshape(heads, -1),
        "rg_lru/input_gate/w": diag_blocks(lru["w_x"]["kernel"][...]),
        "rg_lru/input_gate/b": lru["w_x"]["bias"][...].reshape(heads, -1),
    }


def rg_grads(g) -> dict:
    rb = g["recurrent_block"]
    lru = rb["rg_lru"]
    return {
        "temporal_pre_norm/scale": g["temporal_pre_norm"]["scale"],
        "linear_y/kernel": rb["linear_y"]["kernel"],
        "linear_x/kernel": rb["linear_x"]["kernel"],
        "linear_out/kernel": rb["linear_out"]["kernel"],
        "conv_1d/w": rb["conv_1d"]["w"],
        "conv_1d/b": rb["conv_1d"]["b"],
        "rg_lru/a_param": lru["a_param"],
        "rg_lru/a_gate/w": lru["a_gate"]["w"],
        "rg_lru/a_gate/b": lru["a_gate"]["b"],
        "rg_lru/input_gate/w": lru["input_gate"]["w"],
        "rg_lru/input_gate/b": lru["input_gate"]["b"],
    }


def diff(ours, ref) -> tuple[float, float]:
    """(max |Δ|, max |Δ| / max |ref|) in float64."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    d = float(np.abs(ours - ref).max())
    return d, d / max(float(np.abs(ref).max()), 1e-30)


def timed_compile(fn, *args):
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t


def step_time(compiled, *args) -> float:
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--width", type=int, default=256, help="d, the residual width")
    ap.add_argument("--lru-width", type=int, default=256, help="N, the RG-LRU width")
    ap.add_argument("--heads", type=int, default=2, help="blocks of recurrentgemma's block-diagonal gates")
    ap.add_argument("--conv", type=int, default=4, help="conv1d temporal width")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side per pass")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4, help="largest relative difference that counts as agreement")
    args = ap.parse_args(argv)
    b, length, d, n = args.batch, args.length, args.width, args.lru_width

    kx, kc, kinit, kr, kl = jax.random.split(jax.random.key(args.seed), 5)
    x = jax.random.normal(kx, (b, length, d), jnp.float32)
    cotangent = jax.random.normal(kc, (b, length, d), jnp.float32)  # the loss mean(y ⊙ cotangent)
    segment_pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    ctx = make_context(jnp.zeros((b, length), jnp.int32))  # one segment per row, all causal

    theirs = rg_block(args)
    rg_params = randomise(theirs.init(kinit, x, segment_pos, return_cache=False)["params"], kr)

    cfg = ModelConfig(arch="hawk", hidden_size=d, state_size=n, conv_width=args.conv, gelu="tanh", norm_eps=1e-6,
                      param_dtype="float32", compute_dtype="float32", bidirectional="none")  # fmt: skip
    ours = HawkBlock(cfg, bidirectional=False, rngs=nnx.Rngs(params=0))
    map_onto(ours, rg_params)
    graphdef, state = nnx.split(ours)

    def ssmlm_fwd(state, x):
        return nnx.merge(graphdef, state).mix(x, ctx)[:2]

    def rg_fwd(params, x):
        kw = {"return_cache": False, "capture_intermediates": True, "mutable": ["intermediates"]}
        y, inter = theirs.apply({"params": params}, x, segment_pos, **kw)
        return y[0], inter["intermediates"]["recurrent_block"]["rg_lru"]["__call__"][0][0]  # the RG-LRU's (h, cache)

    def ssmlm_loss(state, x):
        return jnp.mean(ssmlm_fwd(state, x)[0] * cotangent)

    def rg_loss(params, x):
        return jnp.mean(theirs.apply({"params": params}, x, segment_pos, return_cache=False)[0] * cotangent)

    print(f"hawk_parity: {time.strftime('%Y-%m-%d %H:%M')}  {cpu_name()}  ({jax.devices()[0].platform}, "
          f"{len(jax.devices())} device)  jax {jax.__version__}  python {platform.python_version()}")  # fmt: skip
    scan_type = rg_scan.resolve_scan_type(rg_common.ScanType.AUTO).name
    print(f"shape: batch {b} x length {length}, d {d}, lru width {n}, {args.heads} gate heads, conv {args.conv}, "
          f"float32, causal; recurrentgemma scan {scan_type}, ssmlm associative_scan")  # fmt: skip

    # the recurrentgemma init rule, same key: recurrentgemma's own initialiser against ssmlm's
    lam_rg = rg_layers.rnn_real_param_init(min_rad=0.9, max_rad=0.999)(kl, (n,))
    lam_ours = init_lambda(kl, (n,), rule="recurrentgemma")
    _, rel = diff(jax.nn.softplus(lam_ours), jax.nn.softplus(lam_rg))
    print(f"init  softplus(Λ), rg_lru_init=recurrentgemma vs rnn_real_param_init, same key: max rel {rel:.2e}")

    rows = []
    y_ours, h_ours = jax.jit(ssmlm_fwd)(state, x)
    y_rg, h_rg = jax.jit(rg_fwd)(rg_params, x)
    rows.append(("output x + branch", *diff(y_ours, y_rg)))
    rows.append(("branch (output - x)", *diff(y_ours - x, y_rg - x)))
    rows.append(("RG-LRU states h", *diff(h_ours, h_rg)))
    g_ours, gx_ours = jax.jit(jax.grad(ssmlm_loss, argnums=(0, 1)))(state, x)
    g_rg, gx_rg = jax.jit(jax.grad(rg_loss, argnums=(0, 1)))(rg_params, x)
    rows.append(("grad x", *diff(gx_ours, gx_rg)))
    mapped, ref = grads_in_rg_layout(g_ours, args.heads), rg_grads(g_rg)
    for name in ref:
        rows.append((f"grad {name}", *diff(mapped[name], ref[name])))
    for name, absd, rel in rows:
        print(f"  {name:28s} max |Δ| {absd:.3e}   max |Δ|/max|ref| {rel:.3e}")
    worst = max(rows, key=lambda r: r[2])
    agree = worst[2] <= args.tol
    print(f"parity: {'OK' if agree else 'FAILED'} (largest relative difference {worst[2]:.2e} in {worst[0]}, "
          f"tolerance {args.tol:g})")  # fmt: skip

    # training-step speed: jitted value_and_grad with respect to the parameters, interleaved
    sides = {
        "ssmlm": timed_compile(jax.value_and_grad(ssmlm_loss), state, x) + ((state, x),),
        "recurrentgemma": timed_compile(jax.value_and_grad(rg_loss), rg_params, x) + ((rg_params, x),),
    }
    for compiled, _, fn_args in sides.values():
        for _ in range(2):
            step_time(compiled, *fn_args)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.passes):
        for _ in range(args.steps):
            for k, (compiled, _, fn_args) in sides.items():
                times[k].append(step_time(compiled, *fn_args))
    for k, (_, compile_s, _) in sides.items():
        t = times[k]
        print(f"  {k:15s} compile {compile_s:6.2f} s   step median {1e3 * statistics.median(t):8.2f} ms "
              f"(min {1e3 * min(t):.2f}, max {1e3 * max(t):.2f}, {len(t)} steps)")  # fmt: skip
    paired = [a / r for a, r in zip(times["ssmlm"], times["recurrentgemma"], strict=True)]
    ratio = statistics.median(times["ssmlm"]) / statistics.median(times["recurrentgemma"])
    print(f"step ratio ssmlm / recurrentgemma: {ratio:.2f} (ratio of medians); paired ratios "
          f"{min(paired):.2f}-{max(paired):.2f} over {len(paired)} pairs")  # fmt: skip
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
