"""The gated delta rule's same-precision reference kernels (glaref.delta._baseline), held to the
float64 oracle from outside.

Run in float64, every reference kernel is an exact algorithm of the recurrence, so it must equal
the oracle (``glaref.delta._oracle.backend("numba")``, a different evaluation: the step-by-step
adjoint of docs/math_delta.md section 2 in another summation order) to float64 roundoff, on the
shapes where kernels go wrong: G < H, dk != dv, T not a multiple of the chunk, random h0 and
dh_T, scalar and vector gates, beta up to 2, packed sequences. Run in float32, it must *make*
float32's rounding errors (above the float32/float64 separator: no secret float64) of a correct
design's size on the standard regime. Results are the same bytes twice and on 1 or 2 threads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

from glaref._audit._metrics import rel_err
from glaref._inputs import Dims
from glaref.delta import _baseline, _designs, regimes
from glaref.delta._oracle import OUTPUTS, DeltaProblem, backend
from glaref.tolerances import tol

SCALE = 0.7
DIMS = Dims(B=1, G=2, H=4, T=70, dk=8, dv=6)      # G < H, dk != dv
# (kernel, chunk): the scan, and the chunked form at two chunk sizes (T = 70: four chunks of 16
# and a tail of 6; one chunk of 64 and a tail of 6)
REFS = [("scan", 1), ("chunked", 16), ("chunked", 64)]
PACKED = [0, 0, 17, 17, 50, 70]   # empty first and middle sequences, lengths across chunk bounds


def _oracle(dp: DeltaProblem) -> dict[str, np.ndarray]:
    p, be = dp.p, backend("numba")
    o, h_T = be.forward(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, SCALE,
                        cu_seqlens=p.cu_seqlens)
    g = be.vjp(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, p.do, p.dh_T, SCALE,
               cu_seqlens=p.cu_seqlens)
    return dict(zip(OUTPUTS, (o, h_T, *g)))


def _rounded(dp: DeltaProblem) -> DeltaProblem:
    """The problem with every array rounded to float32 (what a float32 kernel is given)."""
    r = lambda x: None if x is None else x.astype(np.float32).astype(np.float64)  # noqa: E731
    p = dp.p
    return DeltaProblem(p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha),
                                   h0=r(p.h0), do=r(p.do), dh_T=r(p.dh_T)), r(dp.beta))


def _beta_two(dp: DeltaProblem) -> DeltaProblem:
    """beta spread over (0, 2) (flash-linear-attention's allow_neg_eigval)."""
    rng = np.random.default_rng(7)
    return dp._replace(beta=2.0 * rng.uniform(size=dp.beta.shape))


def _packed(gate: str) -> DeltaProblem:
    d = dataclasses.replace(DIMS, B=1)
    dp = regimes.make_inputs("standard", d, 3, gate=gate)
    rng = np.random.default_rng(11)
    N = len(PACKED) - 1
    h0 = rng.standard_normal((N, d.H, d.dk, d.dv))
    dh_T = rng.standard_normal((N, d.H, d.dk, d.dv))
    p = dp.p._replace(h0=h0, dh_T=dh_T, cu_seqlens=np.array(PACKED, dtype=np.int64))
    return DeltaProblem(p, dp.beta)


def _cases():
    for gate in ("scalar", "vector"):
        yield f"{gate}", regimes.make_inputs("standard", DIMS, 0, gate=gate)
        yield f"{gate}_beta2", _beta_two(regimes.make_inputs("standard", DIMS, 1, gate=gate))
        yield f"{gate}_packed", _packed(gate)
    # no dh_T: the loss has no h_T term
    dp = regimes.make_inputs("standard", DIMS, 2)
    yield "scalar_no_dh_T", dp._replace(p=dp.p._replace(dh_T=None))


CASES = list(_cases())


def _designs_of(kernel: str) -> list[dict]:
    """The keywords of each design of ``kernel``: the scan in each summation order, the chunked
    form with each decay form."""
    if kernel == "scan":
        return [{"order": order} for order in _baseline.ORDERS]
    return [{"decay": decay} for decay in _baseline.DECAY_FORMS]


@pytest.mark.parametrize("kernel,chunk", REFS, ids=[f"{k}{c}" for k, c in REFS])
@pytest.mark.parametrize("name,dp", CASES, ids=[c[0] for c in CASES])
def test_float64_equals_the_oracle(kernel, chunk, name, dp):
    ref = _oracle(dp)
    for kw in _designs_of(kernel):
        res = _baseline.run(kernel, dp, SCALE, arith="float64", chunk=chunk, **kw)
        assert set(res) == set(OUTPUTS)
        for n in OUTPUTS:
            assert res[n].shape == ref[n].shape and res[n].dtype == np.float64, (name, n)
            assert rel_err(res[n], ref[n]) <= tol("delta_baseline_f64"), (name, kw, n)


@pytest.mark.parametrize("gate", ("scalar", "vector"))
@pytest.mark.parametrize("kernel,chunk", REFS, ids=[f"{k}{c}" for k, c in REFS])
def test_float32_makes_float32_errors(kernel, chunk, gate):
    dp = _rounded(regimes.make_inputs("standard", DIMS, 4, gate=gate))
    ref = _oracle(dp)
    for kw in _designs_of(kernel):
        res = _baseline.run(kernel, dp, SCALE, arith="float32", chunk=chunk, **kw)
        for n in OUTPUTS:
            e = rel_err(res[n], ref[n])
            assert tol("arith_separator_f32_f64") < e <= tol("delta_baseline_f32_standard"), (
                kw, n, e)
    res = _baseline.run(kernel, dp, SCALE, arith="float32", chunk=chunk)
    # bfloat16 operands: bfloat16's errors, not float32's
    res = _baseline.run(kernel, dp, SCALE, arith="float32", operand="bfloat16", chunk=chunk)
    for n in OUTPUTS:
        assert rel_err(res[n], ref[n]) > tol("arith_separator_tf32_f32"), n


def _bytes(res):
    return {n: res[n].tobytes() for n in res}


@pytest.mark.parametrize("kernel,chunk", REFS, ids=[f"{k}{c}" for k, c in REFS])
def test_same_bytes_twice_and_on_one_or_two_threads(kernel, chunk):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    dp = regimes.make_inputs("standard", Dims(B=2, G=1, H=2, T=40, dk=8, dv=4), 5,
                             gate="vector")
    before = numba.get_num_threads()
    runs = []
    try:
        for n_threads in (1, 2, 2):
            numba.set_num_threads(n_threads)
            runs.append([_bytes(_baseline.run(kernel, dp, SCALE, chunk=chunk, **kw))
                         for kw in _designs_of(kernel)])
    finally:
        numba.set_num_threads(before)
    assert runs[0] == runs[1] == runs[2]


def test_the_designs_round_differently():
    """The scan in its two orders, the chunked form at 16 and 64 and the two decay forms are
    different float32 algorithms (none silently runs another's code): their o and dlog_alpha
    differ in the last bits, while each stays a float32-sized distance from the others."""
    dp = _rounded(regimes.make_inputs("standard", DIMS, 6))
    runs = {f"scan {order}": _baseline.run("scan", dp, SCALE, order=order)
            for order in _baseline.ORDERS}
    for C in (16, 64):
        for decay in _baseline.DECAY_FORMS:
            runs[f"chunked{C} {decay}"] = _baseline.run("chunked", dp, SCALE, chunk=C, decay=decay)
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for n in ("o", "log_alpha"):
                e = rel_err(runs[a][n], runs[b][n])
                assert 0 < e <= 2 * tol("delta_baseline_f32_standard"), (a, b, n, e)


def test_empty_sequence_hands_h0_through():
    dp = regimes.make_inputs("standard", dataclasses.replace(DIMS, T=0), 0)
    for kernel, chunk in REFS:
        res = _baseline.run(kernel, dp, SCALE, chunk=chunk)
        np.testing.assert_array_equal(res["h_T"], dp.p.h0.astype(np.float32))
        np.testing.assert_array_equal(res["h0"], dp.p.dh_T.astype(np.float32))
        assert res["o"].shape == (1, 4, 0, 6) and res["beta"].shape == (1, 4, 0)


@pytest.mark.parametrize("kw,arg", [
    ({"kernel": "chunk"}, "kernel"), ({"arith": "float16"}, "arith"),
    ({"operand": "fp8"}, "operand"), ({"decay": "cumsum"}, "decay"), ({"chunk": 0}, "chunk"),
    ({"storage": "bfloat16"}, "storage"), ({"order": "pairwise"}, "order"),
    ({"kernel": "chunked", "order": "lanes"}, "order"),
])
def test_bad_arguments_name_themselves(kw, arg):
    dp = regimes.make_inputs("standard", dataclasses.replace(DIMS, T=3), 0)
    kernel = kw.pop("kernel", "scan")
    with pytest.raises(ValueError, match=arg):
        _baseline.run(kernel, dp, SCALE, **kw)


def test_gradients_need_do():
    dp = regimes.make_inputs("standard", dataclasses.replace(DIMS, T=3), 0)
    dp = dp._replace(p=dp.p._replace(do=None))
    with pytest.raises(ValueError, match="do"):
        _baseline.run("scan", dp, SCALE)
    assert set(_baseline.run("scan", dp, SCALE, grads=False)) == {"o", "h_T"}


@pytest.mark.parametrize("m", [5, 8, 21, 128])
def test_the_scans_column_sums_are_dot_products_to_the_bit(m):
    """The scan forms x^T M column by column along M's rows (``_vT_M``), each column summed
    exactly as ``glaref.gla._baseline_scan.dot`` sums it in the same order (lanes 0, sequential 1):
    the scalar family's orders, to the last bit; the two orders differ once m has a full lane."""
    from glaref.delta._baseline_numba import _vT_M
    from glaref.gla._baseline_scan import dot

    rng = np.random.default_rng(m)
    x = rng.standard_normal(m).astype(np.float32)
    M = rng.standard_normal((m, 7)).astype(np.float32) * np.float32(1e3) ** rng.uniform(
        -1, 1, (m, 1)).astype(np.float32)
    acc = np.empty(9, np.float32)
    got = {}
    for order in (0, 1):
        out = np.empty(7, np.float32)
        _vT_M(x, M, out, np.empty((9, 7), np.float32), order)
        want = np.array([dot(x, np.ascontiguousarray(M[:, j]), acc, order) for j in range(7)],
                        dtype=np.float32)
        assert out.tobytes() == want.tobytes(), order
        got[order] = out
    assert (got[0].tobytes() != got[1].tobytes()) == (m >= 8)


def test_the_lane_order_is_the_more_accurate_scan():
    """At dk = dv = 128 the term-by-term scan's dlog_alpha sums the dk dv terms of
    <S~_t, dS~_t> one after another and errs several times the lane order's (measured ~10x,
    docs/reports/sensitivity_delta_seed512_cpu.txt); o's dot products over dk likewise."""
    dp = _rounded(regimes.make_inputs("standard", Dims(B=1, G=1, H=1, T=24, dk=128, dv=128),
                                      0))
    ref = _oracle(dp)
    err = {order: _baseline.run("scan", dp, SCALE, order=order) for order in _baseline.ORDERS}
    for n in ("o", "log_alpha"):
        lanes, seq = (rel_err(err[order][n], ref[n]) for order in ("lanes", "sequential"))
        assert lanes < seq, (n, lanes, seq)


@pytest.mark.parametrize("chunk_size,decay_form", [
    (1, None), (16, None), (64, "segment_sums"), (64, "chunk_cumsum"), (None, None)])
def test_every_design_of_the_yardstick_runs(chunk_size, decay_form):
    """Each role a claim calls for runs through ``run`` as the engine calls it, the held-to role
    is among the designs, and a chunked claim's designs are chunked at its own chunk size."""
    stick = _designs.yardstick(chunk_size, decay_form)
    assert stick.held_to in stick.designs
    assert set(stick.extremes) | set(stick.field) <= set(stick.designs)
    dp = regimes.make_inputs("standard", dataclasses.replace(DIMS, T=20), 0)
    for role, d in stick.designs.items():
        if chunk_size not in (None, 1):
            assert d.kernel == "chunked" and d.chunk == chunk_size, role
        res = _baseline.run(d.kernel, dp, SCALE, chunk=d.chunk or _baseline.CHUNK,
                            decay=d.decay, order=d.order)
        assert set(res) == set(OUTPUTS)
    scans = {r: d.order for r, d in stick.designs.items() if d.kernel == "scan"}
    if chunk_size == 1:
        assert stick.designs[stick.held_to].kernel == "scan"
        assert stick.designs[stick.held_to].order is None          # the scan's own: lanes
    if chunk_size is None:
        assert stick.designs[stick.held_to].chunk == _baseline.CHUNK
        assert [stick.designs[r].kernel for r in stick.extremes] == ["scan"]
        assert stick.designs[stick.extremes[0]].order is None
    if chunk_size in (None, 1):
        # the term-by-term scan widens the envelope only
        assert {r for r, o in scans.items() if o == "sequential"} == {"scan_sequential"}
        assert "scan_sequential" in stick.field and "scan_sequential" not in stick.extremes


_CHILD = r"""
import hashlib, json
import numpy as np
from glaref._inputs import Dims
from glaref.delta import _baseline, regimes

rng = np.random.default_rng(0)
a = rng.standard_normal((64, 128)).astype(np.float32)
b = rng.standard_normal((128, 48)).astype(np.float32)
out = {"np.matmul": hashlib.sha256((a @ b).tobytes()).hexdigest()}
for gate in ("scalar", "vector"):
    dp = regimes.make_inputs("strong_decay", Dims(1, 1, 2, 70, 24, 20), 0, gate=gate)
    for kernel, decay, order in (("scan", "segment_sums", "lanes"),
                                 ("scan", "segment_sums", "sequential"),
                                 ("chunked", "segment_sums", None),
                                 ("chunked", "chunk_cumsum", None)):
        for operand in (None, "bfloat16"):
            r = _baseline.run(kernel, dp, 0.3, chunk=32, decay=decay, operand=operand,
                              order=order)
            h = hashlib.sha256()
            for name in sorted(r):
                h.update(name.encode() + r[name].tobytes())
            out[f"{gate} {kernel} {decay} {order} {operand}"] = h.hexdigest()
print(json.dumps(out))
"""


@pytest.mark.slow        # two subprocesses loading (or compiling) the reference kernels
@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"),
                    reason="OPENBLAS_CORETYPE names x86-64 kernels")
def test_the_same_bytes_under_every_blas_kernel():
    """No BLAS: the same bytes whichever OpenBLAS kernel a machine picks (Haswell, Prescott),
    where np.matmul itself differs (else the machine cannot show the dependence: skip)."""
    runs = {}
    for coretype in ("Haswell", "Prescott"):
        env = dict(os.environ, OPENBLAS_CORETYPE=coretype, OPENBLAS_VERBOSE="0")
        res = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                             env=env, timeout=900)
        assert res.returncode == 0, res.stderr[-2000:]
        runs[coretype] = json.loads(res.stdout.strip().splitlines()[-1])
    ours = [k for k in runs["Haswell"] if k != "np.matmul"]
    assert [k for k in ours if runs["Haswell"][k] != runs["Prescott"][k]] == []
    if runs["Haswell"]["np.matmul"] == runs["Prescott"]["np.matmul"]:
        pytest.skip("np.matmul float32 gives the same bytes under both coretypes here")
