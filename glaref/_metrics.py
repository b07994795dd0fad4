"""Error metrics of one kernel output against the float64 oracle, and the per-output verdict.

Every figure compares an output ``x`` of the kernel under audit with the oracle's ``ref`` on the
same (already rounded) inputs, both canonical float64 arrays:

    rel_err      ||x - ref||_2 / ||ref||_2          (normwise; the seed report's figure)
    max_abs_err  max |x - ref|
    budget_ulps  max |x - ref| / (scale * u)        (scale: ``_budget.scales``; u: unit roundoff
                                                     of the kernel's compute dtype; 0/0 counts 0)
    nonfinite    count of NaN/inf in x, and the index of the first one

``judge`` turns those figures into a verdict for one output. It is the single place the audit
decides pass or fail, so that the error-budget verdict of issue 6 replaces one function.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import tolerances

OUTPUTS = ("o", "h_T")
GRADS = ("q", "k", "v", "log_alpha", "h0")
NAMES = OUTPUTS + GRADS

FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16")
PRECISIONS = ("default", "high", "highest")


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    """Normwise relative error ||x - ref||_2 / ||ref||_2 (0 when both are 0, inf when only ref is)."""
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


def budget_ulps(x: np.ndarray, ref: np.ndarray, scale: np.ndarray | None, u: float) -> float | None:
    """max |x - ref| / (scale * u) elementwise; an exact element (0/0) counts 0, x/0 counts inf."""
    if scale is None:
        return None
    if x.size == 0:
        return 0.0
    err = np.abs(x - ref)
    denom = scale * u
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0.0, 0.0, err / denom)
    return float(np.max(ratio))


def nonfinite(x: np.ndarray) -> tuple[int, list[int] | None]:
    """Number of NaN/inf entries of x and the index of the first one (None when there is none)."""
    bad = ~np.isfinite(x)
    n = int(bad.sum())
    if n == 0:
        return 0, None
    return n, [int(i) for i in np.argwhere(bad)[0]]


def measure(x: np.ndarray, ref: np.ndarray, scale: np.ndarray | None, u: float) -> dict[str, Any]:
    """rel_err, max_abs_err and budget_ulps of one output (x and ref canonical float64)."""
    return {"rel_err": rel_err(x, ref), "max_abs_err": max_abs_err(x, ref),
            "budget_ulps": budget_ulps(x, ref, scale, u)}


def compute_dtype(dtype: str, precision: str, platform: str) -> str:
    """The arithmetic the kernel's errors should be measured in units of.

    16-bit inputs: their own format (what the kernel stores and feeds its matmuls). float32 on an
    NVIDIA GPU under precision "default" or "high": TF32 (XLA's default for float32 matmuls there,
    10 explicit mantissa bits). Otherwise the input dtype.
    """
    if dtype == "float32" and platform in ("gpu", "cuda") and precision in ("default", "high"):
        return "tf32"
    return dtype


def rel_tolerance(cdtype: str) -> float:
    """Normwise relative tolerance for a kernel computing in ``cdtype`` (glaref/tolerances.py)."""
    return tolerances.tol(f"audit_rel_err_{cdtype}")


def judge(output_name: str, metrics: dict[str, Any], compute_dtype: str, dims: Any,
          mode: str, *, chunk_size: int | None = None, log_alpha: np.ndarray | None = None
          ) -> tuple[bool, str]:
    """Verdict for one output: (ok, reason). Non-finite values always fail.

    metrics: rel_err, max_abs_err, budget_ulps, nonfinite, first_nonfinite of the output.
    For now the verdict compares the normwise relative error with the dtype's tolerance from the
    tolerance table. ``dims``, ``mode``, the kernel's ``chunk_size`` (1 for a scan, None when
    unknown) and the canonical ``log_alpha`` it received are passed so that the budget-based
    verdict (glaref/_verdict.py) can take this function's place without touching the engine.
    """
    n = metrics.get("nonfinite", 0)
    if n:
        return False, f"{output_name}: {n} non-finite value(s), first at {metrics.get('first_nonfinite')}"
    r = metrics["rel_err"]
    limit = rel_tolerance(compute_dtype)
    if r is None or not math.isfinite(r) or r > limit:
        return False, f"{output_name}: rel_err {r:.3g} > {limit:.3g} ({compute_dtype})"
    return True, ""
