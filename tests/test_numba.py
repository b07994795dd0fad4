"""The Numba oracle against the NumPy reference, and its thread-count determinism.

Agreement is normwise relative, ||x - ref|| / ||ref||, per output and per gradient, within
``tol("numba_vs_numpy")``. The reference is ``glaref.gla._reference`` (a different code path: a
step-by-step NumPy loop), never the Numba code itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import glaref.strategies as gst
from glaref._inputs import Dims, Problem
from glaref.gla import _reference
from glaref.tolerances import tol

from conftest import logsigmoid, rand_problem

_numba = pytest.importorskip("glaref.gla._numba")

NAMES = ("o", "h_T", "dq", "dk", "dv", "dlog_alpha", "dh0")


def _strong_decay(rng, shape):  # per-step log decays down to about -30
    la = logsigmoid(rng.standard_normal(shape)) / 0.1
    la[..., ::3] = -30.0
    return la


# log_alpha regimes, as conftest.rand_problem takes them
GATES = {
    "standard": "standard",
    "strong_decay": _strong_decay,
    "zero": 0.0,
    "positive": lambda rng, shape: rng.uniform(0.0, 0.05, shape),  # growth, no overflow over T steps
    "near_one": lambda rng, shape: -1e-4 * rng.uniform(0.5, 1.5, shape),
    "mixed": lambda rng, shape: rng.choice([-30.0, -1.0, 0.0, 0.5], size=shape),  # large steps, both signs
}


def make_case(B, G, H, T, dk, dv, gate="standard", h0_scale=1.0, seed=0, with_dh_T=True):
    """Random canonical inputs and cotangents as a tuple; ``gate`` picks the log_alpha regime."""
    p = rand_problem(B, G, H, T, dk, dv, seed=[seed, B, G, H, T, dk, dv], log_alpha=GATES[gate],
                     h0_scale=h0_scale)
    return p.q, p.k, p.v, p.log_alpha, p.h0, p.do, (p.dh_T if with_dh_T else None)


def both(case, scale=0.7):
    q, k, v, la, h0, do, dh_T = case
    ref = _reference.forward(q, k, v, la, h0, scale) + _reference.vjp(q, k, v, la, h0, do, dh_T, scale)
    got = _numba.forward(q, k, v, la, h0, scale) + _numba.vjp(q, k, v, la, h0, do, dh_T, scale)
    return dict(zip(NAMES, got)), dict(zip(NAMES, ref))


def rel_errors(got, ref):
    out = {}
    for name in NAMES:
        g, r = got[name], ref[name]
        assert g.shape == r.shape, (name, g.shape, r.shape)
        assert g.dtype == np.float64, (name, g.dtype)
        nr = np.linalg.norm(r)
        out[name] = 0.0 if g.size == 0 or nr == 0.0 and np.linalg.norm(g) == 0.0 else (
            np.linalg.norm(g - r) / nr)
    return out


def assert_agree(case, scale=0.7):
    __tracebackhide__ = True
    got, ref = both(case, scale)
    errs = rel_errors(got, ref)
    bad = {n: e for n, e in errs.items() if not e <= tol("numba_vs_numpy")}
    if bad:
        raise AssertionError(f"numba vs numpy above {tol('numba_vs_numpy'):g}: {bad}; all: {errs}")
    return errs


# (B, G, H, T, dk, dv)
SHAPES = [
    (2, 2, 4, 37, 8, 8),      # G < H
    (1, 3, 3, 20, 6, 5),      # G = H, dk != dv
    (2, 1, 2, 1, 4, 4),       # T = 1
    (1, 2, 4, 131, 48, 40),   # odd sizes, T not a multiple of any block size
    (1, 1, 1, 200, 16, 24),   # dk < dv
    (1, 1, 2, 70, 24, 9),     # dk > dv
]


def _shape_examples(test):
    # the hand-picked shapes always run first, as explicit examples, then hypothesis draws more
    for shape in SHAPES:
        test = example(p=Problem(*make_case(*shape), Dims(*shape)))(test)
    return test


@settings(max_examples=25)
@given(p=gst.problems(dims=gst.dims(max_seq=140, max_dk=48, max_dv=40),
                      with_dh_T=st.booleans()))
@_shape_examples
def test_random_cases_agree(p):
    # every non-slow regime at drawn sizes, G | H, with and without dh_T
    assert_agree((p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T))


@pytest.mark.parametrize("gate", ["strong_decay", "zero", "positive", "near_one", "mixed"])
@pytest.mark.parametrize("shape", [(1, 2, 4, 150, 16, 12), (1, 1, 1, 67, 48, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_stress_gates_agree(gate, shape):
    assert_agree(make_case(*shape, gate=gate))


@pytest.mark.parametrize("gate", ["standard", "strong_decay", "zero", "near_one"])
def test_many_chunks_agree(gate):
    # T a multiple of the chunk size, and T long enough for many chunk boundaries
    for T in (2 * _numba.CHUNK, 31 * _numba.CHUNK + 5):
        assert_agree(make_case(1, 1, 2, T, 8, 6, gate=gate))


def test_h0_dominant_agrees():
    assert_agree(make_case(1, 2, 4, 90, 16, 16, gate="near_one", h0_scale=1e4))


def test_without_dh_T_agrees():
    errs = assert_agree(make_case(1, 1, 2, 40, 8, 8, with_dh_T=False))
    assert errs["dh0"] <= tol("numba_vs_numpy")


def test_per_head_matches_reference_and_sums_to_grouped():
    q, k, v, la, h0, do, dh_T = make_case(1, 2, 6, 45, 8, 7)
    got = _numba.vjp(q, k, v, la, h0, do, dh_T, 0.5, per_head=True)
    ref = _reference.vjp(q, k, v, la, h0, do, dh_T, 0.5, per_head=True)
    for g, r in zip(got[:2], ref[:2]):
        assert g.shape == (1, 6, 45, 8)
        assert np.linalg.norm(g - r) <= tol("numba_vs_numpy") * np.linalg.norm(r)
    grouped = _numba.vjp(q, k, v, la, h0, do, dh_T, 0.5)
    # the group sum is a plain left-to-right sum of the per-head values: exact equality
    for g_head, g_sum in zip(got[:2], grouped[:2]):
        expect = (g_head[:, [0, 3]] + g_head[:, [1, 4]]) + g_head[:, [2, 5]]
        np.testing.assert_array_equal(g_sum, expect)


@pytest.mark.parametrize("B,T", [(0, 5), (2, 0)])
def test_empty(B, T):
    q, k, v, la, h0, do, dh_T = make_case(max(B, 1), 2, 4, max(T, 1), 6, 5)
    q, k, v, la, do = q[:B, :, :T], k[:B, :, :T], v[:B, :, :T], la[:B, :, :T], do[:B, :, :T]
    h0, dh_T = h0[:B], dh_T[:B]
    o, h_T = _numba.forward(q, k, v, la, h0, 1.0)
    assert o.shape == (B, 4, T, 5) and h_T.shape == (B, 4, 6, 5)
    np.testing.assert_array_equal(h_T, h0)  # T = 0: nothing happens to the state
    dq, dk, dv, dla, dh0 = _numba.vjp(q, k, v, la, h0, do, dh_T, 1.0)
    assert dq.shape == (B, 2, T, 6) and dk.shape == (B, 2, T, 6)
    assert dv.shape == (B, 4, T, 5) and dla.shape == (B, 4, T) and dh0.shape == (B, 4, 6, 5)
    np.testing.assert_array_equal(dh0, dh_T)  # T = 0: dh0 is dh_T itself


@pytest.mark.parametrize("B,G", [(1, 1), (4, 2)])      # per-head buffers + group sum; grouped
@pytest.mark.parametrize("per_head", [False, True])
def test_no_heads_gives_zero_gradients_for_q_and_k(B, G, per_head):
    # H = 0: no head reads q or k, so dq = dk = 0 exactly (sums of nothing), as the reference says;
    # the kernels write nothing into them, so they must not come back as uninitialised memory
    q, k, v, la, h0, do, dh_T = make_case(B, G, G, 40, 3, 2)
    v, la, h0, do, dh_T = v[:, :0], la[:, :0], h0[:, :0], do[:, :0], dh_T[:, :0]
    for _ in range(3):
        # fill the allocator's free memory with garbage first
        junk = np.full((B, G, 40, 3), np.nan)
        del junk
        got = _numba.vjp(q, k, v, la, h0, do, dh_T, 1.0, per_head=per_head)
        ref = _reference.vjp(q, k, v, la, h0, do, dh_T, 1.0, per_head=per_head)
        for x, r in zip(got, ref):
            assert x.shape == r.shape
            np.testing.assert_array_equal(x, r)
        assert np.array_equal(got[0], np.zeros_like(got[0])) and np.array_equal(got[1], np.zeros_like(got[1]))


_THREAD_SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, {root!r})
    from glaref.gla import _numba
    import numba
    assert numba.get_num_threads() == {n}, numba.get_num_threads()
    rng = np.random.default_rng(7)
    blobs = []
    # (2, 2, 4): as many groups as threads or more, the heads of a group run in one worker;
    # (1, 1, 3): fewer groups than threads with 2 threads, so per-head dq, dk are summed after
    # the parallel loop instead: both paths must give the same bits.
    for B, G, H, T, dk, dv in [(2, 2, 4, 300, 24, 20), (1, 1, 3, 130, 16, 8)]:
        q = rng.standard_normal((B, G, T, dk)) / 5; k = rng.standard_normal((B, G, T, dk)) / 5
        v = rng.standard_normal((B, H, T, dv))
        la = -np.logaddexp(0, -rng.standard_normal((B, H, T)))
        la[0, 0, ::4] = -30.0
        h0 = rng.standard_normal((B, H, dk, dv)); do = rng.standard_normal((B, H, T, dv))
        dh_T = rng.standard_normal((B, H, dk, dv))
        outs = _numba.forward(q, k, v, la, h0, 0.3) + _numba.vjp(q, k, v, la, h0, do, dh_T, 0.3)
        blobs += [np.ascontiguousarray(x).tobytes() for x in outs]
    sys.stdout.buffer.write(b"".join(blobs))
""")


