"""Inputs and layouts: validation and canonicalisation, done once at the edge.

Everything inside glaref works on the canonical layout "bhtd" in float64:

    q, k       (B, G, T, dk)
    v          (B, H, T, dv)
    log_alpha  (B, H, T)        scalar gate: one decay per head and step
               (B, H, T, dk)    vector gate (GLA): one decay per key dimension
    h0, h_T    (B, H, dk, dv)   or (N, H, dk, dv) with cu_seqlens
    o, do      (B, H, T, dv)

The "bthd" layout (flash-linear-attention's and Mamba2's) puts time before heads:
q, k (B, T, G, dk); v, o, do (B, T, H, dv); log_alpha (B, T, H) or (B, T, H, dk); h0 and h_T
are the same in both layouts. The rank of log_alpha selects the gate kind, nothing else.

Packed sequences: ``cu_seqlens`` (N + 1 integer offsets 0 = c_0 <= c_1 <= ... <= c_N = T, with
B = 1) splits the time axis into N independent sequences [c_n, c_{n+1}); each starts from its
own h0[n] and ends in its own h_T[n]. Empty sequences are allowed.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._errors import ArgumentError, DTypeError, LayoutError, NonFiniteError, SeqlensError, ShapeError

LAYOUTS = ("bhtd", "bthd")

# glaref's names, defined here once and imported everywhere else
FORWARD = ("o", "h_T")                      # what the recurrence returns
GRADS = ("q", "k", "v", "log_alpha", "h0")  # a kernel's array arguments; their gradients' names
OUTPUTS = FORWARD + GRADS                   # every output judged: forward values, then gradients
ARRAYS = GRADS + ("do", "dh_T")             # the arrays of a Problem: inputs, then cotangents
DTYPES = ("float64", "float32", "bfloat16", "float16")   # the dtypes a kernel's inputs may have

# Float dtypes that numpy does not know natively but ml_dtypes (via jax) adds.
_EXTRA_FLOAT_NAMES = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz",
                      "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e3m4", "float8_e4m3",
                      "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"}


@dataclass(frozen=True)
class Dims:
    """Sizes of one problem. ``H // G`` heads share each group of q and k."""

    B: int
    G: int
    H: int
    T: int
    dk: int
    dv: int


class Problem(NamedTuple):
    """Canonical float64 "bhtd" arrays of one problem (cotangents may be None)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    log_alpha: np.ndarray
    h0: np.ndarray
    do: np.ndarray | None
    dh_T: np.ndarray | None
    dims: Dims
    cu_seqlens: np.ndarray | None = None   # int64 (N + 1,) offsets of packed sequences, B = 1

    @property
    def vector_gate(self) -> bool:
        """True when log_alpha is (B, H, T, dk): one decay per key dimension."""
        return is_vector_gate(self.log_alpha)

    @property
    def n_states(self) -> int:
        """The leading size of h0 and h_T: B, or N with packed sequences."""
        return self.dims.B if self.cu_seqlens is None else len(self.cu_seqlens) - 1

    def with_fields(self, **changes) -> Problem:
        """This problem with ``changes`` replaced (``_replace``, the name every family's
        problem answers to: ``glaref.delta._oracle.DeltaProblem.with_fields``)."""
        return self._replace(**changes)


# how each array (ARRAYS and OUTPUTS) moves between layouts: to_canonical's ``kind``
_KIND = {"q": "qk", "k": "qk", "v": "v", "do": "v", "o": "v", "log_alpha": "gate",
         "h0": "state", "dh_T": "state", "h_T": "state"}


def is_vector_gate(log_alpha) -> bool:
    """The gate kind from the rank of a canonical log_alpha: (B, H, T) scalar, (B, H, T, dk) vector."""
    return np.ndim(log_alpha) == 4


def sequences(cu_seqlens: np.ndarray | None, B: int, T: int) -> list[tuple[int, int, int]]:
    """(batch row, first step, end step) of every independent sequence: the B rows of a batch,
    or the N packed sequences of row 0. The index in this list is the state index (h0, h_T)."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    return [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]


