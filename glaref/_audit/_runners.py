"""One runner per framework: run a kernel on one problem in one mode and say what it gave.

The engine (``glaref._audit._engine``) judges and records; a runner only runs and converts.
:class:`JaxRunner` compiles the kernel (jit; gradients through ``jax.vjp``, so a ``custom_vjp``
is what runs), measures XLA memory, residuals and time, and applies the memory guard.
:class:`FrameworkRunner` runs torch and NumPy kernels through ``glaref._audit._frameworks.run_kernel``
(accuracy only: the timing and memory fields are null). Both return a :class:`Measured`: the
kernel's outputs and gradients as canonical float64 arrays with the dtypes they were returned in,
or why nothing can be judged (``failure``: the kernel raised, with its traceback, or returned
the wrong structure or dtype; ``declined``: glaref's memory guard).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._inputs import GRADS, from_canonical, kernel_returns, output_problem, to_canonical
from . import _device, _timing
from ._family import Family, Truth
from ._frameworks import Call, kernel_traceback, run_kernel
from ._subjects import Subject

__all__ = ["FrameworkRunner", "JaxRunner", "Measured", "fwd_bwd_program"]


@dataclass
class Measured:
    """What one subject gave in one mode on one problem, before any verdict.

    mode: as run ("fwd" where a fwd_bwd row could only run forward). fields: measured figures in
    record order (timing, XLA memory, residual_mb). params: record keys of this runner (precision,
    framework, forward_only...). values: canonical float64 outputs and gradients; dtypes: the
    dtype name each was returned in; final: the kernel returned h_T. failure: why nothing can be
    judged (a failed row), with the kernel's ``traceback`` when it raised; declined: glaref
    declined the row (memory guard), ``failure`` giving why. truth: the oracle on what the kernel
    really received, where its framework rounded the inputs differently from glaref."""

    mode: str
    fields: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    values: dict[str, np.ndarray] | None = None
    dtypes: dict[str, str] = field(default_factory=dict)
    final: bool | None = None
    failure: str | None = None
    traceback: str | None = None
    declined: bool = False
    truth: Truth | None = None
    program: tuple | None = None      # fwd_bwd: (compiled program, its arguments' dtypes)


def raised(exc: BaseException) -> str:
    """One line naming what a kernel raised."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (sys.exit({exc.code!r}))"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


# ---------------------------------------------------------------- JAX

def _fwd(fn: Callable) -> Callable:
    def f(*inputs):
        return fn(*inputs)

    return f


def fwd_bwd_program(fn: Callable, final: bool, n_inputs: int = len(GRADS)) -> Callable:
    """(inputs..., do[, dh_T]) -> (outputs, grads) through jax.vjp, so a custom_vjp is what runs;
    ``n_inputs``: how many arrays the kernel takes (its family's ``inputs``)."""
    import jax

    def f(*args):
        inputs, (do, *dh_T) = args[:n_inputs], args[n_inputs:]
        out, pullback = jax.vjp(fn, *inputs)
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
    return fwd_bwd_program(fn, final, len(inputs)), inputs + tuple(cts)


def _returned(first, mode: str, final: bool, grad_names: tuple[str, ...]) -> dict[str, Any]:
    """The outputs of a program's first call by name: o[, h_T] and, for fwd_bwd, the gradients
    (``grad_names``, the family's)."""
    out, grads = (first, ()) if mode == "fwd" else first
    raw = {"o": out[0] if final else out}
    if final:
        raw["h_T"] = out[1]
    raw.update(zip(grad_names, grads))
    return raw


