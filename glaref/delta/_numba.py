"""The Numba float64 oracle of the gated delta rule: the functions and signatures of
``glaref.delta._reference``, compiled.

    forward(q, k, v, beta, log_alpha, h0, scale, cu_seqlens=None) -> (o, h_T)
    vjp(q, k, v, beta, log_alpha, h0, do, dh_T, scale, per_head=False, cu_seqlens=None)
        -> (dq, dk, dv, dbeta, dlog_alpha, dh0)

The equations are the reference's (docs/math_delta.md, sections 1 and 2), step by step. The
state S (dk, dv) is kept row-major, so that the inner loops run over dv contiguous numbers.

Forward, one sweep over the rows per step:

    pass 1   S~[i] = a_i S[i];  p += k_i S~[i]           (p = S~^T k)
    then     r = v - p,  u = beta r
    pass 2   S[i] = S~[i] + k_i u;  o_acc += q_i S[i]   (o = scale S^T q)

Each row's part of a pass needs only that row, so pass 2 of step t runs in the same loop as
pass 1 of step t + 1 (the buffer then holds S~_{t+1}). The sums over the rows i (S~^T k, S^T q)
are vectors over j, added row by row in order of i.

Backward (the reverse-time adjoint; G_t = dL/dS_t, w = beta du):

    du = G_t^T k_t,  dv_t = w,  dbeta_t = r . du
    dk_t = G_t u - S~_t w                  dq_t = scale (S~_t do_t + k_t (u . do_t))
    D_t = G_t - k_t w^T                    dlog_alpha_t = <S~_t, D_t> (per row i, or summed)
    G_{t-1} = A_t D_t + scale q_{t-1} do_{t-1}^T        (dh0 = A_0 D_0)

Per step: the three sums over m of a row-major matrix (S~ w, G u, S~ do) are BLAS matrix-vector
products (Numba's binding behind np.dot, held to one thread); then one sweep over the rows
forms D, the carry G_{t-1} in place, du_{t-1} = G_{t-1}^T k_{t-1} (a vector over m, added row
by row in order of i) and <S~, D>: for a scalar gate a vector over m added row by row, then
summed in ``_dot``'s order; for a vector gate the products S~ o D are stored and summed per row
by one more matrix-vector product. A sum over m written as a loop could not use the vector
units (without fastmath, LLVM keeps the order of a reduction, and Numba leaves its SLP
vectorizer off), so BLAS does those; every other loop is elementwise or a sum over rows.

The backward keeps S~ of the first step of every ``block_size(T)`` steps (32 up to T = 8192,
then T / 256) and S~^T k of every step in per-worker buffers, and recomputes the decayed states
S~_t of one block at a time from its checkpoint (never by inverting a step), with S~_t do_t
taken as each state is made: the time stays linear in T. The recomputed states are the products
the equations use (S~_t = A_t S_{t-1}, rounded once, the forward's numbers).

Determinism: kernels are ``@njit(fastmath=False, cache=True)``; ``prange`` runs over workers
that take independent items, (sequence, group) pairs, with the time loop serial inside and a
group's heads in order: head 0 writes dq and dk, the others add, left to right. When there are
fewer (sequence, group) items than threads, the items are (sequence, head) pairs with per-head
dq, dk summed afterwards in the same head order (``glaref.gla._numba._group_sum``): both give
the same bits, for any number of threads. BLAS runs on one thread inside each worker, so a
product is computed the same way whatever the number of workers; as for the scalar-gate
oracle, the last bits of the gradients follow the BLAS kernel the machine loads (the forward
uses no BLAS).
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from ..gla._numba import _dot, _group_sum, _one_blas_thread, _spans

_JIT = dict(fastmath=False, cache=True)
BLOCK = 32            # steps between stored states, at least
MAX_CHECKPOINTS = 256  # states stored per worker, at most (longer sequences get longer blocks)


def block_size(T: int) -> int:
    """Steps between the backward's stored states: 32, or T / 256 (rounded up) for T > 8192, so
    that a worker keeps at most 256 states plus one block of recomputed ones."""
    return max(BLOCK, -(-T // MAX_CHECKPOINTS))


@njit(**_JIT)
def _alphas(la_t, a):  # pragma: no cover - compiled
    """a[i] = exp(log_alpha_t[i]) for a vector gate, or exp(log_alpha_t[0]) for every row."""
    dk = a.shape[0]
    if la_t.shape[0] == 1:
        x = np.exp(la_t[0])
        for i in range(dk):
            a[i] = x
    else:
        for i in range(dk):
            a[i] = np.exp(la_t[i])


@njit(**_JIT)
def _decay_rows(S, a, k_n, p, update, k_t, u):  # pragma: no cover - compiled
    """S <- A (S + k_t u^T) when ``update``, else S <- A S, in place; then p = S^T k_n. One
    pass over the rows."""
    dk, dv = S.shape
    for j in range(dv):
        p[j] = 0.0
    for i in range(dk):
        ai = a[i]
        kn = k_n[i]
        if update:
            ki = k_t[i]
            for j in range(dv):
                s = ai * (S[i, j] + ki * u[j])
                S[i, j] = s
                p[j] += kn * s
        else:
            for j in range(dv):
                s = ai * S[i, j]
                S[i, j] = s
                p[j] += kn * s


@njit(**_JIT)
def _residual(v_t, beta_t, p, r, u):  # pragma: no cover - compiled
    """r = v - S~^T k (p holds S~^T k), u = beta r."""
    for j in range(v_t.shape[0]):
        r[j] = v_t[j] - p[j]
        u[j] = beta_t * r[j]


@njit(**_JIT)
def _forward_head(q, k, v, beta, la, h0, scale, o, h_T):  # pragma: no cover - compiled
    """One (sequence, head): q, k (T, dk), v (T, dv), beta (T,), la (T, 1 or dk); o (T, dv) and
    h_T (dk, dv) written. One pass over the rows per step: the rank-1 update of step t, the
    output's sum and the decay of step t + 1 with its S~^T k, row by row."""
    T, dk = q.shape
    dv = v.shape[1]
    S = h_T
    S[:, :] = h0
    if T == 0:
        return
    a = np.empty(dk)
    p = np.empty(dv)
    r = np.empty(dv)
    u = np.empty(dv)
    acc = np.empty(dv)
    _alphas(la[0], a)
    _decay_rows(S, a, k[0], p, False, p, p)
    for t in range(T):
        _residual(v[t], beta[t], p, r, u)
        last = t + 1 == T
        if not last:
            _alphas(la[t + 1], a)
        k_t, q_t = k[t], q[t]
        k_n = k[t + 1] if not last else k_t
        for j in range(dv):
            acc[j] = 0.0
            p[j] = 0.0
        for i in range(dk):
            ki = k_t[i]
            qi = q_t[i]
            if last:
                for j in range(dv):
                    s = S[i, j] + ki * u[j]
                    S[i, j] = s
                    acc[j] += qi * s
            else:
                ai = a[i]
                kn = k_n[i]
                for j in range(dv):
                    s = S[i, j] + ki * u[j]
                    acc[j] += qi * s
                    s = ai * s
                    S[i, j] = s
                    p[j] += kn * s
        for j in range(dv):
            o[t, j] = scale * acc[j]


