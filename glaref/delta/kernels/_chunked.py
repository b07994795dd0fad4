"""The chunked kernel in the WY / UT form: chunk-parallel within a chunk, states passed between
chunks, and a residual-free ``jax.custom_vjp`` made of per-chunk vjps.

Within chunk n (C steps; the last one zero-padded with beta = 0, which changes nothing), per head,
with S the state before the chunk, rows q_i, k_i (dk), v_i (dv), b_i the cumulative log gate of
the chunk's steps 0..i (a vector of dk numbers for a vector gate) and, for j <= i,

    E_ij = exp(b_i - b_j)                          (scalar; per key dimension for a vector gate)
    A_ij = sum_d q_i[d] k_j[d] E_ij[d]             (j <= i, else 0)
    L_ij = beta_i sum_d k_i[d] k_j[d] E_ij[d]      (j < i, else 0: strictly lower)

the decay-first recurrence (docs/math_delta.md, section 1) unrolls, within the chunk, to
u_i + sum_{j < i} L_ij u_j = beta_i (v_i - (k_i o exp(b_i)) S), a unit lower triangular system:

    (I + L) U = diag(beta) V - diag(beta) (K o exp(b)) S

so with T = (I + L)^-1 (formed by a unit lower triangular solve against I):

    W = T diag(beta) (K o exp(b))        U~ = T diag(beta) V        U = U~ - W S
    O = scale * ( (Q o exp(b)) S + A U )
    S_next = exp(b_last) S + (K o exp(b_last - b))^T U          (diag(exp(b_last)) for vectors)

(docs/math_delta.md, section 8). Every exponent is a sum of log gates over a segment inside one
chunk, b_i - b_j = sum_{j < s <= i} log_alpha_s summed directly (``glaref.kernels._chunked`` for
the scalar gate; a (C, C, C) 0/1 contraction for the vector gate), never exp(b_i) / exp(b_j), so
strong decay underflows instead of overflowing; the masked entries never reach exp.

Backward (``jax.custom_vjp``): nothing is saved from the forward but the inputs themselves. One
forward sweep recomputes the chunk states S_0..S_{N-1}; a reverse sweep over chunks then applies,
per chunk, the vjp of the chunk function (q, k, v, beta, log_alpha, S) -> (o, S_next) above, taken
by ``jax.vjp`` of that chunk alone (through the triangular solve) with the cotangents
(do, dS_next); its dS is carried to the previous chunk and dh0 = dS_0. The gradients are thereby
those of autodiff of the chunk function, in the direct form (dlog_alpha as the derivative of the
decay factors, no reverse cumulative sum). Memory: the N chunk states between the two sweeps,
and one chunk's intermediates at a time (for a vector gate, the (C, C, dk) decays of a chunk).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from ..._inputs import check_scale
from ...kernels import _common as kc
from ...kernels._chunked import _decays
from ...kernels._chunks import _GATE_PRECISION, _chunk, _put
from . import _common as c


def _vector_decays(la):
    """From one chunk's vector gates la (B, G, R, C, dk): exp(b) and exp(b_last - b) (both
    (B, G, R, C, dk)), exp(b_last) (B, G, R, dk) and E (B, G, R, C, C, dk), E[i, j] =
    exp(sum_{j < s <= i} la_s) for j <= i, else 0."""
    C = la.shape[-2]
    i = jnp.arange(C)
    dt = la.dtype
    incl = (i[:, None] <= i[None, :]).astype(dt)          # incl[s, i] = [s <= i]
    after = (i[:, None] > i[None, :]).astype(dt)          # after[s, j] = [s > j]
    seg = ((i[None, None, :] < i[:, None, None]) & (i[:, None, None] <= i[None, :, None])).astype(dt)
    gate = partial(jnp.einsum, precision=_GATE_PRECISION)
    b = gate("...sd,si->...id", la, incl)
    rest = gate("...sd,sj->...jd", la, after)
    diff = gate("...sd,sij->...ijd", la, seg)             # b_i - b_j, exactly 0 for j >= i
    mask = (i[:, None] >= i[None, :])[:, :, None]
    E = jnp.where(mask, jnp.exp(jnp.where(mask, diff, 0.0)), 0.0)
    return jnp.exp(b), jnp.exp(rest), jnp.exp(b[..., -1, :]), E


def _chunk_fn(cfg: c.Config, q, k, v, beta, la, S, *, outputs: bool = True):
    """One chunk: (o * scale, S_next), or S_next alone. q, k (B, G, C, dk); v (B, G, R, C, dv);
    beta (B, G, R, C); la (B, G, R, C[, dk]); S (B, G, R, dk, dv)."""
    ein = partial(jnp.einsum, precision=cfg.precision)
    C = q.shape[2]
    strict = jnp.arange(C)[:, None] > jnp.arange(C)[None, :]
    if la.ndim == 4:                                      # scalar gate: E_ij = D_ij
        eb, eb_rest, eb_last, D = _decays(la)
        KG = k[:, :, None] * eb[..., None]                # k_i o exp(b_i), per head
        KR = k[:, :, None] * eb_rest[..., None]           # k_j o exp(b_last - b_j)
        QG = q[:, :, None] * eb[..., None]
        Akk = ein("bgik,bgjk->bgij", k, k)[:, :, None] * D
        Aqk = ein("bgik,bgjk->bgij", q, k)[:, :, None] * D
        decay_S = eb_last[..., None, None] * S
    else:                                                 # vector gate
        eb, eb_rest, eb_last, E = _vector_decays(la)
        KG, KR, QG = k[:, :, None] * eb, k[:, :, None] * eb_rest, q[:, :, None] * eb
        Akk = ein("bgid,bgjd,bgrijd->bgrij", k, k, E)
        Aqk = ein("bgid,bgjd,bgrijd->bgrij", q, k, E)
        decay_S = eb_last[..., None] * S
    L = jnp.where(strict, beta[..., :, None] * Akk, 0.0)
    eye = jnp.broadcast_to(jnp.eye(C, dtype=L.dtype), L.shape)
    Tinv = lax.linalg.triangular_solve(jnp.eye(C, dtype=L.dtype) + L, eye, left_side=True,
                                       lower=True, unit_diagonal=True)
    W = ein("bgrij,bgrjk->bgrik", Tinv, beta[..., None] * KG)
    U = (ein("bgrij,bgrjv->bgriv", Tinv, beta[..., None] * v)
         - ein("bgrik,bgrkv->bgriv", W, S))
    S_next = decay_S + ein("bgrjk,bgrjv->bgrkv", KR, U)
    if not outputs:
        return S_next
    o = ein("bgrik,bgrkv->bgriv", QG, S) + ein("bgrij,bgrjv->bgriv", Aqk, U)
    return o * cfg.scale, S_next


def _sweep(cfg: c.Config, Q, K, V, BT, LA, S0, *, outputs: bool):
    """outputs=True: (O (B, G, R, Tp, dv), h_T); False: (states (N, B, G, R, dk, dv), h_T), the
    state before each chunk."""
    C = cfg.steps
    N = Q.shape[2] // C

    def body(n, carry):
        S, buf = carry
        args = (_chunk(Q, n, C, 2), _chunk(K, n, C, 2), _chunk(V, n, C, 3), _chunk(BT, n, C, 3),
                _chunk(LA, n, C, 3), S)
        if outputs:
            o, S_next = _chunk_fn(cfg, *args)
            return S_next, _put(buf, o, n, C, 3)
        return _chunk_fn(cfg, *args, outputs=False), lax.dynamic_update_index_in_dim(buf, S, n, 0)

    buf = jnp.zeros(V.shape if outputs else (N,) + S0.shape, S0.dtype)
    h_T, out = lax.fori_loop(0, N, body, (S0, buf))
    return out, h_T


def _backward(cfg: c.Config, Q, K, V, BT, LA, S0, dO, dh_T):
    """The grouped, padded (dq, dk, dv, dbeta, dlog_alpha, dS0) (``_common.residual_free``)."""
    C = cfg.steps
    N = Q.shape[2] // C
    states, _ = _sweep(cfg, Q, K, V, BT, LA, S0, outputs=False)

    def body(j, carry):
        dS, dQ, dK, dV, dB, dLA = carry
        n = N - 1 - j
        args = (_chunk(Q, n, C, 2), _chunk(K, n, C, 2), _chunk(V, n, C, 3), _chunk(BT, n, C, 3),
                _chunk(LA, n, C, 3), lax.dynamic_index_in_dim(states, n, 0, keepdims=False))
        _, pull = jax.vjp(partial(_chunk_fn, cfg), *args)
        dq, dk, dv, db, dla, dS_prev = pull((_chunk(dO, n, C, 3), dS))
        return (dS_prev, _put(dQ, dq, n, C, 2), _put(dK, dk, n, C, 2), _put(dV, dv, n, C, 3),
                _put(dB, db, n, C, 3), _put(dLA, dla, n, C, 3))

    zeros = [jnp.zeros_like(x) for x in (Q, K, V, BT, LA)]
    dS0, dQ, dK, dV, dB, dLA = lax.fori_loop(0, N, body, (dh_T, *zeros))
    return dQ, dK, dV, dB, dLA, dS0


_core = c.residual_free(partial(_sweep, outputs=True), _backward)


def chunked(q, k, v, beta, log_alpha, h0=None, *, chunk_size: int = 64, layout: str = "bhtd",
            scale: float = 1.0, precision=None, return_final_state: bool = False,
            cu_seqlens=None):
    """The gated delta rule, chunked in the WY / UT form, with a residual-free custom backward.

    Parameters
    ----------
    q, k : (B, G, T, dk)
    v : (B, H, T, dv), H a multiple of G (head h reads group h // (H // G))
    beta : (B, H, T)
    log_alpha : (B, H, T) scalar gate (Gated DeltaNet; zeros: DeltaNet) or (B, H, T, dk) vector
        gate (KDA)
    h0 : (B, H, dk, dv) or None (zeros)
    chunk_size : steps per chunk C (any T works; the tail is zero-padded internally)
    layout : "bhtd", or "bthd" (time before heads in q, k, v, beta, log_alpha; states unchanged)
    scale : o_t = scale * S_t^T q_t, as ``glaref.delta.forward``
    precision : passed to every matmul (None: JAX's default, TF32 for float32 on NVIDIA GPUs)
    return_final_state : return (o, h_T) instead of o
    cu_seqlens : concrete offsets of N packed sequences (B = 1); h0 and h_T are then
        (N, H, dk, dv)

    Returns
    -------
    o shaped like v in the promotion of q, k and v's dtypes; with ``return_final_state`` also h_T
    (B, H, dk, dv) in the compute dtype (the promotion of every input, at least float32).
    """
    layout = kc.check_layout(layout)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: got {chunk_size!r}, expected a positive int")
    if cu_seqlens is not None:
        B, _, _, T, _, _ = c.check_inputs(q, k, v, beta, log_alpha, None, layout)
        cu = kc.static_cu_seqlens(cu_seqlens, B, T)
        c.check_inputs(q, k, v, beta, log_alpha, h0, layout, n_states=len(cu) - 1)
        return c.run_packed(chunked, cu, q, k, v, beta, log_alpha, h0, layout=layout,
                            return_final_state=return_final_state, chunk_size=chunk_size,
                            scale=scale, precision=precision)
    B, G, H, T, dk, dv = c.check_inputs(q, k, v, beta, log_alpha, h0, layout)
    cfg = c.Config(int(chunk_size), layout, kc.check_precision(precision), check_scale(scale), G)
    o, h_T = _core(cfg, q, k, v, beta, log_alpha, h0)
    return (o, h_T) if return_final_state else o
