"""The gated delta rule's same-precision reference kernels, compiled by Numba (see
``glaref.delta._baseline`` for what they compute and why).

Every function is generic over the working dtype (float32 or float64): the arrays come in that
dtype, ``z`` is a zero of it (every accumulator starts from it, so that no sum is promoted to
float64), and every assignment into an array of it rounds. Every sum runs in one fixed order, one
term after another (a matrix product ``C = A B`` as rows of axpys ``C[i, :] += A[i, p] B[p, :]``
for p ascending, a dot product from its first term to its last), each product rounded before it
is added: fastmath off lets LLVM neither contract a multiply-add nor reassociate, so that the
bytes, and so the reference errors, are the same on every machine, whatever BLAS it has (none is
called) and whatever number of threads. ``mode`` rounds every matrix-product operand first
(``glaref._baseline_scan.rnd``: 0 none, 1 tf32, 2 bfloat16, 3 float16; float32 arrays only).

Determinism: workers (``glaref._numba_cache.run_workers``) take independent (batch, head) pairs,
each with the same code whatever the number of threads; dq and dk come back per head, and the
caller sums each group's heads in head order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads

from .._baseline_scan import rnd
from .._numba_cache import jit, note_compile, run_workers

_jit = jit(fastmath=False, nogil=True)


def n_workers(n_pairs: int) -> int:
    return max(1, min(get_num_threads(), n_pairs))


@_jit
def _op(x, mode):  # pragma: no cover - compiled
    """x as a matrix-product operand: x itself (mode 0), or a copy rounded to the format of
    ``mode``."""
    if mode == 0:
        return x
    y = x.copy()
    rnd(y.reshape(-1), mode)
    return y


@_jit
def _vT_M(x, M, out, z):  # pragma: no cover - compiled
    """out[j] = sum_i x[i] M[i, j], i ascending (x (m,), M (m, n))."""
    for j in range(M.shape[1]):
        out[j] = z
    for i in range(M.shape[0]):
        xi = x[i]
        for j in range(M.shape[1]):
            out[j] += xi * M[i, j]


@_jit
def _M_v(M, y, out, z):  # pragma: no cover - compiled
    """out[i] = sum_j M[i, j] y[j], j ascending (M (m, n), y (n,))."""
    for i in range(M.shape[0]):
        s = z
        for j in range(M.shape[1]):
            s += M[i, j] * y[j]
        out[i] = s


@_jit
def _dot(x, y, z):  # pragma: no cover - compiled
    s = z
    for a in range(x.shape[0]):
        s += x[a] * y[a]
    return s


# ------------------------------------------------------------------------------------ scan

@_jit
def _scan_step(S, St, a, beta, k, v, r, u, p, mode, z):  # pragma: no cover - compiled
    """One step from S = S_{t-1}: St = S~_t = A_t S_{t-1}, p = S~_t^T k_t, r = v_t - p,
    u = beta_t r, and S <- S~_t + k_t u^T (S ends as S_t)."""
    dk, dv = S.shape
    g = a.shape[0]
    for i in range(dk):
        ai = a[i] if g > 1 else a[0]
        for j in range(dv):
            St[i, j] = ai * S[i, j]
    kr = _op(k, mode)
    _vT_M(kr, _op(St, mode), p, z)
    for j in range(dv):
        r[j] = v[j] - p[j]
        u[j] = beta * r[j]
    ur = _op(u, mode)
    for i in range(dk):
        ki = kr[i]
        for j in range(dv):
            S[i, j] = St[i, j] + ki * ur[j]


@_jit
def _scan_fwd_rows(w, nw, qh, kh, v, beta, alpha, h0, scale, z, mode, o,
                   hT):  # pragma: no cover - compiled
    """Worker w of nw: the (batch, head) pairs w, w + nw, ... of ``scan_forward``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    S = np.empty((dk, dv), qh.dtype)
    St = np.empty((dk, dv), qh.dtype)
    r = np.empty(dv, qh.dtype)
    u = np.empty(dv, qh.dtype)
    p = np.empty(dv, qh.dtype)
    for bh in range(w, B * H, nw):
        b, h = bh // H, bh % H
        S[:, :] = h0[b, h]
        for t in range(T):
            _scan_step(S, St, alpha[b, h, t], beta[b, h, t], kh[b, h, t], v[b, h, t], r, u, p,
                       mode, z)
            _vT_M(_op(qh[b, h, t], mode), _op(S, mode), p, z)
            for j in range(dv):
                o[b, h, t, j] = scale * p[j]
        hT[b, h] = S


def scan_forward(qh, kh, v, beta, alpha, h0, scale, mode):
    """(o, h_T) of the step-by-step scan; qh, kh per head (B, H, T, dk), alpha = exp(log_alpha)
    (B, H, T, 1) for a scalar gate, (B, H, T, dk) for a vector gate, all in the working dtype."""
    B, H, T, dk = qh.shape
    dt = qh.dtype
    o = np.empty(v.shape, dt)
    hT = np.empty(h0.shape, dt)
    run_workers(_scan_fwd_rows, n_workers(B * H), qh, kh, v, beta, alpha, h0, dt.type(scale),
                dt.type(0), mode, o, hT)
    return o, hT


