"""The step-by-step reference kernel of ``glaref._baseline``, and the matrix product of its
chunked kernels, compiled by Numba.

Kept in its own module so that ``glaref._baseline`` imports Numba only when a reference kernel
first runs, and with every function at module level so that Numba's on-disk cache
(``cache=True``) serves later processes. Every dot product here (``dot``: the scan's products and
``bmm``, the chunked kernels' matrix products) sums in the fixed order its ``order`` names
(eight interleaved partial sums combined in a fixed tree, or one term after another), each
product rounded before it is added (no fused multiply-add: fastmath off lets LLVM neither
contract nor reassociate), so that the reference errors are the same on every machine,
whichever BLAS kernel (OpenBLAS Haswell, SkylakeX, Prescott ...) it picks. See
``glaref._baseline`` for what the kernels compute and why. One kernel serves both kinds of
gate: log_alpha (B, H, T, 1), a scalar gate, or (B, H, T, dk), a vector gate (``KERNELS`` gives
the scalar gate's (B, H, T) its trailing axis).
Determinism: ``prange`` over independent (batch, head) pairs only; fastmath off.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

jit = dict(fastmath=False, cache=True)


@njit(**jit)
def rnd(x, mode):  # pragma: no cover - compiled
    """x rounded in place to the format of ``mode`` (0: none; the caller passes 0 for anything
    but float32 arrays)."""
    if mode == 0:
        return x
    drop = 13 if mode != 2 else 16
    bits = x.reshape(-1).view(np.uint32)
    half = np.uint32((1 << (drop - 1)) - 1)
    mask = np.uint32((0xFFFFFFFF >> drop) << drop)
    for i in range(bits.shape[0]):
        b = bits[i]
        if (b & np.uint32(0x7F800000)) != np.uint32(0x7F800000):
            bits[i] = (b + half + ((b >> np.uint32(drop)) & np.uint32(1))) & mask
    return x


@njit(**jit)
def step(S, a, kt, vt, mode_o, mode_s):  # pragma: no cover - compiled
    """S <- diag(a) S + k^T v, a (1,) (a scalar gate: one decay for every row) or (dk,) (a vector
    gate: row i decays by a[i]); one rounding per element in the working dtype, the outer
    product's operands rounded to ``mode_o`` like every other matrix product's."""
    if mode_o != 0:
        kt = rnd(kt.copy(), mode_o)
        vt = rnd(vt.copy(), mode_o)
    for i in range(S.shape[0]):
        ai = a[i] if a.shape[0] > 1 else a[0]
        ki = kt[i]
        for j in range(S.shape[1]):
            S[i, j] = ai * S[i, j] + ki * vt[j]
    rnd(S, mode_s)


@njit(**jit)
def dot(x, y, acc, order=0):  # pragma: no cover - compiled
    """sum_a x[a] y[a]: ``order`` 0 in eight interleaved partial sums, combined in a fixed tree
    (how a vectorised dot product unit accumulates), 1 one term after another (how XLA's CPU
    backend reduces some dots: the loosest order a compiler uses); ``acc`` is scratch of 9
    working-dtype slots."""
    n = x.shape[0]
    if order == 1:
        acc[0] = 0
        for a in range(n):
            acc[0] += x[a] * y[a]
        return acc[0]
    m = n - n % 8
    acc[:] = 0
    for a in range(0, m, 8):
        for lane in range(8):
            acc[lane] += x[a + lane] * y[a + lane]
    for a in range(m, n):
        acc[8] += x[a] * y[a]
    return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + acc[8]


@njit(**jit)
def bmm(a, bt, out, order=0):  # pragma: no cover - compiled
    """out[n, i, j] = dot(a[n, i, :], bt[n, j, :]) for a (N, M, K), bt (N, P, K) (the right
    operand transposed), all C-contiguous in one dtype: a batch of matrix products a @ bt^T,
    every entry summed in ``dot``'s fixed order."""
    acc = np.empty(9, a.dtype)
    for n in range(a.shape[0]):
        for i in range(a.shape[1]):
            for j in range(bt.shape[1]):
                out[n, i, j] = dot(a[n, i], bt[n, j], acc, order)
    return out


@njit(**jit)
def vecmat(x, M, out, mode_o, mode_s, order):  # pragma: no cover - compiled
    """out = x M (x: (m,), M: (m, n)): each entry a dot product over m, operands rounded
    to ``mode_o``, the result to ``mode_s``."""
    xr = rnd(x.copy(), mode_o)
    Mt = rnd(M.T.copy(), mode_o)
    acc = np.empty(9, M.dtype)
    for j in range(Mt.shape[0]):
        out[j] = dot(xr, Mt[j], acc, order)
    rnd(out, mode_s)


@njit(**jit)
def matvec(M, y, out, mode_o, mode_s, order):  # pragma: no cover - compiled
    """out = M y (M: (m, n), y: (n,)): each entry a dot product over n."""
    Mr = rnd(M.copy(), mode_o)
    yr = rnd(y.copy(), mode_o)
    acc = np.empty(9, M.dtype)
    for i in range(Mr.shape[0]):
        out[i] = dot(Mr[i], yr, acc, order)
    rnd(out, mode_s)


@njit(**jit)
def frob(A, Bm, order):  # pragma: no cover - compiled
    """<A, B>: ``order`` 0 a dot product per row, then the rows' sums pairwise; 1 all dk dv terms
    one after another, row by row."""
    acc = np.empty(9, A.dtype)
    if order == 1:
        s = acc[0] - acc[0]
        for i in range(A.shape[0]):
            for j in range(A.shape[1]):
                s += A[i, j] * Bm[i, j]
        return s
    rows = np.empty(A.shape[0], A.dtype)
    for i in range(A.shape[0]):
        rows[i] = dot(A[i], Bm[i], acc)
    n = rows.shape[0]
    while n > 1:
        h = n // 2
        for i in range(h):
            rows[i] = rows[2 * i] + rows[2 * i + 1]
        if n % 2:
            rows[h] = rows[n - 1]
            h += 1
        n = h
    return rows[0] if rows.shape[0] else acc[0] - acc[0]


