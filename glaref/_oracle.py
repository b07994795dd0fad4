"""The public oracle: ``forward``, ``vjp`` and ``dlog_alpha_identity`` over two implementations.

``impl="numba"`` (the default) is the fast float64 path in ``_numba``; ``impl="numpy"`` is the
readable reference in ``_reference``. Both take canonical float64 arrays and share one signature;
this module validates and converts the caller's arrays once (``_inputs``) and moves the results
back to the caller's layout.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _inputs

IMPLS = ("numba", "numpy")


class Grads(NamedTuple):
    """Gradients of L = sum(o * do) + sum(h_T * dh_T), float64, in the caller's layout."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    log_alpha: np.ndarray
    h0: np.ndarray


def _backend(impl: str):
    if impl == "numpy":
        from . import _reference
        return _reference
    if impl == "numba":
        from . import _numba
        return _numba
    raise ValueError(f"impl: got {impl!r}, expected one of {IMPLS}")


def _check_scale(scale) -> float:
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"scale: got {scale!r}, expected a real number") from None
    if not np.isfinite(s):
        raise ValueError(f"scale: got {s}, expected a finite number")
    return s


def forward(q, k, v, log_alpha, h0=None, *, scale=1.0, layout="bhtd", impl="numba",
            allow_nonfinite=False, cu_seqlens=None):
    """Run the recurrence in float64. Returns ``(o, h_T)`` as float64 numpy arrays.

    o has v's layout, (B, H, T, dv) for "bhtd" or (B, T, H, dv) for "bthd"; h_T is (B, H, dk, dv).
    log_alpha (B, H, T) is a scalar gate, (B, H, T, dk) a vector gate (one decay per key
    dimension). ``cu_seqlens`` (N + 1 integer offsets, B = 1): N packed sequences, each from
    h0[n] to h_T[n], with h0 and h_T (N, H, dk, dv).
    """
    p = _inputs.canonicalize(q, k, v, log_alpha, h0, layout=layout, allow_nonfinite=allow_nonfinite,
                             cu_seqlens=cu_seqlens)
    scale = _check_scale(scale)
    o, h_T = _backend(impl).forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale,
                                    cu_seqlens=p.cu_seqlens)
    return _inputs.from_canonical(o, "v", layout), h_T


def vjp(q, k, v, log_alpha, h0, do, dh_T=None, *, scale=1.0, layout="bhtd", impl="numba",
        allow_nonfinite=False, cu_seqlens=None) -> Grads:
    """Gradient of L = sum(o * do) + sum(h_T * dh_T) with respect to all five inputs.

    ``h0=None`` means zeros and ``dh_T=None`` means zero; dh0 is returned either way. dq and dk
    are summed over the heads of their group. Results are float64 in the caller's layout;
    dlog_alpha has log_alpha's shape (scalar or vector gate). ``cu_seqlens`` as for ``forward``.
    """
    p = _inputs.canonicalize(q, k, v, log_alpha, h0, do, dh_T, layout=layout,
                             allow_nonfinite=allow_nonfinite, need_do=True, cu_seqlens=cu_seqlens)
    scale = _check_scale(scale)
    dq, dk, dv, dla, dh0 = _backend(impl).vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale,
                                              cu_seqlens=p.cu_seqlens)
    f = _inputs.from_canonical
    return Grads(f(dq, "qk", layout), f(dk, "qk", layout), f(dv, "v", layout),
                 f(dla, "gate", layout), dh0)


def dlog_alpha_identity(q, k, v, log_alpha, h0, do, dh_T=None, *, scale=1.0, layout="bhtd",
                        impl="numba", allow_nonfinite=False, cu_seqlens=None) -> np.ndarray:
    """dlog_alpha through the reverse-cumsum identity that production kernels use:

        dlog_alpha_t = sum_{s >= t} (q_s . dq_s - k_s . dk_s) + <h_T, dh_T>

    with per-head dq and dk. Equal to ``vjp(...).log_alpha`` in exact arithmetic; it loses
    accuracy through cancellation when the summed terms dwarf the result (docs/math.md, sec. 3).
    Vector gates: the same per key dimension i (products q_s[i] dq_s[i], row sums of
    h_T * dh_T; docs/math.md, sec. 9). Packed sequences: the sum restarts in each sequence.
    """
    from . import _reference

    p = _inputs.canonicalize(q, k, v, log_alpha, h0, do, dh_T, layout=layout,
                             allow_nonfinite=allow_nonfinite, need_do=True, cu_seqlens=cu_seqlens)
    scale = _check_scale(scale)
    be = _backend(impl)
    cu = p.cu_seqlens
    dqh, dkh, _, _, _ = be.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale, per_head=True,
                               cu_seqlens=cu)
    h_T = (be.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale, cu_seqlens=cu)[1]
           if p.dh_T is not None else None)
    dla = _reference.dlog_alpha_identity(p.q, p.k, dqh, dkh, h_T, p.dh_T, vector=p.vector_gate,
                                         cu_seqlens=cu)
    return _inputs.from_canonical(dla, "gate", layout)
