"""The gated delta rule's same-precision reference kernels, compiled by Numba (see
``glaref.delta._baseline`` for what they compute and why).

Every function is generic over the working dtype (float32 or float64): the arrays come in that
dtype, ``z`` is a zero of it (every accumulator starts from it, so that no sum is promoted to
float64), and every assignment into an array of it rounds. Every sum runs in one fixed order,
each product rounded before it is added: fastmath off lets LLVM neither contract a multiply-add
nor reassociate, so that the bytes, and so the reference errors, are the same on every machine,
whatever BLAS it has (none is called) and whatever number of threads. The scan's dot products
(over dk, over dv, dbeta's over dv and dlog_alpha's over the dk dv terms of <S~_t, dS~_t>) sum in
``order``, the orders of ``glaref.gla._baseline_scan.dot`` (0: eight interleaved partial sums
combined in a fixed tree, 1: one term after another); the chunked form's sum one term after
another (a matrix product ``C = A B`` as rows of axpys ``C[i, :] += A[i, p] B[p, :]`` for p
ascending, a dot product from its first term to its last). ``mode`` rounds every matrix-product
operand first (``glaref.gla._baseline_scan.rnd``: 0 none, 1 tf32, 2 bfloat16, 3 float16; float32
arrays only).

Determinism: workers (``glaref._numba_cache.run_workers``) take independent (batch, head) pairs,
each with the same code whatever the number of threads; dq and dk come back per head, and the
caller sums each group's heads in head order.
"""

from __future__ import annotations

import math

import numpy as np
from numba import get_num_threads

from .._numba_cache import jit, note_compile, run_workers
from ..gla._baseline_scan import checkpoints, dot, frob, rnd

_jit = jit(fastmath=False, nogil=True)
# ``dot``'s order number for one term after another: the chunked kernels' every dot product
SEQUENTIAL = 1


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
def _vT_M(x, M, out, P, order):  # pragma: no cover - compiled
    """out[j] = x . M[:, j] (x (m,), M (m, n)), each column summed as
    ``dot(x, M[:, j], acc, order)`` sums it, to the bit: ``order`` 1 one term after another, 0
    in eight interleaved partial sums over i combined in ``dot``'s fixed tree. Formed for every
    j at once along M's rows (no transposed copy, vector loops); P: (9, n) scratch, the partial
    sums."""
    m, n = M.shape
    if order == 1:
        for j in range(n):
            out[j] = 0
        for i in range(m):
            xi = x[i]
            for j in range(n):
                out[j] += xi * M[i, j]
        return
    P[:, :] = 0
    mm = m - m % 8
    for a in range(0, mm, 8):
        for lane in range(8):
            xi = x[a + lane]
            for j in range(n):
                P[lane, j] += xi * M[a + lane, j]
    for a in range(mm, m):
        xi = x[a]
        for j in range(n):
            P[8, j] += xi * M[a, j]
    for j in range(n):
        out[j] = ((((P[0, j] + P[1, j]) + (P[2, j] + P[3, j]))
                   + ((P[4, j] + P[5, j]) + (P[6, j] + P[7, j]))) + P[8, j])


@_jit
def _M_v(M, y, out, acc, order):  # pragma: no cover - compiled
    """out[i] = M[i, :] . y (M (m, n), y (n,)), each a ``dot`` in ``order``."""
    for i in range(M.shape[0]):
        out[i] = dot(M[i], y, acc, order)


# ------------------------------------------------------------------------------------ scan

@_jit
def _scan_step(S, St, a, beta, k, v, r, u, p, mode, P, order):  # pragma: no cover - compiled
    """One step from S = S_{t-1}: St = S~_t = A_t S_{t-1}, p = S~_t^T k_t, r = v_t - p,
    u = beta_t r, and S <- S~_t + k_t u^T (S ends as S_t)."""
    dk, dv = S.shape
    g = a.shape[0]
    for i in range(dk):
        ai = a[i] if g > 1 else a[0]
        for j in range(dv):
            St[i, j] = ai * S[i, j]
    kr = _op(k, mode)
    _vT_M(kr, _op(St, mode), p, P, order)
    for j in range(dv):
        r[j] = v[j] - p[j]
        u[j] = beta * r[j]
    ur = _op(u, mode)
    for i in range(dk):
        ki = kr[i]
        for j in range(dv):
            S[i, j] = St[i, j] + ki * ur[j]


