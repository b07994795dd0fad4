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
    mixed_dims    per gate channel a class: near 1, standard or strongly decayed (not default)

Gate kinds. ``make_inputs(..., gate="vector")`` makes vector gates, log_alpha (B, H, T, dk): every
regime draws its gates per key dimension from the same distribution (strong_decay, say, decays
every dimension strongly). ``mixed_dims`` is the regime of per-dimension variety: each key
dimension of each head is, for the whole sequence, near 1 (-1e-4 * U(0.5, 1.5)), standard
(logsigmoid(N(0, 1))) or strongly decayed (logsigmoid(N(0, 1)) / 0.1, down to ~ -30), with
probabilities 1/3 each; with scalar gates the class is drawn per head instead. It is not among
``DEFAULT_REGIMES`` (the audit's default grid is unchanged); ask for it by name. With
``gate="scalar"`` (the default) every regime draws exactly what it drew before vector gates
existed: the same arrays for the same (regime, dims, seed).

Packed sequences. ``make_inputs(..., cu_seqlens=cu)`` (B = 1) gives h0 and dh_T one row per
sequence, (N, H, dk, dv), and sets ``Problem.cu_seqlens``; ``random_cu_seqlens(T, N, seed)``
draws N random lengths (empty ones included) that fill T.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

import numpy as np

from ._inputs import Dims, Problem, check_cu_seqlens

__all__ = ["DEFAULT_REGIMES", "GATES", "LARGE_VALUES_SCALE", "LONG_MAX_D", "LONG_T",
           "MIXED_NEAR_ONE", "NEAR_ONE_LOG_ALPHA", "POSITIVE_TOTAL_MEAN", "RAGGED_T", "REGIMES",
           "Regime", "STRONG_DECAY_DIVISOR", "get", "lookup", "make_inputs", "random_cu_seqlens"]

GATES = ("scalar", "vector")

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
MIXED_NEAR_ONE = -1e-4          # mixed_dims: the "near 1" class, times U(0.5, 1.5)


class _Spec(NamedTuple):
    """What a regime makes besides the sizes: the gate kind and the number of states (B, or N
    packed sequences)."""

    gate: str
    n_states: int


def _logsigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def _normal_problem(dims: Dims, rng: np.random.Generator, log_alpha: np.ndarray, spec: _Spec,
                    qkv_scale: float = 1.0, h0_scale: float = 1.0) -> Problem:
    B, G, H, T, dk, dv = dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv
    NS = spec.n_states
    # q and k scaled by 1/sqrt(dk) as attention does, so o stays O(1) in dk.
    s = qkv_scale / np.sqrt(max(dk, 1))
    q = s * rng.standard_normal((B, G, T, dk))
    k = s * rng.standard_normal((B, G, T, dk))
    v = qkv_scale * rng.standard_normal((B, H, T, dv))
    h0 = h0_scale * rng.standard_normal((NS, H, dk, dv))
    do = rng.standard_normal((B, H, T, dv))
    dh_T = rng.standard_normal((NS, H, dk, dv))
    return Problem(q, k, v, log_alpha, h0, do, dh_T, dims)


def _gate_shape(dims: Dims, spec: _Spec) -> tuple[int, ...]:
    if spec.gate == "vector":
        return (dims.B, dims.H, dims.T, dims.dk)
    return (dims.B, dims.H, dims.T)


def _standard_gates(dims: Dims, rng: np.random.Generator, spec: _Spec) -> np.ndarray:
    return _logsigmoid(rng.standard_normal(_gate_shape(dims, spec)))


def _standard(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    return _normal_problem(dims, rng, _standard_gates(dims, rng, spec), spec)


def _strong_decay(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    la = _logsigmoid(rng.standard_normal(_gate_shape(dims, spec))) / STRONG_DECAY_DIVISOR
    return _normal_problem(dims, rng, la, spec)


def _near_one(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    la = NEAR_ONE_LOG_ALPHA * rng.uniform(0.5, 1.5, _gate_shape(dims, spec))
    return _normal_problem(dims, rng, la, spec)


def _zero_gate(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    return _normal_problem(dims, rng, np.zeros(_gate_shape(dims, spec)), spec)


def _positive(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    # U(0, 2m/T) has mean m/T, so sum_t log_alpha_t has mean m and is at most 2m: exp(sum) stays
    # finite and moderate (<= e^4) at every T, while every step grows the state.
    hi = 2.0 * POSITIVE_TOTAL_MEAN / max(dims.T, 1)
    return _normal_problem(dims, rng, rng.uniform(0.0, hi, _gate_shape(dims, spec)), spec)


def _large_values(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    return _normal_problem(dims, rng, _standard_gates(dims, rng, spec), spec,
                           qkv_scale=LARGE_VALUES_SCALE)


def _h0_dominant(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    la = _logsigmoid(rng.standard_normal(_gate_shape(dims, spec)) + H0_DOMINANT_GATE_SHIFT)
    return _normal_problem(dims, rng, la, spec, h0_scale=H0_DOMINANT_SCALE)


def _zero_inputs(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    # Mild gates, so that the one nonzero result, dh0 = (prod_t alpha_t) dh_T, stays well inside
    # float32's range at the sizes the audit runs and still tests how the decays are applied.
    la = _logsigmoid(rng.standard_normal(_gate_shape(dims, spec)) + H0_DOMINANT_GATE_SHIFT)
    p = _normal_problem(dims, rng, la, spec)
    z = np.zeros_like
    return p._replace(q=z(p.q), k=z(p.k), v=z(p.v), h0=z(p.h0))


def _mixed_dims(dims: Dims, rng: np.random.Generator, spec: _Spec) -> Problem:
    # One class per gate channel, fixed over time: per key dimension of each head (vector gates)
    # or per head (scalar gates). 0: near 1, 1: standard, 2: strongly decayed.
    shape = _gate_shape(dims, spec)
    channel = shape[:2] + shape[3:]                       # (B, H) or (B, H, dk)
    cls = np.expand_dims(rng.integers(0, 3, channel), 2)  # broadcast over time
    z = _logsigmoid(rng.standard_normal(shape))
    near = MIXED_NEAR_ONE * rng.uniform(0.5, 1.5, shape)
    la = np.select([cls == 0, cls == 1], [near, z], z / STRONG_DECAY_DIVISOR)
    return _normal_problem(dims, rng, la, spec)


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
    make: Callable[[Dims, np.random.Generator, _Spec], Problem]
    slow: bool = False
    cases_fn: Callable[[Dims], list[Dims]] | None = field(default=None)
    default: bool = True     # among DEFAULT_REGIMES (when not slow)

    def cases(self, dims: Dims) -> list[Dims]:
        """The problem sizes this regime runs for the requested size ``dims``."""
        return [dims] if self.cases_fn is None else self.cases_fn(dims)


def _r(name, description, make, slow=False, cases_fn=None, default=True) -> tuple[str, Regime]:
    return name, Regime(name, description, make, slow, cases_fn, default)


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
    _r("mixed_dims", "per key dimension (vector gates) or per head (scalar gates): near 1, "
       "standard or strongly decayed (to ~ -30), fixed over time", _mixed_dims, default=False),
])

DEFAULT_REGIMES = tuple(name for name, r in REGIMES.items() if not r.slow and r.default)


def lookup(table, regime: str):
    """``table[regime]``: a family's regime by name, or a ValueError naming the known ones."""
    try:
        return table[regime]
    except (KeyError, TypeError):
        raise ValueError(f"regime: got {regime!r}, expected one of {sorted(table)}") from None


def get(regime: str) -> Regime:
    """The regime named ``regime`` (ValueError naming the known ones otherwise)."""
    return lookup(REGIMES, regime)


def make_inputs(regime: str, dims: Dims, seed: int = 0, *, gate: str = "scalar",
                cu_seqlens=None) -> Problem:
    """The float64 "bhtd" inputs and cotangents of ``regime`` at size ``dims``, from ``seed``.

    ``dims`` is one of ``REGIMES[regime].cases(...)``'s sizes (any size is accepted: the generator
    does not re-apply ``cases``). The same (regime, dims, seed, gate, cu_seqlens) always gives
    the same arrays; the scalar-gate arrays are those of the three positional arguments alone.
    ``gate``: "scalar" (log_alpha (B, H, T)) or "vector" ((B, H, T, dk)). ``cu_seqlens``: packed
    sequences (dims.B = 1): h0 and dh_T are (N, H, dk, dv) and the problem carries the offsets.
    """
    r = get(regime)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: got {seed!r}, expected a non-negative integer")
    if gate not in GATES:
        raise ValueError(f"gate: got {gate!r}, expected one of {GATES}")
    cu = check_cu_seqlens(cu_seqlens, dims.B, dims.T)
    spec = _Spec(gate, dims.B if cu is None else len(cu) - 1)
    key = [int(seed), dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv]
    if cu is not None:   # packed: a stream of its own per set of offsets
        key += [len(cu)] + cu.tolist()
    rng = np.random.default_rng(key)
    p = r.make(dims, rng, spec)
    return p if cu is None else p._replace(cu_seqlens=cu)


def random_cu_seqlens(T: int, N: int, seed: int = 0) -> np.ndarray:
    """Offsets of N packed sequences filling T steps, lengths random (empty ones allowed): the
    N - 1 inner offsets are uniform on [0, T], sorted. A pure function of (T, N, seed)."""
    if N < 1:
        raise ValueError(f"N: got {N!r}, expected a positive number of sequences")
    if T < 0:
        raise ValueError(f"T: got {T!r}, expected a non-negative number of steps")
    rng = np.random.default_rng([int(seed), T, N])
    inner = np.sort(rng.integers(0, T + 1, N - 1))
    return np.concatenate([[0], inner, [T]]).astype(np.int64)
