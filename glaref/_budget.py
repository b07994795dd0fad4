"""Error budgets: the scale of every output element, from the oracle run on absolute values.

Every element of o, h_T and of each gradient is a sum of products of inputs and decay factors.
Running the same recurrence and vjp on |q|, |k|, |v|, |h0|, |do|, |dh_T| (the decay factors
exp(log_alpha) are already positive) gives, per element, the sum of the absolute values of those
terms. Rounding errors of any correct summation order are bounded by a multiple of that sum
(docs/budgets.md), so it is the natural unit of error:

    budget_ulps = max_i |x_i - ref_i| / (u * scale_i + floor)

with u the unit roundoff of the kernel's compute dtype and ``floor`` the underflow allowance
(``underflow_floor``). For dlog_alpha there are two scales:

- ``log_alpha``: the direct form dlog_alpha_t = alpha_t <S_{t-1}, G_t>, i.e. the abs-vjp
  alpha_t <|S|_{t-1}, |G|_t>;
- ``log_alpha_identity``: the reverse-cumsum identity production kernels use,
  sum_{s >= t} (|q_s| . sdq_s + |k_s| . sdk_s) + <s_hT, |dh_T|>, with sdq, sdk the per-head
  abs-vjp scales of dq, dk and s_hT the scale of h_T. It is never smaller than the direct
  scale (docs/budgets.md, section 3) and under strong decay or long T it is far larger.

The verdict uses the identity scale for dlog_alpha (glaref._verdict explains why).

Vector gates (log_alpha (B, H, T, dk)) and packed sequences (``cu_seqlens``) use the same
abs-value runs; with vector gates both dlog_alpha scales have log_alpha's shape, the identity's
taken per key dimension (docs/math.md, section 9.3).
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from . import _inputs
from ._inputs import _KIND, OUTPUTS, Dims, Problem
from .tolerances import SMALLEST_NORMAL, UNIT_ROUNDOFF, lookup


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
    from ._oracle import _backend
    from ._reference import _group_sum, dlog_alpha_identity

    be = _backend(impl)
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
    an element is a small multiple of u * scale (docs/budgets.md). Arguments as for
    ``glaref.vjp``; without ``do`` only o and h_T are returned (the other fields are None).
    Results are float64, o and the gradients in the caller's layout. Vector gates (log_alpha
    (B, H, T, dk)) and packed sequences (``cu_seqlens``) as in ``glaref.vjp``; the scales of
    dlog_alpha then have log_alpha's shape.
    """
    from ._oracle import _quiet, _warn_nonfinite

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


def budget_view(p: Problem) -> tuple[Dims, np.ndarray]:
    """``(dims, log_alpha)`` to pass to the bound (``_verdict.budget_bound`` / ``judge``, which
    take scalar gates (B, H, T) of one sequence per row) for any problem ``p``.

    Vector gates: each key dimension's gates are a scalar gate sequence of their own, so
    log_alpha (B, H, T, dk) is viewed as (B, H * dk, T); the gate-mass terms then take the
    largest chunk sum over every dimension. Packed sequences: each sequence starts its own chunks
    at its first step, so the gates are laid out one sequence per row, zero-padded to the longest
    length Lmax, and dims become B = N, T = Lmax (a correct kernel's error on a sequence depends
    on its own length, never more than Lmax).
    """
    la = np.asarray(p.log_alpha, dtype=np.float64)
    B, H, T = la.shape[:3]
    if p.vector_gate:
        la = np.moveaxis(la, 3, 2).reshape(B, H * la.shape[3], T)
    if p.cu_seqlens is None:
        return p.dims, la
    cu = np.asarray(p.cu_seqlens)
    lens = np.diff(cu)
    L = int(lens.max()) if lens.size else 0
    rows = np.zeros((len(lens), la.shape[1], L))
    for n, (t0, t1) in enumerate(zip(cu[:-1], cu[1:])):
        rows[n, :, :t1 - t0] = la[0, :, t0:t1]
    return replace(p.dims, B=len(lens), T=L), rows


def underflow_floor(output: str, compute_dtype: str, dims: Dims) -> float:
    """Absolute error a correct kernel may make on one element of ``output`` through underflow.

    With flush-to-zero (XLA flushes subnormals on CPU and GPU) every product or sum that lands
    below the smallest normal number ``tiny`` of the compute dtype may lose up to ``tiny``. The
    floor is ``tiny`` times an upper bound on the number of products in one element's expansion
    (docs/budgets.md, section 4): it only matters where an element's scale itself is near the
    underflow threshold (strong decay over many steps, zero inputs).
    """
    return _n_products(output, dims) * lookup(SMALLEST_NORMAL, compute_dtype, "compute_dtype")


def _n_products(output: str, dims: Dims) -> float:
    T1, dk, dv, r = float(dims.T + 1), dims.dk, dims.dv, dims.H // max(dims.G, 1)
    n = {
        "o": T1 * dk,                          # q_t . (k_s v_s) over s <= t, plus q_t . h0
        "h_T": T1,                             # k_s v_s over s, plus h0
        "q": T1 * dv * r,                      # S_t do_t over dv, summed over the group's heads
        "k": T1 * dv * r,                      # G_t v_t over dv, same
        "v": T1 * dk,                          # G_t^T k_t over dk
        "h0": T1,                              # decayed q_s do_s over s, plus dh_T
        "log_alpha": T1 * T1 * dk * dv,        # pairs (r, s) of time steps times state entries
        "log_alpha_identity": T1 * T1 * dk * dv,
    }
    try:
        return n[output]
    except KeyError:
        raise ValueError(f"output: got {output!r}, expected one of {sorted(n)}") from None


def budget_ulps(output: str, x, ref, scale, compute_dtype: str,
                dims: Dims) -> tuple[float, tuple[int, ...] | None]:
    """``max_i |x_i - ref_i| / (u * scale_i + floor)`` and the index of the worst element.

    output: o, h_T, q, k, v, log_alpha or h0 (sets the underflow floor); x: the kernel's value
    (any float dtype, converted exactly); ref and scale: the oracle's
    float64 value and scale on the same (dtype-rounded) inputs. Non-finite x gives inf (the
    verdict counts non-finite values separately). Empty arrays give (0.0, None).
    """
    u = lookup(UNIT_ROUNDOFF, compute_dtype, "compute_dtype")
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    if x.shape != ref.shape or ref.shape != scale.shape:
        raise ValueError(f"x: got shape {x.shape}, expected ref's {ref.shape} and scale's {scale.shape}")
    if x.size == 0:
        return 0.0, None
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.abs(x - ref) / (u * scale + underflow_floor(output, compute_dtype, dims))
    r = np.where(np.isfinite(x), r, np.inf)
    i = int(np.argmax(r))
    return float(r.flat[i]), tuple(int(j) for j in np.unravel_index(i, r.shape))
