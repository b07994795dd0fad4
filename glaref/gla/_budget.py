"""Error scales: the scale of every output element, from the oracle run on absolute values.

Every element of o, h_T and of each gradient is a sum of products of inputs and decay factors.
Running the same recurrence and vjp on |q|, |k|, |v|, |h0|, |do|, |dh_T| (the decay factors
exp(log_alpha) are already positive) gives, per element, the sum of the absolute values of those
terms. Rounding errors of any correct summation order are bounded by a multiple of that sum
(docs/budgets.md), so it is the natural unit of error: ``_metrics.budget_ulps`` measures errors
in units of u times it. For dlog_alpha there are two scales:

- ``log_alpha``: the direct form dlog_alpha_t = alpha_t <S_{t-1}, G_t>, i.e. the abs-vjp
  alpha_t <|S|_{t-1}, |G|_t>;
- ``log_alpha_identity``: the reverse-cumsum identity production kernels use,
  sum_{s >= t} (|q_s| . sdq_s + |k_s| . sdk_s) + <s_hT, |dh_T|>, with sdq, sdk the per-head
  abs-vjp scales of dq, dk and s_hT the scale of h_T. It is never smaller than the direct
  scale (docs/budgets.md, section 3) and under strong decay or long T it is far larger.

The verdict uses the identity scale for dlog_alpha (glaref._audit._verdict explains why).

Vector gates (log_alpha (B, H, T, dk)) and packed sequences (``cu_seqlens``) use the same
abs-value runs; with vector gates both dlog_alpha scales have log_alpha's shape, the identity's
taken per key dimension (docs/math.md, section 9.3).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _inputs
from .._inputs import _KIND, OUTPUTS, Problem
from ._oracle import _quiet, _warn_nonfinite, backend
from ._reference import _group_sum, dlog_alpha_identity


class Scales(NamedTuple):
    """Per-element error scales (float64, the caller's layout). Gradient fields are None when
    no ``do`` was given. ``log_alpha`` is the direct form's scale, ``log_alpha_identity`` the
    reverse-cumsum identity's."""

    o: np.ndarray
    h_T: np.ndarray
    q: np.ndarray | None
    k: np.ndarray | None
    v: np.ndarray | None
    log_alpha: np.ndarray | None
    h0: np.ndarray | None
    log_alpha_identity: np.ndarray | None


def problem_scales(p: Problem, scale: float = 1.0, impl: str = "numba") -> dict[str, np.ndarray]:
    """Per-element scales of canonical problem ``p``: keys o, h_T and, when ``p.do`` is given,
    q, k, v, log_alpha (direct form), h0 and log_alpha_identity. Arrays are canonical "bhtd"."""

    be = backend(impl)
    a = np.abs
    s = abs(float(scale))
    cu = p.cu_seqlens
    aq, ak, av, ah0 = a(p.q), a(p.k), a(p.v), a(p.h0)
    o, h_T = be.forward(aq, ak, av, p.log_alpha, ah0, s, cu_seqlens=cu)
    out = {"o": o, "h_T": h_T}
    if p.do is None:
        return out
    adh = None if p.dh_T is None else a(p.dh_T)
    dqh, dkh, dv, dla, dh0 = be.vjp(aq, ak, av, p.log_alpha, ah0, a(p.do), adh, s, per_head=True,
                                    cu_seqlens=cu)
    out["q"], out["k"] = _group_sum(dqh, p.dims.G), _group_sum(dkh, p.dims.G)
    out["v"], out["log_alpha"], out["h0"] = dv, dla, dh0
    # the identity's own terms in absolute value: sum_{s >= t} (|q_s| . sdq_s + |k_s| . sdk_s)
    # + <s_hT, |dh_T|>; k enters the identity with a minus sign, so -|k| makes every term
    # positive (exactly: negation commutes with rounding). Vector gates: per key dimension.
    out["log_alpha_identity"] = dlog_alpha_identity(aq, -ak, dqh, dkh, h_T, adh,
                                                    vector=p.vector_gate, cu_seqlens=cu)
    return out


def scales(q, k, v, log_alpha, h0=None, do=None, dh_T=None, *, scale=1.0, layout="bhtd",
           impl="numba", allow_nonfinite=False, cu_seqlens=None) -> Scales:
    """Per-element error scales of o, h_T and every gradient (``glaref.scales``).

    Each element is the sum of the absolute values of the terms that element adds up, from the
    recurrence and its vjp run on |q|, |k|, |v|, |h0|, |do|, |dh_T|. A correct kernel's error on
    an element is a small multiple of u * scale (docs/budgets.md).

    Parameters
    ----------
    q, k, v, log_alpha, h0, do, dh_T, scale, layout, impl, allow_nonfinite, cu_seqlens
        As for ``glaref.vjp`` (vector gates and packed sequences included); ``do=None``: only
        the forward's scales.

    Returns
    -------
    Scales
        float64 scales of o, h_T, the gradients (q, k, v, log_alpha, h0; log_alpha the direct
        form's) and log_alpha_identity (the reverse-cumsum identity's), o and the gradients in
        the caller's layout, dlog_alpha's of log_alpha's shape; the gradients' fields are None
        without ``do``.

    Raises
    ------
    glaref.GlarefError
        As ``glaref.vjp`` raises them (a bad argument named in the message, non-finite inputs
        without ``allow_nonfinite``).
    """

    p = _inputs.canonicalize(q, k, v, log_alpha, h0, do, dh_T, layout=layout,
                             allow_nonfinite=allow_nonfinite, cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    with _quiet():
        d = problem_scales(p, scale, impl)
    f = _inputs.from_canonical
    kinds = {**{n: _KIND[n] for n in OUTPUTS}, "log_alpha_identity": _KIND["log_alpha"]}
    out = Scales(**{name: (f(d[name], kind, layout) if name in d else None)
                    for name, kind in kinds.items()})
    _warn_nonfinite(f"glaref.scales (impl={impl!r})", p, scale,
                    {n: x for n, x in out._asdict().items() if x is not None})
    return out
