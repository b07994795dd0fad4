"""Judging a scalar-gate kernel's outputs on one problem: the oracle's side, and the judging loop.

Every face of glaref that judges a kernel of the scalar-gate family (the audit engine through
``_family.SCALAR_GATE``'s judge, ``glaref.testing``, the tools) goes through here (the gated delta
rule's counterpart is ``glaref.delta._family``): :class:`Truth` holds, for one problem (canonical,
already rounded to the dtype the kernel received), the oracle's outputs and gradients, the error
scales and the same-precision reference kernels' outputs, each computed once on first use and timed
apart (never counted as the kernel's); :func:`assess_outputs` turns a kernel's outputs into one
``_verdict.Assessment`` per output. Nothing is judged against an oracle result that is not finite:
``Truth`` raises ``NonFiniteError`` naming ``scale`` and the cause (``_oracle.nonfinite_report``)
instead. Vector gates and packed sequences (``Problem.cu_seqlens``) go to the oracle, the scales
and the reference kernels as they are; the proven bound, written for scalar gates of one sequence
per row, sees them through ``_verdict.budget_view`` (``Truth.budget_view``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from .._audit import _metrics, _verdict
from .._audit._claims import Claims
from .._audit._verdict import Mismatch
from .._errors import NonFiniteError
from .._inputs import _KIND, FORWARD, GRADS, OUTPUTS, Problem, from_canonical
from ..tolerances import UNIT_ROUNDOFF
from . import _baseline
from ._budget import problem_scales
from ._designs import yardstick
from ._oracle import _quiet, backend, nonfinite_report


class Truth:
    """Oracle results for one problem, computed on first use and timed separately."""

    def __init__(self, problem: Problem, scale: float, impl: str):
        self.p, self.scale, self.impl = problem, scale, impl
        self.be = backend(impl)
        self._fwd = None
        self._grads: dict[bool, tuple] = {}
        self._scales: dict[tuple[bool, bool], dict] = {}
        self._refs: dict[tuple, dict] = {}
        self._view = None
        self.ms: dict[str, float] = {}

    def _finite(self, what: str, results: dict[str, np.ndarray]) -> None:
        """The oracle's results must be finite to judge anything against them; with moderate
        inputs only an extreme ``scale`` makes them overflow."""
        msg = nonfinite_report(f"the oracle's {what}", self.p, self.scale, results)
        if msg is not None:
            raise NonFiniteError(f"scale: got {self.scale:g}; {msg}", argument="scale")

    def forward(self):
        if self._fwd is None:
            t0 = time.perf_counter()
            p = self.p
            with _quiet():
                self._fwd = self.be.forward(p.q, p.k, p.v, p.log_alpha, p.h0, self.scale,
                                            cu_seqlens=p.cu_seqlens)
            self.ms["forward"] = (time.perf_counter() - t0) * 1e3
            self._finite("forward", dict(zip(FORWARD, self._fwd)))
        return self._fwd

    def grads(self, with_dh_T: bool):
        if with_dh_T not in self._grads:
            t0 = time.perf_counter()
            p = self.p
            with _quiet():
                self._grads[with_dh_T] = self.be.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do,
                                                     p.dh_T if with_dh_T else None, self.scale,
                                                     cu_seqlens=p.cu_seqlens)
            self.ms["vjp_dh_T" if with_dh_T else "vjp"] = (time.perf_counter() - t0) * 1e3
            self._finite("gradients", dict(zip(GRADS, self._grads[with_dh_T])))
        return self._grads[with_dh_T]

    def scales(self, with_dh_T: bool, with_grads: bool) -> dict[str, np.ndarray]:
        key = (with_dh_T, with_grads)
        if key not in self._scales:
            t0 = time.perf_counter()
            p = self.p._replace(dh_T=self.p.dh_T if with_dh_T else None,
                                do=self.p.do if with_grads else None)
            with _quiet():
                self._scales[key] = problem_scales(p, self.scale, self.impl)
            self.ms["scales_vjp" if with_grads else "scales"] = (time.perf_counter() - t0) * 1e3
            self._finite("error scales", self._scales[key])
        return self._scales[key]

    def references(self, with_dh_T: bool, grads: bool, chunk_size: int | None,
                   arithmetic: dict, decay_form: str | None = None,
                   dlog_alpha_form: str | None = None) -> dict[str, dict[str, np.ndarray]]:
        """The same-precision reference kernels' outputs on this problem ({role: {output:
        value}}, ``glaref.gla._baseline``), those ``glaref.gla._designs.yardstick(chunk_size,
        decay_form, dlog_alpha_form)`` calls for; timed apart like the oracle and cached (roles
        of one design share its run)."""
        out = {}
        for role, design in yardstick(chunk_size, decay_form, dlog_alpha_form).designs.items():
            key = (design.kernel, design.chunk, design.decay, design.order, with_dh_T, grads,
                   tuple(sorted(arithmetic.items(), key=lambda kv: kv[0])))
            if key not in self._refs:
                t0 = time.perf_counter()
                p = self.p._replace(dh_T=self.p.dh_T if with_dh_T else None)
                self._refs[key] = _baseline.run(design.kernel, p, self.scale, grads=grads,
                                                chunk=design.chunk or _baseline.CHUNK,
                                                decay=design.decay, order=design.order,
                                                **arithmetic)
                name = f"reference_{design.kernel}" + ("_vjp" if grads else "")
                self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - t0) * 1e3
            out[role] = self._refs[key]
        return out

    def budget_view(self):
        """(dims, log_alpha) of this problem as the proven bound takes them
        (``_verdict.budget_view``: vector gates and packed sequences as scalar-gate rows)."""
        if self._view is None:
            self._view = _verdict.budget_view(self.p)
        return self._view

    def reference(self, name: str, with_dh_T: bool) -> np.ndarray:
        if name in FORWARD:
            return self.forward()[FORWARD.index(name)]
        return self.grads(with_dh_T)[GRADS.index(name)]


def _claimed(claims: Claims | None, declared: dict) -> Claims:
    """The claims a kernel is judged with: ``claims`` as the faces resolved them
    (``Claims.resolved``), or, for tests and tools that judge by hand, the claim keywords
    (compute_dtype, accumulate_dtype as judged, chunk_size, operand_dtype, dlog_alpha_form)
    parsed here."""
    if claims is None:
        return Claims(**declared)
    if declared:
        raise TypeError(f"claims and claim keywords {sorted(declared)} given together, expected "
                        "one of them")
    return claims


def proven_arithmetic(c: Claims) -> tuple[str, str | None]:
    """(the unit dtype of budget_ulps and of the proven bound, the accumulate dtype it assumes)
    for claims ``c``."""
    cdtype = c.compute_dtype or c.dtype
    if c.operand_dtype is not None and UNIT_ROUNDOFF[c.operand_dtype] > UNIT_ROUNDOFF[cdtype]:
        # products whose operands are rounded to operand_dtype: the proven bound (and the unit of
        # budget_ulps) of that dtype, accumulating in the compute dtype
        return c.operand_dtype, c.accumulate_dtype or ("float32" if cdtype == "tf32" else cdtype)
    return cdtype, c.accumulate_dtype


def claimed_references(truth: Truth, c: Claims, final: bool, grads: bool):
    """The reference kernels' outputs a kernel of claims ``c`` is judged against ({role:
    {output: value}}, run once and cached by ``truth``) and the yardstick that names their roles
    (``glaref.gla._designs.yardstick``)."""
    cdtype = c.compute_dtype or c.dtype
    refs = truth.references(final, grads, c.chunk_size,
                            _verdict.reference_arithmetic(cdtype, c.accumulate_dtype,
                                                          c.operand_dtype), c.decay_form,
                            c.dlog_alpha_form)
    return refs, yardstick(c.chunk_size, c.decay_form, c.dlog_alpha_form)


def assess_output(truth: Truth, name: str, x: np.ndarray, dtype: str | None, *, final: bool,
                  grads: bool, claims: Claims | None = None, **declared) -> _verdict.Assessment:
    """The Assessment of one output ``name`` of a kernel: ``x`` its canonical "bhtd" value (any
    float dtype), ``dtype`` the dtype name it was *returned* in (the reference kernels' values are
    rounded to it); other arguments as for :func:`assess_outputs`."""
    c = _claimed(claims, declared)
    scales = truth.scales(final, grads)
    refs, stick = claimed_references(truth, c, final, grads)
    # dlog_alpha is held to the scale of the reverse-cumsum identity (_verdict, decision 3)
    sc = scales["log_alpha_identity"] if name == "log_alpha" else scales[name]
    # each reference kernel's value of this output, dlog_alpha in the form its role reads
    ref_out = {r: _baseline.round_to(refs[r][stick.key(r, name)], dtype) for r in stick.roles(name)}
    judged_by = _verdict.References(ref_out, stick)
    # the proven bound takes scalar gates of one sequence per row: vector gates and packed
    # sequences are presented to it as such (_verdict.budget_view)
    proven, proven_acc = proven_arithmetic(c)
    return _verdict.assess(name, x, truth.reference(name, final), scale=sc,
                           claims=replace(c, compute_dtype=proven, accumulate_dtype=proven_acc),
                           view=truth.budget_view(), reference_outputs=judged_by,
                           returned_dtype=dtype)


def assess_outputs(truth: Truth, outputs: dict[str, np.ndarray], dtypes: dict[str, str], *,
                   final: bool, grads: bool, claims: Claims | None = None,
                   **declared) -> dict[str, _verdict.Assessment]:
    """One Assessment per output the kernel gave (canonical "bhtd" values, any float dtype;
    ``dtypes`` the dtype name each was *returned* in, which the reference kernels' values are
    rounded to). ``final``: the kernel returned h_T (so dh_T was its cotangent); ``grads``: the
    gradients are among ``outputs``. Outputs missing from ``outputs`` (or None), and gradients
    the claims say the kernel does not provide, are not judged. ``claims``: what the kernel
    claims, resolved for its compute dtype (``glaref._audit._claims.Claims.resolved``), or instead the
    claim keywords as judged (``_claimed``)."""
    c = _claimed(claims, declared)
    return {name: assess_output(truth, name, outputs[name], dtypes.get(name), final=final,
                                grads=grads, claims=c)
            for name in OUTPUTS if outputs.get(name) is not None and c.judged(name)}


def baseline_error(errors: dict[str, float], chunk_size: int | None,
                   decay_form: str | None = None) -> float:
    """The baseline of one output of a scalar-gate kernel of ``chunk_size`` (1: step by step;
    None: unknown) and ``decay_form``, from the normwise errors of the reference kernels
    (:meth:`Truth.references`) by role: ``glaref._audit._verdict.widen`` with the roles
    ``glaref.gla._designs.yardstick(chunk_size, decay_form)`` names (the scan, the chunked
    reference at C, or for an unknown structure the 64-step chunked reference widened towards
    the scan and 256-step chunks)."""
    return _verdict.widen(errors, yardstick(chunk_size, decay_form))


def looseness_notes(output: str, errors: dict[str, float], chunk_size: int | None,
                    floor: float, decay_form: str | None = None) -> list[str]:
    """Where a scalar-gate kernel's unknown structure (``chunk_size`` None) made ``output``'s
    verdict looser than a declared one would be by more than the allowed ratio:
    ``glaref._audit._verdict.looseness`` with ``glaref.gla._designs.yardstick(chunk_size,
    decay_form)``."""
    return _verdict.looseness(output, errors, yardstick(chunk_size, decay_form), floor)


def locate_nonfinite(per: dict[str, _verdict.Assessment], canonical: dict[str, np.ndarray],
                     layout: str) -> None:
    """Re-express each failing Assessment's first non-finite index in the caller's ``layout``
    (``assess`` finds it in the canonical one), its reason with it; ``canonical``: the values
    judged."""
    for name, a in per.items():
        if a.nonfinite:
            a.first_nonfinite = _metrics.nonfinite(from_canonical(canonical[name], _KIND[name], layout))[1]
            a.reason = f"{name}: {a.nonfinite} non-finite value(s), first at {tuple(a.first_nonfinite)}"


def mismatches(truth: Truth, per: dict[str, _verdict.Assessment],
               canonical: dict[str, np.ndarray], *, final: bool, grads: bool, claims: Claims,
               layout: str) -> dict[str, Mismatch]:
    """The :class:`Mismatch` of every failing output of ``per`` (from :func:`assess_outputs` on
    the same ``canonical`` values, ``truth`` and ``claims``), its worst index in ``layout``: the
    element errors are the verdict's own (``_metrics.element_ulps`` with the scale, unit and
    sizes :func:`assess_output` judged with)."""
    scales = truth.scales(final, grads)
    unit = proven_arithmetic(claims)[0]
    dims = truth.budget_view()[0]
    out = {}
    for name, a in per.items():
        if a.ok:
            continue
        sc = scales["log_alpha_identity"] if name == "log_alpha" else scales[name]
        el = _metrics.element_ulps(name, canonical[name], truth.reference(name, final), sc, unit,
                                   dims)
        el = from_canonical(el, _KIND[name], layout)
        beyond = (el > a.bound) | np.isinf(el)
        worst = None if el.size == 0 else \
            tuple(int(j) for j in np.unravel_index(int(np.argmax(el)), el.shape))
        out[name] = Mismatch(int(beyond.sum()), int(el.size), float(a.bound),
                             float(el.max()) if el.size else 0.0, worst, layout)
    return out
