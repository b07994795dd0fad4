"""The audit engine: regime -> inputs -> oracle + kernel -> metrics + verdicts -> records.

For every regime, config, sequence length (and the sizes the regime derives from them: the plan
of ``glaref._problems``) the float64 inputs are generated once, rounded once to the audited dtype
(so the oracle sees exactly what the kernel sees and only the kernel's arithmetic is measured),
and the oracle runs once:
forward, vjp and the error-budget scales, each timed on its own and never counted as the kernel's.
Then for every mode and kernel one row is measured (``_run_row``) and appended to the records, to
the JSON file (rewritten atomically after every row) and to the caller's callback.

A kernel that raises (even SystemExit), returns the wrong structure or a non-float dtype, has a
non-finite output, or an output that fails either tier of the verdict
(``glaref._judge.assess_outputs`` -> ``glaref._verdict.assess``: more than ``calibrated_ratio``
times the error of the same-precision reference kernels on the same inputs, or beyond the proven
worst-case bound), is recorded as failed (``ok`` false, ``failures`` naming each failing output
with its tier and figure, or why nothing could be measured, also in ``skipped``: the seed
report's key for a row without figures) and the audit goes on. Only rows glaref itself declines
are skipped (``ok`` null, the reason in ``skipped``): the kernel's XLA buffers or the oracle's
own float64 arrays would not fit in the memory available (``_Run.check_memory``,
``oracle_bytes``).

:func:`audit` runs JAX kernels (jit, ``jax.vjp``, timing, XLA memory). :func:`audit_kernel` runs
a torch or NumPy kernel through ``glaref._frameworks.run_kernel`` on the same problems, judged by
the same loop into the same records (``_judged``), accuracy only; ``glaref.testing.check_kernel``
picks one by the kernel's framework.
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from dataclasses import replace
from typing import Any, Callable, Iterable

import numpy as np

from .. import _judge, _metrics, _problems, _verdict
from .._errors import AuditUsageError, GlarefError, NonFiniteError
from .._inputs import (
    _KIND,
    ARRAYS,
    DTYPES,
    FORWARD,
    GRADS,
    Dims,
    Problem,
    check_layout,
    check_scale,
    from_canonical,
    kernel_returns,
    to_canonical,
)
from .._inputs import output_problem as _output_problem
from ..tolerances import UNIT_ROUNDOFF
from . import _device, _report, _timing
from ._presets import BUILTIN_IMPLS, MODES, PRESETS, check_config, config_name, parse_config
from ._subjects import Subject, resolve


def _default_oracle() -> str:
    try:
        import numba  # noqa: F401

        from .. import _numba  # noqa: F401
    except ImportError:
        return "numpy"
    return "numba"


# ---------------------------------------------------------------- argument checking (usage errors)

def _split(x) -> list:
    if x is None:
        return []
    if isinstance(x, str):
        return [p.strip() for p in x.split(",") if p.strip()]
    if callable(x):
        return [x]
    try:
        return list(x)
    except TypeError:       # a single non-iterable value: checked (and refused) by the caller
        return [x]


def _configs(configs, preset_configs) -> dict[str, tuple[int, ...]]:
    if configs is None:
        return dict(preset_configs)
    if isinstance(configs, str):
        out = parse_config(configs)
    elif isinstance(configs, dict):
        out = {str(k): check_config(str(k), v) for k, v in configs.items()}
    else:
        try:
            items = list(configs)
        except TypeError:
            raise AuditUsageError(f"config: got {configs!r}, expected config names, 'B,G,H,dk,dv' "
                                  "strings or {name: (B, G, H, dk, dv)}") from None
        out = {}
        for c in items:
            if isinstance(c, str):
                out.update(parse_config(c))
            else:
                c = check_config(repr(c), c)
                out[config_name(c)] = c
    if not out:
        # zero rows would pass vacuously
        raise AuditUsageError(f"config: got {configs!r}, expected at least one config")
    return out


def _integer(name: str, x, low: int) -> int:
    """An integer argument (int, numpy int or a string of digits; never a bool or a float, which
    would be truncated) that is at least ``low``."""
    if isinstance(x, str):
        try:
            t = int(x.strip())
        except ValueError:
            t = None
    elif isinstance(x, (bool, np.bool_)):
        t = None
    else:
        try:
            t = operator.index(x)
        except TypeError:
            t = None
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    if t is None:
        raise AuditUsageError(f"{name}: got {x!r} ({type(x).__name__}), expected {what}")
    if t < low:
        raise AuditUsageError(f"{name}: got {t}, expected {what}")
    return t


def _seqs(seqs, preset_seqs) -> list[int]:
    if seqs is None:
        return list(preset_seqs)
    if isinstance(seqs, str):
        vals = _split(seqs)
    else:
        try:
            vals = list(seqs)
        except TypeError:
            vals = [seqs]
    out = [_integer("seq", s, 1) for s in vals]
    if not out:
        raise AuditUsageError(f"seq: got {seqs!r}, expected at least one sequence length")
    return out


def _choices(name: str, values, allowed: Iterable[str]) -> list[str]:
    allowed = tuple(allowed)
    vals = _split(values)
    for v in vals:
        if v not in allowed:
            raise AuditUsageError(f"{name}: got {v!r}, expected one of {allowed}")
    if not vals:
        raise AuditUsageError(f"{name}: got nothing, expected one of {allowed}")
    return vals


def _checked(configs, seqs, modes, *, pre, dtype: str, layout: str, scale, seed, chunk_size,
             accumulate_dtype, regimes, oracle_impl):
    """The arguments every audit shares, checked (AuditUsageError naming the bad one, what it got
    and what was expected): (configs, seqs, modes, scale, seed, chunk_size, regimes, oracle),
    defaults from the preset ``pre``."""
    from .. import regimes as _regimes

    cfgs = _configs(configs, pre.configs)
    seq_list = _seqs(seqs, pre.seqs)
    mode_list = _choices("mode", modes if modes is not None else pre.modes, MODES)
    _choices("dtype", dtype, DTYPES)
    try:
        check_layout(layout)
        scale = check_scale(scale)
    except GlarefError as exc:
        raise AuditUsageError(str(exc)) from None
    seed = _integer("seed", seed, 0)
    if chunk_size is not None:
        chunk_size = _integer("chunk_size", chunk_size, 1)
    if accumulate_dtype is not None:
        _choices("accumulate_dtype", accumulate_dtype, DTYPES)
    regime_list = _choices("regime", regimes, _regimes.REGIMES)
    oracle = oracle_impl or _default_oracle()
    _choices("oracle_impl", oracle, ("numba", "numpy"))
    return cfgs, seq_list, mode_list, scale, seed, chunk_size, regime_list, oracle


def _check_accumulate(accumulate_dtype: str | None, cdtype: str) -> None:
    if accumulate_dtype is not None and UNIT_ROUNDOFF[accumulate_dtype] > UNIT_ROUNDOFF[cdtype]:
        raise AuditUsageError(f"accumulate_dtype: got {accumulate_dtype!r}, expected a format at "
                              f"least as precise as the compute dtype {cdtype!r}")


# ---------------------------------------------------------------- gate kind and packed sequences

RANDOM_PACKING = "random:"


def _gate(gate) -> str:
    from ..regimes import GATES
    if gate not in GATES:
        raise AuditUsageError(f"gate: got {gate!r}, expected one of {GATES}")
    return gate


def _packing(cu_seqlens) -> np.ndarray | int | None:
    """None (one sequence per batch row), explicit offsets (an int64 array, validated) or the
    number N of random-length sequences ("random:N")."""
    if cu_seqlens is None:
        return None
    if isinstance(cu_seqlens, str):
        text = cu_seqlens.strip()
        if text.startswith(RANDOM_PACKING):
            n = text[len(RANDOM_PACKING):]
            if not n.isdigit() or int(n) < 1:
                raise AuditUsageError(f"cu_seqlens: got {cu_seqlens!r}, expected 'random:N' with "
                                      "N >= 1 sequences, or offsets such as '0,5,5,40'")
            return int(n)
        parts = [x.strip() for x in text.split(",") if x.strip()]
        try:
            cu_seqlens = [int(x) for x in parts]
        except ValueError:
            raise AuditUsageError(f"cu_seqlens: got {text!r}, expected integer offsets such as "
                                  "'0,5,5,40' or 'random:N'") from None
    from .._inputs import check_cu_seqlens
    a = np.asarray(cu_seqlens)
    if a.dtype.kind not in "iu" or a.ndim != 1 or a.size < 2 or a[-1] < 1:
        raise AuditUsageError(f"cu_seqlens: got {cu_seqlens!r}, expected N + 1 >= 2 integer "
                              "offsets 0 = c_0 <= ... <= c_N = T with T >= 1 (e.g. '0,5,5,40'), "
                              "or 'random:N'")
    try:
        return check_cu_seqlens(a, 1, int(a[-1]))
    except ValueError as exc:          # not starting at 0, decreasing: names the first bad position
        raise AuditUsageError(str(exc)) from None


def _gate_and_packing(gate, cu_seqlens, seqs, seq_list: list[int], regime_list: list[str]):
    """(gate, packing, seq_list) checked: explicit offsets fix T, so ``seqs`` may only repeat it
    (None: it becomes [T]) and no regime may set its own T."""
    from .. import regimes as _regimes

    gate = _gate(gate)
    packing = _packing(cu_seqlens)
    if isinstance(packing, np.ndarray):
        T_cu = int(packing[-1])
        if seqs is None:
            seq_list = [T_cu]
        elif set(seq_list) != {T_cu}:
            raise AuditUsageError(f"seq: got {seq_list}, expected only {T_cu}, the T that "
                                  f"cu_seqlens {packing.tolist()} fixes (or cu_seqlens='random:N')")
        for regime in regime_list:
            if any(d.T != T_cu for d in _regimes.REGIMES[regime].cases(Dims(1, 1, 1, T_cu, 1, 1))):
                raise AuditUsageError(f"regime: got {regime!r}, which sets its own T; explicit "
                                      f"cu_seqlens fix T = {T_cu} (use cu_seqlens='random:N')")
    return gate, packing, seq_list


def _offsets(packing, T: int, seed: int) -> np.ndarray | None:
    """The offsets of one problem of length T: the explicit ones, or N random lengths drawn by
    ``regimes.random_cu_seqlens(T, N, seed)`` (empty sequences included)."""
    from ..regimes import random_cu_seqlens
    if packing is None or isinstance(packing, np.ndarray):
        return packing
    return random_cu_seqlens(T, packing, seed)


def _warm_oracle(impl: str, gate: str = "scalar", packed: bool = False) -> None:
    """Compile the Numba oracle (if cached, load it) outside every timing, for the gate kind
    and packing the audit runs."""
    from .._oracle import backend
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


# ---------------------------------------------------------------- one row

def _reason(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit (sys.exit({exc.code!r}))"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _to64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _dtype_name(dt) -> str:
    """'float32', 'bfloat16', ... for a numpy (or ml_dtypes) dtype."""
    return np.dtype(dt).name


def _verdict_ratio() -> float:
    from ..tolerances import tol
    return tol("calibrated_ratio")


def _worst(values: Iterable[float]) -> float:
    vals = list(values)
    if any(v is None or math.isnan(v) for v in vals):
        return math.nan
    return max(vals) if vals else math.nan




def _accumulate(subject: Subject, cdtype: str) -> str | None:
    """The accumulate_dtype a subject is judged with at compute dtype ``cdtype``
    (``glaref._judge.accumulate_for``)."""
    return _judge.accumulate_for(subject.accumulate_dtype, cdtype)


def _judged(rec: dict[str, Any], per: dict[str, Any], canonical: dict[str, np.ndarray],
            truth: _judge.Truth, *, layout: str, cdtype: str, mode: str, final: bool,
            params: dict[str, Any]) -> dict[str, Any]:
    """Complete a measured row's record from the verdicts ``per`` of ``_judge.assess_outputs``
    (its figures, ``params``, ok, failed_tier, failures, verdict, the oracle's time): the one
    record format of every kernel the engine runs, JAX, torch or NumPy. ``canonical``: the
    kernel's values (float64, "bhtd"), from which the first non-finite index is reported in the
    caller's ``layout`` and dlog_alpha's direct-form budget_ulps computed."""
    _judge.locate_nonfinite(per, canonical, layout)   # the first bad index in the caller's layout
    direct: dict[str, Any] = {}
    if "log_alpha" in per:   # the direct form's budget_ulps beside the identity's
        direct["log_alpha"] = _metrics.budget_ulps(
            "log_alpha", canonical["log_alpha"], truth.reference("log_alpha", final),
            truth.scales(final, True)["log_alpha"], cdtype, truth.budget_view()[0])[0]
    failures = [a.reason for a in per.values() if not a.ok]

    outs_names = [n for n in FORWARD if n in per]
    rec["rel_err"] = _worst(a.rel_err for a in per.values())
    if mode == "fwd_bwd":
        rec["rel_err_grads"] = {n: per[n].rel_err for n in GRADS}
    rec["rel_err_out"] = {n: per[n].rel_err for n in outs_names}
    rec["max_abs_err"] = {n: a.max_abs_err for n, a in per.items()}
    rec["reference_rel_err"] = {n: a.baseline_rel_err for n, a in per.items()}
    rec["reference_ratio"] = {n: a.ratio for n, a in per.items()}
    rec["allowed_ratio"] = _verdict_ratio()
    rec["budget_ulps"] = {n: a.budget_ulps for n, a in per.items()}
    rec["budget_bound"] = {n: a.bound for n, a in per.items()}
    rec["budget_ulps_direct"] = direct
    rec["nonfinite"] = {n: a.nonfinite for n, a in per.items()}
    rec["nonfinite_first_index"] = {n: a.first_nonfinite for n, a in per.items() if a.nonfinite}
    rec.update(params)
    rec["ok"] = not failures
    rec["failed_tier"] = {n: a.failed_tier for n, a in per.items() if not a.ok}
    rec["failures"] = failures
    rec["notes"] = [note for a in per.values() for note in a.notes]
    rec["verdict"] = _report.verdict(rec)
    # the oracle's own time on these inputs (never part of the kernel's figures)
    wanted = ["forward", "scales", "reference_scan", "reference_chunked"] if mode == "fwd" else \
        ["forward", "vjp_dh_T" if final else "vjp", "scales_vjp", "reference_scan_vjp",
         "reference_chunked_vjp"]
    rec["oracle_ms"] = {k: truth.ms[k] for k in wanted if k in truth.ms}
    return rec


class _Run:
    """Everything fixed for one audit call, and the per-row measurement."""

    def __init__(self, *, device, dtype: str, precision: str, layout: str, scale: float,
                 repeats: int, seed: int, memory_guard: bool):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        self.device = device
        self.dtype, self.np_dtype = dtype, jnp.dtype(dtype)
        self.precision, self.layout, self.scale = precision, layout, scale
        self.repeats, self.seed = repeats, seed
        self.memory_guard = memory_guard
        self.cdtype = _verdict.compute_dtype(dtype, precision, device.platform)

    def precision_ctx(self):
        if self.precision == "default":
            return contextlib.nullcontext()
        return self.jax.default_matmul_precision(self.precision)

    def device_arrays(self, p: Problem) -> dict[str, Any]:
        """The problem in the kernel's layout and dtype, on the device (cotangents included)."""
        out = {}
        for name in ARRAYS:
            x = from_canonical(getattr(p, name), _KIND[name], self.layout)
            out[name] = self.jax.device_put(np.asarray(x, dtype=self.np_dtype), self.device)
        return out

    def base(self, subject: Subject, mode: str, cname: str, dims: Dims) -> dict[str, Any]:
        return {"impl": subject.name, "mode": mode, "config": cname, "batch": dims.B,
                "groups": dims.G, "heads": dims.H, "seq": dims.T, "dk": dims.dk, "dv": dims.dv}

    def params(self, subject: Subject, regime: str, final: bool | None,
               truth: _judge.Truth | None = None) -> dict[str, Any]:
        p = truth.p if truth is not None else None
        cu = None if p is None or p.cu_seqlens is None else [int(c) for c in p.cu_seqlens]
        return {"dtype": self.dtype, "compute_dtype": self.cdtype, "precision": self.precision,
                "layout": self.layout, "regime": regime, "seed": self.seed, "scale": self.scale,
                "final_state": final, "chunk_size": subject.chunk_size,
                "accumulate_dtype": _accumulate(subject, self.cdtype),
                "dlog_alpha_form": subject.dlog_alpha_form,
                "gate": "vector" if p is not None and p.vector_gate else "scalar",
                "cu_seqlens": cu}

    def row(self, subject: Subject, mode: str, cname: str, dims: Dims, regime: str,
            truth: _judge.Truth, arr: dict[str, Any]) -> dict[str, Any]:
        """One row: the kernel's structure (jax.eval_shape), compiled program, XLA memory, timing
        and residuals, then its outputs judged against ``truth``. A kernel that raises or returns
        the wrong structure or dtype is a failed row; one over the memory guard is skipped."""
        rec = self.base(subject, mode, cname, dims)
        inputs = tuple(arr[n] for n in GRADS)
        # packed sequences: the kernel receives the offsets (concrete int64) as cu_seqlens=
        cu = truth.p.cu_seqlens
        fn = subject.fn if cu is None else functools.partial(subject.fn, cu_seqlens=cu)
        final: bool | None = None
        measured: dict[str, Any] = {}

        def unmeasured(why: str, ok: bool | None = False) -> dict[str, Any]:
            """The row without figures: why, what was measured so far, failed (or skipped)."""
            rec.update({"skipped": why, **measured, **self.params(subject, regime, final, truth),
                        "ok": ok})
            if ok is False:
                rec["failures"] = [why]
            return rec

        try:
            with self.precision_ctx():
                shape = self.jax.eval_shape(fn, *inputs)
            _, final, problem = kernel_returns(shape, dims, self.layout, truth.p.n_states)
            if problem is not None:
                return unmeasured(problem)
            f, args = _program(fn, mode, final, shape if final else (shape,), inputs, arr)
            with self.precision_ctx():
                compiled, measured["compile_s"] = _timing.compile_fn(f, args)
            mem = _timing.memory(compiled)
            measured.update(mem)
            guard = self.check_memory(mem)
            if guard:
                return unmeasured(guard, ok=None)
            first, timing = _timing.time_calls(compiled, args, self.repeats)
            del compiled
            measured.update(timing)
            if mode == "fwd_bwd":
                with self.precision_ctx():
                    measured["residual_mb"] = _timing.residual_bytes(fn, inputs) / _timing.MIB
        except (Exception, SystemExit) as exc:  # the kernel raised: a failed row; the audit goes on
            return unmeasured("kernel raised " + _reason(exc))

        # ---- errors against the oracle
        arrays = {n: np.asarray(x) for n, x in _returned(first, mode, final).items()}
        for name, x in arrays.items():
            bad_dtype = _output_problem(name, x, x.shape, None)
            if bad_dtype is not None:       # e.g. a gradient from a custom_vjp in an integer dtype
                return unmeasured(bad_dtype)
        canonical = {n: to_canonical(_to64(x), _KIND[n], self.layout) for n, x in arrays.items()}
        per = _judge.assess_outputs(
            truth, canonical, {n: _dtype_name(x.dtype) for n, x in arrays.items()}, final=bool(final),
            grads=mode == "fwd_bwd", compute_dtype=self.cdtype,
            accumulate_dtype=_accumulate(subject, self.cdtype), chunk_size=subject.chunk_size,
            dlog_alpha_form=subject.dlog_alpha_form)
        rec.update({k: measured.get(k) for k in _timing.FIELDS})
        if mode == "fwd_bwd":
            rec["residual_mb"] = measured["residual_mb"]
        return _judged(rec, per, canonical, truth, layout=self.layout, cdtype=self.cdtype,
                       mode=mode, final=bool(final),
                       params=self.params(subject, regime, final, truth))

    def declined(self, subject: Subject, mode: str, cname: str, dims: Dims, regime: str,
                 reason: str) -> dict[str, Any]:
        """A row glaref does not run (the oracle's memory guard): skipped, with the reason."""
        return {**self.base(subject, mode, cname, dims), "skipped": reason,
                **self.params(subject, regime, None), "ok": None}

    def check_memory(self, mem: dict[str, float | None]) -> str | None:
        if not self.memory_guard:
            return None
        parts = [mem[k] for k in ("xla_temp_mb", "xla_arg_mb", "xla_out_mb")]
        if any(p is None for p in parts):
            return None
        need = sum(parts) * _timing.MIB
        avail = _device.available_bytes(self.device)
        if avail is not None and need > avail:
            return (f"needs {need / _timing.MIB:.0f} MB of XLA buffers (temp + arguments + outputs), "
                    f"{avail / _timing.MIB:.0f} MB available on {self.device.platform}")
        return None


def oracle_bytes(dims: Dims, modes: Iterable[str]) -> int:
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


def _oracle_memory(dims: Dims, modes: Iterable[str], host: int | None) -> str | None:
    """Why glaref declines a problem: its oracle side (``oracle_bytes``) would not fit in the
    ``host`` bytes available (None: unknown, or the guard is off), else None."""
    need = oracle_bytes(dims, modes)
    if host is None or need <= host:
        return None
    return (f"the oracle needs about {need / 2**30:.3g} GiB of host memory for this problem "
            f"(float64 inputs, results and error scales), {host / 2**30:.3g} GiB available")


def _fwd(fn: Callable) -> Callable:
    def f(q, k, v, log_alpha, h0):
        return fn(q, k, v, log_alpha, h0)

    return f


def _fwd_bwd(fn: Callable, final: bool) -> Callable:
    """(inputs..., do[, dh_T]) -> (outputs, grads) through jax.vjp, so a custom_vjp is what runs."""
    import jax

    def f(q, k, v, log_alpha, h0, do, *dh_T):
        out, pullback = jax.vjp(fn, q, k, v, log_alpha, h0)
        # the cotangent takes the structure of the output ((o, h_T) as a tuple, list, ...)
        ct = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out), [do, dh_T[0]]) \
            if final else do
        grads = pullback(ct)
        return out, grads

    return f


