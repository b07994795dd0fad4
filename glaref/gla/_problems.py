"""The problems a kernel is checked on: regime -> sizes -> float64 inputs -> rounded to the dtype.

One place for what every face that *generates* problems does (the audit engine for JAX kernels,
its torch/NumPy path, ``glaref.strategies``): the plan of (regime, config, sizes) rows
(``glaref._audit._presets.plan``, every family's), and the rounding of a problem to the dtype the
kernel receives (``glaref._rounding.round_to_dtype``), so that the oracle is run on exactly the
numbers the kernel sees, whatever its framework.
"""

from __future__ import annotations

from .. import regimes as _regimes
from .._audit._presets import plan  # noqa: F401  (the rows of every family: there)
from .._inputs import Dims, Problem
from .._rounding import round_to_dtype


def round_problem(p: Problem, dtype: str) -> Problem:
    """Every array of ``p`` (inputs and cotangents) rounded to ``dtype`` and widened back to
    float64 (exact): the numbers a kernel of that dtype receives, on which the oracle runs."""
    def r(x):
        return None if x is None else round_to_dtype(x, dtype)
    return p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha), h0=r(p.h0),
                      do=r(p.do), dh_T=r(p.dh_T))


def make_problem(regime: str, dims: Dims, seed: int, dtype: str, *, gate: str = "scalar",
                 cu_seqlens=None) -> Problem:
    """The problem of one row: ``glaref.regimes.make_inputs`` rounded to ``dtype`` (``gate`` and
    ``cu_seqlens`` as there: vector gates, packed sequences)."""
    return round_problem(_regimes.make_inputs(regime, dims, seed, gate=gate, cu_seqlens=cu_seqlens),
                         dtype)
