"""A JAX project's kernel test: one call to glaref.testing.check_kernel per kernel."""

import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'glaref[jax]')")
import jax.numpy as jnp  # noqa: E402

import glaref.testing  # noqa: E402


def my_gla(q, k, v, log_alpha, h0, scale=1.0):
    """The project's kernel: S_t = exp(log_alpha_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t, one
    step at a time ("bhtd"; q and k have G groups of H // G heads). Returns (o, h_T)."""
    rep = v.shape[1] // q.shape[1]
    q, k = jnp.repeat(q, rep, axis=1), jnp.repeat(k, rep, axis=1)

    def step(S, xs):
        q_t, k_t, v_t, a_t = xs
        S = jnp.exp(a_t)[..., None, None] * S + k_t[..., :, None] * v_t[..., None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", q_t, S)

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (q, k, v, log_alpha))
    h_T, o = jax.lax.scan(step, h0, xs)
    return jnp.moveaxis(o, 0, 2), h_T


def test_my_gla():
    glaref.testing.check_kernel(my_gla, chunk_size=1)    # chunk_size=1: a step-by-step kernel


def test_a_kernel_that_drops_the_initial_states_decay_fails():
    # what a failure looks like: the message names every failing output with its figures
    def no_h0_decay(q, k, v, log_alpha, h0, scale=1.0):
        o, h_T = my_gla(q, k, v, log_alpha, jnp.zeros_like(h0), scale)
        return o + scale * jnp.einsum("bhtk,bhkv->bhtv", jnp.repeat(q, v.shape[1] // q.shape[1], 1),
                                      h0), h_T
    with pytest.raises(AssertionError, match=r"(?s)kernel disagrees with the glaref oracle.*o: "):
        glaref.testing.check_kernel(no_h0_decay, chunk_size=1)