def _program(fn: Callable, mode: str, final: bool, outs: tuple, inputs: tuple,
             arr: dict[str, Any]) -> tuple[Callable, tuple]:
    """(program, arguments) that one row compiles and times: the kernel alone (fwd), or its
    forward and jax.vjp backward (fwd_bwd) with the cotangents in the dtype of the outputs they
    pair with (``outs``: jax.eval_shape's o[, h_T]; exact when that dtype is at least as wide as
    the audited one, as it is for every sane kernel)."""
    if mode == "fwd":
        # a fresh function per row, so compile_s is never a hit in jit's cache
        return _fwd(fn), inputs
    cts = [arr["do"].astype(outs[0].dtype)]
    if final:
        cts.append(arr["dh_T"].astype(outs[1].dtype))
    return _fwd_bwd(fn, final), inputs + tuple(cts)


def _returned(first, mode: str, final: bool) -> dict[str, Any]:
    """The outputs of a program's first call by name: o[, h_T] and, for fwd_bwd, the gradients."""
    out, grads = (first, ()) if mode == "fwd" else first
    raw = {"o": out[0] if final else out}
    if final:
        raw["h_T"] = out[1]
    raw.update(zip(GRADS, grads))
    return raw


# ---------------------------------------------------------------- the public entry point

def audit(impls=None, configs=None, seqs=None, modes=None, *, preset: str = "quick",
          dtype: str = "float32", precision: str = "default", backend: str | None = None,
          layout: str = "bhtd", scale: float = 1.0, repeats: int | None = None, seed: int = 0,
          regimes="standard", json_path=None, oracle_impl: str | None = None,
          chunk_size: int | None = None, accumulate_dtype: str | None = None,
          dlog_alpha_form: str | None = None, gate: str = "scalar", cu_seqlens=None,
          on_record: Callable[[dict], None] | None = None,
          progress: Callable[[str], None] | None = None,
          memory_guard: bool = True) -> list[dict[str, Any]]:
    """Audit JAX kernels against the float64 oracle; returns one record per row.

    impls: built-in names ("chunked", "scan"), "package.module:function",
        "path/to/file.py:function" or callables ``(q, k, v, log_alpha, h0) -> o | (o, h_T)``.
    configs: preset names, "B,G,H,dk,dv" strings or {name: (B, G, H, dk, dv)}.
    seqs, modes ("fwd", "fwd_bwd"), repeats: default to the preset's ("quick" or "seed");
        ``repeats=0`` measures accuracy only: no timing loop, null inner/median_ms/q1_ms/q3_ms.
    dtype: the kernel's input dtype; precision: jax matmul precision; backend: "cpu", "gpu" or
    None (jax's default). regimes: names from ``glaref.regimes.REGIMES``. json_path: the report,
    rewritten after every row. Records carry the seed report's fields plus the additions listed
    in ``glaref._audit.RECORD_ADDITIONS``.

    Verdict per output (``glaref._verdict.assess``, two tiers): no non-finite value; a normwise
    error within ``calibrated_ratio`` times that of glaref's same-precision reference kernels on
    the same inputs (calibrated); budget_ulps within the bound of any correct kernel (proven),
    all measured against the oracle on the dtype-rounded inputs, in the compute dtype ("tf32"
    for float32 matmuls at default precision on an NVIDIA GPU). What the verdict assumes of a
    user kernel: ``chunk_size`` (its chunk length, 1 for a step-by-step scan: the reference and
    the bound follow it; None: unknown, see ``glaref._verdict.baseline_error``) and
    ``accumulate_dtype`` (the dtype a 16-bit kernel accumulates and carries its states in;
    None: float32, what production kernels do; pass the input dtype itself, e.g. "bfloat16",
    for a kernel that rounds everything to it, whose bound is then usually infinite, so only
    non-finite values fail). Built-in kernels carry their own (chunked: 64, scan: 1, both
    accumulating in float32). ``dlog_alpha_form``: how a user kernel computes dlog_alpha,
    "identity" (the reverse-cumsum identity of flash-linear-attention's chunk kernels) or
    "direct" (the genuine terms of alpha_t <S_{t-1}, G_t>: a scan, autodiff of segment sums);
    None: unknown, judged against the identity's references, which err more (up to ~40x under
    strong decay), so that a kernel of either form passes; "direct" holds dlog_alpha to the
    direct form's references (``glaref._verdict.reference_key``).

    gate: "scalar" (log_alpha (B, H, T)) or "vector" (GLA's per-key-dimension gates, log_alpha
    (B, H, T, dk), drawn by every regime per dimension; ``mixed_dims`` mixes near-one, standard
    and strongly decayed dimensions). Any kernel takes them through its log_alpha argument.
    cu_seqlens: packed sequences. Offsets "0,5,5,40" (or a list of ints: 0 = c_0 <= ... <= c_N =
    T, empty sequences allowed) fix T = c_N, so ``seqs`` may only repeat it and regimes that set
    their own T (ragged, long) are refused; "random:N" packs N sequences of random lengths
    (``regimes.random_cu_seqlens(T, N, seed)``, empty ones included) into every T. Either way
    each config's batch becomes 1 (the sequences are the batch), h0 and h_T are (N, H, dk, dv),
    and every kernel receives the offsets as a keyword, ``cu_seqlens=`` (a concrete int64 NumPy
    array): a user kernel must take that keyword (else a usage error). Records carry ``gate`` and
    ``cu_seqlens`` (the offsets of the row, or null).
    """
    if not isinstance(preset, str) or preset not in PRESETS:
        raise AuditUsageError(f"preset: got {preset!r}, expected one of {sorted(PRESETS)}")
    pre = PRESETS[preset]
    impl_list = _split(impls) if impls is not None else list(pre.impls)
    if not impl_list:
        raise AuditUsageError("impl: got no kernel")
    cfgs, seq_list, mode_list, scale, seed, chunk_size, regime_list, oracle = _checked(
        configs, seqs, modes, pre=pre, dtype=dtype, layout=layout, scale=scale, seed=seed,
        chunk_size=chunk_size, accumulate_dtype=accumulate_dtype, regimes=regimes,
        oracle_impl=oracle_impl)
    _choices("precision", precision, _verdict.PRECISIONS)
    reps = pre.repeats if repeats is None else _integer("repeats", repeats, 0)
    _check_user_options(impl_list, chunk_size, accumulate_dtype, _form(dlog_alpha_form))
    if backend is not None and not isinstance(backend, str):
        raise AuditUsageError(f"backend: got {backend!r}, expected a platform name such as "
                              "'cpu' or 'gpu', or None")
    gate, packing, seq_list = _gate_and_packing(gate, cu_seqlens, seqs, seq_list, regime_list)

    if json_path is not None:
        json_path = _report.check_output(json_path, "json_path")

    jax = _device.import_jax()
    device = _device.select_device(backend)
    cdtype = _verdict.compute_dtype(dtype, precision, device.platform)
    _check_accumulate(accumulate_dtype, cdtype)
    x64 = _device.x64_scope() if dtype == "float64" else contextlib.nullcontext()
    with x64, jax.default_device(device):
        subjects = [resolve(i, layout=layout, precision=precision, scale=scale,
                            chunk_size=chunk_size, accumulate_dtype=accumulate_dtype,
                            dlog_alpha_form=dlog_alpha_form, gate=gate,
                            packed=packing is not None)
                    for i in impl_list]
        run = _Run(device=device, dtype=dtype, precision=precision, layout=layout, scale=scale,
                   repeats=reps, seed=seed, memory_guard=memory_guard)
        header = _header(
            device, precision, configs={k: list(v) for k, v in cfgs.items()}, seq_lens=seq_list,
            impls=[s.name for s in subjects], repeats=reps, modes=mode_list, dtype=dtype,
            layout=layout, scale=scale, seed=seed, regimes=regime_list, oracle=oracle,
            preset=preset, chunk_size=chunk_size, accumulate_dtype=accumulate_dtype,
            dlog_alpha_form=dlog_alpha_form, gate=gate, packing=packing)
        writer = _report.JsonWriter(json_path, header) if json_path else None
        if writer:
            writer.write()
        _warm_oracle(oracle, gate, packing is not None)

        plan = _problems.plan(regime_list, cfgs, seq_list)
        if packing is not None:                  # the sequences are the batch
            plan = [(regime, cname, replace(dims, B=1)) for regime, cname, dims in plan]
        sink = _Sink(len(plan) * len(mode_list) * len(subjects), writer, on_record, progress)
        host = _device.host_available_bytes() if memory_guard else None
        for regime, cname, dims in plan:
            _audit_problem(run, sink, subjects, mode_list, regime, cname, dims, host=host,
                           seed=seed, dtype=dtype, gate=gate, packing=packing, scale=scale,
                           oracle=oracle)
    return sink.records