def test_bit_identical_on_1_and_2_threads():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    blobs = []
    for n in (1, 2):
        env = dict(os.environ, NUMBA_NUM_THREADS=str(n))
        r = subprocess.run([sys.executable, "-c", _THREAD_SCRIPT.format(root=root, n=n)],
                           env=env, capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()
        blobs.append(r.stdout)
    assert len(blobs[0]) > 0
    assert blobs[0] == blobs[1]


# ---------------------------------------------------------------- the compile cache and its note

def test_the_cache_folder_is_per_user_and_overridable(monkeypatch, tmp_path):
    from glaref import _numba_cache

    for var in ("GLAREF_CACHE_DIR", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    if sys.platform.startswith("linux"):
        assert _numba_cache.cache_dir() == Path.home() / ".cache" / "glaref" / "numba"
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert _numba_cache.cache_dir() == tmp_path / "xdg" / "glaref" / "numba"
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "nb"))       # Numba's own setting
    assert _numba_cache.cache_dir() == tmp_path / "nb" / "glaref"
    monkeypatch.setenv("GLAREF_CACHE_DIR", str(tmp_path / "own"))     # glaref's, first
    assert _numba_cache.cache_dir() == tmp_path / "own" / "numba"


_NOTE_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from glaref._numba_cache import jit, note_compile

    @jit(fastmath=False)
    def twice(x):
        return 2 * x

    note_compile(twice, "a test function", 1)
    assert twice(21) == 42
