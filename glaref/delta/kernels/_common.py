"""What both delta-rule kernels share: validation (the scalar family's checks plus beta), the
move to grouped arrays in the compute dtype, and packed sequences.

Inside the kernels every array is "bhtd" with the heads split into (group, head in group), as in
``glaref.kernels._common``:

    q, k       (B, G, T, dk)          shared by the R = H // G heads of a group
    v, o, do   (B, G, R, T, dv)
    beta       (B, G, R, T)
    log_alpha  (B, G, R, T)           scalar gate (GDN)
               (B, G, R, T, dk)       vector gate (KDA)
    h0, h_T    (B, G, R, dk, dv)

Each kernel is a ``jax.custom_vjp`` (``residual_free``) whose residuals are the caller's inputs
themselves: the forward and the backward each group, cast and pad them (``prepare``), and the
gradients go back to the caller's layout and dtypes at the end of the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ..._errors import ShapeError
from ...kernels import _common as kc


def check_inputs(q, k, v, beta, log_alpha, h0, layout: str,
                 n_states: int | None = None) -> tuple[int, int, int, int, int, int]:
    """Validate every array in the caller's layout; return (B, G, H, T, dk, dv). beta has the
    shape of a scalar gate: (B, H, T) in "bhtd", (B, T, H) in "bthd"."""
    dims = kc.check_inputs(q, k, v, log_alpha, h0, layout, n_states)
    B, G, H, T, dk, dv = dims
    if beta is None:
        raise ShapeError("beta: got None, expected an array")
    kc._check_float(beta, "beta")
    want, spell = ((B, H, T), "(B, H, T)") if layout == "bhtd" else ((B, T, H), "(B, T, H)")
    if tuple(beta.shape) != want:
        raise ShapeError(f"beta: got shape {tuple(beta.shape)}, expected {want} {spell} like a "
                         "scalar gate")
    return dims


def dtypes(q, k, v, beta, log_alpha, h0):
    """(compute dtype, dtype of o): the promotion of every input, at least float32; o in the
    promotion of q, k and v (as ``glaref.kernels``)."""
    arrays = [x for x in (q, k, v, beta, log_alpha, h0) if x is not None]
    cdt = jnp.promote_types(jnp.result_type(*[x.dtype for x in arrays]), jnp.float32)
    return cdt, jnp.result_type(q.dtype, k.dtype, v.dtype)


def to_grouped(q, k, v, beta, log_alpha, h0, G: int, layout: str, cdt):
    """Caller's layout -> grouped "bhtd" arrays in the compute dtype; h0 None -> zeros."""
    if layout == "bthd":
        beta = jnp.swapaxes(beta, 1, 2)
    B, H, T = beta.shape
    qg, kg, vg, lag, S0 = kc.to_grouped(q, k, v, log_alpha, h0, G, layout, cdt)
    return qg, kg, vg, beta.astype(cdt).reshape(B, G, H // G, T), lag, S0


def pad(q, k, v, beta, log_alpha, Tp: int):
    """Zero-pad the grouped arrays' time axis to Tp. A padding step (beta = 0, log_alpha = 0,
    q = k = v = 0) leaves the state unchanged and has o = 0, so it changes no output and no
    gradient of a real step."""
    return (kc.pad_time(q, 2, Tp), kc.pad_time(k, 2, Tp), kc.pad_time(v, 3, Tp),
            kc.pad_time(beta, 3, Tp), kc.pad_time(log_alpha, 3, Tp))


@dataclass(frozen=True)
class Config:
    """A kernel's static configuration: ``steps`` (the scan's checkpoint block, the chunked
    kernel's chunk size: T is padded to a multiple of it), layout, precision, scale, G."""

    steps: int
    layout: str
    precision: object
    scale: float
    G: int


def prepare(cfg: Config, q, k, v, beta, log_alpha, h0):
    """The inputs grouped, in the compute dtype, padded to a multiple of ``cfg.steps`` (at least
    one block): (q, k, v, beta, log_alpha, S0, T, compute dtype, output dtype)."""
    cdt, odt = dtypes(q, k, v, beta, log_alpha, h0)
    qg, kg, vg, bg, lag, S0 = to_grouped(q, k, v, beta, log_alpha, h0, cfg.G, cfg.layout, cdt)
    T = qg.shape[2]
    Tp = max(-(-T // cfg.steps), 1) * cfg.steps
    return (*pad(qg, kg, vg, bg, lag, Tp), S0, T, cdt, odt)


def residual_free(forward, backward):
    """The ``jax.custom_vjp`` core (cfg, q, k, v, beta, log_alpha, h0) -> (o, h_T), in the
    caller's layout and dtypes, of a kernel whose residuals are its inputs themselves.

    ``forward(cfg, q, k, v, beta, log_alpha, S0) -> (O, h_T)`` and ``backward(cfg, q, k, v,
    beta, log_alpha, S0, dO, dh_T) -> (dq, dk, dv, dbeta, dlog_alpha, dS0)`` work on the
    grouped, padded arrays of ``prepare``; the backward prepares the inputs again."""

    def run(cfg: Config, q, k, v, beta, log_alpha, h0):
        *xs, T, _, odt = prepare(cfg, q, k, v, beta, log_alpha, h0)
        O, h_T = forward(cfg, *xs)
        o = kc.v_like_from_grouped(O[:, :, :, :T], cfg.layout).astype(odt)
        return o, kc.state_from_grouped(h_T)

    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def core(cfg: Config, q, k, v, beta, log_alpha, h0):
        return run(cfg, q, k, v, beta, log_alpha, h0)

    def fwd(cfg: Config, q, k, v, beta, log_alpha, h0):
        return run(cfg, q, k, v, beta, log_alpha, h0), (q, k, v, beta, log_alpha, h0)

    def bwd(cfg: Config, res, cts):
        q, k, v, beta, log_alpha, h0 = res
        *xs, T, cdt, _ = prepare(cfg, q, k, v, beta, log_alpha, h0)
        do, dh_T = cts
        S0 = xs[-1]
        dO = kc.pad_time(kc.v_like_to_grouped(do, cfg.G, cfg.layout, cdt), 3, xs[0].shape[2])
        dS = dh_T.astype(cdt).reshape(S0.shape)
        dq, dk, dv, db, dla, dS0 = backward(cfg, *xs, dO, dS)
        lay = cfg.layout
        return (kc.qk_from_canonical(dq[:, :, :T], lay).astype(q.dtype),
                kc.qk_from_canonical(dk[:, :, :T], lay).astype(k.dtype),
                kc.v_like_from_grouped(dv[:, :, :, :T], lay).astype(v.dtype),
                kc.gate_from_grouped(db[:, :, :, :T], lay).astype(beta.dtype),
                kc.gate_from_grouped(dla[:, :, :, :T], lay).astype(log_alpha.dtype),
                None if h0 is None else kc.state_from_grouped(dS0).astype(h0.dtype))

    core.defvjp(fwd, bwd)
    return core


def run_packed(fn, cu_seqlens, q, k, v, beta, log_alpha, h0, *, layout: str,
               return_final_state: bool, **kw):
    """``fn`` (a delta kernel) on the N packed sequences of ``cu_seqlens`` (checked here, with
    the inputs and h0's N states), run as a batch of N rows zero-padded to the longest
    (``glaref.kernels._common.run_packed``, with beta)."""
    B, _, _, T, _, _ = check_inputs(q, k, v, beta, log_alpha, None, layout)
    cu = kc.static_cu_seqlens(cu_seqlens, B, T)
    check_inputs(q, k, v, beta, log_alpha, h0, layout, n_states=len(cu) - 1)
    T = q.shape[2 if layout == "bhtd" else 1]
    ax = 2 if layout == "bhtd" else 1
    lens = np.diff(cu)
    N = len(lens)
    H, dv = (v.shape[1], v.shape[3]) if layout == "bhtd" else (v.shape[2], v.shape[3])
    if N == 0:   # no sequence: o is empty and there is no state
        cdt, odt = dtypes(q, k, v, beta, log_alpha, h0)
        o = jnp.zeros(v.shape, odt)
        return (o, jnp.zeros((0, H, q.shape[3], dv), cdt)) if return_final_state else o
    L = int(lens.max())
    j = np.arange(L)
    idx = np.where(j[None, :] < lens[:, None], cu[:-1, None] + j[None, :], T)
    back = np.concatenate([n * L + np.arange(m) for n, m in enumerate(lens)] + [np.zeros(0, int)])
    batch = [kc._to_batch(x, ax, idx, N, L) for x in (q, k, v, beta, log_alpha)]
    o, h_T = fn(*batch, h0, layout=layout, return_final_state=True, **kw)
    o = kc._from_batch(o, ax, back)
    return (o, h_T) if return_final_state else o