class JaxRunner:
    """JAX kernels on one device: jit, jax.vjp, timing (``repeats``), XLA memory; the arrays
    of ``family``'s problems (``Family.inputs``, ``arrays``, ``kinds``)."""

    def __init__(self, *, device, dtype: str, precision: str, layout: str, repeats: int,
                 memory_guard: bool, family: Family):
        import jax

        self.jax, self.device = jax, device
        self.dtype, self.np_dtype = dtype, jax.numpy.dtype(dtype)
        self.precision, self.layout = precision, layout
        self.repeats, self.memory_guard, self.family = repeats, memory_guard, family
        self.params = {"precision": precision}     # the record keys of this runner
        # one compiled program per kernel, mode and argument shapes for the whole audit (rows
        # of other regimes and seeds reuse it); packed rows, whose offsets are baked in, never
        self._programs: dict[tuple, tuple[Any, float]] = {}
        # likewise what tracing tells of a kernel at given input shapes: its output structure
        # (jax.eval_shape) and the bytes of its vjp residuals, traced once, not once per row;
        # and each compiled program's XLA memory
        self._traced: dict[tuple, Any] = {}

    def precision_ctx(self):
        if self.precision == "default":
            return contextlib.nullcontext()
        return self.jax.default_matmul_precision(self.precision)

    def prepare(self, p) -> dict[str, Any]:
        """The problem in the kernel's layout and dtype, on the device (cotangents included)."""
        out = {}
        fields, kinds = self.family.fields(p), self.family.kinds
        for name in self.family.arrays:
            x = from_canonical(fields[name], kinds[name], self.layout)
            out[name] = self.jax.device_put(np.asarray(x, dtype=self.np_dtype), self.device)
        return out

    def measure(self, subject: Subject, mode: str, truth: Truth,
                arr: dict[str, Any]) -> Measured:
        """The kernel's structure (jax.eval_shape), compiled program, XLA memory, timing and
        residuals, and its outputs; a kernel that raises or returns the wrong structure or dtype
        is a failure; one over the memory guard is declined."""
        m = Measured(mode, params=dict(self.params))
        fam = self.family
        inputs = tuple(arr[n] for n in fam.inputs)
        # packed sequences: the kernel receives the offsets (concrete int64) as cu_seqlens=
        cu = truth.p.cu_seqlens
        fn = subject.fn if cu is None else functools.partial(subject.fn, cu_seqlens=cu)
        sig = None if cu is not None else (id(subject.fn), tuple(
            (tuple(x.shape), str(x.dtype)) for x in inputs))
        try:
            with self.precision_ctx():
                shape = self._trace(sig, "shape", lambda: self.jax.eval_shape(fn, *inputs))
            _, m.final, m.failure = kernel_returns(shape, truth.p.dims, self.layout,
                                                   truth.p.n_states)
            if m.failure is not None:
                return m
            f, args = _program(fn, mode, m.final, shape if m.final else (shape,), inputs, arr)
            key = None if cu is not None else (id(subject.fn), mode, m.final, tuple(
                (tuple(x.shape), str(x.dtype)) for x in args))
            if key not in self._programs:
                with self.precision_ctx():
                    self._programs[key] = _timing.compile_fn(f, args)
            compiled, m.fields["compile_s"] = self._programs[key]
            if key is None:
                del self._programs[None]
            mem = self._trace(key, "memory", lambda c=compiled: _timing.memory(c))
            m.fields.update(mem)
            m.failure = self._over_memory(mem)
            if m.failure:
                m.declined = True
                return m
            first, timing = _timing.time_calls(compiled, args, self.repeats)
            if mode == "fwd_bwd":           # the probes (glaref._audit._probes) run it again
                m.program = (compiled, tuple(np.dtype(x.dtype) for x in args))
            del compiled
            m.fields.update(timing)
            if mode == "fwd_bwd":
                with self.precision_ctx():
                    m.fields["residual_mb"] = self._trace(
                        sig, "residuals", lambda: _timing.residual_bytes(fn, inputs)) / _timing.MIB
        except (Exception, SystemExit) as exc:  # the kernel raised: a failed row; the audit goes on
            m.failure, m.traceback = "kernel raised " + raised(exc), kernel_traceback(exc)
            return m
        arrays = {n: np.asarray(x) for n, x in _returned(first, mode, m.final, fam.grads).items()}
        for name, x in arrays.items():
            m.failure = output_problem(name, x, x.shape, None)
            if m.failure is not None:    # e.g. a gradient from a custom_vjp in an integer dtype
                return m
        m.fields = {k: m.fields.get(k) for k in _timing.FIELDS + (("residual_mb",) if
                                                                  mode == "fwd_bwd" else ())}
        m.values = {n: to_canonical(np.asarray(x).astype(np.float64), fam.kinds[n], self.layout)
                    for n, x in arrays.items()}
        m.dtypes = {n: np.dtype(x.dtype).name for n, x in arrays.items()}
        return m

    def _trace(self, sig: tuple | None, what: str, run: Callable[[], Any]) -> Any:
        """``run()``, once per kernel and input signature ``sig`` (or program key; None: a
        packed row, never kept) for ``what`` it measures."""
        if sig is None:
            return run()
        if (sig, what) not in self._traced:
            self._traced[sig, what] = run()
        return self._traced[sig, what]

    def _over_memory(self, mem: dict[str, float | None]) -> str | None:
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


