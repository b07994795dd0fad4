"""The public oracle of the gated delta rule: ``forward``, ``vjp`` and ``scales`` over two
implementations (``impl="numba"``, the default, in ``glaref.delta._numba``; ``impl="numpy"``,
the readable reference in ``glaref.delta._reference``), both on canonical float64 arrays.

Validation is the scalar family's (``glaref._inputs.canonicalize``) plus beta, which has the
layout of a scalar gate: (B, H, T) in "bhtd", (B, T, H) in "bthd". Results holding NaN or
infinity come with a ``glaref.NonFiniteWarning`` saying why, as in ``glaref.forward``.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from .. import _inputs
from .._errors import ArgumentError, NonFiniteWarning, ShapeError
from .._inputs import Problem
from ..gla._oracle import _quiet, nonfinite_report
from . import _reference

IMPLS = ("numba", "numpy")
GRADS = ("q", "k", "v", "beta", "log_alpha", "h0")   # the arrays a delta kernel is given
FORWARD = ("o", "h_T")
OUTPUTS = FORWARD + GRADS


class Grads(NamedTuple):
    """Gradients of L = sum(o * do) + sum(h_T * dh_T), float64, in the caller's layout."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    beta: np.ndarray
    log_alpha: np.ndarray
    h0: np.ndarray


class Scales(NamedTuple):
    """Per-element error scales (sum of |terms|), float64, in the caller's layout; gradient
    fields are None when no ``do`` was given."""

    o: np.ndarray
    h_T: np.ndarray
    q: np.ndarray | None
    k: np.ndarray | None
    v: np.ndarray | None
    beta: np.ndarray | None
    log_alpha: np.ndarray | None
    h0: np.ndarray | None


class DeltaProblem(NamedTuple):
    """A canonical problem of the scalar family (``glaref._inputs.Problem``) and beta (B, H, T).

    Every field of ``p`` (q, k, v, log_alpha, h0, do, dh_T, dims, cu_seqlens, n_states) reads
    through as an attribute, so code that reads a problem's arrays by name (the probes,
    ``glaref._audit._frameworks``) reads beta and the rest alike; :meth:`with_fields` is its
    ``_replace``."""

    p: Problem
    beta: np.ndarray

    q = property(lambda self: self.p.q)
    k = property(lambda self: self.p.k)
    v = property(lambda self: self.p.v)
    log_alpha = property(lambda self: self.p.log_alpha)
    h0 = property(lambda self: self.p.h0)
    do = property(lambda self: self.p.do)
    dh_T = property(lambda self: self.p.dh_T)
    dims = property(lambda self: self.p.dims)
    cu_seqlens = property(lambda self: self.p.cu_seqlens)
    n_states = property(lambda self: self.p.n_states)

    def with_fields(self, **changes) -> DeltaProblem:
        """This problem with ``changes`` (beta, or any field of ``Problem``) replaced."""
        beta = changes.pop("beta", self.beta)
        return DeltaProblem(self.p._replace(**changes), beta)


def backend(impl: str):
    """The module (``_numba`` or ``_reference``) whose forward and vjp take canonical arrays."""
    if impl == "numpy":
        return _reference
    if impl == "numba":
        from . import _numba
        return _numba
    raise ArgumentError(f"impl: got {impl!r}, expected one of {IMPLS}")


def canonicalize(q, k, v, beta, log_alpha, h0=None, do=None, dh_T=None, *, layout="bhtd",
                 allow_nonfinite=False, need_do=False, cu_seqlens=None) -> DeltaProblem:
    """Validate and convert every array once: the scalar family's checks, then beta's."""
    p = _inputs.canonicalize(q, k, v, log_alpha, h0, do, dh_T, layout=layout,
                             allow_nonfinite=allow_nonfinite, need_do=need_do,
                             cu_seqlens=cu_seqlens)
    d = p.dims
    b = _inputs.to_float64(beta, "beta")
    want = _inputs.shape_in(layout, "gate", (d.B, d.H, d.T))
    if b.shape != want:
        spelled = "(B, H, T)" if layout == "bhtd" else "(B, T, H)"
        raise ShapeError(f"beta: got shape {b.shape}, expected {want} {spelled} like a scalar "
                         "gate")
    if not allow_nonfinite:
        _inputs._check_finite(b, "beta")
    return DeltaProblem(p, _inputs.to_canonical(b, "gate", layout))


