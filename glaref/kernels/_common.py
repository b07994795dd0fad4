"""What both JAX kernels share: validation, dtypes and the move to grouped, time-split arrays.

Inside the kernels every array is "bhtd" with the heads split into (group, head in group):

    q, k       (B, G, T, dk)          shared by the R = H // G heads of a group
    v, o, do   (B, G, R, T, dv)
    log_alpha  (B, G, R, T)           scalar gates
               (B, G, R, T, dk)       vector gates (the caller's log_alpha has rank 4)
    h0, h_T    (B, G, R, dk, dv)

so that a matmul with q or k runs once per group over all R heads at once, and nothing is
repeated over heads. Group g holds the contiguous heads g*R ... g*R + R - 1 (h // R == g).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._errors import DTypeError, LayoutError, ShapeError
from .._inputs import check_cu_seqlens

LAYOUTS = ("bhtd", "bthd")


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise LayoutError(f"layout: got {layout!r}, expected one of {LAYOUTS}")
    return layout


def check_precision(precision):
    """None, a ``jax.lax.Precision``, its name ('default', 'high', 'highest'), or a pair of them."""
    if precision is None or isinstance(precision, lax.Precision):
        return precision
    if isinstance(precision, str):
        try:
            return lax.Precision(precision)
        except ValueError:
            raise ValueError(f"precision: got {precision!r}, expected None, a jax.lax.Precision or one "
                             "of 'default', 'high', 'highest'") from None
    if isinstance(precision, tuple) and len(precision) == 2:
        return tuple(check_precision(p) for p in precision)
    raise ValueError(f"precision: got {precision!r}, expected None, a jax.lax.Precision or one of "
                     "'default', 'high', 'highest'")


def _check_float(x, name: str) -> None:
    dt = jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype
    if not jnp.issubdtype(dt, jnp.floating):
        raise DTypeError(f"{name}: got dtype {dt}, expected a real floating dtype "
                         "(float16, bfloat16, float32 or float64)")


def check_inputs(q, k, v, log_alpha, h0, layout: str,
                 n_states: int | None = None) -> tuple[int, int, int, int, int, int]:
    """Validate shapes and dtypes in the caller's layout; return (B, G, H, T, dk, dv).

    log_alpha of rank 3 is a scalar gate, of rank 4 a vector gate (B, H, T, dk). ``n_states``:
    the leading size h0 must have when it is not B (N packed sequences)."""
    check_layout(layout)
    bhtd = layout == "bhtd"
    qk_spell = "(B, G, T, dk)" if bhtd else "(B, T, G, dk)"
    v_spell = "(B, H, T, dv)" if bhtd else "(B, T, H, dv)"
    g_spell = "(B, H, T)" if bhtd else "(B, T, H)"
    gv_spell = "(B, H, T, dk)" if bhtd else "(B, T, H, dk)"
    for name, x in (("q", q), ("k", k), ("v", v), ("log_alpha", log_alpha), ("h0", h0)):
        if x is None and name != "h0":
            raise ShapeError(f"{name}: got None, expected an array")
        if x is not None:
            _check_float(x, name)
    for name, x, nd, spell in (("q", q, 4, qk_spell), ("k", k, 4, qk_spell), ("v", v, 4, v_spell)):
        if x.ndim != nd:
            raise ShapeError(f"{name}: got shape {tuple(x.shape)} ({x.ndim} dims), expected {nd} dims "
                             f"{spell}")
    if log_alpha.ndim not in (3, 4):
        raise ShapeError(f"log_alpha: got shape {tuple(log_alpha.shape)} ({log_alpha.ndim} dims), expected "
                         f"3 dims {g_spell} (scalar gate) or 4 dims {gv_spell} (vector gate)")
    if bhtd:
        B, G, T, dk = q.shape
        H, dv = v.shape[1], v.shape[3]
        v_exp, la_exp = (B, H, T, dv), (B, H, T)
        vB, vT = v.shape[0], v.shape[2]
    else:
        B, T, G, dk = q.shape
        H, dv = v.shape[2], v.shape[3]
        v_exp, la_exp = (B, T, H, dv), (B, T, H)
        vB, vT = v.shape[0], v.shape[1]
    if tuple(k.shape) != tuple(q.shape):
        raise ShapeError(f"k: got shape {tuple(k.shape)}, expected {tuple(q.shape)} {qk_spell} like q")
    if vB != B or vT != T:
        raise ShapeError(f"v: got shape {tuple(v.shape)}, expected {v_exp} {v_spell} with B={B} and "
                         f"T={T} from q")
    if G == 0 or H % G != 0:
        raise ShapeError(f"v: got H={H} heads, expected a multiple of q's G={G} groups")
    if log_alpha.ndim == 4:
        la_exp, g_spell = la_exp + (dk,), f"{gv_spell} (vector gate)"
    if tuple(log_alpha.shape) != la_exp:
        raise ShapeError(f"log_alpha: got shape {tuple(log_alpha.shape)}, expected {la_exp} {g_spell}")
    NS, ns = (B, "B") if n_states is None else (n_states, "N")
    if h0 is not None and tuple(h0.shape) != (NS, H, dk, dv):
        raise ShapeError(f"h0: got shape {tuple(h0.shape)}, expected {(NS, H, dk, dv)} ({ns}, H, dk, dv)")
    return B, G, H, T, dk, dv


def dtypes(q, k, v, log_alpha, h0):
    """(compute dtype, dtype of o).

    Compute dtype: the promotion of all inputs, at least float32 (bfloat16/float16 inputs are
    computed in float32; float64 inputs under jax x64 in float64). o comes back in the promotion
    of q, k and v (the "input dtype"); h_T in the compute dtype.
    """
    arrays = [x for x in (q, k, v, log_alpha, h0) if x is not None]
    cdt = jnp.promote_types(jnp.result_type(*[x.dtype for x in arrays]), jnp.float32)
    odt = jnp.result_type(q.dtype, k.dtype, v.dtype)
    return cdt, odt


def to_grouped(q, k, v, log_alpha, h0, G: int, layout: str, cdt):
    """Caller's layout -> grouped "bhtd" arrays in the compute dtype (see the module docstring)."""
    if layout == "bthd":
        q, k, v, log_alpha = (jnp.swapaxes(x, 1, 2) for x in (q, k, v, log_alpha))
    B, _, T, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    R = H // G
    q = q.astype(cdt)
    k = k.astype(cdt)
    v = v.astype(cdt).reshape(B, G, R, T, dv)
    log_alpha = log_alpha.astype(cdt).reshape((B, G, R) + log_alpha.shape[2:])
    if h0 is None:
        h0 = jnp.zeros((B, G, R, dk, dv), cdt)
    else:
        h0 = h0.astype(cdt).reshape(B, G, R, dk, dv)
    return q, k, v, log_alpha, h0


