"""Bad input gets a clear error; every real float input is converted exactly; empty sizes work.

Messages must name the argument and show what it got (shape or dtype) and what was expected.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import glaref
from glaref import (
    ArgumentError,
    DTypeError,
    GlarefError,
    LayoutError,
    NonFiniteError,
    NonFiniteWarning,
    ShapeError,
)
from glaref._inputs import ARRAYS, GRADS

from conftest import IMPLS, rand_problem

B, G, H, T, DK, DV = 2, 2, 4, 5, 3, 2


@pytest.fixture
def p():
    return rand_problem(B, G, H, T, DK, DV, seed=11)


def _args(p, **over):
    a = dict(q=p.q, k=p.k, v=p.v, log_alpha=p.log_alpha, h0=p.h0, do=p.do, dh_T=p.dh_T)
    a.update(over)
    return a


def _call_vjp(a, **kw):
    return glaref.vjp(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], a["do"], a["dh_T"], impl="numpy", **kw)


def _call_fwd(a, **kw):
    return glaref.forward(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"], impl="numpy", **kw)


def _shape_text(shape) -> str:
    return re.escape(str(tuple(shape)))


# ---------------------------------------------------------------------------------------------
# shapes

@pytest.mark.parametrize("name,bad_shape", [
    ("q", (B, G, T)), ("k", (B, G, T, DK, 1)), ("v", (B, H, T)), ("log_alpha", (B, H, T, 1)),
    ("h0", (B, H, DK)), ("do", (B, H, T)), ("dh_T", (B, H, DK, DV, 1)),
])
def test_wrong_ndim_names_the_argument_and_shape(p, name, bad_shape):
    a = _args(p, **{name: np.zeros(bad_shape)})
    with pytest.raises(ShapeError, match=rf"^{name}: got shape {_shape_text(bad_shape)}") as e:
        _call_vjp(a)
    assert "expected" in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, GlarefError)


@pytest.mark.parametrize("name,bad_shape,expected", [
    ("k", (B, G, T, DK + 1), (B, G, T, DK)),             # dk mismatch
    ("k", (B + 1, G, T, DK), (B, G, T, DK)),             # B mismatch
    ("v", (B + 1, H, T, DV), (B, H, T, DV)),             # B mismatch
    ("v", (B, H, T + 1, DV), (B, H, T, DV)),             # T mismatch
    ("log_alpha", (B, H, T + 1), (B, H, T)),             # T mismatch
    ("log_alpha", (B, H + 1, T), (B, H, T)),             # H mismatch
    ("h0", (B, H, DK, DV + 1), (B, H, DK, DV)),          # dv mismatch
    ("h0", (B, H, DK + 1, DV), (B, H, DK, DV)),          # dk mismatch
    ("do", (B, H, T, DV + 1), (B, H, T, DV)),            # dv mismatch
    ("dh_T", (B, H, DK, DV + 1), (B, H, DK, DV)),        # dv mismatch
])
def test_mismatched_sizes_name_argument_got_and_expected(p, name, bad_shape, expected):
    a = _args(p, **{name: np.zeros(bad_shape)})
    with pytest.raises(ShapeError) as e:
        _call_vjp(a)
    msg = str(e.value)
    assert msg.startswith(f"{name}: got shape {tuple(bad_shape)}"), msg
    assert f"expected {tuple(expected)}" in msg, msg


def test_mismatch_in_bthd_is_reported_in_the_callers_layout(p):
    sw = lambda x: np.swapaxes(x, 1, 2)  # noqa: E731
    with pytest.raises(ShapeError) as e:
        glaref.forward(sw(p.q), sw(p.k), sw(p.v)[:, :T - 1], sw(p.log_alpha), layout="bthd", impl="numpy")
    msg = str(e.value)
    assert msg.startswith(f"v: got shape {(B, T - 1, H, DV)}"), msg
    assert f"expected {(B, T, H, DV)}" in msg and "(B, T, H, dv)" in msg, msg


def test_heads_not_a_multiple_of_groups(p):
    v = np.zeros((B, 3, T, DV))
    with pytest.raises(ShapeError, match=r"H=3 .*multiple of .*G=2"):
        glaref.forward(p.q, p.k, v, np.zeros((B, 3, T)), impl="numpy")


def test_unknown_layout_and_impl_and_bad_scale(p):
    with pytest.raises(LayoutError, match=r"^layout: got 'bhdt', expected one of \('bhtd', 'bthd'\)"):
        glaref.forward(p.q, p.k, p.v, p.log_alpha, layout="bhdt", impl="numpy")
    with pytest.raises(ValueError, match=r"^impl: got 'cuda'"):
        glaref.forward(p.q, p.k, p.v, p.log_alpha, impl="cuda")
    with pytest.raises(ValueError, match=r"^scale: got inf"):
        glaref.forward(p.q, p.k, p.v, p.log_alpha, scale=float("inf"), impl="numpy")
    with pytest.raises(TypeError, match=r"^scale: got 'x'"):
        glaref.forward(p.q, p.k, p.v, p.log_alpha, scale="x", impl="numpy")


def test_vjp_needs_do(p):
    with pytest.raises(ShapeError, match=r"^do: got None"):
        glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, None, impl="numpy")


# ---------------------------------------------------------------------------------------------
# dtypes

@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.complex128, np.bool_, np.uint8])
@pytest.mark.parametrize("name", list(ARRAYS))
def test_non_real_float_dtype_is_refused(p, name, dtype):
    x = getattr(p, name)
    a = _args(p, **{name: x.astype(dtype)})
    with pytest.raises(DTypeError) as e:
        _call_vjp(a)
    msg = str(e.value)
    assert msg.startswith(f"{name}: got dtype {np.dtype(dtype)}"), msg
    assert "expected a real floating dtype" in msg, msg
    assert isinstance(e.value, TypeError)


def _quantised(p, dtype):
    """p's inputs rounded to ``dtype`` (the array passed in) and their exact float64 values."""
    out = {}
    for name in ARRAYS:
        low = getattr(p, name).astype(dtype)
        out[name] = (low, low.astype(np.float64))
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_low_precision_inputs_are_converted_exactly(p, impl, dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    qs = _quantised(p, dtype)
    low = {n: a for n, (a, _) in qs.items()}
    wide = {n: b for n, (_, b) in qs.items()}
    o_low, h_low = glaref.forward(low["q"], low["k"], low["v"], low["log_alpha"], low["h0"], impl=impl)
    o_wide, h_wide = glaref.forward(wide["q"], wide["k"], wide["v"], wide["log_alpha"], wide["h0"], impl=impl)
    assert o_low.dtype == np.float64 and h_low.dtype == np.float64 and type(o_low) is np.ndarray
    assert np.array_equal(o_low, o_wide) and np.array_equal(h_low, h_wide)
    g_low = glaref.vjp(*(low[n] for n in ARRAYS), impl=impl)
    g_wide = glaref.vjp(*(wide[n] for n in ARRAYS), impl=impl)
    for a, b in zip(g_low, g_wide):
        assert a.dtype == np.float64 and np.array_equal(a, b)


def test_jax_arrays_are_accepted(p):
    jnp = pytest.importorskip("jax.numpy")
    qs = _quantised(p, np.float32)
    j = {n: jnp.asarray(a) for n, (a, _) in qs.items()}
    wide = {n: b for n, (_, b) in qs.items()}
    o, h_T = glaref.forward(j["q"], j["k"], j["v"], j["log_alpha"], j["h0"], impl="numpy")
    o_w, h_w = glaref.forward(wide["q"], wide["k"], wide["v"], wide["log_alpha"], wide["h0"], impl="numpy")
    assert type(o) is np.ndarray and o.dtype == np.float64
    assert np.array_equal(o, o_w) and np.array_equal(h_T, h_w)
    # bfloat16 JAX arrays too
    jb = jnp.asarray(p.v, dtype=jnp.bfloat16)
    o_b, _ = glaref.forward(p.q, p.k, jb, p.log_alpha, impl="numpy")
    o_bw, _ = glaref.forward(p.q, p.k, np.asarray(jb).astype(np.float64), p.log_alpha, impl="numpy")
    assert np.array_equal(o_b, o_bw)
    # and an integer JAX array is refused like a numpy one
    with pytest.raises(DTypeError, match=r"^q: got dtype int32"):
        glaref.forward(jnp.asarray(p.q, dtype=jnp.int32), p.k, p.v, p.log_alpha, impl="numpy")


def test_torch_cpu_tensors_are_accepted(p):
    torch = pytest.importorskip("torch")
    t = {n: torch.from_numpy(getattr(p, n)).to(torch.bfloat16)
         for n in GRADS}
    wide = {n: x.double().numpy() for n, x in t.items()}
    o, h_T = glaref.forward(t["q"], t["k"], t["v"], t["log_alpha"], t["h0"], impl="numpy")
    o_w, h_w = glaref.forward(wide["q"], wide["k"], wide["v"], wide["log_alpha"], wide["h0"], impl="numpy")
    assert np.array_equal(o, o_w) and np.array_equal(h_T, h_w)
    with pytest.raises(DTypeError, match=r"^q: got dtype torch.int64"):
        glaref.forward(torch.zeros((B, G, T, DK), dtype=torch.int64), p.k, p.v, p.log_alpha, impl="numpy")


# ---------------------------------------------------------------------------------------------
# non-finite values

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name,index", [("q", (1, 0, 3, 2)), ("v", (0, 3, 1, 1)), ("log_alpha", (1, 2, 4)),
                                        ("h0", (0, 1, 2, 0)), ("do", (1, 1, 0, 1)), ("dh_T", (1, 3, 0, 1))])
