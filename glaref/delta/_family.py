"""The gated delta rule as a recurrence family of the audit: :data:`DELTA`.

What the family brings to the engine (``glaref._audit._family.Family``): a kernel's arrays
``kernel(q, k, v, beta, log_alpha, h0) -> o | (o, h_T)`` (beta (B, H, T) like a scalar gate),
its regimes (``glaref.delta.regimes``), problems rounded to the audited dtype, the oracle's side
of a problem (:class:`Truth`: ``glaref.delta``'s forward, vjp and error scales, and the
same-precision reference kernels of ``glaref.delta._baseline`` that
``glaref.delta._designs.yardstick(chunk_size, decay_form)`` calls for), the built-in JAX kernels
(``glaref.delta.kernels``: scan, chunked) and the presets.

The verdict (:func:`assess_outputs`) is the calibrated tier of ``glaref._audit._verdict`` on this
family's outputs (o, h_T and the gradients q, k, v, beta, log_alpha, h0): non-finite values fail;
an output whose normwise error exceeds ``calibrated_ratio`` times that of the most accurate
reference kernels its claims call for (floored at one rounding of every element:
``_verdict.calibrated_floor``) is less accurate when within that ratio of the field's correct
designs (the chunk-local cumsum decays), a failure under ``strict``, and fails beyond.
The proven tier has no finite bound for this family yet (the delta rule's steps are not
contractions: beta ||k||^2 up to 2 or more makes I - beta k k^T amplify), so it is silent: its
bound is infinite, budget_ulps is reported, and it never passes an output by itself.
"""

from __future__ import annotations

import inspect
import math
import time
from typing import Any

import numpy as np

from .._audit import _metrics, _presets, _probes, _verdict
from .._audit._claims import Claims
from .._audit._family import Family, Judge
from .._audit._presets import Preset
from .._audit._verdict import Mismatch
from .._errors import NonFiniteError
from .._inputs import Dims, from_canonical
from ..gla import _baseline as _rounding
from ..gla._oracle import _quiet, nonfinite_report
from ..gla._problems import round_problem, round_to_dtype
from ..tolerances import UNIT_ROUNDOFF, tol
from . import _baseline, _designs, regimes
from ._oracle import FORWARD, GRADS, OUTPUTS, DeltaProblem, backend, problem_scales

__all__ = ["DELTA", "Truth", "assess_outputs", "make_problem"]

INPUTS = GRADS                                   # q, k, v, beta, log_alpha, h0
ARRAYS = INPUTS + ("do", "dh_T")
KINDS = {"q": "qk", "k": "qk", "v": "v", "do": "v", "o": "v", "beta": "gate",
         "log_alpha": "gate", "h0": "state", "h_T": "state", "dh_T": "state"}
# the name whose underflow allowance (``_metrics.underflow_floor``) an output takes: dbeta_t,
# like dlog_alpha_t, sums over state entries and pairs of steps
_FLOOR_AS = {"beta": "log_alpha"}

# The default regimes: the standard draw; strong decay (a clamped or underflowing gate); the
# converged state, where the delta residual v - S~^T k cancels to ~1e-6 of v (a residual rounded
# to 16 bits is lost there: attention-gym PR 465); beta up to 2 (I - beta k k^T a reflection
# along k, where a sign slip in the (I - beta k k^T) factor shows).
AUDIT_REGIMES = ("standard", "strong_decay", "converged", "beta_two")
ALL_REGIMES = tuple(regimes.REGIMES)

_QUICK = "g2h4_dk32_dv24"
PRESETS: dict[str, Preset] = {
    "quick": Preset(_presets.BUILTIN_IMPLS, {_QUICK: _presets.QUICK_CONFIGS[_QUICK]},
                    _presets.QUICK_SEQS, _presets.MODES, 3, AUDIT_REGIMES),
    "seed": Preset(_presets.BUILTIN_IMPLS, _presets.SEED_CONFIGS, _presets.SEED_SEQS,
                   _presets.MODES, 3, ("standard",)),
}


