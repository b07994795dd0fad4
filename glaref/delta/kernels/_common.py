"""What both delta-rule kernels share: validation (the scalar family's checks plus beta), the
move to grouped arrays in the compute dtype, and packed sequences.

Inside the kernels every array is "bhtd" with the heads split into (group, head in group), as in
``glaref.kernels._common``:

    q, k       (B, G, T, dk)          shared by the R = H // G heads of a group
    v, o, do   (B, G, R, T, dv)
    beta       (B, G, R, T)
    log_alpha  (B, G, R, T)           scalar gate (GDN)
               (B, G, R, T, dk)       vector gate (KDA)
    h0, h_T    (B, G, R, dk, dv)

The layout change, the dtype change and the zero padding of the time axis are plain JAX
operations outside each kernel's ``jax.custom_vjp`` core: jax.vjp transposes them (a reshape, a
transpose, a cast, a slice), and the core sees and keeps only grouped arrays.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..._errors import ShapeError
from ...kernels import _common as kc


def check_inputs(q, k, v, beta, log_alpha, h0, layout: str,
                 n_states: int | None = None) -> tuple[int, int, int, int, int, int]:
    """Validate every array in the caller's layout; return (B, G, H, T, dk, dv). beta has the
    shape of a scalar gate: (B, H, T) in "bhtd", (B, T, H) in "bthd"."""
    dims = kc.check_inputs(q, k, v, log_alpha, h0, layout, n_states)
    B, G, H, T, dk, dv = dims
    if beta is None:
        raise ShapeError("beta: got None, expected an array")
    kc._check_float(beta, "beta")
    want, spell = ((B, H, T), "(B, H, T)") if layout == "bhtd" else ((B, T, H), "(B, T, H)")
    if tuple(beta.shape) != want:
        raise ShapeError(f"beta: got shape {tuple(beta.shape)}, expected {want} {spell} like a "
                         "scalar gate")
    return dims


def dtypes(q, k, v, beta, log_alpha, h0):
    """(compute dtype, dtype of o): the promotion of every input, at least float32; o in the
    promotion of q, k and v (as ``glaref.kernels``)."""
    arrays = [x for x in (q, k, v, beta, log_alpha, h0) if x is not None]
    cdt = jnp.promote_types(jnp.result_type(*[x.dtype for x in arrays]), jnp.float32)
    return cdt, jnp.result_type(q.dtype, k.dtype, v.dtype)


def to_grouped(q, k, v, beta, log_alpha, h0, G: int, layout: str, cdt):
    """Caller's layout -> grouped "bhtd" arrays in the compute dtype; h0 None -> zeros."""
    if layout == "bthd":
        beta = jnp.swapaxes(beta, 1, 2)
    B, H, T = beta.shape
    qg, kg, vg, lag, S0 = kc.to_grouped(q, k, v, log_alpha, h0, G, layout, cdt)
    return qg, kg, vg, beta.astype(cdt).reshape(B, G, H // G, T), lag, S0


def pad(q, k, v, beta, log_alpha, Tp: int):
    """Zero-pad the grouped arrays' time axis to Tp. A padding step (beta = 0, log_alpha = 0,
    q = k = v = 0) leaves the state unchanged and has o = 0, so it changes no output and no
    gradient of a real step."""
    return (kc.pad_time(q, 2, Tp), kc.pad_time(k, 2, Tp), kc.pad_time(v, 3, Tp),
            kc.pad_time(beta, 3, Tp), kc.pad_time(log_alpha, 3, Tp))


def run(core, cfg, q, k, v, beta, log_alpha, h0, *, layout: str, G: int, steps: int):
    """(o, h_T) in the caller's layout: the inputs grouped, cast and padded to a multiple of
    ``steps`` (at least one block), ``core(cfg, q, k, v, beta, log_alpha, S0) -> (O, h_T)``
    on them, and o cut back to T steps."""
    cdt, odt = dtypes(q, k, v, beta, log_alpha, h0)
    qg, kg, vg, bg, lag, S0 = to_grouped(q, k, v, beta, log_alpha, h0, G, layout, cdt)
    T = qg.shape[2]
    Tp = max(-(-T // steps), 1) * steps
    O, h_T = core(cfg, *pad(qg, kg, vg, bg, lag, Tp), S0)
    o = kc.v_like_from_grouped(O[:, :, :, :T], layout).astype(odt)
    return o, kc.state_from_grouped(h_T)


def run_packed(fn, cu: np.ndarray, q, k, v, beta, log_alpha, h0, *, layout: str,
               return_final_state: bool, **kw):
    """``fn`` (a delta kernel) on the N packed sequences of ``cu``, run as a batch of N rows
    zero-padded to the longest (``glaref.kernels._common.run_packed``, with beta)."""
    T = q.shape[2 if layout == "bhtd" else 1]
    ax = 2 if layout == "bhtd" else 1
    lens = np.diff(cu)
    N = len(lens)
    H, dv = (v.shape[1], v.shape[3]) if layout == "bhtd" else (v.shape[2], v.shape[3])
    if N == 0:   # no sequence: o is empty and there is no state
        cdt, odt = dtypes(q, k, v, beta, log_alpha, h0)
        o = jnp.zeros(v.shape, odt)
        return (o, jnp.zeros((0, H, q.shape[3], dv), cdt)) if return_final_state else o
    L = int(lens.max())
    j = np.arange(L)
    idx = np.where(j[None, :] < lens[:, None], cu[:-1, None] + j[None, :], T)
    back = np.concatenate([n * L + np.arange(m) for n, m in enumerate(lens)] + [np.zeros(0, int)])
    batch = [kc._to_batch(x, ax, idx, N, L) for x in (q, k, v, beta, log_alpha)]
    o, h_T = fn(*batch, h0, layout=layout, return_final_state=True, **kw)
    o = kc._from_batch(o, ax, back)
    return (o, h_T) if return_final_state else o
