"""Error figures of one kernel output against the float64 oracle.

Every figure compares an output ``x`` of the kernel under audit with the oracle's ``ref`` on the
same (already rounded) inputs, both canonical float64 arrays:

    rel_err      ||x - ref||_2 / ||ref||_2          (normwise; the seed report's figure)
    max_abs_err  max |x - ref|
    budget_ulps  max |x - ref| / (u * scale + floor) (``budget_ulps``, the error unit: scale from
                                                     ``_budget``, u the unit roundoff of the
                                                     kernel's compute dtype, floor the underflow
                                                     allowance ``underflow_floor``)
    nonfinite    count of NaN/inf in x, and the index of the first one

The verdict on these figures is ``glaref._audit._verdict.assess``: non-finite values always fail; the
normwise error against that of the same-precision reference kernels (calibrated tier) and
budget_ulps against the bound of any correct kernel (proven tier) decide; max_abs_err is
reported, not judged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._inputs import Dims
from ..tolerances import SMALLEST_NORMAL, UNIT_ROUNDOFF, lookup


def rel_err(x, ref) -> float:
    """Normwise relative error ||x - ref||_2 / ||ref||_2 (0 when both are 0, inf when only ref
    is, NaN when x is not finite) of any real arrays (array-likes), in float64."""
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    diff = float(np.linalg.norm((x - ref).ravel()))
    nref = float(np.linalg.norm(ref.ravel()))
    if not math.isfinite(diff):
        return math.nan
    if nref == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / nref


def max_abs_err(x: np.ndarray, ref: np.ndarray) -> float:
    if x.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(x - ref)))


def nonfinite(x: np.ndarray) -> tuple[int, list[int] | None]:
    """Number of NaN/inf entries of x and the index of the first one (None when there is none)."""
    bad = ~np.isfinite(x)
    n = int(bad.sum())
    if n == 0:
        return 0, None
    return n, [int(i) for i in np.argwhere(bad)[0]]


def measure(name: str, x: np.ndarray, ref: np.ndarray, scale: np.ndarray | None,
            compute_dtype: str, dims) -> dict[str, Any]:
    """rel_err, max_abs_err and budget_ulps (None without a scale) of output ``name``; x, ref and
    scale canonical float64 arrays of one shape, ``dims`` the problem's sizes (underflow floor)."""
    ulps = None if scale is None else budget_ulps(name, x, ref, scale, compute_dtype, dims)[0]
    return {"rel_err": rel_err(x, ref), "max_abs_err": max_abs_err(x, ref), "budget_ulps": ulps}


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
    r = element_ulps(output, x, ref, scale, compute_dtype, dims)
    if r.size == 0:
        return 0.0, None
    i = int(np.argmax(r))
    return float(r.flat[i]), tuple(int(j) for j in np.unravel_index(i, r.shape))


def element_ulps(output: str, x, ref, scale, compute_dtype: str, dims: Dims) -> np.ndarray:
    """``|x_i - ref_i| / (u * scale_i + floor_i)`` of every element (inf where x is not finite):
    the array whose largest value is :func:`budget_ulps`, arguments as there."""
    u = lookup(UNIT_ROUNDOFF, compute_dtype, "compute_dtype")
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    if x.shape != ref.shape or ref.shape != scale.shape:
        raise ValueError(f"x: got shape {x.shape}, expected ref's {ref.shape} and scale's {scale.shape}")
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.abs(x - ref) / (u * scale + underflow_floor(output, compute_dtype, dims))
    return np.where(np.isfinite(x), r, np.inf)
