"""The JAX kernels (glaref.kernels) against the float64 oracle.

Every expected value comes from the oracle (glaref.forward / glaref.vjp) run on exactly the
values the kernel received (inputs and cotangents rounded to the kernel's dtype, widened exactly
to float64), so input quantisation is never counted as kernel error. Two checks per output
(o, h_T and the gradients of q, k, v, log_alpha, h0 through jax.vjp with random do and dh_T):

- elementwise: budget_ulps = max |x - ref| / (u * scale + floor) within the worst-case rounding
  bound of a correct chunked (or step-by-step) kernel, glaref._audit._verdict.budget_bound (scales from
  the oracle on absolute values; dlog_alpha against the identity's scale);
- normwise: ||x - ref|| / ||ref|| within the audit's table entry for float32/float64, and for
  16-bit inputs within kernel_rel_err_<dtype> (one rounding at return plus float32 arithmetic,
  the kernels' documented promise); well-conditioned gates only: under strong decay dlog_alpha
  is tiny next to its terms, and the elementwise budget is the meaningful check there.
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
from glaref._audit._presets import SEED_CONFIGS  # noqa: E402
from glaref._audit._verdict import budget_bound  # noqa: E402
from glaref._inputs import GRADS, OUTPUTS, Dims  # noqa: E402
from glaref.gla._budget import problem_scales  # noqa: E402
from glaref.tolerances import tol  # noqa: E402

from conftest import logsigmoid, rand_problem, rel_err  # noqa: E402

pytestmark = pytest.mark.jax




def _np_dtype(name: str):
    return jnp.dtype(name)  # numpy dtype, bfloat16 via ml_dtypes


def rounded(p, dtype: str):
    """The problem with every array rounded to ``dtype`` and widened back (exactly) to float64."""
    dt = _np_dtype(dtype)
    r = lambda x: None if x is None else np.asarray(x).astype(dt).astype(np.float64)  # noqa: E731
    return p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha), h0=r(p.h0),
                      do=r(p.do), dh_T=r(p.dh_T))


def run_kernel(fn, p, dtype: str, *, jit: bool = True, **kw):
    """Run ``fn`` forward and backward through jax.vjp on ``p`` cast to ``dtype``.

    Returns ({output name: float64 array}, {output name: dtype of the kernel's array})."""
    dt = _np_dtype(dtype)
    args = [jnp.asarray(x.astype(dt)) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    f = lambda *a: fn(*a, return_final_state=True, **kw)  # noqa: E731

    def fwd_bwd(q, k, v, la, h0, do, dh_T):
        (o, h_T), pull = jax.vjp(f, q, k, v, la, h0)
        return (o, h_T), pull((do, dh_T))

    if jit:
        fwd_bwd = jax.jit(fwd_bwd)
    (o, h_T), grads = fwd_bwd(*args, jnp.asarray(p.do.astype(dt)),
                              jnp.asarray(p.dh_T, jnp.float32 if dt.itemsize < 4 else dt))
    arrays = {"o": o, "h_T": h_T, **dict(zip(GRADS, grads))}
    return ({k: np.asarray(a, dtype=np.float64) for k, a in arrays.items()},
            {k: a.dtype for k, a in arrays.items()})


def oracle(p):
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    return {"o": o, "h_T": h_T, "q": g.q, "k": g.k, "v": g.v, "log_alpha": g.log_alpha, "h0": g.h0}


def check_against_oracle(got, p, dtype: str, chunk_size: int, *, normwise: bool = True):
    """Assert every output within its budget bound (and normwise tolerance); return the figures."""
    __tracebackhide__ = True
    ref = oracle(p)
    sc = problem_scales(p)
    dims = p.dims
    narrow = dtype in ("bfloat16", "float16")
    acc = "float32" if narrow else None
    figures, failures = {}, []
    for name in OUTPUTS:
        x = got[name]
        if x.shape != ref[name].shape:
            raise AssertionError(f"{name}: shape {x.shape}, expected {ref[name].shape}")
        if not np.isfinite(x).all():
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
            failures.append(f"{name}: non-finite value at {bad}")
            continue
        # h_T is returned in float32 even for 16-bit inputs: judge it as float32 arithmetic
        out_dtype = "float32" if (narrow and name == "h_T") else dtype
        scale = sc["log_alpha_identity"] if name == "log_alpha" else sc[name]
        ulps, where = budget_ulps(name, x, ref[name], scale, out_dtype, dims)
        bound = budget_bound(name, out_dtype, dims, chunk_size, log_alpha=p.log_alpha,
                             accumulate_dtype=None if out_dtype == "float32" or not narrow else acc)
        rel = rel_err(x, ref[name])
        figures[name] = (ulps, bound, rel)
        if not ulps <= bound:
            failures.append(f"{name}: budget_ulps {ulps:.3g} > bound {bound:.3g} at {where} "
                            f"(got {x[where]!r}, expected {ref[name][where]!r}); rel err {rel:.3g}")
        if normwise:
            # 16-bit outputs: glaref.kernels round once, at return (kernel_rel_err_<dtype>)
            key = (f"kernel_rel_err_{out_dtype}" if out_dtype in ("bfloat16", "float16")
                   else f"audit_rel_err_{out_dtype}")
            t = tol(key)
            if not rel <= t:
                failures.append(f"{name}: normwise rel err {rel:.3g} > {t:.3g} ({key})")
    if failures:
        raise AssertionError(f"{dtype} kernel vs oracle:\n  " + "\n  ".join(failures))
    return figures


# (B, G, H, T, dk, dv, chunk_size): T = 1, T < C, T = C + 1 (a one-step tail chunk), several
# chunks with a ragged tail; dk/dv 48/40; G < H with contiguous groups; B = 1.
SHAPES = [
    pytest.param((1, 1, 1, 1, 4, 4, 64), id="T1"),
    pytest.param((2, 1, 2, 63, 16, 8, 64), id="T63-G1H2"),
    pytest.param((1, 2, 4, 65, 48, 40, 64), id="T65-dk48dv40-G2H4"),
    pytest.param((1, 1, 1, 130, 8, 8, 16), id="T130-C16"),
]
KERNELS = ["chunked", "scan"]


def _kernel(name: str, C: int):
    if name == "chunked":
        return kernels.chunked, {"chunk_size": C}, C
    return kernels.scan, {}, 1


@pytest.mark.parametrize("kname", KERNELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_matches_oracle(kname, shape):
    B, G, H, T, dk, dv, C = shape
    p = rounded(rand_problem(B, G, H, T, dk, dv, seed=T + dk), "float32")
    fn, kw, cs = _kernel(kname, C)
    got, dts = run_kernel(fn, p, "float32", **kw)
    check_against_oracle(got, p, "float32", cs)
    assert all(dt == jnp.float32 for dt in dts.values()), dts


def test_ragged_long_T1000():
    """T = 1000 (15 full chunks and a tail of 40), both kernels, scan also checkpointed."""
    p = rounded(rand_problem(1, 1, 2, 1000, 8, 4, seed=3), "float32")
    for fn, kw, cs in [(kernels.chunked, {"chunk_size": 64}, 64), (kernels.scan, {}, 1),
                       (kernels.scan, {"checkpoint_every": 64}, 1)]:
        got, _ = run_kernel(fn, p, "float32", **kw)
        check_against_oracle(got, p, "float32", cs)


@pytest.mark.parametrize("kname", KERNELS)
def test_float64_under_x64(kname):
    B, G, H, T, dk, dv, C = 1, 2, 4, 65, 48, 40, 64
    p = rand_problem(B, G, H, T, dk, dv, seed=11)
    fn, kw, cs = _kernel(kname, C)
    with x64_scope():
        got, dts = run_kernel(fn, p, "float64", **kw)
    assert all(dt == jnp.float64 for dt in dts.values()), dts
    check_against_oracle(got, p, "float64", cs)
    assert jnp.zeros(1).dtype == jnp.float32   # x64 was scoped to the block


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kname", KERNELS)
def test_16bit_inputs_accumulate_in_float32(kname, dtype):
    """o and the gradients come back in the input dtype (one rounding at the end), h_T in float32;
    errors are measured against the oracle on the rounded inputs."""
    B, G, H, T, dk, dv, C = 1, 2, 4, 65, 48, 40, 64
    p = rounded(rand_problem(B, G, H, T, dk, dv, seed=5), dtype)
    p = p._replace(dh_T=rounded(p, "float32").dh_T)
    fn, kw, cs = _kernel(kname, C)
    got, dts = run_kernel(fn, p, dtype, **kw)
    want = jnp.dtype(dtype)
    assert dts["h_T"] == jnp.float32
    assert all(dts[n] == want for n in ("o",) + GRADS), dts
    check_against_oracle(got, p, dtype, cs)


@pytest.mark.parametrize("kname", KERNELS)
def test_h0_none_means_zeros(kname):
    p = rand_problem(1, 1, 2, 20, 6, 5, seed=2)
    p = rounded(p._replace(h0=np.zeros_like(p.h0)), "float32")
    fn, kw, cs = _kernel(kname, 8)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha)]
    f = lambda q, k, v, la: fn(q, k, v, la, None, return_final_state=True, **kw)  # noqa: E731
    (o, h_T), pull = jax.vjp(f, *args)
    gq, gk, gv, gla = pull((jnp.asarray(p.do, jnp.float32), jnp.asarray(p.dh_T, jnp.float32)))
    got = {"o": o, "h_T": h_T, "q": gq, "k": gk, "v": gv, "log_alpha": gla}
    # h0's cotangent is still defined when the kernel is given zeros explicitly
    full, _ = run_kernel(fn, p, "float32", **kw)
    got = {n: np.asarray(a, np.float64) for n, a in got.items()} | {"h0": full["h0"]}
    check_against_oracle(got, p, "float32", cs)
    # and h0=None through jax.vjp with h0 as an argument gives a None cotangent
    _, pull0 = jax.vjp(lambda q, k, v, la, h0: fn(q, k, v, la, h0, **kw), *args, None)
    assert pull0(jnp.asarray(p.do, jnp.float32))[4] is None


@pytest.mark.parametrize("kname", KERNELS)
def test_bthd_layout(kname):
    p = rounded(rand_problem(2, 1, 3, 17, 5, 4, seed=9), "float32")
    fn, kw, cs = _kernel(kname, 8)
    sw = lambda x: np.ascontiguousarray(np.swapaxes(x, 1, 2))  # noqa: E731
    args = [jnp.asarray(x, jnp.float32) for x in (sw(p.q), sw(p.k), sw(p.v), sw(p.log_alpha), p.h0)]
    f = lambda *a: fn(*a, layout="bthd", return_final_state=True, **kw)  # noqa: E731
    (o, h_T), pull = jax.vjp(f, *args)
    gq, gk, gv, gla, gh0 = pull((jnp.asarray(sw(p.do), jnp.float32), jnp.asarray(p.dh_T, jnp.float32)))
    assert o.shape == (2, 17, 3, 4) and gla.shape == (2, 17, 3)
    got = {n: np.asarray(a, np.float64) for n, a in
           {"o": sw(np.asarray(o)), "h_T": h_T, "q": sw(np.asarray(gq)), "k": sw(np.asarray(gk)),
            "v": sw(np.asarray(gv)), "log_alpha": sw(np.asarray(gla)), "h0": gh0}.items()}
    check_against_oracle(got, p, "float32", cs)


@pytest.mark.parametrize("kname", KERNELS)
def test_scale_keyword(kname):
    p = rounded(rand_problem(1, 1, 2, 12, 4, 3, seed=4), "float32")
    fn, kw, _ = _kernel(kname, 8)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    (o, h_T), pull = jax.vjp(lambda *a: fn(*a, scale=0.5, return_final_state=True, **kw), *args)
    grads = pull((jnp.asarray(p.do, jnp.float32), jnp.asarray(p.dh_T, jnp.float32)))
    o_ref, hT_ref = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale=0.5)
    g_ref = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=0.5)
    t = tol("audit_rel_err_float32")
    assert rel_err(o, o_ref) <= t and rel_err(h_T, hT_ref) <= t
    for name, g, r in zip(GRADS, grads, g_ref):
        assert rel_err(g, r) <= t, name


