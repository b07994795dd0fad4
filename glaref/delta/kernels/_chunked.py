"""The chunked kernel in the WY / UT form: everything that does not depend on the state computed
for all chunks at once, then the states passed from chunk to chunk.

Within chunk n (C steps; the last one zero-padded with beta = 0, which changes nothing), per head,
with S the state before the chunk, rows q_i, k_i (dk), v_i (dv), b_i the cumulative log gate of
the chunk's steps 0..i (a vector of dk numbers for a vector gate) and, for j <= i,

    E_ij = exp(b_i - b_j)                          (scalar; per key dimension for a vector gate)
    A_ij = sum_d q_i[d] k_j[d] E_ij[d]             (j <= i, else 0)
    L_ij = beta_i sum_d k_i[d] k_j[d] E_ij[d]      (j < i, else 0: strictly lower)

the decay-first recurrence (docs/math_delta.md, section 1) unrolls, within the chunk, to
u_i + sum_{j < i} L_ij u_j = beta_i (v_i - (k_i o exp(b_i)) S), a unit lower triangular system:

    (I + L) U = diag(beta) V - diag(beta) (K o exp(b)) S

so with T = (I + L)^-1 (formed row by row by forward substitution, T_i = e_i - sum_{j<i}
L_ij T_j, as the field's kernels do):

    W = T diag(beta) (K o exp(b))        U~ = T diag(beta) V        U = U~ - W S
    O = scale * ( (Q o exp(b)) S + A U )
    S_next = exp(b_last) S + (K o exp(b_last - b))^T U          (diag(exp(b_last)) for vectors)

(docs/math_delta.md, section 8). Every exponent is a sum of log gates over a segment inside one
chunk, b_i - b_j = sum_{j < s <= i} log_alpha_s summed directly (``glaref.kernels._chunked`` for
the scalar gate; a (C, C, C) 0/1 contraction for the vector gate), never exp(b_i) / exp(b_j), so
strong decay underflows instead of overflowing; the masked entries never reach exp.

Two phases: T, W, U~, A, Q o exp(b) and K o exp(b_last - b) of every chunk at once (batched
over chunks; a vector gate's (C, C, dk) decays one chunk at a time), then a ``lax.scan`` over
the chunks for U = U~ - W S, o and S_next.

Backward (``jax.custom_vjp``): nothing is saved from the forward but the inputs themselves. The
backward recomputes the forward from them and differentiates it with JAX's autodiff (through
the scan over chunks), except for two hand-written pieces: the inverse T, whose vjp is
dL = strictly_lower(-T^T dT T^T) (autodiff of the substitution loop would keep a copy of T per
row), and the vector gate's decays, recomputed per chunk (``jax.checkpoint``). The gradients
are exact derivatives of the chunked formulas, in the direct form (dlog_alpha from the decay
factors themselves, no reverse cumulative sum). Memory during the backward: per chunk the state,
T, A, W, U~ and U (B*H*(T/C)*dk*dv + B*H*T*(2C + 2dk + 2dv) numbers); nothing between the
forward and the backward.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from ..._inputs import check_scale
from ...kernels import _common as kc
from ...kernels._chunked import _decays
from ...kernels._chunked_vector import _gate_sums, sub_chunk
from ...kernels._chunks import _GATE_PRECISION
from . import _common as c


def _vector_decays(la):
    """E (B, G, R, C, C, dk) of one chunk's vector gates la (B, G, R, C, dk): E[i, j] =
    exp(sum_{j < s <= i} la_s) for j <= i, else 0.

    The exponents come from the sub-chunk pieces of ``glaref.kernels._chunked_vector``
    (sub-chunks of c = ``sub_chunk(C)`` steps): for i in sub-chunk J and j in an earlier one S,
    p_J[i] + mid_{J,S} + x_S[j] (the gates of J up to i, of the sub-chunks between, of S after
    j: segment sums, never a difference of two cumulative sums); within one sub-chunk the
    segment sum itself. C^2 dk work per chunk instead of the C^3 dk of one (C, C, C) contraction."""
    B, G, R, C, dk = la.shape
    c_ = sub_chunk(C)
    n = C // c_
    pc = _gate_sums(la, c_, full=True)[3]
    m, i = jnp.arange(n), jnp.arange(c_)
    before = (m[:, None] > m[None, :])[:, None, :, None, None]              # (J, 1, S, 1, 1)
    expo = (pc["p"][..., :, :, None, None, :] + pc["mid"][..., :, None, :, None, :]
            + pc["x"][..., None, None, :, :, :])                           # (J, i, S, j, dk)
    off = jnp.where(before, jnp.exp(jnp.where(before, expo, 0.0)), 0.0)
    lower = (i[:, None] >= i[None, :])[:, :, None]                          # (i, j, 1)
    diag = jnp.where(lower, jnp.exp(jnp.where(lower, pc["diag"], 0.0)), 0.0)  # (J, i, j, dk)
    same = (m[:, None] == m[None, :]).astype(la.dtype)[:, None, :, None, None]
    E = off + same * diag[..., :, :, None, :, :]
    return E.reshape(B, G, R, C, C, dk)


def _substitute(precision, L):
    """(I + L)^-1 for strictly lower L (..., b, b), by forward substitution over the rows:
    T[i] = e_i - sum_{j < i} L[i, j] T[j] (rows j >= i of T are still e_j, and L[i, j >= i] = 0)."""
    b = L.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(b, dtype=L.dtype), L.shape)

    def row(i, T):
        Li = lax.dynamic_index_in_dim(L, i, -2, keepdims=True)           # (..., 1, b)
        Ti = lax.dynamic_index_in_dim(eye, i, -2, keepdims=True) - jnp.matmul(
            Li, T, precision=precision)
        return lax.dynamic_update_index_in_dim(T, Ti, i, -2)

    return lax.fori_loop(1, b, row, eye)


def _unit_lower_inverse_rows(precision, L):
    """(I + L)^-1 for strictly lower L (..., C, C), blockwise as the field's kernels do: the
    n diagonal blocks of b = ``sub_chunk(C)`` rows by substitution (``_substitute``), then block
    row after block row, T_I = Td_I (E_I - L_{I, <I} T_{<I}) (E_I: rows I of the identity)."""
    C = L.shape[-1]
    b = sub_chunk(C)
    n = C // b
    lead = L.shape[:-2]
    Lbb = jnp.swapaxes(L.reshape(lead + (n, b, n, b)), -3, -2)         # [I, J, i, j]
    Td = _substitute(precision, jnp.moveaxis(jnp.diagonal(Lbb, axis1=-4, axis2=-3), -1, -3))
    if n == 1:
        return Td[..., 0, :, :]
    block = jnp.arange(C) // b
    Loff = jnp.where(block[:, None] > block[None, :], L, 0.0)         # L_{I, <I}
    eye_n = jnp.eye(n, dtype=L.dtype)
    T = jnp.swapaxes(Td[..., :, None, :, :] * eye_n[:, :, None, None], -3, -2).reshape(L.shape)
    for I in range(1, n):
        rows = slice(I * b, (I + 1) * b)
        R = jnp.matmul(Loff[..., rows, :], T, precision=precision)      # L_{I, <I} T_{<I}
        if b > 1:
            R = jnp.matmul(Td[..., I, :, :], R, precision=precision)
        T = T.at[..., rows, :].set(T[..., rows, :] - R)                   # Td_I E_I - Td_I R
    return T


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _unit_lower_inverse(precision, L):
    """T = (I + L)^-1 for strictly lower L, with the vjp dL = strictly_lower(-T^T dT T^T)
    (autodiff of the substitution loop would keep a copy of T per row)."""
    return _unit_lower_inverse_rows(precision, L)


def _inverse_fwd(precision, L):
    T = _unit_lower_inverse_rows(precision, L)
    return T, T


def _inverse_bwd(precision, T, dT):
    Tt = jnp.swapaxes(T, -1, -2)
    dM = -jnp.matmul(jnp.matmul(Tt, dT, precision=precision), Tt, precision=precision)
    C = T.shape[-1]
    return (jnp.where(jnp.arange(C)[:, None] > jnp.arange(C)[None, :], dM, 0.0),)


_unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def _vector_pairs(cfg: c.Config, q, k, la):
    """A and K-K products of every chunk for a vector gate, one chunk at a time (the (C, C, dk)
    decays of one chunk only; recomputed in the backward, ``jax.checkpoint``).
    q, k (B, G, N, C, dk); la (B, G, R, N, C, dk) -> (Aqk, Akk) (B, G, R, N, C, C)."""

    @jax.checkpoint
    def one(xs):
        qn, kn, lan = xs                                   # (B,G,C,dk), (B,G,C,dk), (B,G,R,C,dk)
        E = _vector_decays(lan)
        ein = partial(jnp.einsum, precision=cfg.precision)
        return (ein("bgid,bgjd,bgrijd->bgrij", qn, kn, E),
                ein("bgid,bgjd,bgrijd->bgrij", kn, kn, E))

    Aqk, Akk = lax.map(one, (jnp.moveaxis(q, 2, 0), jnp.moveaxis(k, 2, 0), jnp.moveaxis(la, 3, 0)))
    return jnp.moveaxis(Aqk, 0, 3), jnp.moveaxis(Akk, 0, 3)


def _intra(cfg: c.Config, q, k, v, beta, la):
    """Everything that does not depend on the state, for all chunks at once (chunk-major arrays:
    q, k (B, G, N, C, dk); v (B, G, R, N, C, dv); beta (B, G, R, N, C); la (B, G, R, N, C[, dk])):
    Q o exp(b), K o exp(b_last - b), exp(b_last), A, W and U~ (module docstring)."""
    ein = partial(jnp.einsum, precision=cfg.precision)
    C = q.shape[3]
    qh, kh = q[:, :, None], k[:, :, None]                 # broadcast over the R heads
    if la.ndim == 5:                                      # scalar gate: E_ij = D_ij
        eb, eb_rest, eb_last, D = _decays(la)
        eb, eb_rest = eb[..., None], eb_rest[..., None]
        Akk = ein("bgnik,bgnjk->bgnij", k, k)[:, :, None] * D
        Aqk = ein("bgnik,bgnjk->bgnij", q, k)[:, :, None] * D
    else:                                                 # vector gate
        b = jnp.einsum("...sd,si->...id", la, _incl(C, la.dtype), precision=_GATE_PRECISION)
        rest = jnp.einsum("...sd,sj->...jd", la, _after(C, la.dtype), precision=_GATE_PRECISION)
        eb, eb_rest, eb_last = jnp.exp(b), jnp.exp(rest), jnp.exp(b[..., -1, :])
        Aqk, Akk = _vector_pairs(cfg, q, k, la)
    strict = jnp.arange(C)[:, None] > jnp.arange(C)[None, :]
    T = _unit_lower_inverse(cfg.precision, jnp.where(strict, beta[..., :, None] * Akk, 0.0))
    W = ein("bgrnij,bgrnjk->bgrnik", T, beta[..., None] * (kh * eb))
    U0 = ein("bgrnij,bgrnjv->bgrniv", T, beta[..., None] * v)
    return qh * eb, kh * eb_rest, eb_last, Aqk, W, U0


def _incl(C: int, dt):
    i = jnp.arange(C)
    return (i[:, None] <= i[None, :]).astype(dt)          # incl[s, i] = [s <= i]


def _after(C: int, dt):
    i = jnp.arange(C)
    return (i[:, None] > i[None, :]).astype(dt)           # after[s, j] = [s > j]


def _forward(cfg: c.Config, Q, K, V, BT, LA, S0):
    """(O (B, G, R, Tp, dv), h_T) from the grouped arrays padded to N chunks of C steps."""
    ein = partial(jnp.einsum, precision=cfg.precision)
    C = cfg.steps
    B, G, R, Tp, dv = V.shape
    N = Tp // C
    split = lambda x, ax: x.reshape(x.shape[:ax] + (N, C) + x.shape[ax + 1:])  # noqa: E731
    QG, KR, eb_last, Aqk, W, U0 = _intra(cfg, split(Q, 2), split(K, 2), split(V, 3), split(BT, 3),
                                         split(LA, 3))
    vector = LA.ndim == 5

    def step(S, xs):
        qg, kr, el, a, w, u0 = xs
        U = u0 - ein("bgrik,bgrkv->bgriv", w, S)
        o = ein("bgrik,bgrkv->bgriv", qg, S) + ein("bgrij,bgrjv->bgriv", a, U)
        decay = el[..., None] if vector else el[..., None, None]
        return decay * S + ein("bgrjk,bgrjv->bgrkv", kr, U), o * cfg.scale

    xs = tuple(jnp.moveaxis(x, 3, 0) for x in (QG, KR, eb_last, Aqk, W, U0))
    h_T, O = lax.scan(step, S0, xs)
    return jnp.moveaxis(O, 0, 3).reshape(B, G, R, Tp, dv), h_T


def _backward(cfg: c.Config, Q, K, V, BT, LA, S0, dO, dh_T):
    """The grouped, padded gradients (``_common.residual_free``): JAX's autodiff of the chunked
    forward, recomputed here from the inputs."""
    _, pull = jax.vjp(partial(_forward, cfg), Q, K, V, BT, LA, S0)
    dQ, dK, dV, dB, dLA, dS0 = pull((dO, dh_T))
    return dQ, dK, dV, dB, dLA, dS0


_core = c.residual_free(_forward, _backward)


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
        return c.run_packed(chunked, cu_seqlens, q, k, v, beta, log_alpha, h0, layout=layout,
                            return_final_state=return_final_state, chunk_size=chunk_size,
                            scale=scale, precision=precision)
    B, G, H, T, dk, dv = c.check_inputs(q, k, v, beta, log_alpha, h0, layout)
    cfg = c.Config(int(chunk_size), layout, kc.check_precision(precision), check_scale(scale), G)
    o, h_T = _core(cfg, q, k, v, beta, log_alpha, h0)
    return (o, h_T) if return_final_state else o
