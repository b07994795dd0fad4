"""A failing kernel end to end: its table row, the diagnosis line and the plot.

``handoff_bug`` is a chunked gated linear-attention kernel (C = 16, JAX autodiff) with one bug
of a kind that is common in chunked kernels: the state handed to the next chunk is decayed by
the chunk's decay *without its last step* (exp(b_{C-2}) instead of exp(b_{C-1})). Run

    python3 examples/failing_example.py [PLOT.png]

to audit it as a user would (``glaref audit --impl examples/failing_example.py:handoff_bug
--chunk-size 16 ...``): the row fails, the line under it says where the error is and what it
points to, and the plot shows the error against t with the chunk boundaries and the allowed band
(docs/where.md shows the output).
"""

from __future__ import annotations

import os
import sys

C = 16


def handoff_bug(q, k, v, log_alpha, h0):
    """(q, k, v, log_alpha, h0) -> (o, h_T), canonical "bhtd"; the bug is marked below."""
    import jax.numpy as jnp
    from jax import lax

    B, G, T, dk = q.shape
    H, dv = v.shape[1], v.shape[3]
    N = -(-T // C)
    qh, kh = (jnp.repeat(x, H // G, axis=1) for x in (q, k))

    def chunks(x):                # (B, H, T, ...) -> (N, B, H, C, ...), zero-padded
        x = jnp.pad(x, [(0, 0), (0, 0), (0, N * C - T)] + [(0, 0)] * (x.ndim - 3))
        return jnp.moveaxis(x.reshape(x.shape[:2] + (N, C) + x.shape[3:]), 2, 0)

    i = jnp.arange(C)
    causal = i[:, None] >= i[None, :]
    hp = "highest"

    def step(S, xs):
        Qc, Kc, Vc, la = xs
        b = jnp.cumsum(la, axis=-1)                             # b_i, inclusive
        D = jnp.where(causal, jnp.exp(jnp.where(causal, b[..., :, None] - b[..., None, :], 0.0)), 0.0)
        o = (jnp.einsum("bhij,bhjv->bhiv", jnp.einsum("bhik,bhjk->bhij", Qc, Kc, precision=hp) * D,
                        Vc, precision=hp)
             + jnp.exp(b)[..., None] * jnp.einsum("bhik,bhkv->bhiv", Qc, S, precision=hp))
        decay = jnp.exp(b[..., -2])        # BUG: the chunk's decay is exp(b[..., -1])
        S = (decay[..., None, None] * S
             + jnp.einsum("bhjk,bhjv->bhkv", jnp.exp(b[..., -1:] - b)[..., None] * Kc, Vc,
                          precision=hp))
        return S, o

    h_T, O = lax.scan(step, h0, (chunks(qh), chunks(kh), chunks(v), chunks(log_alpha)))
    o = jnp.moveaxis(O, 0, 2).reshape(B, H, N * C, dv)[:, :, :T]
    return o, h_T


def main(argv: list[str]) -> int:
    from glaref.cli import main as glaref_main

    plot = argv[0] if argv else os.path.join("docs", "where_example.png")
    here = os.path.relpath(__file__)
    return glaref_main(["audit", "--impl", f"{here}:handoff_bug", "--chunk-size", str(C),
                        "--config", "1,2,4,16,16", "--seq", "130", "--mode", "fwd_bwd",
                        "--repeats", "0", "--probes", "determinism,causality", "--no-progress",
                        "--plot", plot])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