@njit(parallel=True, **_JIT)
def _forward_kernel(q, k, v, beta, la, h0, scale, sb, st0, st1, o, h_T):  # pragma: no cover
    """All (sequence, head) pairs, independent; time serial inside each."""
    G = q.shape[1]
    H = v.shape[1]
    hpg = H // G
    NS = sb.shape[0]
    for item in prange(NS * H):
        n = item // H
        h = item - n * H
        g = h // hpg
        b, t0, t1 = sb[n], st0[n], st1[n]
        _forward_head(q[b, g, t0:t1], k[b, g, t0:t1], v[b, h, t0:t1], beta[b, h, t0:t1],
                      la[b, h, t0:t1], h0[n, h], scale, o[b, h, t0:t1], h_T[n, h])


@njit(**_JIT)
def _adjoint_rows(Cc, scale, q_t, k_t, do_t, du):  # pragma: no cover - compiled
    """Pass 1 of step t alone, on the row-major carry: G = C + scale q do^T in place,
    du = G^T k."""
    dk_, dv_ = Cc.shape
    for m in range(dv_):
        du[m] = 0.0
    for i in range(dk_):
        sq = scale * q_t[i]
        ki = k_t[i]
        for m in range(dv_):
            g = Cc[i, m] + sq * do_t[m]
            Cc[i, m] = g
            du[m] += ki * g


