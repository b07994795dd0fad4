"""Running a kernel written in torch, NumPy or JAX on one problem, and reading back what it gave.

    run = run_kernel(kernel, problem, "float32", call=Call(layout="bthd", framework="torch"))
    run.inputs     # float64 canonical Problem: exactly the (rounded) numbers the kernel received
    run.outputs    # {"o": ..., "h_T": ...} float64, canonical "bhtd" (h_T only when returned)
    run.grads      # {"q", "k", "v", "log_alpha", "h0"} through the framework's autodiff, or None
    run.dtypes     # the dtype name of every array the kernel returned ("float32", "bfloat16", ...)
    run.error      # None, or {"stage", "type", "message", "traceback"} when the kernel raised

A kernel is a callable ``(q, k, v, log_alpha, h0) -> o | (o, h_T)`` on arrays of its framework in
``layout`` (another recurrence family's arguments when ``Call.family`` is given: the gated delta rule's
``(q, k, v, beta, log_alpha, h0)``); when its signature takes ``scale`` it receives it, otherwise
it must apply the scale itself (as in the audit). The gradients are those of L = sum(o * do) +
sum(h_T * dh_T) with the problem's cotangents, cast to the dtype of the output they pair with:
torch through ``torch.autograd.grad`` (a custom ``autograd.Function`` is what runs), JAX through
``jax.vjp`` (a ``custom_vjp`` is what runs), NumPy forward only. A torch kernel whose outputs do
not require grad is run forward only, and says why (``run.no_grads``).

No verdict here: this module only runs and converts (the judge is glaref's verdict). torch and jax
are imported only when a kernel of theirs is run; a kernel that raises is reported in ``error``,
never re-raised, so one broken kernel does not stop a test suite's other checks.
"""

from __future__ import annotations

import dis
import inspect
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .._errors import AuditUsageError, DTypeError
from .._inputs import (
    _KIND,
    ARRAYS,
    DTYPES,
    FORWARD,
    GRADS,
    Problem,
    check_layout,
    from_canonical,
    kernel_returns,
    to_canonical,
    to_float64,
)

FRAMEWORKS = ("torch", "numpy", "jax")


@dataclass(frozen=True)
class _Names:
    """The arrays of a recurrence family as a run reads them: inputs (the kernel's arguments,
    in order, each with a gradient), arrays (inputs and cotangents), outputs, kinds (layout
    kind of each: ``to_canonical``)."""

    inputs: tuple[str, ...]
    arrays: tuple[str, ...]
    outputs: tuple[str, ...]
    kinds: dict


_SCALAR_GATE = _Names(GRADS, ARRAYS, FORWARD, _KIND)


def _names(family) -> _Names:
    """The names of ``family`` (``glaref._audit._family.Family``; None: the scalar gate's)."""
    if family is None:
        return _SCALAR_GATE
    return _Names(tuple(family.inputs), tuple(family.arrays), tuple(family.outputs),
                  dict(family.kinds))


@dataclass
class KernelRun:
    """What one call of a kernel gave, as float64 numpy arrays in the canonical "bhtd" layout."""

    framework: str
    dtype: str
    layout: str
    inputs: Problem                                   # what the kernel received, widened exactly
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    grads: dict[str, np.ndarray] | None = None
    dtypes: dict[str, str] = field(default_factory=dict)
    final_state: bool | None = None                   # did the kernel return h_T?
    returned: str | None = None                       # the framework of the arrays it returned
    no_grads: str | None = None                       # why grads is None, when it is
    error: dict[str, str] | None = None               # the kernel raised (or returned garbage)

    @property
    def ok(self) -> bool:
        return self.error is None


# ---------------------------------------------------------------- names and conversions

