"""The step-by-step reference kernel of ``glaref.gla._baseline``, and the matrix product of its
chunked kernels, compiled by Numba.

Kept in its own module so that ``glaref.gla._baseline`` imports Numba only when a reference kernel
first runs, and with every function at module level so that the on-disk cache
(``glaref._numba_cache``: once per machine) serves later processes. Every dot product here
(``dot``: the scan's products and ``bmm``, the chunked kernels' matrix products) sums in the
fixed order its ``order`` names (eight interleaved partial sums combined in a fixed tree, or one
term after another), each product rounded before it is added (no fused multiply-add: fastmath
off lets LLVM neither contract nor reassociate), so that the reference errors are the same on every machine,
whichever BLAS kernel (OpenBLAS Haswell, SkylakeX, Prescott ...) it picks. See
``glaref.gla._baseline`` for what the kernels compute and why. One kernel serves both kinds of
gate: log_alpha (B, H, T, 1), a scalar gate, or (B, H, T, dk), a vector gate (``KERNELS`` gives
the scalar gate's (B, H, T) its trailing axis).
Determinism: fastmath off; the workers (``run_workers``: one thread each, running compiled code
that releases the GIL) take independent (batch, head) pairs only, each with the same code
whatever the number of threads (a ``prange`` loop did the same, at three times the compile
time).
"""

from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads

from .._numba_cache import jit, note_compile, run_workers

_jit = jit(fastmath=False, nogil=True)


def _n_workers(n_pairs: int) -> int:
    return max(1, min(get_num_threads(), n_pairs))


@_jit
def copy(dst, src):  # pragma: no cover - compiled
    """dst = src, two 2-D arrays of one shape (a loop: an array assignment compiles Numba's
    broadcasting checks, seconds of compile time)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@_jit
def rnd(x, mode):  # pragma: no cover - compiled
    """x (1-D: callers pass a matrix as ``M.reshape(-1)``, so that one compiled version serves
    both) rounded in place to the format of ``mode`` (0: none; the caller passes 0 for anything
    but float32 arrays)."""
    if mode == 0:
        return x
    drop = 13 if mode != 2 else 16
    bits = x.view(np.uint32)
    half = np.uint32((1 << (drop - 1)) - 1)
    mask = np.uint32((0xFFFFFFFF >> drop) << drop)
    for i in range(bits.shape[0]):
        b = bits[i]
        if (b & np.uint32(0x7F800000)) != np.uint32(0x7F800000):
            bits[i] = (b + half + ((b >> np.uint32(drop)) & np.uint32(1))) & mask
    return x


@_jit
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
    rnd(S.reshape(-1), mode_s)


@_jit
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


@_jit
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


@_jit
def vecmat(x, M, out, mode_o, mode_s, order):  # pragma: no cover - compiled
    """out = x M (x: (m,), M: (m, n)): each entry a dot product over m, operands rounded
    to ``mode_o``, the result to ``mode_s``."""
    xr = rnd(x.copy(), mode_o)
    Mt = M.T.copy()
    rnd(Mt.reshape(-1), mode_o)
    acc = np.empty(9, M.dtype)
    for j in range(Mt.shape[0]):
        out[j] = dot(xr, Mt[j], acc, order)
    rnd(out, mode_s)


@_jit
def matvec(M, y, out, mode_o, mode_s, order):  # pragma: no cover - compiled
    """out = M y (M: (m, n), y: (n,)): each entry a dot product over n."""
    Mr = M.copy()
    rnd(Mr.reshape(-1), mode_o)
    yr = rnd(y.copy(), mode_o)
    acc = np.empty(9, M.dtype)
    for i in range(Mr.shape[0]):
        out[i] = dot(Mr[i], yr, acc, order)
    rnd(out, mode_s)


@_jit
def frob(A, Bm, order):  # pragma: no cover - compiled
    """<A, B>: ``order`` 0 a dot product per row, then the rows' sums pairwise; 1 all dk dv terms
    one after another, row by row."""
    acc = np.zeros(9, A.dtype)      # zeros: acc[0] is the sums' zero in the working dtype
    if order == 1:
        s = acc[0]
        for i in range(A.shape[0]):
            for j in range(A.shape[1]):
                s += A[i, j] * Bm[i, j]
        return s
    rows = np.empty(A.shape[0], A.dtype)
    for i in range(A.shape[0]):
        rows[i] = dot(A[i], Bm[i], acc, order)       # order is 0 here
    n = rows.shape[0]
    while n > 1:
        h = n // 2
        for i in range(h):
            rows[i] = rows[2 * i] + rows[2 * i + 1]
        if n % 2:
            rows[h] = rows[n - 1]
            h += 1
        n = h
    return rows[0] if rows.shape[0] else acc[0]


@_jit
def _forward_rows(w, n_workers, qh, kh, v, la, h0, scale, mode_o, mode_s, order, o,
                  hT):  # pragma: no cover - compiled
    """Worker w of n_workers: the (batch, head) pairs w, w + n_workers, ... of ``forward``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    S = np.empty((dk, dv), qh.dtype)
    out = np.empty(dv, qh.dtype)
    for bh in range(w, B * H, n_workers):
        b, h = bh // H, bh % H
        copy(S, h0[b, h])
        for t in range(T):
            step(S, np.exp(la[b, h, t]), kh[b, h, t], v[b, h, t], mode_o, mode_s)
            vecmat(qh[b, h, t], S, out, mode_o, mode_s, order)
            for j in range(dv):
                o[b, h, t, j] = scale * out[j]
        copy(hT[b, h], S)


