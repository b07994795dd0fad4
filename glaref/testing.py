"""``glaref.testing``: check a kernel against the float64 oracle from a test suite.

    import glaref.testing as gt

    def test_my_kernel():                      # a JAX, torch or NumPy callable
        gt.check_kernel(my_kernel, chunk_size=64)

    def test_outputs_computed_anywhere():      # outputs and gradients already computed
        gt.assert_close_to_oracle(actual, inputs)

``check_kernel`` runs a kernel on glaref's problems and judges every row; ``assert_close_to_oracle``
judges outputs the caller computed (torch CPU or CUDA tensors, NumPy, JAX, CuPy) on the inputs
the kernel received. Both are thin faces over the audit engine's judgement
(``glaref._judge.assess_outputs`` -> ``glaref._verdict.assess``, the verdict of ``glaref
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
from typing import Any, Callable, Mapping

import numpy as np

from ._inputs import FORWARD

__all__ = ["DEFAULT_CONFIG", "DEFAULT_SEQS", "assert_close_to_oracle", "check_kernel"]

# Small enough to run in seconds on a CPU, large enough to exercise what kernels get wrong:
# grouped heads (G=2 < H=4), T=1 (a single step), and lengths just below and above a multiple of
# common chunk lengths (16, 32, 64 divide 64), so ragged last chunks and chunk hand-overs occur.
DEFAULT_CONFIG = "1,2,4,16,16"    # B, G, H, dk, dv
DEFAULT_SEQS = (1, 63, 65)


def _figure(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def _describe(rec: dict[str, Any]) -> str:
    """One failing row: where it ran, then each failing output's figures (or why nothing ran)."""
    where = (f"{rec['impl']} {rec['mode']} config {rec['config']} "
             f"(B={rec['batch']} G={rec['groups']} H={rec['heads']} dk={rec['dk']} dv={rec['dv']}) "
             f"T={rec['seq']} regime {rec.get('regime')}"
             + (f" gate {rec['gate']}" if rec.get("gate", "scalar") != "scalar" else ""))
    if "skipped" in rec:
        return f"{where}: kernel not measured: {rec['skipped']}"
    only = f" (forward only: {rec['forward_only']})" if rec.get("forward_only") else ""
    lines = [f"{where}: {rec.get('verdict')}{only}"]
    rel = {**(rec.get("rel_err_out") or {}), **(rec.get("rel_err_grads") or {})}
    first_bad = rec.get("nonfinite_first_index") or {}
    ratios = rec.get("reference_ratio") or {}
    base = rec.get("reference_rel_err") or {}
    tiers = rec.get("failed_tier") or {}
    for reason in rec.get("failures", []):
        name = reason.split(":", 1)[0]
        label = name if name in FORWARD else f"{name} (gradient)"
        figures = (f"{tiers.get(name)} tier: {_figure(ratios.get(name))}x the reference kernels' "
                   f"error (allowed {_figure(rec.get('allowed_ratio'))}x; rel_err "
                   f"{_figure(rel.get(name))} vs {_figure(base.get(name))}), "
                   f"budget_ulps {_figure(rec['budget_ulps'].get(name))} "
                   f"(proven bound {_figure(rec['budget_bound'].get(name))}), "
                   f"max_abs_err {_figure(rec['max_abs_err'].get(name))}")
        if rec["nonfinite"].get(name):
            figures += (f", {rec['nonfinite'][name]} non-finite, first at "
                        f"{tuple(first_bad.get(name, ()))}")
        lines.append(f"  {label}: {figures}")
    return "\n".join(lines)


def _framework(kernel: Any, framework: str | None) -> str:
    """The framework ``kernel`` is checked in: ``framework``, or detected from its code; names
    and "module:function" specs are JAX kernels (the audit's)."""
    from ._audit import AuditUsageError
    from ._frameworks import FRAMEWORKS, detect_framework

    if framework is not None and framework not in FRAMEWORKS:
        raise AuditUsageError(f"framework: got {framework!r}, expected one of {FRAMEWORKS} or None "
                              "(detected from the kernel's code)")
    if isinstance(kernel, str) or not callable(kernel):
        if framework not in (None, "jax"):
            raise AuditUsageError(f"kernel: got {kernel!r} with framework {framework!r}, expected a "
                                  f"{framework} callable (names and specs are JAX kernels)")
        return "jax"
    return detect_framework(kernel) if framework is None else framework