def dtype_name(x: Any) -> str:
    """The dtype of an array of any framework as a plain name: "float32", "bfloat16", ..."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        return type(x).__name__
    name = getattr(dt, "name", None)
    if isinstance(name, str):
        return name
    return str(dt).rsplit(".", 1)[-1]          # torch.float32 -> float32


def to_host_float64(x: Any, name: str) -> np.ndarray:
    """Any real float array (numpy, JAX, torch on any device, CuPy) widened exactly to float64 on
    the host. torch tensors are detached and copied to the CPU, CuPy arrays fetched; the rest is
    ``glaref._inputs.to_float64``."""
    mod = type(x).__module__ or ""
    if mod.startswith("torch") and hasattr(x, "detach"):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        return to_float64(t, name)
    if mod.startswith("cupy") and hasattr(x, "get"):
        return to_float64(x.get(), name)
    return to_float64(x, name)


def array_framework(x: Any) -> str:
    """The framework an array belongs to, from its type's module: "numpy", "jax", "torch", ..."""
    root = (type(x).__module__ or "").split(".")[0]
    return "jax" if root == "jaxlib" else root


def _module_of(obj: Any) -> str:
    return getattr(obj, "__module__", None) or type(obj).__module__ or ""


def _modules_reached(kernel: Any, depth: int = 3, budget: int = 300) -> set[str]:
    """Names of the modules a callable comes from or reaches through its code: its own module,
    its class's bases, the modules its code imports, and, recursively (``depth`` levels,
    ``budget`` objects at most), what the names in its code and closure resolve to (modules,
    functions, classes, the attributes its code reads from those modules)."""
    found: set[str] = set()
    seen: set = set()
    stack: list = [(kernel, depth, ())]
    while stack and len(seen) < budget:
        obj, d, attrs = stack.pop()
        is_module = type(obj).__name__ == "module"
        key = (id(obj), attrs) if is_module else id(obj)
        if key in seen:
            continue
        seen.add(key)
        if is_module:
            found.add(obj.__name__)
            # what the code reads from it (``mypkg.ops.kernel(...)``: ops, then kernel), among
            # the attributes already loaded (nothing is imported here)
            for nm in attrs:
                inner = vars(obj).get(nm)
                if inner is not None and (callable(inner) or type(inner).__name__ == "module"):
                    stack.append((inner, d, attrs))
            continue
        classes = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
        found.update(c.__module__ or "" for c in classes)
        found.add(_module_of(obj))
        if d == 0:
            continue
        for attr in ("func", "__wrapped__", "__func__", "forward"):   # partial, wrappers, Modules
            inner = getattr(obj, attr, None)
            if inner is not None and callable(inner):
                stack.append((inner, d, ()))
        # an object of a class defining __call__: that method, whose code is read
        call = getattr(type(obj), "__call__", None)  # noqa: B004
        if hasattr(call, "__code__"):
            stack.append((call, d, ()))
        code = getattr(obj, "__code__", None)
        if code is None:
            continue
        codes, names = [code], []
        while codes:                        # the function's code and the lambdas/defs inside it
            c = codes.pop()
            names.extend(c.co_names)
            codes.extend(x for x in c.co_consts if hasattr(x, "co_names"))
            # modules imported inside the function (``import jax.numpy as jnp`` in its body)
            found.update(i.argval for i in dis.get_instructions(c) if i.opname == "IMPORT_NAME")
        g = getattr(obj, "__globals__", {})
        attrs = tuple(dict.fromkeys(names))
        for nm in attrs:
            if nm in g:
                stack.append((g[nm], d - 1, attrs))
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                stack.append((cell.cell_contents, d - 1, attrs))
            except ValueError:              # an empty cell
                pass
    return found


def detect_framework(kernel: Callable) -> str:
    """The framework a kernel is written in, from the callable alone (nothing is imported).

    The modules the kernel comes from, imports in its body or reaches through its code, its
    closure and the functions those name (three levels deep): "torch" if any is torch's
    (``torch.exp``, an ``nn.Module``, a custom ``autograd.Function``), else "jax" if any is
    JAX's (``jnp.cumsum``, a jitted function), else "numpy". Pass ``framework=`` when this
    guesses wrong.
    """
    roots = {m.split(".")[0] for m in _modules_reached(kernel)}
    if "torch" in roots:
        return "torch"
    if roots & {"jax", "jaxlib"}:
        return "jax"
    return "numpy"


def accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn``'s signature takes the keyword ``name`` (or any keyword)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def kernel_traceback(exc: BaseException) -> str:
    """The traceback of an exception a kernel raised, glaref's own frames trimmed: from the
    first frame outside the glaref package on."""
    frames = traceback.extract_tb(exc.__traceback__)
    keep = [i for i, f in enumerate(frames) if "/glaref/" not in f.filename.replace("\\", "/")]
    tb = exc.__traceback__
    for _ in range(keep[0] if keep else 0):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _error(stage: str, exc: BaseException) -> dict[str, str]:
    return {"stage": stage, "type": type(exc).__name__, "message": str(exc).strip()[:2000],
            "traceback": kernel_traceback(exc)}


def _problem_error(stage: str, message: str) -> dict[str, str]:
    return {"stage": stage, "type": "KernelOutputError", "message": message, "traceback": ""}


def _kernel_arrays(p: Problem, layout: str, nm: _Names) -> dict[str, np.ndarray]:
    """Inputs and cotangents of ``p`` in ``layout`` (float64)."""
    out = {}
    for name in nm.arrays:
        x = getattr(p, name)
        out[name] = None if x is None else from_canonical(x, nm.kinds[name], layout)
    return out


def _canonical_problem(arrays: dict[str, np.ndarray], p: Problem, layout: str,
                       nm: _Names) -> Problem:
    """The float64 canonical problem from the arrays the kernel received (already float64):
    ``p`` with each of them in place (``with_fields``)."""
    return p.with_fields(**{n: (None if arrays[n] is None else
                                to_canonical(arrays[n], nm.kinds[n], layout))
                            for n in nm.arrays})


def _read(x: Any, name: str, kind: str, layout: str) -> np.ndarray:
    return to_canonical(to_host_float64(x, name), kind, layout)


def _received(arrays: dict[str, np.ndarray], inputs: dict[str, np.ndarray], p: Problem,
              layout: str, nm: _Names) -> Problem:
    """The canonical problem the kernel received: its ``inputs`` widened back exactly to float64
    (the rounding is the framework's own), and the cotangents of ``arrays``."""
    return _canonical_problem({**arrays, **inputs}, p, layout, nm)


def _forward(run: KernelRun, call: Callable[[], Any], p: Problem,
             layout: str, nm: _Names) -> tuple[list, bool] | None:
    """Run a kernel's forward (``call()``, its return value) and record it in ``run``
    (final_state, the array framework returned, the forward outputs and their dtypes): (its
    arrays, returns h_T?), or None with ``run.error`` set when it raised or its structure is
    wrong."""
    try:
        out = call()
    except (Exception, SystemExit) as exc:     # a kernel calling sys.exit fails, glaref goes on
        run.error = _error("forward", exc)
        return None
    arrays_out, final, problem = kernel_returns(out, p.dims, layout, p.n_states)
    run.final_state = final
    run.returned = array_framework(arrays_out[0]) if arrays_out else None
    if problem is not None:
        run.error = _problem_error("forward", problem)
        return None
    for name, x in zip(nm.outputs, arrays_out):
        run.dtypes[name] = dtype_name(x)
        run.outputs[name] = _read(x, name, nm.kinds[name], layout)
    return arrays_out, final


# ---------------------------------------------------------------- the frameworks