@njit(**_JIT)
def _total(x):  # pragma: no cover - compiled
    """sum_a x[a] in ``glaref.gla._numba._dot``'s order (eight partial sums, a fixed tree)."""
    n = x.shape[0]
    m = n - n % 8
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    for a in range(0, m, 8):
        s0 += x[a]
        s1 += x[a + 1]
        s2 += x[a + 2]
        s3 += x[a + 3]
        s4 += x[a + 4]
        s5 += x[a + 5]
        s6 += x[a + 6]
        s7 += x[a + 7]
    t = 0.0
    for a in range(m, n):
        t += x[a]
    return (((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) + t


@njit(**_JIT)
def _vjp_head(q, k, v, beta, la, h0, do, dh_T, has_dh_T, scale, C, dq, dk, accumulate, dv,
              dbeta, dla, dh0, ckpt, ps, states, acc):  # pragma: no cover - compiled
    """One (sequence, head). dq, dk (T, dk) written, or added to when ``accumulate``.
    Per-worker scratch: ckpt (>= ceil(T / C), dk, dv) and states (C, dk, dv) hold the decayed
    states S~_t = A_t S_{t-1} of t = c C and t = start + j (the products the equations use,
    the same bits); ps (>= T, dv) the S~_t^T k_t of every step; acc (dv,) the sums over the
    rows of S~ o D (scalar gates)."""
    T, dk_ = q.shape
    dv_ = v.shape[1]
    vector = la.shape[1] != 1
    a = np.empty(dk_)
    p = np.empty(dv_)
    u = np.empty(dv_)
    r = np.empty(dv_)
    w = np.empty(dv_)
    sw = np.empty(dk_)
    gu = np.empty(dk_)
    sdos = np.empty((C, dk_))
    Cc = dh0
    if has_dh_T:
        Cc[:, :] = dh_T
    else:
        Cc[:, :] = 0.0
    if T == 0:
        return
    S = np.empty((dk_, dv_))
    S[:, :] = h0
    # Pass 1: S~^T k of every step, and S~ of the first step of every block.
    _alphas(la[0], a)
    _decay_rows(S, a, k[0], p, False, p, p)
    for t in range(T):
        if t % C == 0:
            Sk = ckpt[t // C]
            for i in range(dk_):
                for m in range(dv_):
                    Sk[i, m] = S[i, m]
        for m in range(dv_):
            ps[t, m] = p[m]
        if t + 1 == T:
            break
        _residual(v[t], beta[t], p, u, u)
        _alphas(la[t + 1], a)
        _decay_rows(S, a, k[t + 1], p, True, k[t], u)
    # Pass 2: blocks in reverse. Cc holds G_t = dL/dS_t row by row, du = G_t^T k_t.
    du = np.empty(dv_)
    dun = np.empty(dv_)
    Pm = np.empty((dk_, dv_)) if vector else np.empty((1, 1))
    ones = np.ones(dv_)
    sacc = acc
    t = T - 1
    _adjoint_rows(Cc, scale, q[t], k[t], do[t], du)
    for c in range((T + C - 1) // C - 1, -1, -1):
        start = c * C
        L = min(C, T - start)
        # Recompute the block's S~_t from its checkpoint, one pass over the rows per step.
        Sk = ckpt[c]
        S0 = states[0]
        for i in range(dk_):
            for m in range(dv_):
                S0[i, m] = Sk[i, m]
        np.dot(S0, do[start], sdos[0])
        for j in range(L - 1):
            t = start + j
            _residual(v[t], beta[t], ps[t], r, u)
            _alphas(la[t + 1], a)
            k_t = k[t]
            Sc = states[j]
            Sn = states[j + 1]
            for i in range(dk_):
                ai = a[i]
                ki = k_t[i]
                for m in range(dv_):
                    Sn[i, m] = ai * (Sc[i, m] + ki * u[m])
            np.dot(Sn, do[t + 1], sdos[j + 1])
        # Backward through the block, per step t: the matrix-vector products S~ w, G u,
        # S~ do (BLAS), then one pass over the rows: D = G - k w^T, <S~, D>, and the carry
        # G_{t-1} = A D + scale q_{t-1} do_{t-1}^T with du_{t-1} = G_{t-1}^T k_{t-1}.
        for j in range(L - 1, -1, -1):
            t = start + j
            b_t = beta[t]
            k_t, do_t = k[t], do[t]
            _residual(v[t], b_t, ps[t], r, u)
            _alphas(la[t], a)
            for m in range(dv_):
                x = b_t * du[m]
                dv[t, m] = x
                w[m] = x
            dbeta[t] = _dot(r, du)
            Sc = states[j]
            np.dot(Sc, w, sw)
            np.dot(Cc, u, gu)
            sdo = sdos[j]
            ud = _dot(u, do_t)
            for i in range(dk_):
                x = gu[i] - sw[i]
                y = scale * (sdo[i] + k_t[i] * ud)
                if accumulate:
                    dk[t, i] += x
                    dq[t, i] += y
                else:
                    dk[t, i] = x
                    dq[t, i] = y
            prev = t > 0
            tp = t - 1 if prev else t
            sqs = scale if prev else 0.0
            q_p, k_p, do_p = q[tp], k[tp], do[tp]
            for m in range(dv_):
                dun[m] = 0.0
                sacc[m] = 0.0
            for i in range(dk_):
                ai = a[i]
                ki = k_t[i]
                sqp = sqs * q_p[i]
                kp = k_p[i]
                if vector:
                    for m in range(dv_):
                        d = Cc[i, m] - ki * w[m]
                        Pm[i, m] = Sc[i, m] * d
                        x = ai * d + sqp * do_p[m]
                        Cc[i, m] = x
                        dun[m] += kp * x
                elif prev:
                    for m in range(dv_):
                        d = Cc[i, m] - ki * w[m]
                        sacc[m] += Sc[i, m] * d
                        x = ai * d + sqp * do_p[m]
                        Cc[i, m] = x
                        dun[m] += kp * x
                else:
                    for m in range(dv_):
                        d = Cc[i, m] - ki * w[m]
                        sacc[m] += Sc[i, m] * d
                        Cc[i, m] = ai * d
            if vector:
                np.dot(Pm, ones, dla[t])
            else:
                dla[t, 0] = _total(sacc)
            for m in range(dv_):      # a copy: swapping the names stops LLVM vectorising
                du[m] = dun[m]


@njit(parallel=True, **_JIT)
def _vjp_kernel(q, k, v, beta, la, h0, do, dh_T, has_dh_T, scale, C, n_workers, sb, st0, st1,
                per_head, dq, dk, dv, dbeta, dla, dh0):  # pragma: no cover - compiled
    """Workers over items (item p to worker p % n_workers): (sequence, head) pairs when
    ``per_head`` (dq, dk (B, H, T, dk)), else (sequence, group) items whose heads run in order,
    adding into dq, dk (B, G, T, dk)."""
    G = q.shape[1]
    T, dk_ = q.shape[2], q.shape[3]
    H, dv_ = v.shape[1], v.shape[3]
    hpg = H // G
    NS = sb.shape[0]
    n_blocks = max(1, (T + C - 1) // C)
    per_item = H if per_head else G
    heads = 1 if per_head else hpg
    for wk in prange(n_workers):
        ckpt = np.empty((n_blocks, dk_, dv_))
        ps = np.empty((T, dv_))
        states = np.empty((C, dk_, dv_))
        acc = np.empty(dv_)
        for item in range(wk, NS * per_item, n_workers):
            n = item // per_item
            x = item - n * per_item
            g = x // hpg if per_head else x
            b, t0, t1 = sb[n], st0[n], st1[n]
            for j in range(heads):
                h = x if per_head else g * hpg + j
                _vjp_head(q[b, g, t0:t1], k[b, g, t0:t1], v[b, h, t0:t1], beta[b, h, t0:t1],
                          la[b, h, t0:t1], h0[n, h], do[b, h, t0:t1],
                          dh_T[n, h] if has_dh_T else dh_T[0, 0], has_dh_T, scale, C,
                          dq[b, x, t0:t1], dk[b, x, t0:t1], j > 0, dv[b, h, t0:t1],
                          dbeta[b, h, t0:t1], dla[b, h, t0:t1], dh0[n, h], ckpt, ps, states, acc)


def _c64(x):
    return np.ascontiguousarray(x, dtype=np.float64)


def _gates(log_alpha):
    """log_alpha as the kernels take it: scalar gates get a trailing axis of 1."""
    return log_alpha if log_alpha.ndim == 4 else log_alpha[..., None]


def forward(q, k, v, beta, log_alpha, h0, scale=1.0, cu_seqlens=None):
    """Return (o, h_T). o: (B, H, T, dv), h_T: (B, H, dk, dv) ((N, H, dk, dv) with cu_seqlens)."""
    q, k, v, beta, log_alpha, h0 = (_c64(x) for x in (q, k, v, beta, log_alpha, h0))
    B, H, T, dv = v.shape
    dk = q.shape[3]
    sb, st0, st1 = _spans(B, T, cu_seqlens)
    o = np.zeros((B, H, T, dv))
    h_T = np.empty((len(sb), H, dk, dv))
    _forward_kernel(q, k, v, beta, _c64(_gates(log_alpha)), h0, float(scale), sb, st0, st1, o,
                    h_T)
    return o, h_T


def vjp(q, k, v, beta, log_alpha, h0, do, dh_T=None, scale=1.0, per_head=False,
        cu_seqlens=None):
    """Return (dq, dk, dv, dbeta, dlog_alpha, dh0): the gradient of
    L = sum(o * do) + sum(h_T * dh_T). ``per_head=True``: dq, dk per head (B, H, T, dk)."""
    q, k, v, beta, log_alpha, h0, do = (_c64(x) for x in (q, k, v, beta, log_alpha, h0, do))
    B, G, T, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    sb, st0, st1 = _spans(B, T, cu_seqlens)
    NS = len(sb)
    la4 = _c64(_gates(log_alpha))
    has_dh_T = dh_T is not None
    dh_T_arr = _c64(dh_T) if has_dh_T else np.zeros((1, 1, dk, dv))
    dvv = np.zeros((B, H, T, dv))
    dbeta = np.zeros((B, H, T))
    dla4 = np.zeros(la4.shape)
    dla = dla4 if log_alpha.ndim == 4 else dla4[..., 0]
    dh0 = np.empty((NS, H, dk, dv))
    if H == 0:
        qk_shape = (B, 0, T, dk) if per_head else (B, G, T, dk)
        return np.zeros(qk_shape), np.zeros(qk_shape), dvv, dbeta, dla, dh0
    C = block_size(T)
    n_threads = get_num_threads()
    grouped = not (per_head or G == H or NS * G < n_threads)
    n_workers = max(1, min(n_threads, NS * G if grouped else NS * H))
    args = (q, k, v, beta, la4, h0, do, dh_T_arr, has_dh_T, float(scale), C, n_workers,
            sb, st0, st1)
    if grouped:
        dq = np.zeros((B, G, T, dk))
        dkg = np.zeros((B, G, T, dk))
        with _one_blas_thread():
            _vjp_kernel(*args, False, dq, dkg, dvv, dbeta, dla4, dh0)
        return dq, dkg, dvv, dbeta, dla, dh0
    dqh = np.zeros((B, H, T, dk))
    dkh = np.zeros((B, H, T, dk))
    with _one_blas_thread():
        _vjp_kernel(*args, True, dqh, dkh, dvv, dbeta, dla4, dh0)
    if per_head or G == H:
        return dqh, dkh, dvv, dbeta, dla, dh0
    return _group_sum(dqh, G), _group_sum(dkh, G), dvv, dbeta, dla, dh0