def make_problem(regime: str, dims: Dims, seed: int, dtype: str, *, gate: str = "scalar",
                 cu_seqlens=None) -> DeltaProblem:
    """The problem of one row: ``glaref.delta.regimes.make_inputs`` (``gate``, packed
    sequences ``cu_seqlens`` as there) with every array (beta included) rounded to ``dtype`` and
    widened back to float64."""
    dp = regimes.make_inputs(regime, dims, seed, gate=gate, cu_seqlens=cu_seqlens)
    return DeltaProblem(round_problem(dp.p, dtype), round_to_dtype(dp.beta, dtype))


def fields(dp: DeltaProblem) -> dict[str, Any]:
    """The problem's arrays by name (``ARRAYS``)."""
    return {n: (dp.beta if n == "beta" else getattr(dp.p, n)) for n in ARRAYS}


class Truth:
    """The oracle's side of one problem (``glaref.gla._judge.Truth``'s interface): forward, vjp,
    error scales and reference kernels, each computed on first use, cached and timed apart
    (``ms``). ``p``: the problem's scalar-family part (dims, offsets, states)."""

    def __init__(self, dp: DeltaProblem, scale: float, impl: str):
        self.dp, self.p, self.scale, self.impl = dp, dp.p, scale, impl
        self.be = backend(impl)
        self._fwd = None
        self._grads: dict[bool, tuple] = {}
        self._scales: dict[tuple[bool, bool], dict] = {}
        self._refs: dict[tuple, dict] = {}
        self.ms: dict[str, float] = {}

    def _finite(self, what: str, results: dict[str, np.ndarray]) -> None:
        msg = nonfinite_report(f"the oracle's {what}", self.p, self.scale, results)
        if msg is not None:
            raise NonFiniteError(f"scale: got {self.scale:g}; {msg}")

    def _timed(self, key: str, fn, *args, **kwargs):
        """fn(*args, **kwargs), its time added to ``ms[key]``."""
        t0 = time.perf_counter()
        with _quiet():
            out = fn(*args, **kwargs)
        self.ms[key] = self.ms.get(key, 0.0) + (time.perf_counter() - t0) * 1e3
        return out

    def forward(self):
        if self._fwd is None:
            p = self.p
            self._fwd = self._timed("forward", lambda: self.be.forward(
                p.q, p.k, p.v, self.dp.beta, p.log_alpha, p.h0, self.scale,
                cu_seqlens=p.cu_seqlens))
            self._finite("forward", dict(zip(FORWARD, self._fwd)))
        return self._fwd

    def grads(self, with_dh_T: bool):
        if with_dh_T not in self._grads:
            p = self.p
            self._grads[with_dh_T] = self._timed(
                "vjp_dh_T" if with_dh_T else "vjp", lambda: self.be.vjp(
                    p.q, p.k, p.v, self.dp.beta, p.log_alpha, p.h0, p.do,
                    p.dh_T if with_dh_T else None, self.scale, cu_seqlens=p.cu_seqlens))
            self._finite("gradients", dict(zip(GRADS, self._grads[with_dh_T])))
        return self._grads[with_dh_T]

    def _problem(self, with_dh_T: bool, with_do: bool = True) -> DeltaProblem:
        p = self.p._replace(dh_T=self.p.dh_T if with_dh_T else None,
                            do=self.p.do if with_do else None)
        return DeltaProblem(p, self.dp.beta)

    def scales(self, with_dh_T: bool, with_grads: bool) -> dict[str, np.ndarray]:
        key = (with_dh_T, with_grads)
        if key not in self._scales:
            dp = self._problem(with_dh_T, with_grads)
            # never refused when they overflow: the sums of |terms| of this family grow with
            # the entrywise absolute value of every step's I - beta k k^T, past float64 at long
            # T (g2h8_d128, T = 8192), while the calibrated tier never reads them; they feed
            # only budget_ulps, reported as nan where they are not finite (assess_output)
            self._scales[key] = self._timed("scales_vjp" if with_grads else "scales",
                                            lambda: problem_scales(dp, self.scale, self.impl))
        return self._scales[key]

    def references(self, with_dh_T: bool, grads: bool, chunk_size: int | None,
                   arithmetic: dict, decay_form: str | None = None) -> dict[str, dict]:
        """The reference kernels' outputs ({role: {output: value}}) that
        ``glaref.delta._designs.yardstick(chunk_size, decay_form)`` calls for, in
        ``arithmetic`` (``_verdict.reference_arithmetic``: arith, operand, storage)."""
        out = {}
        for role, design in _designs.yardstick(chunk_size, decay_form).designs.items():
            chunk = design.chunk or _baseline.CHUNK
            key = (design.kernel, chunk, design.decay, design.order, with_dh_T, grads,
                   tuple(sorted(arithmetic.items())))
            if key not in self._refs:
                self._refs[key] = self._timed(
                    f"reference_{design.kernel}" + ("_vjp" if grads else ""), _baseline.run,
                    design.kernel, self._problem(with_dh_T), self.scale, grads=grads,
                    chunk=chunk, decay=design.decay, order=design.order, **arithmetic)
            out[role] = self._refs[key]
        return out

    def budget_view(self):
        """(dims, log_alpha) as ``_verdict.budget_view`` gives them (the interface; this
        family's proven tier is silent and does not read them)."""
        return _verdict.budget_view(self.p)

    def reference(self, name: str, with_dh_T: bool) -> np.ndarray:
        if name in FORWARD:
            return self.forward()[FORWARD.index(name)]
        return self.grads(with_dh_T)[GRADS.index(name)]


