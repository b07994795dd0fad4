"""The problems a kernel is checked on: regime -> sizes -> float64 inputs -> rounded to the dtype.

One place for what every face that *generates* problems does (the audit engine for JAX kernels,
its torch/NumPy path, ``glaref.strategies``): the plan of (regime, config, sizes) rows, and the
rounding of a problem to the dtype the kernel receives (``glaref._rounding.round_to_dtype``), so
that the oracle is run on exactly the numbers the kernel sees, whatever its framework.
"""

from __future__ import annotations

from typing import Iterable

from .. import regimes as _regimes
from .._inputs import Dims, Problem
from .._rounding import round_to_dtype


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