@pytest.mark.parametrize("kname", KERNELS)
def test_jit_vmap_and_grad(kname):
    """jit equals eager; vmap over a stack of two problems equals two calls; jax.grad w.r.t. all
    five inputs equals the oracle's gradient of the same loss."""
    probs = [rounded(rand_problem(1, 1, 2, 19, 5, 4, seed=s), "float32") for s in (1, 2)]
    fn, kw, _ = _kernel(kname, 8)
    f = lambda q, k, v, la, h0: fn(q, k, v, la, h0, return_final_state=True, **kw)  # noqa: E731
    stack = [jnp.asarray(np.stack([getattr(p, n) for p in probs]), jnp.float32)
             for n in GRADS]
    t = tol("audit_rel_err_float32")

    o_eager, _ = f(*[x[0] for x in stack])
    o_jit, _ = jax.jit(f)(*[x[0] for x in stack])
    assert rel_err(o_jit, o_eager) <= t

    o_v, hT_v = jax.vmap(f)(*stack)
    for i, p in enumerate(probs):
        o_ref, hT_ref = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0)
        assert rel_err(o_v[i], o_ref) <= t and rel_err(hT_v[i], hT_ref) <= t

    p = probs[0]
    do, dh_T = jnp.asarray(p.do, jnp.float32), jnp.asarray(p.dh_T, jnp.float32)

    def loss(q, k, v, la, h0):
        o, h_T = f(q, k, v, la, h0)
        return jnp.sum(o * do) + jnp.sum(h_T * dh_T)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*[x[0] for x in stack])
    g_ref = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    for name, g, r in zip(GRADS, grads, g_ref):
        assert rel_err(g, r) <= t, name

    # vmap of the backward too (custom_vjp under vmap for chunked, batched scan for scan)
    def pullback(q, k, v, la, h0, do, dh_T):
        return jax.vjp(f, q, k, v, la, h0)[1]((do, dh_T))

    dos = jnp.asarray(np.stack([p.do for p in probs]), jnp.float32)
    dhs = jnp.asarray(np.stack([p.dh_T for p in probs]), jnp.float32)
    gv = jax.vmap(pullback)(*stack, dos, dhs)
    for i, p in enumerate(probs):
        g_ref = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
        for name, g, r in zip(GRADS, gv, g_ref):
            assert rel_err(g[i], r) <= t, (i, name)


