"""glaref.conventions.mamba2 against an independent float64 implementation of Mamba2's SSD.

The independent side is written here from the semantics of mamba_ssm's ``ssd_minimal_discrete``
and ``ssd_chunk_scan_combined_ref`` (one chunk: the quadratic "segsum" form, no recurrence; every
decay exp(a_{s+1} + ... + a_t) from a masked cumsum, as its stable ``segsum``), in float64
torch, with dt' = softplus(dt + dt_bias), y = (C S + D x) * silu(z), the state
[headdim, dstate], and every gradient (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states) by
torch.autograd. Errors are measured element by element in units of ``ssd_scales`` (each result's
sum of |terms|), which is itself checked against the independent form run on absolute values
wherever that form is a sum of positive terms.
"""

from __future__ import annotations

import numpy as np
import pytest

from glaref import ShapeError
from glaref.conventions import mamba2
from glaref.tolerances import tol

from conftest import assert_scaled

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'glaref[torch]')")
F = torch.nn.functional

# the tolerance's derivation assumes these limits (glaref/tolerances.py)
MAX_T, MAX_D, MAX_BT, MAX_LOG_DECAY = 16, 8, 32, 6.0
GRADS = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dinitial_states")


def segsum(a):
    """seg[..., t, s] = a_{s+1} + ... + a_t for s <= t (0 on the diagonal), each entry summed from
    the a_j it contains (a masked cumsum, as mamba_ssm's stable ``segsum``), not as a difference
    of two cumulative sums: its gradient then adds, for every a_j, only the terms that contain it
    (a difference of cumulative sums would give the reverse-cumsum form, which cancels)."""
    T = a.shape[-1]
    strict = torch.ones(T, T, dtype=torch.bool).tril(-1)             # j > s
    rep = torch.where(strict, a[..., :, None].expand(*a.shape, T), torch.zeros((), dtype=a.dtype))
    return torch.cumsum(rep, dim=-2)                                 # over j <= t


