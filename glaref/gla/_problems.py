"""The problems a kernel is checked on: regime -> sizes -> float64 inputs -> rounded to the dtype.

One place for what every face that *generates* problems does (the audit engine for JAX kernels,
its torch/NumPy path, ``glaref.strategies``): the plan of (regime, config, sizes) rows, and the
rounding of a problem to the dtype the kernel receives, so that the oracle is run on exactly
the numbers the kernel sees, whatever its framework.

Rounding is correct rounding (to nearest, ties to even) of each float64 value straight to the
dtype, without JAX or ml_dtypes: float32 and float16 by NumPy's own conversions (both round
float64 directly), bfloat16 by rounding to float32 *to odd* first and then to bfloat16 to nearest
even, which equals direct rounding (24 >= 8 + 2 bits: the classic round-to-odd argument). This is
what ml_dtypes (JAX's bfloat16) does; torch converts float64 to bfloat16 through a float32
rounded to nearest, which differs on values within 2^-24 relative of a bfloat16 halfway point, so
glaref rounds first and hands torch values it represents exactly.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .. import regimes as _regimes
from .._inputs import DTYPES, Dims, Problem
from ._baseline import round_to


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


def round_problem(p: Problem, dtype: str) -> Problem:
    """Every array of ``p`` (inputs and cotangents) rounded to ``dtype`` and widened back to
    float64 (exact): the numbers a kernel of that dtype receives, on which the oracle runs."""
    def r(x):
        return None if x is None else round_to_dtype(x, dtype)
    return p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha), h0=r(p.h0),
                      do=r(p.do), dh_T=r(p.dh_T))


def plan(regimes: Iterable[str], configs: dict[str, tuple[int, ...]],
         seqs: Iterable[int], table=None) -> list[tuple[str, str, Dims]]:
    """The rows to run: (regime, config name, sizes) for every regime, config and sequence
    length, with the sizes each regime derives from them (``Regime.cases``), in that order.
    table: {name: regime} of the recurrence (None: ``glaref.regimes.REGIMES``)."""
    table = _regimes.REGIMES if table is None else table
    seqs = list(seqs)
    rows = []
    for regime in regimes:
        for cname, (B, G, H, dk, dv) in configs.items():
            for T in seqs:
                for dims in table[regime].cases(Dims(B, G, H, T, dk, dv)):
                    rows.append((regime, cname, dims))
    return rows


def make_problem(regime: str, dims: Dims, seed: int, dtype: str, *, gate: str = "scalar",
                 cu_seqlens=None) -> Problem:
    """The problem of one row: ``glaref.regimes.make_inputs`` rounded to ``dtype`` (``gate`` and
    ``cu_seqlens`` as there: vector gates, packed sequences)."""
    return round_problem(_regimes.make_inputs(regime, dims, seed, gate=gate, cu_seqlens=cu_seqlens),
                         dtype)