# ---------------------------------------------------------------- the verdict

def _unit(c: Claims) -> str:
    """The unit dtype of budget_ulps: the compute dtype, or the operand format where coarser."""
    cdtype = c.compute_dtype or c.dtype
    if c.operand_dtype is not None and UNIT_ROUNDOFF[c.operand_dtype] > UNIT_ROUNDOFF[cdtype]:
        return c.operand_dtype
    return cdtype


def assess_output(truth: Truth, name: str, x: np.ndarray, dtype: str | None, *, final: bool,
                  grads: bool, claims: Claims) -> _verdict.Assessment:
    """The Assessment of output ``name`` (canonical value ``x``, returned in ``dtype``): the
    calibrated tier's three outcomes, ``glaref._audit._verdict.calibrated`` (ok within R times the
    baseline of the most accurate designs, less accurate within R times the envelope of the
    field's correct designs, FAIL beyond), with the delta family's yardstick and its wording (no
    declaration hint; a FAIL gives the ratio to the baseline alone); the proven tier silent
    (bound infinite)."""
    unit = _unit(claims)
    cdtype = claims.compute_dtype or claims.dtype
    floor_name = _FLOOR_AS.get(name, name)
    dims = truth.p.dims
    x = np.asarray(x)
    count, first = _metrics.nonfinite(x)
    x64 = np.asarray(x, dtype=np.float64)
    ref = truth.reference(name, final)
    sc = truth.scales(final, grads)[name]
    ulps = _metrics.budget_ulps(floor_name, x64, ref, sc, unit, dims)[0] \
        if np.isfinite(sc).all() else math.nan
    a = _verdict.Assessment(name, _metrics.rel_err(x64, ref), _metrics.max_abs_err(x64, ref),
                            ulps, math.inf, None, None, tol("calibrated_ratio"), count, first)
    if _verdict.flag_nonfinite(a):
        return a
    arith = _verdict.reference_arithmetic(cdtype, claims.accumulate_dtype, claims.operand_dtype)
    refs = truth.references(final, grads, claims.chunk_size, arith, claims.decay_form)
    errs = {role: float(np.linalg.norm((_rounding.round_to(v[name], dtype) - ref).ravel()))
            for role, v in refs.items()}
    ref_norm = float(np.linalg.norm(ref.ravel()))
    floor = _verdict.calibrated_floor(ref_norm, dtype, cdtype, floor_name, dims, ref.size)
    cal = _verdict.Calibration(errs, _designs.yardstick(claims.chunk_size, claims.decay_form),
                               floor, ref_norm)
    _verdict.calibrated(a, float(np.linalg.norm((x64 - ref).ravel())), cal, label=cdtype,
                        strict=claims.strict)
    return a


