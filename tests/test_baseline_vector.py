"""The same-precision reference kernels (glaref.gla._baseline) on vector gates and packed sequences.

Each new path is held to the float64 oracle on the same (float32-rounded) inputs, from outside:
every output within the proven worst-case bound of a correct kernel of its structure
(``_verdict.budget_bound``: chunked at C, the scan at C = 1, with the problem presented to the
bound by ``_verdict.budget_view``), and with an error of the size its arithmetic makes: float32
sized when run in float32 (never float64's), float64 sized when run in float64, TF32 sized when
its matmul operands are rounded to TF32. Packed sequences equal the sequences run one by one, to
the last bit, and an empty sequence hands h0 (and dh_T) through unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

import glaref
from glaref import regimes
from glaref._audit import _metrics, _verdict
from glaref._audit._metrics import rel_err
from glaref._inputs import ARRAYS, OUTPUTS, Dims
from glaref.gla import _baseline, _budget
from glaref.tolerances import tol

CHUNK = 32                       # three chunks and a tail at T = 70 / 130
SCALE = 0.7
# sizes: G < H (group sums), dk != dv, T not a multiple of CHUNK
DIMS = Dims(1, 2, 4, 70, 8, 6)
REGIMES = ("standard", "strong_decay", "near_one", "positive", "mixed_dims")
PACKED = [0, 0, 17, 17, 50, 70]  # empty first and middle sequences, lengths across chunk boundaries


def _rounded(p, dtype=np.float32):
    r = lambda x: None if x is None else np.asarray(x).astype(dtype).astype(np.float64)  # noqa: E731
    return p._replace(**{n: r(getattr(p, n)) for n in ARRAYS})


def _problem(regime: str, dims: Dims = DIMS, gate: str = "vector", cu=None):
    return _rounded(regimes.make_inputs(regime, dims, 0, gate=gate, cu_seqlens=cu))


def _oracle(p) -> dict[str, np.ndarray]:
    o, h_T = glaref.forward(p.q, p.k, p.v, p.log_alpha, p.h0, scale=SCALE, cu_seqlens=p.cu_seqlens)
    g = glaref.vjp(p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T, scale=SCALE,
                   cu_seqlens=p.cu_seqlens)
    return dict(zip(OUTPUTS, (o, h_T) + tuple(g)))


def _within_bound(kernel: str, p, res, ref, arith: str, operand: str | None = None) -> dict:
    """{output: (budget_ulps, bound)} of a reference kernel's results; dlog_alpha against the scale
    of the form the kernel uses (the scan: direct; chunked: the identity)."""
    scales = _budget.problem_scales(p, SCALE)
    dims, la = _verdict.budget_view(p)
    chunk = 1 if kernel == "scan" else CHUNK
    cdtype, acc = (operand, "float32") if operand else (arith, None)
    out = {}
    for n in OUTPUTS:
        sc = scales["log_alpha_identity" if n == "log_alpha" and kernel == "chunked" else n]
        ulps = _metrics.budget_ulps(n, res[n], ref[n], sc, cdtype, dims)[0]
        out[n] = (ulps, _verdict.budget_bound(n, cdtype, dims, chunk, log_alpha=la,
                                              accumulate_dtype=acc))
    return out


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("kernel", _baseline.KERNELS)
def test_vector_gates_against_the_oracle_in_float32_and_float64(kernel, regime):
    p = _problem(regime)
    assert p.vector_gate
    ref = _oracle(p)
    sep = tol("arith_separator_f32_f64")
    for arith in ("float32", "float64"):
        res = _baseline.run(kernel, p, SCALE, arith=arith, chunk=CHUNK)
        assert {n: res[n].shape for n in OUTPUTS} == {n: ref[n].shape for n in OUTPUTS}
        for n, (ulps, bound) in _within_bound(kernel, p, res, ref, arith).items():
            assert ulps <= bound, (kernel, regime, arith, n, ulps, bound)
        errs = {n: rel_err(res[n], ref[n]) for n in OUTPUTS}
        if arith == "float32":      # float32's rounding errors, made (not float64's)
            assert all(e > sep for e in errs.values()), (kernel, regime, errs)
        else:                       # float64 arithmetic: float64 rounding only
            assert all(e < sep for e in errs.values()), (kernel, regime, errs)


@pytest.mark.parametrize("operand", ["tf32", "bfloat16"])
@pytest.mark.parametrize("kernel", _baseline.KERNELS)
def test_vector_gates_with_rounded_matmul_operands(kernel, operand):
    # operands rounded to a 10- or 7-bit mantissa, accumulation in float32: within the bound of a
    # kernel of that compute dtype accumulating in float32, and with that format's error size
    p = _problem("standard")
    ref = _oracle(p)
    res = _baseline.run(kernel, p, SCALE, arith="float32", operand=operand, chunk=CHUNK)
    for n, (ulps, bound) in _within_bound(kernel, p, res, ref, "float32", operand).items():
        assert ulps <= bound, (kernel, operand, n, ulps, bound)
    # every output but the scan's h_T passes through a matrix product (the scan's state update is
    # an elementwise k^T v, as in a step-by-step kernel: float32 throughout)
    through_matmul = [n for n in OUTPUTS if not (kernel == "scan" and n == "h_T")]
    errs = {n: rel_err(res[n], ref[n]) for n in through_matmul}
    assert all(e > tol("arith_separator_tf32_f32") for e in errs.values()), (kernel, operand, errs)


@pytest.mark.parametrize("gate", ["scalar", "vector"])
@pytest.mark.parametrize("kernel", _baseline.KERNELS)
def test_packed_against_the_oracle(kernel, gate):
    p = _problem("standard", replace_T(DIMS, PACKED[-1]), gate=gate, cu=PACKED)
    assert p.n_states == len(PACKED) - 1
    ref = _oracle(p)
    res = _baseline.run(kernel, p, SCALE, arith="float32", chunk=CHUNK)
    assert res["h_T"].shape == res["h0"].shape == p.h0.shape
    for n, (ulps, bound) in _within_bound(kernel, p, res, ref, "float32").items():
        assert ulps <= bound, (kernel, gate, n, ulps, bound)


def replace_T(dims: Dims, T: int) -> Dims:
    return Dims(1, dims.G, dims.H, T, dims.dk, dims.dv)


def _sequence(p, n: int, t0: int, t1: int):
    """Sequence n of a packed problem as an unpacked problem of its own (B = 1)."""
    cut = lambda x: x[:, :, t0:t1]   # noqa: E731
    return p._replace(q=cut(p.q), k=cut(p.k), v=cut(p.v), log_alpha=cut(p.log_alpha),
                      h0=p.h0[n:n + 1], do=cut(p.do), dh_T=None if p.dh_T is None else p.dh_T[n:n + 1],
                      dims=replace_T(p.dims, t1 - t0), cu_seqlens=None)


@pytest.mark.parametrize("with_dh_T", [True, False])
@pytest.mark.parametrize("gate", ["scalar", "vector"])
@pytest.mark.parametrize("kernel", _baseline.KERNELS)
def test_packed_equals_one_by_one_to_the_last_bit(kernel, gate, with_dh_T):
    p = _problem("strong_decay", replace_T(DIMS, PACKED[-1]), gate=gate, cu=PACKED)
    if not with_dh_T:
        p = p._replace(dh_T=None)
    for arith in ("float32", "float64"):
        packed = _baseline.run(kernel, p, SCALE, arith=arith, chunk=CHUNK)
        for n, (t0, t1) in enumerate(zip(PACKED[:-1], PACKED[1:])):
            one = _baseline.run(kernel, _sequence(p, n, t0, t1), SCALE, arith=arith, chunk=CHUNK)
            for name in ("o", "q", "k", "v", "log_alpha"):
                assert np.array_equal(packed[name][:, :, t0:t1], one[name]), (kernel, gate, n, name)
            for name in ("h_T", "h0"):
                assert np.array_equal(packed[name][n:n + 1], one[name]), (kernel, gate, n, name)
            if t0 == t1:        # an empty sequence hands its state and cotangent through
                assert np.array_equal(packed["h_T"][n], p.h0[n])
                dh0 = p.dh_T[n] if with_dh_T else np.zeros_like(p.h0[n])
                assert np.array_equal(packed["h0"][n], dh0)


def test_packed_sequences_do_not_see_each_other():
    # the same sequence packed after different neighbours gives the same bits
    p = _problem("standard", replace_T(DIMS, 40), cu=[0, 15, 40])
    q = p._replace(v=np.concatenate([-3.0 * p.v[:, :, :15], p.v[:, :, 15:]], axis=2),
                   h0=np.stack([p.h0[0] * 2.0, p.h0[1]]))
    for kernel in _baseline.KERNELS:
        a = _baseline.run(kernel, p, SCALE, chunk=CHUNK)
        b = _baseline.run(kernel, q, SCALE, chunk=CHUNK)
        assert np.array_equal(a["o"][:, :, 15:], b["o"][:, :, 15:])
        assert np.array_equal(a["h_T"][1], b["h_T"][1])
        assert not np.array_equal(a["o"][:, :, :15], b["o"][:, :, :15])


@pytest.mark.parametrize("gate, regime", [("scalar", "standard"), ("scalar", "strong_decay"),
                                          ("vector", "standard"), ("vector", "strong_decay"),
                                          ("vector", "mixed_dims")])
def test_direct_form_dlog_alpha_of_the_chunked_reference(gate, regime):
    """``log_alpha_direct``: the chunk-local identity with its cancelling pairs removed. It is the
    same function (float64 arithmetic: float64 rounding only; packed: the same per sequence), a
    correct kernel's in float32 (within the proven bound on the direct form's scale), and it
    does not cancel: under strong decay it errs less than the identity. The scan's dlog_alpha
    is its own direct form."""
    p = _problem(regime, gate=gate)
    ref = _oracle(p)["log_alpha"]
    sep = tol("arith_separator_f32_f64")
    r64 = _baseline.run("chunked", p, SCALE, arith="float64", chunk=CHUNK)
    assert rel_err(r64["log_alpha_direct"], ref) < sep
    r32 = _baseline.run("chunked", p, SCALE, arith="float32", chunk=CHUNK)
    scales = _budget.problem_scales(p, SCALE)
    dims, la = _verdict.budget_view(p)
    ulps = _metrics.budget_ulps("log_alpha", r32["log_alpha_direct"], ref, scales["log_alpha"],
                               "float32", dims)[0]
    assert ulps <= _verdict.budget_bound("log_alpha", "float32", dims, CHUNK, log_alpha=la)
    direct, identity = rel_err(r32["log_alpha_direct"], ref), rel_err(r32["log_alpha"], ref)
    assert direct > sep                     # float32's rounding errors, made
    if regime == "strong_decay":
        assert direct < identity, (gate, direct, identity)
    scan = _baseline.run("scan", p, SCALE, arith="float32")
    assert np.array_equal(scan["log_alpha_direct"], scan["log_alpha"])
    packed = _problem(regime, replace_T(DIMS, PACKED[-1]), gate=gate, cu=PACKED)
    whole = _baseline.run("chunked", packed, SCALE, arith="float32", chunk=CHUNK)
    for n, (t0, t1) in enumerate(zip(PACKED[:-1], PACKED[1:])):
        one = _baseline.run("chunked", _sequence(packed, n, t0, t1), SCALE, arith="float32",
                            chunk=CHUNK)
        assert np.array_equal(whole["log_alpha_direct"][:, :, t0:t1], one["log_alpha_direct"])