def _run_torch(kernel, scale_kw, want_grads, device, run: KernelRun, nm: _Names):
    p, dtype, layout = run.inputs, run.dtype, run.layout
    try:
        import torch
    except ImportError:
        raise ImportError("framework 'torch': torch is not installed (pip install "
                          "'glaref[torch]' for the CPU build)") from None

    tdtype = getattr(torch, dtype)
    arrays = _kernel_arrays(p, layout, nm)
    inputs = [torch.from_numpy(np.ascontiguousarray(arrays[n])).to(device=device, dtype=tdtype)
              for n in nm.inputs]
    # what the kernel receives, widened back exactly (the rounding is torch's own)
    run.inputs = _received(arrays, {n: t.double().cpu().numpy() for n, t in zip(nm.inputs, inputs)},
                           p, layout, nm)
    if want_grads:
        for t in inputs:
            t.requires_grad_(True)
    if p.cu_seqlens is not None:    # packed sequences: the offsets as an int64 tensor beside q
        scale_kw = {**scale_kw, "cu_seqlens": torch.as_tensor(np.asarray(p.cu_seqlens, np.int64),
                                                              device=device)}
    taken = _forward(run, lambda: kernel(*inputs, **scale_kw), p, layout, nm)
    if taken is None:
        return
    arrays_out, final = taken
    if not want_grads:
        run.no_grads = "gradients not asked for"
        return
    if p.do is None:
        run.no_grads = "the problem has no cotangent do"
        return
    if not any(getattr(x, "requires_grad", False) for x in arrays_out):
        run.no_grads = "the kernel's outputs do not require grad (not differentiable in torch)"
        return
    cts = [torch.from_numpy(np.ascontiguousarray(arrays["do"])).to(device=arrays_out[0].device,
                                                                    dtype=arrays_out[0].dtype)]
    if final:
        dh_T = arrays["dh_T"] if arrays["dh_T"] is not None else np.zeros(arrays_out[1].shape)
        cts.append(torch.from_numpy(np.ascontiguousarray(dh_T)).to(device=arrays_out[1].device,
                                                                    dtype=arrays_out[1].dtype))
    pairs = [(x, c) for x, c in zip(arrays_out, cts) if x.requires_grad]
    try:
        grads = torch.autograd.grad([x for x, _ in pairs], inputs, [c for _, c in pairs],
                                    allow_unused=True)
    except (Exception, SystemExit) as exc:     # a kernel calling sys.exit fails, glaref goes on
        run.error = _error("backward", exc)
        return
    run.grads = {}
    for name, t, g in zip(nm.inputs, inputs, grads):
        if g is None:      # the kernel never read this input: its gradient is exactly zero
            g = torch.zeros_like(t)
        run.dtypes[f"d{name}"] = dtype_name(g)
        run.grads[name] = _read(g, f"d{name}", nm.kinds[name], layout)


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise DTypeError("dtype: got 'bfloat16' for a NumPy kernel, which needs the ml_dtypes "
                             "package (pip install ml_dtypes)", argument="dtype") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _run_numpy(kernel, scale_kw, want_grads, run: KernelRun, nm: _Names):
    p, dtype, layout = run.inputs, run.dtype, run.layout
    npd = _numpy_dtype(dtype)
    arrays = _kernel_arrays(p, layout, nm)
    inputs = [np.ascontiguousarray(arrays[n]).astype(npd) for n in nm.inputs]
    run.inputs = _received(arrays, {n: x.astype(np.float64) for n, x in zip(nm.inputs, inputs)},
                           p, layout, nm)
    run.no_grads = "NumPy has no automatic differentiation: forward only"
    if p.cu_seqlens is not None:    # packed sequences: the offsets as an int64 array
        scale_kw = {**scale_kw, "cu_seqlens": np.asarray(p.cu_seqlens, np.int64)}
    taken = _forward(run, lambda: kernel(*inputs, **scale_kw), p, layout, nm)
    if taken is None:
        return
    arrays_out, final = taken


def _run_jax(kernel, scale_kw, want_grads, run: KernelRun, nm: _Names):
    p, dtype, layout = run.inputs, run.dtype, run.layout
    import jax
    import jax.numpy as jnp

    jd = jnp.dtype(dtype)
    arrays = _kernel_arrays(p, layout, nm)
    inputs = [jnp.asarray(np.asarray(arrays[n]).astype(jd)) for n in nm.inputs]
    run.inputs = _received(arrays, {n: np.asarray(x).astype(np.float64)
                                    for n, x in zip(nm.inputs, inputs)}, p, layout, nm)

    if p.cu_seqlens is not None:    # packed sequences: the offsets (concrete int64) as the audit
        scale_kw = {**scale_kw, "cu_seqlens": np.asarray(p.cu_seqlens, np.int64)}

    def fn(*xs):
        return kernel(*xs, **scale_kw)

    pullbacks = []

    def forward():
        if want_grads and p.do is not None:
            out, pullback = jax.vjp(fn, *inputs)
            pullbacks.append(pullback)
            return out
        return fn(*inputs)

    taken = _forward(run, forward, p, layout, nm)
    if taken is None:
        return
    arrays_out, final = taken
    pullback = pullbacks[0] if pullbacks else None
    if pullback is None:
        run.no_grads = "gradients not asked for" if not want_grads else "the problem has no cotangent do"
        return
    cts = [jnp.asarray(arrays["do"]).astype(arrays_out[0].dtype)]
    if final:
        dh_T = arrays["dh_T"] if arrays["dh_T"] is not None else np.zeros(arrays_out[1].shape)
        cts.append(jnp.asarray(dh_T).astype(arrays_out[1].dtype))
    try:
        grads = pullback(tuple(cts) if final else cts[0])
    except (Exception, SystemExit) as exc:     # a kernel calling sys.exit fails, glaref goes on
        run.error = _error("backward", exc)
        return
    run.grads = {}
    for name, g in zip(nm.inputs, grads):
        run.dtypes[f"d{name}"] = dtype_name(g)
        run.grads[name] = _read(g, f"d{name}", nm.kinds[name], layout)


