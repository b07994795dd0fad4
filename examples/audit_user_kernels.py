"""Two user kernels for ``glaref audit --impl examples/audit_user_kernels.py:NAME`` (the commands
and their output: docs/reports/audit_examples/). Not a test file: pytest does not collect it.

chunked:        glaref's own chunked JAX kernel (64-step chunks), returning (o, h_T): passes.
chunked_dq_bug: the same kernel with a backward whose dq is 1.01 times the true one (forward,
                h_T and every other gradient unchanged): fails on dq only.
"""

from __future__ import annotations

import jax

import glaref.kernels

CHUNK = 64      # audit with --chunk-size 64: the calibrated tier then compares with a 64-step kernel


def chunked(q, k, v, log_alpha, h0, scale=1.0):
    return glaref.kernels.chunked(q, k, v, log_alpha, h0, chunk_size=CHUNK, scale=scale,
                                  return_final_state=True)


@jax.custom_vjp
def _dq_times_1_01(q):
    """The identity forward; its cotangent multiplied by 1.01 backward."""
    return q


_dq_times_1_01.defvjp(lambda q: (q, None), lambda _, g: (g * 1.01,))


def chunked_dq_bug(q, k, v, log_alpha, h0, scale=1.0):
    return chunked(_dq_times_1_01(q), k, v, log_alpha, h0, scale=scale)
