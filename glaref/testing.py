"""``glaref.testing``: check a kernel against the float64 oracle from a test suite.

    import glaref.testing as gt

    def test_my_kernel():                      # a JAX, torch or NumPy callable
        gt.check_kernel(my_kernel, chunk_size=64)

    def test_outputs_computed_anywhere():      # outputs and gradients already computed
        gt.assert_close_to_oracle(actual, inputs)

``check_kernel`` runs a kernel on glaref's problems and judges every row; ``assert_close_to_oracle``
judges outputs the caller computed (torch CPU or CUDA tensors, NumPy, JAX, CuPy) on the inputs
the kernel received. Both are thin faces over the audit engine's judgement
(``glaref.gla._judge.assess_outputs`` -> ``glaref._audit._verdict.assess``, the verdict of ``glaref
audit``): each output and gradient passes when it is finite and within the two tiers (within
``calibrated_ratio`` times the error of glaref's same-precision reference kernels on the same
inputs, and within the proven worst-case bound); otherwise ``AssertionError`` lists, per output,
the tier that failed and the figures (ratio to the reference kernels, rel_err of both,
budget_ulps and the proven bound, max_abs_err, first non-finite index), as ``numpy.testing``
does. As in ``numpy.testing``, the thing under test comes first; the truth (the oracle) is
implied.

Loading this module is cheap. jax is imported only for JAX kernels; torch only for torch kernels
or tensors; ``assert_close_to_oracle`` needs only the core dependencies (NumPy, Numba) at every
dtype.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from ._audit import _args, _claims
from ._audit._claims import Claims
from ._audit._engine import JaxOptions, audit_jax, audit_kernel, check_probes
from ._audit._frameworks import check_device, check_framework, detect_framework, dtype_name, to_host_float64
from ._audit._messages import describe, failing_lines, less_accurate_lines, output_table
from ._audit._presets import CHECK_CONFIG, CHECK_MODES, CHECK_REGIMES, CHECK_SEQS, Preset
from ._audit._records import Output
from ._errors import (
    AuditEnvironmentError,
    AuditUsageError,
    ClaimError,
    DTypeError,
    LessAccurateWarning,
    ShapeError,
)
from ._inputs import (
    _KIND,
    ARRAYS,
    FORWARD,
    GRADS,
    OUTPUTS,
    canonicalize,
    check_scale,
    from_canonical,
    to_canonical,
)
from ._rounding import round_to_dtype
from .conventions import LOG_ALPHA_BT_SUM
from .gla import _judge

__all__ = ["DEFAULT_CONFIG", "DEFAULT_SEQS", "LessAccurateWarning", "assert_close_to_oracle",
           "check_kernel"]

# Small enough to run in seconds on a CPU, large enough to exercise what kernels get wrong:
# grouped heads (G=2 < H=4), T=1 (a single step), and lengths just below and above a multiple of
# common chunk lengths (16, 32, 64 divide 64), so ragged last chunks and chunk hand-overs occur.
DEFAULT_CONFIG = CHECK_CONFIG      # B, G, H, dk, dv
DEFAULT_SEQS = CHECK_SEQS
# check_kernel's defaults for what it is not given
_CHECK = Preset((), {}, CHECK_SEQS, CHECK_MODES, 0, CHECK_REGIMES)


def _framework(kernel: Any, framework: str | None) -> str:
    """The framework ``kernel`` is checked in: ``framework``, or detected from its code; names
    and "module:function" specs are JAX kernels (the audit's)."""
    check_framework(framework)
    if isinstance(kernel, str) or not callable(kernel):
        if framework not in (None, "jax"):
            raise AuditUsageError(f"kernel: got {kernel!r} with framework {framework!r}, expected a "
                                  f"{framework} callable (names and specs are JAX kernels)",
                                  argument="kernel")
        return "jax"
    return detect_framework(kernel) if framework is None else framework


CLAIM_KEYWORDS = ("dtype", "layout", "compute_dtype", "accumulate_dtype", "operand_dtype",
                  "chunk_size", "dlog_alpha_form", "decay_form", "gate", "grads", "strict",
                  "recurrence")


def parse_claims(claimed: dict[str, Any], function: str, **defaults: Any) -> Claims:
    """The claim keywords a testing function was given (``_claims.Claims``), ``defaults`` where
    absent; an unknown keyword is a usage error naming it."""
    unknown = sorted(set(claimed) - set(CLAIM_KEYWORDS))
    if unknown:
        raise TypeError(f"{function}() got unexpected keyword argument(s) {unknown}, expected "
                        f"claims among {CLAIM_KEYWORDS}" + (" (or backend, precision)" if
                                                            function == "check_kernel" else ""))
    return Claims(**{**defaults, **claimed})


def _run_check(kernel, framework, rows, claims: Claims, *, backend, precision, device,
               probes=None):
    """check_kernel's rows: JAX kernels through ``audit_jax``, torch/NumPy ones through
    ``audit_kernel``."""
    fw = _framework(kernel, framework)
    if fw == "jax":
        for name, value in (("compute_dtype", claims.compute_dtype), ("device", device)):
            if value is not None:
                raise AuditUsageError(f"{name}: got {value!r} for a JAX kernel, expected None (the "
                                      "audit derives the arithmetic from dtype, precision and "
                                      "backend, and places the arrays itself)", argument=name)
        how = JaxOptions(precision=precision, backend=backend, repeats=0,
                         probes=check_probes(probes))
        return audit_jax([kernel], rows, claims, how)
    check_device(device, fw)
    if backend is not None:
        raise AuditUsageError(f"backend: got {backend!r} for a {fw} kernel, expected None "
                              "(JAX only; a torch kernel's device is device=)", argument="backend")
    if precision != "default":
        raise AuditUsageError(f"precision: got {precision!r} for a {fw} kernel, expected "
                              "'default' (jax's matmul precision; for TF32 matmuls pass "
                              "compute_dtype='tf32')", argument="precision")
    records = audit_kernel(kernel, rows, claims, framework=fw, detected=framework is None,
                           device=device, probes=probes)
    lost = sorted({r.params["forward_only"] for r in records if r.params.get("forward_only")})
    if fw == "torch" and lost and "fwd_bwd" in rows.modes:
        warnings.warn(f"{records[0].impl}: gradients not checked, forward only: "
                      f"{'; '.join(lost)}", stacklevel=3)
    return records


def check_kernel(kernel: Callable | str, *, framework: str | None = None,
                 configs=DEFAULT_CONFIG, seqs=None, regimes=None,
                 modes=("fwd_bwd",), seed: int = 0, scale: float = 1.0, cu_seqlens=None,
                 device: str | None = None, probes=None,
                 **claims: Any) -> list[dict[str, Any]]:
    """Assert that ``kernel`` agrees with the float64 oracle; return the records (one per row,
    as :func:`glaref.audit` gives them).

    Parameters
    ----------
    kernel : callable or str
        ``(q, k, v, log_alpha, h0) -> o | (o, h_T)`` on arrays of its framework in its layout (it
        receives ``scale`` when its signature takes it, else must apply it itself), or, for JAX, a
        built-in name ("chunked", "scan") or "package.module:function".
    framework : {"jax", "torch", "numpy"} or None
        None detects it from the kernel's code (``glaref._audit._frameworks.detect_framework``). JAX
        kernels are compiled by the audit engine (gradients by ``jax.vjp``); torch and NumPy
        kernels are run by ``glaref._audit._frameworks.run_kernel`` on the same problems and judged by
        the same verdict, gradients through ``torch.autograd``. A kernel that is not
        differentiable (any NumPy kernel; a torch kernel whose outputs do not require grad) is
        checked forward only: its rows are mode "fwd" with ``forward_only`` giving the reason (a
        warning says so for torch).
    configs, seqs, regimes, modes, seed, scale
        The rows, as ``glaref.audit``'s; by default a few seconds' worth of small cases on a CPU
        (seqs None: ``DEFAULT_SEQS``, or the T that explicit ``cu_seqlens`` offsets fix; regimes
        None: standard, strong_decay and near_one, where a clamped gate and 16-bit accumulation
        show).
    cu_seqlens : str or sequence of int, optional
        Packed sequences, as ``glaref.audit``'s ("0,5,5,40" or "random:N"); the kernel receives
        the offsets as the keyword ``cu_seqlens=`` (a NumPy int64 array; for torch a tensor).
    device : str, optional
        torch only: where the inputs go, "cpu" (default) or "cuda".
    probes : bool, str or sequence of str, optional
        Also run the probes of ``glaref._audit._probes`` on every fwd_bwd row (True or "all", or names
        among determinism, causality, packed, cotangents, chunk_sweep): bit-identical reruns,
        no dependence on later steps, isolated packed sequences, structured cotangents, chunk
        boundaries. A failing probe fails the row, with its own line in the AssertionError.
    **claims
        JAX only, beside the claims: ``backend`` (the device platform, "cpu" or "gpu") and
        ``precision`` (jax's matmul precision, which makes float32 "tf32" on an NVIDIA GPU).
        What the kernel claims (``glaref._audit._claims.Claims``): dtype (default "float32"), layout
        ("bhtd"), chunk_size (1 for a step-by-step scan; None, unknown, judges it between the
        extremes), accumulate_dtype (what a 16-bit kernel accumulates in; None: float32),
        dlog_alpha_form ("identity", the reverse cumsum of q.dq - k.dk of flash-linear-attention's
        chunk kernels, or "direct", a scan or autodiff; None, unknown, holds it to the direct form,
        an identity kernel's dlog_alpha then less accurate, never a failure), decay_form, gate
        ("scalar" or "vector": GLA's per-key-dimension log_alpha (B, H, T, dk)), grads (the
        gradients it provides), recurrence ("scalar_gate", the default, or "delta": the gated
        delta rule of ``glaref.delta``, a kernel ``(q, k, v, beta, log_alpha, h0) -> o |
        (o, h_T)`` of any framework
        judged on its family's regimes, default standard, strong_decay, converged and
        beta_two, by the calibrated tier alone), operand_dtype (the format it rounds its matmul
        operands to beyond ``dtype``, e.g. "bfloat16" for FLA's bfloat16 Triton kernels or a JAX
        kernel that casts its operands to bfloat16 before each dot: the reference kernels then
        round theirs to it too), and for torch and NumPy kernels compute_dtype (default
        ``dtype``; "tf32" for float32 matmuls run as TF32, e.g. a Triton ``tl.dot``; a JAX
        kernel's follows from dtype, precision and backend).

    Returns
    -------
    list of dict
        One record per row.

    Raises
    ------
    AssertionError
        Naming every failing row and output with its figures. A kernel that raises (SystemExit
        included), or returns the wrong structure or a non-float dtype, fails too: the caller
        asked for this kernel to be checked; when it raised, the headline says so and the
        exception's traceback is the ``__cause__``.
    glaref.AuditUsageError
        Bad arguments (``glaref.ClaimError`` for a bad claim), with a one-line message.
    glaref.AuditEnvironmentError
        jax missing for a JAX kernel, or rows glaref declines for lack of memory.
    """
    __tracebackhide__ = True
    backend, precision = claims.pop("backend", None), claims.pop("precision", "default")
    try:
        parsed = parse_claims(claims, "check_kernel")
        fam = _args.family(parsed.recurrence)
        # the family's own default regimes (the quick preset's: for the scalar gate CHECK_REGIMES)
        pre = replace(_CHECK, regimes=fam.presets["quick"].regimes)
        rows = _args.rows(pre, _args.problems(seed, scale, cu_seqlens), configs=configs,
                          seqs=seqs, modes=modes, regimes=regimes, fam=fam)
        records = _run_check(kernel, framework, rows, parsed, backend=backend,
                             precision=precision, device=device, probes=probes)
    except ClaimError as exc:
        # raised afresh from here, so that a test report shows this one line, not the engine
        raise ClaimError(exc.argument, exc.detail) from None
    except (AuditUsageError, AuditEnvironmentError) as exc:
        raise type(exc)(str(exc), exc.argument) from None
    bad = [r for r in records if r.ok is False]
    declined = [r for r in records if r.ok is None]
    less = [r for r in records if r.measured and r.outcome == "less_accurate"]
    if less and not bad:
        warnings.warn(LessAccurateWarning(
            f"{len(less)} of {len(records)} rows less accurate than the most accurate designs "
            "(not a failure; strict=True makes it one):\n"
            + "\n".join(line for r in less for line in less_accurate_lines(r))),
            stacklevel=2)
    if declined and not bad:
        raise AuditEnvironmentError(
            f"{len(declined)} of {len(records)} rows not checked: "
            + "; ".join(f"{r.mode} config {r.config} T={r.seq}: {r.skipped}"
                        for r in declined))
    if bad:
        rows_text = "\n".join(describe(r) for r in bad)
        raised = [r for r in bad if r.traceback]
        what = ("kernel raised" if raised and len(raised) == len(bad) else
                "kernel disagrees with the glaref oracle")
        exc = AssertionError(
            f"{what} on {len(bad)} of {len(records)} rows "
            f"(dtype {parsed.dtype}, compute dtype {bad[0].params.get('compute_dtype')}, "
            f"chunk_size={bad[0].params.get('chunk_size')}; calibrated tier: normwise error against "
            f"glaref's same-precision reference kernels on the same inputs; proven tier: "
            f"budget_ulps, error in units of u x the element's sum of |terms|, against the "
            f"worst case of any correct kernel):\n{rows_text}")
        exc.records = [r.to_json() for r in records]   # as the audit's JSON report has them
        if raised:
            raise exc from KernelRaised(raised[0].traceback)
        raise exc
    return [r.to_json() for r in records]


class KernelRaised(Exception):
    """The exception a checked kernel raised, as its traceback (the kernel's frames; glaref's
    trimmed): the ``__cause__`` of ``check_kernel``'s AssertionError."""

    def __str__(self) -> str:
        return "the kernel raised:\n" + self.args[0].rstrip()


# ---------------------------------------------------------------- outputs computed anywhere

_ARRAY_KEYS = ("q", "k", "v", "log_alpha", "h0", "do", "dh_T", "scale")
_INPUT_KEYS = _ARRAY_KEYS + ("layout", "dtype")


def _gather_inputs(inputs: Mapping[str, Any] | None, keywords: dict[str, Any]) -> dict[str, Any]:
    """The inputs mapping and the keywords as one dict; conflicts and unknown keys refused."""
    if inputs is None:
        inputs = {}
    if not isinstance(inputs, Mapping):
        raise TypeError(f"inputs: got {type(inputs).__name__}, expected a mapping with keys "
                        f"{_INPUT_KEYS} (e.g. glaref.conventions.fla.simple_gla_inputs(...)) or None "
                        "with the arrays as keywords")
    unknown = [k for k in inputs if k not in _INPUT_KEYS]
    if unknown:
        raise ValueError(f"inputs: got keys {unknown}, expected some of {_INPUT_KEYS}")
    out = dict(inputs)
    for key, value in keywords.items():
        if value is None:
            continue
        if out.get(key) is not None:
            raise ValueError(f"{key}: given both in inputs and as a keyword, expected one of them")
        out[key] = value
    for key in ("q", "k", "v", "log_alpha"):
        if out.get(key) is None:
            raise ValueError(f"inputs: got no {key!r}, expected the {key} the kernel received "
                             f"(in inputs or as the keyword {key}=)")
    return out


def _received(args: dict[str, Any], claimed: dict[str, Any]):
    """(Problem, Claims, scale): the canonical float64 problem the kernel received, checked:
    shapes (``glaref._inputs.canonicalize``), and q, k, v exactly values of the claimed dtype
    (nothing is rounded here: the oracle must see what the kernel saw); and the kernel's claims
    (layout and dtype from the inputs unless claimed; the gate kind from log_alpha's rank)."""
    claims = parse_claims(claimed, "assert_close_to_oracle", layout=args.get("layout") or "bhtd",
                          dtype=args.get("dtype") or dtype_name(args["q"]))
    scale = 1.0 if args.get("scale") is None else check_scale(args["scale"])
    arrays = {n: None if args.get(n) is None else to_host_float64(args[n], n) for n in ARRAYS}
    p = canonicalize(*(arrays[n] for n in ARRAYS), layout=claims.layout)
    dtype = claims.dtype
    for n in ("q", "k", "v"):
        x = getattr(p, n)
        r = round_to_dtype(x, dtype)
        if not np.array_equal(r, x):
            i = tuple(int(j) for j in np.argwhere(r != x)[0])
            raise DTypeError(
                f"{n}: got {float(x[i])!r} at {i} (canonical \"bhtd\" index), which is not a {dtype} "
                f"number, expected exactly the {dtype} values the kernel received (glaref rounds "
                f"nothing: pass the tensors the kernel was given, or the dtype it received)", argument=n)
    return p, replace(claims, gate="vector" if p.vector_gate else "scalar"), scale


def _judged_values(actual: Mapping[str, Any], p, layout: str):
    """(values, dtypes, skipped, unjudged): the outputs the caller computed as canonical float64
    arrays, the dtype each was returned in, the names not computed, extra results not judged."""

    if not isinstance(actual, Mapping):
        raise TypeError(f"actual: got {type(actual).__name__}, expected a mapping of glaref's "
                        f"output names {OUTPUTS} to arrays (None: not computed), e.g. "
                        "glaref.conventions.fla.simple_gla_outputs(...)")
    extra = ("dtypes", LOG_ALPHA_BT_SUM)
    unknown = [k for k in actual if k not in OUTPUTS + extra]
    if unknown:
        raise ValueError(f"actual: got keys {unknown}, expected glaref's names {OUTPUTS} (plus "
                         f"{extra}); glaref.conventions renames a project's results (dq -> q, "
                         "ht -> h_T, ...)")
    given_dtypes = actual.get("dtypes") or {}
    if not isinstance(given_dtypes, Mapping):
        raise TypeError(f"actual['dtypes']: got {type(given_dtypes).__name__}, expected a mapping "
                        "of output names to dtype names")
    d = p.dims
    shapes = {"o": (d.B, d.H, d.T, d.dv), "h_T": (d.B, d.H, d.dk, d.dv), "q": (d.B, d.G, d.T, d.dk),
              "k": (d.B, d.G, d.T, d.dk), "v": (d.B, d.H, d.T, d.dv), "log_alpha": p.log_alpha.shape,
              "h0": (d.B, d.H, d.dk, d.dv)}
    values, dtypes, skipped = {}, {}, []
    for name in OUTPUTS:
        x = actual.get(name)
        if x is None:
            skipped.append(name)
            continue
        a = to_host_float64(x, f"actual[{name!r}]")
        want = shapes[name]
        spelled = want if layout == "bhtd" or _KIND[name] == "state" else \
            (want[0], want[2], want[1]) + want[3:]
        if a.shape != spelled:
            label = name if name in FORWARD else f"the gradient {name}"
            raise ShapeError(f"actual[{name!r}]: got shape {a.shape}, expected {spelled} (the "
                             f"shape of {label} for these inputs, layout {layout})")
        values[name] = to_canonical(a, _KIND[name], layout)
        dtypes[name] = _claims.dtype_name(given_dtypes[name], f"actual['dtypes'][{name!r}]") \
            if name in given_dtypes else dtype_name(x)
    if not values:
        raise ValueError(f"actual: got no output (every value None or missing), expected at least "
                         f"one of {OUTPUTS}")
    unjudged = [LOG_ALPHA_BT_SUM] if actual.get(LOG_ALPHA_BT_SUM) is not None else []
    return values, dtypes, skipped, unjudged


def _worst_at(x: np.ndarray, ref: np.ndarray, kind: str, layout: str) -> tuple[int, ...] | None:
    """Index of the largest |x - ref| in the caller's layout (None for an empty array)."""
    if x.size == 0:
        return None
    with np.errstate(invalid="ignore"):
        diff = np.abs(from_canonical(x, kind, layout) - from_canonical(ref, kind, layout))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))


