"""The scan kernel: the recurrence step by step with ``lax.scan``, differentiated by JAX.

    S_t = exp(log_alpha_t) S_{t-1} + k_t^T v_t        o_t = scale * q_t S_t        h_T = S_T

With vector gates (log_alpha (B, H, T, dk)) exp(log_alpha_t) scales row i of S_t by its own
decay: diag(exp(log_alpha_t)) S_{t-1}. Packed sequences (``cu_seqlens``) run as a batch of
N rows (``_common.run_packed``).

Plain autodiff of a scan saves the carried state of every step for the backward, so its
residual memory grows with B*H*T*dk*dv (gigabytes at T = 2048 with dk = dv = 128: the seed
report's scan could not run T = 8192). ``checkpoint_every=N`` wraps blocks of N steps in
``jax.checkpoint``: the backward keeps one state per block and recomputes the N states inside a
block when it gets there, so residuals grow with B*H*(T/N + N)*dk*dv instead.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from .._inputs import check_scale
from . import _common as c


def scan(q, k, v, log_alpha, h0=None, *, layout: str = "bhtd", checkpoint_every: int | None = None,
         precision=None, scale: float = 1.0, return_final_state: bool = False, cu_seqlens=None):
    """Gated linear attention by ``lax.scan`` over time, with JAX's own autodiff.

    Same shapes, semantics, dtypes, ``precision``, vector gates and ``cu_seqlens`` as
    :func:`glaref.kernels.chunked`. ``checkpoint_every``: None (plain autodiff: every step's
    state is saved for the backward) or a positive int N (rematerialise blocks of N steps in the
    backward; T need not be a multiple).
    """
    layout = c.check_layout(layout)
    if cu_seqlens is not None:
        B, _, _, T, _, _ = c.check_inputs(q, k, v, log_alpha, None, layout)
        cu = c.static_cu_seqlens(cu_seqlens, B, T)
        c.check_inputs(q, k, v, log_alpha, h0, layout, n_states=len(cu) - 1)
        return c.run_packed(scan, cu, q, k, v, log_alpha, h0, layout=layout,
                            return_final_state=return_final_state,
                            checkpoint_every=checkpoint_every, precision=precision, scale=scale)
    B, G, H, T, dk, dv = c.check_inputs(q, k, v, log_alpha, h0, layout)
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool)
                                         or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every: got {checkpoint_every!r}, expected None or a positive int")
    precision = c.check_precision(precision)
    scale = check_scale(scale)
    ein = partial(jnp.einsum, precision=precision)

    vector = log_alpha.ndim == 4
    cdt, odt = c.dtypes(q, k, v, log_alpha, h0)
    qg, kg, vg, lag, S0 = c.to_grouped(q, k, v, log_alpha, h0, G, layout, cdt)
    # R = H // G below: the heads of one group, which share its q and k

    def step(S, xs):
        q_t, k_t, v_t, la_t = xs              # (B,G,dk), (B,G,dk), (B,G,R,dv), (B,G,R[,dk])
        a = jnp.exp(la_t)
        a = a[..., None] if vector else a[..., None, None]   # per row of S, or the whole of S
        S = a * S + ein("bgk,bgrv->bgrkv", k_t, v_t)
        return S, ein("bgk,bgrkv->bgrv", q_t, S)

    # time-major for the scan
    Tp = T if checkpoint_every is None else -(-T // checkpoint_every) * checkpoint_every
    xs = (jnp.moveaxis(c.pad_time(qg, 2, Tp), 2, 0), jnp.moveaxis(c.pad_time(kg, 2, Tp), 2, 0),
          jnp.moveaxis(c.pad_time(vg, 3, Tp), 3, 0), jnp.moveaxis(c.pad_time(lag, 3, Tp), 3, 0))
    if checkpoint_every is None:
        h_T, O = lax.scan(step, S0, xs)
    else:
        n = checkpoint_every
        blocks = jax.tree_util.tree_map(lambda x: x.reshape((Tp // n, n) + x.shape[1:]), xs)

        @partial(jax.checkpoint, prevent_cse=False)
        def block(S, xb):
            return lax.scan(step, S, xb)

        h_T, O = lax.scan(block, S0, blocks)
        O = O.reshape((Tp,) + O.shape[2:])
    O = jnp.moveaxis(O[:T], 0, 3)                     # (B, G, R, T, dv)
    o = c.v_like_from_grouped(O * scale, layout).astype(odt)
    if return_final_state:
        return o, c.state_from_grouped(h_T)
    return o