def v_like_to_grouped(x, G: int, layout: str, cdt):
    """do (caller's layout, shaped like o) -> (B, G, R, T, dv) in the compute dtype."""
    if layout == "bthd":
        x = jnp.swapaxes(x, 1, 2)
    B, H, T, dv = x.shape
    return x.astype(cdt).reshape(B, G, H // G, T, dv)


def v_like_from_grouped(x, layout: str):
    """(B, G, R, T, d) -> (B, H, T, d) or (B, T, H, d)."""
    B, G, R, T, d = x.shape
    x = x.reshape(B, G * R, T, d)
    return jnp.swapaxes(x, 1, 2) if layout == "bthd" else x


def gate_from_grouped(x, layout: str):
    """(B, G, R, T[, dk]) -> (B, H, T[, dk]) or (B, T, H[, dk])."""
    B, G, R = x.shape[:3]
    x = x.reshape((B, G * R) + x.shape[3:])
    return jnp.swapaxes(x, 1, 2) if layout == "bthd" else x


def qk_from_canonical(x, layout: str):
    return jnp.swapaxes(x, 1, 2) if layout == "bthd" else x


def state_from_grouped(x):
    B, G, R, dk, dv = x.shape
    return x.reshape(B, G * R, dk, dv)


def pad_time(x, axis: int, T_padded: int):
    """Zero-pad the time axis at the end up to ``T_padded``."""
    T = x.shape[axis]
    if T_padded == T:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, T_padded - T)
    return jnp.pad(x, widths)


