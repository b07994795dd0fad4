"""What a recurrence family brings to the audit, behind one small interface: :class:`Family`.

The engine (``_engine``), the records (``_records``) and the faces ask a family for everything
specific to its recurrence: the names of the arrays a kernel takes and returns, the regimes that
draw its inputs, how one problem is made, its oracle (``truth``: forward, vjp, error scales and
the reference kernels, computed once per problem), how the oracle is compiled before any timing,
and, with the oracle, the reference kernels a claim calls for.
:data:`SCALAR_GATE` is gated linear attention with a scalar (or per-key-dimension) gate, the
family every audit runs today.

A second family is a second ``Family`` value beside its oracle: the gated delta rule's is
``glaref.delta._family.DELTA``. The engine reaches a problem's arrays only through ``fields``
(name -> canonical array) and judges through the family's :class:`Judge` (its verdict, where
the error is, the message figures), so nothing in the engine, the runners or the records names a
family. ``FAMILIES`` (``_args``) lists them for ``--recurrence`` and ``recurrence=``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from .. import _judge, _probes, _problems, _where, regimes
from .._claims import Claims
from .._inputs import _KIND, ARRAYS, FORWARD, GRADS, Dims, Problem
from .._oracle import backend
from ._presets import ALL_REGIMES, PRESETS, Preset

__all__ = ["SCALAR_GATE", "Family", "Judge"]


@dataclass(frozen=True)
class Judge:
    """How a family's outputs are judged, as ``glaref._judge`` does it for the scalar gate:
    assess_outputs(truth, values, dtypes, final=, grads=, claims=) -> {output: Assessment};
    locate_nonfinite(per, values, layout); mismatches(truth, per, values, final=, grads=,
    claims=, layout=) -> {output: Mismatch}; row_profiles (``glaref._where.row_profiles``, or
    None: no error profile, the records' ``where`` empty); direct_log_alpha: the records carry
    dlog_alpha's budget_ulps on the direct form's scale beside the identity's."""

    assess_outputs: Callable[..., dict]
    locate_nonfinite: Callable[..., None]
    mismatches: Callable[..., dict]
    row_profiles: Callable[..., dict] | None
    direct_log_alpha: bool


@dataclass(frozen=True)
class Family:
    """One recurrence as the audit sees it.

    name: how reports name it (``--recurrence``). inputs: the arrays a kernel takes, in order;
    outputs: what it returns (the first always, the rest when it returns its final state); grads:
    the gradients, named by their inputs; arrays: every array of a problem (inputs and
    cotangents); kinds: each array's and output's layout kind (``glaref._inputs.to_canonical``).
    regimes: {name: regime} drawing inputs (each with ``cases(dims)``), all_regimes those
    "all" expands to. make_problem(regime, dims, seed, dtype, gate=, cu_seqlens=): one problem,
    rounded to dtype, reading its arrays as attributes (``p.q``, ``p.beta``) and replacing them
    with ``p.with_fields(**changes)`` (how ``glaref._frameworks`` and the probes handle every
    family's problems); fields(problem): its arrays by name (every name of ``arrays``, None where
    absent). truth(problem, scale, oracle_impl): the oracle's side of a problem (the interface of
    ``_judge.Truth``: forward, grads, scales, references, reference, budget_view, ms, and ``p``,
    the problem's ``glaref._inputs.Problem`` for its dims, offsets and states); truth also runs
    the family's reference kernels, those its claims call for. judge: how outputs are judged
    (:class:`Judge`). warm(oracle_impl, gate, packed): compile (or load) the oracle before any
    timing. kernels: the module of the built-in JAX kernels (imported on first use: jax);
    builtin_claims(module, name, claims): a built-in kernel's own claims. presets: {name:
    Preset}. oracle_bytes(dims, modes): about the most host memory the oracle side of one
    problem holds at once (the engine's memory guard declines a row beyond what is available).
    Every family is audited alike: kernels in JAX, torch and NumPy
    (``glaref._frameworks``, given the family's names and kinds), packed sequences (its
    make_problem's ``cu_seqlens``) and the probes (``glaref._probes``).
    header: keys the report's config and every record carry for this family (none for the
    scalar gate, whose reports predate the option).

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
    fields: Callable[[Any], dict]
    judge: Judge
    kernels: str
    builtin_claims: Callable[[Any, str, Claims], Claims]
    presets: Mapping[str, Preset]
    all_regimes: tuple[str, ...]
    oracle_bytes: Callable[[Dims, Iterable[str]], int]
    header: Mapping[str, str] = field(default_factory=dict)
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


def _scalar_oracle_bytes(dims: Dims, modes: Iterable[str]) -> int:
    """About the most host memory the engine's float64 arrays of one problem take at once.

    Counted in float64 elements, with qk = B G T dk (q, k, dq, dk), v = B H T dv (v, do, o, dv),
    hk = B H T dk (per-head dq, dk), g = B H T (log_alpha and its gradient), s = B H dk dv
    (h0, dh_T, h_T, dh0): the inputs and cotangents twice (generated, then rounded to the audited
    dtype; the copy handed to the kernel is the second on a CPU), the forward, its error scales
    and the two same-precision reference kernels' outputs (``glaref._baseline``), and for fwd_bwd
    the gradients, their scales (from per-head gradients), |inputs| and the references' gradients.
    Within 10 % of the peak measured on the seed's largest config (4, 2, 8, 128, 128) at T = 8192.
    """
    B, G, H, T, dk, dv = dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv
    qk, v, hk, g, s = B * G * T * dk, B * H * T * dv, B * H * T * dk, B * H * T, B * H * dk * dv
    inputs = 2 * qk + 2 * v + g + 2 * s
    grads = 2 * qk + v + g + s
    n = 2 * inputs + 2 * (v + s)                               # inputs twice, forward, its scales
    n += 2 * (v + s)                                           # the references' forward
    if "fwd_bwd" in modes:
        n += grads                                             # gradients
        n += (2 * qk + 2 * v + 2 * s)                          # |inputs| for the scales
        n += (2 * qk + v + 2 * g + s) + 2 * hk                 # gradient scales, per-head dq, dk
        n += 2 * (v + s + grads)                               # the references' fwd_bwd
    return 8 * n


def _scalar_fields(p: Problem) -> dict:
    return {n: getattr(p, n) for n in ARRAYS}


def _scalar_builtin_claims(module, name: str, claims: Claims) -> Claims:
    """glaref.kernels' ``name``: its chunk size (the ``chunk_size`` default; 1 for the scan),
    float32 accumulation, operands unrounded, segment-sum decays and its dlog_alpha form for the
    gate kind."""
    chunk = inspect.signature(getattr(module, name)).parameters.get("chunk_size")
    return claims.design(chunk_size=chunk.default if chunk is not None else 1,
                         accumulate_dtype="float32", operand_dtype=None, decay_form="segment_sums",
                         dlog_alpha_form=module.dlog_alpha_form(name, claims.gate))


SCALAR_GATE = Family(
    name="scalar_gate", inputs=GRADS, outputs=FORWARD, grads=GRADS, arrays=ARRAYS, kinds=_KIND,
    regimes=regimes.REGIMES, make_problem=_problems.make_problem, truth=_judge.Truth,
    warm=_warm_scalar_gate, fields=_scalar_fields,
    judge=Judge(_judge.assess_outputs, _judge.locate_nonfinite, _judge.mismatches,
                _where.row_profiles, direct_log_alpha=True),
    kernels="glaref.kernels", builtin_claims=_scalar_builtin_claims, presets=PRESETS,
    all_regimes=ALL_REGIMES, oracle_bytes=_scalar_oracle_bytes, causal=("o", "dq"),
    anticausal=("dk", "dv"),
    perturb=_perturb_scalar_gate)
