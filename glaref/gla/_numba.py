"""The Numba float64 oracle: same functions and signatures as ``_reference``, compiled and chunked.

Canonical "bhtd" float64 arrays in, float64 arrays out (see ``_inputs``):

    forward(q, k, v, log_alpha, h0, scale, cu_seqlens=None) -> (o, h_T)
    vjp(q, k, v, log_alpha, h0, do, dh_T, scale, per_head=False, cu_seqlens=None)
        -> (dq, dk, dv, dlog_alpha, dh0)

log_alpha (B, H, T) is a scalar gate, (B, H, T, dk) a vector gate (one decay per key dimension:
the pair loop of the "vector gates" section below). The parallel workers run over independent
sequences: the B batch rows, or the N packed sequences of ``cu_seqlens`` (row 0, steps
cu[n]:cu[n+1], state index n), each with the same per-head code as an unpacked call, so packed
and one-by-one results are the same bits.

The equations are those of ``_reference`` (docs/math.md, sections 1 and 2), evaluated chunk by
chunk so that most of the work is matrix products: BLAS dgemm, called from the compiled code
through Numba's own binding to SciPy's BLAS (``numba_xxgemm``, the function behind ``np.dot``),
with alpha/beta and leading dimensions so that products land in place, without temporaries.

Chunked form. Split time into chunks of ``CHUNK`` steps. Inside a chunk with steps j = 0..L-1,
start state S0 and end-of-chunk carry Gn (the cotangent flowing into the chunk from later steps):

    E[j, i]  = alpha_{i+1} * ... * alpha_j          (i <= j; E[j, j] = 1; zero above the diagonal)
    din[j]   = alpha_0 * ... * alpha_j              (decay from S0 to the state after step j)
    dout[i]  = E[L-1, i]                            (decay from step i to the chunk end)
    atot     = din[L-1]

    forward   O = scale * ((Q K^T o E) V + din o (Q S0))          S_end = atot S0 + (dout o K)^T V
    backward  dA = dO V^T,  A = Q K^T (both masked by E)
              dQ = scale * ((dA o E) K + din o (dO S0^T))
              dK = scale * ((dA o E)^T Q) + dout o (V Gn^T)
              dV = scale * ((A o E)^T dO) + dout o (K Gn)
              Gn <- atot Gn + scale * (din o Q)^T dO                (carry into the previous chunk)

Decay factors are products of the per-step alphas, formed as running products
``E[j, i] = E[j, i+1] * alpha_{i+1}``: only the pairs s <= t ever get a factor, every factor
is a product of numbers alpha = exp(log_alpha), and nothing like exp(b_t) * exp(-b_s) (which
overflows under strong decay, log_alpha ~ -30) or exp(b_t - b_s) of two large cumulative sums
(whose rounding, ~ u * |b|, is larger than u when |b| is large) is formed. Each factor carries
the same relative rounding as the step-by-step recurrence (j - i products of rounded alphas),
so the chunked form is as accurate as the reference in every regime: strong decay (factors
underflow to zero as the true values do), log_alpha = 0 (factors exactly 1), small positive
log_alpha (growth within a chunk only), and dominant h0.

dlog_alpha is the direct form alpha_j <S_{j-1}, G_j> of the reference, expanded exactly into the
four products of (S0 + in-chunk terms) and (Gn + in-chunk terms); with E[j,i] E[r,j] = E[r,i],
din[j] dout[j] = atot, din[j] E[r,j] = din[r] and dout[j] E[j,i] = dout[i]:

    dlog_alpha_j = atot <S0, Gn>
                 + scale * sum_{r >= j} din[r] (q_r S0 do_r^T)        (within the chunk)
                 + sum_{i < j} dout[i] (k_i Gn v_i^T)                 (within the chunk)
                 + scale * sum_{r >= j > i} E[r, i] (q_r . k_i) (do_r . v_i)

Every term is a genuine contribution of the direct form, each weighted by its own decay, and
the sums run over one chunk only. It is *not* the reverse-cumsum identity of production
kernels (sum over all s >= t of q_s.dq_s - k_s.dk_s), whose terms do not decay and cancel
under strong decay or long T.

Determinism: kernels are compiled with ``fastmath=False``. The workers (``run_workers``: one
Python thread each, ``numba.get_num_threads()`` of them, running compiled code that releases the GIL)
take independent (b, h) pairs (or (b, g) groups, see ``vjp``) only, with the time loop serial
inside. BLAS is held to one thread during our calls (threadpoolctl), so each product is
computed the same way whatever the number of workers (and BLAS threads do not compete with
ours: without the limit, two workers each starting BLAS threads ran 30x slower on 2 cores).
The group sum of dq and dk runs in a fixed head order (left to right), so results are
bit-identical for any thread count. Dot products in our own loops use eight interleaved partial
sums in a fixed order (``_dot``), never a compiler-reassociated reduction.

Compile time (the first call on a machine; tools/bench_cold.py measures it). Numba compiles a
function per distinct tuple of argument types, and every compiled caller compiles its compiled
callees' code again (it is linked into the caller and optimised with it, and each level is
turned into machine code), so the drivers keep both small: the workers are Python loops over
the items, calling the compiled per-head functions (``_qk_chunks``, ``_forward_head``,
``_chunk_starts``, ``_vjp_head``: the top of each compiled tree, a few microseconds to enter
per head), worker threads instead of a ``prange`` loop (Numba's parallel lowering cost a third
of the compile), ``vector`` passed as None (scalar gates) or True (vector gates) so that Numba
prunes the other kind's branches at compile time and a call compiles the code of its own kind
of gate only, ``_gemm`` compiled once for one signature (any layout, BLAS flags as int8 values:
not one version per combination), and copies as loops (an array assignment compiles Numba's
broadcasting checks with their error messages). The compiled code is cached per user
(``_numba_cache``: once per machine, not per environment).

Memory: the backward stores the state at the start of every chunk for the (b, h) pair a worker
is processing (T / CHUNK states of dk*dv, one buffer per worker, reused), nothing per (b, h)
beyond the outputs; no O(T * dk * dv) storage per head. dq and dk are accumulated into the
group's output directly when there are at least as many groups as threads; otherwise per-head
buffers are summed after the workers finish. Both orders of summation are the same, so both give
the same bits.

Speed (tools/bench_oracle.py measures it). Per chunk of C steps the backward does
10 C^2 d + 12 C d^2 flops (d = dk = dv) against the 12 C d^2 of the step-by-step form, the
forward 4 C^2 d + 4 C d^2 against 4 C d^2; C = 32 keeps that overhead near 20 % at d = 128
while the products stay large enough for BLAS (C = 64 was slower, C = 48 about equal). Which
operand is stored transposed is chosen so that BLAS reads most operands in its fast order: the
backward keeps the chunk-start states as S^T and the carry as Gn^T. Q K^T depends on the
group only, so it is formed once per group and chunk and shared by the group's heads. Under
gates so strong that decay factors reach the subnormal range inside a chunk (log_alpha ~ -30 on
every step) the products meet subnormal numbers and run several times slower; they are kept,
not flushed to zero, since an oracle does not drop terms.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (the BLAS numba_xxgemm calls; see _one_blas_thread)
from numba import get_num_threads, types
from threadpoolctl import ThreadpoolController

from .._numba_cache import jit, note_compile, run_workers

CHUNK = 32
VCHUNK = 32   # vector gates (tools/bench_oracle.py --gate vector)

_jit = jit(fastmath=False, nogil=True)


@_jit
def _decays(log_alpha, t0, L, E, din, dout):  # pragma: no cover - compiled
    """Scalar gates, log_alpha (T, 1): fill E (L x L, lower incl. diagonal) and din, dout
    (column 0) for the chunk starting at t0. Products of alphas only; see the module docstring.
    """
    # din first: it holds the alphas of the chunk for the products below, then their prefix
    # products.
    for j in range(L):
        din[j, 0] = np.exp(log_alpha[t0 + j, 0])
    for j in range(L):
        E[j, j] = 1.0
        for i in range(j + 1, L):
            E[j, i] = 0.0
        p = 1.0
        for i in range(j - 1, -1, -1):
            p = p * din[i + 1, 0]
            E[j, i] = p
    for i in range(L):
        dout[i, 0] = E[L - 1, i]
    p = 1.0
    for j in range(L):
        p = p * din[j, 0]
        din[j, 0] = p


@_jit
def _vec_decays(log_alpha, t0, L, al, din, dout):  # pragma: no cover - compiled
    """Vector gates, log_alpha (T, dk): al, din, dout (L x dk) of the chunk starting at t0;
    products of alphas only."""
    dk = log_alpha.shape[1]
    for j in range(L):
        for i in range(dk):
            al[j, i] = np.exp(log_alpha[t0 + j, i])
    for i in range(dk):
        din[0, i] = al[0, i]
        dout[L - 1, i] = 1.0
    for j in range(1, L):
        for i in range(dk):
            din[j, i] = din[j - 1, i] * al[j, i]
    for j in range(L - 2, -1, -1):
        for i in range(dk):
            dout[j, i] = dout[j + 1, i] * al[j + 1, i]


_N = np.int8(ord("N"))
_T = np.int8(ord("T"))
_D = np.int8(ord("d"))
_xxgemm = types.ExternalFunction("numba_xxgemm", types.intc(
    types.char, types.char, types.char, types.intp, types.intp, types.intp,
    types.CPointer(types.float64), types.CPointer(types.float64), types.intp,
    types.CPointer(types.float64), types.intp, types.CPointer(types.float64),
    types.CPointer(types.float64), types.intp))


@jit("void(int8, int8, float64, float64[:, :], float64[:, :], float64, float64[:, :], float64[:])",
     fastmath=False, nogil=True)
def _gemm(ta, tb, alpha, A, B, beta, Cm, ab):  # pragma: no cover - compiled
    """Row-major Cm <- alpha op(A) op(B) + beta Cm through BLAS dgemm (Numba's own binding).

    op(X) is X when ta / tb is _N, X^T when it is _T (int8 values, not literal booleans, so that
    one compiled version serves every combination; likewise one signature, any layout, compiled
    when this module is imported, serves every caller). A, B, Cm are 2-D views whose rows are
    contiguous (unit last stride); ``ab`` is a float64[2] scratch for alpha and beta. BLAS is
    column-major, so the call computes Cm^T = op(B)^T op(A)^T on the same memory.
    """
    m, n = Cm.shape
    kk = A.shape[0] if ta == _T else A.shape[1]
    if m == 0 or n == 0:
        return
    ab[0] = alpha
    ab[1] = beta
    lda = max(1, A.strides[0] // 8, A.shape[1])
    ldb = max(1, B.strides[0] // 8, B.shape[1])
    ldc = max(1, Cm.strides[0] // 8, n)
    r = _xxgemm(_D, tb, ta, n, m, kk,
                ab[0:1].ctypes, B.ctypes, ldb, A.ctypes, lda, ab[1:2].ctypes, Cm.ctypes, ldc)
    if r != 0:
        raise RuntimeError("BLAS dgemm (numba_xxgemm) failed")


@_jit
def _gated_rows(W, X, out):  # pragma: no cover - compiled
    """out = W o X for the rows of X: a one-column W (a scalar gate) scales whole rows
    (out[i, :] = W[i, 0] X[i, :]), a W as wide as X (a vector gate) multiplies elementwise."""
    if W.shape[1] == 1:
        for i in range(X.shape[0]):
            wi = W[i, 0]
            for a in range(X.shape[1]):
                out[i, a] = wi * X[i, a]
    else:
        for j in range(X.shape[0]):
            for i in range(X.shape[1]):
                out[j, i] = W[j, i] * X[j, i]


@_jit
def _dot(x, y):  # pragma: no cover - compiled
    """sum_a x[a] y[a] with eight interleaved partial sums combined in a fixed tree.

    A fixed summation order (not reassociated by the compiler: fastmath is off), so the
    result does not depend on threads; eight independent chains keep the adds pipelined.
    """
    n = x.shape[0]
    m = n - n % 8
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    for a in range(0, m, 8):
        s0 += x[a] * y[a]
        s1 += x[a + 1] * y[a + 1]
        s2 += x[a + 2] * y[a + 2]
        s3 += x[a + 3] * y[a + 3]
        s4 += x[a + 4] * y[a + 4]
        s5 += x[a + 5] * y[a + 5]
        s6 += x[a + 6] * y[a + 6]
        s7 += x[a + 7] * y[a + 7]
    t = 0.0
    for a in range(m, n):
        t += x[a] * y[a]
    return (((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) + t


@_jit
def _add_into(out, X):  # pragma: no cover - compiled
    """out += X, elementwise."""
    for i in range(X.shape[0]):
        for a in range(X.shape[1]):
            out[i, a] += X[i, a]


@_jit
def _copy(dst, src):  # pragma: no cover - compiled
    """dst = src, two 2-D arrays of one shape (a loop: an array assignment would compile Numba's
    broadcasting checks and their error messages, seconds of compile time)."""
    for i in range(src.shape[0]):
        for m in range(src.shape[1]):
            dst[i, m] = src[i, m]


@_jit
def _copy_t(dst, src):  # pragma: no cover - compiled
    """dst = src^T (dst is src.shape[::-1])."""
    for i in range(src.shape[0]):
        for m in range(src.shape[1]):
            dst[m, i] = src[i, m]


@_jit
def _qk_chunks(q, k, C, QK, ab):  # pragma: no cover - compiled
    """QK[c, :L, :L] = Q_c K_c^T for every chunk c of one group's q, k (T, dk)."""
    T = q.shape[0]
    for c in range((T + C - 1) // C):
        t0 = c * C
        L = min(C, T - t0)
        _gemm(_N, _T, 1.0, q[t0:t0 + L], k[t0:t0 + L], 0.0, QK[c, :L, :L], ab)


@_jit
def _scale_rows(S, w):  # pragma: no cover - compiled
    """S[i, :] *= w[i] (S is dk x dv: the state's rows are the key dimensions)."""
    for i in range(S.shape[0]):
        wi = w[i]
        for m in range(S.shape[1]):
            S[i, m] *= wi


@_jit
def _scale_cols(ST, w):  # pragma: no cover - compiled
    """ST[:, i] *= w[i] (ST is a transposed state, dv x dk)."""
    for m in range(ST.shape[0]):
        for i in range(ST.shape[1]):
            ST[m, i] *= w[i]


@_jit
def _advance(S, atot, W, X, Y, alpha, vector, transposed, Xs, ab):  # pragma: no cover - compiled
    """S <- diag(atot) S + alpha (W o X)^T Y over one chunk, or the same on S^T (dv x dk) when
    ``transposed``: the state update (W, X, Y = dout, K, V) and the backward's carry (din, Q, dO).
    A scalar gate's decay atot[0] goes to BLAS as beta; a vector gate's scales the rows of S
    first. Xs: scratch shaped like X."""
    beta = 1.0
    if vector is not None:
        if transposed:
            _scale_cols(S, atot)
        else:
            _scale_rows(S, atot)
    else:
        beta = atot[0]
    _gated_rows(W, X, Xs)
    if transposed:
        _gemm(_T, _N, alpha, Y, Xs, beta, S, ab)
    else:
        _gemm(_T, _N, alpha, Xs, Y, beta, S, ab)


@_jit
def _mask_by_decays(QKc, Ec, Ac, dAc, Pc, L):  # pragma: no cover - compiled
    """Scalar gates: A = Q K^T o E (zero above the diagonal) for a chunk of L steps; with ``dAc``
    (not None: the backward) also dA <- dA o E and on the way P[r, j] = sum_{i < j} W[r, i]
    (j <= r) with W[r, i] = E[r, i] (q_r . k_i)(do_r . v_i), for the fourth dlog_alpha term.
    QKc[r, i] = q_r . k_i; dAc[r, i] = do_r . v_i on entry."""
    for r in range(L):
        acc = 0.0
        for i in range(r + 1):
            e = Ec[r, i]
            a_ = QKc[r, i] * e
            Ac[r, i] = a_
            if dAc is not None:
                Pc[r, i] = acc
                acc += a_ * dAc[r, i]
                dAc[r, i] *= e
        for i in range(r + 1, L):  # set, not multiplied by 0: a non-finite future term
            Ac[r, i] = 0.0         # must not leak into the past
            if dAc is not None:
                dAc[r, i] = 0.0


# ---- vector gates (log_alpha (T, dk) per head: one decay per key dimension) ------------------
#
# Per chunk, with al[j, i] = alpha_{t0+j}[i] and E[r, s, i] = al[s+1, i] ... al[r, i] (s <= r):
#
#     din[j, i]  = al[0, i] ... al[j, i]           dout[j, i] = al[j+1, i] ... al[L-1, i]
#     A[r, s]    = sum_i q_r[i] k_s[i] E[r, s, i]  (s <= r; 0 above the diagonal)
#     O          = scale * ((din o Q) S0 + A V)        S_end = diag(atot) S0 + (dout o K)^T V
#
# The decays differ per dimension i, so A is not a masked Q K^T: it is formed pair by pair
# (``_vec_pairs``), E[r, s, :] as a running product over r for each s (the same products of
# alphas as the step-by-step recurrence, never exp(b_r) / exp(b_s)). The backward's dQ and dK
# need the same products, so the pair loop forms them too:
#
#     dQ[r] = din[r] o (scale dO_r S0^T) + scale sum_{s <= r} dA[r, s] k_s o E[r, s]
#     dK[s] = dout[s] o (V_s Gn^T)       + scale sum_{r >= s} dA[r, s] q_r o E[r, s]
#     dV    = (dout o K) Gn + scale A^T dO              Gn <- diag(atot) Gn + scale (din o Q)^T dO
#
# with dA[r, s] = do_r . v_s, and dlog_alpha per dimension (the scalar expansion, row by row):
#
#     dlog_alpha_j[i] = atot[i] sum_m S0[i, m] Gn[i, m]
#                     + sum_{r >= j} q_r[i] dQ_inter[r, i] + sum_{s < j} k_s[i] dK_inter[s, i]
#                     + scale sum_{r >= j > s} dA[r, s] q_r[i] k_s[i] E[r, s, i]


@_jit
def _vec_pairs(Q, K, al, L, A, e, w, dA, scale, dQa, dKa, T4, Wb):  # pragma: no cover - compiled
    """A[r, s] = sum_i q_r[i] k_s[i] E[r, s, i] for s <= r (0 above), E as running products.

    With ``dA`` (not None: the backward) also dQa[r] = sum_s dA[r, s] k_s o E[r, s],
    dKa[s] = sum_r dA[r, s] q_r o E[r, s] and T4[j] = sum_{r >= j > s} dA[r, s] q_r o k_s o E[r, s]
    (dQa, dKa, T4 are overwritten). e, w: dk scratch; Wb: L x dk scratch.
    """
    dk = Q.shape[1]
    if dA is not None:
        dQa[:, :] = 0.0
        dKa[:, :] = 0.0
        T4[:, :] = 0.0
    for s in range(L):
        for r in range(s):
            A[r, s] = 0.0
        ks = K[s]
        for i in range(dk):
            e[i] = 1.0
            w[i] = ks[i]
        for r in range(s, L):
            qr = Q[r]
            if r > s:
                ar = al[r]
                for i in range(dk):
                    ei = e[i] * ar[i]
                    e[i] = ei
                    w[i] = ks[i] * ei       # w = k_s o E[r, s]
            A[r, s] = _dot(qr, w)
            if dA is not None:
                g = dA[r, s]
                dq = dQa[r]
                dkk = dKa[s]
                if r > s:
                    wb = Wb[r]
                    for i in range(dk):
                        dq[i] += g * w[i]
                        dkk[i] += g * (qr[i] * e[i])
                        wb[i] = g * (qr[i] * w[i])
                else:
                    for i in range(dk):
                        dq[i] += g * w[i]
                        dkk[i] += g * qr[i]
        if dA is not None:
            # T4[j] += sum_{r >= j} Wb[r] for j = s+1 .. L-1 (suffix sums over r, this s only)
            for i in range(dk):
                e[i] = 0.0
            for r in range(L - 1, s, -1):
                wb = Wb[r]
                t4 = T4[r]
                for i in range(dk):
                    e[i] += wb[i]
                    t4[i] += e[i]


@_jit
def _forward_head(q, k, v, log_alpha, h0, scale, C, vector, o, h_T, QK):  # pragma: no cover
    """One (sequence, head): q, k (T, dk); v, o (T, dv); h0, h_T (dk, dv); log_alpha (T, 1), a
    scalar gate, or (T, dk), a vector gate (``vector``).

    Scalar gates: QK (>= n_chunks, C, C) holds the chunks' Q K^T from ``_qk_chunks`` (shared by
    the heads of a group). Vector gates form A pair by pair (``_vec_pairs``).
    """
    T, dk = q.shape
    ab = np.empty(2)
    gd = np.empty((2, C, log_alpha.shape[1]))
    din, dout = gd[0], gd[1]
    cc = np.empty((2, C, C))
    A, E = cc[0], cc[1]                     # E: scalar gates' decays
    al = np.empty((C if vector is not None else 0, dk))  # vector gates: the chunk's alphas
    Xd = np.empty((C, dk))
    ew = np.empty((2, dk))
    e, w = ew[0], ew[1]
    S = h_T  # the running state lives in the output
    for i in range(dk):
        for m in range(S.shape[1]):
            S[i, m] = h0[i, m]
    for t0 in range(0, T, C):
        L = min(C, T - t0)
        Q = q[t0:t0 + L]
        K = k[t0:t0 + L]
        Ac = A[:L, :L]
        Xc = Xd[:L]
        if vector is not None:
            _vec_decays(log_alpha, t0, L, al, din, dout)
        else:
            _decays(log_alpha, t0, L, E[:L, :L], din, dout)
        if vector is not None:
            _vec_pairs(Q, K, al, L, Ac, e, w, None, scale, Xc, Xc, Xc, Xc)
        else:
            _mask_by_decays(QK[t0 // C], E[:L, :L], Ac, None, Ac, L)
        # O = scale (din o Q) S0 + scale A V
        _gated_rows(din, Q, Xc)
        _gemm(_N, _N, scale, Xc, S, 0.0, o[t0:t0 + L], ab)
        _gemm(_N, _N, scale, Ac, v[t0:t0 + L], 1.0, o[t0:t0 + L], ab)
        # S_end = diag(atot) S0 + (dout o K)^T V
        _advance(S, din[L - 1], dout, K, v[t0:t0 + L], 1.0, vector, False, Xc, ab)


def _forward_worker(w, n_workers, q, k, v, log_alpha, h0, scale, C, grouped, vector, sb, st0, st1,
                    o, h_T):
    """Worker w of n_workers (a Python loop on its own thread over compiled code that releases
    the GIL): items w, w + n_workers, ... of the (sequence, group) items (``grouped``: Q K^T
    once per group) or of the (sequence, head) pairs. Sequence n is row sb[n], steps
    st0[n]:st1[n], state index n. log_alpha is (B, H, T, 1) for scalar gates, (B, H, T, dk) for
    vector gates, with ``vector`` None for scalar gates and True for vector gates: its type picks
    the code at compile time (Numba prunes the branches ``vector is None``), so that a call
    compiles the code of its own kind of gate only."""
    G, T = q.shape[1], q.shape[2]
    H = v.shape[1]
    hpg = H // G
    n_items = len(sb) * G if grouped else len(sb) * H
    ab = np.empty(2)
    QK = np.empty((max((T + C - 1) // C, 1), C, C))
    for item in range(w, n_items, n_workers):
        if grouped:
            n, g = divmod(item, G)
            heads = range(g * hpg, (g + 1) * hpg)
        else:
            n, h = divmod(item, H)
            g, heads = h // hpg, (h,)
        b, t0, t1 = sb[n], st0[n], st1[n]
        qn, kn = q[b, g, t0:t1], k[b, g, t0:t1]
        if vector is None:
            _qk_chunks(qn, kn, C, QK, ab)
        for h in heads:
            _forward_head(qn, kn, v[b, h, t0:t1], log_alpha[b, h, t0:t1], h0[n, h], scale, C,
                          vector, o[b, h, t0:t1], h_T[n, h], QK)


@_jit
def _chunk_starts(k, v, log_alpha, h0, C, vector, starts):  # pragma: no cover - compiled
    """Pass 1 of the backward of one (sequence, head): starts[c] = the state at the start of
    chunk c (the forward's state update, chunk by chunk), kept transposed, S^T (dv, dk), so that
    the backward's products with it read it in the order BLAS prefers. ``vector`` as in
    ``_vjp_head``. Called by the worker before ``_vjp_head`` (pass 2), not from it: a compiled
    function is compiled again inside each compiled caller, so the fewer levels the faster the
    first call."""
    T, dk_ = k.shape
    ab = np.empty(2)
    gd = np.empty((2, C, log_alpha.shape[1]))
    din, dout = gd[0], gd[1]
    E = np.empty((C, C))
    al = np.empty((C if vector is not None else 0, dk_))
    Xk = np.empty((C, dk_))
    S = np.empty((v.shape[1], dk_))
    _copy_t(S, h0)
    for c in range((T + C - 1) // C):
        t0 = c * C
        L = min(C, T - t0)
        _copy(starts[c], S)
        if vector is not None:
            _vec_decays(log_alpha, t0, L, al, din, dout)
        else:
            _decays(log_alpha, t0, L, E[:L, :L], din, dout)
        _advance(S, din[L - 1], dout, k[t0:t0 + L], v[t0:t0 + L], 1.0, vector, True, Xk[:L], ab)


@_jit
def _dq_dk_scalar(Q, K, V, dO, S0, GnT, din, dout, dAc, scale, Yq, Yk, dlc, Xv, sg,
                  ab):  # pragma: no cover - compiled
    """Scalar gates, one chunk: Yq = dQ = scale (din o dO) S0^T + scale (dA o E) K and
    Yk = dK = (dout o V) Gn^T + scale (dA o E)^T Q; dlc (L, 1) = dlog_alpha terms 1 and 2:
    atot <S0, Gn> (a dot product of dk*dv terms, through BLAS) and the suffix sums of
    rowdot(Q, dQ's first product). S0, Gn stored transposed; dA already masked by E.
    Xv (L, dv), sg (1, 1): scratch."""
    L, dk_ = Q.shape
    n = dk_ * V.shape[1]
    _gemm(_N, _T, 1.0, S0.reshape((1, n)), GnT.reshape((1, n)), 0.0, sg, ab)
    t1 = din[L - 1, 0] * sg[0, 0]
    _gated_rows(din, dO, Xv)
    _gemm(_N, _N, scale, Xv, S0, 0.0, Yq, ab)
    suf = 0.0
    for j in range(L - 1, -1, -1):
        suf += _dot(Q[j], Yq[j])
        dlc[j, 0] = t1 + suf
    _gemm(_N, _N, scale, dAc, K, 1.0, Yq, ab)
    _gated_rows(dout, V, Xv)
    _gemm(_N, _N, 1.0, Xv, GnT, 0.0, Yk, ab)
    _gemm(_T, _N, scale, dAc, Q, 1.0, Yk, ab)


@_jit
def _dq_dk_vector(Q, K, V, dO, S0, GnT, din, dout, dQa, dKa, scale, Yq, Yk, dlc, t1,
                  acc, ab):  # pragma: no cover - compiled
    """Vector gates, one chunk: Yq = dQ = din o (scale dO S0^T) + scale dQa and
    Yk = dK = dout o (V Gn^T) + scale dKa; dlc (L, dk) = dlog_alpha terms 1 to 3:
    atot[i] sum_m S0[i, m] Gn[i, m], the suffix sums of q_r o dQ_inter[r] and the prefix sums
    (s < j) of k_s o dK_inter[s]. S0, Gn stored transposed; dQa, dKa from ``_vec_pairs``."""
    L, dk_ = Q.shape
    atot = din[L - 1]
    for i in range(dk_):
        t1[i] = 0.0
    for m in range(V.shape[1]):
        for i in range(dk_):
            t1[i] += S0[m, i] * GnT[m, i]
    for i in range(dk_):
        t1[i] *= atot[i]
        acc[i] = 0.0
    _gemm(_N, _N, scale, dO, S0, 0.0, Yq, ab)
    for j in range(L - 1, -1, -1):
        for i in range(dk_):
            x = din[j, i] * Yq[j, i]
            Yq[j, i] = x
            acc[i] += Q[j, i] * x
            dlc[j, i] = t1[i] + acc[i]
    for j in range(L):
        for i in range(dk_):
            Yq[j, i] += scale * dQa[j, i]
    _gemm(_N, _N, 1.0, V, GnT, 0.0, Yk, ab)
    for i in range(dk_):
        acc[i] = 0.0
    for j in range(L):
        for i in range(dk_):
            x = dout[j, i] * Yk[j, i]
            Yk[j, i] = x + scale * dKa[j, i]
            dlc[j, i] += acc[i]
            acc[i] += K[j, i] * x


@_jit
def _vjp_head(q, k, v, log_alpha, h0, do, dh_T, has_dh_T, scale, C, vector,
              dq, dk, accumulate, dv, dla, dh0, starts, QK):  # pragma: no cover - compiled
    """One (sequence, head); log_alpha and dla (T, 1) for scalar gates, (T, dk) for vector gates
    (``vector``). dq, dk (T, dk) are written, or added to when ``accumulate``.

    ``starts`` (>= ceil(T / C), dv, dk) holds the chunk-start states S^T from ``_chunk_starts``,
    scratch reused across the heads one worker processes (a fresh allocation per head would
    page-fault every time).
    Scalar gates: ``QK`` holds the chunks' Q K^T from ``_qk_chunks`` (shared by the heads of a
    group).
    """
    T, dk_ = q.shape
    dv_ = v.shape[1]
    ab = np.empty(2)
    sg = np.empty((1, 1))
    gd = np.empty((2, C, log_alpha.shape[1]))
    din, dout = gd[0], gd[1]
    cc = np.empty((4, C, C))                # scalar gates' decays E and term-4 partial sums P
    A, dA, E, P = cc[0], cc[1], cc[2], cc[3]
    ck = np.empty((3, C, dk_))
    Xk, Yq, Yk = ck[0], ck[1], ck[2]
    Xv = np.empty((C, dv_))
    vk = np.empty((5, C if vector is not None else 0, dk_))    # vector gates only (``_vec_pairs``)
    al, dQa, dKa, T4, Wb = vk[0], vk[1], vk[2], vk[3], vk[4]
    d1 = np.empty((4, dk_))
    e, w, t1, acc = d1[0], d1[1], d1[2], d1[3]

    # Pass 2 (pass 1, ``_chunk_starts``, filled ``starts``): chunks in reverse, carrying Gn (the
    # cotangent of the state at the chunk end), also kept transposed: GnT = Gn^T (dv, dk).
    GnT = np.empty((dv_, dk_))
    if has_dh_T:
        _copy_t(GnT, dh_T)
    else:
        GnT[:, :] = 0.0
    for c in range((T + C - 1) // C - 1, -1, -1):
        t0 = c * C
        L = min(C, T - t0)
        Q = q[t0:t0 + L]
        K = k[t0:t0 + L]
        V = v[t0:t0 + L]
        dO = do[t0:t0 + L]
        dVc = dv[t0:t0 + L]
        dlc = dla[t0:t0 + L]
        Ac = A[:L, :L]
        dAc = dA[:L, :L]
        # dq, dk written in place when this head is the first (or only) contribution to them
        Yqc = Yq[:L] if accumulate else dq[t0:t0 + L]
        Ykc = Yk[:L] if accumulate else dk[t0:t0 + L]
        if vector is not None:
            _vec_decays(log_alpha, t0, L, al, din, dout)
        else:
            _decays(log_alpha, t0, L, E[:L, :L], din, dout)

        _gemm(_N, _T, 1.0, dO, V, 0.0, dAc, ab)   # dA[r, s] = do_r . v_s
        if vector is not None:
            _vec_pairs(Q, K, al, L, Ac, e, w, dAc, scale, dQa, dKa, T4, Wb)
            _dq_dk_vector(Q, K, V, dO, starts[c], GnT, din, dout, dQa, dKa, scale, Yqc, Ykc,
                          dlc, t1, acc, ab)
        else:
            _mask_by_decays(QK[c], E[:L, :L], Ac, dAc, P[:L, :L], L)
            _dq_dk_scalar(Q, K, V, dO, starts[c], GnT, din, dout, dAc, scale, Yqc, Ykc, dlc,
                          Xv[:L], sg, ab)

        # dV = (dout o K) Gn + scale A^T dO; scalar gates' dlog_alpha term 3 from
        # rowdot(V, (dout o K) Gn)
        _gated_rows(dout, K, Xk[:L])
        _gemm(_N, _T, 1.0, Xk[:L], GnT, 0.0, dVc, ab)
        if vector is None:
            pre = 0.0
            for j in range(L):
                dlc[j, 0] += pre
                pre += _dot(dVc[j], V[j])
        _gemm(_T, _N, scale, Ac, dO, 1.0, dVc, ab)

        # dlog_alpha term 4: scale sum_{r >= j > s} dA[r, s] (q_r o k_s) E[r, s]
        for j in range(L):
            if vector is not None:
                for i in range(dk_):
                    dlc[j, i] += scale * T4[j, i]
            else:
                x = 0.0
                for r in range(j, L):
                    x += P[r, j]
                dlc[j, 0] += scale * x

        # carry into the previous chunk: Gn <- diag(atot) Gn + scale (din o Q)^T dO, transposed
        _advance(GnT, din[L - 1], din, Q, dO, scale, vector, True, Xk[:L], ab)
        if accumulate:
            _add_into(dq[t0:t0 + L], Yqc)
            _add_into(dk[t0:t0 + L], Ykc)
    _copy_t(dh0, GnT)


def _vjp_worker(w, n_workers, q, k, v, log_alpha, h0, do, dh_T, has_dh_T, scale, C, vector,
                sb, st0, st1, per_head, dq, dk, dv, dla, dh0):
    """Worker w of n_workers (as ``_forward_worker``): items w, w + n_workers, ... of the
    (sequence, head) pairs when ``per_head`` (dq, dk (B, H, T, dk), one head each), else of the
    (sequence, group) items, whose heads run in order, adding into dq, dk (B, G, T, dk).
    log_alpha and dla are (B, H, T, 1) for scalar gates, (B, H, T, dk) for vector gates
    (``vector`` None or True, as in ``_forward_worker``)."""
    G, T, dk_ = q.shape[1], q.shape[2], q.shape[3]
    H, dv_ = v.shape[1], v.shape[3]
    hpg = H // G
    n_chunks = max((T + C - 1) // C, 1)
    per_item = H if per_head else G            # items per sequence
    ab = np.empty(2)
    starts = np.empty((n_chunks, dv_, dk_))
    QK = np.empty((n_chunks, C, C))
    for item in range(w, len(sb) * per_item, n_workers):
        n, x = divmod(item, per_item)          # x: the head (per_head) or the group
        g = x // hpg if per_head else x
        b, t0, t1 = sb[n], st0[n], st1[n]
        qn, kn = q[b, g, t0:t1], k[b, g, t0:t1]
        if vector is None:
            _qk_chunks(qn, kn, C, QK, ab)
        for j, h in enumerate((x,) if per_head else range(g * hpg, (g + 1) * hpg)):
            _chunk_starts(kn, v[b, h, t0:t1], log_alpha[b, h, t0:t1], h0[n, h], C, vector, starts)
            _vjp_head(qn, kn, v[b, h, t0:t1], log_alpha[b, h, t0:t1], h0[n, h], do[b, h, t0:t1],
                      dh_T[n, h] if has_dh_T else dh_T[0, 0], has_dh_T, scale, C, vector,
                      dq[b, x, t0:t1], dk[b, x, t0:t1], j > 0, dv[b, h, t0:t1], dla[b, h, t0:t1],
                      dh0[n, h], starts, QK)


def _group_sum(xh, G):
    """out[b, g] = (xh[b, g*hpg] + xh[b, g*hpg + 1]) + ... (left to right, a fixed order)."""
    B, H, T, d = xh.shape
    x = xh.reshape(B, G, H // G, T, d)
    out = x[:, :, 0].copy()
    for j in range(1, H // G):
        out += x[:, :, j]
    return out


def _c64(x):
    return np.ascontiguousarray(x, dtype=np.float64)


_CONTROLLER = None


def _one_blas_thread():
    """Context that holds BLAS to one thread (dgemm inside the workers)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        # numba_xxgemm (also behind np.dot) calls the BLAS that scipy.linalg.cython_blas loads
        # (imported at the top of this module, before the controller takes its inventory; else
        # that BLAS is left unlimited)
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


def _spans(B: int, T: int, cu_seqlens):
    """(row, start, end) arrays of the independent sequences; their index is the state index."""
    if cu_seqlens is None:
        return (np.arange(B, dtype=np.int64), np.zeros(B, dtype=np.int64),
                np.full(B, T, dtype=np.int64))
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    N = len(cu) - 1
    return np.zeros(N, dtype=np.int64), np.ascontiguousarray(cu[:-1]), np.ascontiguousarray(cu[1:])


def _gates(log_alpha):
    """(log_alpha as the kernels take it, vector?, chunk size): scalar gates get a trailing axis
    of 1 so that both kinds are 4-D (one compiled driver)."""
    if log_alpha.ndim == 4:
        return log_alpha, True, VCHUNK
    return log_alpha[..., None], False, CHUNK


def forward(q, k, v, log_alpha, h0, scale=1.0, cu_seqlens=None):
    """Return (o, h_T) of the recurrence. o: (B, H, T, dv), h_T: (B, H, dk, dv) ((N, H, dk, dv)
    with cu_seqlens). log_alpha (B, H, T) or (B, H, T, dk) (vector gates)."""
    q, k, v, log_alpha, h0 = _c64(q), _c64(k), _c64(v), _c64(log_alpha), _c64(h0)
    B, H, T, dv = v.shape
    G, dk = q.shape[1], q.shape[3]
    sb, st0, st1 = _spans(B, T, cu_seqlens)
    NS = len(sb)
    la4, vector, C = _gates(log_alpha)
    o = np.zeros((B, H, T, dv))
    h_T = np.empty((NS, H, dk, dv))
    n_threads = get_num_threads()
    grouped = NS * G >= n_threads
    n_workers = max(1, min(n_threads, NS * G if grouped else NS * H))
    with _one_blas_thread():
        run_workers(_forward_worker, n_workers, q, k, v, la4, h0, float(scale), C, grouped,
             True if vector else None, sb, st0, st1, o, h_T)
    return o, h_T


def vjp(q, k, v, log_alpha, h0, do, dh_T=None, scale=1.0, per_head=False, cu_seqlens=None):
    """Return (dq, dk, dv, dlog_alpha, dh0): the gradient of L = sum(o * do) + sum(h_T * dh_T).

    With ``per_head=True`` dq and dk come back per head, (B, H, T, dk), before the group sum.
    dlog_alpha has log_alpha's shape; dh0 h0's ((N, H, dk, dv) with cu_seqlens).
    """
    q, k, v, log_alpha, h0, do = (_c64(q), _c64(k), _c64(v), _c64(log_alpha), _c64(h0),
                                  _c64(do))
    B, G, T, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    sb, st0, st1 = _spans(B, T, cu_seqlens)
    NS = len(sb)
    la4, vector, C = _gates(log_alpha)
    has_dh_T = dh_T is not None
    dh_T_arr = _c64(dh_T) if has_dh_T else np.zeros((1, 1, dk, dv))
    dvv = np.zeros((B, H, T, dv))
    dla4 = np.zeros(la4.shape)
    dla = dla4 if vector else dla4[..., 0]
    dh0 = np.empty((NS, H, dk, dv))
    if H == 0:
        # no head uses q or k: their gradients are sums of nothing, zeros (the group sum below
        # would read past the per-head buffers)
        qk_shape = (B, 0, T, dk) if per_head else (B, G, T, dk)
        return np.zeros(qk_shape), np.zeros(qk_shape), dvv, dla, dh0
    n_threads = get_num_threads()
    grouped = not (per_head or G == H or NS * G < n_threads)
    n_workers = max(1, min(n_threads, NS * G if grouped else NS * H))
    args = (q, k, v, la4, h0, do, dh_T_arr, has_dh_T, float(scale), C, True if vector else None,
            sb, st0, st1)
    with _one_blas_thread():
        if not grouped:
            dqh = np.zeros((B, H, T, dk))
            dkh = np.zeros((B, H, T, dk))
            run_workers(_vjp_worker, n_workers, *args, True, dqh, dkh, dvv, dla4, dh0)
            if per_head or G == H:
                return dqh, dkh, dvv, dla, dh0
            dq = _group_sum(dqh, G)
            del dqh
            return dq, _group_sum(dkh, G), dvv, dla, dh0
        dq = np.zeros((B, G, T, dk))
        dkg = np.zeros((B, G, T, dk))
        run_workers(_vjp_worker, n_workers, *args, False, dq, dkg, dvv, dla4, dh0)
        return dq, dkg, dvv, dla, dh0


# The one line on stderr while a per-head function compiles (glaref._numba_cache); seconds: the
# CPU time of the first call's compile with a cold cache on a 2-core x86-64 machine
# (docs/reports/cold_start_cpu.txt gives the whole process's, ~1.5 s more: starting Python and
# Numba).
def _what(part, vector_index):
    def what(args):
        gates = "scalar" if isinstance(args[vector_index], types.NoneType) else "vector"
        return f"the float64 oracle ({part}, {gates} gates)"
    return what


note_compile(_forward_head, _what("forward", 7), 4)
note_compile(_vjp_head, _what("gradients", 10), 6)