@dataclass(frozen=True)
class Call:
    """How :func:`run_kernel` calls a kernel, beyond the dtype its inputs are rounded to: the
    ``layout`` they are given in, the ``scale`` (passed when the kernel takes one), its
    ``framework`` ("torch", "numpy", "jax"; None: detected, :func:`detect_framework`), the torch
    ``device`` its inputs are put on (torch only; None: "cpu") and the recurrence ``family``
    whose arguments it takes (``glaref._audit._family.Family``; None: the scalar gate's)."""

    layout: str = "bhtd"
    scale: float = 1.0
    framework: str | None = None
    device: str | None = None
    family: Any = None


def check_framework(framework: str | None) -> None:
    """The one check of a ``framework`` argument: one of ``FRAMEWORKS`` or None (detected from
    the kernel's code); else AuditUsageError naming it."""
    if framework is not None and framework not in FRAMEWORKS:
        raise AuditUsageError(f"framework: got {framework!r}, expected one of {FRAMEWORKS} or None "
                              "(detected from the kernel's code)", argument="framework")


def check_device(device: str | None, framework: str) -> None:
    """The one check of a ``device`` argument: None, or any device for a torch kernel (torch
    itself refuses an unknown one); else AuditUsageError naming it."""
    if device is not None and framework != "torch":
        raise AuditUsageError(f"device: got {device!r} for a {framework} kernel, expected None "
                              "(torch kernels only)", argument="device")


def run_kernel(kernel: Callable, problem: Problem, dtype: str = "float32", *, grads: bool = True,
               call: Call = Call()) -> KernelRun:
    """Run ``kernel`` on ``problem`` (canonical float64, cotangents included) rounded to ``dtype``
    and called as ``call`` says (:class:`Call`); return what it gave (:class:`KernelRun`). Never
    raises for what the kernel does: an exception inside it, or outputs of the wrong structure,
    land in ``error``.

    grads: also run the backward pass (torch, JAX) with the problem's do and dh_T.
    Packed sequences (``problem.cu_seqlens``) reach the kernel as the keyword ``cu_seqlens=``
    (an int64 tensor on ``call.device`` for torch, an int64 NumPy array otherwise).
    ``family``'s problems (``problem`` one of them) for a family other than the scalar gate's
    (a ``glaref._inputs.Problem``).
    Bad arguments (an unknown framework, dtype or layout) raise ValueError naming them.
    """
    layout, framework, device, family = call.layout, call.framework, call.device, call.family
    scale = call.scale
    check_layout(layout)
    if dtype not in DTYPES:
        raise DTypeError(f"dtype: got {dtype!r}, expected one of {DTYPES}", argument="dtype")
    if not callable(kernel):
        raise TypeError(f"kernel: got {type(kernel).__name__}, expected a callable "
                        f"({', '.join(_names(family).inputs)}) -> o | (o, h_T)")
    check_framework(framework)
    fw = detect_framework(kernel) if framework is None else framework
    check_device(device, fw)
    scale_kw = {"scale": float(scale)} if accepts(kernel, "scale") else {}
    nm = _names(family)
    run = KernelRun(framework=fw, dtype=dtype, layout=layout, inputs=problem)
    if fw == "torch":
        _run_torch(kernel, scale_kw, grads, device or "cpu", run, nm)
    elif fw == "jax":
        _run_jax(kernel, scale_kw, grads, run, nm)
    else:
        _run_numpy(kernel, scale_kw, grads, run, nm)
    return run
