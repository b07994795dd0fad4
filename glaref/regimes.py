"""Named, seeded, reproducible input generators ("regimes") for the audit and the tests.

A regime turns a problem size (``Dims``) and a seed into float64 "bhtd" inputs and cotangents
(an ``_inputs.Problem``). ``Regime.cases(dims)`` lists the sizes a regime actually runs: most
return ``[dims]``; ``ragged`` changes T, ``tiny_dims`` sets dk = dv = 1, ``long`` runs T = 65536
on a small configuration. ``make_inputs(regime, dims, seed)`` is a pure function of its arguments
(the generator is seeded from the seed *and* the sizes), so a failing case is reproduced from
the three values printed beside it.

Every regime draws random cotangents do, dh_T ~ N(0, 1) and, unless it says otherwise,
h0 ~ N(0, 1). q and k are N(0, 1/dk) (attention's 1/sqrt(dk) scaling, so o stays O(1) in dk).

    standard      log_alpha = logsigmoid(z), z ~ N(0, 1)                 (alpha ~ 0.5, FLA simple_gla)
    strong_decay  log_alpha = logsigmoid(z) / 0.1                        (per-step log decay down to ~ -30)
    near_one      log_alpha ~ -1e-4 * U(0.5, 1.5)                        (almost no decay: long memory)
    zero_gate     log_alpha = 0 exactly                                  (no decay: sums grow over all of T)
    positive      log_alpha ~ U(0, 4 / T), mean sum 2 over T             (growth, exp(sum) <= e^4)
    large_values  q, k, v 100x larger (|q|, |k| ~ 1e2/sqrt(dk), |v| ~ 1e2), standard gates
    h0_dominant   h0 ~ 1e3 N(0, 1), mild gates logsigmoid(z + 4) (alpha ~ 0.98)
    zero_inputs   q = k = v = h0 = 0, mild gates logsigmoid(z + 4) (exact zeros must stay zeros;
                  the only nonzero result is dh0 = (prod alpha) dh_T)
    ragged        standard, at T in (1, 63, 65, 1000)                    (chunk-boundary cases)
    tiny_dims     standard, at dk = dv = 1
    long          standard, T = 65536, B = G = H = 1, dk, dv <= 16       (slow)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from ._inputs import Dims, Problem

RAGGED_T = (1, 63, 65, 1000)
LONG_T = 65536
LONG_MAX_D = 16

# Scale factors of the regimes, named so the tests check the statistics the docstring promises.
STRONG_DECAY_DIVISOR = 0.1
NEAR_ONE_LOG_ALPHA = -1e-4
POSITIVE_TOTAL_MEAN = 2.0      # mean of sum_t log_alpha_t over the whole sequence
LARGE_VALUES_SCALE = 1e2
H0_DOMINANT_SCALE = 1e3
H0_DOMINANT_GATE_SHIFT = 4.0


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


def _gate_shape(dims: Dims) -> tuple[int, int, int]:
    return (dims.B, dims.H, dims.T)


def _standard_gates(dims: Dims, rng: np.random.Generator) -> np.ndarray:
    return _logsigmoid(rng.standard_normal(_gate_shape(dims)))


def _standard(dims: Dims, rng: np.random.Generator) -> Problem:
    return _normal_problem(dims, rng, _standard_gates(dims, rng))


def _strong_decay(dims: Dims, rng: np.random.Generator) -> Problem:
    la = _logsigmoid(rng.standard_normal(_gate_shape(dims))) / STRONG_DECAY_DIVISOR
    return _normal_problem(dims, rng, la)


def _near_one(dims: Dims, rng: np.random.Generator) -> Problem:
    la = NEAR_ONE_LOG_ALPHA * rng.uniform(0.5, 1.5, _gate_shape(dims))
    return _normal_problem(dims, rng, la)


def _zero_gate(dims: Dims, rng: np.random.Generator) -> Problem:
    return _normal_problem(dims, rng, np.zeros(_gate_shape(dims)))


def _positive(dims: Dims, rng: np.random.Generator) -> Problem:
    # U(0, 2m/T) has mean m/T, so sum_t log_alpha_t has mean m and is at most 2m: exp(sum) stays
    # finite and moderate (<= e^4) at every T, while every step grows the state.
    hi = 2.0 * POSITIVE_TOTAL_MEAN / max(dims.T, 1)
    return _normal_problem(dims, rng, rng.uniform(0.0, hi, _gate_shape(dims)))


def _large_values(dims: Dims, rng: np.random.Generator) -> Problem:
    return _normal_problem(dims, rng, _standard_gates(dims, rng), qkv_scale=LARGE_VALUES_SCALE)


def _h0_dominant(dims: Dims, rng: np.random.Generator) -> Problem:
    la = _logsigmoid(rng.standard_normal(_gate_shape(dims)) + H0_DOMINANT_GATE_SHIFT)
    return _normal_problem(dims, rng, la, h0_scale=H0_DOMINANT_SCALE)


def _zero_inputs(dims: Dims, rng: np.random.Generator) -> Problem:
    # Mild gates, so that the one nonzero result, dh0 = (prod_t alpha_t) dh_T, stays well inside
    # float32's range at the sizes the audit runs and still tests how the decays are applied.
    la = _logsigmoid(rng.standard_normal(_gate_shape(dims)) + H0_DOMINANT_GATE_SHIFT)
    p = _normal_problem(dims, rng, la)
    z = np.zeros_like
    return p._replace(q=z(p.q), k=z(p.k), v=z(p.v), h0=z(p.h0))


def _ragged_cases(dims: Dims) -> list[Dims]:
    return [replace(dims, T=T) for T in RAGGED_T]


def _tiny_cases(dims: Dims) -> list[Dims]:
    return [replace(dims, dk=1, dv=1)]


def _long_cases(dims: Dims) -> list[Dims]:
    return [Dims(1, 1, 1, LONG_T, min(dims.dk, LONG_MAX_D), min(dims.dv, LONG_MAX_D))]


@dataclass(frozen=True)
class Regime:
    name: str
    description: str
    make: Callable[[Dims, np.random.Generator], Problem]
    slow: bool = False
    cases_fn: Callable[[Dims], list[Dims]] | None = field(default=None)

    def cases(self, dims: Dims) -> list[Dims]:
        """The problem sizes this regime runs for the requested size ``dims``."""
        return [dims] if self.cases_fn is None else self.cases_fn(dims)


def _r(name, description, make, slow=False, cases_fn=None) -> tuple[str, Regime]:
    return name, Regime(name, description, make, slow, cases_fn)


REGIMES: dict[str, Regime] = dict([
    _r("standard", "log_alpha = logsigmoid(N(0,1)); q, k ~ N(0, 1/dk); v, h0, do, dh_T ~ N(0,1)",
       _standard),
    _r("strong_decay", "log_alpha = logsigmoid(N(0,1)) / 0.1: per-step log decays down to ~ -30",
       _strong_decay),
    _r("near_one", "log_alpha ~ -1e-4 * U(0.5, 1.5): almost no decay", _near_one),
    _r("zero_gate", "log_alpha = 0: no decay, sums grow over the whole sequence", _zero_gate),
    _r("positive", "log_alpha ~ U(0, 4/T) > 0: the state grows, exp(sum) <= e^4", _positive),
    _r("large_values", "q, k, v 100x larger than standard (|v| ~ 1e2), standard gates", _large_values),
    _r("h0_dominant", "h0 ~ 1e3 N(0,1), mild gates logsigmoid(N(4,1)) (alpha ~ 0.98)", _h0_dominant),
    _r("zero_inputs", "q = k = v = h0 = 0, mild gates logsigmoid(N(4,1)), random do and dh_T",
       _zero_inputs),
    _r("ragged", "standard inputs at T in (1, 63, 65, 1000)", _standard, cases_fn=_ragged_cases),
    _r("tiny_dims", "standard inputs at dk = dv = 1", _standard, cases_fn=_tiny_cases),
    _r("long", "standard inputs, T = 65536, B = G = H = 1, dk, dv <= 16", _standard, slow=True,
       cases_fn=_long_cases),
])

DEFAULT_REGIMES = tuple(name for name, r in REGIMES.items() if not r.slow)


def get(regime: str) -> Regime:
    """The regime named ``regime`` (ValueError naming the known ones otherwise)."""
    try:
        return REGIMES[regime]
    except (KeyError, TypeError):
        raise ValueError(f"regime: got {regime!r}, expected one of {sorted(REGIMES)}") from None


def make_inputs(regime: str, dims: Dims, seed: int = 0) -> Problem:
    """The float64 "bhtd" inputs and cotangents of ``regime`` at size ``dims``, from ``seed``.

    ``dims`` is one of ``REGIMES[regime].cases(...)``'s sizes (any size is accepted: the generator
    does not re-apply ``cases``). The same (regime, dims, seed) always gives the same arrays.
    """
    r = get(regime)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: got {seed!r}, expected a non-negative integer")
    rng = np.random.default_rng([int(seed), dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv])
    return r.make(dims, rng)