@_jit
def _step_buffers(dk, dv, dt):  # pragma: no cover - compiled
    """The buffers of ``_scan_step`` in dtype dt: S, St (dk, dv), P (9, dv), r, u, p (dv,)."""
    return (np.empty((dk, dv), dt), np.empty((dk, dv), dt), np.empty((9, dv), dt),
            np.empty(dv, dt), np.empty(dv, dt), np.empty(dv, dt))


@_jit
def _scan_fwd_rows(w, nw, qh, kh, v, beta, alpha, h0, scale, mode, order, o,
                   hT):  # pragma: no cover - compiled
    """Worker w of nw: the (batch, head) pairs w, w + nw, ... of ``scan_forward``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    S, St, P, r, u, p = _step_buffers(dk, dv, qh.dtype)
    for bh in range(w, B * H, nw):
        b, h = bh // H, bh % H
        S[:, :] = h0[b, h]
        for t in range(T):
            _scan_step(S, St, alpha[b, h, t], beta[b, h, t], kh[b, h, t], v[b, h, t], r, u, p,
                       mode, P, order)
            _vT_M(_op(qh[b, h, t], mode), _op(S, mode), p, P, order)
            for j in range(dv):
                o[b, h, t, j] = scale * p[j]
        hT[b, h] = S


def scan_forward(qh, kh, v, beta, alpha, h0, scale, mode, order):
    """(o, h_T) of the step-by-step scan; qh, kh per head (B, H, T, dk), alpha = exp(log_alpha)
    (B, H, T, 1) for a scalar gate, (B, H, T, dk) for a vector gate, all in the working dtype;
    every dot product in ``order`` (``glaref.gla._baseline_scan.dot``: 0 lanes, 1 sequential)."""
    B, H, T, dk = qh.shape
    dt = qh.dtype
    o = np.empty(v.shape, dt)
    hT = np.empty(h0.shape, dt)
    run_workers(_scan_fwd_rows, n_workers(B * H), qh, kh, v, beta, alpha, h0, dt.type(scale),
                mode, order, o, hT)
    return o, hT


@_jit
def _scan_vjp_rows(w, nw, qh, kh, v, beta, alpha, h0, do, dh_T, scale, mode, order, dq, dk_,
                   dvv, dbeta, dla, dh0):  # pragma: no cover - compiled
    """Worker w of nw: the (batch, head) pairs w, w + nw, ... of ``scan_vjp``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    dt = qh.dtype
    g = alpha.shape[3]
    C, nck, ck, blk = checkpoints(T, dk, dv, dt)   # blocks of ~sqrt(T) steps
    S, St, P, r, u, p = _step_buffers(dk, dv, dt)
    Gt = np.empty((dk, dv), dt)
    D = np.empty((dk, dv), dt)
    Cc = np.empty((dk, dv), dt)
    acc = np.empty(9, dt)
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
                       mode, P, order)
        Cc[:, :] = dh_T[b, h]
        for c in range(nck - 1, -1, -1):
            t0 = c * C
            t1 = min(T, t0 + C)
            blk[0] = ck[c]
            for t in range(t0, t1):
                blk[t - t0 + 1] = blk[t - t0]
                _scan_step(blk[t - t0 + 1], St, alpha[b, h, t], beta[b, h, t], kh[b, h, t],
                           v[b, h, t], r, u, p, mode, P, order)
            for t in range(t1 - 1, t0 - 1, -1):
                # S~_t, r_t, u_t again from S_{t-1} (the same operations: the same bits)
                S[:, :] = blk[t - t0]
                _scan_step(S, St, alpha[b, h, t], beta[b, h, t], kh[b, h, t], v[b, h, t], r, u,
                           p, mode, P, order)
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
                _M_v(_op(blk[t - t0 + 1], mode), dr, xk, acc, order)
                for i in range(dk):
                    dq[b, h, t, i] = xk[i]
                # du = G_t^T k_t;  dv = beta du;  dbeta = r . du
                kr = _op(k, mode)
                Gr = _op(Gt, mode)
                _vT_M(kr, Gr, du, P, order)
                for j in range(dv):
                    dvv[b, h, t, j] = bt * du[j]
                    wv[j] = bt * du[j]
                dbeta[b, h, t] = dot(r, du, acc, order)
                # dk = G_t u - S~_t (beta du);  dS~ = G_t - k (beta du)^T
                wr = _op(wv, mode)
                _M_v(Gr, _op(u, mode), xk, acc, order)
                Str = _op(St, mode)
                _M_v(Str, wr, yk, acc, order)
                for i in range(dk):
                    dk_[b, h, t, i] = xk[i] - yk[i]
                for i in range(dk):
                    ki = kr[i]
                    for j in range(dv):
                        D[i, j] = Gt[i, j] - ki * wr[j]
                # dlog_alpha = <S~_t, dS~_t> (per row for a vector gate);  C_{t-1} = A_t dS~_t
                Dr = _op(D, mode)
                if g == 1:
                    dla[b, h, t, 0] = frob(Str, Dr, order)
                else:
                    for i in range(dk):
                        dla[b, h, t, i] = dot(Str[i], Dr[i], acc, order)
                for i in range(dk):
                    ai = a[i] if g > 1 else a[0]
                    for j in range(dv):
                        Cc[i, j] = ai * D[i, j]
        dh0[b, h] = Cc