def _residual_bytes(f, args):
    """Bytes JAX saves between forward and backward, the inputs themselves excluded, and the
    descriptions of what is saved (jax's own accounting, as print_saved_residuals)."""
    from jax._src.ad_checkpoint import saved_residuals
    res = saved_residuals(f, *args)
    extra = [(a, s) for a, s in res if not s.startswith("from the argument")]
    return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in extra), res


@pytest.mark.parametrize("with_h0", [True, False])
def test_chunked_saves_nothing_but_its_inputs(with_h0):
    p = rand_problem(1, 2, 4, 70, 8, 6, seed=1)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha)]
    if with_h0:
        args.append(jnp.asarray(p.h0, jnp.float32))
        f = lambda *a: kernels.chunked(*a, chunk_size=16, return_final_state=True)  # noqa: E731
    else:
        f = lambda *a: kernels.chunked(*a, None, chunk_size=16, return_final_state=True)  # noqa: E731
    extra, res = _residual_bytes(f, args)
    assert extra == 0, res
    assert len(res) == len(args)          # each input is kept once, nothing else
    # the same through the pullback's leaves, as the audit measures it
    from glaref._audit._timing import residual_bytes
    assert residual_bytes(f, tuple(args)) == 0


def test_scan_checkpoint_every_bounds_residuals():
    """Plain autodiff keeps every step's state (>= T * B*H*dk*dv floats); checkpoint_every=N keeps
    one state per block plus the block's inputs."""
    B, G, H, T, dk, dv, N = 1, 1, 2, 256, 8, 8, 16
    p = rand_problem(B, G, H, T, dk, dv, seed=1)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    plain, _ = _residual_bytes(lambda *a: kernels.scan(*a), args)
    ck, _ = _residual_bytes(lambda *a: kernels.scan(*a, checkpoint_every=N), args)
    state = B * H * dk * dv * 4
    assert plain >= T * state
    inputs_bytes = sum(int(a.size) * 4 for a in args)
    assert ck <= (T // N + 1) * state + 2 * inputs_bytes


STRONG = {
    "la=-30": lambda rng, shape: np.full(shape, -30.0),
    "logsigmoid/0.1": lambda rng, shape: logsigmoid(rng.standard_normal(shape)) / 0.1,
    "mixed -60..0": lambda rng, shape: np.where(rng.random(shape) < 0.5, -60.0, -1e-3),
}


@pytest.mark.parametrize("gates", list(STRONG))
@pytest.mark.parametrize("kname", KERNELS)
def test_strong_decay_is_finite_and_within_budget(kname, gates):
    """Per-step log decays down to -60: exp(b_i - b_j) underflows, nothing may overflow; in the
    chunked kernel the masked upper triangle would be exp(+1800) if it ever reached exp."""
    p = rounded(rand_problem(1, 1, 2, 70, 8, 8, seed=7, log_alpha=STRONG[gates]), "float32")
    fn, kw, cs = _kernel(kname, 32)
    got, _ = run_kernel(fn, p, "float32", **kw)
    for name, x in got.items():
        assert np.isfinite(x).all(), name
    check_against_oracle(got, p, "float32", cs, normwise=False)


@pytest.mark.parametrize("kname", KERNELS)
def test_empty_sequence(kname):
    """T = 0: o is empty, h_T = h0, dh0 = dh_T, the other gradients empty."""
    p = rand_problem(1, 1, 2, 0, 4, 3, seed=0)
    fn, kw, _ = _kernel(kname, 8)
    got, _ = run_kernel(fn, p, "float32", **kw)
    h0 = p.h0.astype(np.float32).astype(np.float64)
    dh_T = p.dh_T.astype(np.float32).astype(np.float64)
    assert got["o"].shape == (1, 2, 0, 3) and got["log_alpha"].shape == (1, 2, 0)
    np.testing.assert_array_equal(got["h_T"], h0)
    np.testing.assert_array_equal(got["h0"], dh_T)


@pytest.mark.parametrize("C", [1, 7, 200])
def test_chunk_sizes(C):
    p = rounded(rand_problem(1, 1, 2, 20, 6, 5, seed=C), "float32")
    got, _ = run_kernel(kernels.chunked, p, "float32", chunk_size=C)
    check_against_oracle(got, p, "float32", C)


def _dot_precisions(jaxpr) -> list:
    """The precision of every dot_general in a jaxpr, sub-jaxprs included."""
    found = []

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "dot_general":
                found.append(eqn.params["precision"])
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (list, tuple)) else [v]):
                    if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                        walk(sub.jaxpr)
                    elif hasattr(sub, "eqns"):
                        walk(sub)
    walk(jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("kname", KERNELS)
def test_precision_reaches_every_matmul(kname):
    p = rand_problem(1, 1, 2, 9, 4, 3, seed=0)
    args = [jnp.asarray(x, jnp.float32) for x in (p.q, p.k, p.v, p.log_alpha, p.h0)]
    fn, kw, _ = _kernel(kname, 4)
    f = lambda *a: fn(*a, precision="highest", return_final_state=True, **kw)  # noqa: E731

    def fwd_bwd(*a):
        out, pull = jax.vjp(f, *a)
        return pull(out)

    precs = _dot_precisions(jax.make_jaxpr(fwd_bwd)(*args))
    assert len(precs) >= 4
    want = jax.lax.Precision.HIGHEST
    assert all(pr is not None and all(x == want for x in (pr if isinstance(pr, tuple) else (pr,)))
               for pr in precs), precs


def test_bad_inputs_name_the_argument():
    q = jnp.zeros((1, 1, 5, 4))
    v = jnp.zeros((1, 2, 5, 3))
    la = jnp.zeros((1, 2, 5))
    h0 = jnp.zeros((1, 2, 4, 3))
    for fn in (kernels.chunked, kernels.scan):
        with pytest.raises(ValueError, match=r"^k: got shape \(1, 1, 6, 4\)"):
            fn(q, jnp.zeros((1, 1, 6, 4)), v, la, h0)
        with pytest.raises(ValueError, match=r"^v: got H=3 heads, expected a multiple of q's G=2"):
            fn(jnp.zeros((1, 2, 5, 4)), jnp.zeros((1, 2, 5, 4)), jnp.zeros((1, 3, 5, 3)),
               jnp.zeros((1, 3, 5)), None)
        with pytest.raises(ValueError, match=r"^log_alpha: got shape \(1, 2, 4\), expected \(1, 2, 5\)"):
            fn(q, q, v, jnp.zeros((1, 2, 4)), h0)
        with pytest.raises(ValueError, match=r"^h0: got shape \(1, 2, 3, 4\)"):
            fn(q, q, v, la, jnp.zeros((1, 2, 3, 4)))
        with pytest.raises(ValueError, match=r"^q: got shape \(1, 5, 4\) \(3 dims\)"):
            fn(jnp.zeros((1, 5, 4)), q, v, la, h0)
        with pytest.raises(TypeError, match=r"^v: got dtype int32"):
            fn(q, q, jnp.zeros((1, 2, 5, 3), jnp.int32), la, h0)
        with pytest.raises(ValueError, match=r"^layout: got 'thd'"):
            fn(q, q, v, la, h0, layout="thd")
        with pytest.raises(ValueError, match=r"^precision: got 'fast'"):
            fn(q, q, v, la, h0, precision="fast")
    with pytest.raises(ValueError, match=r"^chunk_size: got 0"):
        kernels.chunked(q, q, v, la, h0, chunk_size=0)
    with pytest.raises(ValueError, match=r"^checkpoint_every: got 0"):
        kernels.scan(q, q, v, la, h0, checkpoint_every=0)


# ---- the seed grid (issue 4's accuracy target), slow -------------------------------------------



@pytest.mark.slow
@pytest.mark.parametrize("T", [512, 2048, 8192])
@pytest.mark.parametrize("config", list(SEED_CONFIGS))
def test_seed_grid_float32_accuracy(config, T):
    """Both kernels, float32, gates logsigmoid(N(0,1)): every output and gradient within the
    issue-4 target (kernel_seed_grid_float32) of the oracle. scan runs with checkpoint_every=64
    (same arithmetic as plain autodiff, which would need up to 32 GiB of residuals here)."""
    from glaref.regimes import make_inputs
    B, G, H, dk, dv = SEED_CONFIGS[config]
    p = rounded(make_inputs("standard", Dims(B, G, H, T, dk, dv), seed=0), "float32")
    ref = oracle(p)
    t = tol("kernel_seed_grid_float32")
    for fn, kw in [(kernels.chunked, {"chunk_size": 64}), (kernels.scan, {"checkpoint_every": 64})]:
        got, _ = run_kernel(fn, p, "float32", **kw)
        errs = {n: rel_err(got[n], ref[n]) for n in OUTPUTS}
        assert all(e <= t for e in errs.values()), (fn.__name__, errs)