def _run_check(kernel, framework, *, configs, seqs, dtype, regimes, layout, scale, chunk_size,
               accumulate_dtype, modes, seed, backend, precision, compute_dtype, device,
               operand_dtype=None, dlog_alpha_form=None, gate="scalar"):
    """check_kernel's rows: JAX kernels through the audit engine, torch/NumPy ones through
    ``audit_kernel``."""
    from ._audit import AuditUsageError
    from ._audit._engine import audit, audit_kernel

    fw = _framework(kernel, framework)
    if fw == "jax":
        for name, value in (("compute_dtype", compute_dtype), ("device", device),
                            ("operand_dtype", operand_dtype)):
            if value is not None:
                raise AuditUsageError(f"{name}: got {value!r} for a JAX kernel, expected None (the "
                                      "audit derives the arithmetic from dtype, precision and "
                                      "backend, and places the arrays itself)")
        return audit([kernel], configs, seqs, modes, dtype=dtype, precision=precision,
                     backend=backend, layout=layout, scale=scale, repeats=0, seed=seed,
                     regimes=regimes, chunk_size=chunk_size, accumulate_dtype=accumulate_dtype,
                     dlog_alpha_form=dlog_alpha_form, gate=gate)
    if backend is not None:
        raise AuditUsageError(f"backend: got {backend!r} for a {fw} kernel, expected None "
                              "(JAX only; a torch kernel's device is device=)")
    if precision != "default":
        raise AuditUsageError(f"precision: got {precision!r} for a {fw} kernel, expected "
                              "'default' (jax's matmul precision; for TF32 matmuls pass "
                              "compute_dtype='tf32')")
    records = audit_kernel(kernel, framework=fw, detected=framework is None, configs=configs,
                           seqs=seqs, modes=modes, dtype=dtype, compute_dtype=compute_dtype,
                           layout=layout, scale=scale, seed=seed, regimes=regimes,
                           chunk_size=chunk_size, accumulate_dtype=accumulate_dtype, device=device,
                           operand_dtype=operand_dtype, dlog_alpha_form=dlog_alpha_form,
                           gate=gate)
    lost = sorted({r["forward_only"] for r in records if r.get("forward_only")})
    if fw == "torch" and lost and "fwd_bwd" in modes:
        warnings.warn(f"{records[0]['impl']}: gradients not checked, forward only: "
                      f"{'; '.join(lost)}", stacklevel=3)
    return records


