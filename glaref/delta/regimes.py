"""Named, seeded, reproducible inputs of the gated delta rule: the regimes where this family
breaks. ``make_inputs(regime, dims, seed, gate="scalar", cu_seqlens=None)`` is a pure function
of its arguments and returns a ``DeltaProblem`` (canonical float64 "bhtd" arrays of ``glaref._inputs.Problem``
and beta (B, H, T)); ``REGIMES[name].cases(dims)`` lists the sizes a regime runs.

Unless a regime says otherwise: q and k L2-normalised per step (flash-linear-attention's
``use_qk_l2norm_in_kernel``), v, h0, do, dh_T ~ N(0, 1), beta = sigmoid(N(0, 1)) in (0, 1),
log_alpha = logsigmoid(N(0, 1) + 2) (alpha ~ 0.88, Gated DeltaNet's mild forgetting).
``gate="vector"`` draws log_alpha per key dimension (KDA) from the same distribution.

    standard        as above
    beta_near_zero  beta ~ 1e-4 U(0.5, 1.5): the state barely moves; dbeta is a sum of
                    cancelling products
    beta_near_one   beta = 1 - 1e-4 U(0, 1): each step (I - k k^T) projects k's direction out
    beta_two        beta ~ U(1.5, 2) (FLA's allow_neg_eigval): eigenvalue 1 - beta in k's
                    direction, near -1 (a reflection: no forgetting along k)
    gate_one        log_alpha = 0 exactly (DeltaNet; FLA issue 389)
    strong_decay    log_alpha = logsigmoid(N(0, 1)) / 0.1, down to ~ -30 per step
    positive        log_alpha ~ U(0, 4 / T): the state grows, exp(sum) <= e^4
    converged       h0 = W, v_t = W^T k_t + 1e-6 N(0, 1), log_alpha = 0: the state stays ~ W
                    and v_t - S~_t^T k_t ~ 1e-6 |v| cancels (in bfloat16 it rounds to zero)
    near_one_long   log_alpha ~ -1e-4 U(0.5, 1.5) at T = 4096 (dk, dv <= 16)
    h0_dominant     h0 ~ 1e3 N(0, 1), alpha ~ 0.98
    unnormalised    k ~ N(0, 1/dk) not normalised: beta ||k||^2 spreads over (0, ~4), steps
                    with beta ||k||^2 > 2 amplify the state (eigenvalue below -1)
    ragged          standard at T in (0, 1, 63, 65, 1000)
    grouped         standard with G = 1 group of q, k for all H heads (dq, dk summed over H)

Packed sequences (``cu_seqlens``, B = 1): h0 and dh_T get one row per sequence (N, H, dk, dv),
converged draws one W per sequence (each sequence's v_t asks for its own state), and the
problem carries the offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .._inputs import Dims, Problem, check_cu_seqlens
from ..regimes import GATES, lookup
from ._oracle import DeltaProblem

__all__ = ["CONVERGED_NOISE", "GATE_SHIFT", "LONG_MAX_D", "LONG_T", "NEAR_ONE_BETA",
           "NEAR_ONE_LOG_ALPHA", "NEAR_ZERO_BETA", "RAGGED_T", "REGIMES", "Regime",
           "STRONG_DECAY_DIVISOR", "get", "make_inputs"]

RAGGED_T = (0, 1, 63, 65, 1000)
LONG_T = 4096
LONG_MAX_D = 16
GATE_SHIFT = 2.0            # standard gates: logsigmoid(N(0, 1) + 2)
H0_DOMINANT_SCALE = 1e3
H0_DOMINANT_SHIFT = 4.0
CONVERGED_NOISE = 1e-6
NEAR_ZERO_BETA = 1e-4
NEAR_ONE_BETA = 1e-4
STRONG_DECAY_DIVISOR = 0.1
NEAR_ONE_LOG_ALPHA = -1e-4


def _logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def _l2(x):
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n == 0, 1.0, n)


@dataclass(frozen=True)
class _Draw:
    """What a regime changes from the standard draw."""

    gates: Callable | None = None        # (rng, shape, T) -> log_alpha
    beta: Callable | None = None         # (rng, shape) -> beta
    l2_keys: bool = True
    h0_scale: float = 1.0
    converged: bool = False


def _standard_gates(rng, shape, T):
    return _logsigmoid(rng.standard_normal(shape) + GATE_SHIFT)


def _draw(dims: Dims, rng: np.random.Generator, gate: str, d: _Draw,
          cu: np.ndarray | None = None) -> DeltaProblem:
    B, G, H, T, dk, dv = dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv
    N = B if cu is None else len(cu) - 1            # states: one per batch row, or per sequence
    q = _l2(rng.standard_normal((B, G, T, dk)))
    k = rng.standard_normal((B, G, T, dk))
    k = _l2(k) if d.l2_keys else k / np.sqrt(max(dk, 1))
    v = rng.standard_normal((B, H, T, dv))
    gshape = (B, H, T, dk) if gate == "vector" else (B, H, T)
    la = (d.gates or _standard_gates)(rng, gshape, T)
    beta = (d.beta(rng, (B, H, T)) if d.beta else 1.0 / (1.0 + np.exp(-rng.standard_normal((B, H, T)))))
    h0 = d.h0_scale * rng.standard_normal((N, H, dk, dv))
    if d.converged:
        # the state already holds W; every v_t asks for what W gives, up to 1e-6
        W = rng.standard_normal((N, H, dk, dv))
        h0 = W.copy()
        kh = np.repeat(k, H // G, axis=1)
        if cu is None:
            v = np.einsum("bhtk,bhkv->bhtv", kh, W)
        else:           # step t asks for the W of its own sequence
            seq = np.searchsorted(cu, np.arange(T), side="right") - 1
            v = np.einsum("bhtk,thkv->bhtv", kh, W[seq])
        v = v + CONVERGED_NOISE * rng.standard_normal(v.shape)
    do = rng.standard_normal((B, H, T, dv))
    dh_T = rng.standard_normal((N, H, dk, dv))
    return DeltaProblem(Problem(q, k, v, la, h0, do, dh_T, dims, cu), beta)


@dataclass(frozen=True)
class Regime:
    name: str
    description: str
    draw: _Draw
    cases_fn: Callable[[Dims], list[Dims]] | None = None

    def cases(self, dims: Dims) -> list[Dims]:
        """The sizes this regime runs for the requested size ``dims``."""
        return [dims] if self.cases_fn is None else self.cases_fn(dims)


def _ragged(dims):
    return [replace(dims, T=T) for T in RAGGED_T]


def _long(dims):
    return [replace(dims, T=LONG_T, dk=min(dims.dk, LONG_MAX_D), dv=min(dims.dv, LONG_MAX_D))]


def _grouped(dims):
    return [replace(dims, G=1)]


REGIMES: dict[str, Regime] = {r.name: r for r in (
    Regime("standard", "L2 keys, beta = sigmoid(N(0,1)), log_alpha = logsigmoid(N(2,1))", _Draw()),
    Regime("beta_near_zero", "beta ~ 1e-4 U(0.5, 1.5)",
           _Draw(beta=lambda rng, s: NEAR_ZERO_BETA * rng.uniform(0.5, 1.5, s))),
    Regime("beta_near_one", "beta = 1 - 1e-4 U(0, 1)",
           _Draw(beta=lambda rng, s: 1.0 - NEAR_ONE_BETA * rng.random(s))),
    Regime("beta_two", "beta ~ U(1.5, 2): eigenvalue 1 - beta near -1 along k",
           _Draw(beta=lambda rng, s: rng.uniform(1.5, 2.0, s))),
    Regime("gate_one", "log_alpha = 0 exactly (DeltaNet)",
           _Draw(gates=lambda rng, s, T: np.zeros(s))),
    Regime("strong_decay", "log_alpha = logsigmoid(N(0,1)) / 0.1, down to ~ -30",
           _Draw(gates=lambda rng, s, T: _logsigmoid(rng.standard_normal(s))
                 / STRONG_DECAY_DIVISOR)),
    Regime("positive", "log_alpha ~ U(0, 4/T) > 0: growth, exp(sum) <= e^4",
           _Draw(gates=lambda rng, s, T: rng.uniform(0.0, 4.0 / max(T, 1), s))),
    Regime("converged", "h0 = W, v = W^T k + 1e-6 N(0,1), log_alpha = 0: v - S~^T k ~ 1e-6",
           _Draw(gates=lambda rng, s, T: np.zeros(s), converged=True)),
    Regime("near_one_long", "log_alpha ~ -1e-4 U(0.5, 1.5) at T = 4096, dk, dv <= 16",
           _Draw(gates=lambda rng, s, T: NEAR_ONE_LOG_ALPHA * rng.uniform(0.5, 1.5, s)),
           _long),
    Regime("h0_dominant", "h0 ~ 1e3 N(0,1), log_alpha = logsigmoid(N(4,1))",
           _Draw(gates=lambda rng, s, T: _logsigmoid(rng.standard_normal(s) + H0_DOMINANT_SHIFT),
                 h0_scale=H0_DOMINANT_SCALE)),
    Regime("unnormalised", "k ~ N(0, 1/dk), not normalised: beta ||k||^2 up to ~ 4",
           _Draw(l2_keys=False)),
    Regime("ragged", "standard at T in (0, 1, 63, 65, 1000)", _Draw(), _ragged),
    Regime("grouped", "standard with G = 1 (all heads share q, k)", _Draw(), _grouped),
)}


def get(regime: str) -> Regime:
    """The regime named ``regime`` (ValueError naming the known ones otherwise)."""
    return lookup(REGIMES, regime)


def make_inputs(regime: str, dims: Dims, seed: int = 0, *, gate: str = "scalar",
                cu_seqlens=None) -> DeltaProblem:
    """The float64 "bhtd" inputs, beta and cotangents of ``regime`` at ``dims`` from ``seed``:
    the same arguments always give the same arrays. ``cu_seqlens``: packed sequences
    (dims.B = 1; ``glaref._inputs.check_cu_seqlens``), a stream of their own per set of
    offsets."""
    r = get(regime)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: got {seed!r}, expected a non-negative integer")
    if gate not in GATES:
        raise ValueError(f"gate: got {gate!r}, expected one of {GATES}")
    key = [int(seed), dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv, GATES.index(gate),
           list(REGIMES).index(regime)]
    cu = check_cu_seqlens(cu_seqlens, dims.B, dims.T)
    if cu is not None:
        key += [len(cu)] + cu.tolist()
    return _draw(dims, np.random.default_rng(key), gate, r.draw, cu)
