"""Deliberately broken JAX kernels ("mutants"), each audited by glaref's engine as a user kernel.

Each mutant is a plausible real bug in a chunked scalar-gated linear-attention kernel. All are
callables ``(q, k, v, log_alpha, h0) -> (o, h_T)`` on canonical "bhtd" JAX arrays, differentiable
with ``jax.vjp``. They are built from one compact *correct* chunked kernel with a hand-written
``jax.custom_vjp`` (``base``), written here on purpose instead of importing glaref.kernels: a
mutant must differ from a known-correct kernel by exactly one bug. Within chunk n, with b_i the
inclusive cumulative sum of log_alpha from the chunk's start and S the state entering the chunk:

    o_i   = sum_{j <= i} (q_i . k_j) exp(b_i - b_j) v_j + exp(b_i) q_i S
    S'    = exp(b_last) S + sum_j exp(b_last - b_j) k_j^T v_j
    dS    = exp(b_last) dS' + sum_i exp(b_i) q_i^T do_i                      (dh0 = dS of chunk 0)
    dlog_alpha_t = sum_{s >= t, s in chunk} (q_s . dq_s - k_s . dk_s) + <S', dS'>  (per-head dq, dk;
                   S' and dS' the state after the chunk and its cotangent: the identity applied
                   chunk by chunk, as flash-linear-attention's kernels do)

The audit engine judges them like any user kernel (tests/test_detection.py,
tools/detection_table.py): ``glaref.audit(list(MUTANTS.values()), ..., chunk_size=MUTANT_CHUNK)``
from Python, or ``glaref audit --impl tests/mutants.py:gate_late --chunk-size 16`` on the command
line (every mutant is also a module attribute under its name, and its ``__qualname__`` is that
name, so records and tables show it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

BASE_CHUNK = 16

MUTANT_DOCS = {
    "gate_late": "gate applied one step late: S_t = alpha_{t-1} S_{t-1} + k_t^T v_t",
    "exclusive_cumsum": "exclusive instead of inclusive cumsum of log_alpha inside a chunk",
    "h0_not_decayed": "the initial state enters the first chunk without its decay",
    "h0_decayed_twice": "the first chunk's decay applied twice to the initial state",
    "group_sum_wrong_axis": "dq, dk summed over the wrong axis of (G, H/G) (visible when G > 1 and H/G > 1)",
    "dla_missing_hT": "the <h_T, dh_T> term (the last chunk's tail) missing from the dlog_alpha identity",
    "chunk_off_by_one": "state handed to the next chunk decayed by exp(b_{C-2}) instead of exp(b_{C-1})",
    "tf32_matmul": "every matmul input rounded to TF32 (10 explicit mantissa bits)",
    "bf16_states": "chunk states (and their cotangents) stored in bfloat16 between chunks",
    "odd_truncation": "dk and dv truncated to even sizes (the last feature dropped when odd)",
    "split_exp": "decays formed as exp(b_i) * exp(-b_j) (overflows under strong decay)",
}
MUTANT_NAMES = tuple(MUTANT_DOCS)

# One mutant per pattern of glaref._audit._where that the mutants above do not show in the standard and
# strong_decay regimes at even sizes (tests/test_where.py), and one per probe of glaref._audit._probes
# (tests/test_probes.py). Kept apart from MUTANTS, whose every member tests/test_detection.py
# expects flagged by the verdict: the probe mutants pass it on purpose.
PATTERN_DOCS = {
    "head_group_map": "heads mapped to q/k groups by tiling (h % G) instead of repeating (h // (H/G))",
    "ragged_tail": "the last partial chunk's mask one row short (its last valid row dropped)",
    "global_cumsum_f16": "decays from a whole-sequence cumulative sum of log_alpha held in float16",
    "wrong_scale": "q scaled by a constant off by 2^-10 (a wrong or badly rounded scale)",
    "dv_tile": "the dv tile covers only the first dv - dv // 4 columns (the rest never written)",
}
PROBE_DOCS = {
    "nondeterministic": "a reduction whose order changes from run to run: the last bit of ~1% "
                        "of o's elements flips at random (within every tolerance)",
    "reads_ahead": "the in-chunk causal mask one step wide: o_t reads k_{t+1}, v_{t+1}",
    "packed_leak": "packed sequences run as one: the state is not reset at sequence starts",
    "state_reads_ahead": "each packed sequence's final state takes in the step after its end "
                         "(k_e^T v_e at its end offset e < T): the future in the state only",
}

# the probe each probe mutant fails (tests/test_probes.py, tools/where_table.py)
PROBE_EXPECTED = {"nondeterministic": "determinism", "reads_ahead": "causality",
                  "packed_leak": "packed", "state_reads_ahead": "causality"}


@dataclass(frozen=True)
class _Flags:
    chunk: int = BASE_CHUNK
    exclusive_cumsum: bool = False
    h0_not_decayed: bool = False
    h0_decayed_twice: bool = False
    group_sum_wrong_axis: bool = False
    dla_missing_hT: bool = False
    chunk_off_by_one: bool = False
    tf32_matmul: bool = False
    bf16_states: bool = False
    split_exp: bool = False
    head_group_map: bool = False
    ragged_tail: bool = False
    global_cumsum_f16: bool = False
    reads_ahead: bool = False


def _build(flags: _Flags):
    """The chunked kernel with the bugs switched on in ``flags``: (q, k, v, la, h0) -> (o, h_T)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    f32 = jnp.float32
    C = flags.chunk

    def mm(x):
        if flags.tf32_matmul:
            return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
        return x

    def ein(spec, a, b):
        return jnp.einsum(spec, mm(a), mm(b), precision=lax.Precision.HIGHEST)

    def keep_state(S):
        return S.astype(jnp.bfloat16).astype(f32) if flags.bf16_states else S

    def chunks(x, T, N):
        """(B, H, T, ...) -> (B, H, N, C, ...), zero-padded in time."""
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, N * C - T)
        x = jnp.pad(x, pad)
        return x.reshape(x.shape[:2] + (N, C) + x.shape[3:])

    def prepare(q, k, v, la, H):
        B, G, T, dk = q.shape
        N = max(1, -(-T // C))
        heads = (lambda x: jnp.tile(x, (1, H // G, 1, 1))) if flags.head_group_map else \
            (lambda x: jnp.repeat(x, H // G, axis=1))
        qh, kh, vf = heads(q.astype(f32)), heads(k.astype(f32)), v.astype(f32)
        if flags.ragged_tail and T % C:
            kh, vf = kh.at[:, :, T - 1].set(0.0), vf.at[:, :, T - 1].set(0.0)
        Q, K, V, L = (chunks(x, T, N) for x in (qh, kh, vf, la.astype(f32)))
        b = jnp.cumsum(L, axis=-1)
        if flags.global_cumsum_f16:
            # prefix sums over the whole sequence, rounded to float16; in-chunk sums as their
            # differences from the previous chunk's end
            Bg = jnp.cumsum(L.reshape(L.shape[:2] + (N * C,)), axis=-1)
            Bg = Bg.astype(jnp.float16).astype(f32).reshape(L.shape)
            prev = jnp.concatenate([jnp.zeros_like(Bg[..., :1, -1]), Bg[..., :-1, -1]], axis=-1)
            b = Bg - prev[..., None]
        if flags.exclusive_cumsum:
            b = b - L
        mask = jnp.tril(jnp.ones((C, C), dtype=bool), 1 if flags.reads_ahead else 0)
        diff = jnp.where(mask, b[..., :, None] - b[..., None, :], 0.0)
        b_last = b[..., -2] if (flags.chunk_off_by_one and C >= 2) else b[..., -1]
        if flags.split_exp:
            D = jnp.where(mask, jnp.exp(b)[..., :, None] * jnp.exp(-b)[..., None, :], 0.0)
            e_out = jnp.exp(b[..., -1:]) * jnp.exp(-b)
        else:
            D = jnp.where(mask, jnp.exp(diff), 0.0)
            e_out = jnp.exp(b[..., -1:] - b)
        e_in = jnp.exp(b)
        e_tot = jnp.exp(b_last)
        # The initial state's decay in chunk 0 (the h0 bugs change only these).
        if flags.h0_not_decayed:
            e_in = e_in.at[:, :, 0].set(1.0)
            e_tot = e_tot.at[:, :, 0].set(1.0)
        if flags.h0_decayed_twice:
            e_in = e_in.at[:, :, 0].multiply(e_in[:, :, 0])
            e_tot = e_tot.at[:, :, 0].multiply(e_tot[:, :, 0])
        return Q, K, V, D, e_in, e_out, e_tot, qh, kh

    def states(K, V, e_out, e_tot, h0):
        """S before each chunk (N, B, H, dk, dv) and the final state."""
        def step(S, x):
            Kn, Vn, eo, et = x
            S_new = keep_state(et[..., None, None] * S + ein("bhjd,bhjv->bhdv", Kn * eo[..., None], Vn))
            return S_new, S
        xs = (jnp.moveaxis(K, 2, 0), jnp.moveaxis(V, 2, 0), jnp.moveaxis(e_out, 2, 0),
              jnp.moveaxis(e_tot, 2, 0))
        h_T, S_in = lax.scan(step, keep_state(h0.astype(f32)), xs)
        return S_in, h_T

    def forward(q, k, v, la, h0):
        B, G, T, dk = q.shape
        H = v.shape[1]
        Q, K, V, D, e_in, e_out, e_tot, _, _ = prepare(q, k, v, la, H)
        S_in, h_T = states(K, V, e_out, e_tot, h0)
        A = ein("bhnid,bhnjd->bhnij", Q, K) * D
        o = ein("bhnij,bhnjv->bhniv", A, V)
        o = o + ein("bhnid,nbhdv->bhniv", Q * e_in[..., None], S_in)
        o = o.reshape(o.shape[:2] + (o.shape[2] * C, o.shape[-1]))[:, :, :T]
        return o.astype(v.dtype), h_T

    @jax.custom_vjp
    def kernel(q, k, v, la, h0):
        return forward(q, k, v, la, h0)

    def fwd(q, k, v, la, h0):
        return forward(q, k, v, la, h0), (q, k, v, la, h0)

    def bwd(res, cts):
        q, k, v, la, h0 = res
        do, dh_T = cts
        B, G, T, Dk = q.shape
        H = v.shape[1]
        N = max(1, -(-T // C))
        Q, K, V, D, e_in, e_out, e_tot, qh, kh = prepare(q, k, v, la, H)
        S_in, h_T = states(K, V, e_out, e_tot, h0)
        dO = chunks(do.astype(f32), T, N)
        dh_T = dh_T.astype(f32)

        def step(dS, x):
            Qn, dOn, ein_n, eo, et = x
            # dS is the cotangent of the state after this chunk; eo is unused here.
            dS_prev = keep_state(et[..., None, None] * dS
                                 + ein("bhid,bhiv->bhdv", Qn * ein_n[..., None], dOn))
            return dS_prev, dS
        xs = tuple(jnp.moveaxis(x, 2, 0) for x in (Q, dO, e_in, e_out, e_tot))
        dh0, dS_out = lax.scan(step, dh_T, xs, reverse=True)   # dS_out[n]: cotangent after chunk n

        A = ein("bhnid,bhnjd->bhnij", Q, K) * D
        dA = ein("bhniv,bhnjv->bhnij", dO, V) * D
        dq = ein("bhnij,bhnjd->bhnid", dA, K) + e_in[..., None] * ein("bhniv,nbhdv->bhnid", dO, S_in)
        dk = ein("bhnij,bhnid->bhnjd", dA, Q) + e_out[..., None] * ein("bhnjv,nbhdv->bhnjd", V, dS_out)
        dv = ein("bhnij,bhniv->bhnjv", A, dO) + e_out[..., None] * ein("bhnjd,nbhdv->bhnjv", K, dS_out)

        def unchunk(x):
            return x.reshape(x.shape[:2] + (N * C, x.shape[-1]))[:, :, :T]
        dq, dk, dv = unchunk(dq), unchunk(dk), unchunk(dv)
        # the identity chunk by chunk: in-chunk reverse cumsum plus <S_{n+1}, dS_{n+1}> (the
        # state after the chunk and its cotangent), which carries everything beyond the chunk
        # and equals <h_T, dh_T> for the last one
        terms = chunks(jnp.sum(qh * dq, -1) - jnp.sum(kh * dk, -1), T, N)      # (B, H, N, C)
        S_after = jnp.concatenate([S_in[1:], h_T[None]], axis=0)               # (N, B, H, dk, dv)
        tail = jnp.moveaxis(jnp.sum(S_after * dS_out, axis=(-2, -1)), 0, 2)    # (B, H, N)
        if flags.dla_missing_hT:
            tail = tail.at[:, :, -1].set(0.0)
        dla = jnp.flip(jnp.cumsum(jnp.flip(terms, -1), -1), -1) + tail[..., None]
        dla = dla.reshape(dla.shape[:2] + (N * C,))[:, :, :T]
        R = H // G
        if flags.group_sum_wrong_axis or flags.head_group_map:
            dq_g = dq.reshape(B, R, G, T, Dk).sum(1)
            dk_g = dk.reshape(B, R, G, T, Dk).sum(1)
        else:
            dq_g = dq.reshape(B, G, R, T, Dk).sum(2)
            dk_g = dk.reshape(B, G, R, T, Dk).sum(2)
        return (dq_g.astype(q.dtype), dk_g.astype(k.dtype), dv.astype(v.dtype),
                dla.astype(la.dtype), dh0.astype(h0.dtype))

    kernel.defvjp(fwd, bwd)
    return kernel


@functools.lru_cache(maxsize=None)
def _kernel(flags: _Flags):
    return _build(flags)


def base(q, k, v, log_alpha, h0):
    """The correct chunked kernel (C = 16) that every mutant modifies."""
    return _kernel(_Flags())(q, k, v, log_alpha, h0)


def scan_kernel(q, k, v, log_alpha, h0):
    """A correct step-by-step kernel: lax.scan over time, differentiated by JAX."""
    import jax.numpy as jnp
    from jax import lax

    H = v.shape[1]
    f32 = jnp.float32
    qh = jnp.repeat(q.astype(f32), H // q.shape[1], axis=1)
    kh = jnp.repeat(k.astype(f32), H // k.shape[1], axis=1)

    def step(S, x):
        q_t, k_t, v_t, a_t = x
        S = jnp.exp(a_t)[..., None, None] * S + k_t[..., :, None] * v_t[..., None, :]
        return S, jnp.einsum("bhd,bhdv->bhv", q_t, S, precision="highest")
    xs = (jnp.moveaxis(qh, 2, 0), jnp.moveaxis(kh, 2, 0), jnp.moveaxis(v.astype(f32), 2, 0),
          jnp.moveaxis(log_alpha.astype(f32), 2, 0))
    h_T, o = lax.scan(step, h0.astype(f32), xs)
    return jnp.moveaxis(o, 0, 2).astype(v.dtype), h_T


def _gate_late(q, k, v, log_alpha, h0):
    import jax.numpy as jnp

    shifted = jnp.concatenate([jnp.zeros_like(log_alpha[..., :1]), log_alpha[..., :-1]], axis=-1)
    return base(q, k, v, shifted, h0)


def _odd_truncation(q, k, v, log_alpha, h0):
    import jax.numpy as jnp

    dk, dv = q.shape[-1], v.shape[-1]
    ek, ev = dk - dk % 2, dv - dv % 2
    o, h_T = base(q[..., :ek], k[..., :ek], v[..., :ev], log_alpha, h0[..., :ek, :ev])
    o = jnp.pad(o, [(0, 0)] * 3 + [(0, dv - ev)])
    h_T = jnp.pad(h_T, [(0, 0)] * 2 + [(0, dk - ek), (0, dv - ev)])
    return o, h_T


def _flagged(name: str) -> Callable:
    kern = _kernel(_Flags(**{name: True}))

    def mutant(q, k, v, log_alpha, h0):
        return kern(q, k, v, log_alpha, h0)
    mutant.__name__ = name
    return mutant


def _wrong_scale(q, k, v, log_alpha, h0):
    return base(q * (1.0 - 2.0**-10), k, v, log_alpha, h0)


def _dv_tile(q, k, v, log_alpha, h0):
    import jax.numpy as jnp

    dv = v.shape[-1]
    ev = dv - dv // 4
    o, h_T = base(q, k, v[..., :ev], log_alpha, h0[..., :ev])
    return jnp.pad(o, [(0, 0)] * 3 + [(0, dv - ev)]), jnp.pad(h_T, [(0, 0)] * 3 + [(0, dv - ev)])


def _flip_bits(o):
    """~1% of o's elements, drawn afresh on every call, times (1 + 2^-23): one float32 ulp."""
    rng = np.random.default_rng()
    o = np.asarray(o)
    return np.where(rng.random(o.shape) < 0.01, 1.0 + 2.0**-23, 1.0).astype(o.dtype)


def _nondeterministic(q, k, v, log_alpha, h0):
    import jax

    o, h_T = base(q, k, v, log_alpha, h0)
    factor = jax.pure_callback(_flip_bits, jax.ShapeDtypeStruct(o.shape, o.dtype),
                               jax.lax.stop_gradient(o))
    return o * jax.lax.stop_gradient(factor), h_T


def _packed_leak(q, k, v, log_alpha, h0, cu_seqlens=None):
    """glaref.kernels.chunked (C = 16), but packed sequences run as one row from h0[0]: sequence
    n starts from the state the previous one left, and h_T[n] is the state at its end."""
    import jax.numpy as jnp

    from glaref import kernels

    run = functools.partial(kernels.chunked, chunk_size=BASE_CHUNK, return_final_state=True)
    if cu_seqlens is None:
        return run(q, k, v, log_alpha, h0)
    o, _ = run(q, k, v, log_alpha, h0[:1])
    ends = [int(c) for c in cu_seqlens[1:]]
    h_T = [h0[0] if c == 0 else run(q[:, :, :c], k[:, :, :c], v[:, :, :c], log_alpha[:, :, :c],
                                    h0[:1])[1][0] for c in ends]
    return o, jnp.stack(h_T)


def _state_reads_ahead(q, k, v, log_alpha, h0, cu_seqlens=None):
    """glaref.kernels.chunked (C = 16), but with packed sequences the final state of each one
    adds k_e^T v_e, the step right after its end e (when e < T): every output right, unpacked
    (no step after T) the kernel is correct, and only the states see the future."""
    import jax.numpy as jnp

    from glaref import kernels

    run = functools.partial(kernels.chunked, chunk_size=BASE_CHUNK, return_final_state=True)
    if cu_seqlens is None:
        return run(q, k, v, log_alpha, h0)
    o, h_T = run(q, k, v, log_alpha, h0, cu_seqlens=cu_seqlens)
    T, H = q.shape[2], v.shape[1]
    kh = jnp.repeat(k, H // k.shape[1], axis=1)
    ahead = [kh[0, :, e, :, None] * v[0, :, e, None, :] if e < T else jnp.zeros_like(h_T[0])
             for e in (int(c) for c in cu_seqlens[1:])]
    return o, h_T + jnp.stack(ahead).astype(h_T.dtype)


def _named(table: dict[str, Callable], docs: dict[str, str]) -> dict[str, Callable]:
    for _name, _fn in table.items():
        _fn.__doc__ = docs[_name]
        _fn.__name__ = _fn.__qualname__ = _name
        globals()[_name] = _fn          # so "tests/mutants.py:<name>" names it for the CLI
    return table


MUTANTS: dict[str, Callable] = _named({
    name: (_gate_late if name == "gate_late" else _odd_truncation if name == "odd_truncation"
           else _flagged(name))
    for name in MUTANT_NAMES
}, MUTANT_DOCS)
PATTERN_MUTANTS: dict[str, Callable] = _named({
    "head_group_map": _flagged("head_group_map"), "ragged_tail": _flagged("ragged_tail"),
    "global_cumsum_f16": _flagged("global_cumsum_f16"), "wrong_scale": _wrong_scale,
    "dv_tile": _dv_tile}, PATTERN_DOCS)
PROBE_MUTANTS: dict[str, Callable] = _named({
    "nondeterministic": _nondeterministic, "reads_ahead": _flagged("reads_ahead"),
    "packed_leak": _packed_leak, "state_reads_ahead": _state_reads_ahead}, PROBE_DOCS)
# chunk size each mutant's bound is computed with (all are chunked kernels built on ``base``)
MUTANT_CHUNK = BASE_CHUNK