""")


def test_a_cold_cache_compiles_with_a_note_and_a_warm_one_loads_silently(tmp_path):
    # the mechanism of the oracle's cache and note, on a one-line function (milliseconds to
    # compile): the note on stderr exactly when compiling; the entries in GLAREF_CACHE_DIR,
    # found again from a copy of the source file elsewhere (another checkout or environment)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, GLAREF_CACHE_DIR=str(tmp_path / "cache"))
    src = _NOTE_SCRIPT.format(root=root)
    runs = []
    for where in ("a", "a", "b"):
        f = tmp_path / where / "user_module.py"
        f.parent.mkdir(exist_ok=True)
        f.write_text(src)
        r = subprocess.run([sys.executable, str(f)], env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        runs.append(r.stderr)
    note = "glaref: compiling a test function, once per machine: ~1 s (cached in "
    assert runs[0].count(note) == 1, runs[0]
    assert str(tmp_path / "cache" / "numba") in runs[0]
    assert "compiling" not in runs[1] and "compiling" not in runs[2], runs
    assert list((tmp_path / "cache" / "numba").glob("user_module-*/*.nbi"))


@pytest.mark.slow
def test_the_oracle_notes_its_first_compile_once(tmp_path):
    # the real oracle, cold (seconds to a minute): one note per driver compiled, none when warm
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, GLAREF_CACHE_DIR=str(tmp_path))
    code = (f"import sys; sys.path.insert(0, {root!r}); import numpy as np, glaref; "
            "x = np.ones((1, 1, 3, 2)); glaref.forward(x, x, x, -np.ones((1, 1, 3)), None)")
    errs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=600).stderr for _ in range(2)]
    assert errs[0].count("glaref: compiling the float64 oracle (forward, scalar gates), once per "
                         "machine") == 1, errs[0]
    assert "compiling" not in errs[1], errs[1]
