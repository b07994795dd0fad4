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

The backward keeps S~ of the first step of every ``block_size(T)`` steps (32 up to T = 8192,
then T / 256) and S~^T k of every step in per-worker buffers (the first pass, the forward's
sweep), then takes the blocks in reverse (never inverting a step). In every block the carry
runs step by step: one sweep over the rows per step forms G_{t-1} in place and du_{t-1} =
G_{t-1}^T k_{t-1} (a vector over m, rows added in order of i); dv and dbeta follow from du.

dq, dk and dlog_alpha are outputs only, not needed by the carry, so they are taken once per
32 steps (``_block_outputs``; ``_block_outputs_vector`` for a vector gate) from the piece's
first decayed state S~_0, the carry into its last step and the piece's rows u, w, k, q, do:
with E[r, i] = a_{i+1} ... a_r (per key dimension for a vector gate), S~_j = E[j,0] S~_0 +
sum_{i<j} E[j,i] k_i u_i^T and D_j likewise a sum of the carry and the piece's rank-one terms,
so S~_j w_j, S~_j do_j, G_j u_j and <S~_j, D_j> are sums of their genuine terms, each with its
own decay (docs/math_delta.md, section 3), formed by BLAS matrix products ([W; dO] S~_0^T,
U Gc^T and the piece's (L, L) products) and, for a vector gate, loops over the key index. No
state is recomputed but the one at every 32nd step of blocks longer than 32 steps (T > 8192).
(A sum over m of a row-major matrix written as a loop would not use the vector units: without
fastmath LLVM keeps the order of a reduction, and Numba leaves its SLP vectorizer off.)

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

from ..gla._numba import _N, _T, _dot, _gemm, _group_sum, _one_blas_thread, _spans

_JIT = dict(fastmath=False, cache=True)
BLOCK = 32            # steps between stored states, at least
MAX_CHECKPOINTS = 256  # states stored per worker, at most (longer sequences get longer blocks)


def block_size(T: int) -> int:
    """Steps between the backward's stored states: 32, or T / 256 (rounded up) for T > 8192, so
    that a worker keeps at most 256 states (the outputs are taken ``BLOCK`` steps at a time)."""
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
    """The carry into step t made G_t: G = C + scale q_t do_t^T in place, du = G^T k_t (the
    last step of every 32-step piece)."""
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
def _piece_products(S0, Gc, U, W, dO, X, SX, ab):  # pragma: no cover - compiled
    """The products of a piece with the full state and carry (BLAS): returns SXb (2L, dk), rows
    S0 w_j then S0 do_j, and GU (L, dk), rows Gc u_j (views of the scratch SX; X holds [W; dO])."""
    L, dv_ = U.shape
    Xb = X[:2 * L]
    for j in range(L):
        for m in range(dv_):
            Xb[j, m] = W[j, m]
            Xb[L + j, m] = dO[j, m]
    SXb = SX[:2 * L]
    _gemm(_N, _T, 1.0, Xb, S0, 0.0, SXb, ab)
    GU = SX[2 * L:3 * L]
    _gemm(_N, _T, 1.0, U, Gc, 0.0, GU, ab)
    return SXb, GU


@njit(**_JIT)
def _pair_products(U, W, dO, WU, DU, ab):  # pragma: no cover - compiled
    """WU[j, i] = w_j . u_i and DU[j, i] = do_j . u_i over a piece's steps (BLAS)."""
    _gemm(_N, _T, 1.0, W, U, 0.0, WU, ab)
    _gemm(_N, _T, 1.0, dO, U, 0.0, DU, ab)


@njit(**_JIT)
def _block_outputs(a, S0, Gc, U, W, K, Qh, dO, scale, E, X, SX, Y, Z, xs, ys, dq, dk, dla,
                   accumulate, ab):  # pragma: no cover - compiled
    """dq, dk, dlog_alpha of a block's L steps (scalar gate) from the block's first decayed
    state S0 = S~_0, the carry Gc into its last step (dL/dS_{L-1} from later steps, without
    that step's q do^T), and the rows u_j, w_j = beta_j du_j, k_j, scale q_j, do_j (U, W, K,
    Qh, dO: (L, dv) or (L, dk)); a holds the block's L alphas. With E[r, i] = a_{i+1} ... a_r
    (r >= i, running products), S~_j = E[j, 0] S0 + sum_{i<j} E[j, i] k_i u_i^T and
    D_j = G_j - k_j w_j^T = E[L-1, j] Gc + sum_{r>=j} E[r, j] (q^_r do_r^T - k_r w_r^T):

        S~_j w_j  = E[j,0] S0 w_j  + sum_{i<j} E[j,i] k_i (u_i . w_j)
        S~_j do_j = E[j,0] S0 do_j + sum_{i<j} E[j,i] k_i (u_i . do_j)
        G_j u_j   = E[L-1,j] Gc u_j + sum_{r>=j} E[r,j] q^_r (do_r . u_j) - sum_{r>j} E[r,j] k_r (w_r . u_j)
        <S~_j, D_j> = E[L-1,0] <S0, Gc> + sum_{r>=j} E[r,0] x_r + sum_{i<j} E[L-1,i] y_i
                      + sum_{i<j<=r} E[r,i] z[r,i]
        x_r = q^_r . S0 do_r - k_r . S0 w_r,  y_i = k_i . Gc u_i,
        z[r,i] = (q^_r . k_i)(do_r . u_i) - (k_r . k_i)(w_r . u_i)

    every term a genuine term of the step-by-step products (docs/math_delta.md, section 3),
    each with its own decay. Products through BLAS (``glaref.gla._numba._gemm``); scratch E
    (C, C), X (2C, dv), SX (3C, dk) for [W; dO] S0^T and U Gc^T, Y (7, C, C) for W U^T,
    dO U^T, Q^ K^T, K K^T and the three masked products' factors, Z (3, C, dk) their products,
    xs, ys (2C,)."""
    L, dk_ = K.shape
    dv_ = U.shape[1]
    for r in range(L):
        E[r, r] = 1.0
        for i in range(r - 1, -1, -1):
            E[r, i] = E[r, i + 1] * a[i + 1]
    SXb, GU = _piece_products(S0, Gc, U, W, dO, X, SX, ab)
    WU, DU, QK, KK = Y[0, :L, :L], Y[1, :L, :L], Y[2, :L, :L], Y[3, :L, :L]
    _pair_products(U, W, dO, WU, DU, ab)
    _gemm(_N, _T, 1.0, Qh, K, 0.0, QK, ab)            # [r, i] = q^_r . k_i
    _gemm(_N, _T, 1.0, K, K, 0.0, KK, ab)             # [r, i] = k_r . k_i
    Mq, Mk, Md = Y[4, :L, :L], Y[5, :L, :L], Y[6, :L, :L]
    for j in range(L):
        for r in range(L):
            Mq[j, r] = E[r, j] * DU[r, j] if r >= j else 0.0            # q^_r (do_r . u_j)
            if r > j:
                Mk[j, r] = E[r, j] * WU[r, j]                            # k_r (w_r . u_j)
            elif r < j:
                Mk[j, r] = E[j, r] * WU[j, r]                            # k_r (u_r . w_j)
            else:
                Mk[j, r] = 0.0
            Md[j, r] = E[j, r] * DU[j, r] if r < j else 0.0             # k_r (u_r . do_j)
    P = Z[0, :L]
    Pk = Z[1, :L]
    Pd = Z[2, :L]
    _gemm(_N, _N, 1.0, Mq, Qh, 0.0, P, ab)
    _gemm(_N, _N, 1.0, Mk, K, 0.0, Pk, ab)
    _gemm(_N, _N, 1.0, Md, K, 0.0, Pd, ab)
    for r in range(L):
        xs[r] = E[r, 0] * (_dot(Qh[r], SXb[L + r]) - _dot(K[r], SXb[r]))
        ys[r] = E[L - 1, r] * _dot(K[r], GU[r])
    base = E[L - 1, 0] * _dot(S0.reshape(dk_ * dv_), Gc.reshape(dk_ * dv_))
    # the pairs i < j <= r: col[i] = sum_{r >= j} E[r, i] z[r, i], rows added from the last
    col = xs[L:2 * L]
    for i in range(L):
        col[i] = 0.0
    for j in range(L - 1, -1, -1):
        for i in range(j):
            col[i] += E[j, i] * (QK[j, i] * DU[j, i] - KK[j, i] * WU[j, i])
        pair = 0.0
        for i in range(j):
            pair += col[i]
        ys[L + j] = pair
    for j in range(L):
        ud = _dot(U[j], dO[j])
        e0 = E[j, 0]
        eL = E[L - 1, j]
        for i in range(dk_):
            x = ((eL * GU[j, i] + P[j, i]) - Pk[j, i]) - e0 * SXb[j, i]
            y = scale * ((e0 * SXb[L + j, i] + Pd[j, i]) + K[j, i] * ud)
            if accumulate:
                dk[j, i] += x
                dq[j, i] += y
            else:
                dk[j, i] = x
                dq[j, i] = y
        tot = base
        for r in range(j, L):
            tot += xs[r]
        for i in range(j):
            tot += ys[i]
        dla[j, 0] = tot + ys[L + j]


@njit(**_JIT)
def _block_outputs_vector(al, S0, Gc, U, W, K, Qh, dO, scale, Ed, X, SX, Y, V, dq, dk, dla,
                          accumulate, ab):  # pragma: no cover - compiled
    """``_block_outputs`` for a vector gate: the same terms with a decay per key dimension,
    Ed[r, i, :] = al[i+1, :] ... al[r, :] (running products), applied elementwise over the key
    index; the sums over the piece's pairs are loops over it (vectors over the key index),
    S~_0 <-> Gc row by row (``_dot``). Scratch Ed (C, C, dk), V (4, C, dk)."""
    L, dk_ = K.shape
    for r in range(L):
        for d in range(dk_):
            Ed[r, r, d] = 1.0
        for i in range(r - 1, -1, -1):
            for d in range(dk_):
                Ed[r, i, d] = Ed[r, i + 1, d] * al[i + 1, d]
    SXb, GU = _piece_products(S0, Gc, U, W, dO, X, SX, ab)
    WU, DU = Y[0, :L, :L], Y[1, :L, :L]
    _pair_products(U, W, dO, WU, DU, ab)
    acc = V[0, 0]
    base = V[0, 1]
    xr = V[0, 2]
    yr = V[0, 3]
    for d in range(dk_):
        base[d] = Ed[L - 1, 0, d] * _dot(S0[d], Gc[d])
    # dlog_alpha's pairs i < j <= r, per key dimension: col[i] = sum_{r >= j} Ed[r, i] z[r, i]
    col = V[1, :L]
    pair = V[2, :L]
    for i in range(L):
        for d in range(dk_):
            col[i, d] = 0.0
    for j in range(L - 1, -1, -1):
        for i in range(j):
            zq = DU[j, i]
            zk = WU[j, i]
            for d in range(dk_):
                col[i, d] += Ed[j, i, d] * (K[i, d] * (Qh[j, d] * zq - K[j, d] * zk))
        for d in range(dk_):
            pair[j, d] = 0.0
        for i in range(j):
            for d in range(dk_):
                pair[j, d] += col[i, d]
    xsum = V[3, :L]          # sum_{r >= j} Ed[r, 0] x_r, from the last
    for j in range(L - 1, -1, -1):
        for d in range(dk_):
            x = Ed[j, 0, d] * (Qh[j, d] * SXb[L + j, d] - K[j, d] * SXb[j, d])
            xsum[j, d] = x if j == L - 1 else xsum[j + 1, d] + x
    for d in range(dk_):
        acc[d] = 0.0         # sum_{i < j} Ed[L-1, i] y_i, from the first
    for j in range(L):
        ud = _dot(U[j], dO[j])
        for d in range(dk_):
            dla[j, d] = ((base[d] + xsum[j, d]) + acc[d]) + pair[j, d]
        for d in range(dk_):
            xr[d] = Ed[L - 1, j, d] * GU[j, d] - Ed[j, 0, d] * SXb[j, d]
            yr[d] = Ed[j, 0, d] * SXb[L + j, d]
        for r in range(j, L):
            c = DU[r, j]
            for d in range(dk_):
                xr[d] += c * (Ed[r, j, d] * Qh[r, d])
        for r in range(j + 1, L):
            c = WU[r, j]
            for d in range(dk_):
                xr[d] -= c * (Ed[r, j, d] * K[r, d])
        for i in range(j):
            c = WU[j, i]
            c2 = DU[j, i]
            for d in range(dk_):
                e = Ed[j, i, d] * K[i, d]
                xr[d] -= c * e
                yr[d] += c2 * e
        for d in range(dk_):
            x = xr[d]
            y = scale * (yr[d] + K[j, d] * ud)
            if accumulate:
                dk[j, d] += x
                dq[j, d] += y
            else:
                dk[j, d] = x
                dq[j, d] = y
        for d in range(dk_):
            acc[d] += Ed[L - 1, j, d] * (K[j, d] * GU[j, d])


@njit(**_JIT)
def _vjp_head(q, k, v, beta, la, h0, do, dh_T, has_dh_T, scale, C, dq, dk, accumulate, dv,
              dbeta, dla, dh0, ckpt, ps):  # pragma: no cover - compiled
    """One (sequence, head): the carry step by step (G, du, dv, dbeta), and dq, dk, dlog_alpha
    of every 32-step piece from ``_block_outputs`` (scalar gate) or ``_block_outputs_vector``."""
    T, dk_ = q.shape
    dv_ = v.shape[1]
    Cc = dh0
    if not _start(k, v, beta, la, h0, dh_T, has_dh_T, C, ckpt, ps, Cc):
        return
    a = np.empty(dk_)
    p = np.empty(dv_)
    u = np.empty(dv_)
    r = np.empty(dv_)
    du = np.empty(dv_)
    dun = np.empty(dv_)
    Gc = np.empty((dk_, dv_))
    U = np.empty((BLOCK, dv_))
    W = np.empty((BLOCK, dv_))
    Qh = np.empty((BLOCK, dk_))
    vector = la.shape[1] != 1
    al = np.empty(BLOCK)
    alv = np.empty((BLOCK, dk_) if vector else (1, 1))
    Ed = np.empty((BLOCK, BLOCK, dk_) if vector else (1, 1, 1))
    V = np.empty((4, BLOCK, dk_))
    E = np.empty((BLOCK, BLOCK))
    X = np.empty((2 * BLOCK, dv_))
    SX = np.empty((3 * BLOCK, dk_))
    Y = np.empty((7, BLOCK, BLOCK))
    Z = np.empty((3, BLOCK, dk_))
    xs = np.empty(2 * BLOCK)
    ys = np.empty(2 * BLOCK)
    ab = np.empty(2)
    n_sub = (C + BLOCK - 1) // BLOCK
    subs = np.empty((n_sub, dk_, dv_)) if n_sub > 1 else np.empty((1, 1, 1))
    for c in range((T + C - 1) // C - 1, -1, -1):
        b0 = c * C
        be = min(b0 + C, T)
        nb = (be - b0 + BLOCK - 1) // BLOCK
        if nb > 1:
            # blocks longer than BLOCK (T > 8192): the decayed state at every BLOCK-th step,
            # recomputed from the checkpoint (the first pass's products, the same bits), so
            # that the outputs' products stay BLOCK steps long
            S = subs[0]
            S[:, :] = ckpt[c]
            for sb in range(1, nb):
                subs[sb, :, :] = subs[sb - 1]
                S = subs[sb]
                for t in range(b0 + (sb - 1) * BLOCK, b0 + sb * BLOCK):
                    _residual(v[t], beta[t], ps[t], r, u)
                    _alphas(la[t + 1], a)
                    _decay_rows(S, a, k[t + 1], p, True, k[t], u)
        for sb in range(nb - 1, -1, -1):
            s0 = b0 + sb * BLOCK
            L = min(BLOCK, be - s0)
            e = s0 + L
            S0 = ckpt[c] if nb == 1 else subs[sb]
            for i in range(dk_):
                for m in range(dv_):
                    Gc[i, m] = Cc[i, m]
            _adjoint_rows(Cc, scale, q[e - 1], k[e - 1], do[e - 1], du)
            for j in range(L - 1, -1, -1):
                t = s0 + j
                b_t = beta[t]
                k_t = k[t]
                _residual(v[t], b_t, ps[t], r, u)
                for m in range(dv_):
                    U[j, m] = u[m]
                    x = b_t * du[m]
                    dv[t, m] = x
                    W[j, m] = x
                dbeta[t] = _dot(r, du)
                _alphas(la[t], a)
                if vector:
                    for i in range(dk_):
                        alv[j, i] = a[i]
                else:
                    al[j] = a[0]
                if j > 0:
                    sq = scale * q[t - 1]
                    k_p = k[t - 1]
                    do_p = do[t - 1]
                    for m in range(dv_):
                        dun[m] = 0.0
                    for i in range(dk_):
                        ai = a[i]
                        ki = k_t[i]
                        sqi = sq[i]
                        kp = k_p[i]
                        for m in range(dv_):
                            x = ai * (Cc[i, m] - ki * W[j, m]) + sqi * do_p[m]
                            Cc[i, m] = x
                            dun[m] += kp * x
                    for m in range(dv_):  # a copy: swapping the names stops LLVM vectorising
                        du[m] = dun[m]
                else:
                    for i in range(dk_):
                        ai = a[i]
                        ki = k_t[i]
                        for m in range(dv_):
                            Cc[i, m] = ai * (Cc[i, m] - ki * W[j, m])
            for j in range(L):
                for i in range(dk_):
                    Qh[j, i] = scale * q[s0 + j, i]
            if vector:
                _block_outputs_vector(alv, S0, Gc, U[:L], W[:L], k[s0:e], Qh[:L], do[s0:e],
                                      scale, Ed, X, SX, Y, V, dq[s0:e], dk[s0:e], dla[s0:e],
                                      accumulate, ab)
            else:
                _block_outputs(al, S0, Gc, U[:L], W[:L], k[s0:e], Qh[:L], do[s0:e], scale, E,
                               X, SX, Y, Z, xs, ys, dq[s0:e], dk[s0:e], dla[s0:e], accumulate,
                               ab)


@njit(**_JIT)
def _start(k, v, beta, la, h0, dh_T, has_dh_T, C, ckpt, ps, Cc):  # pragma: no cover - compiled
    """The carry's start (Cc = dh_T, or zero) and, when T > 0, the forward's sweep: S~^T k of
    every step into ps and S~ of the first step of every block of C steps into ckpt. Returns
    whether there are steps to run back through."""
    T, dk_ = k.shape
    dv_ = v.shape[1]
    if has_dh_T:
        Cc[:, :] = dh_T
    else:
        Cc[:, :] = 0.0
    if T == 0:
        return False
    a = np.empty(dk_)
    p = np.empty(dv_)
    u = np.empty(dv_)
    S = np.empty((dk_, dv_))
    S[:, :] = h0
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
    return True


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
                          dbeta[b, h, t0:t1], dla[b, h, t0:t1], dh0[n, h], ckpt, ps)

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
