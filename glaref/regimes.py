"""Named, seeded, reproducible input generators ("regimes") for the audit and the tests.

A regime turns a problem size (``Dims``) and a seed into float64 "bhtd" inputs and cotangents
(an ``_inputs.Problem``). ``Regime.cases(dims)`` lists the sizes a regime actually runs (most
return ``[dims]``; a regime may change T or dk/dv, e.g. ragged lengths).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ._inputs import Dims, Problem


def _logsigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def _normal_problem(dims: Dims, rng: np.random.Generator, log_alpha: np.ndarray,
                    qkv_scale: float = 1.0, h0_scale: float = 1.0) -> Problem:
    B, G, H, T, dk, dv = dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv
    # q and k scaled by 1/sqrt(dk) as attention does, so o stays O(1) in dk.
    s = qkv_scale / np.sqrt(max(dk, 1))
    q = s * rng.standard_normal((B, G, T, dk))
    k = s * rng.standard_normal((B, G, T, dk))
    v = qkv_scale * rng.standard_normal((B, H, T, dv))
    h0 = h0_scale * rng.standard_normal((B, H, dk, dv))
    do = rng.standard_normal((B, H, T, dv))
    dh_T = rng.standard_normal((B, H, dk, dv))
    return Problem(q, k, v, log_alpha, h0, do, dh_T, dims)


def _standard(dims: Dims, rng: np.random.Generator) -> Problem:
    la = _logsigmoid(rng.standard_normal((dims.B, dims.H, dims.T)))
    return _normal_problem(dims, rng, la)


@dataclass(frozen=True)
class Regime:
    name: str
    description: str
    make: Callable[[Dims, np.random.Generator], Problem]
    slow: bool = False
    cases_fn: Callable[[Dims], list[Dims]] | None = field(default=None)

    def cases(self, dims: Dims) -> list[Dims]:
        return [dims] if self.cases_fn is None else self.cases_fn(dims)


REGIMES: dict[str, Regime] = {
    "standard": Regime("standard", "log_alpha = logsigmoid(N(0,1)); q, k ~ N(0, 1/dk); v, h0, do, dh_T ~ N(0,1)",
                       _standard),
}


def make_inputs(regime: str, dims: Dims, seed: int = 0) -> Problem:
    """The float64 "bhtd" inputs and cotangents of ``regime`` at size ``dims``, from ``seed``."""
    try:
        r = REGIMES[regime]
    except KeyError:
        raise ValueError(f"regime: got {regime!r}, expected one of {sorted(REGIMES)}") from None
    rng = np.random.default_rng([seed, dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv])
    return r.make(dims, rng)