def _warn_nonfinite(what: str, dp: DeltaProblem, scale: float, results: dict) -> None:
    msg = nonfinite_report(what, dp.p, scale, results)
    if msg is not None:
        mb = float(np.max(np.abs(dp.beta))) if dp.beta.size else 0.0
        warnings.warn(f"{msg} (beta: |beta| <= {mb:.3g}; each step multiplies the state by "
                      "I - beta k k^T, of norm up to |1 - beta |k|^2|)", NonFiniteWarning,
                      stacklevel=3)


def forward(q, k, v, beta, log_alpha, h0=None, *, scale=1.0, layout="bhtd", impl="numba",
            allow_nonfinite=False, cu_seqlens=None):
    """Run the gated delta rule in float64 (the equations in ``glaref.delta``'s docstring).

    Parameters
    ----------
    q, k, v, log_alpha, h0, scale, layout, impl, allow_nonfinite, cu_seqlens
        As for ``glaref.forward`` (log_alpha (B, H, T) a scalar gate, (B, H, T, dk) a vector
        gate; zeros for DeltaNet).
    beta : array_like
        (B, H, T) (time second or third as ``layout`` says): the delta rule's step sizes.

    Returns
    -------
    o : numpy.ndarray
        float64, v's layout.
    h_T : numpy.ndarray
        float64, (B, H, dk, dv) (or (N, H, dk, dv) packed).

    Raises
    ------
    glaref.GlarefError
        As ``glaref.forward`` raises them, for beta too (a bad argument named in the message,
        non-finite inputs without ``allow_nonfinite``).
    """
    dp = canonicalize(q, k, v, beta, log_alpha, h0, layout=layout,
                      allow_nonfinite=allow_nonfinite, cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    p = dp.p
    with _quiet():
        o, h_T = backend(impl).forward(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, scale,
                                       cu_seqlens=p.cu_seqlens)
    o = _inputs.from_canonical(o, "v", layout)
    _warn_nonfinite(f"glaref.delta.forward (impl={impl!r})", dp, scale, {"o": o, "h_T": h_T})
    return o, h_T


def vjp(q, k, v, beta, log_alpha, h0, do, dh_T=None, *, scale=1.0, layout="bhtd",
        impl="numba", cu_seqlens=None) -> Grads:
    """Gradient of L = sum(o * do) + sum(h_T * dh_T) with respect to all six inputs.

    Parameters
    ----------
    q, k, v, beta, log_alpha, h0, scale, layout, impl, cu_seqlens
        As for :func:`forward` (``h0=None`` means zeros). Every input must be finite: the
        gradients of a non-finite forward are not defined (:func:`forward` with
        ``allow_nonfinite=True`` shows how non-finite values propagate).
    do, dh_T : array_like
        The cotangents of o and h_T, as for ``glaref.vjp`` (``dh_T=None`` means zero).

    Returns
    -------
    Grads
        Named tuple (q, k, v, beta, log_alpha, h0) of float64 gradients in the caller's layout,
        dq and dk summed over the heads of their group.

    Raises
    ------
    glaref.GlarefError
        As :func:`forward` raises them, for do and dh_T too.
    """
    dp = canonicalize(q, k, v, beta, log_alpha, h0, do, dh_T, layout=layout, need_do=True,
                      cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    p = dp.p
    with _quiet():
        dq, dk, dv, dbeta, dla, dh0 = backend(impl).vjp(
            p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, p.do, p.dh_T, scale,
            cu_seqlens=p.cu_seqlens)
    f = _inputs.from_canonical
    g = Grads(f(dq, "qk", layout), f(dk, "qk", layout), f(dv, "v", layout),
              f(dbeta, "gate", layout), f(dla, "gate", layout), dh0)
    _warn_nonfinite(f"glaref.delta.vjp (impl={impl!r})", dp, scale,
                    {"d" + n: x for n, x in g._asdict().items()})
    return g


def problem_scales(dp: DeltaProblem, scale: float = 1.0, impl: str = "numba") -> dict:
    """Per-element sums of |terms| of canonical problem ``dp``: keys o, h_T and, with ``do``,
    q, k, v, beta, log_alpha, h0 (canonical "bhtd").

    Every output is a polynomial in q, k, v, beta, h0, do, dh_T and the decays alpha, whose terms
    carry signs from the delta residual v - S~^T k. The same recurrence run with v -> -|v| and
    beta -> -|beta| (and |q|, |k|, |h0|, |do|, |dh_T|) turns every step into
    S_t = A_t |S_{t-1}| + |beta_t| |k_t| (|v_t| + |k_t|^T A_t |S_{t-1}|)^T: every term positive,
    so it adds up the terms' absolute values (docs/math_delta.md, section 4); the gradients with
    respect to v and beta change sign with their inputs and are negated back.
    """
    p = dp.p
    be = backend(impl)
    a = np.abs
    s = abs(float(scale))
    cu = p.cu_seqlens
    args = (a(p.q), a(p.k), -a(p.v), -a(dp.beta), p.log_alpha, a(p.h0))
    o, h_T = be.forward(*args, s, cu_seqlens=cu)
    out = {"o": o, "h_T": h_T}
    if p.do is None:
        return out
    adh = None if p.dh_T is None else a(p.dh_T)
    dq, dk, dv, dbeta, dla, dh0 = be.vjp(*args, a(p.do), adh, s, cu_seqlens=cu)
    out.update(q=dq, k=dk, v=-dv, beta=-dbeta, log_alpha=dla, h0=dh0)
    return out


_KINDS = {"o": "v", "h_T": "state", "q": "qk", "k": "qk", "v": "v", "beta": "gate",
          "log_alpha": "gate", "h0": "state"}


def scales(q, k, v, beta, log_alpha, h0=None, do=None, dh_T=None, *, scale=1.0, layout="bhtd",
           impl="numba", cu_seqlens=None) -> Scales:
    """Per-element error scales of o, h_T and (with ``do``) every gradient, dbeta included:
    each element's sum of the absolute values of the terms it adds up. A correct kernel's error
    on an element is a small multiple of u times it.

    Parameters
    ----------
    q, k, v, beta, log_alpha, h0, do, dh_T, scale, layout, impl, cu_seqlens
        As for :func:`vjp` (finite inputs only); ``do=None``: only the forward's scales.

    Returns
    -------
    Scales
        float64 scales of o, h_T and the gradients in the caller's layout; the gradients'
        fields are None without ``do``.

    Raises
    ------
    glaref.GlarefError
        As :func:`vjp` raises them."""
    dp = canonicalize(q, k, v, beta, log_alpha, h0, do, dh_T, layout=layout,
                      cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    with _quiet():
        d = problem_scales(dp, scale, impl)
    f = _inputs.from_canonical
    out = Scales(**{n: (f(d[n], kind, layout) if n in d else None) for n, kind in _KINDS.items()})
    results = {n: x for n, x in out._asdict().items() if x is not None}
    if any(not np.isfinite(x).all() for x in results.values()) and all(
            np.isfinite(a).all() for a in (*dp.p[:5], dp.beta)):
        bad = ", ".join(n for n, x in results.items() if not np.isfinite(x).all())
        warnings.warn(f"glaref.delta.scales (impl={impl!r}): non-finite scales of {bad}: the sums "
                      "of |terms| exceed float64's range although every input is finite. Along "
                      "k_t each step multiplies them by alpha_t (1 + |beta_t| |k_t|^2) where the "
                      "recurrence multiplies by alpha_t (1 - beta_t |k_t|^2): up to e^"
                      f"{_term_growth(dp):.4g} over one sequence here (docs/math_delta.md, "
                      "section 4). The values themselves may be finite (glaref.delta.forward).",
                      NonFiniteWarning, stacklevel=2)
    else:
        _warn_nonfinite(f"glaref.delta.scales (impl={impl!r})", dp, scale, results)
    return out


def _term_growth(dp: DeltaProblem) -> float:
    """max over sequences and heads of sum_t log(max_i alpha_t[i] (1 + |beta_t| |k_t|^2))."""
    p = dp.p
    H = p.dims.H
    k2 = np.repeat(np.sum(p.k * p.k, axis=-1), H // max(p.dims.G, 1), axis=1)   # (B, H, T)
    la = p.log_alpha if p.log_alpha.ndim == 3 else p.log_alpha.max(axis=-1)
    g = la + np.log1p(np.abs(dp.beta) * k2)
    spans = _inputs.sequences(p.cu_seqlens, p.dims.B, p.dims.T)
    return max((float(g[b, :, t0:t1].sum(axis=-1).max()) for b, t0, t1 in spans if t1 > t0),
               default=0.0)
