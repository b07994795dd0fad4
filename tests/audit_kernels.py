"""Small JAX kernels the audit tests feed to ``glaref audit`` (as ``audit_kernels:name`` or as
``tests/audit_kernels.py:name``). Each is the plain recurrence on a lax.scan, written here from
the equations so the tests do not depend on glaref.kernels, plus deliberate defects.

    S_t = exp(log_alpha_t) S_{t-1} + k_t^T v_t,   o_t = q_t S_t,   h_T = S_T   (head h, group h // (H/G))
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _heads(x, H):
    return jnp.repeat(x, H // x.shape[1], axis=1)


def _recurrence(q, k, v, log_alpha, h0):
    """"bhtd" in, (o, h_T) out; computes in float32 at least (float64 stays float64)."""
    ct = jnp.promote_types(jnp.result_type(q, k, v, log_alpha, h0), jnp.float32)
    H = v.shape[1]
    q, k = _heads(q, H).astype(ct), _heads(k, H).astype(ct)
    v, log_alpha, h0 = v.astype(ct), log_alpha.astype(ct), h0.astype(ct)

    def step(S, xs):
        q_t, k_t, v_t, la_t = xs
        S = jnp.exp(la_t)[:, :, None, None] * S + k_t[:, :, :, None] * v_t[:, :, None, :]
        return S, jnp.einsum("bhk,bhkv->bhv", q_t, S)

    xs = (jnp.moveaxis(q, 2, 0), jnp.moveaxis(k, 2, 0), jnp.moveaxis(v, 2, 0),
          jnp.moveaxis(log_alpha, 2, 0))
    S, o = jax.lax.scan(step, h0, xs)
    return jnp.moveaxis(o, 0, 2), S


def scan_kernel(q, k, v, log_alpha, h0):
    """Correct, returns o only (so the audit feeds dh_T = 0)."""
    return _recurrence(q, k, v, log_alpha, h0)[0]


def scan_kernel_final(q, k, v, log_alpha, h0):
    """Correct, returns (o, h_T)."""
    return _recurrence(q, k, v, log_alpha, h0)


def list_kernel(q, k, v, log_alpha, h0):
    """Correct, returns [o, h_T] as a list (the audit must pair its cotangent as a list)."""
    return list(_recurrence(q, k, v, log_alpha, h0))


def scan_kernel_bthd(q, k, v, log_alpha, h0):
    """Correct, takes and returns the "bthd" layout."""
    t = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
    o, h_T = _recurrence(t(q), t(k), t(v), t(log_alpha), h0)
    return t(o), h_T


def scaled_kernel(q, k, v, log_alpha, h0, scale=1.0):
    """Correct for any scale: takes ``scale`` as a keyword, as the audit passes it."""
    return _recurrence(q * scale, k, v, log_alpha, h0)[0]


def wrong_kernel(q, k, v, log_alpha, h0):
    """Wrong by exactly 1 %: o * 1.01 (normwise relative error 0.01)."""
    return _recurrence(q, k, v, log_alpha, h0)[0] * 1.01


def nan_kernel_bthd(q, k, v, log_alpha, h0):
    """bthd kernel with NaN at o[0, 5, 1, 0] and o[0, 6, 1, 2] (batch, time, head, dv)."""
    o, h_T = scan_kernel_bthd(q, k, v, log_alpha, h0)
    return o.at[0, 5, 1, 0].set(jnp.nan).at[0, 6, 1, 2].set(jnp.nan), h_T


def raising_kernel(q, k, v, log_alpha, h0):
    """Refuses T = 20 (like the seed's scan refusing dk=48, dv=40)."""
    if q.shape[2] == 20:
        raise ValueError("unsupported shape: T=20")
    return scan_kernel(q, k, v, log_alpha, h0)


def interrupting_kernel(q, k, v, log_alpha, h0):
    """Stands for a user pressing Ctrl-C while T = 20 is being measured."""
    if q.shape[2] == 20:
        raise KeyboardInterrupt
    return scan_kernel(q, k, v, log_alpha, h0)


def bf16_only_kernel(q, k, v, log_alpha, h0):
    """Insists on bfloat16 inputs (checks the audit casts them), computes in float32 and returns
    o in float32, so its error against the oracle on the same rounded inputs is float32-sized."""
    for name, x in (("q", q), ("k", k), ("v", v), ("log_alpha", log_alpha), ("h0", h0)):
        if x.dtype != jnp.bfloat16:
            raise TypeError(f"{name}: got {x.dtype}, expected bfloat16")
    return _recurrence(q, k, v, log_alpha, h0)[0]


@jax.custom_vjp
def custom_vjp_kernel(q, k, v, log_alpha, h0):
    """Correct, with a backward that recomputes from the inputs: saves nothing else."""
    return _recurrence(q, k, v, log_alpha, h0)


def _cv_fwd(q, k, v, log_alpha, h0):
    return _recurrence(q, k, v, log_alpha, h0), (q, k, v, log_alpha, h0)


def _cv_bwd(res, cts):
    _, pullback = jax.vjp(_recurrence, *res)
    return pullback(cts)


custom_vjp_kernel.defvjp(_cv_fwd, _cv_bwd)


@jax.custom_vjp
def no_backward_kernel(q, k, v, log_alpha, h0):
    """Correct forward; a backward not written yet (raises NotImplementedError)."""
    return _recurrence(q, k, v, log_alpha, h0)


def _nb_bwd(res, cts):
    raise NotImplementedError("backward not written yet")


no_backward_kernel.defvjp(lambda *args: (_recurrence(*args), None), _nb_bwd)


def complex_kernel(q, k, v, log_alpha, h0):
    """The correct o plus 1e3j: complex64 (the imaginary part must not be dropped silently)."""
    return scan_kernel(q, k, v, log_alpha, h0) + 1e3j


def int_kernel(q, k, v, log_alpha, h0):
    """The correct o rounded to int32."""
    return scan_kernel(q, k, v, log_alpha, h0).astype(jnp.int32)


def bool_kernel(q, k, v, log_alpha, h0):
    """o > 0, a bool array of o's shape."""
    return scan_kernel(q, k, v, log_alpha, h0) > 0


def none_kernel(q, k, v, log_alpha, h0):
    """Forgets to return."""
    scan_kernel(q, k, v, log_alpha, h0)


def exiting_kernel(q, k, v, log_alpha, h0):
    """Calls sys.exit(7) (a kernel library that gives up on an unsupported shape this way)."""
    import sys
    sys.exit(7)


def memory_error_kernel(q, k, v, log_alpha, h0):
    """Raises MemoryError above T = 15 (a kernel that runs out of memory on long sequences)."""
    if q.shape[2] > 15:
        raise MemoryError(f"cannot allocate the states for T={q.shape[2]}")
    return scan_kernel(q, k, v, log_alpha, h0)


not_a_kernel = 3
