"""JAX kernels for gated linear attention, scalar or vector gates (needs the ``jax`` extra).

    from glaref import kernels
    o = kernels.chunked(q, k, v, log_alpha, h0, chunk_size=64, layout="bhtd")
    o, h_T = kernels.chunked(q, k, v, log_alpha, h0, return_final_state=True)
    o = kernels.scan(q, k, v, log_alpha, h0, layout="bhtd", checkpoint_every=None)

Both compute the oracle's recurrence with scale 1 unless ``scale=`` is given
(``glaref.forward``): q, k (B, G, T, dk); v (B, H, T, dv); log_alpha (B, H, T); h0 (B, H, dk, dv)
or None (zeros), layout "bhtd" or "bthd" (time before heads); head h reads group h // (H // G).
They are jit-able, vmap-able and differentiable (jax.vjp / jax.grad) with respect to q, k, v,
log_alpha and h0, and take any T, dk, dv and G dividing H.

Vector gates: log_alpha (B, H, T, dk) ((B, T, H, dk) in "bthd") decays each key dimension by
its own gate, S_t = diag(exp(log_alpha_t)) S_{t-1} + k_t^T v_t (GLA); the gradient of log_alpha
has the same shape. ``chunked`` then forms every decay factor from gate sums over a segment
inside one chunk, never exp(b_i) / exp(b_j), so strong decay underflows instead of overflowing
(``_chunked_vector``). Packed sequences: ``cu_seqlens=`` (concrete integer offsets of N
sequences, B = 1) restarts the recurrence at each sequence, with h0 and h_T (N, H, dk, dv); the
sequences run as a batch of N rows padded to the longest (``_common.run_packed``).

``chunked`` is the fast one: chunk-parallel forward and a ``jax.custom_vjp`` whose backward
recomputes everything from the inputs (no residuals beyond the inputs). ``scan`` is the
step-by-step recurrence differentiated by JAX; ``checkpoint_every=N`` bounds its residual memory.
``chunked`` supports reverse-mode only (``jax.custom_vjp``: no ``jax.jvp``/``jacfwd``).

Dtypes. The compute dtype is the promotion of all inputs, at least float32: bfloat16 and float16
inputs are upcast to float32 on entry and every intermediate (cumulative log gates, decays,
chunk states, matmul accumulations, the reverse sweep's dS) is float32; float64 inputs under
``jax.experimental.enable_x64`` compute in float64. What is stored in the input dtype: only the
returned o (rounded once, at the end, to the promotion of q, k, v's dtypes) and each gradient
(rounded once, at the end, to its input's dtype, as JAX requires). h_T is returned in the
compute dtype, so a carried state never loses precision between calls.

Precision. ``precision`` (None, "default", "high", "highest" or a ``jax.lax.Precision``) is
passed to every matmul and einsum. None means JAX's default: full float32 on CPU, but on NVIDIA
GPUs (Ampere and later) float32 matmuls then run as TF32 (10-bit mantissa, unit roundoff 2**-11
instead of 2**-24); pass ``precision="highest"`` for true float32 there.

dlog_alpha. ``chunked`` with scalar gates computes it by the chunk-local reverse-cumsum identity
(as flash-linear-attention's chunk kernels do); with vector gates by the per-chunk vjp of the
chunk function, the direct form; ``scan`` by JAX autodiff of the recurrence, the direct form.
The audit judges each against references of its own form (``dlog_alpha_form``).
"""

from __future__ import annotations

from ._chunked import chunked
from ._scan import scan

__all__ = ["chunked", "dlog_alpha_form", "scan"]


def dlog_alpha_form(name: str, gate: str = "scalar") -> str:
    """How built-in kernel ``name`` ("chunked" or "scan") computes dlog_alpha with ``gate``
    ("scalar" or "vector") gates: "identity" or "direct" (glaref._audit._verdict.DLOG_ALPHA_FORMS)."""
    if name not in __all__ or name == "dlog_alpha_form":
        raise ValueError(f"name: got {name!r}, expected 'chunked' or 'scan'")
    if gate not in ("scalar", "vector"):
        raise ValueError(f"gate: got {gate!r}, expected 'scalar' or 'vector'")
    return "identity" if name == "chunked" and gate == "scalar" else "direct"
