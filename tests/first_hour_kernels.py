"""Two kernels with the bugs a first audit must catch (issue 23), fed to ``glaref audit`` as
``tests/first_hour_kernels.py:name`` and to ``glaref.testing.check_kernel``. Both are right in the
standard regime at short T, which is why the defaults have to reach further.

    clamped            glaref's chunked kernel on log_alpha clamped at -4 (exp(-4) = 0.018 kept
                       where the gate says ~0): wrong under strong decay, and its dlog_alpha is 0
                       wherever the clamp bites
    bf16_accumulating  the recurrence S_t = exp(log_alpha_t) S_{t-1} + k_t^T v_t with each step in
                       float32 but the state carried between steps in the inputs' dtype: with
                       bfloat16 inputs S is rounded to bfloat16 every step, an error that grows
                       with the number of steps the gates remember
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from glaref import kernels

CLAMP = -4.0


def clamped(q, k, v, log_alpha, h0):
    return kernels.chunked(q, k, v, jnp.maximum(log_alpha, CLAMP), h0, return_final_state=True)


def bf16_accumulating(q, k, v, log_alpha, h0):
    """"bhtd" in, (o, h_T) out. Each step computes in float32, but the state carried from step to
    step is stored in the inputs' dtype, as are o and h_T."""
    dt = v.dtype
    H = v.shape[1]
    q, k = (jnp.repeat(x, H // x.shape[1], axis=1) for x in (q, k))

    def step(S, xs):
        q_t, k_t, v_t, la_t = (x.astype(jnp.float32) for x in xs)
        S = jnp.exp(la_t)[:, :, None, None] * S.astype(jnp.float32) \
            + k_t[:, :, :, None] * v_t[:, :, None, :]
        return S.astype(dt), jnp.einsum("bhk,bhkv->bhv", q_t, S).astype(dt)

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (q, k, v, log_alpha))
    S, o = jax.lax.scan(step, h0.astype(dt), xs)
    return jnp.moveaxis(o, 0, 2), S