def assess_outputs(truth: Truth, outputs: dict[str, np.ndarray], dtypes: dict[str, str], *,
                   final: bool, grads: bool, claims: Claims) -> dict[str, _verdict.Assessment]:
    """One Assessment per output the kernel gave and claims to provide (``OUTPUTS`` order)."""
    return {name: assess_output(truth, name, outputs[name], dtypes.get(name), final=final,
                                grads=grads, claims=claims)
            for name in OUTPUTS if outputs.get(name) is not None and claims.judged(name)}


def locate_nonfinite(per: dict[str, _verdict.Assessment], canonical: dict[str, np.ndarray],
                     layout: str) -> None:
    """Each failing Assessment's first non-finite index in the caller's ``layout``."""
    for name, a in per.items():
        if a.nonfinite:
            x = from_canonical(canonical[name], KINDS[name], layout)
            a.first_nonfinite = _metrics.nonfinite(x)[1]
            a.reason = f"{name}: {a.nonfinite} non-finite value(s), first at {tuple(a.first_nonfinite)}"


def mismatches(truth: Truth, per: dict[str, _verdict.Assessment],
               canonical: dict[str, np.ndarray], *, final: bool, grads: bool, claims: Claims,
               layout: str) -> dict[str, Mismatch]:
    """``glaref._audit._verdict.Mismatch`` of every output with non-finite elements, the only ones beyond
    this family's proven bound (infinite), with the worst element error (budget units) and its
    index; an output failing the calibrated tier alone has none (its message gives the ratio)."""
    scales = truth.scales(final, grads)
    out = {}
    for name, a in per.items():
        if not a.nonfinite:
            continue
        el = _metrics.element_ulps(_FLOOR_AS.get(name, name), canonical[name],
                                   truth.reference(name, final), scales[name], _unit(claims),
                                   truth.p.dims)
        el = from_canonical(el, KINDS[name], layout)
        worst = None if el.size == 0 else \
            tuple(int(j) for j in np.unravel_index(int(np.argmax(el)), el.shape))
        out[name] = Mismatch(int(np.isinf(el).sum()), int(el.size), float(a.bound),
                             float(el.max()) if el.size else 0.0, worst, layout)
    return out


def warm(impl: str, gate: str = "scalar", packed: bool = False) -> None:
    """Compile the Numba oracle (if cached, load it) for ``gate`` and packing outside every
    timing."""
    be = backend(impl)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 3, 2))
    v = rng.standard_normal((1, 1, 3, 2))
    beta = np.full((1, 1, 3), 0.5)
    la = -np.ones((1, 1, 3) if gate == "scalar" else (1, 1, 3, 2))
    h0 = np.zeros((1, 1, 2, 2))
    be.forward(q, q, v, beta, la, h0, 1.0)
    be.vjp(q, q, v, beta, la, h0, v, h0, 1.0)
    if packed:
        cu = np.array([0, 1, 3])
        h0 = np.zeros((2, 1, 2, 2))
        be.forward(q, q, v, beta, la, h0, 1.0, cu_seqlens=cu)
        be.vjp(q, q, v, beta, la, h0, v, h0, 1.0, cu_seqlens=cu)