def _form(dlog_alpha_form) -> str | None:
    """dlog_alpha_form checked (None, "identity" or "direct"), or a usage error naming it."""
    try:
        return _verdict.check_dlog_alpha_form(dlog_alpha_form)
    except ValueError as exc:
        raise AuditUsageError(str(exc)) from None


def _header(device, precision: str, *, packing, **config) -> dict[str, Any]:
    """The report's header: the device, and the audit's configuration as run (``config``: the
    checked arguments; ``packing`` written as the offsets, "random:N" or None)."""
    cu = (None if packing is None else f"{RANDOM_PACKING}{packing}" if isinstance(packing, int)
          else packing.tolist())
    return {"device": _device.device_info(device, precision),
            "config": {"device": device.platform, **config, "precision": precision,
                       "cu_seqlens": cu}}


def _check_user_options(impl_list: list, chunk_size, accumulate_dtype,
                        dlog_alpha_form=None) -> None:
    """chunk_size, accumulate_dtype and dlog_alpha_form describe user kernels (built-ins carry
    their own): refuse them when every kernel is built in, where they would apply to nothing."""
    given = {n: v for n, v in (("chunk_size", chunk_size), ("accumulate_dtype", accumulate_dtype),
                               ("dlog_alpha_form", dlog_alpha_form)) if v is not None}
    if not given:
        return
    if all(isinstance(i, str) and i in BUILTIN_IMPLS for i in impl_list):
        given, value = next(iter(given.items()))
        raise AuditUsageError(
            f"{given}: got {value!r}, but it describes user kernels and every kernel here is "
            f"built in ({', '.join(impl_list)}); built-in kernels carry their own")