def check_cu_seqlens(cu_seqlens: Any, B: int, T: int) -> np.ndarray | None:
    """Validate packed-sequence offsets; return them as a contiguous int64 array (or None).

    Expected: a 1-D integer array of N + 1 >= 1 offsets, starting at 0, nondecreasing, ending at
    T, with B = 1. Errors name cu_seqlens, what it got and the first bad position.
    """
    if cu_seqlens is None:
        return None
    mod = type(cu_seqlens).__module__ or ""
    if mod.startswith("torch") and hasattr(cu_seqlens, "detach"):
        t = cu_seqlens.detach()
        if t.is_floating_point() or t.is_complex():
            raise DTypeError(f"cu_seqlens: got dtype {t.dtype}, expected an integer dtype "
                             "(int32 or int64 offsets)", argument="cu_seqlens")
        a = t.cpu().numpy()
    else:
        try:
            a = np.asarray(cu_seqlens)
        except Exception as exc:  # pragma: no cover - exotic array-likes
            raise DTypeError(f"cu_seqlens: could not convert {_describe(cu_seqlens)} to an array: "
                             f"{exc}", argument="cu_seqlens") from exc
    if a.dtype.kind not in "iu":
        raise DTypeError(f"cu_seqlens: got dtype {a.dtype}, expected an integer dtype "
                         "(int32 or int64 offsets)", argument="cu_seqlens")
    if a.ndim != 1 or a.size == 0:
        raise ShapeError(f"cu_seqlens: got shape {a.shape}, expected (N + 1,) offsets with N >= 0",
                         argument="cu_seqlens")
    if B != 1:
        raise ShapeError(f"cu_seqlens: given with B={B} batch rows, expected B=1 (the packed "
                         "sequences lie along the time axis of one row)", argument="cu_seqlens")
    a = np.ascontiguousarray(a, dtype=np.int64)
    shown = a.tolist() if a.size <= 12 else a[:12].tolist() + ["..."]
    if a[0] != 0:
        raise SeqlensError(f"cu_seqlens: got {shown}, expected offsets starting at 0: "
                           f"cu_seqlens[0] = {int(a[0])}", argument="cu_seqlens")
    dec = np.flatnonzero(a[1:] < a[:-1])
    if dec.size:
        i = int(dec[0]) + 1
        raise SeqlensError(f"cu_seqlens: got {shown}, expected nondecreasing offsets: "
                           f"cu_seqlens[{i}] = {int(a[i])} < cu_seqlens[{i - 1}] = {int(a[i - 1])}",
                           argument="cu_seqlens")
    if a[-1] != T:
        big = np.flatnonzero(a > T)
        i = int(big[0]) if big.size else a.size - 1
        raise SeqlensError(f"cu_seqlens: got {shown}, expected offsets ending at T={T}: "
                           f"cu_seqlens[{i}] = {int(a[i])}", argument="cu_seqlens")
    return a


def check_layout(layout: str) -> str:
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise LayoutError(f"layout: got {layout!r}, expected one of {LAYOUTS}", argument="layout")
    return layout


