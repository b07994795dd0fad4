"""Rounding float64 values to the formats kernels read and compute in, once for every family.

:func:`round_to_dtype`: a problem's float64 values rounded to the dtype a kernel receives (the
audit, ``glaref.testing`` and every family's problems), so that the oracle runs on exactly the
numbers the kernel sees. :func:`round_to`: a value rounded to a format a kernel computes in
(tf32, bfloat16, float16, float32), as the same-precision reference kernels round
(``glaref.gla._baseline``, ``glaref.delta._baseline``).

Rounding is correct rounding (to nearest, ties to even) of each float64 value straight to the
dtype, without JAX or ml_dtypes: float32 and float16 by NumPy's own conversions (both round
float64 directly), bfloat16 by rounding to float32 *to odd* first and then to bfloat16 to nearest
even, which equals direct rounding (24 >= 8 + 2 bits: the classic round-to-odd argument). This is
what ml_dtypes (JAX's bfloat16) does; torch converts float64 to bfloat16 through a float32
rounded to nearest, which differs on values within 2^-24 relative of a bfloat16 halfway point, so
glaref rounds first and hands torch values it represents exactly.
"""

from __future__ import annotations

import numpy as np

from ._inputs import DTYPES

__all__ = ["round_to", "round_to_dtype"]

# mantissa bits dropped from float32's 23 to reach each format
_DROP = {"tf32": 13, "bfloat16": 16, "float16": 13}


def round_to(x: np.ndarray, fmt: str | None) -> np.ndarray:
    """x rounded to nearest (ties to even) in format ``fmt`` ("tf32", "bfloat16", "float16",
    "float32", "float64" or None: unchanged), returned in x's own dtype (float32 or float64).

    tf32 and float16 keep 10 explicit mantissa bits, bfloat16 7; exponent ranges are float32's
    (the values the baseline meets stay far inside float16's range)."""
    if fmt is None or fmt == "float64":
        return x
    if fmt == "float32":
        return x.astype(np.float32).astype(x.dtype)
    drop = _DROP[fmt]
    y = np.ascontiguousarray(x, dtype=np.float32)
    bits = y.view(np.uint32)
    lsb = (bits >> np.uint32(drop)) & np.uint32(1)
    half = np.uint32((1 << (drop - 1)) - 1)
    mask = np.uint32((0xFFFFFFFF >> drop) << drop)
    finite = np.isfinite(y)
    r = ((bits + half + lsb) & mask).view(np.float32)
    return np.where(finite, r, y).astype(x.dtype, copy=False)


def _bfloat16(x: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 (as float64 values), correctly rounded."""
    with np.errstate(over="ignore"):              # beyond float32's range: inf, as it should
        f = x.astype(np.float32)                  # to nearest: may round away from zero
    back = f.astype(np.float64)
    with np.errstate(invalid="ignore"):
        inexact = back != x                       # NaN compares unequal: kept as NaN below
        away = inexact & (np.abs(back) > np.abs(x))
    bits = f.view(np.uint32).copy()
    bits[away] -= np.uint32(1)                    # the float32 neighbour towards zero (truncation)
    bits[inexact] |= np.uint32(1)                 # ... made odd: round to odd
    return round_to(bits.view(np.float32), "bfloat16").astype(np.float64)


def round_to_dtype(x, dtype: str) -> np.ndarray:
    """``x`` (float64) rounded to ``dtype`` ("float64", "float32", "bfloat16", "float16") and
    widened back exactly to float64."""
    a = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return a
    if dtype in ("float32", "float16"):
        return a.astype(dtype).astype(np.float64)
    if dtype == "bfloat16":
        return _bfloat16(a)
    raise ValueError(f"dtype: got {dtype!r}, expected one of {DTYPES}")