def check_kernel(kernel: Callable | str, framework: str | None = None, *, configs=DEFAULT_CONFIG,
                 seqs=(65, 1000), dtype: str = "float32",
                 regimes=("standard", "strong_decay", "near_one"),
                 layout: str = "bhtd", scale: float = 1.0, chunk_size: int | None = None,
                 accumulate_dtype: str | None = None, modes=("fwd_bwd",), seed: int = 0,
                 backend: str | None = None, precision: str = "default",
                 compute_dtype: str | None = None, device: str | None = None,
                 operand_dtype: str | None = None, dlog_alpha_form: str | None = None,
                 gate: str = "scalar") -> list[dict[str, Any]]:
    """Assert that ``kernel`` agrees with the float64 oracle; return the records (one per row,
    as :func:`glaref._audit.audit` gives them).

    kernel: a callable ``(q, k, v, log_alpha, h0) -> o | (o, h_T)`` on arrays of its framework
        in ``layout`` (it receives ``scale`` when its signature takes it, else must apply it
        itself), or, for JAX, a built-in name ("chunked", "scan") or "package.module:function".
    framework: "jax", "torch", "numpy", or None to detect it from the kernel's code
        (``glaref._frameworks.detect_framework``). JAX kernels go through the audit engine
        (``glaref.audit``, jit, gradients by ``jax.vjp``); torch and NumPy kernels are run by
        ``glaref._frameworks.run_kernel`` on the same problems and judged by the same verdict,
        gradients through ``torch.autograd``. A kernel that is not differentiable (any NumPy
        kernel; a torch kernel whose outputs do not require grad) is checked forward only: its
        rows are mode "fwd" with ``forward_only`` giving the reason (a warning says so for torch).
    chunk_size: the kernel's chunk length (1 for a step-by-step scan); None (unknown) judges it
        between the two extremes. accumulate_dtype: what a 16-bit kernel accumulates in (None:
        float32). dlog_alpha_form: how the kernel computes dlog_alpha, "identity" (the reverse
        cumsum of q.dq - k.dk, flash-linear-attention's chunk kernels) or "direct" (a scan,
        autodiff); None (unknown) judges it as the identity, which errs up to ~40x more under
        strong decay, so "direct" gives a sharper dlog_alpha check. gate: "scalar" (log_alpha
        (B, H, T)) or "vector" (GLA's per-key-dimension gates, log_alpha (B, H, T, dk); the
        kernel returns dlog_alpha of that shape). configs, seqs, regimes, dtype, modes, seed:
        the engine's; they default to a few seconds' worth of small cases on a CPU.
    backend, precision: JAX only (the device platform; jax's matmul precision, which makes
        float32 "tf32" on an NVIDIA GPU). device, compute_dtype: torch and NumPy only (where
        torch puts the inputs, "cpu" or "cuda"; the arithmetic the errors are measured in, by
        default ``dtype``: "tf32" for a float32 kernel whose matmuls run as TF32, e.g. a Triton
        kernel's ``tl.dot``). operand_dtype: torch and NumPy only, the format a kernel rounds
        its matrix products' operands to beyond its inputs' dtype (e.g. "bfloat16" for a
        bfloat16 Triton kernel that casts its float32 states and scores to bfloat16 before each
        ``tl.dot``, as flash-linear-attention's do); the reference kernels then round theirs
        alike. None: operands kept in the compute dtype.

    Raises AssertionError naming every failing row and output with its figures. A kernel that
    raises (SystemExit included), or returns the wrong structure or a non-float dtype, fails too
    (the message gives the reason): the caller asked for this kernel to be checked. Bad arguments
    raise ``glaref.AuditUsageError`` (a ValueError) with a one-line message; missing jax
    for a JAX kernel, or rows glaref declines for lack of memory, ``AuditEnvironmentError``.
    """
    __tracebackhide__ = True
    from ._audit import AuditEnvironmentError, AuditUsageError

    try:
        records = _run_check(kernel, framework, configs=configs, seqs=seqs, dtype=dtype,
                             regimes=regimes, layout=layout, scale=scale, chunk_size=chunk_size,
                             accumulate_dtype=accumulate_dtype, modes=modes, seed=seed,
                             backend=backend, precision=precision, compute_dtype=compute_dtype,
                             device=device, operand_dtype=operand_dtype,
                             dlog_alpha_form=dlog_alpha_form, gate=gate)
    except (AuditUsageError, AuditEnvironmentError) as exc:
        # raised afresh from here, so that a test report shows this one line, not the engine
        raise type(exc)(str(exc)) from None
    bad = [r for r in records if r.get("ok") is False]
    declined = [r for r in records if r.get("ok") is None]
    if declined and not bad:
        raise AuditEnvironmentError(
            f"{len(declined)} of {len(records)} rows not checked: "
            + "; ".join(f"{r['mode']} config {r['config']} T={r['seq']}: {r['skipped']}"
                        for r in declined))
    if bad:
        rows = "\n".join(_describe(r) for r in bad)
        raise AssertionError(
            f"kernel disagrees with the glaref oracle on {len(bad)} of {len(records)} rows "
            f"(dtype {dtype}, compute dtype {bad[0].get('compute_dtype')}, "
            f"chunk_size={bad[0].get('chunk_size')}; calibrated tier: normwise error against "
            f"glaref's same-precision reference kernels on the same inputs; proven tier: "
            f"budget_ulps, error in units of u x the element's sum of |terms|, against the "
            f"worst case of any correct kernel):\n{rows}")
    return records


# ---------------------------------------------------------------- outputs computed anywhere

_INPUT_KEYS = ("q", "k", "v", "log_alpha", "h0", "do", "dh_T", "scale", "layout", "dtype")


