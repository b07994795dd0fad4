"""What the scalar- and vector-gate chunked kernels share: their configuration, the cut into
chunks of C steps (a zero-padded tail, strided slices in and out), the preparation of the inputs
(grouped, compute dtype, padded) and the residual-free ``jax.custom_vjp`` core built from a
kernel's chunk sweep and its backward (``_chunked`` for scalar gates, ``_chunked_vector`` for
vector gates)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
from jax import lax

from . import _common as c


@dataclass(frozen=True)
class _Config:
    chunk_size: int
    layout: str
    precision: object
    scale: float
    G: int


def _pad(q, k, v, log_alpha, C: int):
    """Zero-pad the grouped arrays' time axis to a multiple of C (no copy when T already is);
    T = 0 becomes one chunk of padding, which leaves h_T = h0."""
    T = q.shape[2]
    Tp = max(-(-T // C), 1) * C
    return (c.pad_time(q, 2, Tp), c.pad_time(k, 2, Tp), c.pad_time(v, 3, Tp),
            c.pad_time(log_alpha, 3, Tp))


def _chunk(x, n, C: int, axis: int):
    """Chunk n (C steps) of x along its time axis: a strided slice, no transposed copy."""
    return lax.dynamic_slice_in_dim(x, n * C, C, axis)


def _put(buf, x, n, C: int, axis: int):
    return lax.dynamic_update_slice_in_dim(buf, x, n * C, axis)


# The gate sums below are written as matmuls with 0/1 matrices (XLA lowers a cumsum to a
# reduce_window that costs C^2 adds per row and runs slowly on CPU). They are sums of log gates,
# not products of the user's data, so they always run at HIGHEST precision: a TF32 rounding of
# log_alpha would put an error of |b| * 2**-11 into every decay.
_GATE_PRECISION = lax.Precision.HIGHEST


def _prepare(cfg: _Config, q, k, v, log_alpha, h0):
    """The inputs grouped, in the compute dtype and padded to whole chunks: (Q, K, V, LA, h0,
    T, compute dtype, output dtype). Scalar and vector gates alike."""
    cdt, odt = c.dtypes(q, k, v, log_alpha, h0)
    qg, kg, vg, lag, h0g = c.to_grouped(q, k, v, log_alpha, h0, cfg.G, cfg.layout, cdt)
    T = qg.shape[2]
    Q, K, V, LA = _pad(qg, kg, vg, lag, cfg.chunk_size)
    return Q, K, V, LA, h0g, T, cdt, odt


def _forward_with(sweep, cfg: _Config, q, k, v, log_alpha, h0):
    """(o, h_T) in the caller's layout and dtypes, the chunks swept by ``sweep`` (scalar gates'
    or vector gates')."""
    Q, K, V, LA, S0, T, cdt, odt = _prepare(cfg, q, k, v, log_alpha, h0)
    h_T, O = sweep(cfg, Q, K, V, LA, S0, outputs=True)
    o = c.v_like_from_grouped(O[:, :, :, :T], cfg.layout).astype(odt)
    return o, c.state_from_grouped(h_T)


def _residual_free(sweep, backward):
    """The ``jax.custom_vjp`` core (cfg, q, k, v, log_alpha, h0) -> (o, h_T) of a chunked kernel
    whose forward sweeps the chunks with ``sweep`` and whose residuals are the inputs themselves:
    nothing computed is kept for the backward. ``backward(cfg, prepared, do, dh_T)`` gets the
    inputs as ``_prepare`` returns them and returns the grouped, padded gradients
    (dS0, dQ, dK, dV, dLA), brought back here to the caller's layout and dtypes."""

    @partial(jax.custom_vjp, nondiff_argnums=(0,))
    def core(cfg: _Config, q, k, v, log_alpha, h0):
        return _forward_with(sweep, cfg, q, k, v, log_alpha, h0)

    def fwd(cfg: _Config, q, k, v, log_alpha, h0):
        return _forward_with(sweep, cfg, q, k, v, log_alpha, h0), (q, k, v, log_alpha, h0)

    def bwd(cfg: _Config, res, cts):
        q, k, v, log_alpha, h0 = res
        prepared = _prepare(cfg, q, k, v, log_alpha, h0)
        dS0, dQ, dK, dV, dLA = backward(cfg, prepared, *cts)
        T, lay = prepared[5], cfg.layout
        return (c.qk_from_canonical(dQ[:, :, :T], lay).astype(q.dtype),
                c.qk_from_canonical(dK[:, :, :T], lay).astype(k.dtype),
                c.v_like_from_grouped(dV[:, :, :, :T], lay).astype(v.dtype),
                c.gate_from_grouped(dLA[:, :, :, :T], lay).astype(log_alpha.dtype),
                None if h0 is None else c.state_from_grouped(dS0).astype(h0.dtype))

    core.defvjp(fwd, bwd)
    return core
