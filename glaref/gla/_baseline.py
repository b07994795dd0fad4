"""Same-precision reference kernels: the error a correct kernel makes, measured on the same inputs.

The calibrated verdict (``glaref._audit._verdict``) compares a kernel's error on each output with the
error that *correct* kernels make on exactly the same inputs, in the same arithmetic. These are
those correct kernels: two algorithms that bracket how production kernels of the recurrence are
written, evaluated here in a chosen low precision by NumPy and Numba, so that they need neither
JAX nor torch, run the same on every machine, and never share code (or bugs) with a kernel under
audit, glaref's own JAX kernels included.

``scan``     the recurrence step by step (docs/math.md, sections 1 and 3):
             S_t = alpha_t S_{t-1} + k_t^T v_t,  o_t = scale q_t S_t, and the reverse sweep
             G_t = scale q_t^T do_t + alpha_{t+1} G_{t+1}, dq_t = scale S_t do_t^T,
             dk_t = G_t v_t^T, dv_t = G_t^T k_t^T, dh0 = alpha_1 G_1, with dlog_alpha in the
             *direct* form alpha_t <S_{t-1}, G_t>. One rounding of the state per step: the
             sequential accumulation of T steps (what near-one and growing gates punish).
``chunked``  chunks of C steps (``CHUNK`` by default), the form of flash-linear-attention's chunk
             kernels: decays exp(b_i - b_j) of the log gates' sums inside each chunk, a masked
             (Q K^T o D) V product inside the chunk and the state handed from chunk to chunk;
             dlog_alpha by the reverse-cumsum *identity*, chunk-local:
             dlog_alpha_t = sum_{t <= s < end of chunk} (q_s . dq_s - k_s . dk_s)
                            + <S_{n+1}, dS_{n+1}>,
             which cancels heavily under strong decay (docs/math.md, section 4), and again
             in the direct form from the same products, the identity with its cancelling pairs
             removed (``_direct_dla``, docs/math.md section 4.3), for kernels that declare it.

Designs (docs/budgets.md, section 9). The field's correct kernels differ in how they round, and
each of these is a reference kernel of its own: ``decay`` "segment_sums" forms every exponent as
a sum over its own segment (glaref's kernels, Mamba2's ssd_minimal), "chunk_cumsum" as the
difference of a chunk-local cumulative sum rounded once per step (flash-linear-attention's
chunk_local_cumsum, Mamba2's dA_cumsum chunk scan), whose error grows with the chunk's total
decay, never with T; ``order`` "lanes" sums every dot product in eight interleaved partial sums
combined in a fixed tree (the scan's own order), "sequential" one term after another (the
chunked kernels' own order, as OpenBLAS's and XLA's CPU matrix products accumulate; the scan
summing so is the field's term-by-term design, what XLA does for some of a scan's reductions).

Reproducibility. Nothing here calls BLAS: every matrix product is ``_dot`` (``_baseline_scan.bmm``,
the order above, each product rounded before it is added), every sum over steps a cumulative
sum, every exp computed in float64 and rounded, every other sum a NumPy reduction (pairwise along
a contiguous axis, row by row along any other), so that the same inputs give the same bytes, and
the same reference errors, whichever BLAS kernel a machine picks (tests/test_baseline_blas.py).

Vector gates (log_alpha (B, H, T, dk), docs/math.md section 9): the scan decays row i of the
state by alpha_t[i] (S_t = diag(alpha_t) S_{t-1} + k_t^T v_t) and takes dlog_alpha_t[i] =
alpha_t[i] <S_{t-1}[i, :], G_t[i, :]> row by row (direct form); the chunked kernel forms the
per-dimension decays exp(b_i[m] - b_j[m]) as segment sums like the scalar one, its intra-chunk
scores A[i, j] = sum_m q_i[m] k_j[m] exp(b_i[m] - b_j[m]) as one product per query with the
decayed keys (accumulated in the working dtype like any matrix product), and dlog_alpha by the
chunk-local identity per key dimension with its tail term (``_chunked_vector``). Packed sequences
(``cu_seqlens``): every sequence runs on its own, exactly as an unpacked call (``run``).

Arithmetic. ``arith`` is the dtype every operation is carried out in (float32 for float32, tf32,
bfloat16 and float16 kernels that accumulate in float32; float64 for float64 kernels).
``operand`` names the format every matrix-product operand is rounded to first (round to nearest
even, on the float32 bit pattern): "tf32" (10 explicit mantissa bits: what NVIDIA GPUs do with
float32 matmuls at JAX's default precision), "bfloat16", "float16" (mantissa only; the values
stay in range), or None. ``storage`` rounds every product's result, every carried state and every
running sum to a 16-bit format: a kernel that *accumulates* in bfloat16 or float16. The caller
rounds each returned output to the dtype the kernel under audit returned it in
(``round_to``): a bfloat16 kernel's o carries that final rounding, and so must its baseline.

Both kernels take canonical float64 "bhtd" arrays (exactly representable in ``arith``; the audit
rounds inputs to the kernel's dtype before anything runs) and return float64 arrays of the values
they computed. Nothing here is an oracle: these kernels *make* rounding errors on purpose.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from .._rounding import round_to

KERNELS = ("scan", "chunked")
CHUNK = 64          # the chunked reference's chunk, what production kernels use
CHUNK_WIDE = 256    # the widest chunk production kernels use: one extreme of unknown structure
ROUNDINGS = ("tf32", "bfloat16", "float16")
# how the chunked kernel forms its decay exponents (``_decay_exponents``): sums over each
# segment, or differences of a chunk-local cumulative sum (flash-linear-attention, Mamba2)
DECAY_FORMS = ("segment_sums", "chunk_cumsum")
# the order every dot product sums in (``_baseline_scan.dot``): eight interleaved partial sums
# combined in a fixed tree, or one term after another (one accumulator per result, as OpenBLAS's
# and XLA's CPU matrix products accumulate along the inner dimension). Each kernel's own default
# (``DEFAULT_ORDER``): the scan sums in lanes, the chunked kernels sequentially, the orders they
# were calibrated with (docs/budgets.md, section 9)
ORDERS = ("lanes", "sequential")
DEFAULT_ORDER = {"scan": "lanes", "chunked": "sequential"}

_MODE = {None: 0, "tf32": 1, "bfloat16": 2, "float16": 3}


# ------------------------------------------------------------------------------------ chunked

def _dot(a, b, order="sequential"):
    """a @ b (a (..., M, K), b (..., K, N), batch axes broadcast) in the arrays' dtype, every entry
    summed in the fixed ``order`` (``ORDERS``, ``_baseline_scan.bmm``; no fused multiply-add),
    never by BLAS, whose float32 order differs between the kernels a machine picks."""
    from ._baseline_scan import bmm

    dt = np.result_type(a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    A = np.ascontiguousarray(np.broadcast_to(a, batch + (M, K)), dtype=dt).reshape(-1, M, K)
    Bt = np.ascontiguousarray(np.swapaxes(np.broadcast_to(b, batch + (K, N)), -1, -2),
                              dtype=dt).reshape(-1, N, K)
    out = np.empty((A.shape[0], M, N), dt)
    # operands always read-only (``bmm`` is then compiled once per dtype, not once per
    # combination of writable and read-only views)
    A.flags.writeable = False
    Bt.flags.writeable = False
    if K == 0:
        out[:] = 0
        return out.reshape(batch + (M, N))
    return bmm(A, Bt, out, ORDERS.index(order)).reshape(batch + (M, N))


def _mm(a, b, operand, storage, order="sequential"):
    """A matrix product of the kernel: operands rounded to ``operand``, the result (accumulated
    in the arrays' dtype in ``_dot``'s fixed order) rounded to ``storage``."""
    return round_to(_dot(round_to(a, operand), round_to(b, operand), order), storage)


def _exp(x):
    """exp in the working dtype, correctly rounded (computed in float64, then rounded): the same
    on every machine, whichever SIMD exp NumPy dispatches to."""
    return np.exp(x.astype(np.float64)).astype(x.dtype)


def _suffix_sums(x, axis):
    """sum_{s >= t} x_s along ``axis`` (time), each accumulated from the chunk's end backwards,
    in the working dtype (a reverse cumulative sum: a fixed order on every machine)."""
    return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis)


def _prefix_sums_before(x, axis):
    """sum_{s < t} x_s along ``axis`` (time), accumulated forwards from the chunk's start."""
    c = np.cumsum(x, axis=axis, dtype=x.dtype)
    z = np.zeros_like(np.take(x, [0], axis=axis))
    return np.concatenate([z, np.take(c, np.arange(x.shape[axis] - 1), axis=axis)], axis=axis)


