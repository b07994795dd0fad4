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

dq and dk are summed over the H // G heads of each group. The backward keeps one state every
``C`` steps (C ~ sqrt(T)) and recomputes the states in between, so its memory grows with
B*H*(T/C + C)*dk*dv, never with B*H*T*dk*dv.
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


def _step(S: np.ndarray, alpha_t: np.ndarray, k_t: np.ndarray, v_t: np.ndarray) -> np.ndarray:
    """S_t = alpha_t S_{t-1} + k_t^T v_t for all (b, h) at once."""
    return alpha_t[:, :, None, None] * S + k_t[:, :, :, None] * v_t[:, :, None, :]


def checkpoint_interval(T: int) -> int:
    """Steps between stored states in the backward: about sqrt(T), at least 1."""
    return max(1, math.isqrt(max(T, 1)))


def forward(q, k, v, log_alpha, h0, scale=1.0):
    """Return (o, h_T) of the recurrence. o: (B, H, T, dv), h_T: (B, H, dk, dv)."""
    H = v.shape[1]
    qh, kh = _per_head(q, H), _per_head(k, H)
    alpha = np.exp(log_alpha)
    S = h0.copy()
    o = np.empty(v.shape, dtype=np.result_type(q, k, v, log_alpha, h0))
    for t in range(v.shape[2]):
        S = _step(S, alpha[:, :, t], kh[:, :, t], v[:, :, t])
        o[:, :, t] = scale * np.einsum("bhk,bhkv->bhv", qh[:, :, t], S)
    return o, S


def vjp(q, k, v, log_alpha, h0, do, dh_T=None, scale=1.0, per_head=False):
    """Return (dq, dk, dv, dlog_alpha, dh0): the gradient of L = sum(o * do) + sum(h_T * dh_T).

    With ``per_head=True`` dq and dk come back per head, (B, H, T, dk), before the group sum.
    """
    B, H, T, dv = v.shape
    G = q.shape[1]
    qh, kh = _per_head(q, H), _per_head(k, H)
    alpha = np.exp(log_alpha)
    dtype = np.result_type(q, k, v, log_alpha, h0, do, *(() if dh_T is None else (dh_T,)))

    # Forward pass, keeping S_{c} for c = 0, C, 2C, ... (the state *before* step c+1).
    C = checkpoint_interval(T)
    checkpoints = []
    S = h0.astype(dtype, copy=True)
    for t in range(T):
        if t % C == 0:
            checkpoints.append(S)
        S = _step(S, alpha[:, :, t], kh[:, :, t], v[:, :, t])

    dqh = np.empty(qh.shape, dtype=dtype)
    dkh = np.empty(kh.shape, dtype=dtype)
    dvv = np.empty(v.shape, dtype=dtype)
    dla = np.empty(log_alpha.shape, dtype=dtype)
    # Gc carries alpha_{t+1} G_{t+1} into step t (zero-based t below is step t+1 of the math).
    Gc = np.zeros_like(S) if dh_T is None else dh_T.astype(dtype, copy=True)

    for c in reversed(range(len(checkpoints))):
        start, stop = c * C, min(T, (c + 1) * C)
        # States S_{start}, ..., S_{stop} of this block, recomputed from its checkpoint.
        states = [checkpoints[c]]
        for t in range(start, stop):
            states.append(_step(states[-1], alpha[:, :, t], kh[:, :, t], v[:, :, t]))
        for t in reversed(range(start, stop)):
            S_t, S_prev = states[t - start + 1], states[t - start]
            G_t = Gc + scale * qh[:, :, t, :, None] * do[:, :, t, None, :]
            dqh[:, :, t] = scale * np.einsum("bhkv,bhv->bhk", S_t, do[:, :, t])
            dkh[:, :, t] = np.einsum("bhkv,bhv->bhk", G_t, v[:, :, t])
            dvv[:, :, t] = np.einsum("bhkv,bhk->bhv", G_t, kh[:, :, t])
            dla[:, :, t] = alpha[:, :, t] * np.einsum("bhkv,bhkv->bh", S_prev, G_t)
            Gc = alpha[:, :, t, None, None] * G_t
    # After the loop Gc = alpha_1 G_1 = dh0 (or dh_T itself when T = 0).
    if per_head:
        return dqh, dkh, dvv, dla, Gc
    return _group_sum(dqh, G), _group_sum(dkh, G), dvv, dla, Gc


def dlog_alpha_identity(q, k, dq_head, dk_head, h_T, dh_T=None):
    """dlog_alpha through the identity production kernels use (docs/math.md, section 3):

        dlog_alpha_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <h_T, dh_T>

    with per-head dq, dk taken *before* the group sum. q, k: (B, G, T, dk); dq_head, dk_head:
    (B, H, T, dk). Cancellation in the reverse cumulative sum makes it lose accuracy when
    the terms are large compared with their sum (strong decay, long T).
    """
    H = dq_head.shape[1]
    d = (np.einsum("bhtk,bhtk->bht", _per_head(q, H), dq_head)
         - np.einsum("bhtk,bhtk->bht", _per_head(k, H), dk_head))
    total = np.flip(np.cumsum(np.flip(d, axis=2), axis=2), axis=2)
    if dh_T is not None:
        total = total + np.einsum("bhkv,bhkv->bh", h_T, dh_T)[:, :, None]
    return total
