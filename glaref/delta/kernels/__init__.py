"""JAX kernels of the gated delta rule (DeltaNet, Gated DeltaNet, KDA; needs the ``jax`` extra).

    from glaref.delta import kernels
    o, h_T = kernels.chunked(q, k, v, beta, log_alpha, h0, chunk_size=64, return_final_state=True)
    o = kernels.scan(q, k, v, beta, log_alpha, h0, scale=dk ** -0.5)

Both compute ``glaref.delta.forward``'s recurrence (decay first, docs/math_delta.md section 1)
with scale 1 unless ``scale=`` is given: q, k (B, G, T, dk); v (B, H, T, dv); beta (B, H, T);
log_alpha (B, H, T) (scalar gate) or (B, H, T, dk) (vector gate); h0 (B, H, dk, dv) or None
(zeros); layout "bhtd" or "bthd"; head h reads group h // (H // G). They are jit-able and
differentiable by ``jax.vjp`` / ``jax.grad`` (reverse mode only: each is a ``jax.custom_vjp``)
with respect to q, k, v, beta, log_alpha and h0, and take any T, dk, dv and G dividing H.
Packed sequences: ``cu_seqlens=`` (concrete offsets of N sequences, B = 1) restarts the
recurrence at each, with h0 and h_T (N, H, dk, dv), run as a batch of N padded rows.

``scan`` steps through time with ``lax.scan``; its backward is the reverse-time adjoint of
docs/math_delta.md section 2, written out, recomputing states from checkpoints (``_scan``).
``chunked`` is the WY / UT chunked form the field ships (docs/math_delta.md section 8): a unit
lower triangular system per chunk, solved for every chunk at once, states passed between chunks;
its backward is JAX's autodiff of that forward, recomputed from the inputs, with the inverse's
vjp written out (``_chunked``). Neither keeps anything between the forward and the backward but
the inputs themselves.

Dtypes, as ``glaref.kernels``: the compute dtype is the promotion of all inputs, at least
float32 (16-bit inputs are upcast on entry); o comes back in the promotion of q, k and v, each
gradient in its input's dtype, h_T in the compute dtype. ``precision`` reaches every matmul of
the data, the triangular inverse's included (the gate sums always run at HIGHEST).
"""

from __future__ import annotations

from ._chunked import chunked
from ._scan import scan

__all__ = ["chunked", "scan"]