class _Sink:
    """Where each row goes as it is made: the returned records, the JSON report (rewritten
    atomically), the caller's callback; and the progress line announcing it."""

    def __init__(self, total: int, writer, on_record, progress):
        self.records: list[dict[str, Any]] = []
        self.total, self.writer, self.on_record, self.progress = total, writer, on_record, progress

    def announce(self, text: str) -> None:
        if self.progress:
            self.progress(f"[{len(self.records) + 1}/{self.total}] {text}")

    def add(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)
        if self.writer:
            self.writer.add(rec)
        if self.on_record:
            self.on_record(rec)


def _audit_problem(run: _Run, sink: _Sink, subjects: list[Subject], modes: list[str], regime: str,
                   cname: str, dims: Dims, *, host: int | None, seed: int, dtype: str, gate: str,
                   packing, scale: float, oracle: str) -> None:
    """Every row (mode x kernel) of one problem: declined when the oracle's side would not fit
    in ``host`` bytes, else the problem made, its oracle run once and each row measured."""
    reason = _oracle_memory(dims, modes, host)
    if reason is not None:
        for mode in modes:
            for subject in subjects:
                sink.announce(f"{subject.name} {mode} {cname} T={dims.T} ({regime}): skipped")
                sink.add(run.declined(subject, mode, cname, dims, regime, reason))
        return
    problem = _problems.make_problem(regime, dims, seed, dtype, gate=gate,
                                     cu_seqlens=_offsets(packing, dims.T, seed))
    kind = "" if gate == "scalar" else f", {gate} gates"
    kind += "" if packing is None else f", {problem.n_states} packed sequences"
    truth = _judge.Truth(problem, scale, oracle)
    try:
        truth.forward()
        arr = run.device_arrays(problem)
        for mode in modes:
            for subject in subjects:
                sink.announce(f"{subject.name} {mode} {cname} T={dims.T} ({regime}{kind})")
                sink.add(run.row(subject, mode, cname, dims, regime, truth, arr))
    except NonFiniteError as exc:
        # the oracle's own results overflow (the regimes' inputs are moderate: an extreme scale):
        # nothing can be judged against them
        raise AuditUsageError(str(exc)) from None


