"""The JAX kernels of the gated delta rule (glaref.delta.kernels) against the float64 oracle.

Every expected value comes from glaref.delta.forward / vjp, run on exactly the values the kernel
received (float32 inputs are rounded first and widened back exactly). In float64 (jax x64) both
kernels must agree with the oracle to delta_kernel_f64; in float32 their error must be of
float32 size (audit_rel_err_float32). The figure is the normwise max |x - ref| / max |ref| per
output (test_delta_trust.rel).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from test_delta_trust import NAMES, make_case, rel  # noqa: E402

import glaref.delta as gd  # noqa: E402
from glaref import ShapeError  # noqa: E402
from glaref._audit._device import x64_scope  # noqa: E402
from glaref.delta import kernels  # noqa: E402
from glaref.tolerances import tol  # noqa: E402

pytestmark = pytest.mark.jax

OUTS = ("o", "h_T") + NAMES
C_SMALL = 4   # the chunked kernel's chunk size on the tiny shapes: T = 1, C - 1, C + 1, 2C + 3


def kernel(name: str, **kw):
    """The kernel ``name`` returning (o, h_T); the chunked one at ``C_SMALL`` unless given."""
    if name == "chunked":
        kw.setdefault("chunk_size", C_SMALL)
    return functools.partial(getattr(kernels, name), return_final_state=True, **kw)


def run(fn, x, cot, dtype, *, scale=1.0, **kw):
    """{output name: float64 array} of fn's forward and its jax.vjp, jitted (one XLA compile is
    several times cheaper than running the kernels op by op); dh0 is None when h0 is."""
    args = [None if a is None else jnp.asarray(a, dtype) for a in x]
    do, dh_T = (jnp.asarray(a, dtype) for a in cot)

    def fwd_bwd(*a):
        out, pull = jax.vjp(lambda *xs: fn(*xs, scale=scale, **kw), *a)
        return out, pull((do, dh_T))

    (o, h_T), grads = jax.jit(fwd_bwd)(*args)
    got = dict(zip(OUTS, (o, h_T, *grads)))
    return {n: None if a is None else np.asarray(a, np.float64) for n, a in got.items()}


def oracle(x, cot, *, scale=1.0, **kw):
    o, h_T = gd.forward(*x, scale=scale, **kw)
    g = gd.vjp(*x, *cot, scale=scale, **kw)
    return dict(zip(OUTS, (o, h_T, *g)))


def errors(got, ref) -> dict:
    """Normwise error per output; dh0 is skipped when the kernel had no h0."""
    out = {}
    for n in OUTS:
        if got[n] is None:
            continue
        assert got[n].shape == ref[n].shape, (n, got[n].shape, ref[n].shape)
        assert np.isfinite(got[n]).all(), f"{n}: non-finite values"
        out[n] = rel(got[n], ref[n])
    return out


def assert_within(errs: dict, limit: float, what: str) -> None:
    __tracebackhide__ = True
    bad = {n: e for n, e in errs.items() if not e <= limit}
    if bad:
        figures = ", ".join(f"{n} {e:.3g}" for n, e in bad.items())
        raise AssertionError(f"{what}: normwise error above {limit:.3g}: {figures}")


def rounded(x, cot, dtype):
    r = lambda a: None if a is None else np.asarray(a).astype(dtype).astype(np.float64)  # noqa: E731
    return [r(a) for a in x], [r(a) for a in cot]


# (id, (B, G, H, T, dk, dv), make_case keywords, h0 given)
CASES = [
    ("g2h4_dk3_dv5_T11", (1, 2, 4, 11, 3, 5), {"beta_max": 2.0}, True),      # T = 2C + 3
    ("T1_deltanet", (2, 1, 1, 1, 3, 2), {"gates": "zero"}, True),
    ("T3_no_h0", (1, 1, 2, 3, 4, 3), {"beta_max": 2.0}, False),             # T = C - 1
    ("T5_vector", (1, 1, 2, 5, 4, 3), {"vector": True, "beta_max": 2.0}, True),   # T = C + 1
    ("g2h4_T11_vector_no_h0", (1, 2, 4, 11, 3, 2), {"vector": True}, False),
    ("T9_deltanet_l2", (1, 1, 2, 9, 4, 4), {"gates": "zero", "l2": True}, True),
]


def case(dims, kw, with_h0):
    x, cot = make_case(*dims, **kw)
    if not with_h0:
        x = (*x[:5], None)
    return x, cot


@pytest.mark.parametrize("name,dims,kw,with_h0", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("kname", ["scan", "chunked"])
def test_float64_matches_oracle(kname, name, dims, kw, with_h0):
    x, cot = case(dims, kw, with_h0)
    with x64_scope():
        got = run(kernel(kname), x, cot, jnp.float64, scale=0.7)
    errs = errors(got, oracle(x, cot, scale=0.7))
    assert ("h0" in errs) == with_h0
    assert_within(errs, tol("delta_kernel_f64"), f"{kname} float64 {name}")


SLOW = pytest.mark.slow
F32_CASES = [pytest.param(name, dims, kw, id=name, marks=marks) for name, dims, kw, marks in [
    ("g2h4_beta2", (1, 2, 4, 37, 8, 6), {"beta_max": 2.0}, ()),
    ("vector_strong", (1, 1, 2, 37, 8, 8), {"vector": True, "gates": "strong"}, ()),
    ("vector_l2", (1, 1, 2, 37, 8, 6), {"vector": True, "l2": True}, SLOW),
    ("deltanet_l2", (1, 1, 2, 37, 8, 8), {"gates": "zero", "l2": True}, SLOW),
]]


@pytest.mark.parametrize("name,dims,kw", F32_CASES)
@pytest.mark.parametrize("kname", ["scan", "chunked"])
def test_float32_error_is_float32_size(kname, name, dims, kw):
    x, cot = rounded(*make_case(*dims, **kw), np.float32)
    got = run(kernel(kname, **({"chunk_size": 16} if kname == "chunked" else {})), x, cot,
              jnp.float32, scale=0.5)
    assert_within(errors(got, oracle(x, cot, scale=0.5)), tol("audit_rel_err_float32"),
                  f"{kname} float32 {name}")


@pytest.mark.parametrize("C", [1, 7, pytest.param(64, marks=pytest.mark.slow)])
def test_chunk_sizes(C):
    """One step per chunk, a chunk size not dividing T, one chunk longer than T."""
    x, cot = make_case(1, 1, 2, 23, 3, 4, vector=C == 7, beta_max=2.0)
    with x64_scope():
        got = run(kernel("chunked", chunk_size=C), x, cot, jnp.float64)
    assert_within(errors(got, oracle(x, cot)), tol("delta_kernel_f64"), f"chunked C={C}")


@pytest.mark.parametrize("n", [pytest.param(1, marks=pytest.mark.slow), 5,
                               pytest.param(23, marks=pytest.mark.slow)])
def test_scan_checkpoint_every(n):
    x, cot = make_case(1, 1, 2, 23, 3, 4, beta_max=2.0)
    with x64_scope():
        got = run(kernel("scan", checkpoint_every=n), x, cot, jnp.float64)
    assert_within(errors(got, oracle(x, cot)), tol("delta_kernel_f64"), f"scan every {n}")


@pytest.mark.parametrize("kname", ["scan", "chunked"])
def test_packed_sequences(kname):
    """cu_seqlens with an empty sequence and one longer than a chunk; h0, h_T per sequence."""
    cu = np.array([0, 3, 3, 10, 13])
    x, cot = make_case(1, 1, 2, 13, 3, 4, beta_max=2.0)
    rng = np.random.default_rng(5)
    x = (*x[:5], rng.standard_normal((4, 2, 3, 4)))
    cot = (cot[0], rng.standard_normal((4, 2, 3, 4)))
    with x64_scope():
        got = run(kernel(kname), x, cot, jnp.float64, cu_seqlens=cu)
    errs = errors(got, oracle(x, cot, cu_seqlens=cu))
    assert_within(errs, tol("delta_kernel_f64"), f"{kname} packed")
    # the empty sequence: its state passes through, and so does its cotangent
    np.testing.assert_array_equal(got["h_T"][1], x[5][1])
    np.testing.assert_array_equal(got["h0"][1], cot[1][1])


@pytest.mark.parametrize("kname", ["scan", "chunked"])
def test_bthd_layout(kname):
    x, cot = make_case(1, 2, 4, 6, 3, 2, vector=kname == "scan")
    sw = lambda a: np.swapaxes(a, 1, 2)  # noqa: E731
    xt = (sw(x[0]), sw(x[1]), sw(x[2]), sw(x[3]), sw(x[4]), x[5])
    cott = (sw(cot[0]), cot[1])
    with x64_scope():
        got = run(kernel(kname, layout="bthd"), xt, cott, jnp.float64)
    errs = errors(got, oracle(xt, cott, layout="bthd"))
    assert_within(errs, tol("delta_kernel_f64"), f"{kname} bthd")


@pytest.mark.parametrize("kname", ["scan", "chunked"])
def test_empty_sequence(kname):
    x, cot = make_case(1, 1, 2, 0, 3, 2)
    got = run(kernel(kname), x, cot, jnp.float32)
    assert got["o"].shape == (1, 2, 0, 2) and got["beta"].shape == (1, 2, 0)
    np.testing.assert_array_equal(got["h_T"], x[5].astype(np.float32))
    np.testing.assert_array_equal(got["h0"], cot[1].astype(np.float32))


@pytest.mark.parametrize("with_h0", [True, False])
@pytest.mark.parametrize("kname", ["scan", "chunked"])
def test_saves_nothing_but_its_inputs(kname, with_h0):
    from jax._src.ad_checkpoint import saved_residuals
    x, _ = make_case(1, 2, 4, 13, 3, 5, vector=with_h0)
    args = [jnp.asarray(a, jnp.float32) for a in (x if with_h0 else x[:5])]
    fn = kernel(kname)
    f = fn if with_h0 else (lambda *a: fn(*a, None))
    res = saved_residuals(f, *args)
    assert all(s.startswith("from the argument") for _, s in res), res
    assert len(res) == len(args)


def test_16bit_inputs_dtypes_and_accuracy():
    """bfloat16 inputs: computed in float32, o and each gradient rounded once at return, h_T in
    float32 (as glaref.kernels)."""
    bf16 = jnp.dtype("bfloat16")
    x, cot = rounded(*make_case(1, 1, 2, 21, 4, 4, beta_max=2.0), bf16)
    ref = oracle(x, cot)
    for kname in ("scan", "chunked"):
        args = [jnp.asarray(a, bf16) for a in x]
        fn = kernel(kname)

        @jax.jit
        def fwd_bwd(*a):
            out, pull = jax.vjp(fn, *a)  # noqa: B023 (called in this iteration)
            return out, pull((jnp.asarray(cot[0], bf16), jnp.asarray(cot[1], jnp.float32)))

        (o, h_T), grads = fwd_bwd(*args)
        assert o.dtype == bf16 and h_T.dtype == jnp.float32
        assert all(g.dtype == bf16 for g in grads)
        got = dict(zip(OUTS, (o, h_T, *grads)))
        errs = errors({n: np.asarray(a, np.float64) for n, a in got.items()}, ref)
        h = errs.pop("h_T")
        assert h <= tol("audit_rel_err_float32"), (kname, h)
        assert_within(errs, tol("kernel_rel_err_bfloat16"), f"{kname} bfloat16")


def test_bad_inputs_name_the_argument():
    x, _ = make_case(1, 1, 2, 5, 3, 2)
    q, k, v, beta, la, h0 = (jnp.asarray(a, jnp.float32) for a in x)
    for kname in ("scan", "chunked"):
        fn = getattr(kernels, kname)
        with pytest.raises(ShapeError, match=r"beta: got shape \(2, 5\), expected \(1, 2, 5\)"):
            fn(q, k, v, beta[0], la, h0)
        with pytest.raises(ShapeError, match="beta: got None"):
            fn(q, k, v, None, la, h0)
        with pytest.raises(TypeError, match="beta: got dtype int32"):
            fn(q, k, v, beta.astype(jnp.int32), la, h0)
        with pytest.raises(ShapeError, match="log_alpha"):
            fn(q, k, v, beta, la[..., None], h0)
        with pytest.raises(ShapeError, match="h0"):
            fn(q, k, v, beta, la, h0[:, :1])
    with pytest.raises(ValueError, match="chunk_size: got 0"):
        kernels.chunked(q, k, v, beta, la, h0, chunk_size=0)
    with pytest.raises(ValueError, match="checkpoint_every: got 0"):
        kernels.scan(q, k, v, beta, la, h0, checkpoint_every=0)


def test_import_glaref_delta_loads_no_jax():
    code = ("import json, sys; import glaref, glaref.delta; glaref.delta.forward; "
            "print(json.dumps(sorted(m for m in ('jax', 'glaref.delta.kernels') "
            "if m in sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


SWEEP = [(dims, kw, C) for dims in [(2, 1, 3, 130, 16, 8), (1, 2, 4, 200, 8, 16)]
         for kw in [{"beta_max": 2.0}, {"vector": True, "l2": True}, {"gates": "zero", "l2": True},
                    {"vector": True, "gates": "strong"}]
         for C in [16, 64]]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dims,kw,C", SWEEP)
def test_sweep_float64_and_float32(dims, kw, C, seed):
    x, cot = make_case(*dims, seed=seed, **kw)
    ref = oracle(x, cot, scale=0.5)
    for kname, extra in (("scan", {}), ("chunked", {"chunk_size": C})):
        with x64_scope():
            got = run(kernel(kname, **extra), x, cot, jnp.float64, scale=0.5)
        assert_within(errors(got, ref), tol("delta_kernel_f64"), f"{kname} float64 {dims} {kw}")
    x, cot = rounded(x, cot, np.float32)
    ref = oracle(x, cot, scale=0.5)
    for kname, extra in (("scan", {}), ("chunked", {"chunk_size": C})):
        got = run(kernel(kname, **extra), x, cot, jnp.float32, scale=0.5)
        assert_within(errors(got, ref), tol("audit_rel_err_float32"),
                      f"{kname} float32 {dims} {kw}")
