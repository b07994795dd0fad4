"""Error figures of one kernel output against the float64 oracle.

Every figure compares an output ``x`` of the kernel under audit with the oracle's ``ref`` on the
same (already rounded) inputs, both canonical float64 arrays:

    rel_err      ||x - ref||_2 / ||ref||_2          (normwise; the seed report's figure)
    max_abs_err  max |x - ref|
    budget_ulps  max |x - ref| / (u * scale + floor) (``glaref._budget.budget_ulps``: scale from
                                                     ``_budget``, u the unit roundoff of the
                                                     kernel's compute dtype, floor the underflow
                                                     allowance)
    nonfinite    count of NaN/inf in x, and the index of the first one

The verdict on these figures is ``glaref._verdict.judge`` (budget_ulps against the bound of a
correct kernel; non-finite values always fail); rel_err and max_abs_err are reported, not judged.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _budget

# the arithmetic a kernel's errors are measured in: its input dtype, or TF32 for float32 matmuls
COMPUTE_DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16")
PRECISIONS = ("default", "high", "highest")


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
    ulps = None if scale is None else _budget.budget_ulps(name, x, ref, scale, compute_dtype, dims)[0]
    return {"rel_err": rel_err(x, ref), "max_abs_err": max_abs_err(x, ref), "budget_ulps": ulps}


def compute_dtype(dtype: str, precision: str, platform: str) -> str:
    """The arithmetic the kernel's errors should be measured in units of.

    16-bit inputs: their own format (what the kernel stores and feeds its matmuls). float32 on an
    NVIDIA GPU under precision "default" or "high": TF32 (XLA's default for float32 matmuls there,
    10 explicit mantissa bits). Otherwise the input dtype.
    """
    if dtype == "float32" and platform in ("gpu", "cuda") and precision in ("default", "high"):
        return "tf32"
    return dtype