def _decay_exponents(lc, form):
    """One chunk's decay exponents from its log gates lc (..., L) (time last), in lc's dtype:
    (seg (..., L, L) with seg[i, j] = b_i - b_j for i >= j (0 above the diagonal), b (..., L)
    with b_i the sum of log_alpha from the chunk's start to step i, rest (..., L) with
    rest_j = b_last - b_j).

    form "segment_sums": each a sum over its own segment (sum_{j < s <= i} log_alpha_s, accumulated
    forwards from s = j + 1, as ssd_minimal's masked cumulative sum does): its error is bounded
    by the segment's own magnitude. form "chunk_cumsum": the chunk-local cumulative sum b rounded once
    per step (accumulated from the chunk's start), and every exponent the rounded difference of two
    of its values, flash-linear-attention's chunk_local_cumsum and Mamba2's dA_cumsum: error u |b|,
    bounded by the chunk's total decay, not by T."""
    L = lc.shape[-1]
    i = np.arange(L)
    lower = i[:, None] >= i[None, :]
    if form == "chunk_cumsum":
        b = np.cumsum(lc, axis=-1, dtype=lc.dtype)
        seg = np.where(lower, b[..., :, None] - b[..., None, :], 0).astype(lc.dtype)
        return seg, b, (b[..., -1:] - b).astype(lc.dtype)
    # x[i', j'] = y_i' for i' > j' (y = lc with a leading 0); a cumulative sum over i' gives
    # seg'[i', j'] = sum_{j' < s <= i'} y_s, so seg[i, j] = seg'[i + 1, j + 1], b_i = seg'[i + 1, 0]
    # and b_last - b_j = seg'[L, j + 1]
    y = np.concatenate([np.zeros_like(lc[..., :1]), lc], axis=-1)
    k = np.arange(L + 1)
    x = np.where(k[:, None] > k[None, :], y[..., :, None], 0).astype(lc.dtype)
    segp = np.cumsum(x, axis=-2, dtype=lc.dtype)
    seg = np.where(lower, segp[..., 1:, 1:], 0)
    return seg, segp[..., 1:, 0], segp[..., L, 1:]