def test_nonfinite_is_located(p, name, index, bad):
    x = getattr(p, name).copy()
    x[index] = bad
    x[tuple(np.array(x.shape) - 1)] = bad          # a later bad element: the first is reported
    a = _args(p, **{name: x})
    with pytest.raises(NonFiniteError) as e:
        _call_vjp(a)
    msg = str(e.value)
    assert msg.startswith(f"{name}: got a non-finite value"), msg
    assert f"at index {index}" in msg and "allow_nonfinite=True" in msg, msg
    assert repr(float(bad)) in msg, msg
    # accepted on request: computed instead of refused (log_alpha = -inf is a decay of exactly 0);
    # a non-finite result comes with a warning naming the non-finite input as the reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = _call_vjp(a, allow_nonfinite=True)
    assert [x.shape for x in g] == [x.shape for x in _call_vjp(_args(p))]
    if np.isnan(bad):
        assert any(np.isnan(x).any() for x in g)
    said = [str(w.message) for w in caught if issubclass(w.category, NonFiniteWarning)]
    if any(not np.isfinite(x).all() for x in g):
        assert len(said) == 1 and f"allow_nonfinite=True ({name} has 2)" in said[0], said
    else:
        assert said == [] and (name, bad) == ("log_alpha", -np.inf)
    assert not [w for w in caught if not issubclass(w.category, NonFiniteWarning)]


