"""The public oracle: ``forward``, ``vjp`` and ``dlog_alpha_identity`` over two implementations.

``impl="numba"`` (the default) is the fast float64 path in ``_numba``; ``impl="numpy"`` is the
readable reference in ``_reference``. Both take canonical float64 arrays and share one signature;
this module validates and converts the caller's arrays once (``_inputs``), runs the backend, and
checks its results once: a result holding NaN or infinity comes with a ``NonFiniteWarning`` that
says why (finite inputs whose true values overflow float64, naming the arguments responsible, or
non-finite inputs accepted with ``allow_nonfinite=True``), the same way on both implementations.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import numpy as np

from .. import _inputs
from .._errors import ArgumentError, NonFiniteWarning
from .._inputs import ARRAYS, Problem
from . import _reference

IMPLS = ("numba", "numpy")


class Grads(NamedTuple):
    """Gradients of L = sum(o * do) + sum(h_T * dh_T), float64, in the caller's layout."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    log_alpha: np.ndarray
    h0: np.ndarray


def backend(impl: str):
    """The oracle's implementation ``impl``: the module (``_numba`` or ``_reference``) whose
    forward and vjp take canonical float64 arrays."""
    if impl == "numpy":
        return _reference
    if impl == "numba":
        from . import _numba
        return _numba
    raise ArgumentError(f"impl: got {impl!r}, expected one of {IMPLS}")


