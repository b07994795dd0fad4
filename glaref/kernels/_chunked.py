"""The chunked kernel: chunk-parallel forward, residual-free hand-written backward.

The sequence is cut into chunks of C steps (the last one zero-padded: log_alpha = 0 and
q = k = v = 0 change neither o nor h_T nor any gradient). Within chunk n, with b_i the inclusive
cumulative sum of log_alpha over the chunk's steps 0..i and S_n the state before the chunk:

    o_i     = scale * ( sum_{j <= i} (q_i . k_j) exp(b_i - b_j) v_j  +  exp(b_i) q_i S_n )
    S_{n+1} = exp(b_{C-1}) S_n + sum_j exp(b_{C-1} - b_j) k_j^T v_j

Every exponent is a difference b_i - b_j with j <= i inside one chunk (b_{-1} = 0), never a
product exp(b_i) * exp(-b_j), so strong decay (log_alpha ~ -30 per step) underflows to 0 instead
of overflowing; b_i - b_j is itself summed over the segment j < s <= i (``_decays``), not
subtracted from two cumulative sums. Entries above the diagonal are masked *before* the exp
(their exponent is set to 0, then the result to 0), so no masked inf ever appears, in the
forward or the backward.

Backward (a ``jax.custom_vjp``): nothing is saved from the forward but the inputs themselves. The
backward recomputes the chunk states S_0..S_N in one forward sweep over chunks, then runs a
reverse sweep with dS_n = dL/dS_n (dS_N = dh_T):

    dS_n  = exp(b_{C-1}) dS_{n+1} + scale * sum_i exp(b_i) q_i^T do_i          (dh0 = dS_0)
    dA_ij = scale * (do_i . v_j) exp(b_i - b_j)                       (j <= i, else 0)
    dq_i  = sum_j dA_ij k_j + scale * exp(b_i) do_i S_n^T
    dk_j  = sum_i dA_ij q_i + exp(b_{C-1} - b_j) v_j dS_{n+1}^T
    dv_j  = scale * sum_{i >= j} (q_i . k_j) exp(b_i - b_j) do_i + exp(b_{C-1} - b_j) k_j dS_{n+1}

dq and dk are summed over the heads of a group. dlog_alpha uses the per-head identity
dlog_alpha_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <h_T, dh_T> (dq_s, dk_s per head),
applied chunk by chunk: the part of the sum beyond chunk n plus <h_T, dh_T> equals
<S_{n+1}, dS_{n+1}> exactly, so

    dlog_alpha_t = sum_{s >= t, s in chunk n} (q_s . dq_s - k_s . dk_s) + <S_{n+1}, dS_{n+1}>

which sums at most C terms instead of T (a float32 reverse cumsum over the whole sequence would
accumulate rounding over T steps).

Memory: the backward keeps the N chunk states (B*H*(T/C)*dk*dv numbers) between its two sweeps;
nothing is kept between the forward and the backward. Both sweeps are ``lax.fori_loop``s that
read each chunk with a strided slice of the (padded) inputs and write into preallocated outputs,
so no chunk-major copy of the inputs is made.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
from jax import lax

from .._inputs import check_scale
from . import _common as c
from ._chunked_vector import chunked_vector_core
from ._chunks import _GATE_PRECISION, _chunk, _Config, _put, _residual_free


def _gate_matrices(C: int, dtype):
    """0/1 matrices of one chunk: incl[s, i] = [s <= i] (inclusive prefix sums), after[s, j] =
    [s > j] (sums after j), seg[s, i, j] = [j < s <= i] (segment sums b_i - b_j)."""
    i = jnp.arange(C)
    incl = (i[:, None] <= i[None, :]).astype(dtype)
    after = (i[:, None] > i[None, :]).astype(dtype)
    seg = ((i[None, None, :] < i[:, None, None]) & (i[:, None, None] <= i[None, :, None]))
    return incl, after, seg.astype(dtype)


def _decays(la, *, full: bool = True):
    """From one chunk's log gates (B, G, R, C): exp(b_i), exp(b_last - b_j), exp(b_last) and (when
    ``full``) the masked intra-chunk decay matrix D_ij = exp(b_i - b_j) for j <= i, else 0.

    b_i - b_j is summed directly as sum_{j < s <= i} log_alpha_s (one dot product per entry),
    not as the difference of two cumulative sums: with strong decay b_i and b_j are large and
    close, and their difference would carry the rounding error of the large values (u * |b_i|)
    into every near-diagonal decay. Likewise b_last - b_j = sum_{s > j} log_alpha_s."""
    C = la.shape[-1]
    incl, after, seg = _gate_matrices(C, la.dtype)
    gate = partial(jnp.einsum, precision=_GATE_PRECISION)
    b = gate("...s,si->...i", la, incl)
    rest = gate("...s,sj->...j", la, after)                    # b_last - b_j
    eb, eb_rest, eb_last = jnp.exp(b), jnp.exp(rest), jnp.exp(b[..., -1])
    if not full:
        return eb, eb_rest, eb_last, None
    diff = gate("...s,sij->...ij", la, seg)                    # b_i - b_j, exactly 0 above the diagonal
    mask = jnp.arange(C)[:, None] >= jnp.arange(C)[None, :]   # j <= i
    # mask the exponent before exp: entries above the diagonal must never reach exp with a value
    # that could overflow (they are 0 by construction; the where keeps that true by design).
    D = jnp.where(mask, jnp.exp(jnp.where(mask, diff, 0.0)), 0.0)
    return eb, eb_rest, eb_last, D


def _forward_sweep(cfg: _Config, Q, K, V, LA, S0, *, outputs: bool):
    """One sweep over the chunks of the padded grouped arrays.

    outputs=True: (h_T, o (B, G, R, Tp, dv)). outputs=False: (h_T, states (N, B, G, R, dk, dv)),
    the state before each chunk."""
    ein = partial(jnp.einsum, precision=cfg.precision)
    C = cfg.chunk_size
    N = Q.shape[2] // C

    def body(n, carry):
        S, buf = carry
        q, k = _chunk(Q, n, C, 2), _chunk(K, n, C, 2)
        v, la = _chunk(V, n, C, 3), _chunk(LA, n, C, 3)
        eb, eb_rest, eb_last, D = _decays(la, full=outputs)
        # state after the chunk: k is shared by the group's heads, so fold the decay into v
        S_next = (eb_last[..., None, None] * S
                  + ein("bgck,bgrcv->bgrkv", k, eb_rest[..., None] * v))
        if not outputs:
            return S_next, lax.dynamic_update_index_in_dim(buf, S, n, 0)
        qk = ein("bgik,bgjk->bgij", q, k)
        o = (eb[..., None] * ein("bgck,bgrkv->bgrcv", q, S)
             + ein("bgrij,bgrjv->bgriv", qk[:, :, None] * D, v))
        return S_next, _put(buf, o * cfg.scale, n, C, 3)

    if outputs:
        buf = jnp.zeros(V.shape, S0.dtype)
    else:
        buf = jnp.zeros((N,) + S0.shape, S0.dtype)
    return lax.fori_loop(0, N, body, (S0, buf))


def _backward(cfg: _Config, prepared, do, dh_T):
    """Scalar gates' backward: the grouped, padded (dS0, dQ, dK, dV, dLA) (``_chunks._residual_free``)."""
    Q, K, V, LA, S0, T, cdt, _ = prepared
    G = cfg.G
    B, _, R, dk, dv = S0.shape
    prec = cfg.precision
    ein = partial(jnp.einsum, precision=prec)
    scale = cfg.scale

    # Sweep 1: recompute the chunk states from the inputs.
    h_T, states = _forward_sweep(cfg, Q, K, V, LA, S0, outputs=False)

    # Sweep 2: reverse over chunks, carrying dS_{n+1} and S_{n+1}.
    C = cfg.chunk_size
    N = Q.shape[2] // C
    DO = c.pad_time(c.v_like_to_grouped(do, G, cfg.layout, cdt), 3, N * C)
    dS_T = dh_T.astype(cdt).reshape(B, G, R, dk, dv)
    suffix = jnp.tril(jnp.ones((C, C), cdt))                    # suffix[s, t] = [s >= t]

    def body(i, carry):
        dS_next, S_next, dQ, dK, dV, dLA = carry
        n = N - 1 - i
        q, k = _chunk(Q, n, C, 2), _chunk(K, n, C, 2)
        v, la, do = _chunk(V, n, C, 3), _chunk(LA, n, C, 3), _chunk(DO, n, C, 3)
        S = lax.dynamic_index_in_dim(states, n, 0, keepdims=False)
        eb, eb_rest, eb_last, D = _decays(la)
        dos = do * scale
        qk = ein("bgik,bgjk->bgij", q, k)                         # shared by the R heads
        dA = ein("bgric,bgrjc->bgrij", dos, v) * D                # dL/d(q_i . k_j), per head
        M = dA * qk[:, :, None]
        dA_group = dA.sum(axis=2)
        # inter-chunk parts, per head
        dq_inter = eb[..., None] * ein("bgriv,bgrkv->bgrik", dos, S)
        dk_inter = eb_rest[..., None] * ein("bgrjv,bgrkv->bgrjk", v, dS_next)
        dq = ein("bgij,bgjk->bgik", dA_group, k) + dq_inter.sum(axis=2)
        dk = ein("bgij,bgik->bgjk", dA_group, q) + dk_inter.sum(axis=2)
        dv_ = (ein("bgrij,bgric->bgrjc", qk[:, :, None] * D, dos)
               + eb_rest[..., None] * ein("bgjk,bgrkv->bgrjv", k, dS_next))
        # per-head q_s . dq_s - k_s . dk_s; intra parts from M = dA * (q_i . k_j)
        w = (M.sum(axis=-1) - M.sum(axis=-2)
             + jnp.sum(q[:, :, None] * dq_inter, axis=-1)
             - jnp.sum(k[:, :, None] * dk_inter, axis=-1))
        tail = jnp.sum(S_next * dS_next, axis=(-2, -1))          # <S_{n+1}, dS_{n+1}>
        # reverse cumsum within the chunk, sum_{s >= t} w_s, as a 0/1 matmul (see _GATE_PRECISION)
        dla = jnp.einsum("...s,st->...t", w, suffix, precision=_GATE_PRECISION) + tail[..., None]
        dS = eb_last[..., None, None] * dS_next + ein("bgik,bgric->bgrkc", q, eb[..., None] * dos)
        return (dS, S, _put(dQ, dq, n, C, 2), _put(dK, dk, n, C, 2), _put(dV, dv_, n, C, 3),
                _put(dLA, dla, n, C, 3))

    init = (dS_T, h_T, jnp.zeros(Q.shape, cdt), jnp.zeros(K.shape, cdt), jnp.zeros(V.shape, cdt),
            jnp.zeros(LA.shape, cdt))
    dS0, _, dQ, dK, dV, dLA = lax.fori_loop(0, N, body, init)
    return dS0, dQ, dK, dV, dLA


