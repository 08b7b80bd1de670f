"""S4D: a diagonal state-space model turned into a long convolution kernel (BiGS paper, Section 3).

Continuous SSM      x'(t) = A x(t) + B u(t),      y(t) = C x(t) + D u(t)
ZOH discretisation  Ā = exp(ΔA),                  B̄ = (exp(ΔA) - 1) / A · B
Kernel              K̄ = (C̄B̄, C̄ĀB̄, …, C̄Ā^{L-1}B̄),  y = K̄ ∗ u + D u

As in BiGS (and the released checkpoints), one SSM is shared by every hidden channel: A (N complex
modes), C (N complex), a scalar step Δ and a scalar D; B is fixed to 1. All N modes are summed and
the real part is taken (no conjugate-pair halving). The kernel is evaluated at whatever length the
input has, which is what makes length extension exact: no SSM parameter depends on L.

Shapes: L sequence length, N states, H hidden channels, B batch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# ----------------------------------------------------------------------------- initialisation of A


def hippo_legs(n: int) -> np.ndarray:
    """The HiPPO-LegS matrix (BiGS eq. in Section 3.2): -sqrt(2n+1)sqrt(2k+1) below the diagonal, -(n+1) on it."""
    q = np.sqrt(1 + 2 * np.arange(n))
    a = q[:, None] * q[None, :]
    return -(np.tril(a, -1) + np.diag(np.arange(n) + 1.0))


def init_a(n: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(A_re, A_im) for N = n modes. 'hippo' is the diagonal of the normal part of HiPPO-LegS (S4D-LegS).

    hippo: A + P Pᵀ with P_n = sqrt(n + 1/2) equals -I/2 plus a skew-symmetric matrix; its eigenvalues are
    -1/2 + iλ with λ the eigenvalues of the Hermitian -i·skew, sorted ascending (all n kept, as the
    official code does). lin: -1/2 + iπn (S4D-Lin). inv: -1/2 + i(N/π)(N/(2n+1) - 1) (S4D-Inv).
    """
    idx = np.arange(n, dtype=np.float64)
    a_re = np.full(n, -0.5)
    if kind == "hippo":
        p = np.sqrt(idx + 0.5)
        s = hippo_legs(n) + p[:, None] * p[None, :]
        skew = s - np.diag(np.diag(s))
        a_im = np.linalg.eigvalsh(-1j * skew)  # ascending
        a_re = np.full(n, np.mean(np.diag(s)))
    elif kind == "lin":
        a_im = math.pi * idx
    elif kind == "inv":
        a_im = (n / math.pi) * (n / (2 * idx + 1) - 1)
    else:
        raise ValueError(f"unknown A initialisation {kind!r}; expected hippo, lin or inv")
    return a_re.astype(np.float32), np.asarray(a_im, dtype=np.float64).astype(np.float32)


# ----------------------------------------------------------------------------- kernel and convolution


def discretize_zoh(a: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Ā = exp(ΔA), B̄ = (exp(ΔA) - 1)/A with B = 1."""
    # expm1 keeps B̄ accurate when |ΔA| is tiny (exp(x) - 1 would cancel in float32)
    return jnp.exp(step * a), jnp.expm1(step * a) / a


def s4d_kernel(a_re, a_im, c, log_step, length: int) -> jax.Array:
    """K[ℓ] = Re Σ_n C_n · (e^{ΔA_n} - 1)/A_n · e^{ℓΔA_n}, ℓ = 0..L-1.  Returns (L,) float32.

    Re(A) is clipped to ≤ -1e-4 so every mode decays (as in the Annotated S4 and BiGS code).
    ``c`` is (N, 2) holding real and imaginary parts.
    """
    a = jnp.minimum(a_re, -1e-4) + 1j * a_im  # (N,)
    step = jnp.exp(log_step)  # (1,)
    _, b_bar = discretize_zoh(a, step)
    c = c[:, 0] + 1j * c[:, 1]
    # Ā^ℓ = exp(ℓΔA) exactly (ZOH), so no log/exp round trip.
    powers = jnp.exp(step * a[:, None] * jnp.arange(length)[None, :])  # (N, L)
    return jnp.real(jnp.einsum("n,nl->l", c * b_bar, powers)).astype(jnp.float32)


def causal_conv(u: jax.Array, k: jax.Array, d: jax.Array) -> jax.Array:
    """y = K ∗ u + D·u along axis 1 of u (B, L, H), with one kernel K (L,) for all channels, or one
    per channel (H, L) with D (H,).

    FFT with zero padding to 2L so the circular convolution equals the linear (causal) one.
    """
    length = u.shape[1]
    dtype = u.dtype
    uf = jnp.fft.rfft(u.astype(jnp.float32), n=2 * length, axis=1)
    kf = jnp.fft.rfft(k, n=2 * length, axis=-1)  # (F,) or (H, F)
    kf = kf[None, :, None] if k.ndim == 1 else kf.T[None]
    y = jnp.fft.irfft(uf * kf, n=2 * length, axis=1)[:, :length]
    return (y + d * u.astype(jnp.float32)).astype(dtype)


# ----------------------------------------------------------------------------- reference twins (tests)


def causal_conv_ref(u: np.ndarray, k: np.ndarray, d: float) -> np.ndarray:
    """Direct O(L²) causal sum y_t = Σ_{j≤t} K_j u_{t-j} + D u_t, for tests."""
    length = u.shape[1]
    y = np.zeros_like(u, dtype=np.float64)
    for t in range(length):
        for j in range(t + 1):
            y[:, t] += k[j] * u[:, t - j]
    return y + d * u


def ssm_recurrence_ref(a_re, a_im, c, log_step, d, u: np.ndarray) -> np.ndarray:
    """Run the discrete recurrence x_k = Ā x_{k-1} + B̄ u_k, y_k = Re(C x_k) + D u_k on a 1-D input."""
    a = np.minimum(np.asarray(a_re, np.float64), -1e-4) + 1j * np.asarray(a_im, np.float64)
    step = float(np.exp(np.asarray(log_step, np.float64)).reshape(-1)[0])
    a_bar = np.exp(step * a)
    b_bar = (a_bar - 1) / a
    cc = np.asarray(c, np.float64)
    cc = cc[:, 0] + 1j * cc[:, 1]
    x = np.zeros_like(a)
    ys = []
    for uk in np.asarray(u, np.float64):
        x = a_bar * x + b_bar * uk
        ys.append(np.real(np.sum(cc * x)) + float(np.asarray(d).reshape(-1)[0]) * uk)
    return np.array(ys)
