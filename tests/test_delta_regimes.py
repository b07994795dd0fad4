"""glaref.delta.regimes: reproducible, and each regime draws what its docstring promises."""

from __future__ import annotations

import numpy as np
import pytest

from glaref._inputs import Dims
from glaref.delta import regimes

DIMS = Dims(1, 2, 4, 40, 6, 5)


@pytest.mark.parametrize("name", list(regimes.REGIMES))
@pytest.mark.parametrize("gate", ["scalar", "vector"])
def test_reproducible_and_shaped(name, gate):
    for dims in regimes.get(name).cases(DIMS):
        a = regimes.make_inputs(name, dims, 3, gate=gate)
        b = regimes.make_inputs(name, dims, 3, gate=gate)
        c = regimes.make_inputs(name, dims, 4, gate=gate)
        for x, y in zip((*a.p[:7], a.beta), (*b.p[:7], b.beta)):
            np.testing.assert_array_equal(x, y)
        if dims.T:
            assert not np.array_equal(a.p.v, c.p.v)
        assert a.beta.shape == (dims.B, dims.H, dims.T)
        gshape = (dims.B, dims.H, dims.T) + ((dims.dk,) if gate == "vector" else ())
        assert a.p.log_alpha.shape == gshape
        assert a.p.q.shape == (dims.B, dims.G, dims.T, dims.dk)


def _p(name, **kw):
    return regimes.make_inputs(name, DIMS, 0, **kw)


def test_promised_statistics():
    assert np.all((_p("standard").beta > 0) & (_p("standard").beta < 1))
    np.testing.assert_allclose(np.linalg.norm(_p("standard").p.k, axis=-1), 1.0, rtol=1e-14)
    b0 = _p("beta_near_zero").beta
    assert b0.min() >= 0.5e-4 and b0.max() <= 1.5e-4
    b1 = _p("beta_near_one").beta
    assert b1.min() >= 1 - 1e-4 and b1.max() <= 1.0
    b2 = _p("beta_two").beta
    assert b2.min() >= 1.5 and b2.max() <= 2.0
    assert not _p("gate_one").p.log_alpha.any()
    assert _p("strong_decay").p.log_alpha.min() < -10
    pos = _p("positive").p.log_alpha
    assert pos.min() >= 0 and pos.max() <= 4.0 / DIMS.T
    assert np.abs(_p("h0_dominant").p.h0).max() > 1e3
    norms = np.linalg.norm(_p("unnormalised").p.k, axis=-1)
    assert norms.std() > 0.1
    assert [d.T for d in regimes.get("ragged").cases(DIMS)] == list(regimes.RAGGED_T)
    assert regimes.get("grouped").cases(DIMS)[0].G == 1
    (long,) = regimes.get("near_one_long").cases(DIMS)
    assert long.T == regimes.LONG_T and long.dk <= regimes.LONG_MAX_D


def test_converged_residual_is_tiny():
    """v_t - S~_t^T k_t ~ 1e-6 at the first step (S~_1 = h0 = W, alpha = 1)."""
    dp = _p("converged")
    p = dp.p
    kh = np.repeat(p.k, DIMS.H // DIMS.G, axis=1)
    S1 = np.exp(p.log_alpha[:, :, 0, None, None]) * p.h0
    r = p.v[:, :, 0] - np.einsum("bhkv,bhk->bhv", S1, kh[:, :, 0])
    assert np.abs(r).max() < 1e-5 * np.abs(p.v[:, :, 0]).max()
    assert not p.log_alpha.any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="regime: got 'nope'"):
        regimes.make_inputs("nope", DIMS)
    with pytest.raises(ValueError, match="gate: got 'x'"):
        regimes.make_inputs("standard", DIMS, gate="x")
    with pytest.raises(ValueError, match="seed: got -1"):
        regimes.make_inputs("standard", DIMS, -1)
