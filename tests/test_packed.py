"""Packed variable-length sequences (cu_seqlens, docs/math.md section 10) in the oracle.

Packed must equal running the sequences one by one, to the last bit, for both implementations
and both gate kinds: the oracle runs each sequence with the same code as an unpacked call.
Bad offsets get an error naming cu_seqlens and the first bad position.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import glaref
from glaref import DTypeError, SeqlensError, ShapeError
from glaref.tolerances import tol

from conftest import IMPLS, assert_scaled, rand_problem, rel_err

# (G, H, dk, dv, cu_seqlens): ragged lengths, an empty sequence first, in the middle and last,
# sequences longer than the Numba oracle's chunks, a single sequence, no step at all.
CASES = [
    pytest.param(2, 4, 5, 3, [0, 7, 7, 40, 41, 75], id="ragged-empty-mid"),
    pytest.param(1, 2, 4, 4, [0, 0, 16], id="empty-first"),
    pytest.param(1, 3, 3, 6, [0, 70, 70], id="empty-last"),
    pytest.param(2, 2, 6, 5, [0, 130], id="one-seq"),
    pytest.param(1, 1, 3, 2, [0, 1, 2, 3, 4, 5, 6], id="length-1"),
    pytest.param(1, 2, 3, 3, [0, 0], id="T0"),
]


def _packed(G, H, dk, dv, cu, vector, seed=0, **kw):
    """Inputs with B = 1 and T = cu[-1], plus (N, H, dk, dv) h0 and dh_T."""
    T, N = cu[-1], len(cu) - 1
    p = rand_problem(1, G, H, T, dk, dv, seed=seed, vector_gate=vector, **kw)
    rng = np.random.default_rng(seed + 7)
    return p._replace(h0=rng.standard_normal((N, H, dk, dv)), dh_T=rng.standard_normal((N, H, dk, dv)))


def _one_by_one(p, cu, impl, scale, dh_T=True, per_head=False):
    """Each sequence as its own unpacked call (B = 1), results put back in the packed layout."""
    outs = []
    for n in range(len(cu) - 1):
        t = slice(cu[n], cu[n + 1])
        a = (p.q[:, :, t], p.k[:, :, t], p.v[:, :, t], p.log_alpha[:, :, t], p.h0[n:n + 1])
        o, h_T = glaref.forward(*a, scale=scale, impl=impl)
        if per_head:
            g = glaref.gla._oracle.backend(impl).vjp(*a, p.do[:, :, t], p.dh_T[n:n + 1] if dh_T else None,
                                                  scale, per_head=True)
        else:
            g = glaref.vjp(*a, p.do[:, :, t], p.dh_T[n:n + 1] if dh_T else None, scale=scale, impl=impl)
        outs.append((o, h_T) + tuple(g))
    cat = lambda i, axis: np.concatenate([x[i] for x in outs], axis=axis)  # noqa: E731
    if not outs:
        return None
    return {"o": cat(0, 2), "h_T": cat(1, 0), "q": cat(2, 2), "k": cat(3, 2), "v": cat(4, 2),
            "log_alpha": cat(5, 2), "h0": cat(6, 0)}


def _run_packed(p, cu, impl, scale, dh_T=True):
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale=scale, impl=impl, cu_seqlens=cu)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T if dh_T else None, scale=scale,
                   impl=impl, cu_seqlens=cu)
    return {"o": o, "h_T": h_T, **g._asdict()}


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("G,H,dk,dv,cu", CASES)
def test_packed_equals_one_by_one_to_the_last_bit(G, H, dk, dv, cu, impl, vector):
    p = _packed(G, H, dk, dv, cu, vector, seed=len(cu))
    for dh_T in (True, False):
        got = _run_packed(p, cu, impl, 0.6, dh_T)
        N = len(cu) - 1
        assert got["h_T"].shape == got["h0"].shape == (N, H, dk, dv)
        assert got["log_alpha"].shape == p.log_alpha.shape
        want = _one_by_one(p, cu, impl, 0.6, dh_T)
        if want is None:   # no sequence at all
            assert all(x.size == 0 for x in got.values())
            continue
        for name, x in got.items():
            np.testing.assert_array_equal(x, want[name], err_msg=f"{name} (dh_T={dh_T})")
    # empty sequences: h_T = h0 and dh0 = dh_T
    for n in range(len(cu) - 1):
        if cu[n] == cu[n + 1]:
            np.testing.assert_array_equal(got["h_T"][n], p.h0[n])
            g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, impl=impl, cu_seqlens=cu)
            np.testing.assert_array_equal(g.h0[n], p.dh_T[n])


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_packed_per_head_gradients_and_numba_against_numpy(vector):
    cu = [0, 7, 7, 40, 41, 75]
    p = _packed(2, 6, 5, 3, cu, vector, seed=3, log_alpha=lambda rng, s: np.where(
        rng.random(s) < 0.3, -30.0, -0.05))
    from glaref.gla import _numba, _reference
    cu64 = np.asarray(cu)
    a = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, 0.8)
    for be in (_numba, _reference):
        got = be.vjp(*a, per_head=True, cu_seqlens=cu64)
        want = _one_by_one(p, cu, "numba" if be is _numba else "numpy", 0.8, per_head=True)
        np.testing.assert_array_equal(got[0], want["q"])
        np.testing.assert_array_equal(got[1], want["k"])
    got = _run_packed(p, cu, "numba", 0.8)
    ref = _run_packed(p, cu, "numpy", 0.8)
    for name in got:
        assert rel_err(got[name], ref[name]) <= tol("numba_vs_numpy"), name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_packed_scales_and_identity(impl, vector):
    cu = [0, 5, 5, 17, 30]
    p = _packed(1, 2, 3, 4, cu, vector, seed=5)
    args = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    sc = glaref.scales(*args, impl=impl, cu_seqlens=cu)
    assert sc.h_T.shape == sc.h0.shape == (4, 2, 3, 4)
    assert sc.log_alpha_identity.shape == p.log_alpha.shape
    # every scale, sequence by sequence, is the unpacked scale of that sequence (same bits)
    for n in range(len(cu) - 1):
        t = slice(cu[n], cu[n + 1])
        one = glaref.scales(p.q[:, :, t], p.k[:, :, t], p.v[:, :, t], p.log_alpha[:, :, t],
                            p.h0[n:n + 1], p.do[:, :, t], p.dh_T[n:n + 1], impl=impl)
        for name in ("o", "q", "k", "v", "log_alpha", "log_alpha_identity"):
            np.testing.assert_array_equal(getattr(sc, name)[:, :, t], getattr(one, name), err_msg=name)
        for name in ("h_T", "h0"):
            np.testing.assert_array_equal(getattr(sc, name)[n:n + 1], getattr(one, name), err_msg=name)
    ident = glaref.dlog_alpha_identity(*args, impl=impl, cu_seqlens=cu)
    direct = glaref.vjp(*args, impl=impl, cu_seqlens=cu).log_alpha
    assert_scaled(ident, direct, sc.log_alpha_identity + sc.log_alpha, tol("dlog_alpha_identity"),
                  "packed identity vs direct")


@pytest.mark.parametrize("impl", IMPLS)
def test_packed_bthd_and_integer_arrays_of_any_kind(impl):
    cu = [0, 9, 9, 20]
    p = _packed(1, 2, 3, 2, cu, True, seed=6)
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, impl=impl, cu_seqlens=cu)
    for c in (np.asarray(cu, np.int32), np.asarray(cu, np.uint64), tuple(cu)):
        ot, h_Tt = glaref.forward(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, layout="bthd",
                                  impl=impl, cu_seqlens=c)
        np.testing.assert_array_equal(sw(ot), o)
        np.testing.assert_array_equal(h_Tt, h_T)
    jnp = pytest.importorskip("jax.numpy")
    oj, _ = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, impl=impl, cu_seqlens=jnp.asarray(cu))
    np.testing.assert_array_equal(oj, o)


# ---- bad input -------------------------------------------------------------------------------

def _bad(cu, **over):
    p = _packed(1, 2, 3, 2, [0, 4, 10], False, seed=1)
    a = dict(q=p.q, k=p.k, v=p.v, log_alpha=p.log_alpha, h0=None)
    a.update(over)
    glaref.forward(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], impl="numpy", cu_seqlens=cu)


@pytest.mark.parametrize("cu,exc,msg", [
    ([1, 4, 10], SeqlensError,
     "cu_seqlens: got [1, 4, 10], expected offsets starting at 0: cu_seqlens[0] = 1"),
    ([0, 6, 4, 10], SeqlensError, "cu_seqlens: got [0, 6, 4, 10], expected nondecreasing offsets: "
                                  "cu_seqlens[2] = 4 < cu_seqlens[1] = 6"),
    ([0, 4, 9], SeqlensError,
     "cu_seqlens: got [0, 4, 9], expected offsets ending at T=10: cu_seqlens[2] = 9"),
    ([0, 12, 12], SeqlensError,
     "cu_seqlens: got [0, 12, 12], expected offsets ending at T=10: cu_seqlens[1] = 12"),
    (np.array([0.0, 4.0, 10.0]), DTypeError, "cu_seqlens: got dtype float64, expected an integer dtype"),
    (np.array([[0, 4, 10]]), ShapeError, "cu_seqlens: got shape (1, 3), expected (N + 1,) offsets"),
    (np.array([], dtype=np.int64), ShapeError, "cu_seqlens: got shape (0,), expected (N + 1,) offsets"),
])
def test_bad_offsets_name_cu_seqlens_and_the_first_bad_position(cu, exc, msg):
    with pytest.raises(exc, match="^" + re.escape(msg)) as e:
        _bad(cu)
    assert isinstance(e.value, (ValueError, TypeError))


def test_packed_needs_one_batch_row_and_per_sequence_states():
    p = rand_problem(2, 1, 2, 10, 3, 2, seed=0)
    with pytest.raises(ShapeError, match=re.escape("cu_seqlens: given with B=2 batch rows, expected B=1")):
        glaref.forward(p.q, p.k, p.v, p.log_alpha, impl="numpy", cu_seqlens=[0, 4, 10])
    with pytest.raises(ShapeError,
                       match=re.escape("h0: got shape (1, 2, 3, 2), expected (2, 2, 3, 2) (N, H, dk, dv)")):
        _bad([0, 4, 10], h0=np.zeros((1, 2, 3, 2)))
    q = rand_problem(1, 1, 2, 10, 3, 2, seed=0)
    with pytest.raises(ShapeError,
                       match=re.escape("dh_T: got shape (1, 2, 3, 2), expected (3, 2, 3, 2) (N, H, dk, dv)")):
        glaref.vjp(q.q, q.k, q.v, q.log_alpha, None, q.do, np.zeros((1, 2, 3, 2)), impl="numpy",
                   cu_seqlens=[0, 4, 4, 10])
    torch = pytest.importorskip("torch")
    with pytest.raises(DTypeError, match=r"^cu_seqlens: got dtype torch.float32"):
        glaref.forward(q.q, q.k, q.v, q.log_alpha, impl="numpy", cu_seqlens=torch.tensor([0.0, 10.0]))
    o, _ = glaref.forward(q.q, q.k, q.v, q.log_alpha, impl="numpy", cu_seqlens=torch.tensor([0, 10]))
    np.testing.assert_array_equal(o, glaref.forward(q.q, q.k, q.v, q.log_alpha, impl="numpy")[0])
