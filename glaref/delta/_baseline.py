"""The gated delta rule's same-precision reference kernels: the error a correct kernel makes,
measured on the same inputs.

The calibrated verdict compares a kernel's error on each output with the error that *correct*
kernels of the recurrence make on exactly the same inputs in the same arithmetic. These are those
kernels for the delta family (docs/math_delta.md), evaluated by Numba
(``glaref.delta._baseline_numba``) so that they need neither JAX nor torch, sum in one fixed order
on every machine (no BLAS), and share no code with any kernel under audit, glaref's own JAX
kernels (``glaref.delta.kernels``) included.

``scan``     the recurrence step by step, decay first (docs/math_delta.md, section 1):
             S~_t = A_t S_{t-1}, r_t = v_t - S~_t^T k_t, u_t = beta_t r_t, S_t = S~_t + k_t u_t^T,
             o_t = scale S_t^T q_t; and the reverse-time adjoint of section 2 (G_t, dq_t, du_t,
             dv_t, dbeta_t, dk_t, dS~_t, dlog_alpha_t = <S~_t, dS~_t> in the direct form,
             C_{t-1} = A_t dS~_t), the states recomputed from checkpoints. One rounding of the
             state per step: the sequential accumulation of T steps. Every dot product (over
             dk, dv, and the dk dv terms of dlog_alpha's <S~_t, dS~_t>) sums in ``order``:
             "lanes" (the default, eight interleaved partial sums combined in a fixed tree, as
             a scan kernel's vectorised reductions accumulate) or "sequential" (one term after
             another, the loosest order a compiler uses: a field design).
``chunked``  the WY / UT chunked form the field ships (flash-linear-attention's
             chunk_gated_delta_rule and chunk_kda; docs/math_delta.md, section 8): per chunk of C
             steps (the last one shorter), the unit lower triangular system
             (I + L) with L_ij = beta_i sum_d k_i[d] k_j[d] E_ij[d] (j < i) inverted by forward
             substitution into T, W = T diag(beta) (K o exp(b)), U~ = T diag(beta) V,
             U = U~ - W S, o = scale ((Q o exp(b)) S + A U), S_next = diag(exp(b_last)) S +
             (K o exp(b_last - b))^T U, the state handed from chunk to chunk; and the backward of
             these formulas written by hand (``_baseline_numba``).

Designs (``glaref.delta._designs``). ``decay`` "segment_sums" forms every exponent of a chunk as a
sum of gates over its own segment and dlog_alpha in the direct form (each decay factor's
cotangent added to the gates of its segment: glaref's kernels); "chunk_cumsum" forms every
exponent as the difference of the chunk-local cumulative sum b rounded once per step, and
dlog_alpha through that cumulative sum (a reverse cumulative sum of db within the chunk, whose
pairs cancel): flash-linear-attention's chunk_local_cumsum forward and reverse, and what autodiff
of such a forward gives. Its errors grow with the chunk's total decay, never with T.

Arithmetic. ``arith`` is the dtype every operation is carried out in: float32 for float32,
tf32, bfloat16 and float16 kernels that accumulate in float32; float64 for float64 kernels (and
the trust tests). ``operand`` ("tf32", "bfloat16", "float16" or None) rounds every
matrix-product operand first, as ``glaref.gla._baseline`` does. Every exp is computed in float64 and
rounded (the same on every machine). The caller rounds inputs to the kernel's dtype before and
each returned output to the kernel's output dtype after.

Both kernels take a canonical ``glaref.delta._oracle.DeltaProblem`` and return float64 arrays of
the values they computed. Nothing here is an oracle: these kernels *make* rounding errors on
purpose.
"""

from __future__ import annotations

import numpy as np

from ..gla._baseline import ROUNDINGS, per_sequence
from ._oracle import DeltaProblem

__all__ = ["ARITHS", "CHUNK", "DECAY_FORMS", "DEFAULT_ORDER", "KERNELS", "ORDERS", "run"]

KERNELS = ("scan", "chunked")
CHUNK = 64            # the chunked reference's chunk, what production kernels use
DECAY_FORMS = ("segment_sums", "chunk_cumsum")
ARITHS = ("float32", "float64")
# the order a dot product sums in (``glaref.gla._baseline_scan.dot``, as in glaref.gla._baseline):
# eight interleaved partial sums combined in a fixed tree, or one term after another; each kernel
# has its own (``DEFAULT_ORDER``): the scan sums in lanes (how a scan kernel's vectorised
# reductions accumulate), the chunked form sequentially (rows of axpys and dots one term after
# another, the only order it has)
ORDERS = ("lanes", "sequential")
DEFAULT_ORDER = {"scan": "lanes", "chunked": "sequential"}
# every mode number of glaref.gla._baseline_scan.rnd
_MODE = {None: 0, "tf32": 1, "bfloat16": 2, "float16": 3}


def _scan(qh, kh, v, beta, alpha, h0, do, dh_T, scale, mode, grads, chunk, decay, order):
    from . import _baseline_numba as nb

    od = ORDERS.index(order)
    o, h_T = nb.scan_forward(qh, kh, v, beta, alpha, h0, scale, mode, od)
    if not grads:
        return o, h_T
    return (o, h_T) + nb.scan_vjp(qh, kh, v, beta, alpha, h0, do, dh_T, scale, mode, od)


def _chunked(qh, kh, v, beta, la, h0, do, dh_T, scale, mode, grads, chunk, decay, order):
    from . import _baseline_numba as nb

    form = DECAY_FORMS.index(decay)
    o, h_T = nb.chunked_forward(qh, kh, v, beta, la, h0, scale, mode, chunk, form)
    if not grads:
        return o, h_T
    return (o, h_T) + nb.chunked_vjp(qh, kh, v, beta, la, h0, do, dh_T, scale, mode, chunk,
                                     form)


