"""The JAX kernels with vector gates and with packed sequences (cu_seqlens) against the float64
oracle, in the style of tests/test_kernels.py: every expected value is the oracle's on the same
(dtype-rounded) inputs; each output is judged elementwise by budget_ulps against the worst-case
bound of a correct kernel (glaref._audit._verdict.budget_bound, dlog_alpha against the identity's
scale) and, where the gates are well conditioned, normwise against the table's tolerance.

The bound takes scalar gates of one sequence per row; ``_verdict.budget_view`` presents vector
gates (one gate sequence per key dimension) and packed sequences (one row per sequence) that way.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import glaref  # noqa: E402
from glaref import kernels  # noqa: E402
from glaref._audit._device import x64_scope  # noqa: E402
from glaref._audit._metrics import budget_ulps  # noqa: E402
from glaref._audit._verdict import budget_bound, budget_view  # noqa: E402
from glaref._inputs import GRADS, OUTPUTS  # noqa: E402
from glaref.gla._budget import problem_scales  # noqa: E402
from glaref.kernels._chunked_vector import sub_chunk  # noqa: E402
from glaref.tolerances import tol  # noqa: E402

from conftest import logsigmoid, rand_problem, rel_err  # noqa: E402
from test_kernels import rounded  # noqa: E402

pytestmark = pytest.mark.jax

KERNELS = ["chunked", "scan"]


def _kernel(name: str, C: int):
    if name == "chunked":
        return kernels.chunked, {"chunk_size": C}, C
    return kernels.scan, {}, 1


def run(fn, p, dtype: str, *, jit: bool = True, **kw):
    """fn forward and backward through jax.vjp on p cast to dtype (cu_seqlens from p)."""
    dt = jnp.dtype(dtype)
    args = [jnp.asarray(x.astype(dt)) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    if p.cu_seqlens is not None:
        kw = dict(kw, cu_seqlens=p.cu_seqlens)
    f = lambda *a: fn(*a, return_final_state=True, **kw)  # noqa: E731

    def fwd_bwd(q, k, v, la, h0, do, dh_T):
        (o, h_T), pull = jax.vjp(f, q, k, v, la, h0)
        return (o, h_T), pull((do, dh_T))

    if jit:
        fwd_bwd = jax.jit(fwd_bwd)
    dh_dt = jnp.float32 if dt.itemsize < 4 else dt
    (o, h_T), grads = fwd_bwd(*args, jnp.asarray(p.do.astype(dt)), jnp.asarray(p.dh_T, dh_dt))
    arrays = {"o": o, "h_T": h_T, **dict(zip(GRADS, grads))}
    return ({k: np.asarray(a, dtype=np.float64) for k, a in arrays.items()},
            {k: a.dtype for k, a in arrays.items()})


def oracle(p):
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, cu_seqlens=p.cu_seqlens)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, cu_seqlens=p.cu_seqlens)
    return {"o": o, "h_T": h_T, **g._asdict()}


def measure(got, p, dtype: str, chunk_size: int, outputs=OUTPUTS):
    """{output: (budget_ulps, bound, normwise rel err, worst index)} against the oracle."""
    ref = oracle(p)
    sc = problem_scales(p)
    dims, la = budget_view(p)
    narrow = dtype in ("bfloat16", "float16")
    out = {}
    for name in outputs:
        x = got[name]
        if x.shape != ref[name].shape:
            raise AssertionError(f"{name}: shape {x.shape}, expected {ref[name].shape}")
        out_dtype = "float32" if (narrow and name == "h_T") else dtype
        scale = sc["log_alpha_identity"] if name == "log_alpha" else sc[name]
        ulps, where = budget_ulps(name, x, ref[name], scale, out_dtype, dims)
        bound = budget_bound(name, out_dtype, dims, chunk_size, log_alpha=la,
                             accumulate_dtype="float32" if narrow and out_dtype != "float32" else None)
        out[name] = (ulps, bound, rel_err(x, ref[name]) if np.isfinite(x).all() else np.inf, where)
    return out


def check(got, p, dtype: str, chunk_size: int, *, normwise: bool = True, outputs=OUTPUTS):
    __tracebackhide__ = True
    figures = measure(got, p, dtype, chunk_size, outputs)
    failures = []
    for name, (ulps, bound, rel, where) in figures.items():
        if not np.isfinite(got[name]).all():
            failures.append(f"{name}: non-finite value at "
                            f"{tuple(int(i) for i in np.argwhere(~np.isfinite(got[name]))[0])}")
            continue
        if not ulps <= bound:
            failures.append(f"{name}: budget_ulps {ulps:.3g} > bound {bound:.3g} at {where}; rel {rel:.3g}")
        if normwise:
            out_dtype = "float32" if (dtype in ("bfloat16", "float16") and name == "h_T") else dtype
            key = (f"kernel_rel_err_{out_dtype}" if out_dtype in ("bfloat16", "float16")
                   else f"audit_rel_err_{out_dtype}")
            if not rel <= tol(key):
                failures.append(f"{name}: normwise rel err {rel:.3g} > {tol(key):.3g} ({key})")
    if failures:
        raise AssertionError(f"{dtype} kernel vs oracle:\n  " + "\n  ".join(failures))
    return figures


def vproblem(B, G, H, T, dk, dv, seed=0, **kw):
    return rand_problem(B, G, H, T, dk, dv, seed=seed, vector_gate=True, **kw)


# ---- vector gates -----------------------------------------------------------------------------

SHAPES = [
    pytest.param((1, 1, 1, 1, 4, 4, 64), id="T1"),
    pytest.param((2, 1, 2, 63, 16, 8, 64), id="T63-G1H2"),
    pytest.param((1, 2, 4, 65, 48, 40, 64), id="T65-dk48dv40-G2H4"),
    pytest.param((1, 1, 1, 130, 8, 8, 16), id="T130-C16"),
]


@pytest.mark.parametrize("kname", KERNELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_vector_float32_matches_oracle(kname, shape):
    B, G, H, T, dk, dv, C = shape
    p = rounded(vproblem(B, G, H, T, dk, dv, seed=T + dk), "float32")
    fn, kw, cs = _kernel(kname, C)
    got, dts = run(fn, p, "float32", **kw)
    check(got, p, "float32", cs)
    assert got["log_alpha"].shape == p.log_alpha.shape
    assert all(dt == jnp.float32 for dt in dts.values()), dts


@pytest.mark.parametrize("kname", KERNELS)
def test_vector_float64_under_x64(kname):
    p = vproblem(1, 2, 4, 65, 48, 40, seed=11)
    fn, kw, cs = _kernel(kname, 64)
    with x64_scope():
        got, dts = run(fn, p, "float64", **kw)
    assert all(dt == jnp.float64 for dt in dts.values()), dts
    check(got, p, "float64", cs)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kname", KERNELS)
def test_vector_16bit_inputs_accumulate_in_float32(kname, dtype):
    p = rounded(vproblem(1, 2, 4, 65, 48, 40, seed=5), dtype)
    p = p._replace(dh_T=rounded(p, "float32").dh_T)
    fn, kw, cs = _kernel(kname, 64)
    got, dts = run(fn, p, dtype, **kw)
    assert dts["h_T"] == jnp.float32
    assert all(dts[n] == jnp.dtype(dtype) for n in ("o",) + GRADS), dts
    check(got, p, dtype, cs)


@pytest.mark.parametrize("C", [1, 7, 12, 200])
def test_vector_chunk_and_sub_chunk_sizes(C):
    # sub-chunks: C = 1, 7 (prime: one sub-chunk), 12 (two of 6... the largest divisor <= 16 is 12),
    # 200 (20 sub-chunks of 10, T = 50 < C: one padded chunk)
    assert C % sub_chunk(C) == 0 and sub_chunk(C) <= 16
    p = rounded(vproblem(1, 1, 2, 50, 6, 5, seed=C), "float32")
    got, _ = run(kernels.chunked, p, "float32", chunk_size=C)
    check(got, p, "float32", C)


def _half_dims(rng, s):
    """Per key dimension: even dimensions decayed at -60 per step, odd ones near 1."""
    return np.where(np.arange(s[-1]) % 2 == 0, -60.0, -1e-3) * rng.uniform(0.5, 1.5, s)


STRONG = {
    "la=-30": lambda rng, shape: np.full(shape, -30.0),
    "logsigmoid/0.1": lambda rng, shape: logsigmoid(rng.standard_normal(shape)) / 0.1,
    "mixed -60..0": lambda rng, shape: np.where(rng.random(shape) < 0.5, -60.0, -1e-3),
    "half dims -60": _half_dims,
}


@pytest.mark.parametrize("gates", list(STRONG))
@pytest.mark.parametrize("kname", KERNELS)
def test_vector_strong_decay_is_finite_and_within_budget(kname, gates):
    """Per-dimension log decays down to -60 per step: exp(-b_s) of the naive split would be
    exp(+1900) inside one chunk; every exponent here is a segment sum <= 0 and underflows."""
    p = rounded(vproblem(1, 1, 2, 70, 8, 8, seed=7, log_alpha=STRONG[gates]), "float32")
    fn, kw, cs = _kernel(kname, 32)
    got, _ = run(fn, p, "float32", **kw)
    for name, x in got.items():
        assert np.isfinite(x).all(), name
    check(got, p, "float32", cs, normwise=False)


@pytest.mark.parametrize("regime", ["mixed_dims", "strong_decay", "positive", "h0_dominant"])
@pytest.mark.parametrize("kname", KERNELS)
def test_vector_regimes_within_budget(kname, regime):
    """The regimes with vector gates, mixed_dims among them (near-1 and strongly decayed key
    dimensions side by side in every head), through both kernels in float32."""
    from glaref._inputs import Dims
    from glaref.regimes import make_inputs
    p = rounded(make_inputs(regime, Dims(1, 2, 4, 100, 16, 8), 0, gate="vector"), "float32")
    fn, kw, cs = _kernel(kname, 32)
    got, _ = run(fn, p, "float32", **kw)
    check(got, p, "float32", cs, normwise=regime not in ("mixed_dims", "strong_decay"))


def _naive_split_forward(q, k, v, log_alpha, h0, *, chunk_size, return_final_state=False, **_):
    """A deliberately naive vector-gate chunk: A = (Q o exp(b)) (K o exp(-b))^T, masked after.
    Exact in exact arithmetic; overflows (inf * 0 = nan) once -b > 88 in float32."""
    B, G, T, dk = q.shape
    H = v.shape[1]
    R = H // G
    qh, kh = jnp.repeat(q, R, axis=1), jnp.repeat(k, R, axis=1)
    C = chunk_size
    S = jnp.zeros((B, H, dk, v.shape[3]), q.dtype) if h0 is None else h0
    outs = []
    for t0 in range(0, T, C):
        sl = slice(t0, min(T, t0 + C))
        b = jnp.cumsum(log_alpha[:, :, sl], axis=2)
        A = jnp.einsum("bhik,bhjk->bhij", qh[:, :, sl] * jnp.exp(b), kh[:, :, sl] * jnp.exp(-b))
        L = b.shape[2]
        A = A * jnp.tril(jnp.ones((L, L), q.dtype))
        outs.append(jnp.einsum("bhik,bhkv->bhiv", qh[:, :, sl] * jnp.exp(b), S)
                    + jnp.einsum("bhij,bhjv->bhiv", A, v[:, :, sl]))
        S = (jnp.exp(b[:, :, -1])[..., None] * S
             + jnp.einsum("bhjk,bhjv->bhkv", kh[:, :, sl] * jnp.exp(b[:, :, -1:] - b), v[:, :, sl]))
    o = jnp.concatenate(outs, axis=2)
    return (o, S) if return_final_state else o


def test_strong_decay_check_catches_the_naive_split():
    # teeth: the same check flags a kernel that forms exp(-b_s) (its o is nan under strong decay)
    p = rounded(vproblem(1, 1, 2, 70, 8, 8, seed=7, log_alpha=STRONG["la=-30"]), "float32")
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    o, h_T = _naive_split_forward(*args, chunk_size=32, return_final_state=True)
    got = {"o": np.asarray(o, np.float64), "h_T": np.asarray(h_T, np.float64)}
    assert not np.isfinite(got["o"]).all()
    with pytest.raises(AssertionError, match="o: non-finite value"):
        check(got, p, "float32", 32, normwise=False, outputs=("o", "h_T"))
    # and on mild gates the naive split is right, so the failure above is the overflow alone
    pm = rounded(vproblem(1, 1, 2, 70, 8, 8, seed=7), "float32")
    args = [jnp.asarray(x, jnp.float32) for x in (pm.q, pm.k, pm.v, pm.log_alpha, pm.h0)]
    o, h_T = _naive_split_forward(*args, chunk_size=32, return_final_state=True)
    check({"o": np.asarray(o, np.float64), "h_T": np.asarray(h_T, np.float64)}, pm, "float32", 32,
          outputs=("o", "h_T"))


@pytest.mark.parametrize("kname", KERNELS)
def test_vector_bthd_layout(kname):
    p = rounded(vproblem(2, 1, 3, 17, 5, 4, seed=9), "float32")
    fn, kw, cs = _kernel(kname, 8)
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    args = [jnp.asarray(x, jnp.float32) for x in (sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0)]
    (o, h_T), pull = jax.vjp(lambda *a: fn(*a, layout="bthd", return_final_state=True, **kw), *args)
    gq, gk, gv, gla, gh0 = pull((jnp.asarray(sw(p.do), jnp.float32), jnp.asarray(p.dh_T, jnp.float32)))
    assert o.shape == (2, 17, 3, 4) and gla.shape == (2, 17, 3, 5)
    got = {n: np.asarray(a, np.float64) for n, a in
           {"o": sw(np.asarray(o)), "h_T": h_T, "q": sw(np.asarray(gq)), "k": sw(np.asarray(gk)),
            "v": sw(np.asarray(gv)), "log_alpha": sw(np.asarray(gla)), "h0": gh0}.items()}
    check(got, p, "float32", cs)


def test_vector_chunked_saves_nothing_but_its_inputs():
    from test_kernels import _residual_bytes
    p = vproblem(1, 2, 4, 70, 8, 6, seed=1)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    extra, res = _residual_bytes(lambda *a: kernels.chunked(*a, chunk_size=16, return_final_state=True), args)
    assert extra == 0, res
    assert len(res) == len(args)


def test_vector_precision_reaches_every_matmul():
    from test_kernels import _dot_precisions
    p = vproblem(1, 1, 2, 9, 4, 3, seed=0)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    for fn, kw in [(kernels.chunked, {"chunk_size": 4}), (kernels.scan, {})]:
        f = lambda *a: fn(*a, precision="highest", return_final_state=True, **kw)  # noqa: E731, B023

        def fwd_bwd(*a):
            out, pull = jax.vjp(f, *a)  # noqa: B023 - called in this iteration
            return pull(out)

        precs = _dot_precisions(jax.make_jaxpr(fwd_bwd)(*args))
        assert len(precs) >= 4
        want = jax.lax.Precision.HIGHEST
        assert all(pr is not None and all(x == want for x in (pr if isinstance(pr, tuple) else (pr,)))
                   for pr in precs), precs


def test_vector_gate_shape_errors():
    q = jnp.zeros((1, 1, 5, 4))
    v = jnp.zeros((1, 2, 5, 3))
    for fn in (kernels.chunked, kernels.scan):
        with pytest.raises(ValueError, match=r"^log_alpha: got shape \(1, 2, 5, 3\), expected \(1, 2, 5, 4\) "
                                             r"\(B, H, T, dk\) \(vector gate\)"):
            fn(q, q, v, jnp.zeros((1, 2, 5, 3)))
        with pytest.raises(ValueError, match=r"^log_alpha: got shape \(1, 2, 5, 4, 1\) \(5 dims\)"):
            fn(q, q, v, jnp.zeros((1, 2, 5, 4, 1)))


# ---- packed sequences -------------------------------------------------------------------------

def packed_problem(G, H, dk, dv, cu, vector, seed=0, **kw):
    T, N = cu[-1], len(cu) - 1
    p = rand_problem(1, G, H, T, dk, dv, seed=seed, vector_gate=vector, **kw)
    rng = np.random.default_rng(seed + 7)
    return p._replace(h0=rng.standard_normal((N, H, dk, dv)), dh_T=rng.standard_normal((N, H, dk, dv)),
                      cu_seqlens=np.asarray(cu, np.int64))


PACKED = [
    pytest.param([0, 7, 7, 40, 41, 75], id="ragged-empty-mid"),
    pytest.param([0, 0, 16], id="empty-first"),
    pytest.param([0, 70, 70], id="empty-last"),
    pytest.param([0, 130], id="one-seq"),
]


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("kname", KERNELS)
@pytest.mark.parametrize("cu", PACKED)
def test_packed_float32_matches_oracle(cu, kname, vector):
    p = rounded(packed_problem(2, 4, 8, 6, cu, vector, seed=len(cu)), "float32")
    fn, kw, cs = _kernel(kname, 16)
    got, _ = run(fn, p, "float32", **kw)
    N = len(cu) - 1
    assert got["h_T"].shape == got["h0"].shape == (N, 4, 8, 6)
    check(got, p, "float32", cs)
    for n in range(N):   # an empty sequence: h_T = h0 and dh0 = dh_T exactly
        if cu[n] == cu[n + 1]:
            np.testing.assert_array_equal(got["h_T"][n], p.h0[n])
            np.testing.assert_array_equal(got["h0"][n], p.dh_T[n])


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("kname", KERNELS)
def test_packed_strong_decay_float64_bthd(kname, vector):
    cu = [0, 33, 33, 90]
    p = packed_problem(1, 2, 4, 4, cu, vector, seed=3,
                       log_alpha=lambda rng, s: logsigmoid(rng.standard_normal(s)) / 0.1)
    fn, kw, cs = _kernel(kname, 32)
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    with x64_scope():
        args = [jnp.asarray(x) for x in (sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0)]
        f = lambda *a: fn(*a, layout="bthd", cu_seqlens=cu, return_final_state=True, **kw)  # noqa: E731
        (o, h_T), pull = jax.vjp(f, *args)
        gq, gk, gv, gla, gh0 = pull((jnp.asarray(sw(p.do)), jnp.asarray(p.dh_T)))
        got = {"o": sw(np.asarray(o)), "h_T": np.asarray(h_T), "q": sw(np.asarray(gq)),
               "k": sw(np.asarray(gk)), "v": sw(np.asarray(gv)), "log_alpha": sw(np.asarray(gla)),
               "h0": np.asarray(gh0)}
    check(got, p, "float64", cs, normwise=False)


@pytest.mark.parametrize("kname", KERNELS)
def test_packed_h0_none_and_bad_offsets(kname):
    cu = [0, 5, 12]
    p = rounded(packed_problem(1, 2, 3, 2, cu, True, seed=2), "float32")
    fn, kw, _ = _kernel(kname, 4)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha)]
    o, h_T = fn(*args, None, cu_seqlens=cu, return_final_state=True, **kw)
    o_ref, h_ref = glaref.forward(p.q, p.k, p.v, p.log_alpha, None, cu_seqlens=cu)
    t = tol("audit_rel_err_float32")
    assert rel_err(o, o_ref) <= t and rel_err(h_T, h_ref) <= t and h_T.shape == (2, 2, 3, 2)
    with pytest.raises(ValueError, match=r"^cu_seqlens: got \[0, 6, 5, 12\], expected nondecreasing offsets: "
                                         r"cu_seqlens\[2\] = 5 < cu_seqlens\[1\] = 6"):
        fn(*args, None, cu_seqlens=[0, 6, 5, 12], **kw)
    with pytest.raises(ValueError,
                       match=r"^h0: got shape \(1, 2, 3, 2\), expected \(2, 2, 3, 2\) \(N, H, dk, dv\)"):
        fn(*args, jnp.zeros((1, 2, 3, 2)), cu_seqlens=cu, **kw)
    with pytest.raises(ValueError, match=r"^cu_seqlens: got a traced array"):
        jax.jit(lambda c: fn(*args, None, cu_seqlens=c, **kw))(jnp.asarray(cu))
    with pytest.raises(ValueError, match=r"^cu_seqlens: given with B=2 batch rows"):
        two = [jnp.concatenate([x, x]) for x in args]
        fn(*two, None, cu_seqlens=cu, **kw)


def test_packed_jit_with_static_offsets_equals_eager():
    cu = [0, 9, 20]
    p = rounded(packed_problem(1, 2, 3, 2, cu, False, seed=4), "float32")
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    f = lambda *a: kernels.chunked(*a, chunk_size=8, cu_seqlens=cu)  # noqa: E731
    assert rel_err(jax.jit(f)(*args), f(*args)) <= tol("audit_rel_err_float32")


# ---- figures (python tests/test_kernels_vector.py) --------------------------------------------

def _report() -> None:  # pragma: no cover - a reporting aid
    print("float32 kernels, vector gates, strong decay (B=1, G=1, H=2, T=70, dk=dv=8, C=32):")
    print("  budget_ulps / bound and normwise rel err per output")
    for gates in STRONG:
        p = rounded(vproblem(1, 1, 2, 70, 8, 8, seed=7, log_alpha=STRONG[gates]), "float32")
        for kname in KERNELS:
            fn, kw, cs = _kernel(kname, 32)
            got, _ = run(fn, p, "float32", **kw)
            f = measure(got, p, "float32", cs)
            print(f"  {gates:15s} {kname:8s} " + "  ".join(
                f"{n} {u:.2g}/{b:.3g} ({r:.1e})" for n, (u, b, r, _) in f.items()))


if __name__ == "__main__":  # pragma: no cover
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _report()