def _dtype_arg(x: Any, name: str) -> str:
    """A dtype given by name or as a numpy/torch/JAX dtype, as its name."""
    from ._errors import DTypeError
    from ._verdict import COMPUTE_DTYPES

    text = x if isinstance(x, str) else getattr(x, "name", None) or str(x).rsplit(".", 1)[-1]
    if not isinstance(text, str) or text not in COMPUTE_DTYPES:
        raise DTypeError(f"{name}: got {x!r}, expected one of {COMPUTE_DTYPES}")
    return text


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


def _received(args: dict[str, Any]):
    """(Problem, dtype, layout, scale): the canonical float64 problem the kernel received,
    checked: shapes (``glaref._inputs.canonicalize``), and q, k, v exactly values of the dtype
    (nothing is rounded here: the oracle must see what the kernel saw)."""
    from ._errors import DTypeError
    from ._frameworks import dtype_name, to_host_float64
    from ._inputs import ARRAYS, canonicalize, check_layout, check_scale
    from ._problems import DTYPES, round_to_dtype

    layout = check_layout(args.get("layout") or "bhtd")
    dtype = args.get("dtype")
    dtype = dtype_name(args["q"]) if dtype is None else _dtype_arg(dtype, "dtype")
    if dtype not in DTYPES:
        raise DTypeError(f"dtype: got {dtype!r}, expected the dtype the kernel received, one of "
                         f"{DTYPES}")
    scale = 1.0 if args.get("scale") is None else check_scale(args["scale"])
    arrays = {n: None if args.get(n) is None else to_host_float64(args[n], n) for n in ARRAYS}
    p = canonicalize(*(arrays[n] for n in ARRAYS), layout=layout)
    for n in ("q", "k", "v"):
        x = getattr(p, n)
        r = round_to_dtype(x, dtype)
        if not np.array_equal(r, x):
            i = tuple(int(j) for j in np.argwhere(r != x)[0])
            raise DTypeError(
                f"{n}: got {float(x[i])!r} at {i} (canonical \"bhtd\" index), which is not a {dtype} "
                f"number, expected exactly the {dtype} values the kernel received (glaref rounds "
                f"nothing: pass the tensors the kernel was given, or the dtype it received)")
    return p, dtype, layout, scale


def _judged_values(actual: Mapping[str, Any], p, layout: str):
    """(values, dtypes, skipped, unjudged): the outputs the caller computed as canonical float64
    arrays, the dtype each was returned in, the names not computed, extra results not judged."""
    from ._errors import ShapeError
    from ._frameworks import dtype_name, to_host_float64
    from ._inputs import _KIND, OUTPUTS, to_canonical
    from .conventions import LOG_ALPHA_BT_SUM

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
            label = name if name in FORWARD else f"d{name}"
            raise ShapeError(f"actual[{name!r}]: got shape {a.shape}, expected {spelled} (the "
                             f"shape of {label} for these inputs, layout {layout})")
        values[name] = to_canonical(a, _KIND[name], layout)
        dtypes[name] = _dtype_arg(given_dtypes[name], f"actual['dtypes'][{name!r}]") \
            if name in given_dtypes else dtype_name(x)
    if not values:
        raise ValueError(f"actual: got no output (every value None or missing), expected at least "
                         f"one of {OUTPUTS}")
    unjudged = [LOG_ALPHA_BT_SUM] if actual.get(LOG_ALPHA_BT_SUM) is not None else []
    return values, dtypes, skipped, unjudged


def _worst_at(x: np.ndarray, ref: np.ndarray, kind: str, layout: str) -> tuple[int, ...] | None:
    """Index of the largest |x - ref| in the caller's layout (None for an empty array)."""
    from ._inputs import from_canonical

    if x.size == 0:
        return None
    with np.errstate(invalid="ignore"):
        diff = np.abs(from_canonical(x, kind, layout) - from_canonical(ref, kind, layout))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))


