"""Kernels of the gated delta rule for the audit's tests: correct ones (the zoo) and mutants,
each with one bug of the kinds the field has shipped. All take
``(q, k, v, beta, log_alpha, h0, scale=1.0) -> (o, h_T)`` in "bhtd", scalar gates.

Two small JAX forms written here, differentiated by ``jax.vjp``: ``scan_autodiff`` (the
recurrence step by step, decay first) and ``chunked_autodiff`` (the WY / UT chunked form: per
chunk of C steps, (I + strictly-lower(diag(beta) (K K^T o D))) U = diag(beta) (V - diag(e^b) K S0),
then o and the next state from U), each with a switch that plants one bug; and wrappers of
``glaref.delta.kernels`` whose ``jax.custom_vjp`` backward is perturbed.

    S~_t = alpha_t S_{t-1};  u_t = beta_t (v_t - S~_t^T k_t);  S_t = S~_t + k_t u_t^T;
    o_t = scale S_t^T q_t
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from glaref.delta import kernels

HIGHEST = lax.Precision.HIGHEST


def _heads(x, H):
    """q or k (B, G, T, dk) repeated to H heads, head h reading group h // (H // G)."""
    return jnp.repeat(x, H // x.shape[1], axis=1)


def _bf16(x):
    """x rounded to bfloat16 in the forward pass, the identity for the gradient."""
    return x + lax.stop_gradient(x.astype(jnp.bfloat16).astype(x.dtype) - x)


def _scanned(step, q, k, v, beta, log_alpha, h0):
    """(o, h_T) of ``step(S, (q_t, k_t, v_t, beta_t, log_alpha_t)) -> (S_t, o_t)`` run by
    lax.scan over time, heads sharing their group's q and k, in float32 at least."""
    H = v.shape[1]
    f32 = jnp.promote_types(q.dtype, jnp.float32)
    xs = tuple(jnp.moveaxis(x.astype(f32), 2, 0)
               for x in (_heads(q, H), _heads(k, H), v, beta, log_alpha))
    h_T, o = lax.scan(step, h0.astype(f32), xs)
    return jnp.moveaxis(o, 0, 2).astype(jnp.promote_types(q.dtype, v.dtype)), h_T


def scan_autodiff(q, k, v, beta, log_alpha, h0, scale=1.0, *, decay_after=False,
                  residual_bf16=False, stop_state=False, operand=None):
    """The recurrence by lax.scan, gradients by autodiff. Bugs: ``decay_after`` (the delta
    update on S_{t-1}, then the decay), ``residual_bf16`` (v - S~^T k rounded to bfloat16),
    ``stop_state`` (no gradient through S~ in the residual: the state's cotangent loses its
    (I - beta k k^T) factor). A design, not a bug, when the kernel says so: ``operand``
    (a dtype: both factors of every product, S~^T k, k u^T and S^T q, rounded to it, their
    cotangents too, as a kernel casting its float32 state and vectors before each dot does)."""
    def rnd(x):
        return x if operand is None else x.astype(operand).astype(x.dtype)

    def step(S, x):
        q_t, k_t, v_t, b_t, la_t = x
        a = jnp.exp(la_t)[..., None, None]
        S_t = S if decay_after else a * S
        S_read = lax.stop_gradient(S_t) if stop_state else S_t
        r = v_t - jnp.einsum("bhkv,bhk->bhv", rnd(S_read), rnd(k_t), precision=HIGHEST)
        if residual_bf16:
            r = _bf16(r)
        S_new = S_t + rnd(k_t)[..., :, None] * rnd(b_t[..., None] * r)[..., None, :]
        if decay_after:
            S_new = a * S_new
        return S_new, scale * jnp.einsum("bhkv,bhk->bhv", rnd(S_new), rnd(q_t),
                                         precision=HIGHEST)

    return _scanned(step, q, k, v, beta, log_alpha, h0)


def chunked_autodiff(q, k, v, beta, log_alpha, h0, scale=1.0, *, chunk_size=64,
                     with_diagonal=False, mask_tail=True):
    """The chunked WY / UT form, gradients by autodiff. Bugs: ``with_diagonal`` (the triangular
    system's strictly-lower mask includes the diagonal), ``mask_tail=False`` (T padded to a
    multiple of C by repeating the last step, whose padding steps then update the state)."""
    B, H, T, dv = v.shape
    C = chunk_size
    N = -(-T // C)
    pad = N * C - T
    f32 = jnp.promote_types(q.dtype, jnp.float32)
    qh, kh = _heads(q, H).astype(f32), _heads(k, H).astype(f32)
    v, beta, la = v.astype(f32), beta.astype(f32), log_alpha.astype(f32)
    mode = "constant" if mask_tail else "edge"
    padded = [jnp.pad(x, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 3), mode=mode)
              for x in (qh, kh, v, beta, la)]
    qc, kc, vc, bc, lc = (x.reshape((B, H, N, C) + x.shape[3:]) for x in padded)
    i = jnp.arange(C)
    mask = i[:, None] >= i[None, :] if with_diagonal else i[:, None] > i[None, :]
    causal = i[:, None] >= i[None, :]
    # segment[i, j, s] = [j < s <= i]: the decay between steps j and i as a sum over its own
    # segment, never a difference of cumulative sums (which cancels under strong decay)
    segment = ((i[None, :, None] < i[None, None, :]) & (i[None, None, :] <= i[:, None, None]))
    ein = functools.partial(jnp.einsum, precision=HIGHEST)

    def chunk(S, x):
        q_c, k_c, v_c, b_c, l_c = x                      # (B, H, C, ...)
        b = jnp.cumsum(l_c, axis=-1)
        seg = ein("bhs,ijs->bhij", l_c, segment.astype(f32))
        D = jnp.exp(jnp.where(causal, seg, -jnp.inf))
        A = jnp.where(mask, b_c[..., :, None] * ein("bhik,bhjk->bhij", k_c, k_c) * D, 0.0)
        rhs = b_c[..., None] * (v_c - jnp.exp(b)[..., None] * ein("bhik,bhkv->bhiv", k_c, S))
        U = jax.scipy.linalg.solve_triangular(jnp.eye(C, dtype=f32) + A, rhs, lower=True)
        o = jnp.exp(b)[..., None] * ein("bhik,bhkv->bhiv", q_c, S) + ein(
            "bhij,bhjv->bhiv", ein("bhik,bhjk->bhij", q_c, k_c) * D, U)
        last = D[..., -1, :]                             # e^{b_C - b_j}
        S_next = jnp.exp(b[..., -1])[..., None, None] * S + ein("bhjk,bhjv->bhkv",
                                                                k_c * last[..., None], U)
        return S_next, scale * o

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (qc, kc, vc, bc, lc))
    h_T, o = lax.scan(chunk, h0.astype(f32), xs)
    o = jnp.moveaxis(o, 0, 2).reshape(B, H, N * C, dv)[:, :, :T]
    return o.astype(jnp.promote_types(q.dtype, v.dtype)), h_T


