"""The scan kernel: the gated delta rule step by step with ``lax.scan``, and its reverse-time
adjoint as a residual-free ``jax.custom_vjp`` (docs/math_delta.md, sections 1 and 2):

    S~_t = A_t S_{t-1}          A_t = exp(log_alpha_t), or diag(exp(log_alpha_t)) (vector gate)
    r_t  = v_t - S~_t^T k_t     u_t = beta_t r_t
    S_t  = S~_t + k_t u_t^T     o_t = scale * S_t^T q_t          h_T = S_T

Backward, with C_t = dL/dS_t from the later steps (C_T = dh_T):

    G_t          = C_t + scale * q_t do_t^T        dq_t = scale * S_t do_t
    du_t         = G_t^T k_t                       dv_t = beta_t du_t      dbeta_t = r_t . du_t
    dk_t         = G_t u_t - beta_t S~_t du_t      dS~_t = G_t - beta_t k_t du_t^T
    dlog_alpha_t = <S~_t, dS~_t> (per row i for a vector gate)
    C_{t-1}      = A_t dS~_t                       dh0 = C_0

dq and dk are summed over the heads of a group. Nothing is saved from the forward but the
inputs themselves. The backward first sweeps forward again keeping one state every n steps
(n = ``checkpoint_every``, by default ceil(sqrt(T))), then walks the blocks of n steps in reverse:
it recomputes the n states of a block from the block's checkpoint and runs the adjoint over them.
A step is never inverted (I - beta k k^T is singular at beta |k|^2 = 1). Memory: B*H*(T/n + n)
states of dk*dv numbers during the backward, none between the forward and the backward.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from ..._inputs import check_scale
from ...kernels import _common as kc
from . import _common as c


def _ein(cfg):
    return partial(jnp.einsum, precision=cfg.precision)


def _decay(la_t):
    """A_t as a factor broadcastable against a state (B, G, R, dk, dv)."""
    a = jnp.exp(la_t)
    return a[..., None] if la_t.ndim == 4 else a[..., None, None]


def _step(cfg, S, xs):
    """One step for every (batch, head): (S~_t, r_t, u_t, S_t)."""
    ein = _ein(cfg)
    q_t, k_t, v_t, b_t, la_t = xs     # (B,G,dk), (B,G,dk), (B,G,R,dv), (B,G,R), (B,G,R[,dk])
    St = _decay(la_t) * S
    r = v_t - ein("bgk,bgrkv->bgrv", k_t, St)
    u = b_t[..., None] * r
    return St, r, u, St + ein("bgk,bgrv->bgrkv", k_t, u)


def _time_major(q, k, v, beta, la):
    """The grouped arrays with time first, for ``lax.scan``."""
    return (jnp.moveaxis(q, 2, 0), jnp.moveaxis(k, 2, 0), jnp.moveaxis(v, 3, 0),
            jnp.moveaxis(beta, 3, 0), jnp.moveaxis(la, 3, 0))


def _blocks(xs, n: int):
    """Time-major arrays (Tp, ...) -> (Tp // n, n, ...)."""
    return jax.tree_util.tree_map(lambda x: x.reshape((x.shape[0] // n, n) + x.shape[1:]), xs)


def _forward(cfg, q, k, v, beta, la, S0):
    ein = _ein(cfg)

    def step(S, xs):
        S = _step(cfg, S, xs)[3]
        return S, ein("bgk,bgrkv->bgrv", xs[0], S) * cfg.scale

    h_T, O = lax.scan(step, S0, _time_major(q, k, v, beta, la))
    return jnp.moveaxis(O, 0, 3), h_T


def _backward(cfg, q, k, v, beta, la, S0, dO, dh_T):
    """The grouped, padded (dq, dk, dv, dbeta, dlog_alpha, dS0) (``_common.residual_free``)."""
    ein = _ein(cfg)
    n = cfg.steps
    xs = _blocks(_time_major(q, k, v, beta, la), n)
    dOs = _blocks(jnp.moveaxis(dO, 3, 0), n)

    # Sweep 1: the state before each block.
    def block_fwd(S, xb):
        return lax.scan(lambda S_, x: (_step(cfg, S_, x)[3], None), S, xb)[0], S

    _, checkpoints = lax.scan(block_fwd, S0, xs)

    def adjoint(Cc, inp):
        """One step back: from C_t to C_{t-1} and the step's gradients."""
        S_prev, x, do_t = inp
        q_t, k_t, v_t, b_t, la_t = x
        St, r, u, S_t = _step(cfg, S_prev, x)
        G_t = Cc + cfg.scale * ein("bgk,bgrv->bgrkv", q_t, do_t)
        dq = cfg.scale * ein("bgrkv,bgrv->bgk", S_t, do_t)
        du = ein("bgrkv,bgk->bgrv", G_t, k_t)
        bdu = b_t[..., None] * du
        dbeta = jnp.sum(r * du, axis=-1)
        dk = ein("bgrkv,bgrv->bgk", G_t, u) - ein("bgrkv,bgrv->bgk", St, bdu)
        dSt = G_t - ein("bgk,bgrv->bgrkv", k_t, bdu)
        dla = jnp.sum(St * dSt, axis=(-2, -1) if la_t.ndim == 3 else -1)
        return _decay(la_t) * dSt, (dq, dk, bdu, dbeta, dla)

    # Sweep 2: blocks in reverse; each recomputes its states from its checkpoint.
    def block_bwd(Cc, inp):
        S_in, xb, dob = inp
        _, S_prevs = lax.scan(lambda S_, x: (_step(cfg, S_, x)[3], S_), S_in, xb)
        return lax.scan(adjoint, Cc, (S_prevs, xb, dob), reverse=True)

    dS0, grads = lax.scan(block_bwd, dh_T, (checkpoints, xs, dOs), reverse=True)
    flat = [g.reshape((-1,) + g.shape[2:]) for g in grads]    # (Tp, ...) time-major
    dq, dk, dv, dbeta, dla = flat
    return (jnp.moveaxis(dq, 0, 2), jnp.moveaxis(dk, 0, 2), jnp.moveaxis(dv, 0, 3),
            jnp.moveaxis(dbeta, 0, 3), jnp.moveaxis(dla, 0, 3), dS0)


_core = c.residual_free(_forward, _backward)


def scan(q, k, v, beta, log_alpha, h0=None, *, layout: str = "bhtd", scale: float = 1.0,
         precision=None, checkpoint_every: int | None = None, return_final_state: bool = False,
         cu_seqlens=None):
    """The gated delta rule by ``lax.scan`` over time, with the reverse-time adjoint as its
    ``jax.custom_vjp`` (module docstring).

    Same shapes, semantics, dtypes, ``precision`` and ``cu_seqlens`` as
    :func:`glaref.delta.kernels.chunked`. ``checkpoint_every``: the backward's block of steps
    between kept states, None for ceil(sqrt(T)), or a positive int.
    """
    layout = kc.check_layout(layout)
    if cu_seqlens is not None:
        return c.run_packed(scan, cu_seqlens, q, k, v, beta, log_alpha, h0, layout=layout,
                            return_final_state=return_final_state, scale=scale,
                            precision=precision, checkpoint_every=checkpoint_every)
    B, G, H, T, dk, dv = c.check_inputs(q, k, v, beta, log_alpha, h0, layout)
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool)
                                         or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every: got {checkpoint_every!r}, expected None or a "
                         "positive int")
    n = checkpoint_every or max(1, math.isqrt(max(T - 1, 0)) + 1)
    cfg = c.Config(n, layout, kc.check_precision(precision), check_scale(scale), G)
    o, h_T = _core(cfg, q, k, v, beta, log_alpha, h0)
    return (o, h_T) if return_final_state else o