@_jit
def _scan_vjp_rows(w, nw, qh, kh, v, beta, alpha, h0, do, dh_T, scale, z, mode, dq, dk_, dvv,
                   dbeta, dla, dh0):  # pragma: no cover - compiled
    """Worker w of nw: the (batch, head) pairs w, w + nw, ... of ``scan_vjp``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    dt = qh.dtype
    g = alpha.shape[3]
    C = max(1, int(math.sqrt(max(T, 1))))
    nck = (T + C - 1) // C
    ck = np.empty((max(nck, 1), dk, dv), dt)       # the state before steps 0, C, 2C, ...
    blk = np.empty((C + 1, dk, dv), dt)            # one block's states, recomputed
    S = np.empty((dk, dv), dt)
    St = np.empty((dk, dv), dt)
    Gt = np.empty((dk, dv), dt)
    D = np.empty((dk, dv), dt)
    Cc = np.empty((dk, dv), dt)
    r = np.empty(dv, dt)
    u = np.empty(dv, dt)
    p = np.empty(dv, dt)
    sdo = np.empty(dv, dt)
    du = np.empty(dv, dt)
    wv = np.empty(dv, dt)
    xk = np.empty(dk, dt)
    yk = np.empty(dk, dt)
    for bh in range(w, B * H, nw):
        b, h = bh // H, bh % H
        S[:, :] = h0[b, h]
        for t in range(T):
            if t % C == 0:
                ck[t // C] = S
            _scan_step(S, St, alpha[b, h, t], beta[b, h, t], kh[b, h, t], v[b, h, t], r, u, p,
                       mode, z)
        Cc[:, :] = dh_T[b, h]
        for c in range(nck - 1, -1, -1):
            t0 = c * C
            t1 = min(T, t0 + C)
            blk[0] = ck[c]
            for t in range(t0, t1):
                blk[t - t0 + 1] = blk[t - t0]
                _scan_step(blk[t - t0 + 1], St, alpha[b, h, t], beta[b, h, t], kh[b, h, t],
                           v[b, h, t], r, u, p, mode, z)
            for t in range(t1 - 1, t0 - 1, -1):
                # S~_t, r_t, u_t again from S_{t-1} (the same operations: the same bits)
                S[:, :] = blk[t - t0]
                _scan_step(S, St, alpha[b, h, t], beta[b, h, t], kh[b, h, t], v[b, h, t], r, u,
                           p, mode, z)
                a = alpha[b, h, t]
                bt = beta[b, h, t]
                k = kh[b, h, t]
                for j in range(dv):
                    sdo[j] = scale * do[b, h, t, j]
                # G_t = C_t + scale q_t do_t^T;  dq_t = S_t (scale do_t)
                qr = _op(qh[b, h, t], mode)
                dr = _op(sdo, mode)
                for i in range(dk):
                    qi = qr[i]
                    for j in range(dv):
                        Gt[i, j] = Cc[i, j] + qi * dr[j]
                _M_v(_op(blk[t - t0 + 1], mode), dr, xk, z)
                for i in range(dk):
                    dq[b, h, t, i] = xk[i]
                # du = G_t^T k_t;  dv = beta du;  dbeta = r . du
                kr = _op(k, mode)
                Gr = _op(Gt, mode)
                _vT_M(kr, Gr, du, z)
                for j in range(dv):
                    dvv[b, h, t, j] = bt * du[j]
                    wv[j] = bt * du[j]
                dbeta[b, h, t] = _dot(r, du, z)
                # dk = G_t u - S~_t (beta du);  dS~ = G_t - k (beta du)^T
                wr = _op(wv, mode)
                _M_v(Gr, _op(u, mode), xk, z)
                Str = _op(St, mode)
                _M_v(Str, wr, yk, z)
                for i in range(dk):
                    dk_[b, h, t, i] = xk[i] - yk[i]
                for i in range(dk):
                    ki = kr[i]
                    for j in range(dv):
                        D[i, j] = Gt[i, j] - ki * wr[j]
                # dlog_alpha = <S~_t, dS~_t> (per row for a vector gate);  C_{t-1} = A_t dS~_t
                Dr = _op(D, mode)
                if g == 1:
                    s = z
                    for i in range(dk):
                        s += _dot(Str[i], Dr[i], z)
                    dla[b, h, t, 0] = s
                else:
                    for i in range(dk):
                        dla[b, h, t, i] = _dot(Str[i], Dr[i], z)
                for i in range(dk):
                    ai = a[i] if g > 1 else a[0]
                    for j in range(dv):
                        Cc[i, j] = ai * D[i, j]
        dh0[b, h] = Cc


def scan_vjp(qh, kh, v, beta, alpha, h0, do, dh_T, scale, mode):
    """(dq, dk per head, dv, dbeta, dlog_alpha (B, H, T, g), dh0) of the scan's reverse sweep
    (docs/math_delta.md, section 2), the states recomputed from checkpoints every ~sqrt(T)
    steps by the forward's own operations."""
    B, H, T, dk = qh.shape
    dt = qh.dtype
    dq = np.empty(qh.shape, dt)
    dk_ = np.empty(kh.shape, dt)
    dvv = np.empty(v.shape, dt)
    dbeta = np.empty(beta.shape, dt)
    dla = np.empty(alpha.shape, dt)
    dh0 = np.empty(h0.shape, dt)
    run_workers(_scan_vjp_rows, n_workers(B * H), qh, kh, v, beta, alpha, h0, do, dh_T,
                dt.type(scale), dt.type(0), mode, dq, dk_, dvv, dbeta, dla, dh0)
    return dq, dk_, dvv, dbeta, dla, dh0


def _what(kernel, part):
    def what(args):
        return f"the gated delta rule's {args[2].dtype} reference kernels ({kernel}, {part})"
    return what


note_compile(_scan_fwd_rows, _what("scan", "forward"), 4)
note_compile(_scan_vjp_rows, _what("scan", "gradients"), 6)