def oracle_bytes(dims: Dims, modes) -> int:
    """About the most host memory the oracle side of one problem holds at once, counted in
    float64 elements as ``glaref._audit._family``'s scalar-gate estimate counts them, with
    beta and its gradient (g = B H T each, beside log_alpha's) and the delta yardstick's
    reference kernels: up to three (the scan, the WY / UT form with segment-sum and with
    chunk-local cumsum decays, for a kernel of unknown structure), each keeping its outputs,
    and the largest temporary of the chunked form, its (C, C) triangular matrices per chunk
    (B H T C elements at C = ``_baseline.CHUNK``) beside one chunk's states."""
    B, G, H, T, dk, dv = dims.B, dims.G, dims.H, dims.T, dims.dk, dims.dv
    qk, v, g, s = B * G * T * dk, B * H * T * dv, B * H * T, B * H * dk * dv
    refs = len(_designs.yardstick(None).designs)
    inputs = 2 * qk + 2 * v + 2 * g + 2 * s                    # q, k, v, do, beta, log_alpha, ...
    grads = 2 * qk + v + 2 * g + s
    n = 2 * inputs + 2 * (v + s)                               # inputs twice, forward, its scales
    n += refs * (v + s)                                        # the references' forward
    n += B * H * T * _baseline.CHUNK                           # the chunked form's temporaries
    if "fwd_bwd" in modes:
        n += grads                                             # gradients
        n += inputs                                            # |inputs| for the scales
        n += grads                                             # gradient scales
        n += refs * (v + s + grads)                            # the references' fwd_bwd
    return 8 * n


def perturb(name: str, part: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The probes' perturbation (``glaref._audit._probes.perturb``: a random factor and shift) kept in
    each input's range: beta drawn again within the part's own range (its regime's: (0, 1),
    (1.5, 2), ...; scaled down by a factor in [0.5, 1) where the part holds one value), log_alpha
    scaled by a factor in [0.5, 1.5) (its sign kept: <= 0 decays), each key row rescaled to its
    old norm (L2-normalised keys stay normalised, so beta ||k||^2 keeps its regime's range)."""
    if name == "beta":
        lo, hi = (float(part.min()), float(part.max())) if part.size else (0.0, 0.0)
        if hi > lo:
            return rng.uniform(lo, hi, part.shape)
        return part * rng.uniform(0.5, 1.0, part.shape)
    if name == "log_alpha":
        return part * rng.uniform(0.5, 1.5, part.shape)
    new = _probes.perturb(name, part, rng)
    if name == "k":
        old = np.linalg.norm(part, axis=-1, keepdims=True)
        now = np.linalg.norm(new, axis=-1, keepdims=True)
        new = new * np.divide(old, now, out=np.zeros_like(now), where=now > 0)
    return new


def builtin_claims(module, name: str, claims: Claims) -> Claims:
    """``glaref.delta.kernels``' ``name``: the chunked kernel judged at its default chunk
    length, the scan step by step, both accumulating in float32 with operands unrounded, decays
    from segment sums."""
    chunk = inspect.signature(getattr(module, name)).parameters.get("chunk_size")
    return claims.design(chunk_size=chunk.default if chunk is not None else 1,
                         accumulate_dtype="float32", operand_dtype=None,
                         decay_form="segment_sums")


DELTA = Family(
    name="delta", inputs=INPUTS, outputs=FORWARD, grads=GRADS, arrays=ARRAYS, kinds=KINDS,
    regimes=regimes.REGIMES, make_problem=make_problem, truth=Truth, warm=warm, fields=fields,
    judge=Judge(assess_outputs, locate_nonfinite, mismatches, None, direct_log_alpha=False),
    kernels="glaref.delta.kernels", builtin_claims=builtin_claims, presets=PRESETS,
    all_regimes=ALL_REGIMES, oracle_bytes=oracle_bytes, header={"recurrence": "delta"},
    # o_t and dq_t = scale S_t do_t read steps s <= t only; dv_t = beta_t G_t^T k_t reads
    # G_t, made of do_t and the later steps alone (C_{t-1} = A_t (G_t - beta_t k_t du_t^T));
    # dk_t, dbeta_t and dlog_alpha_t multiply G_t by S~_t, u_t or r_t: past and future both
    causal=("o", "dq"), anticausal=("dv",), perturb=perturb)
