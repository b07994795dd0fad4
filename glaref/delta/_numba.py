"""The Numba float64 oracle of the gated delta rule: the functions and signatures of
``glaref.delta._reference``, compiled.

    forward(q, k, v, beta, log_alpha, h0, scale, cu_seqlens=None) -> (o, h_T)
    vjp(q, k, v, beta, log_alpha, h0, do, dh_T, scale, per_head=False, cu_seqlens=None)
        -> (dq, dk, dv, dbeta, dlog_alpha, dh0)

The equations are the reference's (docs/math_delta.md, sections 1 and 2), step by step. The
forward runs over the rows i of the state S (dk, dv), row-major, so that the inner loops run
over dv contiguous numbers:

    pass 1   S~[i] = a_i S[i];  p += k_i S~[i]           (p = S~^T k)
    then     r = v - p,  u = beta r
    pass 2   S[i] = S~[i] + k_i u;  o_acc += q_i S[i]   (o = scale S^T q)

Each row's part of a pass needs only that row, so a step costs one sweep over the state: pass 2
of step t runs in the same loop as pass 1 of step t + 1 (the buffer then holds S~_{t+1}).

The backward's sums run both ways: over i (du = G^T k, in order of i: an axpy over m on a
row-major matrix) and over m (dq = scale S do, gu = G u, S~ w, <S~[i], D[i]>: each the eight
partial sums of ``glaref.gla._numba._dot``, one per m mod 8, combined in its fixed tree). A sum over
m of a row-major matrix would be a scalar loop per row, four per row and step; so the backward
keeps the states and the adjoint transposed as well, (dv, dk), where the eight partial sums of
all rows i are vectors over i (``lanes[x, m % 8, i]``, term m added in order of m) and every
inner loop runs over dk contiguous numbers:

    pass 1 (row-major, as the forward's)    S~_t, p_t = S~_t^T k_t of every step
    per block, transposed                   S_t^T[m] = S~_t^T[m] + u_m k_t;  lanes 0: S_t^T[m] do_m;
                                            S~_{t+1}^T[m] = a o S_t^T[m];  dq = scale sum(lanes 0)
    per step t, transposed, row m of G^T    G = C^T[m] + do_m scale q;  D = G - w_m k
                  (w = beta du)             lanes 1-3: G u_m, S~^T[m] w_m, S~^T[m] o D;
                                            C^T[m] = a o D    (the carry of t - 1)
              then dk = sum(lanes 1) - sum(lanes 2), dlog_alpha = sum(lanes 3) (per key, or
              summed over i for a scalar gate)
    per step t, row-major                   C = a o (G - k w^T);  G_{t-1} = C + scale q do^T,
                                            du_{t-1} = G_{t-1}^T k_{t-1}   (one sweep)

Every product and partial sum is the one of the row-major equations, in the same order, so the
transposed copies hold the same numbers and the results have the same bits as a row-major
backward with ``_dot``'s sums. (Two loops note: a view S[i] in a per-row loop is a new array
whose reference count is raised and dropped, atomic operations once per row and step, so rows
are indexed as S[i, m]; and swapping two arrays' names between steps stops LLVM vectorising
the loops that use them, so du is copied.) The backward keeps S~ (transposed) of the first step
of every ``block_size(T)`` steps (32 up to T = 8192, then T / 256) and S~^T k of every step in
per-worker buffers, and recomputes the decayed states S~_t of one block at a time from its
checkpoint (never by inverting a step): the time stays linear in T. The recomputed states are
the products the equations use (S~_t = A_t S_{t-1}, rounded once, the forward's numbers).

Determinism: kernels are ``@njit(fastmath=False, cache=True)``; ``prange`` runs over workers
that take independent items, (sequence, group) pairs, with the time loop serial inside and a
group's heads in order: head 0 writes dq and dk, the others add, left to right. When there are
fewer (sequence, group) items than threads, the items are (sequence, head) pairs with per-head
dq, dk summed afterwards in the same head order (``glaref.gla._numba._group_sum``): both give
the same bits, for any number of threads.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, prange

from ..gla._numba import _dot, _group_sum, _spans

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
def _zero_lanes(lanes, x):  # pragma: no cover - compiled
    """lanes[x] = 0 (a loop: an array assignment compiles Numba's broadcasting checks)."""
    for l in range(lanes.shape[1]):
        for i in range(lanes.shape[2]):
            lanes[x, l, i] = 0.0


@njit(**_JIT)
def _lane_sum(lanes, x, i):  # pragma: no cover - compiled
    """The total of partial sums lanes[x, :, i] in ``glaref.gla._numba._dot``'s tree (lanes[x, l]
    holds the terms m = l mod 8 of the full groups of eight, lanes[x, 8] the rest), so that a
    sum over m added into lanes term by term in order of m has the bits of ``_dot``."""
    return ((((lanes[x, 0, i] + lanes[x, 1, i]) + (lanes[x, 2, i] + lanes[x, 3, i]))
             + ((lanes[x, 4, i] + lanes[x, 5, i]) + (lanes[x, 6, i] + lanes[x, 7, i])))
            + lanes[x, 8, i])


@njit(**_JIT)
def _vjp_head(q, k, v, beta, la, h0, do, dh_T, has_dh_T, scale, C, dq, dk, accumulate, dv,
              dbeta, dla, dh0, ckpt, ps, states, CT, lanes):  # pragma: no cover - compiled
    """One (sequence, head). dq, dk (T, dk) written, or added to when ``accumulate``.
    Per-worker scratch: ckpt (>= ceil(T / C), dv, dk) and states (C, dv, dk) hold the decayed
    states S~_t = A_t S_{t-1}, transposed, of t = c C and t = start + j (the products the
    equations use, the same bits); ps (>= T, dv) the S~_t^T k_t of every step; CT (dv, dk)
    the carry, transposed; lanes (4, 9, dk) the partial sums of the sums over m."""
    T, dk_ = q.shape
    dv_ = v.shape[1]
    m8 = dv_ - dv_ % 8
    vector = la.shape[1] != 1
    a = np.empty(dk_)
    p = np.empty(dv_)
    u = np.empty(dv_)
    r = np.empty(dv_)
    w = np.empty(dv_)
    sq = np.empty(dk_)
    Cc = dh0
    if has_dh_T:
        Cc[:, :] = dh_T
    else:
        Cc[:, :] = 0.0
    if T == 0:
        return
    for i in range(dk_):
        for m in range(dv_):
            CT[m, i] = Cc[i, m]
    S = np.empty((dk_, dv_))
    S[:, :] = h0
    # Pass 1: S~^T k of every step, and S~ (transposed) of the first step of every block.
    _alphas(la[0], a)
    _decay_rows(S, a, k[0], p, False, p, p)
    for t in range(T):
        if t % C == 0:
            Sk = ckpt[t // C]
            for i in range(dk_):
                for m in range(dv_):
                    Sk[m, i] = S[i, m]
        for m in range(dv_):
            ps[t, m] = p[m]
        if t + 1 == T:
            break
        _residual(v[t], beta[t], p, u, u)
        _alphas(la[t + 1], a)
        _decay_rows(S, a, k[t + 1], p, True, k[t], u)
    # Pass 2: blocks in reverse. Cc carries dL/dS_t (then G_t) row by row, for the sums over i
    # (du = G^T k, in order of i, as axpys over m); CT the same numbers, transposed, row m by
    # row m, for the sums over m, whose eight partial sums of ``_dot`` are vectors over i:
    # term m of row i goes to lanes[x, m % 8, i].
    du = np.empty(dv_)
    dun = np.empty(dv_)
    for c in range((T + C - 1) // C - 1, -1, -1):
        start = c * C
        L = min(C, T - start)
        # Recompute the block's S~_t (transposed) from its checkpoint; dq_t = scale S_t do_t
        # needs no cotangent, so it is summed here, from S_t = S~_t + k u^T.
        Sk = ckpt[c]
        S0 = states[0]
        for m in range(dv_):
            for i in range(dk_):
                S0[m, i] = Sk[m, i]
        for j in range(L):
            t = start + j
            _residual(v[t], beta[t], ps[t], r, u)
            k_t, do_t = k[t], do[t]
            nxt = j + 1 < L
            if nxt:
                _alphas(la[t + 1], a)
            Sc = states[j]
            Sn = states[j + 1] if nxt else Sc
            _zero_lanes(lanes, 0)
            for m in range(dv_):
                um = u[m]
                dm = do_t[m]
                ln = m & 7 if m < m8 else 8
                if nxt:
                    for i in range(dk_):
                        x = Sc[m, i] + k_t[i] * um
                        lanes[0, ln, i] += x * dm
                        Sn[m, i] = a[i] * x
                else:
                    for i in range(dk_):
                        lanes[0, ln, i] += (Sc[m, i] + k_t[i] * um) * dm
            for i in range(dk_):
                x = scale * _lane_sum(lanes, 0, i)
                if accumulate:
                    dq[t, i] += x
                else:
                    dq[t, i] = x
        # Backward through the block: on Cc, pass 1 of the last step alone, then per step t
        # its update fused with pass 1 of step t - 1 (G and du), row by row; on CT, per step,
        # G, D = G - k w^T and the carry A D with the sums over m (G u, S~ w, <S~, D>).
        t = start + L - 1
        _adjoint_rows(Cc, scale, q[t], k[t], do[t], du)
        for j in range(L - 1, -1, -1):
            t = start + j
            b_t = beta[t]
            k_t, q_t, do_t = k[t], q[t], do[t]
            _residual(v[t], b_t, ps[t], r, u)
            _alphas(la[t], a)
            for m in range(dv_):
                dv[t, m] = b_t * du[m]
                w[m] = b_t * du[m]
            dbeta[t] = _dot(r, du)
            for i in range(dk_):
                sq[i] = scale * q_t[i]
            Sc = states[j]
            for x in range(1, 4):
                _zero_lanes(lanes, x)
            for m in range(dv_):
                dm = do_t[m]
                wm = w[m]
                um = u[m]
                ln = m & 7 if m < m8 else 8
                for i in range(dk_):
                    g = CT[m, i] + sq[i] * dm
                    d = g - k_t[i] * wm
                    lanes[1, ln, i] += g * um
                    lanes[2, ln, i] += Sc[m, i] * wm
                    lanes[3, ln, i] += Sc[m, i] * d
                    CT[m, i] = a[i] * d
            total = 0.0
            for i in range(dk_):
                x = _lane_sum(lanes, 1, i) - _lane_sum(lanes, 2, i)
                if accumulate:
                    dk[t, i] += x
                else:
                    dk[t, i] = x
                y = _lane_sum(lanes, 3, i)
                if vector:
                    dla[t, i] = y
                else:
                    total += y
            if not vector:
                dla[t, 0] = total
            if j > 0:
                tp = t - 1
                q_p, k_p, do_p = q[tp], k[tp], do[tp]
                for m in range(dv_):
                    dun[m] = 0.0
                for i in range(dk_):
                    ai = a[i]
                    ki = k_t[i]
                    sqp = scale * q_p[i]
                    kp = k_p[i]
                    for m in range(dv_):
                        g = ai * (Cc[i, m] - ki * w[m]) + sqp * do_p[m]
                        Cc[i, m] = g
                        dun[m] += kp * g
                for m in range(dv_):      # a copy: swapping the names stops LLVM vectorising
                    du[m] = dun[m]
            else:
                for i in range(dk_):
                    ai = a[i]
                    ki = k_t[i]
                    for m in range(dv_):
                        Cc[i, m] = ai * (Cc[i, m] - ki * w[m])


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
        ckpt = np.empty((n_blocks, dv_, dk_))
        ps = np.empty((T, dv_))
        states = np.empty((C, dv_, dk_))
        CT = np.empty((dv_, dk_))
        lanes = np.empty((4, 9, dk_))
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
                          dbeta[b, h, t0:t1], dla[b, h, t0:t1], dh0[n, h], ckpt, ps, states,
                          CT, lanes)


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
        _vjp_kernel(*args, False, dq, dkg, dvv, dbeta, dla4, dh0)
        return dq, dkg, dvv, dbeta, dla, dh0
    dqh = np.zeros((B, H, T, dk))
    dkh = np.zeros((B, H, T, dk))
    _vjp_kernel(*args, True, dqh, dkh, dvv, dbeta, dla4, dh0)
    if per_head or G == H:
        return dqh, dkh, dvv, dbeta, dla, dh0
    return _group_sum(dqh, G), _group_sum(dkh, G), dvv, dbeta, dla, dh0