def assert_close_to_oracle(actual: Mapping[str, Any], inputs: Mapping[str, Any] | None = None, *,
                           oracle_impl: str | None = None, **given: Any) -> dict[str, Any]:
    """Assert that a kernel's outputs and gradients, computed anywhere, agree with the float64
    oracle on the inputs the kernel received.

        got = fla.simple_gla_outputs(o, ht, q.grad, k.grad, v.grad, g.grad, h0.grad)
        gt.assert_close_to_oracle(got, fla.simple_gla_inputs(q, k, v, g, initial_state=h0,
                                                             do=do, dht=dht))

    The verdict is the audit's (``glaref.gla._judge``): each output passes when finite, within
    ``calibrated_ratio`` times the error of glaref's same-precision reference kernels on the same
    inputs (NumPy/Numba: no JAX at any dtype) and within the proven worst-case bound. Vector
    gates (GLA: log_alpha (B, H, T, dk), ``fla.gla_inputs``) are judged like scalar ones;
    dlog_alpha then has log_alpha's shape.

    Parameters
    ----------
    actual : mapping
        glaref's names (o, h_T, q, k, v, log_alpha, h0: the gradients under the names of their
        inputs) to arrays of any framework and device (torch CPU or CUDA tensors, NumPy, JAX,
        CuPy, DLPack); None or missing means not computed: skipped, not failed. Optional
        ``dtypes`` ({name: dtype name}, what each result was returned in; by default the array's
        own dtype) and ``log_alpha_bt_sum`` (FLA's dg_gamma: listed, not judged), as
        ``glaref.conventions.fla.simple_gla_outputs`` gives them.
    inputs : mapping, optional
        Keys q, k, v, log_alpha, h0, do, dh_T, scale, layout, dtype (what
        ``fla.simple_gla_inputs`` returns), or None with the same as keywords. They must be
        exactly what the kernel received (nothing is rounded: q, k, v not representable in
        ``dtype`` are refused); do and dh_T are the cotangents of the backward pass (dh_T None:
        h_T had none); h0 None means zeros; scale defaults to 1.0 (glaref's); layout ("bhtd" or
        "bthd") is that of the inputs and of ``actual``; dtype, the dtype the kernel received,
        defaults to q's.
    oracle_impl : {"numba", "numpy"}, optional
        The oracle's implementation (default Numba's when installed).
    **given
        The inputs' keys as keywords, and the kernel's claims (``glaref._audit._claims.Claims``), as
        :func:`check_kernel`'s: compute_dtype (default ``dtype``; "tf32" for a float32 kernel
        whose matmuls run as TF32), accumulate_dtype (None: float32), operand_dtype, chunk_size
        (1: step by step; None: unknown), dlog_alpha_form ("identity", flash-linear-attention's
        chunk kernels; "direct", its fused_recurrent ones; None: unknown), decay_form, grads.

    Returns
    -------
    dict
        One ``glaref._audit._verdict.Assessment`` per judged output (rel_err, ratio, budget_ulps,
        bound, ...).

    Raises
    ------
    AssertionError
        With a table of every judged output (tier, ratio to the reference kernels, rel_err of
        both, budget_ulps and the proven bound, max_abs_err and its index, first non-finite
        index; indices in the caller's ``layout``); its attribute ``assessments`` holds the
        figures the function would have returned.
    ValueError, TypeError
        Bad arguments, naming the argument (``glaref.ClaimError`` for a bad claim).
    """
    __tracebackhide__ = True
    args = _gather_inputs(inputs, {k: given.pop(k) for k in _INPUT_KEYS if k in given})
    p, claims, sc = _received(args, given)
    values, dtypes, skipped, unjudged = _judged_values(actual, p, claims.layout)
    grads = [n for n in values if n in GRADS]
    if grads and p.do is None:
        raise ValueError(f"inputs: got no do, expected the cotangent of o that produced the "
                         f"gradients {grads} (and dh_T, that of h_T, if there was one)")
    oracle = oracle_impl or _args.default_oracle()
    if oracle not in _args.ORACLES:
        raise ValueError(f"oracle_impl: got {oracle!r}, expected 'numba', 'numpy' or None")
    c = claims.resolved(claims.compute_dtype or claims.dtype)
    truth = _judge.Truth(p, sc, oracle)
    final = p.dh_T is not None
    per = _judge.assess_outputs(truth, values, dtypes, final=final, grads=bool(grads), claims=c)
    _judge.locate_nonfinite(per, values, c.layout)
    bad = [a for a in per.values() if not a.ok]
    if bad:
        worst = {n: _worst_at(values[n], truth.reference(n, final), _KIND[n], c.layout)
                 for n in per}
        mismatched = _judge.mismatches(truth, per, values, final=final, grads=bool(grads),
                                       claims=c, layout=c.layout)
        outputs = {n: Output.of(a, mismatch=mismatched.get(n)) for n, a in per.items()}
        d = p.dims
        exc = AssertionError(
            f"kernel outputs disagree with the glaref oracle on {len(bad)} of {len(per)} judged "
            f"outputs (dtype {c.dtype}, compute dtype {c.compute_dtype}, accumulate_dtype "
            f"{c.accumulate_dtype}, operand_dtype {c.operand_dtype}, chunk_size={c.chunk_size}, "
            f"dlog_alpha_form={c.dlog_alpha_form}; "
            f"B={d.B} G={d.G} H={d.H} T={d.T} dk={d.dk} dv={d.dv}, scale {sc:.6g}, "
            f"layout {c.layout}):\n"
            + "\n".join(output_table(outputs, bad[0].allowed_ratio, worst, skipped, unjudged)
                        + failing_lines(outputs)) + "\n"
            + "(x_ref: normwise error over that of glaref's same-precision reference kernels "
              "on the same inputs, the calibrated tier, failing above allowed; budget_ulps: max "
              "|x - ref| in units of u x the element's sum of |terms|, the proven tier, failing "
              "above proven_bound, which no correct kernel exceeds)")
        exc.assessments = per      # the figures of every judged output, for reports
        raise exc
    less = [a for a in per.values() if a.outcome == "less_accurate"]
    if less:
        warnings.warn(LessAccurateWarning(
            f"{len(less)} of {len(per)} outputs less accurate than the most accurate designs "
            "(not a failure; strict=True makes it one):\n" + "\n".join(f"  {a.reason}" for a in less)),
            stacklevel=2)
    return per