def _table(per, worst: dict, skipped: list[str], unjudged: list[str]) -> str:
    """The per-output table of :func:`assert_close_to_oracle`'s message."""
    head = ("output", "verdict", "x_ref", "allowed", "rel_err", "ref_rel_err", "budget_ulps",
            "proven_bound", "max_abs_err", "at", "non-finite")
    rows = [head]
    for name, a in per.items():
        label = name if name in FORWARD else f"d{name}"
        nonfinite = "-" if not a.nonfinite else f"{a.nonfinite}, first at {tuple(a.first_nonfinite)}"
        at = worst.get(name)
        rows.append((label, "ok" if a.ok else f"FAIL {a.failed_tier}", _figure(a.ratio),
                     _figure(a.allowed_ratio), _figure(a.rel_err), _figure(a.baseline_rel_err),
                     _figure(a.budget_ulps), _figure(a.bound), _figure(a.max_abs_err),
                     "-" if at is None else str(at), nonfinite))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if skipped:
        lines.append(f"  not computed (skipped): {', '.join(skipped)}")
    if unjudged:
        lines.append(f"  not judged: {', '.join(unjudged)} (dlog_alpha summed over batch and time, "
                     "e.g. FLA's dg_gamma: the verdict judges dlog_alpha itself)")
    return "\n".join(lines)