def check_flag(x: Any, name: str) -> bool:
    """A yes/no argument: True or False (numpy's bools too), never a merely truthy value."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise ArgumentError(f"{name}: got {x!r} ({type(x).__name__}), expected True or False", argument=name)


def whole_number(x: Any) -> int | None:
    """``x`` as an int when it is one: an int, a numpy integer or a string of digits (with an
    optional sign); None for anything else, bools and floats included (a float would be
    truncated). The callers word their own error."""
    if isinstance(x, str):
        try:
            return int(x.strip())
        except ValueError:
            return None
    if isinstance(x, (bool, np.bool_)):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def check_scale(scale: Any) -> float:
    """``scale`` as a finite float: a real number (Python or numpy int or float, or a 0-d real
    array), not a string, a bool or a complex number, and finite in float64."""
    if isinstance(scale, int) and not isinstance(scale, bool):
        try:
            s = float(scale)                    # a Python int of any size
        except OverflowError:
            raise NonFiniteError(f"scale: got an integer of {scale.bit_length()} bits, expected "
                                 "a finite float64 number (|scale| < 1.8e308)", argument="scale") from None
    else:
        a = None
        if not isinstance(scale, (str, bytes, bool, np.bool_)):
            try:
                a = np.asarray(scale)
            except Exception:  # noqa: BLE001 - anything numpy cannot read is not a number
                a = None
        if a is None or a.ndim != 0 or not (a.dtype.kind in "iu" or is_real_float(a.dtype)):
            raise DTypeError(f"scale: got {scale!r} ({_describe(scale)}), expected a real number",
                             argument="scale")
        s = float(a)
    if not math.isfinite(s):
        raise NonFiniteError(f"scale: got {s}, expected a finite number", argument="scale")
    return s


def _describe(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__name__}"


def to_float64(x: Any, name: str) -> np.ndarray:
    """Convert any real floating array-like (numpy, JAX, torch CPU, lists) exactly to float64.

    Every real float format (float16, bfloat16, float32, ...) is a subset of float64, so the
    conversion is exact. Integers, booleans and complex numbers are refused: a kernel's inputs
    are floating point, and silently accepting ints hides a caller's bug.
    """
    if isinstance(x, np.ma.MaskedArray):
        if np.ma.is_masked(x):
            raise DTypeError(f"{name}: got a masked array with {int(np.ma.count_masked(x))} masked "
                             "element(s), expected plain values (glaref does not read masks: "
                             f"fill them first, e.g. {name}.filled(0.0))", argument=name)
        a = np.asarray(x.data)
    elif isinstance(x, np.ndarray):
        a = x
    else:
        # torch tensors: bfloat16 has no numpy equivalent, so widen on the torch side
        # (exact) by duck typing; torch itself is never imported here.
        mod = type(x).__module__ or ""
        if mod.startswith("torch") and hasattr(x, "detach"):
            t = x.detach()
            if getattr(t, "device", None) is not None and str(t.device) != "cpu":
                raise DTypeError(f"{name}: got a torch tensor on {t.device}, expected a CPU tensor "
                                 "(call .cpu() first)", argument=name)
            if t.is_complex():
                raise DTypeError(f"{name}: got dtype {t.dtype}, expected a real floating dtype",
                                 argument=name)
            if not t.is_floating_point():
                raise DTypeError(f"{name}: got dtype {t.dtype}, expected a real floating dtype "
                                 "(float16, bfloat16, float32 or float64)", argument=name)
            t = t.double()
            a = t.numpy()
        else:
            try:
                a = np.asarray(x)
            except Exception as exc:  # pragma: no cover - exotic array-likes
                raise DTypeError(f"{name}: could not convert {_describe(x)} to an array: {exc}",
                                 argument=name) from exc
            if a.dtype == object and hasattr(x, "__dlpack__"):
                # an array that speaks only DLPack (no __array__): take it zero-copy on the CPU
                try:
                    a = np.from_dlpack(x)
                except Exception as exc:
                    raise DTypeError(f"{name}: could not read {_describe(x)} through DLPack: {exc}",
                                     argument=name) from exc
    dt = a.dtype
    if dt.kind == "O":
        raise DTypeError(f"{name}: got {_describe(x)} (dtype object), expected a real floating "
                         "array (float16, bfloat16, float32 or float64)", argument=name)
    if is_real_float(dt):
        # np.asarray, not np.ascontiguousarray: the latter turns a 0-d array into shape (1,)
        return np.asarray(a, dtype=np.float64, order="C")
    raise DTypeError(f"{name}: got dtype {dt}, expected a real floating dtype "
                     "(float16, bfloat16, float32 or float64)", argument=name)


def is_real_float(dtype: Any) -> bool:
    """Is ``dtype`` a real floating format (numpy's float16/32/64 or an ml_dtypes one)?"""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        # a dtype numpy cannot name (a torch or jax dtype object): go by its name
        name = str(dtype).rsplit(".", 1)[-1]
        return name in _EXTRA_FLOAT_NAMES or name in ("float16", "float32", "float64")
    return dt.kind == "f" or dt.name in _EXTRA_FLOAT_NAMES


def output_problem(name: str, x: Any, shape: tuple[int, ...], layout: str | None = None) -> str | None:
    """Why a kernel's output ``name`` (an array of any framework, or jax.eval_shape's leaf) is not
    a real floating array of ``shape``, or None: the one check of what kernels return."""
    where = f" ({layout})" if layout else ""
    if x is None or not hasattr(x, "shape") or not hasattr(x, "dtype"):
        return f"{name}: got {type(x).__name__}, expected an array of shape {shape}{where}"
    if tuple(x.shape) != tuple(shape):
        return f"{name}: got shape {tuple(x.shape)}, expected {tuple(shape)}{where}"
    if not is_real_float(x.dtype):
        return (f"{name}: got dtype {x.dtype}, expected a real floating dtype (float16, bfloat16, "
                "float32 or float64)")
    return None


def shape_in(layout: str, kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape in ``layout`` of an array of ``kind`` (``_KIND``) whose canonical shape is
    ``shape``: time and heads swapped in "bthd", states the same in both layouts."""
    if layout == "bhtd" or kind == "state":
        return tuple(shape)
    s = list(shape)
    s[1], s[2] = s[2], s[1]
    return tuple(s)


def kernel_returns(out: Any, dims: Dims, layout: str,
                   n_states: int | None = None) -> tuple[list, bool, str | None]:
    """(the arrays returned, returns h_T?, why the return value is wrong or None) for a kernel's
    return value ``o`` or ``(o, h_T)`` (any framework's arrays, or jax.eval_shape's leaves): the
    one check of its structure. n_states: h_T's leading size (B, or N packed sequences)."""
    if out is None:
        return [], False, "kernel returned None, expected o or (o, h_T)"
    if isinstance(out, (tuple, list)):
        if len(out) != 2:
            return list(out), False, f"kernel returned {len(out)} values, expected o or (o, h_T)"
        arrays, final = list(out), True
    else:
        arrays, final = [out], False
    shapes = (shape_in(layout, _KIND["o"], (dims.B, dims.H, dims.T, dims.dv)),
              (dims.B if n_states is None else n_states, dims.H, dims.dk, dims.dv))
    for name, x, shape in zip(FORWARD, arrays, shapes):
        problem = output_problem(name, x, shape, layout if name == "o" else None)
        if problem is not None:
            return arrays, final, problem
    return arrays, final, None


def _check_ndim(a: np.ndarray, name: str, ndim: int, expected: str) -> None:
    if a.ndim != ndim:
        raise ShapeError(f"{name}: got shape {a.shape} ({a.ndim} dims), expected {ndim} dims {expected}",
                         argument=name)


def _check_shape(a: np.ndarray, name: str, expected: tuple[int, ...], spelled: str) -> None:
    if a.shape != expected:
        raise ShapeError(f"{name}: got shape {a.shape}, expected {expected} {spelled}", argument=name)


def _check_finite(a: np.ndarray, name: str) -> None:
    if a.size and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise NonFiniteError(f"{name}: got a non-finite value {float(a[tuple(bad)])!r} at index "
                             f"{tuple(int(i) for i in bad)}, "
                             "expected finite values (pass allow_nonfinite=True to accept)", argument=name)


def _fits(q_shape, k_shape, v_shape, layout: str) -> bool:
    """Do q, k and v (4-d shapes as given) agree on B, T and the head grouping in ``layout``?"""
    if tuple(k_shape) != tuple(q_shape):
        return False
    if layout == "bthd":
        q_shape, v_shape = ((s[0], s[2], s[1], s[3]) for s in (q_shape, v_shape))
    B, G, T, _ = q_shape
    return v_shape[0] == B and v_shape[2] == T and G > 0 and v_shape[1] % G == 0


def _check_not_transposed(q_shape, k_shape, v_shape, layout: str) -> None:
    """Arrays that disagree in ``layout`` but agree in the other one were given in the other
    layout: say so, rather than blame whichever argument is checked first."""
    other = "bthd" if layout == "bhtd" else "bhtd"
    if not _fits(q_shape, k_shape, v_shape, layout) and _fits(q_shape, k_shape, v_shape, other):
        raise LayoutError(f"layout: got {layout!r}, but q {tuple(q_shape)}, k {tuple(k_shape)} and "
                          f"v {tuple(v_shape)} fit {other!r} and not {layout!r}: the arrays look "
                          f"transposed (pass layout={other!r}, or swap their axes 1 and 2)",
                          argument="layout")


def _check_state_not_transposed(x: np.ndarray, name: str, qkv_shapes, layout: str,
                                want: tuple[int, ...], T: int) -> None:
    """A state (h0, dh_T) with T heads instead of H, while q, k and v also fit the other layout:
    with G = H, q, k, v and log_alpha fit both layouts and only the state tells them apart."""
    other = "bthd" if layout == "bhtd" else "bhtd"
    if (x.ndim == 4 and x.shape != want and x.shape == (want[0], T, *want[2:])
            and _fits(*qkv_shapes, other)):
        q_shape, k_shape, v_shape = qkv_shapes
        raise LayoutError(f"layout: got {layout!r}, but q {tuple(q_shape)}, k {tuple(k_shape)}, v "
                          f"{tuple(v_shape)} and {name} {x.shape} fit {other!r} and not {layout!r}: "
                          f"the arrays look transposed (pass layout={other!r}, or swap axes 1 and "
                          f"2 of q, k, v and log_alpha)", argument="layout")


def to_canonical(a: np.ndarray, kind: str, layout: str) -> np.ndarray:
    """Move one array from ``layout`` to "bhtd". kind: 'qk', 'v', 'gate' or 'state'."""
    if layout == "bhtd" or kind == "state":
        return a
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))