# ---------------------------------------------------------------- torch and NumPy kernels

def _framework_row(kernel: Callable, name: str, framework: str, mode: str, cname: str,
                   regime: str, truth: _judge.Truth, *, dtype: str, cdtype: str, layout: str,
                   scale: float, seed: int, chunk_size: int | None, acc: str | None,
                   device: str | None, detected: bool, oracle_impl: str,
                   operand_dtype: str | None = None,
                   dlog_alpha_form: str | None = None) -> dict[str, Any]:
    """One row of a kernel run by ``glaref._frameworks.run_kernel`` on ``truth``'s problem."""
    from .._frameworks import run_kernel

    dims = truth.p.dims
    rec = {"impl": name, "mode": mode, "config": cname, "batch": dims.B, "groups": dims.G,
           "heads": dims.H, "seq": dims.T, "dk": dims.dk, "dv": dims.dv}
    run = run_kernel(kernel, truth.p, dtype, layout=layout, scale=scale, framework=framework,
                     grads=mode == "fwd_bwd", device=device)
    params = {"dtype": dtype, "compute_dtype": cdtype, "precision": None, "layout": layout,
              "regime": regime, "seed": seed, "scale": scale, "final_state": run.final_state,
              "chunk_size": chunk_size, "accumulate_dtype": acc, "operand_dtype": operand_dtype,
              "dlog_alpha_form": dlog_alpha_form, "framework": framework,
              "gate": "vector" if truth.p.vector_gate else "scalar",
              "cu_seqlens": None if truth.p.cu_seqlens is None else [int(c) for c in truth.p.cu_seqlens]}
    problem = None
    if run.error is not None:
        e = run.error
        first = (e["message"].splitlines() or [""])[0][:300]
        problem = first if e["type"] == "KernelOutputError" else \
            (f"{e['type']}: {first}" if first else e["type"])
        if e["stage"] == "backward":
            problem += " (in the backward pass)"
        if detected:
            problem += (f" [run as a {framework} kernel, detected from its code: pass framework= "
                        "if it is written in another]")
    elif detected and run.returned not in (framework, None):
        problem = (f"the kernel returned {run.returned} arrays for {framework} inputs: it was taken "
                   f"for a {framework} kernel (detected from its code); pass "
                   f"framework={run.returned!r}")
    if problem is not None:     # a kernel that raises fails: the caller asked for it to run
        rec.update({"skipped": problem, **params, "ok": False, "failures": [problem]})
        return rec
    if mode == "fwd_bwd" and run.grads is None:
        rec["mode"] = "fwd"
        params["forward_only"] = run.no_grads
    inputs_seen = run.inputs
    if not all(np.array_equal(getattr(inputs_seen, n), getattr(truth.p, n))
               for n in GRADS):
        # the framework rounded differently from glaref (never expected: the problem holds
        # values of the dtype already); judge against what the kernel received
        truth = _judge.Truth(inputs_seen, scale, oracle_impl)
    values = {**run.outputs, **(run.grads or {})}
    dtypes = {n: run.dtypes[n] for n in run.outputs}
    dtypes.update({n: run.dtypes[f"d{n}"] for n in (run.grads or {})})
    final = bool(run.final_state)
    per = _judge.assess_outputs(truth, values, dtypes, final=final, grads=run.grads is not None,
                                compute_dtype=cdtype, accumulate_dtype=acc, chunk_size=chunk_size,
                                operand_dtype=operand_dtype, dlog_alpha_form=dlog_alpha_form)
    rec.update(dict.fromkeys(_timing.FIELDS))
    if rec["mode"] == "fwd_bwd":
        rec["residual_mb"] = None
    return _judged(rec, per, values, truth, layout=layout, cdtype=cdtype, mode=rec["mode"],
                   final=final, params=params)


