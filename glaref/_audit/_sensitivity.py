"""How sharp the verdict is: the smallest error it flags, as a multiple of a correct kernel's own.

For a correct kernel's output x (o, h_T or a gradient) on one problem, an error of relative size
eps is injected, in two kinds:

    systematic   x (1 + eps)                       (a wrong constant, a missing factor)
    random       x + eps |x| N(0, 1), fixed seed   (elementwise noise: a precision bug)

and the smallest eps the verdict flags on that output (``glaref.gla._judge.assess_output``, the audit's own
rule) is found by bisection. Its ratio to the output's *natural* error, the kernel's own normwise
relative error ||x - ref|| / ||ref||, is the sensitivity: 1 would flag anything beyond what the
kernel already does; the calibrated tier aims at a few times ``calibrated_ratio``.
``tools/sensitivity.py`` writes the report (docs/reports/sensitivity_cpu.*); the tests assert
the targets at small sizes. Running kernels needs jax; judging does not.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import numpy as np

from .._inputs import GRADS, OUTPUTS
from ._family import Truth
from ._runners import fwd_bwd_program
from ._verdict import Assessment

KINDS = ("systematic", "random")


def inject(x: np.ndarray, eps: float, kind: str, seed: int = 0) -> np.ndarray:
    """x with an error of relative size eps of the given ``kind`` (float64)."""
    x = np.asarray(x, dtype=np.float64)
    if kind == "systematic":
        return x * (1.0 + eps)
    if kind == "random":
        noise = np.random.default_rng(seed).standard_normal(x.shape)
        return x + eps * np.abs(x) * noise
    raise ValueError(f"kind: got {kind!r}, expected one of {KINDS}")


def threshold(truth: Truth, name: str, x: np.ndarray, dtype: str, kind: str, *,
              assess: Callable[..., Assessment], rel_precision: float = 0.02,
              level: str = "not_ok") -> dict:
    """{"natural": the output's own rel_err, "eps": the smallest injected eps the verdict flags
    (to ``rel_precision``), "ratio": eps / natural, "clean": the uninjected output passes}.
    eps is inf when nothing up to 1e3 is flagged (the output is zero, say). ``level``: flagged
    means an outcome other than ok ("not_ok": less accurate or FAIL) or a failure ("fail").
    ``assess(truth, name, x, dtype)``: the verdict of one output with the kernel's claims, e.g.
    ``functools.partial(glaref.gla._judge.assess_output, final=True, grads=True, claims=c)`` or a recurrence
    family's own (``glaref.delta._family.assess_output``)."""
    if level not in ("not_ok", "fail"):
        raise ValueError(f"level: got {level!r}, expected 'not_ok' or 'fail'")

    def flagged(eps: float) -> bool:
        a = assess(truth, name, inject(x, eps, kind), dtype)
        return not a.ok if level == "fail" else a.outcome != "ok"

    # the kernel's own error, as the verdict measures it (_metrics.rel_err against the oracle)
    natural = assess(truth, name, x, dtype).rel_err
    clean = not flagged(0.0)
    hi = max(natural, 1e-12)
    while not flagged(hi):
        hi *= 4.0
        if hi > 1e3:
            return {"natural": natural, "eps": math.inf, "ratio": math.inf, "clean": clean}
    lo = hi / 4.0 if hi > max(natural, 1e-12) else 0.0
    while lo > 0 and flagged(lo):              # flagged already at the start: step down
        hi, lo = lo, lo / 4.0
        if lo < 1e-30:
            lo = 0.0
    while hi - lo > rel_precision * hi:
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2.0
        if flagged(mid):
            hi = mid
        else:
            lo = mid
    return {"natural": natural, "eps": hi, "ratio": hi / natural if natural > 0 else math.inf,
            "clean": clean}


_JITTED: dict = {}


def _jitted(fn, cu_seqlens: tuple[int, ...] | None = None):
    """One jitted fwd_bwd program per kernel (and packed offsets, passed as ``cu_seqlens=``),
    reused across problems (JAX caches per shape)."""
    import jax

    key = (id(fn), cu_seqlens)
    if key not in _JITTED:
        kernel = fn if cu_seqlens is None else functools.partial(fn, cu_seqlens=np.asarray(cu_seqlens))
        _JITTED[key] = (fn, jax.jit(fwd_bwd_program(kernel, True)))
    return _JITTED[key][1]


def jax_outputs(fn, truth: Truth, dtype: str, precision: str = "default"):
    """Run a JAX kernel ``fn(q, k, v, log_alpha, h0) -> (o, h_T)`` ("bhtd") once, forward and
    backward through jax.vjp, on the problem of ``truth`` in ``dtype``: ({name: canonical float64
    value}, {name: returned dtype name}). The same program the audit engine times. Vector gates
    need nothing; packed sequences (``truth.p.cu_seqlens``) are passed as ``cu_seqlens=``, as the
    engine does."""
    import jax
    import jax.numpy as jnp

    p = truth.p
    np_dt = jnp.dtype(dtype)
    args = [jnp.asarray(np.asarray(getattr(p, n)).astype(np_dt))
            for n in GRADS]
    cu = None if p.cu_seqlens is None else tuple(int(c) for c in p.cu_seqlens)
    kernel = fn if cu is None else functools.partial(fn, cu_seqlens=np.asarray(cu))
    ctx = contextlib.nullcontext() if precision == "default" else jax.default_matmul_precision(precision)
    with ctx:
        o_s, h_s = jax.eval_shape(kernel, *args)
        # cotangents in the dtype of the output they pair with, as the engine does
        cts = [jnp.asarray(np.asarray(p.do).astype(o_s.dtype)),
               jnp.asarray(np.asarray(p.dh_T).astype(h_s.dtype))]
        (o, h_T), g = _jitted(fn, cu)(*args, *cts)
    arrays = dict(zip(OUTPUTS, (o, h_T) + tuple(g)))
    return ({n: np.asarray(v).astype(np.float64) for n, v in arrays.items()},
            {n: np.dtype(v.dtype).name for n, v in arrays.items()})