# ---------------------------------------------------------------- the zoo (correct kernels)

def scan(q, k, v, beta, log_alpha, h0, scale=1.0):
    return kernels.scan(q, k, v, beta, log_alpha, h0, scale=scale, return_final_state=True)


def chunked_at(C: int):
    def chunked(q, k, v, beta, log_alpha, h0, scale=1.0):
        return kernels.chunked(q, k, v, beta, log_alpha, h0, chunk_size=C, scale=scale,
                               return_final_state=True)

    chunked.__qualname__ = f"chunked_C{C}"
    return chunked


def autodiff_chunked(q, k, v, beta, log_alpha, h0, scale=1.0):
    return chunked_autodiff(q, k, v, beta, log_alpha, h0, scale, chunk_size=64)


def autodiff_scan(q, k, v, beta, log_alpha, h0, scale=1.0):
    return scan_autodiff(q, k, v, beta, log_alpha, h0, scale)


def projected_then_decayed(q, k, v, beta, log_alpha, h0, scale=1.0):
    """The same recurrence in another exact arrangement, so that autodiff derives dbeta and
    dlog_alpha by other identities: S_t = alpha_t (S_{t-1} - k_t (beta_t S_{t-1}^T k_t)^T)
    + k_t (beta_t v_t)^T (a scalar gate commutes with the projection). dlog_alpha_t is then
    alpha_t <P_t, dS_t> with P_t the projected undecayed state (not <S~_t, (I - beta k k^T) dS_t>),
    and dbeta_t the sum of two separate terms, <k^T dS_t, v_t> - alpha_t <k^T dS_t, S_{t-1}^T k_t>
    (not <du_t, v_t - S~_t^T k_t>): different roundings, the same values."""
    def step(S, x):
        q_t, k_t, v_t, b_t, la_t = x
        read = jnp.einsum("bhkv,bhk->bhv", S, k_t, precision=HIGHEST)
        P = S - k_t[..., :, None] * (b_t[..., None] * read)[..., None, :]
        S_new = jnp.exp(la_t)[..., None, None] * P + \
            k_t[..., :, None] * (b_t[..., None] * v_t)[..., None, :]
        return S_new, scale * jnp.einsum("bhkv,bhk->bhv", S_new, q_t, precision=HIGHEST)

    return _scanned(step, q, k, v, beta, log_alpha, h0)


