"""The NumPy reference: the definition of the recurrence, written to be read beside docs/math.md.

All arrays are canonical "bhtd" (see ``_inputs``); the functions are generic over the dtype, so
the same code runs in float64 (the oracle) and in complex128 (complex-step derivative checks).

Forward (docs/math.md, section 1), for every batch b and head h with group g = h // (H // G):

    S_0 = h0
    S_t = alpha_t * S_{t-1} + k_t^T v_t          alpha_t = exp(log_alpha_t)
    o_t = scale * q_t S_t
    h_T = S_T

Backward (docs/math.md, section 2), with G_t = dL/dS_t through every path:

    G_T = scale * q_T^T do_T + dh_T
    G_t = scale * q_t^T do_t + alpha_{t+1} G_{t+1}
    dq_t = scale * S_t do_t^T      dk_t = G_t v_t^T      dv_t = G_t^T k_t^T
    dlog_alpha_t = alpha_t <S_{t-1}, G_t>                dh0 = alpha_1 G_1

Vector gates (docs/math.md, section 9): log_alpha (B, H, T, dk) decays each row i of the state
(key dimension i) by its own alpha_t[i], "alpha_t *" above becomes diag(alpha_t) (a row scaling)
and the inner product of dlog_alpha is taken per row:

    dlog_alpha_t[i] = alpha_t[i] sum_j S_{t-1}[i, j] G_t[i, j]

The code below is the same for both: ``_decay`` broadcasts a scalar or a per-row decay.

dq and dk are summed over the H // G heads of each group. The backward keeps one state every
``C`` steps (C ~ sqrt(T)) and recomputes the states in between, so its memory grows with
B*H*(T/C + C)*dk*dv, never with B*H*T*dk*dv.

Packed sequences (``cu_seqlens``, B = 1): each sequence [c_n, c_{n+1}) is run on its own, from
h0[n] to h_T[n], by the same code: packed equals one by one, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np


def _per_head(x: np.ndarray, H: int) -> np.ndarray:
    """Repeat q or k (B, G, T, d) over the heads of each group -> (B, H, T, d)."""
    return np.repeat(x, H // x.shape[1], axis=1)


def _group_sum(x: np.ndarray, G: int) -> np.ndarray:
    """Sum per-head dq or dk (B, H, T, d) over the heads of each group -> (B, G, T, d)."""
    B, H, T, d = x.shape
    return x.reshape(B, G, H // G, T, d).sum(axis=2)


def _decay(alpha_t: np.ndarray) -> np.ndarray:
    """alpha_t of one step, (B, H) or (B, H, dk), shaped to scale states (B, H, dk, dv): the same
    number for every entry (scalar gate) or one per row i of the state (vector gate)."""
    return alpha_t[:, :, None, None] if alpha_t.ndim == 2 else alpha_t[:, :, :, None]


def _step(S: np.ndarray, alpha_t: np.ndarray, k_t: np.ndarray, v_t: np.ndarray) -> np.ndarray:
    """S_t = alpha_t S_{t-1} + k_t^T v_t for all (b, h) at once."""
    return _decay(alpha_t) * S + k_t[:, :, :, None] * v_t[:, :, None, :]


def checkpoint_interval(T: int) -> int:
    """Steps between stored states in the backward: about sqrt(T), at least 1."""
    return max(1, math.isqrt(max(T, 1)))


def checkpoints(S0: np.ndarray, T: int, step) -> tuple[int, list[np.ndarray]]:
    """The forward pass keeping the states S_c for c = 0, C, 2C, ... (the state before step
    c + 1), C = ``checkpoint_interval(T)``: (C, [S_0, S_C, ...]). ``step(t, S)`` returns S_{t+1}
    from S_t; S0 is copied, never written."""
    C = checkpoint_interval(T)
    kept = []
    S = S0.copy()
    for t in range(T):
        if t % C == 0:
            kept.append(S)
        S = step(t, S)
    return C, kept


def forward(q, k, v, log_alpha, h0, scale=1.0, cu_seqlens=None):
    """Return (o, h_T) of the recurrence. o: (B, H, T, dv), h_T: (B, H, dk, dv) ((N, H, dk, dv)
    with cu_seqlens)."""
    if cu_seqlens is not None:
        return _packed_forward(q, k, v, log_alpha, h0, scale, cu_seqlens)
    H = v.shape[1]
    qh, kh = _per_head(q, H), _per_head(k, H)
    alpha = np.exp(log_alpha)
    S = h0.copy()
    o = np.empty(v.shape, dtype=np.result_type(q, k, v, log_alpha, h0))
    for t in range(v.shape[2]):
        S = _step(S, alpha[:, :, t], kh[:, :, t], v[:, :, t])
        o[:, :, t] = scale * np.einsum("bhk,bhkv->bhv", qh[:, :, t], S)
    return o, S


def vjp(q, k, v, log_alpha, h0, do, dh_T=None, scale=1.0, per_head=False, cu_seqlens=None):
    """Return (dq, dk, dv, dlog_alpha, dh0): the gradient of L = sum(o * do) + sum(h_T * dh_T).

    With ``per_head=True`` dq and dk come back per head, (B, H, T, dk), before the group sum.
    """
    if cu_seqlens is not None:
        return packed_vjp(vjp, (q, k, v, log_alpha), h0, do, dh_T, scale, per_head, cu_seqlens)
    B, H, T, dv = v.shape
    G = q.shape[1]
    qh, kh = _per_head(q, H), _per_head(k, H)
    alpha = np.exp(log_alpha)
    dtype = np.result_type(q, k, v, log_alpha, h0, do, *(() if dh_T is None else (dh_T,)))

    C, kept = checkpoints(h0.astype(dtype), T,
                          lambda t, S: _step(S, alpha[:, :, t], kh[:, :, t], v[:, :, t]))

    dqh = np.empty(qh.shape, dtype=dtype)
    dkh = np.empty(kh.shape, dtype=dtype)
    dvv = np.empty(v.shape, dtype=dtype)
    dla = np.empty(log_alpha.shape, dtype=dtype)
    # Gc carries alpha_{t+1} G_{t+1} into step t (zero-based t below is step t+1 of the math).
    Gc = np.zeros(h0.shape, dtype) if dh_T is None else dh_T.astype(dtype, copy=True)

    for c in reversed(range(len(kept))):
        start, stop = c * C, min(T, (c + 1) * C)
        # States S_{start}, ..., S_{stop} of this block, recomputed from its checkpoint.
        states = [kept[c]]
        for t in range(start, stop):
            states.append(_step(states[-1], alpha[:, :, t], kh[:, :, t], v[:, :, t]))
        for t in reversed(range(start, stop)):
            S_t, S_prev = states[t - start + 1], states[t - start]
            G_t = Gc + scale * qh[:, :, t, :, None] * do[:, :, t, None, :]
            dqh[:, :, t] = scale * np.einsum("bhkv,bhv->bhk", S_t, do[:, :, t])
            dkh[:, :, t] = np.einsum("bhkv,bhv->bhk", G_t, v[:, :, t])
            dvv[:, :, t] = np.einsum("bhkv,bhk->bhv", G_t, kh[:, :, t])
            # <S_{t-1}, G_t>, whole (scalar gate) or row by row (vector gate)
            inner = "bhkv,bhkv->bh" if alpha.ndim == 3 else "bhkv,bhkv->bhk"
            dla[:, :, t] = alpha[:, :, t] * np.einsum(inner, S_prev, G_t)
            Gc = _decay(alpha[:, :, t]) * G_t
    # After the loop Gc = alpha_1 G_1 = dh0 (or dh_T itself when T = 0).
    if per_head:
        return dqh, dkh, dvv, dla, Gc
    return _group_sum(dqh, G), _group_sum(dkh, G), dvv, dla, Gc


def dlog_alpha_identity(q, k, dq_head, dk_head, h_T, dh_T=None, vector=False, cu_seqlens=None):
    """dlog_alpha through the identity production kernels use (docs/math.md, section 3):

        dlog_alpha_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <h_T, dh_T>

    with per-head dq, dk taken *before* the group sum. q, k: (B, G, T, dk); dq_head, dk_head:
    (B, H, T, dk). Cancellation in the reverse cumulative sum makes it lose accuracy when
    the terms are large compared with their sum (strong decay, long T).

    ``vector=True`` (vector gates, docs/math.md section 9): the same per key dimension i,
    dlog_alpha_t[i] = sum_{s >= t} (q_s[i] dq_s[i] - k_s[i] dk_s[i]) + sum_j h_T[i, j] dh_T[i, j].
    With ``cu_seqlens`` the reverse sum stops at each sequence's start and each sequence adds
    its own final-state term.
    """
    H = dq_head.shape[1]
    pair = "bhtk,bhtk->bhtk" if vector else "bhtk,bhtk->bht"
    d = np.einsum(pair, _per_head(q, H), dq_head) - np.einsum(pair, _per_head(k, H), dk_head)
    final = None
    if dh_T is not None:
        final = np.einsum("nhkv,nhkv->nhk" if vector else "nhkv,nhkv->nh", h_T, dh_T)
    return suffix_sums(d, final, cu_seqlens)


def suffix_sums(d, final=None, cu_seqlens=None):
    """sum_{s >= t} d_s (+ final) along the time axis 2 of d (B, H, T[, dk]), restarting in every
    sequence: each batch row, or each packed sequence of ``cu_seqlens``; ``final`` (one per
    sequence, (n, H[, dk])) is added to every step of its sequence."""
    total = np.empty_like(d)
    T = d.shape[2]
    spans = ([(b, 0, T) for b in range(d.shape[0])] if cu_seqlens is None else
             [(0, t0, t1) for t0, t1 in _spans(cu_seqlens)])
    for n, (b, t0, t1) in enumerate(spans):
        seg = np.flip(np.cumsum(np.flip(d[b, :, t0:t1], axis=1), axis=1), axis=1)
        total[b, :, t0:t1] = seg if final is None else seg + final[n][:, None]
    return total


def _spans(cu_seqlens):
    return [(int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]


def _packed_forward(q, k, v, log_alpha, h0, scale, cu_seqlens):
    """Packed sequences (B = 1): every sequence run on its own, from h0[n] to h_T[n]."""
    o = np.zeros(v.shape, dtype=np.result_type(q, k, v, log_alpha, h0))
    h_T = np.empty(h0.shape, dtype=o.dtype)
    for n, (t0, t1) in enumerate(_spans(cu_seqlens)):
        o[:, :, t0:t1], h_T[n:n + 1] = forward(q[:, :, t0:t1], k[:, :, t0:t1], v[:, :, t0:t1],
                                               log_alpha[:, :, t0:t1], h0[n:n + 1], scale)
    return o, h_T


def packed_vjp(vjp_one, xs, h0, do, dh_T, scale, per_head, cu_seqlens):
    """Packed sequences (B = 1): ``vjp_one`` on every sequence on its own. ``xs`` are the inputs
    that run along t, in vjp_one's order and starting with q, k, v; the gradients come back in
    that order, then dh0."""
    q, H = xs[0], xs[2].shape[1]
    dtype = np.result_type(*xs, h0, do, *(() if dh_T is None else (dh_T,)))
    G_out = H if per_head else q.shape[1]
    dqk = q.shape[:1] + (G_out,) + q.shape[2:]
    grads = [np.zeros(dqk, dtype), np.zeros(dqk, dtype)] + [np.zeros(x.shape, dtype) for x in xs[2:]]
    dh0 = np.empty(h0.shape, dtype=dtype)
    for n, (t0, t1) in enumerate(_spans(cu_seqlens)):
        ts = slice(t0, t1)
        r = vjp_one(*(x[:, :, ts] for x in xs), h0[n:n + 1], do[:, :, ts],
                    None if dh_T is None else dh_T[n:n + 1], scale, per_head)
        for g, x in zip(grads, r[:-1]):
            g[:, :, ts] = x
        dh0[n:n + 1] = r[-1]
    return (*grads, dh0)