def assert_close_to_oracle(actual: Mapping[str, Any], inputs: Mapping[str, Any] | None = None, *,
                           q=None, k=None, v=None, log_alpha=None, h0=None, do=None, dh_T=None,
                           scale: float | None = None, layout: str | None = None,
                           dtype: Any = None, compute_dtype: str | None = None,
                           accumulate_dtype: str | None = None, chunk_size: int | None = None,
                           oracle_impl: str | None = None,
                           operand_dtype: str | None = None,
                           dlog_alpha_form: str | None = None) -> dict[str, Any]:
    """Assert that a kernel's outputs and gradients, computed anywhere, agree with the float64
    oracle on the inputs the kernel received; return the figures (one
    ``glaref._verdict.Assessment`` per judged output: rel_err, ratio, budget_ulps, bound, ...).

        got = fla.simple_gla_outputs(o, ht, q.grad, k.grad, v.grad, g.grad, h0.grad)
        gt.assert_close_to_oracle(got, fla.simple_gla_inputs(q, k, v, g, initial_state=h0,
                                                             do=do, dht=dht))

    actual: glaref's names (o, h_T, q, k, v, log_alpha, h0: the gradients under the names of
        their inputs) to arrays of any framework and device (torch CPU or CUDA tensors, NumPy,
        JAX, CuPy, DLPack); None or missing means not computed: skipped, not failed. Optional
        ``dtypes`` ({name: dtype name}, what each result was returned in; by default the array's
        own dtype) and ``log_alpha_bt_sum`` (FLA's dg_gamma: listed, not judged), as
        ``glaref.conventions.fla.simple_gla_outputs`` gives them.
    inputs: a mapping with keys q, k, v, log_alpha, h0, do, dh_T, scale, layout, dtype (what
        ``fla.simple_gla_inputs`` returns), or None with the same as keywords. They must be
        exactly what the kernel received (nothing is rounded: q, k, v not representable in
        ``dtype`` are refused); do and dh_T are the cotangents of the backward pass (dh_T None:
        h_T had none); h0 None means zeros; scale defaults to 1.0 (glaref's); layout ("bhtd" or
        "bthd") is that of the inputs and of ``actual``; dtype, the dtype the kernel received,
        defaults to q's.
    compute_dtype: the arithmetic the errors are measured in (default ``dtype``): "tf32" for a
        float32 kernel whose matmuls run as TF32 (a Triton ``tl.dot``, torch with allow_tf32).
    accumulate_dtype: what a 16-bit kernel accumulates and carries its states in (None: float32,
        what production kernels do). chunk_size: the kernel's chunk length (1: step by step;
        None: unknown). operand_dtype: the format the kernel rounds its matrix products'
        operands to (None: none beyond its inputs' dtype), as :func:`check_kernel`'s.
        dlog_alpha_form: "identity", "direct" or None (unknown), as :func:`check_kernel`'s
        (flash-linear-attention's chunk kernels use the identity, its fused_recurrent ones the
        direct form). As :func:`check_kernel` and ``glaref audit``.

    The verdict is the audit's (``glaref._judge``): each output passes when finite, within
    ``calibrated_ratio`` times the error of glaref's same-precision reference kernels on the same
    inputs (NumPy/Numba: no JAX at any dtype) and within the proven worst-case bound. Otherwise
    AssertionError with a table of every judged output (tier, ratio to the reference kernels,
    rel_err of both, budget_ulps and the proven bound, max_abs_err and its index, first
    non-finite index; indices in ``layout``), whose attribute ``assessments`` holds the figures
    the function would have returned (for reports that record failing cases too). Bad arguments
    raise ValueError or TypeError subclasses naming the argument.

    Vector gates (GLA: log_alpha (B, H, T, dk), ``fla.gla_inputs``) are judged like scalar ones;
    dlog_alpha then has log_alpha's shape.
    """
    __tracebackhide__ = True
    from . import _judge
    from ._audit._engine import _default_oracle
    from ._inputs import _KIND, GRADS

    args = _gather_inputs(inputs, {"q": q, "k": k, "v": v, "log_alpha": log_alpha, "h0": h0,
                                   "do": do, "dh_T": dh_T, "scale": scale, "layout": layout,
                                   "dtype": dtype})
    p, dt, lay, sc = _received(args)
    values, dtypes, skipped, unjudged = _judged_values(actual, p, lay)
    grads = [n for n in values if n in GRADS]
    if grads and p.do is None:
        raise ValueError(f"inputs: got no do, expected the cotangent of o that produced the "
                         f"gradients {grads} (and dh_T, that of h_T, if there was one)")
    cdtype = dt if compute_dtype is None else _dtype_arg(compute_dtype, "compute_dtype")
    if accumulate_dtype is not None:
        from .tolerances import UNIT_ROUNDOFF
        acc_name = _dtype_arg(accumulate_dtype, "accumulate_dtype")
        if UNIT_ROUNDOFF[acc_name] > UNIT_ROUNDOFF[cdtype]:
            raise ValueError(f"accumulate_dtype: got {accumulate_dtype!r}, expected a format at "
                             f"least as precise as the compute dtype {cdtype!r}")
        accumulate_dtype = acc_name
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                   or chunk_size < 1):
        raise ValueError(f"chunk_size: got {chunk_size!r}, expected a positive integer or None")
    if operand_dtype is not None:
        operand_dtype = _dtype_arg(operand_dtype, "operand_dtype")
    from ._verdict import check_dlog_alpha_form
    check_dlog_alpha_form(dlog_alpha_form)
    oracle = oracle_impl or _default_oracle()
    if oracle not in ("numba", "numpy"):
        raise ValueError(f"oracle_impl: got {oracle!r}, expected 'numba', 'numpy' or None")
    acc = _judge.accumulate_for(accumulate_dtype, cdtype)
    truth = _judge.Truth(p, sc, oracle)
    final = p.dh_T is not None
    per = _judge.assess_outputs(truth, values, dtypes, final=final, grads=bool(grads),
                                compute_dtype=cdtype, accumulate_dtype=acc, chunk_size=chunk_size,
                                operand_dtype=operand_dtype, dlog_alpha_form=dlog_alpha_form)
    _judge.locate_nonfinite(per, values, lay)
    bad = [a for a in per.values() if not a.ok]
    if bad:
        worst = {n: _worst_at(values[n], truth.reference(n, final), _KIND[n], lay) for n in per}
        d = p.dims
        exc = AssertionError(
            f"kernel outputs disagree with the glaref oracle on {len(bad)} of {len(per)} judged "
            f"outputs (dtype {dt}, compute dtype {cdtype}, accumulate_dtype {acc}, operand_dtype "
            f"{operand_dtype}, chunk_size={chunk_size}, dlog_alpha_form={dlog_alpha_form}; "
            f"B={d.B} G={d.G} H={d.H} T={d.T} dk={d.dk} dv={d.dv}, scale {sc:.6g}, "
            f"layout {lay}):\n{_table(per, worst, skipped, unjudged)}\n"
            + "\n".join(f"  {a.reason}" for a in bad)
            + "\n(x_ref: normwise error over that of glaref's same-precision reference kernels "
              "on the same inputs, the calibrated tier, failing above allowed; budget_ulps: max "
              "|x - ref| in units of u x the element's sum of |terms|, the proven tier, failing "
              "above proven_bound, which no correct kernel exceeds)")
        exc.assessments = per      # the figures of every judged output, for reports
        raise exc
    return per