def _quiet():
    """numpy's own overflow/invalid warnings are replaced by one NonFiniteWarning on the results
    (the Numba path raises none), so both implementations speak the same way."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore")


# ---------------------------------------------------------------- non-finite results, explained

def _count_first(a: np.ndarray) -> tuple[int, tuple[int, ...] | None]:
    bad = ~np.isfinite(a)
    n = int(bad.sum())
    return n, (tuple(int(i) for i in np.argwhere(bad)[0]) if n else None)


def largest_window_sum(log_alpha: np.ndarray, cu_seqlens=None) -> float:
    """max over (b, h[, i]) and steps s <= t of one sequence of log_alpha_s + ... + log_alpha_t
    (canonical, time on axis 2; scalar or vector gates), or 0: the log of the largest decay
    factor exp(sum) the recurrence forms."""
    if cu_seqlens is not None:
        bounds = [int(x) for x in cu_seqlens]
        return max([largest_window_sum(log_alpha[:, :, a:b]) for a, b in zip(bounds, bounds[1:])],
                   default=0.0)
    if log_alpha.size == 0:
        return 0.0
    c = np.cumsum(log_alpha, axis=2)
    c = np.concatenate([np.zeros_like(c[:, :, :1]), c], axis=2)
    return float(np.max(c - np.minimum.accumulate(c, axis=2)))


def _overflow_cause(p: Problem, scale: float) -> str:
    """Why finite inputs gave non-finite results: the factors of the products, the arguments that
    carry at least a quarter of their combined magnitude (in decades) named first."""
    biggest = {"scale": abs(scale)}
    for name in ("q", "k", "v", "h0", "do", "dh_T"):
        a = getattr(p, name)
        if a is not None:
            biggest[name] = float(np.max(np.abs(a))) if a.size else 0.0
    window = largest_window_sum(p.log_alpha, p.cu_seqlens)
    decades = {n: math.log10(m) if m > 1 else 0.0 for n, m in biggest.items()}
    decades["log_alpha"] = window / math.log(10)
    total = sum(decades.values())
    named = [n for n, d in decades.items() if d > 0 and d >= 0.25 * total]
    named = sorted(named, key=lambda n: -decades[n]) or [max(decades, key=decades.get)]

    def what(n):
        if n == "log_alpha":
            return (f"log_alpha (sums over consecutive steps up to {window:.4g}, so decay factors "
                    f"up to e^{window:.4g})")
        return f"scale ({scale:.3g})" if n == "scale" else f"{n} (|{n}| up to {biggest[n]:.3g})"

    listed = ", ".join(f"|{n}| <= {m:.3g}" for n, m in biggest.items() if n != "scale")
    return (f"Every input is finite: the true values, or the products on the way to them, exceed "
            f"float64's range (1.8e+308). Likely cause: {' and '.join(what(n) for n in named)}. "
            f"All factors: scale {scale:.3g}, {listed}, log_alpha's largest sum over consecutive "
            f"steps {window:.4g}.")


def nonfinite_report(what: str, p: Problem, scale: float,
                     results: dict[str, np.ndarray]) -> str | None:
    """None when every result is finite; else one message naming each non-finite result (count,
    first index in the arrays given) and the cause."""
    bad = {n: _count_first(a) for n, a in results.items()}
    bad = {n: cf for n, cf in bad.items() if cf[0]}
    if not bad:
        return None
    outs = ", ".join(f"{n} has {c} (first at index {first})" for n, (c, first) in bad.items())
    nonfinite_in = {}
    for name in ARRAYS:
        a = getattr(p, name)
        if a is not None:
            c = _count_first(a)[0]
            if c:
                nonfinite_in[name] = c
    if nonfinite_in:
        why = ("The inputs hold non-finite values, accepted with allow_nonfinite=True ("
               + ", ".join(f"{n} has {c}" for n, c in nonfinite_in.items())
               + "): NaN and infinity propagate through the recurrence.")
    else:
        why = _overflow_cause(p, scale)
    return f"{what}: non-finite results: {outs}. {why}"


def _warn_nonfinite(what: str, p: Problem, scale: float, results: dict[str, np.ndarray]) -> None:
    msg = nonfinite_report(what, p, scale, results)
    if msg is not None:
        warnings.warn(msg, NonFiniteWarning, stacklevel=3)


# ---------------------------------------------------------------- the public functions

def forward(q, k, v, log_alpha, h0=None, *, scale=1.0, layout="bhtd", impl="numba",
            allow_nonfinite=False, cu_seqlens=None):
    """Run the recurrence in float64.

    Parameters
    ----------
    q, k : array_like
        (B, G, T, dk) for layout "bhtd", (B, T, G, dk) for "bthd"; G groups of H / G heads.
    v : array_like
        (B, H, T, dv), or (B, T, H, dv) for "bthd".
    log_alpha : array_like
        (B, H, T) a scalar gate, or (B, H, T, dk) a vector gate (one decay per key dimension);
        time second or third as ``layout`` says.
    h0 : array_like, optional
        (B, H, dk, dv) initial state; None means zeros.
    scale : float, default 1.0
        Multiplies o.
    layout : {"bhtd", "bthd"}, default "bhtd"
        Where the time axis is, for the arguments and o.
    impl : {"numba", "numpy"}, default "numba"
        The fast path or the readable reference (same signature, same results).
    allow_nonfinite : bool, default False
        Accept NaN or infinity in the inputs (else ``glaref.NonFiniteError``).
    cu_seqlens : array_like of int, optional
        N + 1 offsets with B = 1: N packed sequences, each from h0[n] to h_T[n], h0 and h_T
        then (N, H, dk, dv).

    Returns
    -------
    o : numpy.ndarray
        float64, v's layout: (B, H, T, dv) or (B, T, H, dv).
    h_T : numpy.ndarray
        float64, (B, H, dk, dv) (or (N, H, dk, dv) packed).

    Raises
    ------
    glaref.ShapeError, glaref.DTypeError, glaref.LayoutError, glaref.SeqlensError
        An argument of the wrong shape, dtype, layout or offsets, named in the message.
    glaref.NonFiniteError
        Non-finite inputs without ``allow_nonfinite``.
    glaref.ArgumentError
        An unknown ``impl`` or a non-bool ``allow_nonfinite``.

    Non-finite results come with a ``glaref.NonFiniteWarning`` saying why.
    """
    p = _inputs.canonicalize(q, k, v, log_alpha, h0, layout=layout, allow_nonfinite=allow_nonfinite,
                             cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    be = backend(impl)
    with _quiet():
        o, h_T = be.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale, cu_seqlens=p.cu_seqlens)
    o = _inputs.from_canonical(o, "v", layout)
    _warn_nonfinite(f"glaref.forward (impl={impl!r})", p, scale, {"o": o, "h_T": h_T})
    return o, h_T


def vjp(q, k, v, log_alpha, h0, do, dh_T=None, *, scale=1.0, layout="bhtd", impl="numba",
        allow_nonfinite=False, cu_seqlens=None) -> Grads:
    """Gradient of L = sum(o * do) + sum(h_T * dh_T) with respect to all five inputs.

    Parameters
    ----------
    q, k, v, log_alpha, h0, scale, layout, impl, allow_nonfinite, cu_seqlens
        As for :func:`forward` (``h0=None`` means zeros).
    do : array_like
        The cotangent of o, o's shape and layout.
    dh_T : array_like, optional
        The cotangent of h_T, (B, H, dk, dv); None means zero.

    Returns
    -------
    Grads
        Named tuple (q, k, v, log_alpha, h0) of float64 gradients in the caller's layout: dq
        and dk summed over the heads of their group, dlog_alpha of log_alpha's shape (scalar or
        vector gate), dh0 whether h0 was given or not. Non-finite ones come with a
        ``glaref.NonFiniteWarning`` saying why.

    Raises
    ------
    glaref.GlarefError
        As :func:`forward` raises them, for do and dh_T too.
    """
    p = _inputs.canonicalize(q, k, v, log_alpha, h0, do, dh_T, layout=layout,
                             allow_nonfinite=allow_nonfinite, need_do=True, cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    be = backend(impl)
    with _quiet():
        dq, dk, dv, dla, dh0 = be.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale,
                                      cu_seqlens=p.cu_seqlens)
    f = _inputs.from_canonical
    g = Grads(f(dq, "qk", layout), f(dk, "qk", layout), f(dv, "v", layout),
              f(dla, "gate", layout), dh0)
    _warn_nonfinite(f"glaref.vjp (impl={impl!r})", p, scale,
                    {"dq": g.q, "dk": g.k, "dv": g.v, "dlog_alpha": g.log_alpha, "dh0": g.h0})
    return g


def dlog_alpha_identity(q, k, v, log_alpha, h0, do, dh_T=None, *, scale=1.0, layout="bhtd",
                        impl="numba", allow_nonfinite=False, cu_seqlens=None) -> np.ndarray:
    """dlog_alpha through the reverse-cumsum identity that production kernels use:

        dlog_alpha_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <h_T, dh_T>

    with per-head dq and dk. Equal to ``vjp(...).log_alpha`` in exact arithmetic; it loses
    accuracy through cancellation when the summed terms dwarf the result (docs/math.md, sec. 3).
    Vector gates: the same per key dimension i (products q_s[i] dq_s[i], row sums of
    h_T * dh_T; docs/math.md, sec. 9). Packed sequences: the sum restarts in each sequence.
    """
    p = _inputs.canonicalize(q, k, v, log_alpha, h0, do, dh_T, layout=layout,
                             allow_nonfinite=allow_nonfinite, need_do=True, cu_seqlens=cu_seqlens)
    scale = _inputs.check_scale(scale)
    be = backend(impl)
    cu = p.cu_seqlens
    with _quiet():
        dqh, dkh, _, _, _ = be.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale,
                                   per_head=True, cu_seqlens=cu)
        h_T = (be.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale, cu_seqlens=cu)[1]
               if p.dh_T is not None else None)
        dla = _reference.dlog_alpha_identity(p.q, p.k, dqh, dkh, h_T, p.dh_T, vector=p.vector_gate,
                                             cu_seqlens=cu)
    dla = _inputs.from_canonical(dla, "gate", layout)
    _warn_nonfinite(f"glaref.dlog_alpha_identity (impl={impl!r})", p, scale, {"dlog_alpha": dla})
    return dla
