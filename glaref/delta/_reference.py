"""The NumPy reference of the gated delta rule: the definition, written to be read beside
docs/math_delta.md.

All arrays are canonical "bhtd" (``glaref._inputs``), plus beta (B, H, T); the functions are
generic over the dtype, so the same code runs in float64 (the oracle) and in complex128
(complex-step derivative checks).

Forward (docs/math_delta.md, section 1), for every batch b and head h, group g = h // (H // G),
state S of shape (dk, dv):

    S~_t = A_t S_{t-1}             A_t = alpha_t (scalar gate) or diag(alpha_t) (vector gate),
                                   alpha_t = exp(log_alpha_t)
    r_t  = v_t - S~_t^T k_t        (the delta residual)
    u_t  = beta_t r_t
    S_t  = S~_t + k_t u_t^T
    o_t  = scale * S_t^T q_t       h_T = S_T

Backward (docs/math_delta.md, section 2), with G_t = dL/dS_t through every path and
C_t = dL/dS_t from the later steps alone (C_T = dh_T):

    G_t          = C_t + scale * q_t do_t^T
    dq_t         = scale * S_t do_t
    du_t         = G_t^T k_t                  (dv,)
    dv_t         = beta_t du_t
    dbeta_t      = r_t . du_t
    dS~_t        = G_t - beta_t k_t du_t^T
    dk_t         = G_t u_t - beta_t S~_t du_t
    dlog_alpha_t = <S~_t, dS~_t>              (scalar gate; per row i for a vector gate)
    C_{t-1}      = A_t dS~_t                  dh0 = C_0

dq and dk are summed over the H // G heads of each group. The backward keeps one state every
``C`` steps (C ~ sqrt(T)) and recomputes the states in between from it, never by inverting a
step (I - beta k k^T is singular at beta ||k||^2 = 1).

Packed sequences (``cu_seqlens``, B = 1): each sequence [c_n, c_{n+1}) runs on its own, from
h0[n] to h_T[n], by the same code.
"""

from __future__ import annotations

import numpy as np

from ..gla._reference import _decay, _group_sum, _per_head, _spans, checkpoints, packed_vjp


def _step(S, alpha_t, beta_t, k_t, v_t):
    """One step for all (b, h): returns (S~_t, r_t, S_t)."""
    St = _decay(alpha_t) * S
    r = v_t - np.einsum("bhkv,bhk->bhv", St, k_t)
    return St, r, St + k_t[:, :, :, None] * (beta_t[:, :, None] * r)[:, :, None, :]


def forward(q, k, v, beta, log_alpha, h0, scale=1.0, cu_seqlens=None):
    """Return (o, h_T). o: (B, H, T, dv), h_T: (B, H, dk, dv) ((N, H, dk, dv) with cu_seqlens)."""
    if cu_seqlens is not None:
        return _packed_forward(q, k, v, beta, log_alpha, h0, scale, cu_seqlens)
    H = v.shape[1]
    qh, kh = _per_head(q, H), _per_head(k, H)
    alpha = np.exp(log_alpha)
    S = h0.copy()
    o = np.empty(v.shape, dtype=np.result_type(q, k, v, beta, log_alpha, h0))
    for t in range(v.shape[2]):
        _, _, S = _step(S, alpha[:, :, t], beta[:, :, t], kh[:, :, t], v[:, :, t])
        o[:, :, t] = scale * np.einsum("bhk,bhkv->bhv", qh[:, :, t], S)
    return o, S


def vjp(q, k, v, beta, log_alpha, h0, do, dh_T=None, scale=1.0, per_head=False,
        cu_seqlens=None):
    """Return (dq, dk, dv, dbeta, dlog_alpha, dh0): the gradient of
    L = sum(o * do) + sum(h_T * dh_T). ``per_head=True``: dq, dk per head (B, H, T, dk)."""
    if cu_seqlens is not None:
        return packed_vjp(vjp, (q, k, v, beta, log_alpha), h0, do, dh_T, scale, per_head,
                          cu_seqlens)
    B, H, T, dv = v.shape
    G = q.shape[1]
    qh, kh = _per_head(q, H), _per_head(k, H)
    alpha = np.exp(log_alpha)
    dtype = np.result_type(q, k, v, beta, log_alpha, h0, do,
                           *(() if dh_T is None else (dh_T,)))

    C, kept = checkpoints(h0.astype(dtype), T, lambda t, S: _step(
        S, alpha[:, :, t], beta[:, :, t], kh[:, :, t], v[:, :, t])[2])

    dqh = np.empty(qh.shape, dtype=dtype)
    dkh = np.empty(kh.shape, dtype=dtype)
    dvv = np.empty(v.shape, dtype=dtype)
    dbeta = np.empty(beta.shape, dtype=dtype)
    dla = np.empty(log_alpha.shape, dtype=dtype)
    Cc = np.zeros(h0.shape, dtype) if dh_T is None else dh_T.astype(dtype, copy=True)
    inner = "bhkv,bhkv->bh" if alpha.ndim == 3 else "bhkv,bhkv->bhk"

    for c in reversed(range(len(kept))):
        start, stop = c * C, min(T, (c + 1) * C)
        # S~_t, r_t, S_t of this block, recomputed from its checkpoint.
        steps, S = [], kept[c]
        for t in range(start, stop):
            steps.append(_step(S, alpha[:, :, t], beta[:, :, t], kh[:, :, t], v[:, :, t]))
            S = steps[-1][2]
        for t in reversed(range(start, stop)):
            St, r, S_t = steps[t - start]
            b_t, k_t = beta[:, :, t], kh[:, :, t]
            G_t = Cc + scale * qh[:, :, t, :, None] * do[:, :, t, None, :]
            dqh[:, :, t] = scale * np.einsum("bhkv,bhv->bhk", S_t, do[:, :, t])
            du = np.einsum("bhkv,bhk->bhv", G_t, k_t)
            dvv[:, :, t] = b_t[:, :, None] * du
            dbeta[:, :, t] = np.einsum("bhv,bhv->bh", r, du)
            u = b_t[:, :, None] * r
            dkh[:, :, t] = (np.einsum("bhkv,bhv->bhk", G_t, u)
                            - b_t[:, :, None] * np.einsum("bhkv,bhv->bhk", St, du))
            dSt = G_t - k_t[:, :, :, None] * (b_t[:, :, None] * du)[:, :, None, :]
            dla[:, :, t] = np.einsum(inner, St, dSt)
            Cc = _decay(alpha[:, :, t]) * dSt
    # After the loop Cc = A_1^T dS~_1 = dh0 (or dh_T itself when T = 0).
    if per_head:
        return dqh, dkh, dvv, dbeta, dla, Cc
    return _group_sum(dqh, G), _group_sum(dkh, G), dvv, dbeta, dla, Cc


def _packed_forward(q, k, v, beta, log_alpha, h0, scale, cu_seqlens):
    """Packed sequences (B = 1): every sequence run on its own, from h0[n] to h_T[n]."""
    o = np.zeros(v.shape, dtype=np.result_type(q, k, v, beta, log_alpha, h0))
    h_T = np.empty(h0.shape, dtype=o.dtype)
    for n, (t0, t1) in enumerate(_spans(cu_seqlens)):
        ts = slice(t0, t1)
        o[:, :, ts], h_T[n:n + 1] = forward(q[:, :, ts], k[:, :, ts], v[:, :, ts], beta[:, :, ts],
                                            log_alpha[:, :, ts], h0[n:n + 1], scale)
    return o, h_T