_IMPLS = {"scan": _scan, "chunked": _chunked}


def run(kernel: str, dp: DeltaProblem, scale: float, *, arith: str = "float32",
        operand: str | None = None, storage: str | None = None, grads: bool = True,
        chunk: int = CHUNK, decay: str = "segment_sums",
        order: str | None = None) -> dict[str, np.ndarray]:
    """Run the reference kernel ``kernel`` ("scan" or "chunked", the latter with chunks of
    ``chunk`` steps and decays of form ``decay``, ``DECAY_FORMS``) in ``arith`` (``ARITHS``)
    with matrix-product operands rounded to ``operand``, every dot product summed in ``order``
    (``ORDERS``; None: the kernel's own, ``DEFAULT_ORDER``; the chunked form has "sequential"
    alone), on canonical problem ``dp``. ``storage`` (16-bit accumulation) must be None: the
    keywords are ``glaref.gla._baseline.run``'s, so that a ``glaref._audit._designs.Design`` drives both
    families.

    Returns float64 arrays under the family's output names: o, h_T and, with ``grads`` (``do``
    required; ``dh_T=None`` means the loss has no h_T term), q, k, v, beta, log_alpha, h0: each
    gradient named by its input, dq and dk summed over each group's heads in head order.
    Packed sequences (``dp.p.cu_seqlens``, B = 1) run every sequence on its own, from h0[n] to
    h_T[n]: packed equals one by one, to the last bit.

    Raises ValueError naming the argument for an unknown kernel, arith, operand, storage,
    decay, order or chunk.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: got {kernel!r}, expected one of {KERNELS}")
    if arith not in ARITHS:
        raise ValueError(f"arith: got {arith!r}, expected one of {ARITHS}")
    if operand is not None and operand not in ROUNDINGS:
        raise ValueError(f"operand: got {operand!r}, expected None or one of {ROUNDINGS}")
    if storage is not None:
        raise ValueError(f"storage: got {storage!r}, expected None (the delta family's reference "
                         "kernels accumulate in arith)")
    if order is None:
        order = DEFAULT_ORDER.get(kernel, "sequential")
    if order not in ORDERS or (kernel == "chunked" and order != "sequential"):
        allowed = ORDERS if kernel == "scan" else ("sequential",)
        raise ValueError(f"order: got {order!r}, expected None or one of {allowed} for the "
                         f"{kernel} kernel")
    if decay not in DECAY_FORMS:
        raise ValueError(f"decay: got {decay!r}, expected one of {DECAY_FORMS}")
    if not isinstance(chunk, (int, np.integer)) or isinstance(chunk, bool) or chunk < 1:
        raise ValueError(f"chunk: got {chunk!r}, expected a positive integer")
    p = dp.p
    if grads and p.do is None:
        raise ValueError("do: got None, expected the cotangent of o (grads=True)")
    if p.cu_seqlens is not None:
        return _run_packed(kernel, dp, scale, arith=arith, operand=operand, grads=grads,
                           chunk=chunk, decay=decay, order=order)
    dt = np.dtype(arith)
    B, G, T, dk = p.q.shape
    H = p.v.shape[1]
    c = lambda x: np.ascontiguousarray(x, dtype=dt)  # noqa: E731
    qh, kh = c(np.repeat(p.q, H // G, axis=1)), c(np.repeat(p.k, H // G, axis=1))
    v, beta, h0 = c(p.v), c(dp.beta), c(p.h0)
    la = p.log_alpha if p.log_alpha.ndim == 4 else p.log_alpha[..., None]
    la = c(la)
    # alpha = exp(log_alpha) of the working-dtype gate, computed in float64 and rounded
    alpha = c(np.exp(la.astype(np.float64)))
    mode = _MODE[operand] if dt == np.float32 else 0
    do = c(p.do) if grads else None
    dh_T = None if not grads else (np.zeros_like(h0) if p.dh_T is None else c(p.dh_T))
    if qh.size == 0 or v.size == 0:          # T, B or H of zero: nothing to accumulate
        z = np.zeros
        res = (z(v.shape, dt), h0.copy(), z(qh.shape, dt), z(kh.shape, dt), z(v.shape, dt),
               z(beta.shape, dt), z(la.shape, dt), dh_T)
        res = res if grads else res[:2]
    else:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            res = _IMPLS[kernel](qh, kh, v, beta, alpha if kernel == "scan" else la, h0, do,
                                 dh_T, scale, mode, grads, int(chunk), decay, order)
    out = {"o": res[0], "h_T": res[1]}
    if grads:
        dq, dk_, dv, dbeta, dla, dh0 = res[2:]
        # group sum in head order, in the working dtype
        gsum = lambda x: x.reshape(B, G, H // G, T, dk).sum(axis=2, dtype=dt)  # noqa: E731
        out.update(q=gsum(dq), k=gsum(dk_), v=dv, beta=dbeta,
                   log_alpha=dla if p.log_alpha.ndim == 4 else dla[..., 0], h0=dh0)
    return {n: np.asarray(x, dtype=np.float64) for n, x in out.items()}


def _run_packed(kernel: str, dp: DeltaProblem, scale: float, *, grads: bool,
                **kw) -> dict[str, np.ndarray]:
    """:func:`run` on packed sequences: each sequence [c_n, c_{n+1}) of row 0 on its own."""
    return per_sequence(dp.p, lambda sub, ts: run(kernel, DeltaProblem(sub, dp.beta[:, :, ts]),
                                                  scale, grads=grads, **kw))