def _grad_buffers(*inputs):
    """One uninitialised buffer per input (qh, kh, v, beta, log_alpha, h0), in the dtype of qh,
    for a reverse sweep to fill: (dq, dk per head, dv, dbeta, dlog_alpha, dh0)."""
    return tuple(np.empty(x.shape, inputs[0].dtype) for x in inputs)


def scan_vjp(qh, kh, v, beta, alpha, h0, do, dh_T, scale, mode, order):
    """(dq, dk per head, dv, dbeta, dlog_alpha (B, H, T, g), dh0) of the scan's reverse sweep
    (docs/math_delta.md, section 2), the states recomputed from checkpoints every ~sqrt(T)
    steps by the forward's own operations; every dot product, dbeta's over dv and dlog_alpha's
    over the dk dv terms of <S~_t, dS~_t> (``glaref.gla._baseline_scan.frob``; per row for a vector
    gate) included, in ``order``."""
    grads = _grad_buffers(qh, kh, v, beta, alpha, h0)
    run_workers(_scan_vjp_rows, n_workers(qh.shape[0] * qh.shape[1]), qh, kh, v, beta, alpha,
                h0, do, dh_T, qh.dtype.type(scale), mode, order, *grads)
    return grads


# ------------------------------------------------------------------------------------ chunked

@_jit
def _prep(q, k, v, be, la, L, form, mode, z, E, eb, er, Ke, Qd, Kr, KK, A, Tm, KB, VB, W,
          Ut):  # pragma: no cover - compiled
    """Everything of one chunk of L steps that does not depend on the state entering it
    (docs/math_delta.md, section 8), into the buffers' first L rows (g = 1: a scalar gate):

        E[i, j]  = exp(b_i - b_j) (j <= i)    eb[i] = exp(b_i)    er[j] = exp(b_last - b_j)
        Ke = K o exp(b)    Qd = Q o exp(b)    Kr = K o exp(b_last - b)
        KK[i, j] = sum_d k_i[d] k_j[d] E[i, j, d] (j < i)    A[i, j] = sum_d q_i[d] k_j[d] E[i, j, d]
        Tm = (I + diag(beta) KK)^-1 by forward substitution, row by row
        KB = diag(beta) Ke    VB = diag(beta) V    W = Tm KB    Ut = Tm VB

    Exponents (``form`` 0, segment sums): b_i - b_j = sum_{j < s <= i} log_alpha_s accumulated
    from s = j + 1, b_i from s = 0; (``form`` 1, chunk-local cumsum) the cumulative sum b rounded
    once per step and every exponent the rounded difference of two of its values. A scalar gate's
    scores are E_ij (q_i . k_j); a vector gate's sum q_i[d] (k_j[d] E_ij[d]) over d, the decayed
    key rounded like any operand."""
    dk = q.shape[1]
    dv = v.shape[1]
    g = la.shape[1]
    seg = np.empty(g, E.dtype)
    for j in range(L):
        for d in range(g):
            seg[d] = z
            E[j, j, d] = 1
        if form == 0:
            for i in range(j + 1, L):
                for d in range(g):
                    seg[d] += la[i, d]
                    E[i, j, d] = math.exp(np.float64(seg[d]))
    # b_i (a segment sum from the chunk's start, and the cumulative sum: the same sequential
    # sum), held in eb until its exp below
    for d in range(g):
        s = z
        for i in range(L):
            s += la[i, d]
            eb[i, d] = s
    if form == 1:
        for j in range(L):
            for i in range(j + 1, L):
                for d in range(g):
                    x = eb[i, d] - eb[j, d]
                    E[i, j, d] = math.exp(np.float64(x))
        for j in range(L):
            for d in range(g):
                er[j, d] = eb[L - 1, d] - eb[j, d]
    else:
        for j in range(L):
            for d in range(g):
                er[j, d] = z
            for i in range(j + 1, L):
                for d in range(g):
                    er[j, d] += la[i, d]
    for i in range(L):
        for d in range(g):
            eb[i, d] = math.exp(np.float64(eb[i, d]))
            er[i, d] = math.exp(np.float64(er[i, d]))
    for i in range(L):
        for d in range(dk):
            e1 = eb[i, d] if g > 1 else eb[i, 0]
            e2 = er[i, d] if g > 1 else er[i, 0]
            Ke[i, d] = k[i, d] * e1
            Qd[i, d] = q[i, d] * e1
            Kr[i, d] = k[i, d] * e2
            KB[i, d] = be[i] * Ke[i, d]
        for c in range(dv):
            VB[i, c] = be[i] * v[i, c]
    qr = _op(q, mode)
    kr = _op(k, mode)
    KD = np.empty((L, dk), q.dtype)
    dacc = np.empty(9, q.dtype)
    for i in range(L):
        if g == 1:
            for j in range(i + 1):
                A[i, j] = E[i, j, 0] * dot(qr[i], kr[j], dacc, SEQUENTIAL)
                if j < i:
                    KK[i, j] = E[i, j, 0] * dot(kr[i], kr[j], dacc, SEQUENTIAL)
        else:
            for j in range(i + 1):
                for d in range(dk):
                    KD[j, d] = k[j, d] * E[i, j, d]
            KDr = _op(KD, mode)
            for j in range(i + 1):
                A[i, j] = dot(qr[i], KDr[j], dacc, SEQUENTIAL)
                if j < i:
                    KK[i, j] = dot(kr[i], KDr[j], dacc, SEQUENTIAL)
    # Tm = (I + L)^-1, L = diag(beta) KK: row i of Tm is e_i - sum_{m < i} L[i, m] Tm[m]
    for i in range(L):
        for j in range(L):
            Tm[i, j] = z
        for m in range(i):
            lim = be[i] * KK[i, m]
            for j in range(m + 1):
                Tm[i, j] -= lim * Tm[m, j]
        Tm[i, i] = 1
    _lower_mm(_op(Tm, mode), _op(KB, mode), W, L, z)
    _lower_mm(_op(Tm, mode), _op(VB, mode), Ut, L, z)