def _fma(a, x, y):
    """a * x + y rounded once to the working dtype (a fused multiply-add epilogue): the products
    and sum in float64, which holds them exactly or within one float64 rounding."""
    return (np.multiply(a, x, dtype=np.float64) + y).astype(x.dtype)


def _direct_dla(M, q_in, k_in, carried, st):
    """One chunk's dlog_alpha in the *direct* form (docs/math.md, sections 4 and 9.3): the
    chunk-local identity with its cancelling pairs removed, leaving only the genuine terms of
    alpha_t <S_{t-1}, G_t>, each carrying its own decay:

        dlog_alpha_t = sum_{i >= t > j} M[i, j] + sum_{i >= t} q_i . dq_i^in
                       + sum_{j < t} k_j . dk_j^in + exp(b_last) <S_n, dS_{n+1}>

    M[i, j] (.., L, L[, dk]): the in-chunk products (zero above the diagonal); q_in, k_in
    (.., L[, dk]): q_i . dq_i^in and k_j . dk_j^in, the parts through the entering state and the
    leaving cotangent; carried (..[, dk]): exp(b_last) <S_n, dS_{n+1}>. Every sum over steps is a
    cumulative sum in the working dtype (``_suffix_sums``, ``_prefix_sums_before``)."""
    if M.ndim == 4:                                      # scalar gates: one key "dimension"
        return _direct_dla(M[..., None], q_in[..., None], k_in[..., None], carried[..., None],
                           st)[..., 0]
    L = M.shape[2]
    before = np.tril(np.ones((L, L), M.dtype), -1)       # [j < t]
    # R[t, j] = sum_{i >= t} M[i, j], then the sum over j < t
    Rm = st(_suffix_sums(M, 2))
    straddle = st(np.sum(Rm * before[..., None], axis=3))
    return st(straddle + st(_suffix_sums(q_in, 2)) + st(_prefix_sums_before(k_in, 2))
              + carried[:, :, None])