_chunked_core = _residual_free(_forward_sweep, _backward)


def chunked(q, k, v, log_alpha, h0=None, *, chunk_size: int = 64, layout: str = "bhtd",
            precision=None, scale: float = 1.0, return_final_state: bool = False, cu_seqlens=None):
    """Gated linear attention, chunked, with a residual-free custom backward.

    Same shapes and semantics as ``glaref.forward`` (module docstring of ``glaref.kernels``):
    q, k (B, G, T, dk); v (B, H, T, dv); log_alpha (B, H, T) (scalar gate) or (B, H, T, dk)
    (vector gate, one decay per key dimension: ``_chunked_vector``); h0 (B, H, dk, dv) or None
    (zeros), in layout "bhtd" (or the "bthd" equivalents). Returns o, shaped like v, in the
    promotion of q, k and v's dtypes; with ``return_final_state=True`` returns ``(o, h_T)`` with
    h_T (B, H, dk, dv) in the compute dtype (float32, or float64 for float64 inputs under x64).

    ``chunk_size`` C: steps per chunk (any T works; the tail is zero-padded internally).
    ``precision``: passed to every matmul (None = JAX's default, which on NVIDIA GPUs runs
    float32 matmuls as TF32; use "highest" for true float32 there).
    ``cu_seqlens``: concrete integer offsets of N packed sequences (B = 1); h0 and h_T are then
    (N, H, dk, dv) (``_common.run_packed``).
    """
    layout = c.check_layout(layout)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: got {chunk_size!r}, expected a positive int")
    if cu_seqlens is not None:
        B, _, _, T, _, _ = c.check_inputs(q, k, v, log_alpha, None, layout)
        cu = c.static_cu_seqlens(cu_seqlens, B, T)
        c.check_inputs(q, k, v, log_alpha, h0, layout, n_states=len(cu) - 1)
        return c.run_packed(chunked, cu, q, k, v, log_alpha, h0, layout=layout,
                            return_final_state=return_final_state, chunk_size=chunk_size,
                            precision=precision, scale=scale)
    B, G, H, T, dk, dv = c.check_inputs(q, k, v, log_alpha, h0, layout)
    cfg = _Config(int(chunk_size), layout, c.check_precision(precision), check_scale(scale), G)
    if log_alpha.ndim == 4:
        o, h_T = chunked_vector_core(cfg, q, k, v, log_alpha, h0)
    else:
        o, h_T = _chunked_core(cfg, q, k, v, log_alpha, h0)
    return (o, h_T) if return_final_state else o