@njit(parallel=True, **jit)
def forward(qh, kh, v, la, h0, scale, mode_o, mode_s, order):  # pragma: no cover - compiled
    """(o, h_T); la (B, H, T, 1) for a scalar gate, (B, H, T, dk) for a vector gate."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    o = np.empty((B, H, T, dv), qh.dtype)
    hT = np.empty((B, H, dk, dv), qh.dtype)
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        S = h0[b, h].copy()
        out = np.empty(dv, qh.dtype)
        for t in range(T):
            step(S, np.exp(la[b, h, t]), kh[b, h, t], v[b, h, t], mode_o, mode_s)
            vecmat(qh[b, h, t], S, out, mode_o, mode_s, order)
            for j in range(dv):
                o[b, h, t, j] = scale * out[j]
        hT[b, h] = S
    return o, hT


@njit(parallel=True, **jit)
def vjp(qh, kh, v, la, h0, do, dh_T, scale, mode_o, mode_s, order):  # pragma: no cover - compiled
    """(dq, dk, dv, dlog_alpha, dh0) with la and dlog_alpha (B, H, T, 1) for a scalar gate,
    dlog_alpha_t = a_t <S_{t-1}, G_t>, or (B, H, T, dk) for a vector gate, dlog_alpha_t[i] =
    a_t[i] <S_{t-1}[i, :], G_t[i, :]> (direct form, one row of the state per key dimension);
    G carried as diag(a_t) G_t. The states are recomputed from checkpoints every C ~ sqrt(T)
    steps."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    dt = qh.dtype
    g = la.shape[3]
    dq = np.empty((B, H, T, dk), dt)
    dk_ = np.empty((B, H, T, dk), dt)
    dvv = np.empty((B, H, T, dv), dt)
    dla = np.empty((B, H, T, g), dt)
    dh0 = np.empty((B, H, dk, dv), dt)
    C = max(1, int(math.sqrt(max(T, 1))))
    nck = (T + C - 1) // C
    for bh in prange(B * H):
        b, h = bh // H, bh % H
        # checkpoints: the state before steps 0, C, 2C, ...
        ck = np.empty((max(nck, 1), dk, dv), dt)
        S = h0[b, h].copy()
        for t in range(T):
            if t % C == 0:
                ck[t // C] = S
            step(S, np.exp(la[b, h, t]), kh[b, h, t], v[b, h, t], mode_o, mode_s)
        Gc = dh_T[b, h].copy()
        blk = np.empty((C + 1, dk, dv), dt)
        Gt = np.empty((dk, dv), dt)
        tmp_k = np.empty(dk, dt)
        tmp_v = np.empty(dv, dt)
        sdo = np.empty(dv, dt)
        acc = np.empty(9, dt)
        for c in range(nck - 1, -1, -1):
            t0 = c * C
            t1 = min(T, t0 + C)
            blk[0] = ck[c]
            for t in range(t0, t1):
                blk[t - t0 + 1] = blk[t - t0]
                step(blk[t - t0 + 1], np.exp(la[b, h, t]), kh[b, h, t], v[b, h, t], mode_o, mode_s)
            for t in range(t1 - 1, t0 - 1, -1):
                a = np.exp(la[b, h, t])
                for j in range(dv):
                    sdo[j] = scale * do[b, h, t, j]
                qr = rnd(qh[b, h, t].copy(), mode_o)
                dr = rnd(sdo.copy(), mode_o)
                for i in range(dk):
                    for j in range(dv):
                        Gt[i, j] = Gc[i, j] + qr[i] * dr[j]
                rnd(Gt, mode_s)
                matvec(blk[t - t0 + 1], sdo, tmp_k, mode_o, mode_s, order)
                dq[b, h, t] = tmp_k
                matvec(Gt, v[b, h, t], tmp_k, mode_o, mode_s, order)
                dk_[b, h, t] = tmp_k
                vecmat(kh[b, h, t], Gt, tmp_v, mode_o, mode_s, order)
                dvv[b, h, t] = tmp_v
                prev = blk[t - t0]
                if g == 1:
                    dla[b, h, t, 0] = a[0] * frob(prev, Gt, order)
                else:
                    for i in range(dk):
                        dla[b, h, t, i] = a[i] * dot(prev[i], Gt[i], acc, order)
                for i in range(dk):
                    ai = a[i] if g > 1 else a[0]
                    for j in range(dv):
                        Gc[i, j] = ai * Gt[i, j]
                rnd(Gc, mode_s)
        dh0[b, h] = Gc
    return dq, dk_, dvv, dla, dh0


def forward_scalar(qh, kh, v, la, h0, scale, mode_o, mode_s, order):
    """``forward`` for a scalar gate la (B, H, T)."""
    return forward(qh, kh, v, la[..., None], h0, scale, mode_o, mode_s, order)


def vjp_scalar(qh, kh, v, la, h0, do, dh_T, scale, mode_o, mode_s, order):
    """``vjp`` for a scalar gate la (B, H, T); dlog_alpha (B, H, T)."""
    dq, dk, dv, dla, dh0 = vjp(qh, kh, v, la[..., None], h0, do, dh_T, scale, mode_o, mode_s,
                               order)
    return dq, dk, dv, dla[..., 0], dh0


KERNELS = {"scalar": (forward_scalar, vjp_scalar), "vector": (forward, vjp)}