def test_nonfinite_index_is_in_the_callers_layout(p):
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    v = sw(p.v)                                   # (B, T, H, dv)
    v[1, 4, 2, 0] = np.nan
    with pytest.raises(NonFiniteError,
                       match=re.escape("v: got a non-finite value nan at index (1, 4, 2, 0)")):
        glaref.forward(sw(p.q), sw(p.k), v, sw(p.log_alpha), layout="bthd", impl="numpy")
    with pytest.warns(NonFiniteWarning, match=re.escape("o has 1 (first at index (1, 4, 2, 0))")):
        o, _ = glaref.forward(sw(p.q), sw(p.k), v, sw(p.log_alpha), layout="bthd", impl="numpy",
                              allow_nonfinite=True)
    # the NaN reaches only column 0 of the state of (b=1, h=2), from step 4 on
    assert np.isnan(o[1, 4, 2, 0]) and np.isfinite(o[:, :4]).all() and np.isfinite(o[..., 1]).all()


# ---------------------------------------------------------------------------------------------
# empty sizes

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
@pytest.mark.parametrize("Bn,Tn", [(0, 5), (2, 0), (0, 0)])
def test_empty_batch_or_time(impl, layout, Bn, Tn):
    p = rand_problem(Bn, G, H, Tn, DK, DV, seed=12)
    sw = (lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))) if layout == "bthd" else (lambda x: x)
    o, h_T = glaref.forward(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0, layout=layout, impl=impl)
    o_shape = (Bn, H, Tn, DV) if layout == "bhtd" else (Bn, Tn, H, DV)
    assert o.shape == o_shape and h_T.shape == (Bn, H, DK, DV)
    assert o.dtype == h_T.dtype == np.float64
    assert np.array_equal(h_T, p.h0)  # no step: the state is h0 (zeros when B = 0, trivially)
    g = glaref.vjp(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), None, sw(p.do), p.dh_T, layout=layout,
                   impl=impl)
    assert g.q.shape == g.k.shape == sw(p.q).shape
    assert g.v.shape == o_shape and g.log_alpha.shape == sw(p.log_alpha).shape
    assert g.h0.shape == (Bn, H, DK, DV)
    if Tn == 0:
        assert np.array_equal(g.h0, p.dh_T)


