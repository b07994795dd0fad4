"""Cost of one jitted kernel call: compile time, XLA memory, residual memory and run time.

- compile_s: wall time of ``jax.jit(f).lower(*args).compile()`` (tracing, lowering, XLA), measured
  the first time an audit compiles the program: rows of the same kernel, mode, argument shapes
  and dtypes (other regimes, seeds) reuse it and repeat its figure.
- xla_temp_mb / xla_arg_mb / xla_out_mb: ``compiled.memory_analysis()`` in MiB; null when the
  backend reports none (never estimated). The fwd program is the kernel itself; the fwd_bwd
  program takes (q, k, v, log_alpha, h0, do[, dh_T]) and returns (o[, h_T], the five gradients),
  so its arguments and outputs include the cotangents and o, unlike the seed report's fwd_bwd
  (five inputs in, gradients out): compare temp, not arg/out, with the seed.
- residual_mb: what the forward saves for the backward. Traced abstractly, without running or
  allocating anything: ``jax.eval_shape`` of ``jax.vjp(kernel, *inputs)`` returns the VJP
  function, a pytree whose leaves are the residuals; leaves that are the inputs themselves are not
  counted (they exist anyway). So a ``custom_vjp`` kernel saving only its inputs has 0, and a
  plain-autodiff ``lax.scan`` has every per-step state. Same count as
  ``jax.ad_checkpoint.print_saved_residuals`` minus its "from the argument" lines.
- median_ms / q1_ms / q3_ms: one warm-up call (its output is the one measured for errors), one
  calibration call, then ``repeats`` timings of ``inner`` back-to-back calls each, ``inner``
  chosen so one timing lasts about ``TARGET_S``; the figures are per call. ``repeats=0`` skips
  the calibration and the timings (accuracy only: the warm-up call is still the one measured for
  errors, compile_s and the memory figures are still recorded); inner and the ms figures are null.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

MIB = float(2**20)
# the record fields measured here, in the records' order (residual_mb, fwd_bwd only, aside)
FIELDS = ("compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "xla_temp_mb", "xla_arg_mb",
          "xla_out_mb")
TARGET_S = 0.05      # calibrated length of one timing
MAX_INNER = 1000


def compile_fn(f: Callable, args: tuple) -> tuple[Any, float]:
    import jax
    t0 = time.perf_counter()
    compiled = jax.jit(f).lower(*args).compile()
    return compiled, time.perf_counter() - t0


def memory(compiled) -> dict[str, float | None]:
    out: dict[str, float | None] = {"xla_temp_mb": None, "xla_arg_mb": None, "xla_out_mb": None}
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - backends without memory analysis
        return out
    if m is None:
        return out
    for key, attr in (("xla_temp_mb", "temp_size_in_bytes"), ("xla_arg_mb", "argument_size_in_bytes"),
                      ("xla_out_mb", "output_size_in_bytes")):
        v = getattr(m, attr, None)
        out[key] = None if v is None or v < 0 else v / MIB
    return out


def residual_bytes(kernel: Callable, inputs: tuple) -> int:
    """Bytes of the residuals ``jax.vjp(kernel, *inputs)`` keeps, inputs themselves excluded."""
    import jax

    def residuals(*xs):
        _, pullback = jax.vjp(kernel, *xs)
        ids = {id(x) for x in xs}
        return [r for r in jax.tree_util.tree_leaves(pullback) if id(r) not in ids]

    shapes = jax.eval_shape(residuals, *inputs)
    return int(sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in shapes))


def time_calls(compiled, args: tuple, repeats: int) -> tuple[Any, dict[str, float | int | None]]:
    """(first output, {inner, median_ms, q1_ms, q3_ms}); all four None when ``repeats`` is 0."""
    import jax
    first = jax.block_until_ready(compiled(*args))        # warm-up; measured for errors
    if repeats == 0:
        return first, {"inner": None, "median_ms": None, "q1_ms": None, "q3_ms": None}
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    one = time.perf_counter() - t0
    inner = int(max(1, min(MAX_INNER, TARGET_S // max(one, 1e-9))))
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = None
        for _ in range(inner):
            out = compiled(*args)
        jax.block_until_ready(out)
        per_call.append((time.perf_counter() - t0) / inner)
        del out
    q1, med, q3 = np.percentile(np.array(per_call) * 1e3, [25, 50, 75])
    return first, {"inner": inner, "median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3)}
