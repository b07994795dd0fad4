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
        qh = jnp.repeat(q.astype(f32), H // G, axis=1)
        kh = jnp.repeat(k.astype(f32), H // G, axis=1)
        Q, K, V, L = (chunks(x, T, N) for x in (qh, kh, v.astype(f32), la.astype(f32)))
        b = jnp.cumsum(L, axis=-1)
        if flags.exclusive_cumsum:
            b = b - L
        mask = jnp.tril(jnp.ones((C, C), dtype=bool))
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
        if flags.group_sum_wrong_axis:
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


MUTANTS: dict[str, Callable] = {
    name: (_gate_late if name == "gate_late" else _odd_truncation if name == "odd_truncation"
           else _flagged(name))
    for name in MUTANT_NAMES
}
for _name, _fn in MUTANTS.items():
    _fn.__doc__ = MUTANT_DOCS[_name]
    _fn.__name__ = _fn.__qualname__ = _name
    globals()[_name] = _fn          # so "tests/mutants.py:<name>" names it for the CLI
# chunk size each mutant's bound is computed with (all are chunked kernels built on ``base``)
MUTANT_CHUNK = BASE_CHUNK
