"""What a recurrence family brings to the audit, behind one small interface: :class:`Family`.

The engine (``_engine``), the records (``_records``) and the faces ask a family for everything
specific to its recurrence: the names of the arrays a kernel takes and returns, the regimes that
draw its inputs, how one problem is made, its oracle (``truth``: forward, vjp, error scales and
the reference kernels, computed once per problem), how the oracle is compiled before any timing,
and, with the oracle, the reference kernels a claim calls for.
:data:`SCALAR_GATE` is gated linear attention with a scalar (or per-key-dimension) gate, the
family every audit runs today.

A second family (the gated delta rule of ``glaref.delta``, say) is a second ``Family`` value: its
oracle module, regimes, problem maker and reference kernels. What still assumes the scalar-gate
family's arrays: ``glaref._inputs.Problem`` (the fields q, k, v, log_alpha, h0, do, dh_T), which
``truth`` and the runners take, and the proven bound of ``glaref._verdict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .. import _judge, _probes, _problems, regimes
from .._inputs import _KIND, ARRAYS, FORWARD, GRADS
from .._oracle import backend

__all__ = ["SCALAR_GATE", "Family"]


@dataclass(frozen=True)
class Family:
    """One recurrence as the audit sees it.

    name: how reports name it. inputs: the arrays a kernel takes, in order; outputs: what it
    returns (the first always, the rest when it returns its final state); grads: the gradients,
    named by their inputs; arrays: every array of a problem (inputs and cotangents); kinds: each
    array's layout kind (``glaref._inputs.to_canonical``). regimes: {name: regime} drawing inputs.
    make_problem(regime, dims, seed, dtype, gate=, cu_seqlens=): one problem, rounded to dtype.
    truth(problem, scale, oracle_impl): the oracle's side of a problem (``_judge.Truth``).
    truth also runs the family's reference kernels, those its claims call for (for this family
    the table of ``glaref._designs``). warm(oracle_impl, gate, packed): compile (or load) the
    oracle before any timing.

    For the probes (``glaref._probes``, which read the names and kinds above too): causal, the
    outputs and gradients (a gradient as ``d<input>``) whose step t depends on steps s <= t only;
    anticausal, those whose step t depends on steps s >= t only (none declared: the causality
    probe does not apply); perturb(name, values, rng): new values of the same magnitudes for
    the probes that change inputs (None: ``glaref._probes.perturb``, a random factor and shift)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    grads: tuple[str, ...]
    arrays: tuple[str, ...]
    kinds: Mapping[str, str]
    regimes: Mapping[str, Any]
    make_problem: Callable[..., Any]
    truth: Callable[..., _judge.Truth]
    warm: Callable[[str, str, bool], None]
    causal: tuple[str, ...] = ()
    anticausal: tuple[str, ...] = ()
    perturb: Callable[[str, np.ndarray, np.random.Generator], np.ndarray] | None = None


def _warm_scalar_gate(impl: str, gate: str = "scalar", packed: bool = False) -> None:
    """Compile the Numba oracle (if cached, load it) outside every timing, for the gate kind
    and packing the audit runs."""
    be = backend(impl)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 3, 2))
    v = rng.standard_normal((1, 1, 3, 2))
    la = -np.ones((1, 1, 3) if gate == "scalar" else (1, 1, 3, 2))
    h0 = np.zeros((1, 1, 2, 2))
    be.forward(q, q, v, la, h0, 1.0)
    be.vjp(q, q, v, la, h0, v, h0, 1.0)
    if packed:
        cu = np.array([0, 1, 3])
        h0 = np.zeros((2, 1, 2, 2))
        be.forward(q, q, v, la, h0, 1.0, cu_seqlens=cu)
        be.vjp(q, q, v, la, h0, v, h0, 1.0, cu_seqlens=cu)


def _perturb_scalar_gate(name: str, part: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The probes' perturbation, log_alpha kept negative (scaled by a random factor only)."""
    if name == "log_alpha":
        return part * rng.uniform(0.5, 1.5, part.shape)
    return _probes.perturb(name, part, rng)


SCALAR_GATE = Family(
    name="scalar_gate", inputs=GRADS, outputs=FORWARD, grads=GRADS, arrays=ARRAYS, kinds=_KIND,
    regimes=regimes.REGIMES, make_problem=_problems.make_problem, truth=_judge.Truth,
    warm=_warm_scalar_gate, causal=("o", "dq"), anticausal=("dk", "dv"),
    perturb=_perturb_scalar_gate)
