"""glaref.delta: the float64 ground truth for the gated delta rule (DeltaNet, Gated DeltaNet,
Kimi Delta Attention), flash-linear-attention's convention (decay first):

    S~_t = A_t S_{t-1}      A_t = exp(log_alpha_t) (scalar gate: GDN; log_alpha = 0: DeltaNet)
                            A_t = diag(exp(log_alpha_t))  (vector gate (dk,): KDA)
    u_t  = beta_t (v_t - S~_t^T k_t)
    S_t  = S~_t + k_t u_t^T
    o_t  = scale * S_t^T q_t            h_T = S_T

    o, h_T = glaref.delta.forward(q, k, v, beta, log_alpha, h0=None, scale=1.0, layout="bhtd")
    g = glaref.delta.vjp(q, k, v, beta, log_alpha, h0, do, dh_T=None, scale=1.0, layout="bhtd")
    g.q, g.k, g.v, g.beta, g.log_alpha, g.h0

Shapes ("bhtd"; "bthd" swaps the time and head axes of every array but the states): q, k
(B, G, T, dk) with G groups of H // G heads (dq, dk summed over each group's heads); v
(B, H, T, dv); beta (B, H, T); log_alpha (B, H, T) (scalar gate) or (B, H, T, dk) (vector gate);
h0, h_T (B, H, dk, dv), or (N, H, dk, dv) with ``cu_seqlens`` (N packed sequences, B = 1).
Inputs may be numpy, torch (CPU) or JAX arrays of any real float dtype; results are float64
numpy arrays. Equations and gradients: docs/math_delta.md. Importing this module loads neither
numba nor jax; the Numba oracle compiles on first use.
"""

from __future__ import annotations

import importlib

from ._oracle import Grads, Scales, forward, scales, vjp

__all__ = ["Grads", "Scales", "forward", "regimes", "scales", "vjp"]


def __getattr__(name: str):
    if name == "regimes":
        return importlib.import_module(".regimes", __name__)
    raise AttributeError(f"module 'glaref.delta' has no attribute {name!r}")