def audit_kernel(kernel: Callable, *, framework: str, detected: bool = False, configs=None,
                 seqs=None, modes=None, dtype: str = "float32", compute_dtype: str | None = None,
                 layout: str = "bhtd", scale: float = 1.0, seed: int = 0, regimes="standard",
                 chunk_size: int | None = None, accumulate_dtype: str | None = None,
                 device: str | None = None, oracle_impl: str | None = None,
                 memory_guard: bool = True, operand_dtype: str | None = None,
                 dlog_alpha_form: str | None = None, gate: str = "scalar") -> list[dict[str, Any]]:
    """Accuracy rows of one torch or NumPy kernel (``framework``), one record per row.

    The rows, problems (``glaref._problems``: regime inputs rounded to ``dtype``), oracle
    (``_judge.Truth``), verdict (``_judge.assess_outputs``) and record format (``_judged``) are
    :func:`audit`'s; the kernel is run by ``glaref._frameworks.run_kernel`` (gradients through
    torch.autograd) instead of being compiled by JAX, so the timing and XLA memory fields are
    null. Defaults as :func:`audit`'s "quick" preset.

    compute_dtype: the arithmetic the kernel's errors are measured in: None for ``dtype``
    itself, "tf32" for float32 inputs multiplied as TF32 (a Triton ``tl.dot`` on an NVIDIA GPU,
    or torch with ``allow_tf32``). device: where a torch kernel's inputs go ("cpu" by default,
    "cuda"). operand_dtype: the format the kernel rounds its matrix products' operands to beyond
    ``dtype`` (None: none; ``_verdict.reference_arithmetic``). dlog_alpha_form: as for
    :func:`audit`. gate: "scalar" or "vector" (log_alpha (B, H, T, dk), as :func:`audit`'s).
    detected: the framework was
    guessed from the kernel's code, so a kernel returning another framework's arrays fails with
    a message saying which ``framework=`` to pass.

    Records carry two keys of their own: ``framework``, and ``forward_only`` (the reason) on rows
    asked for fwd_bwd whose kernel is not differentiable (a NumPy kernel, a torch kernel whose
    outputs do not require grad): those are measured forward only and recorded as mode "fwd".
    A kernel that raises, or returns the wrong structure, is a failed row (``ok`` false,
    ``skipped`` and ``failures`` giving the reason). Rows whose oracle side would not fit in
    the host's memory are skipped (``ok`` null) unless ``memory_guard`` is False.
    """
    from .._frameworks import FRAMEWORKS

    if framework not in FRAMEWORKS:
        raise AuditUsageError(f"framework: got {framework!r}, expected one of {FRAMEWORKS}")
    if not callable(kernel):
        raise AuditUsageError(f"kernel: got {type(kernel).__name__}, expected a {framework} "
                              "callable (q, k, v, log_alpha, h0) -> o | (o, h_T)")
    if device is not None and framework != "torch":
        raise AuditUsageError(f"device: got {device!r} for a {framework} kernel, expected None "
                              "(torch kernels only)")
    cfgs, seq_list, mode_list, scale, seed, chunk_size, regime_list, oracle = _checked(
        configs, seqs, modes, pre=PRESETS["quick"], dtype=dtype, layout=layout, scale=scale,
        seed=seed, chunk_size=chunk_size, accumulate_dtype=accumulate_dtype, regimes=regimes,
        oracle_impl=oracle_impl)
    cdtype = dtype if compute_dtype is None else _choices("compute_dtype", compute_dtype,
                                                          _verdict.COMPUTE_DTYPES)[0]
    _check_accumulate(accumulate_dtype, cdtype)
    acc = _judge.accumulate_for(accumulate_dtype, cdtype)
    if operand_dtype is not None:
        _choices("operand_dtype", operand_dtype, _verdict.COMPUTE_DTYPES)
    _form(dlog_alpha_form)
    gate = _gate(gate)
    if framework == "numpy":     # forward only: one "fwd" row where fwd_bwd was asked for
        mode_list = list(dict.fromkeys("fwd" for _ in mode_list))
    name = getattr(kernel, "__qualname__", None) or getattr(kernel, "__name__", None) or repr(kernel)
    _warm_oracle(oracle, gate)
    records: list[dict[str, Any]] = []
    host = _device.host_available_bytes() if memory_guard else None
    for regime, cname, dims in _problems.plan(regime_list, cfgs, seq_list):
        reason = _oracle_memory(dims, mode_list, host)
        if reason is not None:      # declined before any input is made
            for mode in mode_list:
                records.append({"impl": name, "mode": mode, "config": cname, "batch": dims.B,
                                "groups": dims.G, "heads": dims.H, "seq": dims.T, "dk": dims.dk,
                                "dv": dims.dv, "skipped": reason, "dtype": dtype,
                                "compute_dtype": cdtype, "precision": None, "layout": layout,
                                "regime": regime, "seed": seed, "scale": scale,
                                "final_state": None, "chunk_size": chunk_size,
                                "accumulate_dtype": acc, "operand_dtype": operand_dtype,
                                "dlog_alpha_form": dlog_alpha_form,
                                "framework": framework, "ok": None})
            continue
        truth = _judge.Truth(_problems.make_problem(regime, dims, seed, dtype, gate=gate), scale,
                             oracle)
        try:
            truth.forward()
            for mode in mode_list:
                rec = _framework_row(kernel, name, framework, mode, cname, regime, truth,
                                     dtype=dtype, cdtype=cdtype, layout=layout, scale=scale,
                                     seed=seed, chunk_size=chunk_size, acc=acc, device=device,
                                     detected=detected, oracle_impl=oracle,
                                     operand_dtype=operand_dtype, dlog_alpha_form=dlog_alpha_form)
                if framework == "numpy":
                    rec["forward_only"] = "NumPy has no automatic differentiation: forward only"
                records.append(rec)
        except NonFiniteError as exc:     # the oracle's own results overflow: an extreme scale
            raise AuditUsageError(str(exc)) from None
    return records