def forward(qh, kh, v, la, h0, scale, mode_o, mode_s, order):
    """(o, h_T); la (B, H, T, 1) for a scalar gate, (B, H, T, dk) for a vector gate."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    o = np.empty((B, H, T, dv), qh.dtype)
    hT = np.empty((B, H, dk, dv), qh.dtype)
    run_workers(_forward_rows, _n_workers(B * H), qh, kh, v, la, h0, scale, mode_o, mode_s,
                order, o, hT)
    return o, hT


@_jit
def checkpoints(T, dk, dv, dt):  # pragma: no cover - compiled
    """The storage of a checkpointed reverse sweep over T steps of a (dk, dv) state in dtype
    dt: blocks of C ~ sqrt(T) steps, nck of them; ck for the state before steps 0, C, 2C, ...
    and blk for one block's C + 1 states, recomputed from its checkpoint. Returns
    (C, nck, ck, blk); both families' scans use it."""
    C = max(1, int(math.sqrt(max(T, 1))))
    nck = (T + C - 1) // C
    return C, nck, np.empty((max(nck, 1), dk, dv), dt), np.empty((C + 1, dk, dv), dt)


@_jit
def _vjp_rows(w, n_workers, qh, kh, v, la, h0, do, dh_T, scale, mode_o, mode_s, order, dq, dk_,
              dvv, dla, dh0):  # pragma: no cover - compiled
    """Worker w of n_workers: the (batch, head) pairs w, w + n_workers, ... of ``vjp``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    dt = qh.dtype
    g = la.shape[3]
    C, nck, ck, blk = checkpoints(T, dk, dv, dt)
    S = np.empty((dk, dv), dt)
    Gc = np.empty((dk, dv), dt)
    Gt = np.empty((dk, dv), dt)
    tmp_k = np.empty(dk, dt)
    tmp_v = np.empty(dv, dt)
    sdo = np.empty(dv, dt)
    acc = np.empty(9, dt)
    for bh in range(w, B * H, n_workers):
        b, h = bh // H, bh % H
        copy(S, h0[b, h])
        for t in range(T):
            if t % C == 0:
                copy(ck[t // C], S)
            step(S, np.exp(la[b, h, t]), kh[b, h, t], v[b, h, t], mode_o, mode_s)
        copy(Gc, dh_T[b, h])
        for c in range(nck - 1, -1, -1):
            t0 = c * C
            t1 = min(T, t0 + C)
            copy(blk[0], ck[c])
            for t in range(t0, t1):
                copy(blk[t - t0 + 1], blk[t - t0])
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
                rnd(Gt.reshape(-1), mode_s)
                matvec(blk[t - t0 + 1], sdo, tmp_k, mode_o, mode_s, order)
                for i in range(dk):
                    dq[b, h, t, i] = tmp_k[i]
                matvec(Gt, v[b, h, t], tmp_k, mode_o, mode_s, order)
                for i in range(dk):
                    dk_[b, h, t, i] = tmp_k[i]
                vecmat(kh[b, h, t], Gt, tmp_v, mode_o, mode_s, order)
                for j in range(dv):
                    dvv[b, h, t, j] = tmp_v[j]
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
                rnd(Gc.reshape(-1), mode_s)
        copy(dh0[b, h], Gc)


def vjp(qh, kh, v, la, h0, do, dh_T, scale, mode_o, mode_s, order):
    """(dq, dk, dv, dlog_alpha, dh0) with la and dlog_alpha (B, H, T, 1) for a scalar gate,
    dlog_alpha_t = a_t <S_{t-1}, G_t>, or (B, H, T, dk) for a vector gate, dlog_alpha_t[i] =
    a_t[i] <S_{t-1}[i, :], G_t[i, :]> (direct form, one row of the state per key dimension);
    G carried as diag(a_t) G_t. The states are recomputed from checkpoints every C ~ sqrt(T)
    steps."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    dt = qh.dtype
    dq = np.empty((B, H, T, dk), dt)
    dk_ = np.empty((B, H, T, dk), dt)
    dvv = np.empty((B, H, T, dv), dt)
    dla = np.empty((B, H, T, la.shape[3]), dt)
    dh0 = np.empty((B, H, dk, dv), dt)
    run_workers(_vjp_rows, _n_workers(B * H), qh, kh, v, la, h0, do, dh_T, scale, mode_o, mode_s,
                order, dq, dk_, dvv, dla, dh0)
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


# The one line on stderr while a worker compiles (glaref._numba_cache); seconds: the CPU time of
# the compile on a 2-core x86-64 machine (tools/bench_cold.py).
def _what(part):
    def what(args):
        return f"the {args[2].dtype} reference kernels (scan, {part})"
    return what


note_compile(_forward_rows, _what("forward"), 4)
note_compile(_vjp_rows, _what("gradients"), 5)
