"""Small shared helpers for the test suite (importable as ``import conftest`` from tests/).

Kept generic on purpose: random problems, the implementations to parametrise over, and one
comparison that measures an error element by element against a rounding scale.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

import numpy as np
import pytest

from glaref._audit._metrics import rel_err  # noqa: F401 - the tests take glaref's one metric from here
from glaref._inputs import Dims, Problem


def _jax_cache_dir() -> str:
    """Where the test suite keeps JAX's compiled programs: beside glaref's Numba cache
    (glaref/_numba_cache.py), $GLAREF_CACHE_DIR/jax or the user's cache folder + /glaref/jax."""
    own = os.environ.get("GLAREF_CACHE_DIR")
    if own:
        return os.path.join(os.path.expanduser(own), "jax")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "glaref", "jax")


# JAX's persistent compilation cache, for every compile however short (under two busy cores a
# small jit takes over a second): the xdist workers, the CLI's subprocesses and the next run load
# an XLA program compiled once instead of compiling it again (tests/test_kernels.py: 64 s of CPU
# cold, 15 s warm). Set through the environment, before jax is imported, so that subprocesses
# inherit it; a cache folder the user chose (JAX_COMPILATION_CACHE_DIR) is kept. The folder is not
# pruned (entries are keyed by program, jax version and machine; delete it to reclaim the space).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _jax_cache_dir())
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:          # the property tests skip themselves; nothing to configure
    pass
else:
    # No per-example deadline: the first example of a test may compile (or load) the Numba
    # oracle or import the audit engine. On CI (CI set) every run draws the same examples
    # (derandomize), so a red CI is reproducible; locally each run explores new ones.
    _hypothesis_settings.register_profile("glaref", deadline=None)
    _hypothesis_settings.register_profile("glaref-ci", deadline=None, derandomize=True,
                                          database=None)
    _hypothesis_settings.load_profile("glaref-ci" if os.environ.get("CI") else "glaref")

# The implementations of the oracle. numba is skipped, with its reason shown, only while
# glaref/gla/_numba.py does not exist (it is being written alongside these tests).
HAS_NUMBA_MODULE = importlib.util.find_spec("glaref.gla._numba") is not None
IMPLS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("numba", id="numba", marks=pytest.mark.skipif(
        not HAS_NUMBA_MODULE, reason="glaref/gla/_numba.py does not exist yet: impl='numba' not testable")),
]



def blocked_imports(*names: str) -> str:
    """Python source, for ``python -c``, that makes importing any of ``names`` (top-level
    packages) raise ImportError: a fresh process without numba, jax, torch, ..."""
    return f"""
import importlib.abc, sys
BLOCK = {names!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCK:
            raise ImportError(f"{{name}} is blocked for this test")
        return None
sys.meta_path.insert(0, Block())
"""

@pytest.fixture(params=IMPLS)
def impl(request) -> str:
    """Each oracle implementation in turn."""
    return request.param


def logsigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def rand_problem(B: int, G: int, H: int, T: int, dk: int, dv: int, seed: int | list[int] = 0, *,
                 log_alpha: str | float | np.ndarray | Callable = "standard",
                 h0_scale: float = 1.0, vector_gate: bool = False) -> Problem:
    """Random canonical float64 "bhtd" inputs and cotangents (do and dh_T always random);
    ``seed`` is whatever ``np.random.default_rng`` takes.

    log_alpha: "standard" (logsigmoid(N(0, 1))), a number (that constant everywhere), an array of
    shape (B, H, T), or a callable ``f(rng, shape)``. q and k are N(0, 1/dk); v, do, dh_T N(0, 1);
    h0 is ``h0_scale * N(0, 1)``. ``vector_gate=True``: log_alpha has shape (B, H, T, dk) (one
    decay per key dimension), drawn the same way; the other arrays are unchanged.
    """
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(max(dk, 1))
    q = s * rng.standard_normal((B, G, T, dk))
    k = s * rng.standard_normal((B, G, T, dk))
    v = rng.standard_normal((B, H, T, dv))
    h0 = h0_scale * rng.standard_normal((B, H, dk, dv))
    do = rng.standard_normal((B, H, T, dv))
    dh_T = rng.standard_normal((B, H, dk, dv))
    shape = (B, H, T, dk) if vector_gate else (B, H, T)
    if isinstance(log_alpha, str):
        if log_alpha != "standard":
            raise ValueError(f"log_alpha: got {log_alpha!r}, expected 'standard', a number, an array or "
                             "a callable")
        la = logsigmoid(rng.standard_normal(shape))
    elif callable(log_alpha):
        la = np.asarray(log_alpha(rng, shape), dtype=np.float64)
    else:
        la = np.broadcast_to(np.asarray(log_alpha, dtype=np.float64), shape).copy()
    return Problem(q, k, v, la, h0, do, dh_T, Dims(B, G, H, T, dk, dv))


def abs_problem(p: Problem) -> Problem:
    """The problem on absolute values (decays unchanged): evaluating any implementation of the
    recurrence on it gives, per element, the sum of |terms| -- the scale rounding errors live on."""
    a = np.abs
    return p._replace(q=a(p.q), k=a(p.k), v=a(p.v), h0=a(p.h0), do=None if p.do is None else a(p.do),
                      dh_T=None if p.dh_T is None else a(p.dh_T))


def scaled_err(actual, desired, scale) -> float:
    """max_i |actual_i - desired_i| / scale_i: the error in units of each element's term scale.

    Elements whose scale is exactly 0 must match exactly (they are sums of no terms)."""
    actual, desired, scale = (np.asarray(x, dtype=np.float64) for x in (actual, desired, scale))
    diff = np.abs(actual - desired)
    if diff.size == 0:
        return 0.0
    if np.any((scale == 0) & (diff != 0)):
        return float("inf")
    ratio = np.where(scale == 0, 0.0, diff / np.where(scale == 0, 1.0, scale))
    return float(ratio.max())


def assert_scaled(actual, desired, scale, tol: float, what: str) -> float:
    """Assert |actual - desired| <= tol * scale element by element; return the worst ratio.

    ``desired`` is the truth (numpy.testing order). The message gives the worst element's index,
    both values, its scale and the normwise relative error.
    """
    __tracebackhide__ = True
    actual, desired, scale = (np.asarray(x, dtype=np.float64) for x in (actual, desired, scale))
    if actual.shape != desired.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != expected {desired.shape}")
    worst = scaled_err(actual, desired, scale)
    if not worst <= tol:
        diff = np.abs(actual - desired)
        ratio = np.where(scale == 0, np.where(diff == 0, 0.0, np.inf),
                         diff / np.where(scale == 0, 1.0, scale))
        i = np.unravel_index(np.nanargmax(np.where(np.isnan(ratio), np.inf, ratio)), ratio.shape)
        raise AssertionError(
            f"{what}: max |err|/scale = {worst:.3e} > tol {tol:.3e} at index {tuple(int(j) for j in i)}: "
            f"got {actual[i]!r}, expected {desired[i]!r}, scale {scale[i]!r}; "
            f"normwise rel err {rel_err(actual, desired):.3e}")
    return worst
