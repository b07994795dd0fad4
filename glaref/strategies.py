"""hypothesis strategies that draw valid glaref problems, for property tests (glaref's and yours).

    from hypothesis import given
    import glaref.strategies as gst

    @given(gst.problems(), gst.dtypes())
    def test_my_kernel(problem, dtype):
        ...                     # problem: a canonical float64 glaref._inputs.Problem

A problem is ``glaref.regimes.make_inputs(regime, dims, seed)``: the inputs and cotangents of one
of the audit's regimes at a drawn size, a pure function of the three drawn values (each failing
example notes them, so ``make_inputs`` reproduces it outside hypothesis). Everything shrinks
towards the smallest case: one batch, group and head, T = 1, dk = dv = 1, the "standard" regime,
seed 0, float32.

This module imports hypothesis when loaded (``import glaref`` never loads it); hypothesis is a
test dependency (the ``test`` extra), not one of glaref's.
"""

from __future__ import annotations

from typing import Iterable

from hypothesis import note
from hypothesis import strategies as st

from . import regimes as _regimes
from ._inputs import LAYOUTS, Dims, Problem
from .gla._problems import round_problem  # the audit's own rounding, not a second copy

__all__ = ["DTYPES", "dims", "dtypes", "layouts", "problems", "regimes", "rounded", "seeds"]

# the dtypes a kernel under test takes, in shrinking order (float32 first: the common case)
DTYPES = ("float32", "float64", "bfloat16", "float16")


@st.composite
def dims(draw, *, max_batch: int = 2, max_groups: int = 2, max_heads_per_group: int = 3,
         min_seq: int = 1, max_seq: int = 70, max_dk: int = 16, max_dv: int = 16) -> Dims:
    """Problem sizes with G dividing H (H = G * heads per group). The default maximum T = 70
    crosses 64, the chunk length of many kernels and of glaref's Numba oracle."""
    G = draw(st.integers(1, max_groups))
    H = G * draw(st.integers(1, max_heads_per_group))
    return Dims(B=draw(st.integers(1, max_batch)), G=G, H=H, T=draw(st.integers(min_seq, max_seq)),
                dk=draw(st.integers(1, max_dk)), dv=draw(st.integers(1, max_dv)))


def regimes(names: Iterable[str] | None = None) -> st.SearchStrategy[str]:
    """Regime names (glaref.regimes), by default every regime but the slow ones; "standard" first.

    The regimes that choose their own sizes (ragged's T, tiny_dims's dk = dv = 1, long's T) run
    at the drawn size here: ``dims`` draws those sizes itself."""
    names = tuple(_regimes.DEFAULT_REGIMES if names is None else names)
    for n in names:
        _regimes.get(n)                       # ValueError naming the known regimes
    if not names:
        raise ValueError("names: got no regime, expected at least one")
    return st.sampled_from(names)


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def dtypes(names: Iterable[str] = DTYPES) -> st.SearchStrategy[str]:
    names = tuple(names)
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise ValueError(f"names: got {names!r}, expected some of {DTYPES}")
    return st.sampled_from(names)


def layouts() -> st.SearchStrategy[str]:
    return st.sampled_from(LAYOUTS)


@st.composite
def problems(draw, dims: st.SearchStrategy[Dims] | None = None,
             regimes: st.SearchStrategy[str] | None = None,
             seeds: st.SearchStrategy[int] | None = None,
             with_dh_T: bool | st.SearchStrategy[bool] = True) -> Problem:
    """A canonical float64 "bhtd" Problem (inputs and cotangents) from a drawn regime, size and
    seed. with_dh_T: False (or a strategy drawing it) sets dh_T to None (no cotangent on h_T)."""
    d = draw(_dims_default() if dims is None else dims)
    r = draw(_regimes_default() if regimes is None else regimes)
    s = draw(_seeds_default() if seeds is None else seeds)
    keep = draw(with_dh_T) if isinstance(with_dh_T, st.SearchStrategy) else bool(with_dh_T)
    note(f"glaref problem: glaref.regimes.make_inputs({r!r}, {d!r}, seed={s})"
         + ("" if keep else " with dh_T=None"))
    p = _regimes.make_inputs(r, d, s)
    return p if keep else p._replace(dh_T=None)


# the module-level names are shadowed by problems()'s parameters; keep handles on the defaults
_dims_default, _regimes_default, _seeds_default = dims, regimes, seeds


def rounded(problem: Problem, dtype: str) -> Problem:
    """``problem`` with every array rounded to ``dtype`` and widened back to float64 (exact): the
    numbers a kernel of that dtype receives, on which the oracle is then run."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: got {dtype!r}, expected one of {DTYPES}")
    return round_problem(problem, dtype)