@_jit
def _lower_mm(Tm, X, out, L, z):  # pragma: no cover - compiled
    """out[i] = sum_{j <= i} Tm[i, j] X[j], j ascending (Tm lower triangular), rows < L."""
    for i in range(L):
        for c in range(X.shape[1]):
            out[i, c] = z
        for j in range(i + 1):
            t = Tm[i, j]
            for c in range(X.shape[1]):
                out[i, c] += t * X[j, c]


@_jit
def _row_times(acc, X, i, Y, n, z):  # pragma: no cover - compiled
    """acc = X[i, :n] Y[:n, :], summed one term after another from zero ``z``."""
    for c in range(acc.shape[0]):
        acc[c] = z
    for d in range(n):
        w = X[i, d]
        for c in range(acc.shape[0]):
            acc[c] += w * Y[d, c]


@_jit
def _col_times(acc, X, j, Y, L, z):  # pragma: no cover - compiled
    """acc = X[j:L, j]^T Y[j:L, :] (column j of a lower triangular X^T Y), i from j to L - 1 one
    term after another from zero ``z``."""
    for c in range(acc.shape[0]):
        acc[c] = z
    for i in range(j, L):
        w = X[i, j]
        for c in range(acc.shape[0]):
            acc[c] += w * Y[i, c]


@_jit
def _chunk_forward(S, L, E, eb, Qd, Kr, A, W, Ut, U, o_c, S_next, scale, mode,
                   z):  # pragma: no cover - compiled
    """U = Ut - W S;  o = scale ((Q o exp(b)) S + A U);  S_next = diag(exp(b_last)) S + Kr^T U
    (rows < L), every product one term after another."""
    dk, dv = S.shape
    g = eb.shape[1]
    Sr = _op(S, mode)
    Wr = _op(W, mode)
    acc = np.empty(dv, S.dtype)
    for i in range(L):
        _row_times(acc, Wr, i, Sr, dk, z)
        for c in range(dv):
            U[i, c] = Ut[i, c] - acc[c]
    Ur = _op(U, mode)
    Qr = _op(Qd, mode)
    Ar = _op(A, mode)
    acc2 = np.empty(dv, S.dtype)
    for i in range(L):
        _row_times(acc, Qr, i, Sr, dk, z)
        _row_times(acc2, Ar, i, Ur, i + 1, z)
        for c in range(dv):
            o_c[i, c] = scale * (acc[c] + acc2[c])
    Krr = _op(Kr, mode)
    for d in range(dk):
        el = eb[L - 1, d] if g > 1 else eb[L - 1, 0]
        for c in range(dv):
            acc[c] = z
        for j in range(L):
            x = Krr[j, d]
            for c in range(dv):
                acc[c] += x * Ur[j, c]
        for c in range(dv):
            S_next[d, c] = el * S[d, c] + acc[c]


