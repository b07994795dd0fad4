"""The Numba float64 oracle: same functions and signatures as ``_reference``, compiled.

Canonical "bhtd" float64 arrays in, float64 arrays out (see ``_inputs``):

    forward(q, k, v, log_alpha, h0, scale) -> (o, h_T)
    vjp(q, k, v, log_alpha, h0, do, dh_T, scale, per_head=False) -> (dq, dk, dv, dlog_alpha, dh0)

The equations are those of ``_reference`` (docs/math.md, sections 1 and 2). Determinism: the
kernels are ``@njit(fastmath=False, cache=True)``; ``prange`` runs over independent (b, h) pairs
only, with the time loop serial inside each, and the group sum of dq and dk is done after the
parallel loop in a fixed head order. The result is therefore bit-identical for any number of
threads.

Memory: the backward keeps one state every C ~ sqrt(T) steps per (b, h) being processed (only
the pairs in flight hold buffers), and recomputes the C states of a block from its checkpoint.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


def _checkpoint_interval(T: int) -> int:
    return max(1, math.isqrt(max(T, 1)))


@njit(parallel=True, fastmath=False, cache=True)
def _forward_kernel(q, k, v, log_alpha, h0, scale, o, h_T):  # pragma: no cover - compiled
    B, G, T, dk = q.shape
    H = v.shape[1]
    dv = v.shape[3]
    hpg = H // G
    for bh in prange(B * H):
        b = bh // H
        h = bh - b * H
        g = h // hpg
        S = h0[b, h].copy()
        acc = np.empty(dv)
        for t in range(T):
            a = np.exp(log_alpha[b, h, t])
            for i in range(dk):
                ki = k[b, g, t, i]
                for j in range(dv):
                    S[i, j] = a * S[i, j] + ki * v[b, h, t, j]
            for j in range(dv):
                acc[j] = 0.0
            for i in range(dk):
                qi = q[b, g, t, i]
                for j in range(dv):
                    acc[j] += qi * S[i, j]
            for j in range(dv):
                o[b, h, t, j] = scale * acc[j]
        for i in range(dk):
            for j in range(dv):
                h_T[b, h, i, j] = S[i, j]


@njit(parallel=True, fastmath=False, cache=True)
def _vjp_kernel(q, k, v, log_alpha, h0, do, dh_T, has_dh_T, scale, C,
                dqh, dkh, dvv, dla, dh0):  # pragma: no cover - compiled
    B, G, T, dk = q.shape
    H = v.shape[1]
    dv = v.shape[3]
    hpg = H // G
    n_ck = (T + C - 1) // C
    for bh in prange(B * H):
        b = bh // H
        h = bh - b * H
        g = h // hpg
        # forward, keeping S before step c*C
        ck = np.empty((max(n_ck, 1), dk, dv))
        S = h0[b, h].copy()
        for t in range(T):
            if t % C == 0:
                ck[t // C] = S
            a = np.exp(log_alpha[b, h, t])
            for i in range(dk):
                ki = k[b, g, t, i]
                for j in range(dv):
                    S[i, j] = a * S[i, j] + ki * v[b, h, t, j]
        Gc = np.zeros((dk, dv))
        if has_dh_T:
            Gc[:, :] = dh_T[b, h]
        Gt = np.empty((dk, dv))
        states = np.empty((C + 1, dk, dv))
        for c in range(n_ck - 1, -1, -1):
            start = c * C
            stop = min(T, start + C)
            states[0] = ck[c]
            for t in range(start, stop):
                a = np.exp(log_alpha[b, h, t])
                r = t - start
                for i in range(dk):
                    ki = k[b, g, t, i]
                    for j in range(dv):
                        states[r + 1, i, j] = a * states[r, i, j] + ki * v[b, h, t, j]
            for t in range(stop - 1, start - 1, -1):
                r = t - start
                a = np.exp(log_alpha[b, h, t])
                # G_t = Gc + scale q_t^T do_t
                for i in range(dk):
                    sq = scale * q[b, g, t, i]
                    for j in range(dv):
                        Gt[i, j] = Gc[i, j] + sq * do[b, h, t, j]
                # dq_t = scale S_t do_t ; dk_t = G_t v_t ; dla_t = a <S_{t-1}, G_t>
                s_dot = 0.0
                for i in range(dk):
                    accq = 0.0
                    acck = 0.0
                    for j in range(dv):
                        accq += states[r + 1, i, j] * do[b, h, t, j]
                        acck += Gt[i, j] * v[b, h, t, j]
                        s_dot += states[r, i, j] * Gt[i, j]
                    dqh[b, h, t, i] = scale * accq
                    dkh[b, h, t, i] = acck
                dla[b, h, t] = a * s_dot
                # dv_t = G_t^T k_t
                for j in range(dv):
                    dvv[b, h, t, j] = 0.0
                for i in range(dk):
                    ki = k[b, g, t, i]
                    for j in range(dv):
                        dvv[b, h, t, j] += Gt[i, j] * ki
                for i in range(dk):
                    for j in range(dv):
                        Gc[i, j] = a * Gt[i, j]
        for i in range(dk):
            for j in range(dv):
                dh0[b, h, i, j] = Gc[i, j]


@njit(parallel=True, fastmath=False, cache=True)
def _group_sum_kernel(xh, out):  # pragma: no cover - compiled
    """out[b, g] = xh[b, g*hpg] + xh[b, g*hpg + 1] + ... (left to right, fixed order)."""
    B, H, T, d = xh.shape
    G = out.shape[1]
    hpg = H // G
    for bg in prange(B * G):
        b = bg // G
        g = bg - b * G
        h0_ = g * hpg
        for t in range(T):
            for i in range(d):
                s = xh[b, h0_, t, i]
                for j in range(1, hpg):
                    s += xh[b, h0_ + j, t, i]
                out[b, g, t, i] = s


def _c64(x):
    return np.ascontiguousarray(x, dtype=np.float64)


def forward(q, k, v, log_alpha, h0, scale=1.0):
    """Return (o, h_T) of the recurrence. o: (B, H, T, dv), h_T: (B, H, dk, dv)."""
    q, k, v, log_alpha, h0 = _c64(q), _c64(k), _c64(v), _c64(log_alpha), _c64(h0)
    B, H, T, dv = v.shape
    dk = q.shape[3]
    o = np.empty((B, H, T, dv))
    h_T = np.empty((B, H, dk, dv))
    _forward_kernel(q, k, v, log_alpha, h0, float(scale), o, h_T)
    return o, h_T


def vjp(q, k, v, log_alpha, h0, do, dh_T=None, scale=1.0, per_head=False):
    """Return (dq, dk, dv, dlog_alpha, dh0): the gradient of L = sum(o * do) + sum(h_T * dh_T).

    With ``per_head=True`` dq and dk come back per head, (B, H, T, dk), before the group sum.
    """
    q, k, v, log_alpha, h0, do = (_c64(q), _c64(k), _c64(v), _c64(log_alpha), _c64(h0),
                                  _c64(do))
    B, G, T, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    has_dh_T = dh_T is not None
    dh_T_arr = _c64(dh_T) if has_dh_T else np.zeros((0, 0, 0, 0))
    dqh = np.empty((B, H, T, dk))
    dkh = np.empty((B, H, T, dk))
    dvv = np.empty((B, H, T, dv))
    dla = np.empty((B, H, T))
    dh0 = np.empty((B, H, dk, dv))
    _vjp_kernel(q, k, v, log_alpha, h0, do, dh_T_arr, has_dh_T, float(scale),
                _checkpoint_interval(T), dqh, dkh, dvv, dla, dh0)
    if per_head or G == H:
        return dqh, dkh, dvv, dla, dh0
    dq = np.empty((B, G, T, dk))
    dkg = np.empty((B, G, T, dk))
    _group_sum_kernel(dqh, dq)
    _group_sum_kernel(dkh, dkg)
    return dq, dkg, dvv, dla, dh0