def from_canonical(a: np.ndarray, kind: str, layout: str) -> np.ndarray:
    """Move one array from "bhtd" to ``layout`` (the inverse of :func:`to_canonical`)."""
    if layout == "bhtd" or kind == "state":
        return a
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))


def canonicalize(q, k, v, log_alpha, h0=None, do=None, dh_T=None, *, layout: str = "bhtd",
                 allow_nonfinite: bool = False, need_do: bool = False,
                 cu_seqlens=None) -> Problem:
    """Validate the inputs, convert them to float64 and move them to the "bhtd" layout.

    log_alpha of rank 3 is a scalar gate, of rank 4 a vector gate (one decay per key dimension).
    With ``cu_seqlens`` (packed sequences, B = 1) h0 and dh_T are (N, H, dk, dv).
    """
    check_layout(layout)
    allow_nonfinite = check_flag(allow_nonfinite, "allow_nonfinite")
    bhtd = layout == "bhtd"
    qk_spell = "(B, G, T, dk)" if bhtd else "(B, T, G, dk)"
    v_spell = "(B, H, T, dv)" if bhtd else "(B, T, H, dv)"
    g_spell = "(B, H, T)" if bhtd else "(B, T, H)"
    gv_spell = "(B, H, T, dk)" if bhtd else "(B, T, H, dk)"

    q = to_float64(q, "q")
    k = to_float64(k, "k")
    v = to_float64(v, "v")
    log_alpha = to_float64(log_alpha, "log_alpha")
    _check_ndim(q, "q", 4, qk_spell)
    _check_ndim(k, "k", 4, qk_spell)
    _check_ndim(v, "v", 4, v_spell)
    if log_alpha.ndim not in (3, 4):
        raise ShapeError(f"log_alpha: got shape {log_alpha.shape} ({log_alpha.ndim} dims), expected "
                         f"3 dims {g_spell} (scalar gate) or 4 dims {gv_spell} (vector gate)",
                         argument="log_alpha")
    vector = log_alpha.ndim == 4
    _check_not_transposed(q.shape, k.shape, v.shape, layout)
    given = (q.shape, k.shape, v.shape)
    q = to_canonical(q, "qk", layout)
    k = to_canonical(k, "qk", layout)
    v = to_canonical(v, "v", layout)
    log_alpha = to_canonical(log_alpha, "gate", layout)

    B, G, T, dk = q.shape
    H, dv = v.shape[1], v.shape[3]

    def back(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
        # a canonical shape spelled in the caller's layout, for error messages
        if bhtd or kind == "state":
            return shape
        s = list(shape)
        s[1], s[2] = s[2], s[1]
        return tuple(s)

    if k.shape != q.shape:
        raise ShapeError(f"k: got shape {back(k.shape, 'qk')}, expected {back(q.shape, 'qk')} "
                         f"{qk_spell} like q", argument="k")
    if v.shape[0] != B or v.shape[2] != T:
        raise ShapeError(f"v: got shape {back(v.shape, 'v')}, expected {back((B, H, T, dv), 'v')} {v_spell} "
                         f"with B={B} and T={T} from q", argument="v")
    if G == 0 or H % G != 0:
        raise ShapeError(f"v: got H={H} heads, expected a multiple of q's G={G} groups", argument="v")
    la_shape, la_spell = ((B, H, T, dk), f"{gv_spell} (vector gate)") if vector else ((B, H, T), g_spell)
    if log_alpha.shape != la_shape:
        raise ShapeError(f"log_alpha: got shape {back(log_alpha.shape, 'gate')}, expected "
                         f"{back(la_shape, 'gate')} {la_spell}", argument="log_alpha")
    cu = check_cu_seqlens(cu_seqlens, B, T)
    NS, ns_spell = (B, "B") if cu is None else (len(cu) - 1, "N")
    st_spell = f"({ns_spell}, H, dk, dv)"
    if h0 is None:
        h0 = np.zeros((NS, H, dk, dv))
    else:
        h0 = to_float64(h0, "h0")
        _check_state_not_transposed(h0, "h0", given, layout, (NS, H, dk, dv), T)
        _check_shape(h0, "h0", (NS, H, dk, dv), st_spell)
    if do is not None:
        do = to_float64(do, "do")
        _check_ndim(do, "do", 4, v_spell)
        do = to_canonical(do, "v", layout)
        if do.shape != (B, H, T, dv):
            raise ShapeError(f"do: got shape {back(do.shape, 'v')}, expected "
                             f"{back((B, H, T, dv), 'v')} {v_spell} like o", argument="do")
    elif need_do:
        raise ShapeError("do: got None, expected the cotangent of o", argument="do")
    if dh_T is not None:
        dh_T = to_float64(dh_T, "dh_T")
        _check_state_not_transposed(dh_T, "dh_T", given, layout, (NS, H, dk, dv), T)
        _check_shape(dh_T, "dh_T", (NS, H, dk, dv), f"{st_spell} like h_T")

    if not allow_nonfinite:
        for name, a in (("q", q), ("k", k), ("v", v), ("log_alpha", log_alpha), ("h0", h0),
                        ("do", do), ("dh_T", dh_T)):
            if a is not None:
                # report the index in the caller's layout
                _check_finite(from_canonical(a, _KIND[name], layout), name)
    return Problem(q, k, v, log_alpha, h0, do, dh_T, Dims(B, G, H, T, dk, dv), cu)
