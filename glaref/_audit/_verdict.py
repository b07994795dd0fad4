"""The verdict rule: is an output's error what a correct kernel makes, or a bug?

Two tiers, decided per output (o, h_T and the gradients of q, k, v, log_alpha, h0) by
:func:`assess` for the scalar gate (``glaref.gla._judge`` calls it for the audit engine, the
testing API and the tools). The calibrated tier's outcome is :func:`calibrated`, from
family-neutral figures (the kernel's error, the reference kernels' by role and the family's
yardstick), the one decision both families' verdicts make (the gated delta rule's:
``glaref.delta._family.assess_output``, whose proven tier is silent):

* Calibrated (the default decision). The kernel's normwise error ||x - ref||_2 is compared with
  the error that correct kernels make on exactly the same inputs in the same arithmetic: glaref's
  same-precision reference kernels (``glaref.gla._baseline``: a step-by-step scan and a chunked
  kernel, evaluated in the kernel's compute precision, their outputs rounded to the dtypes the
  kernel returned). The output fails when its error exceeds ``calibrated_ratio`` times the
  baseline (``widen``), the baseline never below one rounding of every element
  (``calibrated_floor``). Which reference is the baseline depends on what is known of the
  kernel's structure (``chunk_size``): a step-by-step kernel (1) is held to the scan, a chunked
  one (C) to the chunked reference at C, and an unknown one to the chunked reference, widened to
  the geometric mean of both where the scan's error is the larger: on long-memory inputs the
  step-by-step accumulation legitimately errs several times more than a chunked one, and a kernel
  whose structure is unknown may lie anywhere between the two (docs/budgets.md, section 8).
  This tier is sharp: it flags errors a few times above what correct kernels make.
* Proven. budget_ulps above the worst-case rounding bound below (decisions 1 to 5). No correct
  kernel, whatever its structure, can exceed it; it fails far fewer bugs than the calibrated tier
  (its bound sits orders of magnitude above what kernels actually do) but a failure here is a
  proof, and the message says so. Where no finite bound exists (16-bit accumulation, or float32
  at long T with unknown chunking) the tier is silent, never a pass by itself.

Non-finite values always fail. Below, the decisions behind the proven bound.

1. Reference. Every figure of a kernel output (budget_ulps, rel_err, max_abs_err) compares it
   with the float64 oracle run on the *dtype-rounded* inputs and cotangents: exactly the values
   the kernel received (q, k, v, log_alpha, h0 cast to the kernel's dtype, and do, dh_T cast
   likewise for the vjp), widened exactly to float64. The rounding of the inputs is not the
   kernel's error; in bfloat16 its effect (u * condition number) would dwarf the kernel's own
   arithmetic and hide real bugs behind it. The scales come from the same rounded inputs.

2. Unit. budget_ulps = max_i |x_i - ref_i| / (u * scale_i + floor_i) (``_metrics.budget_ulps``):
   u is the unit roundoff of the compute dtype (``tolerances.UNIT_ROUNDOFF``): the dtype of the
   arrays the kernel receives (float32, bfloat16, float16, float64), or "tf32" for float32
   matmuls a GPU runs as TF32 (precision "default"/"high"), since that is the arithmetic
   the user asked for there. scale is the per-element sum of |terms| (``_budget``); floor_i is
   the underflow allowance (smallest normal of the dtype times the number of products).

3. dlog_alpha is judged against the scale of the reverse-cumsum *identity*
   (``log_alpha_identity``), not of the direct form alpha_t <S_{t-1}, G_t>. A kernel's interface
   does not say which form it uses; production kernels use the identity and legitimately make
   errors proportional to its scale, and the identity scale is never smaller than the direct one
   (docs/budgets.md, section 3), so a direct-form kernel passes too. The price: a dlog_alpha bug
   much smaller than the identity scale goes unseen; the direct-scale budget_ulps is reported
   beside it for that reason (``budget_ulps_direct`` in the engine's records, when it has it).

4. Rule. An output passes when it has no non-finite value and budget_ulps <= budget_bound(...),
   the worst-case rounding-error bound (gamma_n = n u / (1 - n u)) of a correct kernel whose
   structure is given by ``chunk_size``: C for a chunked kernel that accumulates log_alpha from
   each chunk's start, 1 for a step-by-step scan, None when unknown (the larger of the two
   extremes C = 1 and C = T). Being worst-case, it passes every correct kernel; it catches any
   bug whose error exceeds that multiple of u * scale: structural bugs (errors O(scale), i.e.
   ~1/u ulps) everywhere, precision bugs (TF32 matmuls, bfloat16 states: 2^13 to 2^16 ulps of
   float32) where the bound is small: weak decay and small sizes.

5. Mixed precision. With 16-bit inputs the all-16-bit worst case (n u with u = 2^-8) exceeds 1
   on any realistic size and the bound is infinite: only non-finite values fail. A kernel that
   keeps its accumulations and carried states in float32 and rounds to the 16-bit format only
   matmul operands and its results is judged with ``accumulate_dtype="float32"``: a handful of
   16-bit roundings plus float32 accumulation (docs/budgets.md, section 5). glaref's own kernels
   make that promise (glaref.kernels docstring); a user kernel is judged that way only when the
   user says so.

The constants sit in glaref/tolerances.py ("budget_*" and "calibrated_*" entries), each with its
reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._inputs import OUTPUTS, Dims, Problem
from ..tolerances import UNIT_ROUNDOFF, lookup, tol
from . import _metrics
from ._designs import Design, Yardstick

if TYPE_CHECKING:                        # _claims reads this module's vocabulary
    from ._claims import Claims

# How a kernel computes dlog_alpha, when it says (``dlog_alpha_form``; None: unknown):
#   "identity"  the chunk-local reverse-cumsum identity sum_{s >= t} (q_s . dq_s - k_s . dk_s)
#               plus a state term (flash-linear-attention's chunk kernels): its terms cancel
#               under strong decay, so it legitimately errs more (docs/budgets.md, section 8):
#               held to the chunked references' identity;
#   "direct"    the genuine terms of alpha_t <S_{t-1}, G_t> only (a scan, autodiff of segment
#               sums, glaref's vector-gate chunked kernel): held to references of that form.
# Unknown, dlog_alpha is held to the direct form, the most accurate correct design, and the
# identity widens only its envelope (``glaref.gla._designs.yardstick``): less accurate, never FAIL.
DLOG_ALPHA_FORMS = ("identity", "direct")


# the arithmetic a kernel's errors are measured in: its input dtype, or TF32 for float32 matmuls
COMPUTE_DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16")
PRECISIONS = ("default", "high", "highest")


def compute_dtype(dtype: str, precision: str, platform: str) -> str:
    """The arithmetic the kernel's errors should be measured in units of.

    16-bit inputs: their own format (what the kernel stores and feeds its matmuls). float32 on an
    NVIDIA GPU under precision "default" or "high": TF32 (XLA's default for float32 matmuls there,
    10 explicit mantissa bits). Otherwise the input dtype.
    """
    if dtype == "float32" and platform in ("gpu", "cuda") and precision in ("default", "high"):
        return "tf32"
    return dtype


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output: got {output!r}, expected one of {OUTPUTS}")


def _chunk(chunk_size, T: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size: got {chunk_size!r}, expected a positive integer or None")
    return int(min(chunk_size, max(T, 1)))


def gate_mass(log_alpha, chunk_size: int) -> float:
    """Lambda_C: the largest sum of |log_alpha| over one chunk of ``chunk_size`` steps (chunks
    start at t = 0, as a chunked kernel cuts them), over every batch and head. log_alpha: (B, H, T)."""
    la = np.abs(np.asarray(log_alpha, dtype=np.float64))
    if la.ndim != 3:
        raise ValueError(f"log_alpha: got shape {la.shape}, expected (B, H, T)")
    T = la.shape[2]
    if la.size == 0:
        return 0.0
    C = _chunk(chunk_size, T)
    N = -(-T // C)
    pad = np.zeros(la.shape[:2] + (N * C - T,))
    return float(np.concatenate([la, pad], axis=2).reshape(la.shape[:2] + (N, C)).sum(-1).max())


def positive_mass(log_alpha) -> float:
    """The largest sum over the whole sequence of max(log_alpha, 0), over every batch and head."""
    la = np.asarray(log_alpha, dtype=np.float64)
    if la.size == 0:
        return 0.0
    return float(np.maximum(la, 0.0).sum(axis=-1).max())


def accumulation_depth(output: str, dims: Dims, chunk_size: int) -> float:
    """n of gamma_n for ``output`` of a chunked kernel with chunks of ``chunk_size`` steps
    (1: step by step), excluding the gate-exponent term (docs/budgets.md, section 2).

    With a = budget_step_ops roundings per recurrence step or chunk hand-over, N = ceil(T/C) and
    r = H/G heads per group, the state and its cotangent carry d_S = C + a N; then
    o: dk + d_S + a; h_T: d_S; dq, dk: dv + d_S + a + r; dv: dk + d_S + a; dh0: d_S + a;
    dlog_alpha: T + a + max(dk + dv + d_S + a + r, dk dv + d_S).
    """
    _check_output(output)
    a = tol("budget_step_ops")
    T, dk, dv = dims.T, dims.dk, dims.dv
    r = dims.H // max(dims.G, 1)
    C = _chunk(chunk_size, T)
    N = -(-max(T, 1) // C)
    d_S = C + a * N
    return {
        "o": dk + d_S + a,
        "h_T": d_S,
        "q": dv + d_S + a + r,
        "k": dv + d_S + a + r,
        "v": dk + d_S + a,
        "h0": d_S + a,
        "log_alpha": T + a + max(dk + dv + d_S + a + r, dk * dv + d_S),
    }[output]


def _bound_for_chunk(output: str, dims: Dims, C: int, log_alpha) -> float:
    # Gate term: each exp(b_i - b_j) is formed from chunk-local cumulative sums whose absolute
    # error is <= gamma_C * Lambda_C, plus the rounding of the difference itself and exp's own
    # error: relative error <= (budget_gate_factor * (C + 1) * Lambda_C + 1) u per factor.
    # Growth (log_alpha > 0) is not damped: a term spanning several chunks carries every spanned
    # chunk's exponent error, so the whole positive mass of the sequence is added.
    lam = gate_mass(log_alpha, C) + positive_mass(log_alpha)
    g = tol("budget_gate_factor") * (C + 1) * lam + 1.0
    return accumulation_depth(output, dims, C) + g


class BudgetView(NamedTuple):
    """A problem as the proven bound takes it (:func:`budget_view`): its dims and its scalar
    gates (B, H, T), one sequence per row."""

    dims: Dims
    log_alpha: np.ndarray


def budget_view(p: Problem) -> BudgetView:
    """``(dims, log_alpha)`` to pass to the bound (``budget_bound`` / ``assess``, which
    take scalar gates (B, H, T) of one sequence per row) for any problem ``p``.

    Vector gates: each key dimension's gates are a scalar gate sequence of their own, so
    log_alpha (B, H, T, dk) is viewed as (B, H * dk, T); the gate-mass terms then take the
    largest chunk sum over every dimension. Packed sequences: each sequence starts its own chunks
    at its first step, so the gates are laid out one sequence per row, zero-padded to the longest
    length Lmax, and dims become B = N, T = Lmax (a correct kernel's error on a sequence depends
    on its own length, never more than Lmax).
    """
    la = np.asarray(p.log_alpha, dtype=np.float64)
    B, H, T = la.shape[:3]
    if p.vector_gate:
        la = np.moveaxis(la, 3, 2).reshape(B, H * la.shape[3], T)
    if p.cu_seqlens is None:
        return BudgetView(p.dims, la)
    cu = np.asarray(p.cu_seqlens)
    lens = np.diff(cu)
    L = int(lens.max()) if lens.size else 0
    rows = np.zeros((len(lens), la.shape[1], L))
    for n, (t0, t1) in enumerate(zip(cu[:-1], cu[1:])):
        rows[n, :, :t1 - t0] = la[0, :, t0:t1]
    return BudgetView(replace(p.dims, B=len(lens), T=L), rows)


def budget_bound(output: str, compute_dtype: str, dims: Dims, chunk_size: int | None = None, *,
                 log_alpha, accumulate_dtype: str | None = None) -> float:
    """The largest budget_ulps a correct kernel can show on ``output`` (in ulps of the compute
    dtype's u). ``log_alpha``: the (B, H, T) gates the kernel received (canonical layout),
    needed for the gate-exponent term. chunk_size: C of a chunked kernel, 1 for a scan, None when
    unknown (the larger of C = 1 and C = T).

    ``accumulate_dtype`` None: every operation may round to the compute dtype, and the bound is
    gamma_n / u = n / (1 - n u) with n = accumulation_depth + gate term (infinite when n u >= 1:
    the dtype cannot resolve that accumulation and nothing can be concluded). Given (e.g.
    "float32" for a bfloat16 kernel), the kernel promises to hold every accumulation, carried
    state, cumulative gate and cotangent in that dtype and to round to the compute dtype only
    matmul operands and the returned values: at most ``budget_narrow_roundings`` roundings of u
    on a term's path, plus n roundings of the accumulation dtype's u_acc:
    bound = (m u + gamma_n(u_acc)) / u.
    """
    _check_output(output)
    u = lookup(UNIT_ROUNDOFF, compute_dtype, "compute_dtype")
    T = dims.T
    if chunk_size is None:
        n = max(_bound_for_chunk(output, dims, 1, log_alpha),
                _bound_for_chunk(output, dims, max(T, 1), log_alpha))
    else:
        n = _bound_for_chunk(output, dims, _chunk(chunk_size, T), log_alpha)
    if accumulate_dtype is None or accumulate_dtype == compute_dtype:
        return math.inf if n * u >= 1.0 else n / (1.0 - n * u)
    u_acc = lookup(UNIT_ROUNDOFF, accumulate_dtype, "accumulate_dtype")
    if u_acc > u:
        raise ValueError(f"accumulate_dtype: got {accumulate_dtype!r}, expected a format at least "
                         f"as precise as compute_dtype {compute_dtype!r}")
    m = tol("budget_narrow_roundings")
    if n * u_acc >= 1.0:
        return math.inf
    # (1 + u)^m (1 + gamma_n(u_acc)) - 1 <= gamma_m(u) + gamma_n(u_acc) + cross term, in units of u
    g_m = m * u / (1.0 - m * u)
    g_n = n * u_acc / (1.0 - n * u_acc)
    return (g_m + g_n + g_m * g_n) / u


# ---------------------------------------------------------------- the calibrated tier

def reference_arithmetic(compute_dtype: str, accumulate_dtype: str | None,
                         operand_dtype: str | None = None) -> dict:
    """How the same-precision reference kernels (``glaref.gla._baseline.run``) compute for a kernel
    of ``compute_dtype`` that accumulates in ``accumulate_dtype`` (None: in the compute dtype):
    ``arith`` (the dtype of every operation), ``operand`` (the format matmul operands are
    rounded to) and ``storage`` (the format sums and states are rounded to).

    float32 and float64: everything in that dtype. tf32 (float32 matmuls on an NVIDIA GPU at
    default precision): float32 arithmetic with every matmul operand rounded to TF32, as the
    hardware does (or to ``operand_dtype`` where that is coarser). 16-bit inputs accumulating
    in float32: float32 arithmetic throughout, the 16-bit format only in the returned values
    (the caller rounds the references' outputs to the dtypes the kernel returned), unless
    ``operand_dtype`` says the kernel also rounds its matmul operands (flash-linear-attention's
    Triton kernels feed 16-bit operands to tl.dot): then the references round theirs to it too.
    16-bit inputs accumulating in their own format: operands and sums rounded to it. The dtypes
    are the claims' (``glaref._audit._claims.Claims``), checked there."""
    if operand_dtype in ("float32", "float64"):
        operand_dtype = None
    if compute_dtype == "float64":
        return {"arith": "float64", "operand": None, "storage": None}
    if compute_dtype == "float32":
        return {"arith": "float32", "operand": operand_dtype, "storage": None}
    if compute_dtype == "tf32":     # operands rounded to TF32, or to a coarser claimed format
        coarser = operand_dtype is not None and \
            UNIT_ROUNDOFF[operand_dtype] > UNIT_ROUNDOFF["tf32"]
        return {"arith": "float32", "operand": operand_dtype if coarser else "tf32",
                "storage": None}
    acc = accumulate_dtype or compute_dtype
    if acc in ("float32", "float64"):   # float32 is what the references carry at most
        return {"arith": "float32", "operand": operand_dtype, "storage": None}
    return {"arith": "float32", "operand": compute_dtype, "storage": acc}


def widen(errors: dict[str, float], stick: Yardstick) -> float:
    """The baseline of one output, from the normwise errors of the reference kernels by role
    (``errors``), which the family's yardstick ``stick`` names (the scalar gate's:
    ``glaref.gla._judge.baseline_error``).

    A kernel is held to its yardstick's ``held_to`` reference: the scan for a step-by-step kernel,
    the chunked reference run at C for a chunked one. A kernel of unknown structure may lie
    anywhere between the yardstick's ``extremes`` (a step-by-step scan, wide chunks); it is held
    to the chunked reference at the family's default chunk (the form production kernels use),
    widened towards either extreme by the geometric mean where that extreme errs more:
    max(c, sqrt(c s), sqrt(c w)). On long-memory inputs the scan's sequential accumulation errs
    several times more than chunks do; on slowly decaying states and under the dlog_alpha
    identity, wide chunks do (docs/budgets.md, section 8). Each extreme is itself a correct
    kernel, so the baseline never drops below m / R times its error (m =
    ``calibrated_extreme_margin``): where an extreme errs more than (R / m)^2 times the held-to
    chunks (bfloat16 inputs under near-one gates at T >= 2048, whose products are exact in
    float32 while the scan rounds its state every step), a kernel erring up to m times as much
    as that extreme still passes: max(c, sqrt(c x), m x / R) over the extremes x (inf where one
    of them is not finite)."""
    c = errors[stick.held_to]
    if not stick.extremes:
        return c
    others = [errors[k] for k in stick.extremes]
    if not all(math.isfinite(x) for x in [c] + others):
        return math.inf
    m_over_R = tol("calibrated_extreme_margin") / tol("calibrated_ratio")
    return max([c] + [math.sqrt(c * x) for x in others] + [m_over_R * x for x in others])


def looseness(output: str, errors: dict[str, float], stick: Yardstick,
              floor: float) -> list[str]:
    """Where the kernel's unknown structure made this output's verdict looser than a declared
    one would be by more than the allowed ratio R (a kernel of that structure could then err
    over R^2 times its own error and pass): one sentence saying what sharpens it.

    Structure (``stick`` with ``extremes``): the baseline (:func:`widen`) against that of a
    kernel declaring the chunks of its ``held_to`` reference (that reference alone), both
    floored at ``floor`` as the verdict floors them. ``errors``: the reference kernels' normwise
    errors by role."""
    R = tol("calibrated_ratio")
    notes = []
    base = max(widen(errors, stick), floor)
    if stick.extremes and stick.held_to in errors:
        held = errors[stick.held_to]
        sharp = max(held, floor)
        if base > R * sharp:
            worst = max(stick.extremes, key=lambda k: errors[k])
            notes.append(f"{output}: chunk structure unknown, so held to {base / sharp:.3g}x the "
                         f"{stick.designs[stick.held_to].chunk}-step chunked reference's error "
                         f"({stick.designs[worst].label}, a correct kernel, errs "
                         f"{errors[worst] / held:.3g}x it here); give chunk_size "
                         "(--chunk-size) for a sharper verdict")
    return notes


def calibrated_floor(ref_norm: float, returned_dtype: str | None, compute_dtype: str, output: str,
                     dims: Dims, size: int) -> float:
    """The least baseline (normwise, absolute): one rounding of every element of the result in
    the dtype it was returned in, u_ret ||ref||_2 (u of the compute dtype when the returned
    dtype is unknown), plus the underflow allowance of every element
    (``_metrics.underflow_floor``). The reference kernels can be exact where a correct kernel
    rounds once (T = 1, dk = dv = 1, exactly representable results)."""
    u = lookup(UNIT_ROUNDOFF, returned_dtype or compute_dtype, "returned dtype")
    return (tol("calibrated_floor") * u * ref_norm
            + math.sqrt(size) * _metrics.underflow_floor(output, compute_dtype, dims))


@dataclass
class Assessment:
    """Figures and verdict of one output. Norms are over the whole output array."""

    output: str
    rel_err: float                 # ||x - ref|| / ||ref|| (the seed report's figure)
    max_abs_err: float
    budget_ulps: float | None      # proven tier: max |x - ref| / (u scale + floor)
    bound: float                   # proven tier: the worst case of any correct kernel (may be inf)
    baseline_rel_err: float | None  # calibrated tier: the baseline (floored), relative to ||ref||
    ratio: float | None            # calibrated tier: ||x - ref|| / baseline
    allowed_ratio: float
    nonfinite: int = 0
    first_nonfinite: list[int] | None = None
    # None (passed), "nonfinite", "calibrated", "proven", "undecided", or "strict" (less accurate
    # than the most accurate designs, within the field's, and strict was asked for)
    failed_tier: str | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)   # where the verdict is looser (looseness)
    # calibrated tier: ||x - ref|| over the envelope of the field's correct designs (the largest
    # of the baseline and their errors); ``ratio`` is the one to the most accurate ones (x_best)
    envelope_ratio: float | None = None
    design: str | None = None      # less accurate: the design family that explains the error

    @property
    def ok(self) -> bool:
        return self.failed_tier is None

    @property
    def x_best(self) -> float | None:
        """The error over the most accurate correct designs' (the baseline): ``ratio``."""
        return self.ratio

    @property
    def outcome(self) -> str:
        """"ok" (within the most accurate designs' rule), "less_accurate" (beyond it, within the
        field's correct designs: a failure only under strict) or "fail"."""
        if self.design is not None and self.failed_tier in (None, "strict"):
            return "less_accurate"
        return "ok" if self.failed_tier is None else "fail"


@dataclass(frozen=True)
class Mismatch:
    """numpy.testing's "Mismatched elements: n / N" for one failing output: the elements beyond
    the verdict's element-wise allowance, the proven bound (``budget_ulps`` is the largest element
    error in budget units; more than ``bound`` fails the proven tier), non-finite ones included.
    The calibrated tier judges the whole output's norm and has no element-wise allowance: an
    output failing only it can have count 0. ``worst``: the largest element error (budget
    units), at ``worst_index`` in the caller's layout."""

    count: int
    size: int
    bound: float
    worst: float
    worst_index: tuple[int, ...] | None
    layout: str

    def line(self) -> str:
        """The message's line (without the output's name)."""
        def g(x) -> str:        # None: a non-finite figure read back from JSON
            return "inf" if x is None else f"{x:.4g}"

        share = 100.0 * self.count / self.size if self.size else 0.0
        at = "" if self.worst_index is None else \
            f"; worst {g(self.worst)} at {self.worst_index} ({self.layout})"
        return (f"mismatched elements: {self.count} / {self.size} ({share:.3g}%) beyond the "
                f"proven bound of {g(self.bound)} budget units{at}")

    def summary(self) -> dict[str, Any]:
        """As the records keep it (JSON-able)."""
        return {"count": self.count, "size": self.size, "bound": self.bound, "worst": self.worst,
                "worst_index": None if self.worst_index is None else list(self.worst_index)}


def _norm(x: np.ndarray) -> float:
    return float(np.linalg.norm(x.ravel()))


def _over(err: float, base: float) -> float:
    """err / base, 0 for no error and inf for a zero base."""
    return 0.0 if err == 0 else (err / base if base > 0 else math.inf)


def flag_nonfinite(a: Assessment) -> bool:
    """Fail ``a`` when its output has a non-finite value (every family's first rule); whether
    it did."""
    if a.nonfinite:
        first = a.first_nonfinite
        where = "" if first is None else f", first at {tuple(first)}"
        a.failed_tier, a.reason = "nonfinite", f"{a.output}: {a.nonfinite} non-finite value(s){where}"
    return bool(a.nonfinite)


class References(NamedTuple):
    """The same-precision reference kernels that judge one output: ``outputs`` {role: value},
    already rounded to the dtype the kernel returned it in, and the family's yardstick
    ``stick`` that names the roles (``glaref._audit._designs.Yardstick.roles``)."""

    outputs: dict[str, np.ndarray]
    stick: Yardstick


@dataclass(frozen=True)
class Calibration:
    """What the calibrated tier judges one output's error by: ``errors`` the reference kernels'
    normwise errors ||r - ref||_2 by role (None: they did not run), ``stick`` the family's
    yardstick naming the roles, ``floor`` the least baseline (:func:`calibrated_floor`) and
    ``ref_norm`` the oracle's ||ref||_2 (the baseline is reported relative to it)."""

    errors: dict[str, float] | None
    stick: Yardstick | None
    floor: float
    ref_norm: float


@dataclass(frozen=True)
class Wording:
    """What a family's messages add to the calibrated tier's common wording: ``hint`` the
    declaration that would hold a less accurate kernel to the design that explains its error
    (from that Design; None: the family says none), ``envelope`` whether a FAIL also gives its
    ratio to the envelope of the field's designs and names the least accurate of them."""

    hint: Callable[[Design], str] | None = None
    envelope: bool = False


def calibrated(a: Assessment, err: float, cal: Calibration, *, label: str, strict: bool,
               wording: Wording = Wording(), proven: str | None = None) -> None:
    """The calibrated tier's figures and outcome of one output, filled into ``a`` (ratio,
    envelope_ratio, baseline_rel_err, design, failed_tier, reason) for any family: ``err`` the
    kernel's normwise error ||x - ref||_2, ``cal`` the reference kernels' errors and the
    yardstick naming them, R ``a.allowed_ratio``.

    Within R times the baseline of the most accurate designs (:func:`widen`, floored), ok; beyond
    it but within R times the envelope of the field's correct designs (the largest of the
    baseline and the errors of the yardstick's ``field``), less accurate, the design explaining
    it the field's design within whose rule the error lies that errs nearest to it, a failure
    only under ``strict``; beyond both, FAIL. No finite baseline (or no references): undecided,
    never a pass. ``proven``: the proven tier's failure message, which takes precedence over
    the calibrated outcome (its figures are still filled). ``label``: the precision the messages
    name the reference kernels by; ``wording``: the family's additions (:class:`Wording`)."""
    R = a.allowed_ratio
    field_errs: dict[str, float] = {}
    if cal.errors is not None:
        base = max(widen(cal.errors, cal.stick), cal.floor)
        a.baseline_rel_err = base / cal.ref_norm if cal.ref_norm else base
        a.ratio = _over(err, base)
        field_errs = {r: cal.errors[r] for r in cal.stick.field
                      if r in cal.errors and math.isfinite(cal.errors[r])}
        a.envelope_ratio = _over(err, max([base] + list(field_errs.values())))
    if proven is not None:
        a.failed_tier, a.reason = "proven", proven
    elif a.ratio is None or not math.isfinite(a.baseline_rel_err):
        a.failed_tier = "undecided"
        a.reason = (f"{a.output}: no verdict: the {label} reference kernels "
                    f"{'did not run' if a.ratio is None else 'gave a non-finite error'}")
    elif a.ratio > R and a.envelope_ratio > R:
        a.failed_tier = "calibrated"
        a.reason = (f"{a.output}: {a.ratio:.3g}x the error of the {label} reference kernels "
                    f"(rel_err {a.rel_err:.3g} vs {a.baseline_rel_err:.3g}; allowed {R:g}x)")
        if wording.envelope and field_errs:
            widest = max(field_errs, key=field_errs.get)
            a.reason += (f", {a.envelope_ratio:.3g}x that of every correct design the field "
                         f"ships (the least accurate here: {cal.stick.designs[widest].family})")
    elif a.ratio > R:
        within = [r for r, e in field_errs.items() if err <= R * e]
        design = cal.stick.designs[min(within, key=lambda r: abs(math.log(err / field_errs[r])))]
        a.design = design.family
        a.reason = (f"{a.output}: less accurate: {a.ratio:.3g}x the error of the most accurate "
                    f"{label} reference kernels (allowed {R:g}x), {a.envelope_ratio:.3g}x that "
                    f"of a correct design the field ships: {a.design}")
        if wording.hint is not None:
            a.reason += f"; {wording.hint(design)}"
        if strict:
            a.failed_tier = "strict"
            a.reason += "; a failure under strict"
    else:
        a.reason = f"{a.output}: {a.ratio:.3g}x the {label} reference kernels' error (allowed {R:g}x)"


def _sharpen(design: Design, chunk_size: int | None) -> str:
    """The scalar gate's hint for a less accurate kernel explained by ``design``."""
    if chunk_size is None:
        also = "decay_form" if design.dlog_alpha is None else design.declares
        return f"declaring its chunk_size and {also} holds it to its own design"
    if design.declares is not None:
        return f"declaring {design.declares} holds it to that design alone"
    return "no narrower declaration exists"


def assess(output: str, x, ref, *, scale, claims: Claims, view: BudgetView,
           reference_outputs: References | None,
           returned_dtype: str | None = None) -> Assessment:
    """Figures and the two-tier verdict of one output (module docstring), with the calibrated
    tier's three outcomes (:func:`calibrated`): within R times the baseline of the most
    accurate designs, ok; beyond it but within R times the envelope of the field's correct
    designs (``glaref._audit._designs.Yardstick.field``: chunk-local cumsum decays, term-by-term
    sums, dlog_alpha by the chunk-local identity), less accurate, a pass unless ``strict``;
    beyond that, FAIL.

    x: the kernel's value (any real float dtype, canonical layout); ref: the oracle's float64
    value on the same rounded inputs; scale: its error scale (``_budget``; the identity's for
    log_alpha). claims: what is known of the kernel, as the proven bound reads it
    (``glaref.gla._judge.assess_output`` gives them): ``compute_dtype`` the unit of budget_ulps and
    of the bound (set), ``accumulate_dtype``, ``chunk_size`` (``budget_bound``) and ``strict``;
    they were checked at the face (``glaref._audit._claims``). view: the problem as the
    bound takes it (:func:`budget_view`). reference_outputs: the same-precision reference
    kernels that judge this output and the yardstick naming them (:class:`References`, the
    scalar gate's ``glaref.gla._designs.yardstick`` of the claims' chunk_size, decay_form and
    dlog_alpha_form; None: the calibrated tier is not run and the verdict cannot pass).
    returned_dtype: the dtype the kernel returned this output in (the floor's rounding; None:
    the compute dtype). Messages name the references' precision by the compute dtype.
    """
    compute_dtype, accumulate_dtype = claims.compute_dtype, claims.accumulate_dtype
    chunk_size = claims.chunk_size
    dims, log_alpha = view
    _check_output(output)
    x = np.asarray(x)
    count, first = _metrics.nonfinite(x)
    x64 = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    m = _metrics.measure(output, x64, ref, scale, compute_dtype, dims)
    bound = budget_bound(output, compute_dtype, dims, chunk_size, log_alpha=log_alpha,
                         accumulate_dtype=accumulate_dtype)
    R = tol("calibrated_ratio")
    a = Assessment(output, m["rel_err"], m["max_abs_err"], m["budget_ulps"], bound, None, None, R,
                   count, first)
    if flag_nonfinite(a):
        return a
    ref_norm = _norm(ref)
    errs, stick, floor = None, None, 0.0
    if reference_outputs is not None:
        stick = reference_outputs.stick
        errs = {k: _norm(np.asarray(v, dtype=np.float64) - ref)
                for k, v in reference_outputs.outputs.items()}
        floor = calibrated_floor(ref_norm, returned_dtype, compute_dtype, output, dims, ref.size)
        if math.isfinite(max(widen(errs, stick), floor)):
            a.notes = looseness(output, errs, stick, floor)
    proven = None
    if a.budget_ulps is not None and a.budget_ulps > bound:
        acc = "" if accumulate_dtype is None else f", accumulating in {accumulate_dtype}"
        proven = (f"{output}: beyond any correct kernel: budget_ulps {a.budget_ulps:.4g} > proven "
                  f"bound {bound:.4g} ({compute_dtype}{acc}, chunk_size={chunk_size})")
    calibrated(a, _norm(x64 - ref), Calibration(errs, stick, floor, ref_norm),
               label=compute_dtype, strict=claims.strict,
               wording=Wording(lambda d: _sharpen(d, chunk_size), envelope=True), proven=proven)
    return a