# ---------------------------------------------------------------- torch and NumPy

class FrameworkRunner:
    """torch and NumPy kernels through ``glaref._audit._frameworks.run_kernel``, accuracy only.
    ``detected``: the framework was guessed from the kernel's code, so a kernel returning
    another framework's arrays fails saying which ``framework=`` to pass."""

    def __init__(self, *, framework: str, dtype: str, layout: str, scale: float,
                 device: str | None, detected: bool, operand_dtype: str | None,
                 family: Family):
        self.framework, self.dtype, self.layout, self.scale = framework, dtype, layout, scale
        self.device, self.detected, self.family = device, detected, family
        self.params = {"precision": None, "operand_dtype": operand_dtype, "framework": framework}

    def prepare(self, p):
        """The problem itself: ``run_kernel`` converts it for the kernel's framework."""
        return p

    def measure(self, subject: Subject, mode: str, truth: Truth, p) -> Measured:
        fw, fam = self.framework, self.family
        run = run_kernel(subject.fn, p, self.dtype, grads=mode == "fwd_bwd",
                         call=Call(self.layout, self.scale, fw, self.device, fam))
        m = Measured(mode, params=dict(self.params), final=run.final_state)
        if fw == "numpy":
            m.params["forward_only"] = run.no_grads
        if run.error is not None:
            e = run.error
            first = (e["message"].splitlines() or [""])[0][:300]
            m.failure = first if e["type"] == "KernelOutputError" else \
                (f"{e['type']}: {first}" if first else e["type"])
            m.traceback = e["traceback"] or None
            if e["stage"] == "backward":
                m.failure += " (in the backward pass)"
            if self.detected:
                m.failure += (f" [run as a {fw} kernel, detected from its code: pass framework= "
                              "if it is written in another]")
        elif self.detected and run.returned not in (fw, None):
            m.failure = (f"the kernel returned {run.returned} arrays for {fw} inputs: it was "
                         f"taken for a {fw} kernel (detected from its code); pass "
                         f"framework={run.returned!r}")
        if m.failure is not None:     # a kernel that raises fails: the caller asked for it to run
            return m
        if mode == "fwd_bwd" and run.grads is None:
            m.mode, m.params["forward_only"] = "fwd", run.no_grads
        if not all(np.array_equal(getattr(run.inputs, n), getattr(p, n)) for n in fam.inputs):
            # the framework rounded differently from glaref (never expected: the problem holds
            # values of the dtype already); judge against what the kernel received
            m.truth = fam.truth(run.inputs, truth.scale, truth.impl)
        m.values = {**run.outputs, **(run.grads or {})}
        m.dtypes = {n: run.dtypes[n] for n in run.outputs}
        m.dtypes.update({n: run.dtypes[f"d{n}"] for n in (run.grads or {})})
        m.fields = dict.fromkeys(_timing.FIELDS + (("residual_mb",) if m.mode == "fwd_bwd" else ()))
        return m