def ssd_segsum(x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states):
    """Mamba2's SSD in its quadratic form over the whole sequence (a single chunk)."""
    b, T, h, P = x.shape
    G = B.shape[2]
    dtp = dt if dt_bias is None else dt + dt_bias
    if dt_softplus:
        dtp = torch.logaddexp(dtp, torch.zeros_like(dtp))      # exact softplus
    Bh, Ch = (y.repeat_interleave(h // G, dim=2) for y in (B, C))   # head h reads group h // (h/G)
    # a virtual step 0 with log decay 0 carries the initial state: row t+1, column 0
    seg = segsum(F.pad((A * dtp).transpose(1, 2), (1, 0)))          # [b, h, T+1, T+1]
    causal = torch.ones(T + 1, T + 1, dtype=torch.bool).tril()
    decay = torch.where(causal, torch.exp(torch.where(causal, seg, torch.zeros_like(seg))),
                        torch.zeros_like(seg))
    L = decay[..., 1:, 1:]                                           # exp(c_t - c_s), s <= t
    X = x * dtp[..., None]
    scores = torch.einsum("bthn,bshn->bhts", Ch, Bh) * L
    y = torch.einsum("bhts,bshp->bthp", scores, X)
    final = torch.einsum("bshn,bhs,bshp->bhpn", Bh, L[..., -1, :], X)
    if initial_states is not None:
        y = y + torch.einsum("bthn,bhpn,bht->bthp", Ch, initial_states, decay[..., 1:, 0])
        final = final + decay[..., -1, 0][..., None, None] * initial_states
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * (z * torch.sigmoid(z))
    return y, final


def segsum_results(c, dt_softplus, absolute=False):
    """y, final_states and every gradient of the segsum form, float64 numpy, under Mamba2's names.
    absolute: run on |x|, |B|, |C|, |D|, |initial_states|, |dy|, |dfinal_states|."""
    f = (lambda t: t.abs()) if absolute else (lambda t: t)
    leaves = {n: (None if c[n] is None else f(c[n].detach()).clone().requires_grad_(True))
              if n not in ("dt", "A", "dt_bias", "z") else
              (None if c[n] is None else c[n].detach().clone().requires_grad_(True))
              for n in mamba2.INPUT_NAMES}
    y, final = ssd_segsum(**leaves, dt_softplus=dt_softplus)
    loss = 0.0
    if c["dy"] is not None:
        loss = loss + (y * f(c["dy"].detach())).sum()
    if c["dfinal_states"] is not None:
        loss = loss + (final * f(c["dfinal_states"].detach())).sum()
    if c["dy"] is not None or c["dfinal_states"] is not None:
        loss.backward()
    out = {"y": y, "final_states": final}
    grads = c["dy"] is not None or c["dfinal_states"] is not None
    for n, t in leaves.items():
        # an input the loss does not reach (C when only dfinal_states is given) has gradient 0
        out[f"d{n}"] = (None if t is None or not grads else
                        t.grad if t.grad is not None else torch.zeros_like(t))
    return {n: (None if t is None else t.detach().numpy()) for n, t in out.items()}


def make(batch, seqlen, nheads, headdim, ngroups, dstate, *, seed=0, regime="standard",
         D="head", z=True, dt_bias=True, dt_softplus=True, h0=True, dy=True, dfinal=True):
    assert seqlen <= MAX_T and max(headdim, dstate) <= MAX_D and batch * seqlen <= MAX_BT
    c = mamba2.ssd_case(batch, seqlen, nheads, headdim, ngroups, dstate, dtype="float64",
                        seed=seed, regime=regime,
                        drawn=mamba2.SSDCase(D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus))
    if not h0:
        c["initial_states"] = None
    if not dy:
        c["dy"] = None
    if not dfinal:
        c["dfinal_states"] = None
    return c


def call(fn, c, **kw):
    return fn(**{n: c[n] for n in mamba2.INPUT_NAMES}, dt_softplus=c["dt_softplus"],
              cotangents=(c["dy"], c["dfinal_states"]), **kw)


def compare(c, impl="numba"):
    """max |convention - segsum| / scale per result; each asserted within the tolerance."""
    dtp = mamba2._prepare(*(c[n] for n in mamba2.INPUT_NAMES[:8]), c["dt_softplus"], None, None,
                          None)
    assert np.abs(dtp["log_alpha"]).max() <= MAX_LOG_DECAY
    got = call(mamba2.ssd_reference, c, impl=impl)
    scales = call(mamba2.ssd_scales, c, impl=impl)
    want = segsum_results(c, c["dt_softplus"])
    worst = {}
    for n in ("y", "final_states") + GRADS:
        w = want[n]
        if n == "dinitial_states" and c["initial_states"] is None:
            assert got[n] is not None          # glaref gives the gradient at zeros; skip it
            continue
        if w is None or (n in GRADS and c["dy"] is None and c["dfinal_states"] is None):
            assert got[n] is None, n
            continue
        worst[n] = assert_scaled(got[n], w, scales[n], tol("convention_mamba2_vs_segsum_f64"),
                                 f"mamba2 {n}")
    return worst


CASES = {
    "full": dict(),                                             # D [h], z, dt_bias, softplus
    "channel_D_no_z": dict(D="channel", z=False),
    "bare": dict(D=None, z=False, dt_bias=False, dt_softplus=False),
    "no_h0": dict(h0=False),
    "dy_only": dict(dfinal=False),
    "dfinal_only": dict(dy=False),
    "near_one": dict(regime="near_one"),
}


@pytest.mark.parametrize("name", CASES)
def test_ssd_matches_segsum_form(name):
    worst = compare(make(2, 11, 4, 3, 2, 5, seed=1, **CASES[name]))
    assert {"y", "final_states"} <= set(worst)


@pytest.mark.parametrize("impl", ["numpy", "numba"])
@pytest.mark.parametrize("ngroups", [1, 4])
def test_groups_and_impls(ngroups, impl):
    compare(make(1, 16, 4, 8, ngroups, 6, seed=2), impl=impl)


def test_forward_only():
    c = make(1, 7, 2, 3, 1, 4, seed=3, dy=False, dfinal=False)
    got = call(mamba2.ssd_reference, c)
    assert got["y"] is not None and got["final_states"] is not None
    assert all(got[n] is None for n in GRADS)


def test_scales_are_sums_of_absolute_terms():
    # without z and softplus (and dt' > 0), every result but ddt and dA is a sum of products of
    # the inputs with positive coefficients: the segsum form on absolute values is its scale
    for D in ("head", "channel"):
        c = make(2, 9, 4, 3, 2, 5, seed=4, D=D, z=False, dt_bias=False, dt_softplus=False)
        c["x"], c["B"], c["C"] = -c["x"], c["B"], -c["C"]      # signs of both kinds
        scales = call(mamba2.ssd_scales, c)
        ab = segsum_results(c, False, absolute=True)
        for n in ("y", "final_states", "dx", "dB", "dC", "dD", "dinitial_states"):
            assert_scaled(scales[n], ab[n], ab[n], tol("convention_mamba2_scales"), n)


def test_inputs_are_glaref_problem():
    c = make(2, 5, 4, 3, 2, 6, seed=5)
    m = call(mamba2.ssd_inputs, c)
    assert m["scale"] == 1.0 and m["layout"] == "bhtd" and m["dtype"] == "float64"
    assert m["q"].shape == m["k"].shape == (2, 2, 5, 6)      # (B, G, T, dstate)
    assert m["v"].shape == m["do"].shape == (2, 4, 5, 3)     # (B, H, T, headdim)
    assert m["h0"].shape == m["dh_T"].shape == (2, 4, 6, 3)  # (B, H, dstate, headdim)
    np.testing.assert_array_equal(m["q"], np.swapaxes(c["C"].detach().numpy(), 1, 2))
    np.testing.assert_array_equal(m["h0"], np.swapaxes(c["initial_states"].detach().numpy(), -1, -2))
    x = c["x"].detach().numpy()
    zz = c["z"].detach().numpy()
    np.testing.assert_allclose(m["do"], np.swapaxes(c["dy"].detach().numpy() * zz / (1 + np.exp(-zz)), 1, 2),
                               rtol=tol("convention_mamba2_scales"))
    assert (m["log_alpha"] < 0).all() and m["v"].shape == np.swapaxes(x, 1, 2).shape


def test_from_glaref_equals_reference():
    c = make(1, 6, 2, 3, 1, 4, seed=6)
    import glaref
    m = call(mamba2.ssd_inputs, c)
    core = (m["q"], m["k"], m["v"], m["log_alpha"], m["h0"])
    o, h_T = glaref.forward(*core)
    g = glaref.vjp(*core, m["do"], m["dh_T"])
    res = mamba2.ssd_from_glaref({"o": o, "h_T": h_T, **g._asdict()},
                                 *(c[n] for n in ("x", "dt", "A", "D", "z", "dt_bias")),
                                 dt_softplus=True, dy=c["dy"])
    ref = call(mamba2.ssd_reference, c)
    for n, x in ref.items():
        np.testing.assert_array_equal(res[n], x)


def test_outputs_reads_any_framework():
    c = make(1, 4, 2, 3, 1, 2, seed=7)
    out = mamba2.ssd_outputs(y=c["x"].float(), dA=c["A"], dB=None)
    assert out["dB"] is None and out["dtypes"] == {"y": "float32", "dA": "float64"}
    np.testing.assert_array_equal(out["y"], c["x"].detach().float().double().numpy())


def test_errors_name_the_argument():
    c = make(1, 4, 4, 3, 2, 2, seed=8)
    a = {n: c[n] for n in mamba2.INPUT_NAMES}
    with pytest.raises(ShapeError, match=r"^B: got ngroups=3, expected a divisor of x's nheads=4"):
        mamba2.ssd_inputs(**{**a, "B": torch.zeros(1, 4, 3, 2), "C": torch.zeros(1, 4, 3, 2)})
    with pytest.raises(ShapeError, match=r"^A: got shape \(3,\), expected \(4,\)"):
        mamba2.ssd_inputs(**{**a, "A": torch.zeros(3)})
    with pytest.raises(ShapeError, match=r"^D: got shape \(4, 2\)"):
        mamba2.ssd_inputs(**{**a, "D": torch.zeros(4, 2)})
    with pytest.raises(ShapeError, match=r"^initial_states: got shape \(1, 4, 2, 3\)"):
        mamba2.ssd_inputs(**{**a, "initial_states": torch.zeros(1, 4, 2, 3)})
    with pytest.raises(ValueError, match=r"^regime: got 'zero_gate'"):
        mamba2.ssd_case(1, 4, 2, 3, 1, 2, regime="zero_gate")