def test_h0_none_means_zeros_and_dh0_is_returned(p):
    o0, h0_ = glaref.forward(p.q, p.k, p.v, p.log_alpha, None, impl="numpy")
    o1, h1 = glaref.forward(p.q, p.k, p.v, p.log_alpha, np.zeros_like(p.h0), impl="numpy")
    assert np.array_equal(o0, o1) and np.array_equal(h0_, h1)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, None, p.do, impl="numpy")
    assert g.h0.shape == p.h0.shape and np.any(g.h0 != 0)
    assert glaref.Grads._fields == GRADS


class _OnlyDLPack:
    """An array-like that offers DLPack and nothing else (no __array__, no buffer)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_only_arrays_are_accepted(p):
    v32 = p.v.astype(np.float32)
    o, _ = glaref.forward(p.q, p.k, _OnlyDLPack(v32), p.log_alpha, impl="numpy")
    o_w, _ = glaref.forward(p.q, p.k, v32.astype(np.float64), p.log_alpha, impl="numpy")
    assert np.array_equal(o, o_w)
    with pytest.raises(DTypeError, match=r"^v: got dtype int64"):
        glaref.forward(p.q, p.k, _OnlyDLPack(p.v.astype(np.int64)), p.log_alpha, impl="numpy")


def test_non_array_input_is_refused_with_its_type(p):
    with pytest.raises(DTypeError,
                       match=r"^q: got builtins.object \(dtype object\), expected a real floating array"):
        glaref.forward(object(), p.k, p.v, p.log_alpha, impl="numpy")


# ---------------------------------------------------------------------------------------------
# arguments that are not arrays: no lenient conversions

@pytest.mark.parametrize("scale,error,text", [
    ("0.5", DTypeError, "scale: got '0.5' (builtins.str), expected a real number"),
    (True, DTypeError, "scale: got True (builtins.bool), expected a real number"),
    (np.bool_(False), DTypeError, "scale: got np.False_ (numpy.bool"),
    (1 + 2j, DTypeError, "scale: got (1+2j) (builtins.complex), expected a real number"),
    (np.ones(2), DTypeError, "scale: got array([1., 1.])"),
    (10**400, NonFiniteError, "scale: got an integer of 1329 bits, expected a finite float64"),
    (np.nan, NonFiniteError, "scale: got nan, expected a finite number"),
])
@pytest.mark.parametrize("impl", IMPLS)
def test_scale_must_be_a_finite_real_number(p, impl, scale, error, text):
    for call in (lambda: _call_fwd(_args(p), scale=scale), lambda: _call_vjp(_args(p), scale=scale),
                 lambda: glaref.scales(p.q, p.k, p.v, p.log_alpha, scale=scale, impl=impl)):
        with pytest.raises(error) as e:
            call()
        assert str(e.value).startswith(text), str(e.value)


def test_real_scales_of_every_kind_are_accepted_exactly(p):
    o = _call_fwd(_args(p), scale=0.5)[0]
    for s in (np.float32(0.5), np.float64(0.5), np.array(0.5), 1 / np.int64(2)):
        assert np.array_equal(_call_fwd(_args(p), scale=s)[0], o)
    assert np.array_equal(_call_fwd(_args(p), scale=2)[0], _call_fwd(_args(p), scale=2.0)[0])


@pytest.mark.parametrize("flag", ["no", "", 0, 1, None, np.float64(1.0)])
def test_allow_nonfinite_must_be_true_or_false(p, flag):
    x = p.q.copy()
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(ArgumentError,
                       match=rf"^allow_nonfinite: got {re.escape(repr(flag))} .*expected True or False"):
        _call_fwd(_args(p, q=x), allow_nonfinite=flag)
    # numpy's bools are bools
    with pytest.raises(NonFiniteError):
        _call_fwd(_args(p, q=x), allow_nonfinite=np.False_)


def test_impl_error_is_a_glaref_error(p):
    with pytest.raises(ArgumentError, match=r"^impl: got 'cuda', expected one of \('numba', 'numpy'\)"):
        glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, impl="cuda")


def test_a_masked_array_with_masked_elements_is_refused(p):
    m = np.ma.masked_array(p.v, mask=np.zeros(p.v.shape, bool))
    m[1, 2, 3, 0] = np.ma.masked
    with pytest.raises(DTypeError, match=r"^v: got a masked array with 1 masked element\(s\), "
                                         r"expected plain values .*v.filled\(0.0\)"):
        _call_fwd(_args(p, v=m))
    # without a masked element it is its data
    clear = np.ma.masked_array(p.v, mask=np.zeros(p.v.shape, bool))
    assert np.array_equal(_call_fwd(_args(p, v=clear))[0], _call_fwd(_args(p))[0])


@pytest.mark.parametrize("x", [1.0, np.float64(1.0), np.array(1.0), np.float32(2.0)])
def test_zero_dim_inputs_are_reported_with_their_own_shape(p, x):
    with pytest.raises(ShapeError, match=re.escape("q: got shape () (0 dims), expected 4 dims")):
        _call_fwd(_args(p, q=x))
    with pytest.raises(ShapeError, match=re.escape("h0: got shape (), expected (2, 4, 3, 2)")):
        _call_fwd(_args(p, h0=x))


@pytest.mark.parametrize("given,passed", [("bhtd", "bthd"), ("bthd", "bhtd")])
def test_arrays_in_the_other_layout_are_called_transposed(given, passed):
    # G=2, H=4, T=7: in the wrong layout v's "T" would be 4 against q's 2 or 7
    p = rand_problem(2, 2, 4, 7, 3, 5, seed=13)
    sw = (lambda x: np.swapaxes(x, 1, 2)) if given == "bthd" else (lambda x: x)  # noqa: E731
    with pytest.raises(LayoutError) as e:
        glaref.forward(sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), layout=passed, impl="numpy")
    msg = str(e.value)
    assert msg.startswith(f"layout: got {passed!r}, but q {sw(p.q).shape}"), msg
    assert f"fit {given!r} and not {passed!r}: the arrays look transposed" in msg, msg
    # a plain mismatch is still blamed on its argument
    with pytest.raises(ShapeError, match=r"^v: got shape"):
        glaref.forward(sw(p.q), sw(p.k), sw(p.v)[:1], sw(p.log_alpha), layout=given, impl="numpy")


@pytest.mark.parametrize("given,passed", [("bhtd", "bthd"), ("bthd", "bhtd")])
def test_with_one_head_per_group_the_state_tells_the_layouts_apart(given, passed):
    # G = H = 3, T = 7: q, k, v and log_alpha fit both layouts; only h0 (or dh_T), with H heads,
    # shows which one they are in (it used to be blamed: "h0: got shape (2, 3, 4, 5), expected
    # (2, 7, 4, 5)")
    p = rand_problem(2, 3, 3, 7, 4, 5, seed=13)
    sw = (lambda x: np.swapaxes(x, 1, 2)) if given == "bthd" else (lambda x: x)  # noqa: E731
    args = [sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha)]
    for name, call in (("h0", lambda: glaref.forward(*args, p.h0, layout=passed, impl="numpy")),
                       ("dh_T", lambda: glaref.vjp(*args, None, sw(p.do), p.dh_T, layout=passed,
                                                   impl="numpy"))):
        with pytest.raises(LayoutError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"layout: got {passed!r}, but q {args[0].shape}"), msg
        assert (f"and {name} {p.h0.shape} fit {given!r} and not {passed!r}: the arrays look "
                "transposed") in msg, msg
    # a state of the wrong size is still blamed on itself
    with pytest.raises(ShapeError, match=r"^h0: got shape"):
        glaref.forward(*args, p.h0[:, :2], layout=given, impl="numpy")


# ---------------------------------------------------------------------------------------------
# finite inputs whose results overflow float64: one warning naming the cause, on both impls

def _overflow_cases():
    p = rand_problem(1, 1, 2, 20, 3, 2, seed=14)
    spike = p.log_alpha.copy()
    spike[:, :, 3] = 710.0                                   # exp(710) > 1.8e308 at one step
    big = np.full_like(p.do, 1e308)
    return p, {
        "log_alpha=+60 over 20 steps": (dict(log_alpha=np.full_like(p.log_alpha, 60.0)), {}, ["log_alpha"]),
        "log_alpha=710 at one step": (dict(log_alpha=spike), {}, ["log_alpha"]),
        "k=v=1e200": (dict(k=np.full_like(p.k, 1e200), v=np.full_like(p.v, 1e200)), {}, ["k", "v"]),
        "scale=1e308": ({}, dict(scale=1e308), ["scale"]),
        "cotangents 1e308": (dict(do=big, dh_T=np.full_like(p.dh_T, 1e308)), {}, ["do", "dh_T"]),
    }


_P_OVER, _OVERFLOW = _overflow_cases()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(_OVERFLOW))
def test_overflow_warns_naming_the_cause_on_both_impls(impl, case):
    arrays, kw, causes = _OVERFLOW[case]
    a = _args(_P_OVER, **arrays)
    calls = {"vjp": lambda: glaref.vjp(*(a[n] for n in ARRAYS),
                                       impl=impl, **kw)}
    if not case.startswith("cotangents"):
        calls["forward"] = lambda: glaref.forward(a["q"], a["k"], a["v"], a["log_alpha"], a["h0"],
                                                  impl=impl, **kw)
    for fname, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = call()
        assert any(not np.isfinite(x).all() for x in out), (fname, "expected an overflow")
        assert [w.category for w in caught] == [NonFiniteWarning], [str(w.message) for w in caught]
        msg = str(caught[0].message)
        assert msg.startswith(f"glaref.{fname} (impl={impl!r}): non-finite results: "), msg
        assert "Every input is finite" in msg and "exceed float64's range" in msg, msg
        likely = msg.split("Likely cause: ", 1)[1].split(". All factors", 1)[0]
        named = sorted(part.split(" (", 1)[0] for part in likely.split(") and "))
        assert named == sorted(causes), (fname, likely)


def test_finite_results_raise_no_warning(p):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _call_vjp(_args(p))
        _call_fwd(_args(p))


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("x", [0.5, np.zeros(3)])
def test_wrong_ndim_in_bthd_is_a_shape_error_not_a_crash(p, name, x):
    # found by tests/test_contract.py: a 0-d do in "bthd" reached np.swapaxes (AxisError)
    sw = lambda a: np.swapaxes(a, 1, 2)  # noqa: E731
    a = {n: (sw(getattr(p, n)) if n in ("q", "k", "v", "log_alpha", "do") else getattr(p, n))
         for n in ARRAYS}
    a[name] = x
    with pytest.raises(ShapeError, match=rf"^{name}: got shape \({'' if np.ndim(x) == 0 else '3,'}\)"):
        glaref.vjp(*(a[n] for n in ARRAYS), layout="bthd",
                   impl="numpy")
