"""glaref.conventions.fla against flash-linear-attention's own definition of simple_gla.

The independent side is written here from FLA's naive recurrent form (``naive_recurrent_simple_gla``:
S_t = exp(g_t + g_gamma) S_{t-1} + k_t^T v_t with the state [K, V], o_t = scale q_t S_t, scale None
meaning K ** -0.5), as a float64 torch loop differentiated by torch.autograd. Every result under
FLA's names (o, ht, dq, dk, dv, dg, dg_gamma, dh0) is compared element by element in units of its
sum of |terms|, which the same loop gives when run on absolute values (decays are positive, so
every term is then positive): the unit of measure comes from the independent side too.
"""

from __future__ import annotations

import numpy as np
import pytest

import glaref
from glaref import ShapeError
from glaref.conventions import LOG_ALPHA_BT_SUM, fla
from glaref.tolerances import tol

from conftest import assert_scaled

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'glaref[torch]')")

# the tolerance's derivation assumes these limits (glaref/tolerances.py)
MAX_T, MAX_D, MAX_LOG_DECAY = 16, 8, 6.0
FLA_NAMES = ("o", "ht", "dq", "dk", "dv", "dg", "dg_gamma", "dh0")


def naive_simple_gla(q, k, v, g, g_gamma, scale, h0, state_v_first):
    """FLA's recurrence, step by step (q, k may have G heads dividing v's H: repeated per head)."""
    B, T, G, K = q.shape
    H, V = v.shape[2], v.shape[3]
    if scale is None:
        scale = K ** -0.5
    q, k = (x.repeat_interleave(H // G, dim=2) for x in (q, k))
    S = torch.zeros(B, H, K, V, dtype=torch.float64)
    if h0 is not None:
        S = S + (h0.transpose(-1, -2) if state_v_first else h0)
    outs = []
    for t in range(T):
        lg = torch.zeros(B, H, dtype=torch.float64)
        if g is not None:
            lg = lg + g[:, t]
        if g_gamma is not None:
            lg = lg + g_gamma
        S = S * torch.exp(lg)[..., None, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    o = torch.stack(outs, 1)
    return o, (S.transpose(-1, -2) if state_v_first else S)


def naive_results(q, k, v, g, g_gamma, scale, h0, do, dht, state_v_first):
    """(o, ht and every gradient under FLA's names) of the naive loop, float64 numpy."""
    leaves = {"q": q, "k": k, "v": v, "g": g, "g_gamma": g_gamma, "h0": h0}
    leaves = {n: (None if x is None else x.detach().clone().requires_grad_(True))
              for n, x in leaves.items()}
    o, ht = naive_simple_gla(leaves["q"], leaves["k"], leaves["v"], leaves["g"],
                             leaves["g_gamma"], scale, leaves["h0"], state_v_first)
    loss = (o * do).sum()
    if dht is not None:
        loss = loss + (ht * dht).sum()
    loss.backward()
    out = {"o": o, "ht": ht}
    for n, x in leaves.items():
        out["dh0" if n == "h0" else f"d{n}"] = None if x is None else x.grad
    return {n: (None if x is None else x.detach().numpy()) for n, x in out.items()}


def case(B, T, G, H, K, V, seed, *, g=True, g_gamma=False, h0=True, dht=True, v_first=False):
    assert T <= MAX_T and max(K, V) <= MAX_D
    rng = np.random.default_rng([seed, B, T, G, H, K, V])
    t = lambda *shape, s=1.0: torch.from_numpy(s * rng.standard_normal(shape))  # noqa: E731
    args = {"q": t(B, T, G, K, s=K ** -0.5), "k": t(B, T, G, K, s=K ** -0.5), "v": t(B, T, H, V),
            "g": torch.nn.functional.logsigmoid(t(B, T, H)) if g else None,
            "g_gamma": -torch.from_numpy(rng.uniform(0.05, 1.0, H)) if g_gamma else None,
            "initial_state": t(B, H, V, K) if (h0 and v_first) else t(B, H, K, V) if h0 else None,
            "do": t(B, T, H, V),
            "dht": t(B, H, V, K) if (dht and v_first) else t(B, H, K, V) if dht else None,
            "state_v_first": v_first}
    la = torch.zeros(B, T, H, dtype=torch.float64)
    if args["g"] is not None:
        la = la + args["g"]
    if args["g_gamma"] is not None:
        la = la + args["g_gamma"]
    assert la.abs().max() <= MAX_LOG_DECAY
    return args


def compare(args, scale=None, impl="numba"):
    """max |convention - naive| / scale per FLA result; asserts each within the tolerance."""
    a = dict(args)
    v_first = a.pop("state_v_first")
    got = fla.simple_gla_reference(**a, scale=scale, state_v_first=v_first, impl=impl)
    naive_args = (a["q"], a["k"], a["v"], a["g"], a["g_gamma"], scale, a["initial_state"],
                  a["do"], a["dht"], v_first)
    want = naive_results(*naive_args)
    # the same loop on |q|, |k|, |v|, |h0|, |do|, |dht| (decays unchanged): sums of |terms|
    ab = lambda x: None if x is None else x.abs()  # noqa: E731
    absd = (ab(a["q"]), ab(a["k"]), ab(a["v"]), a["g"], a["g_gamma"], scale,
            ab(a["initial_state"]), ab(a["do"]), ab(a["dht"]), v_first)
    scales = naive_results(*absd)
    worst = {}
    for n in FLA_NAMES:
        if want[n] is None or (n == "dh0" and a["initial_state"] is None):
            # no such input in the call: FLA returns no gradient; glaref still gives dh0 (at zeros)
            assert n == "dh0" or got[n] is None, n
            continue
        assert got[n] is not None, n
        worst[n] = assert_scaled(got[n], want[n], scales[n], tol("convention_fla_vs_naive_f64"),
                                 f"fla {n}")
    return worst


CASES = {
    "g": dict(),
    "g_and_g_gamma": dict(g_gamma=True),
    "g_gamma_only": dict(g=False, g_gamma=True),
    "no_decay": dict(g=False),
    "state_v_first": dict(v_first=True, g_gamma=True),
    "no_h0_no_dht": dict(h0=False, dht=False),
}


@pytest.mark.parametrize("name", CASES)
def test_simple_gla_matches_fla_definition(name):
    worst = compare(case(2, 13, 3, 3, 5, 4, seed=1, **CASES[name]))
    assert set(worst) >= {"o", "ht", "dq", "dk", "dv"}


@pytest.mark.parametrize("impl", ["numpy", "numba"])
def test_grouped_heads_and_explicit_scale(impl):
    # q and k with G = 2 heads for H = 4 value heads (glaref's grouping, FLA's GVA layout)
    compare(case(1, 16, 2, 4, 8, 6, seed=2, g_gamma=True), scale=0.37, impl=impl)


def test_default_scale_is_fla_default():
    args = case(1, 4, 2, 2, 7, 3, seed=3)
    m = fla.simple_gla_inputs(args["q"], args["k"], args["v"], args["g"])
    assert m["scale"] == 7 ** -0.5
    assert fla.simple_gla_inputs(args["q"], args["k"], args["v"], scale=0.5)["scale"] == 0.5


def test_inputs_are_glaref_vjp_arguments():
    args = case(2, 9, 2, 4, 5, 3, seed=4, g_gamma=True, v_first=True)
    m = fla.simple_gla_inputs(**args)
    assert m["layout"] == "bhtd" and m["dtype"] == "float64"
    assert m["q"].shape == (2, 2, 9, 5) and m["v"].shape == (2, 4, 9, 3)
    assert m["h0"].shape == (2, 4, 5, 3) and m["dh_T"].shape == (2, 4, 5, 3)
    # log_alpha = g + g_gamma, moved to (B, H, T)
    np.testing.assert_array_equal(
        m["log_alpha"], np.swapaxes((args["g"] + args["g_gamma"]).numpy(), 1, 2))
    np.testing.assert_array_equal(m["h0"], np.swapaxes(args["initial_state"].numpy(), -1, -2))
    g = glaref.vjp(**{n: m[n] for n in ("q", "k", "v", "log_alpha", "h0", "do", "dh_T",
                                        "scale", "layout")})
    assert g.q.shape == m["q"].shape


def test_outputs_map_fla_results_to_glaref_names():
    # the naive loop's own autograd results (torch tensors that require grad) read under glaref's
    # names equal the oracle's canonical results to within the same tolerance
    args = case(2, 11, 3, 3, 4, 5, seed=5, g_gamma=True, v_first=True)
    a = dict(args)
    v_first = a.pop("state_v_first")
    q, k, v, g, gg, h0 = (a[n].detach().clone().requires_grad_(True)
                          for n in ("q", "k", "v", "g", "g_gamma", "initial_state"))
    o, ht = naive_simple_gla(q, k, v, g, gg, None, h0, v_first)
    ((o * a["do"]).sum() + (ht * a["dht"]).sum()).backward()
    mapped = fla.simple_gla_outputs(o, ht, q.grad, k.grad, v.grad, g.grad, h0.grad, gg.grad,
                                    state_v_first=v_first)
    assert mapped["dtypes"]["o"] == "float64" and mapped["dtypes"][LOG_ALPHA_BT_SUM] == "float64"
    m = fla.simple_gla_inputs(**args)
    core = (m["q"], m["k"], m["v"], m["log_alpha"], m["h0"])
    o_ref, h_T_ref = glaref.forward(*core, scale=m["scale"])
    gr = glaref.vjp(*core, m["do"], m["dh_T"], scale=m["scale"])
    sc = glaref.scales(*core, m["do"], m["dh_T"], scale=m["scale"])
    ref = {"o": o_ref, "h_T": h_T_ref, **gr._asdict(),
           LOG_ALPHA_BT_SUM: gr.log_alpha.sum(axis=(0, 2))}
    scl = {**sc._asdict(), LOG_ALPHA_BT_SUM: sc.log_alpha.sum(axis=(0, 2))}
    for n, want in ref.items():
        assert_scaled(mapped[n], want, scl[n], tol("convention_fla_vs_naive_f64"), n)


def test_outputs_and_from_glaref_are_inverse():
    rng = np.random.default_rng(6)
    B, T, H, K, V = 2, 5, 3, 4, 6
    canon = {"o": rng.standard_normal((B, H, T, V)), "h_T": rng.standard_normal((B, H, K, V)),
             "q": rng.standard_normal((B, H, T, K)), "k": rng.standard_normal((B, H, T, K)),
             "v": rng.standard_normal((B, H, T, V)), "log_alpha": rng.standard_normal((B, H, T)),
             "h0": rng.standard_normal((B, H, K, V))}
    for v_first in (False, True):
        f = fla.simple_gla_from_glaref(canon, g=True, g_gamma=True, state_v_first=v_first)
        back = fla.simple_gla_outputs(f["o"], f["ht"], f["dq"], f["dk"], f["dv"], f["dg"],
                                      f["dh0"], f["dg_gamma"], state_v_first=v_first)
        for n, x in canon.items():       # pure data movement: exact
            np.testing.assert_array_equal(back[n], x)
        np.testing.assert_array_equal(back[LOG_ALPHA_BT_SUM], canon["log_alpha"].sum(axis=(0, 2)))
    none = fla.simple_gla_outputs(o=f["o"])
    assert none["h_T"] is None and none["q"] is None and none["dtypes"] == {"o": "float64"}


def test_scales_are_glaref_scales_renamed():
    args = case(1, 6, 2, 2, 3, 3, seed=7, g_gamma=True)
    a = dict(args)
    a.pop("state_v_first")
    s = fla.simple_gla_scales(**a)
    m = fla.simple_gla_inputs(**args)
    sc = glaref.scales(m["q"], m["k"], m["v"], m["log_alpha"], m["h0"], m["do"], m["dh_T"],
                       scale=m["scale"])
    np.testing.assert_array_equal(s["dg_gamma"], sc.log_alpha.sum(axis=(0, 2)))
    np.testing.assert_array_equal(s["o"], np.swapaxes(sc.o, 1, 2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_case_is_fla_layout_and_rounded(dtype):
    q, k, v, g, h0, do, dht = fla.simple_gla_case(2, 7, 3, 4, 5, dtype=dtype, seed=3,
                                                  state_v_first=True)
    assert q.shape == k.shape == (2, 7, 3, 4) and v.shape == do.shape == (2, 7, 3, 5)
    assert g.shape == (2, 7, 3) and h0.shape == dht.shape == (2, 3, 5, 4)
    assert all(x.requires_grad and x.is_leaf for x in (q, k, v, g, h0))
    assert not do.requires_grad and q.dtype == getattr(torch, dtype)
    assert fla.simple_gla_inputs(q, k, v, g)["dtype"] == dtype
    # the same seed and sizes give the same numbers; numpy gives them too
    again = fla.simple_gla_case(2, 7, 3, 4, 5, dtype=dtype, seed=3, state_v_first=True)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, g, h0, do, dht), again))
    if dtype == "float32":
        arrs = fla.simple_gla_case(2, 7, 3, 4, 5, dtype=dtype, seed=3, framework="numpy",
                                   state_v_first=True)
        for t, a in zip((q, k, v, g, h0, do, dht), arrs):
            np.testing.assert_array_equal(t.detach().numpy(), a)


def test_errors_name_the_argument():
    args = case(1, 4, 2, 2, 3, 3, seed=8)
    q, k, v, g = args["q"], args["k"], args["v"], args["g"]
    with pytest.raises(ShapeError, match=r"^q: got 4 heads for v's 2.*GQA"):
        fla.simple_gla_inputs(torch.cat([q, q], 2), torch.cat([k, k], 2), v, g)
    with pytest.raises(ShapeError, match=r"^g: got shape \(1, 4, 3\), expected \(1, 4, 2\)"):
        fla.simple_gla_inputs(q, k, v, torch.zeros(1, 4, 3))
    with pytest.raises(ShapeError, match=r"^g_gamma: got shape \(3,\), expected \(2,\)"):
        fla.simple_gla_inputs(q, k, v, g_gamma=torch.zeros(3))
    with pytest.raises(ShapeError, match=r"^initial_state: .*\[B, H, V, K\] \(state_v_first\)"):
        fla.simple_gla_inputs(q, k, v, g, initial_state=torch.zeros(1, 2, 3, 2),
                              state_v_first=True)
    with pytest.raises(ShapeError, match=r"^dk: got shape"):
        fla.simple_gla_outputs(dk=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"^framework: got 'jax'"):
        fla.simple_gla_case(1, 2, 1, 2, 2, framework="jax")