@_jit
def _chunk_buffers(C, dk, dv, g, dt):  # pragma: no cover - compiled
    return (np.empty((C, C, g), dt), np.empty((C, g), dt), np.empty((C, g), dt),
            np.empty((C, dk), dt), np.empty((C, dk), dt), np.empty((C, dk), dt),
            np.zeros((C, C), dt), np.zeros((C, C), dt), np.empty((C, C), dt),
            np.empty((C, dk), dt), np.empty((C, dv), dt), np.empty((C, dk), dt),
            np.empty((C, dv), dt), np.empty((C, dv), dt))


@_jit
def _chunked_fwd_rows(w, nw, qh, kh, v, beta, la, h0, scale, z, mode, C, form, o,
                      hT):  # pragma: no cover - compiled
    """Worker w of nw: the (batch, head) pairs w, w + nw, ... of ``chunked_forward``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    g = la.shape[3]
    dt = qh.dtype
    E, eb, er, Ke, Qd, Kr, KK, A, Tm, KB, VB, W, Ut, U = _chunk_buffers(C, dk, dv, g, dt)
    S = np.empty((dk, dv), dt)
    Sn = np.empty((dk, dv), dt)
    o_c = np.empty((C, dv), dt)
    for bh in range(w, B * H, nw):
        b, h = bh // H, bh % H
        S[:, :] = h0[b, h]
        for t0 in range(0, T, C):
            L = min(C, T - t0)
            _prep(qh[b, h, t0:t0 + L], kh[b, h, t0:t0 + L], v[b, h, t0:t0 + L],
                  beta[b, h, t0:t0 + L], la[b, h, t0:t0 + L], L, form, mode, z, E, eb, er, Ke,
                  Qd, Kr, KK, A, Tm, KB, VB, W, Ut)
            _chunk_forward(S, L, E, eb, Qd, Kr, A, W, Ut, U, o_c, Sn, scale, mode, z)
            o[b, h, t0:t0 + L] = o_c[:L]
            S[:, :] = Sn
        hT[b, h] = S


def chunked_forward(qh, kh, v, beta, la, h0, scale, mode, C, form):
    """(o, h_T) of the chunked WY / UT form with chunks of C steps; la (B, H, T, 1) for a scalar
    gate, (B, H, T, dk) for a vector gate; ``form`` 0 segment sums, 1 chunk-local cumsum."""
    B, H, T, dk = qh.shape
    dt = qh.dtype
    o = np.empty(v.shape, dt)
    hT = np.empty(h0.shape, dt)
    run_workers(_chunked_fwd_rows, n_workers(B * H), qh, kh, v, beta, la, h0, dt.type(scale),
                dt.type(0), mode, C, form, o, hT)
    return o, hT


@_jit
def _chunk_backward(S, dSn, sdo, L, q, k, v, be, E, eb, er, Ke, Qd, Kr, KK, A, Tm, KB, VB, W, U,
                    form, mode, z, dq, dk_, dv_, dbeta, dla, dS):  # pragma: no cover - compiled
    """The backward of one chunk's formulas (``_prep``, ``_chunk_forward``), written by hand:
    given the state S entering it, the cotangent dSn of the state leaving it and sdo = scale do
    (rows < L), the chunk's dq, dk (per head), dv, dbeta, dlog_alpha and the cotangent dS of S.

        dU  = A^T sdo + Kr dSn       dA[i, j] = sdo_i . U_j (j <= i)    dQd = sdo S^T
        dKr = U dSn^T                dW = -dU S^T
        dS  = diag(exp(b_last)) dSn + Qd^T sdo - W^T dU
        dTm = dU VB^T + dW KB^T (lower)    dM = -Tm^T dTm Tm^T,  dL = its strictly lower part
        dKK = diag(beta) dL          dKB = Tm^T dW                dVB = Tm^T dU
        dv  = diag(beta) dVB         dbeta_i = sum_j dL[i, j] KK[i, j] + dVB_i . v_i + dKB_i . Ke_i
        dq_i = dQd_i o exp(b_i) + sum_{j <= i} dA[i, j] k_j o E_ij
        dk_j = sum_{i >= j} dA[i, j] q_i o E_ij + sum_{i != j} dKK[max, min] k_i o E_{max, min}
               + beta_j dKB_j o exp(b_j) + dKr_j o exp(b_last - b_j)

    and dlog_alpha from X = (cotangent of each decay factor exp(x)) exp(x): for ``form`` 0
    (segment sums) in the direct form, each X added to every gate of its segment,

        dlog_alpha_s = sum_{j < s <= i} X^E_ij + sum_{i >= s} X^b_i + sum_{j < s} X^r_j + X^last;

    for ``form`` 1 (chunk-local cumsum decays) through the cumulative sum b, as autodiff of the
    field's chunked forward and flash-linear-attention's backward (a reverse chunk-local cumsum
    of dg) form it: db_i = sum_j X^E_ij - sum_j X^E_ji + X^b_i - X^r_i (b_last also gains
    sum_j X^r_j + X^last), dlog_alpha_s = sum_{i >= s} db_i, in which the pairs inside [s, L)
    cancel instead of never being added (the identity form, docs/math.md section 4). Here
    X^E_ij = dA[i, j] q_i o k_j o E_ij + dKK[i, j] k_i o k_j o E_ij (a scalar gate:
    dA[i, j] A[i, j] + dKK[i, j] KK[i, j]), X^b_i = dQd_i o Qd_i + dKB_i o KB_i,
    X^r_j = dKr_j o Kr_j, X^last = exp(b_last) o rowsum(S o dSn) (a scalar gate: summed over d).
    """
    dkk, dv = S.shape
    g = eb.shape[1]
    dt = S.dtype
    Sr = _op(S, mode)
    dSnr = _op(dSn, mode)
    sdor = _op(sdo, mode)
    Ur = _op(U, mode)
    Ar = _op(A, mode)
    Krr = _op(Kr, mode)
    Wr = _op(W, mode)
    Qr = _op(Qd, mode)
    dU = np.empty((L, dv), dt)
    dacc = np.empty(9, dt)
    acc = np.empty(dv, dt)
    acc2 = np.empty(dv, dt)
    for j in range(L):
        _col_times(acc, Ar, j, sdor, L, z)
        _row_times(acc2, Krr, j, dSnr, dkk, z)
        for c in range(dv):
            dU[j, c] = acc[c] + acc2[c]
    dUr = _op(dU, mode)
    dA = np.zeros((L, L), dt)
    for i in range(L):
        for j in range(i + 1):
            dA[i, j] = dot(sdor[i], Ur[j], dacc, SEQUENTIAL)
    dQd = np.empty((L, dkk), dt)
    dKr = np.empty((L, dkk), dt)
    dW = np.empty((L, dkk), dt)
    tmp = np.empty(dkk, dt)
    for i in range(L):
        _M_v(Sr, sdor[i], dQd[i], dacc, SEQUENTIAL)
        _M_v(dSnr, Ur[i], dKr[i], dacc, SEQUENTIAL)
        _M_v(Sr, dUr[i], tmp, dacc, SEQUENTIAL)
        for d in range(dkk):
            dW[i, d] = -tmp[d]
    for d in range(dkk):
        el = eb[L - 1, d] if g > 1 else eb[L - 1, 0]
        for c in range(dv):
            acc[c] = z
            acc2[c] = z
        for i in range(L):
            x = Qr[i, d]
            y = Wr[i, d]
            for c in range(dv):
                acc[c] += x * sdor[i, c]
                acc2[c] += y * dUr[i, c]
        for c in range(dv):
            dS[d, c] = el * dSn[d, c] + acc[c] - acc2[c]
    # the triangular system: dTm (lower), then dL = strictly-lower(-Tm^T dTm Tm^T)
    VBr = _op(VB, mode)
    KBr = _op(KB, mode)
    dWr = _op(dW, mode)
    dT = np.zeros((L, L), dt)
    for i in range(L):
        for j in range(i + 1):
            dT[i, j] = (dot(dUr[i], VBr[j], dacc, SEQUENTIAL)
                        + dot(dWr[i], KBr[j], dacc, SEQUENTIAL))
    Tmr = _op(Tm[:L, :L].copy(), mode)
    dTr = _op(dT, mode)
    Y = np.empty((L, L), dt)
    for i in range(L):
        for j in range(L):
            s = z
            for m in range(max(i, j), L):
                s += Tmr[m, i] * dTr[m, j]
            Y[i, j] = s
    Yr = _op(Y, mode)
    dKK = np.zeros((L, L), dt)
    for i in range(L):
        sb = z
        for j in range(i):
            s = z
            for n in range(j + 1):
                s += Yr[i, n] * Tmr[j, n]
            dKK[i, j] = be[i] * (-s)
            sb += (-s) * KK[i, j]
        dbeta[i] = sb
    # dKB = Tm^T dW, dVB = Tm^T dU; dv, dbeta
    dKB = np.empty((L, dkk), dt)
    dVB = np.empty((L, dv), dt)
    tk = np.empty(dkk, dt)
    for j in range(L):
        _col_times(tk, Tmr, j, dWr, L, z)
        _col_times(acc, Tmr, j, dUr, L, z)
        for d in range(dkk):
            dKB[j, d] = tk[d]
        for c in range(dv):
            dVB[j, c] = acc[c]
            dv_[j, c] = be[j] * acc[c]
        dbeta[j] = (dbeta[j] + dot(dVB[j], v[j], dacc, SEQUENTIAL)
                    + dot(dKB[j], Ke[j], dacc, SEQUENTIAL))
    # dq, dk
    for i in range(L):
        for d in range(dkk):
            e1 = eb[i, d] if g > 1 else eb[i, 0]
            e2 = er[i, d] if g > 1 else er[i, 0]
            dq[i, d] = dQd[i, d] * e1
            dk_[i, d] = be[i] * dKB[i, d] * e1 + dKr[i, d] * e2
    qr = _op(q, mode)
    kr = _op(k, mode)
    dAr = _op(dA, mode)
    dKKr = _op(dKK, mode)
    for i in range(L):
        for j in range(i + 1):
            a = dAr[i, j]
            b2 = dKKr[i, j]
            for d in range(dkk):
                e = E[i, j, d] if g > 1 else E[i, j, 0]
                dq[i, d] += a * (kr[j, d] * e)
                dk_[j, d] += a * (qr[i, d] * e)
                if j < i:
                    dk_[j, d] += b2 * (kr[i, d] * e)
                    dk_[i, d] += b2 * (kr[j, d] * e)
    # dlog_alpha: the decay factors' own cotangents times the factors (X below), then summed
    # over the gates of each factor's segment (form 0, direct) or through the cumulative sum
    # (form 1, identity)
    Xb = np.zeros((L, g), dt)
    Xr = np.zeros((L, g), dt)
    for i in range(L):
        for d in range(dkk):
            gi = d if g > 1 else 0
            Xb[i, gi] += dQd[i, d] * Qd[i, d] + dKB[i, d] * KB[i, d]
            Xr[i, gi] += dKr[i, d] * Kr[i, d]
    Xl = np.zeros(g, dt)
    for d in range(dkk):
        gi = d if g > 1 else 0
        el = eb[L - 1, d] if g > 1 else eb[L - 1, 0]
        Xl[gi] += el * dot(S[d], dSn[d], dacc, SEQUENTIAL)
    st = np.zeros((L, g), dt)
    run = np.empty(g, dt)
    x = np.empty(g, dt)
    for j in range(L):
        for d in range(g):
            run[d] = z
        for i in range(L - 1, j, -1):
            if g == 1:
                x[0] = dA[i, j] * A[i, j] + dKK[i, j] * KK[i, j]
            else:
                for d in range(g):
                    e = E[i, j, d]
                    x[d] = (dA[i, j] * (q[i, d] * k[j, d] * e)
                            + dKK[i, j] * (k[i, d] * k[j, d] * e))
            for d in range(g):
                if form == 0:
                    # st[i] += sum_{i' >= i} X[i', j]: the pairs straddling s = i
                    run[d] += x[d]
                    st[i, d] += run[d]
                else:
                    # db_i += X[i, j], db_j -= X[i, j] (the exponent b_i - b_j)
                    st[i, d] += x[d]
                    st[j, d] -= x[d]
    if form == 0:
        for d in range(g):
            suf = z
            for s in range(L - 1, -1, -1):
                suf += Xb[s, d]
                st[s, d] += suf
            pre = z
            for s in range(L):
                dla[s, d] = st[s, d] + pre + Xl[d]
                pre += Xr[s, d]
    else:
        # db_i = sum_j X[i, j] - sum_j X[j, i] + X^b_i - X^r_i, and b_last also carries
        # sum_j X^r_j + X^last; dlog_alpha_s = sum_{i >= s} db_i (the reverse cumulative sum,
        # in which every pair inside [s, L) cancels)
        for d in range(g):
            tot = z
            for i in range(L):
                st[i, d] = (st[i, d] + Xb[i, d]) - Xr[i, d]
                tot += Xr[i, d]
            st[L - 1, d] += tot + Xl[d]
            suf = z
            for s in range(L - 1, -1, -1):
                suf += st[s, d]
                dla[s, d] = suf


@_jit
def _chunked_vjp_rows(w, nw, qh, kh, v, beta, la, h0, do, dh_T, scale, z, mode, C, form, dq,
                      dk_, dvv, dbeta, dla, dh0):  # pragma: no cover - compiled
    """Worker w of nw: the (batch, head) pairs w, w + nw, ... of ``chunked_vjp``."""
    B, H, T, dk = qh.shape
    dv = v.shape[3]
    g = la.shape[3]
    dt = qh.dtype
    E, eb, er, Ke, Qd, Kr, KK, A, Tm, KB, VB, W, Ut, U = _chunk_buffers(C, dk, dv, g, dt)
    N = (T + C - 1) // C
    states = np.empty((N + 1, dk, dv), dt)
    o_c = np.empty((C, dv), dt)
    sdo = np.empty((C, dv), dt)
    dS = np.empty((dk, dv), dt)
    dSp = np.empty((dk, dv), dt)
    for bh in range(w, B * H, nw):
        b, h = bh // H, bh % H
        states[0] = h0[b, h]
        for n in range(N):
            t0 = n * C
            L = min(C, T - t0)
            _prep(qh[b, h, t0:t0 + L], kh[b, h, t0:t0 + L], v[b, h, t0:t0 + L],
                  beta[b, h, t0:t0 + L], la[b, h, t0:t0 + L], L, form, mode, z, E, eb, er, Ke,
                  Qd, Kr, KK, A, Tm, KB, VB, W, Ut)
            _chunk_forward(states[n], L, E, eb, Qd, Kr, A, W, Ut, U, o_c, states[n + 1], scale,
                           mode, z)
        dS[:, :] = dh_T[b, h]
        for n in range(N - 1, -1, -1):
            t0 = n * C
            L = min(C, T - t0)
            _prep(qh[b, h, t0:t0 + L], kh[b, h, t0:t0 + L], v[b, h, t0:t0 + L],
                  beta[b, h, t0:t0 + L], la[b, h, t0:t0 + L], L, form, mode, z, E, eb, er, Ke,
                  Qd, Kr, KK, A, Tm, KB, VB, W, Ut)
            _chunk_forward(states[n], L, E, eb, Qd, Kr, A, W, Ut, U, o_c, dSp, scale, mode, z)
            for i in range(L):
                for c in range(dv):
                    sdo[i, c] = scale * do[b, h, t0 + i, c]
            _chunk_backward(states[n], dS, sdo[:L], L, qh[b, h, t0:t0 + L], kh[b, h, t0:t0 + L],
                            v[b, h, t0:t0 + L], beta[b, h, t0:t0 + L], E, eb, er, Ke, Qd, Kr,
                            KK, A, Tm, KB, VB, W, U, form, mode, z, dq[b, h, t0:t0 + L], dk_[b, h, t0:t0 + L],
                            dvv[b, h, t0:t0 + L], dbeta[b, h, t0:t0 + L], dla[b, h, t0:t0 + L],
                            dSp)
            dS[:, :] = dSp
        dh0[b, h] = dS


def chunked_vjp(qh, kh, v, beta, la, h0, do, dh_T, scale, mode, C, form):
    """(dq, dk per head, dv, dbeta, dlog_alpha (B, H, T, g), dh0) of the chunked form's
    hand-written backward (``_chunk_backward``), chunk by chunk in reverse, each chunk's
    quantities recomputed from the state entering it (stored by a first forward sweep)."""
    grads = _grad_buffers(qh, kh, v, beta, la, h0)
    run_workers(_chunked_vjp_rows, n_workers(qh.shape[0] * qh.shape[1]), qh, kh, v, beta, la,
                h0, do, dh_T, qh.dtype.type(scale), qh.dtype.type(0), mode, C, form, *grads)
    return grads


def _what(kernel, part):
    def what(args):
        return f"the gated delta rule's {args[2].dtype} reference kernels ({kernel}, {part})"
    return what


# The one line on stderr while a worker compiles (glaref._numba_cache); seconds: the CPU time of
# the float32 compile on the shared 2-core x86-64 machine (measured 2026-12-04: scan forward 6.6
# with Numba's start-up, gradients 3.7; chunked forward 6.0, gradients 9.1).
note_compile(_scan_fwd_rows, _what("scan", "forward"), 5)
note_compile(_scan_vjp_rows, _what("scan", "gradients"), 6)
note_compile(_chunked_fwd_rows, _what("chunked", "forward"), 6)
note_compile(_chunked_vjp_rows, _what("chunked", "gradients"), 10)
