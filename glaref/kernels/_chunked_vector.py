"""The chunked kernel for vector gates: log_alpha (B, H, T, dk), one decay per key dimension.

Within chunk n (C steps, the last one zero-padded), with b_j[i] the cumulative log decay of key
dimension i from the chunk's start to step j (inclusive) and S_n the state before the chunk:

    o_j     = scale * ( (q_j o exp(b_j)) S_n + sum_{s <= j} A[j, s] v_s )
    A[j, s] = sum_i q_j[i] k_s[i] exp(b_j[i] - b_s[i])
    S_{n+1} = diag(exp(b_last)) S_n + sum_s (k_s o exp(b_last - b_s))^T v_s

The decay differs per term of the dot product, so A is not a masked Q K^T, and the split
(q o exp(b)) (k o exp(-b))^T overflows under strong decay (exp(-b_s) > 1e308 once -b_s > 709).
The chunk is cut into n sub-chunks of c steps (c = the largest divisor of C not above 16):

- key s in an earlier sub-chunk S than query j's sub-chunk J: with r the last step before J,
  exp(b_j - b_s) = exp(b_j - b_r) exp(b_r - b_s), both exponents <= 0 under decay, so
  A[J-block, S-block] = (Q_J o exp(p_J)) (K_S o exp(x_S + mid_{S,J}))^T is a matrix product;
  p_J[j] = sum of the gates of J up to j, x_S[s] = sum of the gates of S after s,
  mid_{S,J} = the gates of the whole sub-chunks strictly between S and J;
- s and j in the same sub-chunk: exp(b_j - b_s) with b_j - b_s = sum_{s < t <= j} log_alpha_t
  summed over that segment directly (a 0/1 tensor contraction), never as the difference of two
  cumulative sums, and masked (exponent set to 0, result to 0) above the diagonal before exp.

Every exponent is therefore a sum of gates over a segment inside one chunk, never exp(b_i) /
exp(b_j). Partial sums of same-signed gates never exceed the final sum, so each exponent's
rounding stays relative to its own value (not to |b| of the whole chunk); b_j and b_last - b_j
themselves (for the state terms) are sums of whole sub-chunk totals and one partial sub-chunk.

Backward (``jax.custom_vjp``, nothing saved but the inputs): one forward sweep recomputes the
chunk states S_0..S_{N-1}, then a reverse sweep over chunks applies, per chunk, the vjp of the
chunk function (q, k, v, log_alpha, S_n) -> (o, S_{n+1}) above, taken by ``jax.vjp`` on that
chunk alone with the cotangents (do, dS_{n+1}); its dS_n is carried to the previous chunk, and
dh0 = dS_0. dlog_alpha is thereby the derivative of the decay factors themselves (the direct
form: a sum of the genuine terms, each weighted by its own decay), not the reverse-cumsum
identity, so it does not cancel under strong decay. Residual memory: the N chunk states between
the two sweeps, and one chunk's intermediates at a time.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from . import _common as c
from ._chunks import _GATE_PRECISION, _chunk, _Config, _put, _residual_free

SUB = 16   # largest sub-chunk


def sub_chunk(C: int) -> int:
    """The sub-chunk size for chunk size C: the largest divisor of C not above SUB."""
    return max(d for d in range(1, min(C, SUB) + 1) if C % d == 0)


def _matrices(C: int, c_: int, dtype):
    """0/1 matrices: within a sub-chunk incl[t, j] = [t <= j], after[t, s] = [t > s],
    seg[t, j, s] = [s < t <= j]; across sub-chunks before[a, m] = [a < m], later[a, m] = [a > m],
    mid[a, J, S] = [S < a < J]."""
    n = C // c_
    i = jnp.arange(c_)
    incl = (i[:, None] <= i[None, :]).astype(dtype)
    after = (i[:, None] > i[None, :]).astype(dtype)
    seg = ((i[None, None, :] < i[:, None, None]) & (i[:, None, None] <= i[None, :, None])).astype(dtype)
    m = jnp.arange(n)
    before = (m[:, None] < m[None, :]).astype(dtype)
    later = (m[:, None] > m[None, :]).astype(dtype)
    mid = ((m[None, None, :] < m[:, None, None]) & (m[:, None, None] < m[None, :, None])).astype(dtype)
    return incl, after, seg, before, later, mid


def _gate_sums(la, c_: int, full: bool):
    """From one chunk's gates la (B, G, R, C, dk): b (inclusive from the chunk start), rest =
    b_last - b, b_last and, when ``full``, the sub-chunk pieces p, x, mid and the in-sub-chunk
    segment sums diag[J, j, s] = sum_{s < t <= j} la_t (0 for s >= j). Shapes (B, G, R, n, c, dk)
    for b, rest, p, x; (B, G, R, n, n, dk) for mid[J, S]; (B, G, R, n, c, c, dk) for diag."""
    B, G, R, C, dk = la.shape
    n = C // c_
    incl, after, seg, before, later, mid = _matrices(C, c_, la.dtype)
    gate = partial(jnp.einsum, precision=_GATE_PRECISION)
    ls = la.reshape(B, G, R, n, c_, dk)
    p = gate("...mti,tj->...mji", ls, incl)          # sum of J's gates up to j (inclusive)
    x = gate("...mti,ts->...msi", ls, after)         # sum of S's gates after s
    tot = p[..., c_ - 1, :]                           # (B, G, R, n, dk) sub-chunk totals
    b = gate("...ai,am->...mi", tot, before)[..., None, :] + p
    rest = x + gate("...ai,am->...mi", tot, later)[..., None, :]
    b_last = b[..., n - 1, c_ - 1, :]
    if not full:
        return b, rest, b_last, None
    pieces = dict(p=p, x=x, mid=gate("...ai,aJS->...JSi", tot, mid),
                  diag=gate("...mti,tjs->...mjsi", ls, seg))
    return b, rest, b_last, pieces


def _masked_exp(e, mask):
    """exp(e) where mask, else 0; the exponent is masked first so nothing masked reaches exp."""
    return jnp.where(mask, jnp.exp(jnp.where(mask, e, 0.0)), 0.0)


def _chunk_fn(cfg: _Config, q, k, v, la, S, *, outputs: bool = True):
    """One chunk: (o * scale, S_next) (or S_next alone). q, k (B, G, C, dk); v (B, G, R, C, dv);
    la (B, G, R, C, dk); S (B, G, R, dk, dv)."""
    ein = partial(jnp.einsum, precision=cfg.precision)
    B, G, R, C, dk = la.shape
    c_ = sub_chunk(C)
    n = C // c_
    b, rest, b_last, pc = _gate_sums(la, c_, full=outputs)
    b = b.reshape(B, G, R, C, dk)
    rest = rest.reshape(B, G, R, C, dk)
    S_next = (jnp.exp(b_last)[..., None] * S
              + ein("bgrck,bgrcv->bgrkv", k[:, :, None] * jnp.exp(rest), v))
    if not outputs:
        return S_next
    qs, ks = q.reshape(B, G, n, c_, dk), k.reshape(B, G, n, c_, dk)
    m = jnp.arange(n)
    # off-diagonal sub-chunk blocks S < J: (Q_J o exp(p_J)) (K_S o exp(x_S + mid_{S,J}))^T
    off = (m[None, :] < m[:, None])[:, :, None, None]                      # (J, S, 1, 1)
    KD = ks[:, :, None, None] * _masked_exp(pc["x"][..., None, :, :, :] + pc["mid"][..., None, :], off)
    QD = qs[:, :, None] * jnp.exp(pc["p"])
    A = ein("bgrJji,bgrJSsi->bgrJjSs", QD, KD)
    # diagonal blocks: exp of the in-sub-chunk segment sums, s <= j
    i = jnp.arange(c_)
    F = _masked_exp(pc["diag"], (i[None, :] <= i[:, None])[:, :, None])    # (j, s, 1)
    Ad = ein("bgJji,bgJsi,bgrJjsi->bgrJjs", qs, ks, F)
    # A V block by block (off-diagonal blocks, then the diagonal ones). Assembling the whole C x C
    # matrix A and taking one product A V made XLA's CPU compiler crash (a segmentation fault in
    # the jitted backward with R = 2 heads per group and two sub-chunks, jax 0.10.2).
    vs = v.reshape(B, G, R, n, c_, v.shape[-1])
    intra = ein("bgrJjSs,bgrSsv->bgrJjv", A, vs) + ein("bgrJjs,bgrJsv->bgrJjv", Ad, vs)
    o = ein("bgrck,bgrkv->bgrcv", q[:, :, None] * jnp.exp(b), S) + intra.reshape(B, G, R, C, -1)
    return o * cfg.scale, S_next


def _sweep(cfg: _Config, Q, K, V, LA, S0, *, outputs: bool):
    """outputs=True: (h_T, o (B, G, R, Tp, dv)); False: (h_T, states (N, B, G, R, dk, dv))."""
    C = cfg.chunk_size
    N = Q.shape[2] // C

    def body(n, carry):
        S, buf = carry
        args = (_chunk(Q, n, C, 2), _chunk(K, n, C, 2), _chunk(V, n, C, 3), _chunk(LA, n, C, 3), S)
        if outputs:
            o, S_next = _chunk_fn(cfg, *args)
            return S_next, _put(buf, o, n, C, 3)
        return _chunk_fn(cfg, *args, outputs=False), lax.dynamic_update_index_in_dim(buf, S, n, 0)

    buf = jnp.zeros(V.shape if outputs else (N,) + S0.shape, S0.dtype)
    return lax.fori_loop(0, N, body, (S0, buf))


def _backward(cfg: _Config, prepared, do, dh_T):
    """The grouped, padded (dS0, dQ, dK, dV, dLA) (``_chunks._residual_free``)."""
    Q, K, V, LA, S0, T, cdt, _ = prepared
    B, G, R, dk, dv = S0.shape
    C = cfg.chunk_size
    N = Q.shape[2] // C
    _, states = _sweep(cfg, Q, K, V, LA, S0, outputs=False)
    DO = c.pad_time(c.v_like_to_grouped(do, G, cfg.layout, cdt), 3, N * C)

    def body(j, carry):
        dS, dQ, dK, dV, dLA = carry
        n = N - 1 - j
        args = (_chunk(Q, n, C, 2), _chunk(K, n, C, 2), _chunk(V, n, C, 3), _chunk(LA, n, C, 3),
                lax.dynamic_index_in_dim(states, n, 0, keepdims=False))
        _, pull = jax.vjp(partial(_chunk_fn, cfg), *args)
        dq, dk, dv_, dla, dS_prev = pull((_chunk(DO, n, C, 3), dS))
        return (dS_prev, _put(dQ, dq, n, C, 2), _put(dK, dk, n, C, 2), _put(dV, dv_, n, C, 3),
                _put(dLA, dla, n, C, 3))

    init = (dh_T.astype(cdt).reshape(B, G, R, dk, dv), jnp.zeros(Q.shape, cdt),
            jnp.zeros(K.shape, cdt), jnp.zeros(V.shape, cdt), jnp.zeros(LA.shape, cdt))
    return lax.fori_loop(0, N, body, init)


chunked_vector_core = _residual_free(_sweep, _backward)
