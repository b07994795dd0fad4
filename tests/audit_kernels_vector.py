"""User kernels for the vector-gate and packed-sequence audit tests (tests/test_audit_vector.py),
loaded by path as the CLI loads a user's file. Each takes "bhtd" JAX arrays."""

from __future__ import annotations


def per_sequence(q, k, v, log_alpha, h0, *, cu_seqlens):
    """Packed sequences done right, by hand: every sequence through glaref.kernels.scan on its own
    (from h0[n]), the outputs concatenated in time and the final states stacked."""
    import jax.numpy as jnp

    from glaref import kernels

    outs, states = [], []
    for n in range(len(cu_seqlens) - 1):
        t0, t1 = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if t0 == t1:                       # an empty sequence: no output, h_T = h0
            states.append(h0[n:n + 1].astype(jnp.float32))
            continue
        o, h_T = kernels.scan(q[:, :, t0:t1], k[:, :, t0:t1], v[:, :, t0:t1],
                              log_alpha[:, :, t0:t1], h0[n:n + 1], return_final_state=True)
        outs.append(o)
        states.append(h_T)
    return jnp.concatenate(outs, axis=2), jnp.concatenate(states, axis=0)


def no_restart(q, k, v, log_alpha, h0, *, cu_seqlens):
    """Packed sequences done wrong: the state runs on across every boundary from h0[0] (a kernel
    that ignores cu_seqlens), the one final state repeated for every sequence."""
    import jax.numpy as jnp

    from glaref import kernels

    o, h_T = kernels.scan(q, k, v, log_alpha, h0[:1], return_final_state=True)
    return o, jnp.repeat(h_T, len(cu_seqlens) - 1, axis=0)


def mean_gate(q, k, v, log_alpha, h0):
    """Vector gates done wrong: one decay per head, the mean of the key dimensions' log gates."""
    from glaref import kernels

    return kernels.scan(q, k, v, log_alpha.mean(axis=-1), h0, return_final_state=True)