# ---- packed sequences (cu_seqlens) -------------------------------------------------------------
#
# Both kernels run packed sequences as a batch: sequence n (steps cu[n]:cu[n+1] of the one batch
# row) becomes row n of a batch of N rows, zero-padded at its end to the longest length Lmax
# (padding steps have log_alpha = 0 and q = k = v = 0, so they change neither o nor the state nor
# any gradient), the kernel runs on that batch with h0 (N, H, dk, dv), and o is gathered back.
# Each sequence starts its own chunks at its first step, as production varlen kernels do. The
# gathers are ordinary JAX ops, so jax.vjp differentiates through them. Memory grows with
# N * Lmax rather than T: fine for a reference kernel, wasteful for a few very long sequences
# among many short ones.


def static_cu_seqlens(cu_seqlens, B: int, T: int) -> np.ndarray:
    """cu_seqlens as concrete int64 offsets, validated like the oracle's (errors name it)."""
    if isinstance(cu_seqlens, jax.core.Tracer):   # the offsets decide shapes: they must be known
        raise ValueError("cu_seqlens: got a traced array, expected concrete offsets (a numpy "
                         "array, a list or a JAX array created outside jit)")
    return check_cu_seqlens(cu_seqlens, B, T)


def _time_axis(layout: str) -> int:
    return 2 if layout == "bhtd" else 1


def _to_batch(x, axis: int, idx: np.ndarray, N: int, L: int):
    """(1, ..., T, ...) -> (N, ..., L, ...): row n holds steps idx[n] (T = a zero padding step)."""
    pad = jnp.zeros(x.shape[:axis] + (1,) + x.shape[axis + 1:], x.dtype)
    y = jnp.take(jnp.concatenate([x, pad], axis=axis), idx.reshape(-1), axis=axis)
    y = y.reshape(x.shape[:axis] + (N, L) + x.shape[axis + 1:])
    return jnp.moveaxis(y, axis, 0)[:, 0]


def _from_batch(y, axis: int, back: np.ndarray):
    """(N, ..., L, ...) -> (1, ..., T, ...): step t is row n, position j with n * L + j = back[t]."""
    y = jnp.moveaxis(y[:, None], 0, axis)
    y = y.reshape(y.shape[:axis] + (-1,) + y.shape[axis + 2:])
    return jnp.take(y, back, axis=axis)


def run_packed(fn, cu: np.ndarray, q, k, v, log_alpha, h0, *, layout: str,
               return_final_state: bool, **kw):
    """``fn`` (a kernel) on the N packed sequences of ``cu`` run as a batch (see above)."""
    T = q.shape[_time_axis(layout)]
    lens = np.diff(cu)
    N = len(lens)
    L = int(lens.max()) if N else 0
    j = np.arange(L)
    idx = np.where(j[None, :] < lens[:, None], cu[:-1, None] + j[None, :], T)
    back = np.concatenate([n * L + np.arange(m) for n, m in enumerate(lens)] + [np.zeros(0, int)])
    ax = _time_axis(layout)
    H, dv = (v.shape[1], v.shape[3]) if layout == "bhtd" else (v.shape[2], v.shape[3])
    dk = q.shape[3]
    batch = [_to_batch(x, ax, idx, N, L) for x in (q, k, v, log_alpha)]
    if N == 0:   # no sequence at all: o is empty and there is no state
        cdt, odt = dtypes(q, k, v, log_alpha, h0)
        o = jnp.zeros(v.shape, odt)
        return (o, jnp.zeros((0, H, dk, dv), cdt)) if return_final_state else o
    o, h_T = fn(*batch, h0, layout=layout, return_final_state=True, **kw)
    o = _from_batch(o, ax, back)
    return (o, h_T) if return_final_state else o