def _sweep(q, k, v, la, h0, do, dh_T, scale, st, grads, C, decays, forward, backward):
    """The chunk loop of both chunked kernels: a forward sweep over chunks of C steps keeping the
    state before each, then (``grads``) the reverse sweep carrying the state's cotangent dS.
    ``decays(t0, t1)``: one chunk's decay factors; ``forward(Q, K, V, S, dec)`` -> (o of the
    chunk, S_next); ``backward(Q, K, V, dO, S, S_next, dS, dec)`` -> (dq, dk, dv, dlog_alpha by
    the identity, dlog_alpha in the direct form, dS before the chunk). dO is do * scale."""
    T = q.shape[2]
    N = max(1, -(-T // C))
    bounds = [(n * C, min(T, (n + 1) * C)) for n in range(N)]
    o = np.empty(v.shape, q.dtype)
    S = h0.copy()
    states = [S]                                                      # state before each chunk
    for t0, t1 in bounds:
        c = slice(t0, t1)
        o[:, :, c], S = forward(q[:, :, c], k[:, :, c], v[:, :, c], S, decays(t0, t1))
        states.append(S)
    h_T = S
    if not grads:
        return o, h_T
    dq, dk, dv, dla, dla_d = (np.empty_like(x) for x in (q, k, v, la, la))
    dS = np.zeros_like(h_T) if dh_T is None else dh_T.copy()
    for n in reversed(range(N)):
        t0, t1 = bounds[n]
        c = slice(t0, t1)
        dO = st(do[:, :, c] * scale)
        dq[:, :, c], dk[:, :, c], dv[:, :, c], dla[:, :, c], dla_d[:, :, c], dS = backward(
            q[:, :, c], k[:, :, c], v[:, :, c], dO, states[n], states[n + 1], dS, decays(t0, t1))
    return o, h_T, dq, dk, dv, dla, dS, dla_d


def _chunked(q, k, v, la, h0, do, dh_T, scale, operand, storage, grads, C=CHUNK,
             decay="segment_sums", order="sequential"):
    """The chunked kernel on per-head arrays (B, H, T, d) in the working dtype, its decays of
    ``decay`` form (``_decay_exponents``)."""
    dt = q.dtype
    st = lambda x: round_to(x, storage)          # noqa: E731
    mm = lambda a, b: _mm(a, b, operand, storage, order)  # noqa: E731
    sw = lambda x: np.swapaxes(x, -1, -2)        # noqa: E731

    def decays(t0, t1):
        # exponents b_i - b_j, b_i and b_last - b_j of the chunk, in the working dtype
        seg, b, rest = _decay_exponents(la[:, :, t0:t1], decay)
        i = np.arange(t1 - t0)
        D = np.where(i[:, None] >= i[None, :], _exp(seg), 0).astype(dt)
        eb = _exp(b)                                                                  # exp(b_i)
        return D, eb, _exp(rest), eb[..., -1]

    def forward(Q, K, V, S, dec):
        D, eb, eb_rest, eb_last = dec
        A = st(mm(Q, sw(K)) * D)
        o = st(scale * st(_fma(eb[..., None], mm(Q, S), mm(A, V))))
        return o, st(_fma(eb_last[..., None, None], S, mm(sw(st(K * eb_rest[..., None])), V)))

    def backward(Q, K, V, dO, S, S_next, dS, dec):
        D, eb, eb_rest, eb_last = dec
        A = st(mm(Q, sw(K)) * D)
        QK = st(mm(Q, sw(K)))
        dA = st(mm(dO, sw(V)) * D)
        dq_in = st(eb[..., None] * mm(dO, sw(S)))                       # from the entering state
        dk_in = st(eb_rest[..., None] * mm(V, sw(dS)))                  # from the leaving cotangent
        dq_c = st(mm(dA, K) + dq_in)
        dk_c = st(mm(sw(dA), Q) + dk_in)
        dv_c = st(_fma(eb_rest[..., None], mm(K, dS), mm(sw(A), dO)))
        # q_s . dq_s - k_s . dk_s: the in-chunk parts from the same products M_ij = dA_ij (q_i . k_j)
        # (q_i . dq_i^intra = sum_j M_ij, k_j . dk_j^intra = sum_i M_ij), so that they cancel
        # term by term instead of as two rounded totals
        M = st(dA * QK)
        w = st(np.sum(M, axis=-1) - np.sum(M, axis=-2)
               + np.sum(Q * dq_in, axis=-1) - np.sum(K * dk_in, axis=-1))
        tail = st(np.sum(S_next * dS, axis=(-2, -1)))
        # sum_{t <= s < end} w_s, a reverse cumulative sum inside the chunk
        dla = st(st(_suffix_sums(w, 2)) + tail[..., None])
        dla_d = _direct_dla(M, st(np.sum(Q * dq_in, axis=-1)), st(np.sum(K * dk_in, axis=-1)),
                            st(eb_last * np.sum(S * dS, axis=(-2, -1))), st)
        dS = st(_fma(eb_last[..., None, None], dS, mm(sw(st(Q * eb[..., None])), dO)))
        return dq_c, dk_c, dv_c, dla, dla_d, dS

    return _sweep(q, k, v, la, h0, do, dh_T, scale, st, grads, C, decays, forward, backward)


def _chunked_vector(q, k, v, la, h0, do, dh_T, scale, operand, storage, grads, C=CHUNK,
                    decay="segment_sums", order="sequential"):
    """The chunked kernel for vector gates, la (B, H, T, dk): one decay per key dimension.

    The decay differs per term of q_i . k_j, so the intra-chunk scores are no masked Q K^T:
    with b_i[m] the cumulative log decay of dimension m from the chunk's start to step i,
    A[i, j] = sum_m q_i[m] k_j[m] exp(b_i[m] - b_j[m]) is, for each query i, the product of q_i
    with the decayed keys KD[i, j] = k_j o exp(b_i - b_j) (a matrix product per query, operands
    rounded and accumulated like any other). The gradients use the same decayed keys and the
    decayed queries QD[j, i] = q_i o exp(b_i - b_j):

        dq_i = sum_j dOV[i, j] KD[i, j] + exp(b_i) o (dO_i S^T)        dOV[i, j] = dO_i . v_j
        dk_j = sum_i dOV[i, j] QD[j, i] + exp(b_last - b_j) o (v_j dS^T)
        dlog_alpha_t = sum_{t <= s < end} (q_s o dq_s - k_s o dk_s) + rowsum(S_next o dS)

    (the chunk-local identity per key dimension, docs/math.md section 9.3), its in-chunk parts
    from the same products M[i, j] = dOV[i, j] q_i o KD[i, j] so that they cancel term by term.
    Every exponent of the ``decay`` form (``_decay_exponents``), per key dimension.
    Memory: (B, H, C, C, dk) per chunk."""
    dt = q.dtype
    st = lambda x: round_to(x, storage)          # noqa: E731
    mm = lambda a, b: _mm(a, b, operand, storage, order)  # noqa: E731
    sw = lambda x: np.swapaxes(x, -1, -2)        # noqa: E731

    def decays(t0, t1):
        # per key dimension, as in _chunked. exp(b_i - b_j) (B, H, L_i, L_j, dk), zero for j > i;
        # exp(b_i), exp(b_last - b_j) (B, H, L, dk) and exp(b_last) (B, H, dk)
        seg, b, rest = _decay_exponents(np.moveaxis(la[:, :, t0:t1], 3, 2), decay)  # [m, i, j]
        i = np.arange(t1 - t0)
        D = np.moveaxis(np.where(i[:, None] >= i[None, :], _exp(seg), 0).astype(dt), 2, 4)
        eb = np.moveaxis(_exp(b), 2, 3)
        return D, eb, np.moveaxis(_exp(rest), 2, 3), eb[:, :, -1]

    def scores(Q, KD):
        # A[i, j] = q_i . KD[i, j]: one (1 x dk) (dk x L) product per query
        return mm(Q[:, :, :, None, :], sw(KD))[:, :, :, 0, :]

    def forward(Q, K, V, S, dec):
        D, eb, eb_rest, eb_last = dec
        A = st(scores(Q, st(D * K[:, :, None])))
        o = st(scale * st(mm(st(Q * eb), S) + mm(A, V)))
        return o, st(_fma(eb_last[..., None], S, mm(sw(st(K * eb_rest)), V)))

    def backward(Q, K, V, dO, S, S_next, dS, dec):
        D, eb, eb_rest, eb_last = dec
        KD = st(D * K[:, :, None])                                     # KD[i, j] = k_j o e^{b_i - b_j}
        QD = st(np.swapaxes(D, 2, 3) * Q[:, :, None])                  # QD[j, i] = q_i o e^{b_i - b_j}
        A = st(scores(Q, KD))
        dOV = st(mm(dO, sw(V)))                                        # dO_i . v_j (KD, QD mask it)
        dq_in = st(eb * mm(dO, sw(S)))                                 # from the entering state
        dk_in = st(eb_rest * mm(V, sw(dS)))                            # from the leaving cotangent
        dq_c = st(mm(dOV[:, :, :, None, :], KD)[:, :, :, 0, :] + dq_in)
        dk_c = st(mm(sw(dOV)[:, :, :, None, :], QD)[:, :, :, 0, :] + dk_in)
        dv_c = st(mm(st(K * eb_rest), dS) + mm(sw(A), dO))
        # q_s o dq_s - k_s o dk_s: the in-chunk parts from the same products
        # M[i, j] = dOV[i, j] q_i o KD[i, j] (q_i o dq_i^intra = sum_j M[i, j],
        # k_j o dk_j^intra = sum_i M[i, j]), so that they cancel term by term
        M = st(st(dOV[..., None] * KD) * Q[:, :, :, None, :])
        w = st(np.sum(M, axis=3) - np.sum(M, axis=2) + Q * dq_in - K * dk_in)
        tail = st(np.sum(S_next * dS, axis=-1))                       # (B, H, dk)
        # sum_{t <= s < end} w_s, a reverse cumulative sum inside the chunk
        dla = st(st(_suffix_sums(w, 2)) + tail[:, :, None, :])
        dla_d = _direct_dla(M, st(Q * dq_in), st(K * dk_in),
                            st(eb_last * np.sum(S * dS, axis=-1)), st)
        dS = st(_fma(eb_last[..., None], dS, mm(sw(st(Q * eb)), dO)))
        return dq_c, dk_c, dv_c, dla, dla_d, dS

    return _sweep(q, k, v, la, h0, do, dh_T, scale, st, grads, C, decays, forward, backward)


# ------------------------------------------------------------------------------------ scan

def _scan(qh, kh, v, la, h0, do, dh_T, scale, operand, storage, grads, order="lanes"):
    from ._baseline_scan import KERNELS

    fwd, vjp = KERNELS["vector" if la.ndim == 4 else "scalar"]
    mo, ms = _MODE[operand], _MODE[storage]
    if qh.dtype != np.float32:
        mo = ms = 0
    sc = qh.dtype.type(scale)
    od = ORDERS.index(order)
    o, h_T = fwd(qh, kh, v, la, h0, sc, mo, ms, od)
    if not grads:
        return o, h_T
    dhT = np.zeros_like(h0) if dh_T is None else dh_T
    dq, dk, dv, dla, dh0 = vjp(qh, kh, v, la, h0, do, dhT, sc, mo, ms, od)
    return o, h_T, dq, dk, dv, dla, dh0, dla      # the scan's dlog_alpha is the direct form


# ------------------------------------------------------------------------------------ public

def run(kernel: str, p, scale: float, *, arith: str = "float32", operand: str | None = None,
        storage: str | None = None, grads: bool = True, chunk: int = CHUNK,
        decay: str = "segment_sums", order: str | None = None) -> dict[str, np.ndarray]:
    """Run the same-precision reference kernel ``kernel`` ("scan" or "chunked", the latter with
    chunks of ``chunk`` steps and decays of form ``decay``, ``DECAY_FORMS``), every dot product
    summed in ``order`` (``ORDERS``; None: the kernel's own, ``DEFAULT_ORDER``), on canonical
    problem ``p`` (``_inputs.Problem``; with ``grads`` its ``do`` is required and ``dh_T=None``
    means zero). Returns float64 arrays under glaref's
    output names: o, h_T and, with ``grads``, q, k, v, log_alpha, h0 (dq, dk summed over each
    group's heads, in head order), plus ``log_alpha_direct``: dlog_alpha in the direct form (the
    chunked kernel's identity without its cancelling pairs; the scan's own dlog_alpha).

    Vector gates (log_alpha (B, H, T, dk)) run the kernels' per-dimension forms
    (``_chunked_vector``, the scan's ``*_vector``). Packed sequences (``p.cu_seqlens``, B = 1) run
    every sequence on its own, from h0[n] to h_T[n], and concatenate the results in time (states
    stacked): packed equals one by one, to the last bit; empty sequences give h_T[n] = h0[n]."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: got {kernel!r}, expected one of {KERNELS}")
    if arith not in ("float32", "float64"):
        raise ValueError(f"arith: got {arith!r}, expected 'float32' or 'float64'")
    if decay not in DECAY_FORMS:
        raise ValueError(f"decay: got {decay!r}, expected one of {DECAY_FORMS}")
    if order is None:
        order = DEFAULT_ORDER.get(kernel, "lanes")
    if order not in ORDERS:
        raise ValueError(f"order: got {order!r}, expected one of {ORDERS}")
    for name, fmt in (("operand", operand), ("storage", storage)):
        if fmt is not None and fmt not in ROUNDINGS:
            raise ValueError(f"{name}: got {fmt!r}, expected None or one of {ROUNDINGS}")
    if p.cu_seqlens is not None:
        return _run_packed(kernel, p, scale, arith=arith, operand=operand, storage=storage,
                           grads=grads, chunk=chunk, decay=decay, order=order)
    dt = np.dtype(arith)
    B, G, T, dk = p.q.shape
    H = p.v.shape[1]
    c = lambda x: None if x is None else np.ascontiguousarray(x, dtype=dt)  # noqa: E731
    qh = c(np.repeat(p.q, H // G, axis=1))
    kh = c(np.repeat(p.k, H // G, axis=1))
    v, la, h0, do, dh_T = c(p.v), c(p.log_alpha), c(p.h0), c(p.do), c(p.dh_T)
    if grads and do is None:
        raise ValueError("do: got None, expected the cotangent of o (grads=True)")
    chunked = _chunked_vector if la.ndim == 4 else _chunked      # vector gates: la (B, H, T, dk)
    impl = (functools.partial(_scan, order=order) if kernel == "scan" else
            functools.partial(chunked, C=chunk, decay=decay, order=order))
    if qh.size == 0 or v.size == 0:                 # T, B or H of zero: nothing to accumulate
        z = np.zeros
        res = (z(v.shape, dt), h0.copy(), z(qh.shape, dt), z(kh.shape, dt), z(v.shape, dt),
               z(la.shape, dt), np.zeros_like(h0) if dh_T is None else dh_T.copy(),
               z(la.shape, dt))
        res = res if grads else res[:2]
    else:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            res = impl(qh, kh, v, la, h0, do, dh_T, scale, operand, storage, grads)
    out = {"o": res[0], "h_T": res[1]}
    if grads:
        dq, dk_, dv, dla, dh0, dla_direct = res[2:]
        # group sum in head order, in the working dtype (storage-rounded like any other sum)
        gsum = lambda x: round_to(x.reshape(B, G, H // G, T, dk).sum(axis=2, dtype=dt), storage)  # noqa: E731
        out.update(q=gsum(dq), k=gsum(dk_), v=dv, log_alpha=dla, h0=dh0,
                   log_alpha_direct=dla_direct)
    return {n: np.asarray(x, dtype=np.float64) for n, x in out.items()}


def per_sequence(p, run_one) -> dict[str, np.ndarray]:
    """A reference kernel on packed sequences: ``run_one(sub, ts)`` runs each sequence
    [c_n, c_{n+1}) of row 0 on its own (``sub``: that sequence as a problem of one row, ``ts``:
    its slice of the time axis) and returns {output: value}; the states (h_T, h0) go to row n,
    every other output to its time slice. Shared by both families' ``run``."""
    cu = [int(c) for c in p.cu_seqlens]
    NS, T = len(cu) - 1, p.q.shape[2]
    out: dict[str, np.ndarray] = {}
    for n, (t0, t1) in enumerate(zip(cu[:-1], cu[1:])):
        ts = slice(t0, t1)
        cut = lambda x: None if x is None else x[:, :, ts]            # noqa: E731, B023
        one = lambda x: None if x is None else x[n:n + 1]             # noqa: E731, B023
        sub = p._replace(q=cut(p.q), k=cut(p.k), v=cut(p.v), log_alpha=cut(p.log_alpha),
                         h0=one(p.h0), do=cut(p.do), dh_T=one(p.dh_T),
                         dims=dataclasses.replace(p.dims, B=1, T=t1 - t0), cu_seqlens=None)
        for name, x in run_one(sub, ts).items():
            state = name in ("h_T", "h0")
            if name not in out:
                out[name] = np.zeros((NS,) + x.shape[1:] if state else
                                     x.shape[:2] + (T,) + x.shape[3:])
            if state:
                out[name][n:n + 1] = x
            else:
                out[name][:, :, ts] = x
    return out


def _run_packed(kernel: str, p, scale: float, *, grads: bool, **arith) -> dict[str, np.ndarray]:
    """:func:`run` on packed sequences: each sequence [c_n, c_{n+1}) of row 0 on its own."""
    return per_sequence(p, lambda sub, ts: run(kernel, sub, scale, grads=grads, **arith))