def bf16_operands(q, k, v, beta, log_alpha, h0, scale=1.0):
    """The scan with its matmul operands rounded to bfloat16: correct only for a kernel that
    claims ``operand_dtype="bfloat16"``."""
    return scan_autodiff(q, k, v, beta, log_alpha, h0, scale, operand=jnp.bfloat16)


# ---------------------------------------------------------------- mutants

def decay_after_update(q, k, v, beta, log_alpha, h0, scale=1.0):
    return scan_autodiff(q, k, v, beta, log_alpha, h0, scale, decay_after=True)


def residual_bf16(q, k, v, beta, log_alpha, h0, scale=1.0):
    return scan_autodiff(q, k, v, beta, log_alpha, h0, scale, residual_bf16=True)


def mask_with_diagonal(q, k, v, beta, log_alpha, h0, scale=1.0):
    return chunked_autodiff(q, k, v, beta, log_alpha, h0, scale, with_diagonal=True)


def tail_unmasked(q, k, v, beta, log_alpha, h0, scale=1.0):
    return chunked_autodiff(q, k, v, beta, log_alpha, h0, scale, mask_tail=False)


def _exact_forward(backward):
    """A kernel whose forward is glaref.delta.kernels.scan and whose backward is ``backward(
    inputs, cotangents) -> the six gradients``."""
    @jax.custom_vjp
    def kernel(q, k, v, beta, log_alpha, h0):
        return scan(q, k, v, beta, log_alpha, h0)

    def fwd(*inputs):
        return kernel(*inputs), inputs

    def bwd(inputs, ct):
        return backward(inputs, ct)

    kernel.defvjp(fwd, bwd)
    return kernel


def _state_cotangent_no_projection(inputs, ct):
    """The gradients with the state's cotangent carried back by alpha_t alone, without the
    (I - beta_t k_t k_t^T) factor."""
    return jax.vjp(lambda *x: scan_autodiff(*x, stop_state=True), *inputs)[1](ct)


def _dbeta_without_h0(inputs, ct):
    """The right gradients, but dbeta from a run with h0 = 0: its h0 path missing."""
    grads = jax.vjp(scan, *inputs)[1](ct)
    q, k, v, beta, la, h0 = inputs
    no_h0 = jax.vjp(lambda b: scan(q, k, v, b, la, jnp.zeros_like(h0)), beta)[1](ct)[0]
    return grads[:3] + (no_h0,) + grads[4:]


state_cotangent_no_projection = _exact_forward(_state_cotangent_no_projection)
dbeta_without_h0 = _exact_forward(_dbeta_without_h0)

ZOO = {"scan": scan, "chunked_C16": chunked_at(16), "chunked_C32": chunked_at(32),
       "chunked_C64": chunked_at(64), "autodiff_chunked": autodiff_chunked,
       "autodiff_scan": autodiff_scan, "projected_then_decayed": projected_then_decayed}
MUTANTS = {"decay_after_update": decay_after_update,
           "state_cotangent_no_projection": state_cotangent_no_projection,
           "dbeta_without_h0": dbeta_without_h0, "residual_bf16": residual_bf16,
           "mask_with_diagonal": mask_with_diagonal, "tail_unmasked": tail_unmasked}
