"""What a recurrence family brings to the audit, behind one small interface: :class:`Family`.

The engine (``_engine``), the records (``_records``) and the faces ask a family for everything
specific to its recurrence: the names of the arrays a kernel takes and returns, the regimes that
draw its inputs, how one problem is made, its oracle (``truth``: forward, vjp, error scales and
the reference kernels, computed once per problem), how the oracle is compiled before any timing,
and, with the oracle, the reference kernels a claim calls for.
``glaref.gla._family.SCALAR_GATE`` is gated linear attention with a scalar (or per-key-dimension) gate, the
family every audit runs today.

A second family is a second ``Family`` value beside its oracle: the gated delta rule's is
``glaref.delta._family.DELTA``. The engine reaches a problem's arrays only through ``fields``
(name -> canonical array) and judges through the family's :class:`Judge` (its verdict, where
the error is, the message figures), so nothing in the engine, the runners or the records names a
family. ``FAMILIES`` (``_claims``) lists them for ``--recurrence`` and ``recurrence=``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

import numpy as np

from .._inputs import Dims
from ._claims import Claims
from ._presets import Preset

__all__ = ["Family", "Judge", "Truth"]


class Truth(Protocol):
    """The oracle's side of one problem, as a family's ``truth`` makes it (``glaref.gla._judge.Truth``,
    ``glaref.delta._family``'s): every result computed once on first use and timed apart in ``ms``
    (never counted as the kernel's). ``p``: the problem's ``glaref._inputs.Problem`` (its dims,
    offsets and states); forward(): the oracle's outputs; grads(with_dh_T): its gradients;
    scales(with_dh_T, with_grads): the error scales by output; references(...): the reference
    kernels' outputs a claim calls for; reference(name, with_dh_T): the oracle's value of one
    output; budget_view(): (dims, log_alpha) as the proven bound takes them."""

    p: Any
    ms: dict[str, float]

    def forward(self) -> Any: ...

    def grads(self, with_dh_T: bool) -> Any: ...

    def scales(self, with_dh_T: bool, with_grads: bool) -> dict[str, np.ndarray]: ...

    def references(self, *args: Any, **kwargs: Any) -> dict[str, dict[str, np.ndarray]]: ...

    def reference(self, name: str, with_dh_T: bool) -> np.ndarray: ...

    def budget_view(self) -> Any: ...


@dataclass(frozen=True)
class Judge:
    """How a family's outputs are judged, as ``glaref.gla._judge`` does it for the scalar gate:
    assess_outputs(truth, values, dtypes, final=, grads=, claims=) -> {output: Assessment};
    locate_nonfinite(per, values, layout); mismatches(truth, per, values, final=, grads=,
    claims=, layout=) -> {output: Mismatch}; row_profiles (``glaref.gla._where.row_profiles``, or
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
    with ``p.with_fields(**changes)`` (how ``glaref._audit._frameworks`` and the probes handle every
    family's problems); fields(problem): its arrays by name (every name of ``arrays``, None where
    absent). truth(problem, scale, oracle_impl): the oracle's side of a problem (:class:`Truth`:
    forward, grads, scales, references, reference, budget_view, ms, and ``p``, the problem's
    ``glaref._inputs.Problem`` for its dims, offsets and states); truth also runs
    the family's reference kernels, those its claims call for. judge: how outputs are judged
    (:class:`Judge`). warm(oracle_impl, gate, packed): compile (or load) the oracle before any
    timing. kernels: the module of the built-in JAX kernels (imported on first use: jax);
    builtin_claims(module, name, claims): a built-in kernel's own claims. presets: {name:
    Preset}. oracle_bytes(dims, modes): about the most host memory the oracle side of one
    problem holds at once (the engine's memory guard declines a row beyond what is available).
    Every family is audited alike: kernels in JAX, torch and NumPy
    (``glaref._audit._frameworks``, given the family's names and kinds), packed sequences (its
    make_problem's ``cu_seqlens``) and the probes (``glaref._audit._probes``).
    header: keys the report's config and every record carry for this family (none for the
    scalar gate, whose reports predate the option).

    For the probes (``glaref._audit._probes``, which read the names and kinds above too): causal, the
    outputs and gradients (a gradient as ``d<input>``) whose step t depends on steps s <= t only;
    anticausal, those whose step t depends on steps s >= t only (none declared: the causality
    probe does not apply); perturb(name, values, rng): new values of the same magnitudes for
    the probes that change inputs (None: ``glaref._audit._probes.perturb``, a random factor and shift)."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    grads: tuple[str, ...]
    arrays: tuple[str, ...]
    kinds: Mapping[str, str]
    regimes: Mapping[str, Any]
    make_problem: Callable[..., Any]
    truth: Callable[..., Truth]
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
