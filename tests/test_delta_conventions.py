"""glaref.conventions.fla_delta: FLA's gated delta rule and KDA calls, both ways, against a
float64 torch autograd loop of FLA's definition (in-kernel L2 normalisation and beta sigmoid
included)."""

from __future__ import annotations

import numpy as np
import pytest

import glaref
from glaref.conventions import fla_delta
from glaref.tolerances import tol

torch = pytest.importorskip("torch")


def _torch_fla(q, k, v, g, beta, scale, h0, do, dht, l2, sig, neg):
    """FLA's definition in float64 torch: o, ht and the gradients under FLA's names."""
    t = {n: torch.tensor(a, requires_grad=True) for n, a in
         dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0).items()}
    qq, kk = t["q"], t["k"]
    if l2:
        qq = qq * torch.rsqrt((qq * qq).sum(-1, keepdim=True) + fla_delta.L2NORM_EPS)
        kk = kk * torch.rsqrt((kk * kk).sum(-1, keepdim=True) + fla_delta.L2NORM_EPS)
    b = (2.0 if neg else 1.0) * torch.sigmoid(t["beta"]) if sig else t["beta"]
    B, T, H, V = v.shape
    r = H // q.shape[2]
    S = t["h0"]
    os = []
    for s in range(T):
        a = t["g"][:, s].exp()
        S = S * (a[..., None, None] if a.dim() == 2 else a[..., None])
        k_t = kk[:, s].repeat_interleave(r, 1)
        u = b[:, s, :, None] * (t["v"][:, s] - torch.einsum("bhkv,bhk->bhv", S, k_t))
        S = S + k_t[..., None] * u[:, :, None, :]
        os.append(scale * torch.einsum("bhkv,bhk->bhv", S, qq[:, s].repeat_interleave(r, 1)))
    o = torch.stack(os, 1)
    L = (o * torch.tensor(do)).sum() + (S * torch.tensor(dht)).sum()
    gr = torch.autograd.grad(L, [t[n] for n in ("q", "k", "v", "beta", "g", "h0")])
    # FLA_NAMES: o, ht, dq, dk, dv, dbeta, dg, dh0 -- the order of the gradients above
    return dict(zip(fla_delta.FLA_NAMES, (x.detach().numpy() for x in (o, S, *gr))))


CASES = [
    # id, (B, T, HQ, H, K, V), vector gate, l2, sigmoid, allow_neg_eigval
    ("gdn_l2", (2, 9, 2, 2, 4, 3), False, True, False, False),
    ("gdn_gva_sigmoid_neg", (1, 7, 1, 3, 3, 5), False, True, True, True),
    ("kda_gva_l2_sigmoid", (1, 8, 2, 4, 4, 2), True, True, True, False),
    ("kda_raw", (2, 6, 1, 1, 5, 4), True, False, False, False),
]


def _case(B, T, HQ, H, K, V, vector, seed=0):
    rng = np.random.default_rng(seed)
    g = -np.logaddexp(0, -rng.standard_normal((B, T, H, K) if vector else (B, T, H)))
    return dict(q=rng.standard_normal((B, T, HQ, K)), k=rng.standard_normal((B, T, HQ, K)),
                v=rng.standard_normal((B, T, H, V)), g=g,
                beta=rng.standard_normal((B, T, H)), h0=rng.standard_normal((B, H, K, V)),
                do=rng.standard_normal((B, T, H, V)), dht=rng.standard_normal((B, H, K, V)))


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("name,dims,vector,l2,sig,neg", CASES, ids=[c[0] for c in CASES])
def test_reference_matches_fla_definition(name, dims, vector, l2, sig, neg):
    x = _case(*dims, vector)
    if not sig:
        x["beta"] = np.abs(x["beta"])
    want = _torch_fla(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.6, x["h0"], x["do"],
                      x["dht"], l2, sig, neg)
    got = fla_delta.delta_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.6, x["h0"],
                                    x["do"], x["dht"], options=fla_delta.DeltaOptions(
                                        use_qk_l2norm_in_kernel=l2, use_beta_sigmoid_in_kernel=sig,
                                        allow_neg_eigval=neg))
    for n in fla_delta.FLA_NAMES:
        assert got[n].shape == want[n].shape, n
        assert _rel(got[n], want[n]) <= tol("delta_trust_jax_f64"), (name, n)


def test_state_v_first_and_default_scale():
    x = _case(1, 5, 1, 2, 3, 4, False)
    a = fla_delta.delta_reference(x["q"], x["k"], x["v"], x["g"], np.abs(x["beta"]), None,
                                  x["h0"], x["do"], x["dht"])
    swap = lambda s: np.ascontiguousarray(np.swapaxes(s, -1, -2))  # noqa: E731
    b = fla_delta.delta_reference(x["q"], x["k"], x["v"], x["g"], np.abs(x["beta"]), 3 ** -0.5,
                                  swap(x["h0"]), x["do"], swap(x["dht"]),
                                  options=fla_delta.DeltaOptions(state_v_first=True))
    for n in fla_delta.FLA_NAMES:
        np.testing.assert_array_equal(b[n], swap(a[n]) if n in ("ht", "dh0") else a[n])


def test_inputs_map_to_glaref_delta():
    x = _case(1, 6, 1, 2, 3, 2, True)
    m = fla_delta.delta_inputs(x["q"], x["k"], x["v"], x["g"], None, None, x["h0"])
    assert m["scale"] == 3 ** -0.5
    np.testing.assert_array_equal(m["beta"], np.ones((1, 2, 6)))
    np.testing.assert_array_equal(m["log_alpha"], np.swapaxes(x["g"], 1, 2))
    np.testing.assert_array_equal(m["q"], np.swapaxes(x["q"], 1, 2))
    m0 = fla_delta.delta_inputs(x["q"], x["k"], x["v"])
    assert not m0["log_alpha"].any() and m0["log_alpha"].shape == (1, 2, 6)


def test_outputs_read_kernel_results():
    x = _case(1, 4, 1, 1, 2, 3, False)
    ref = fla_delta.delta_reference(x["q"], x["k"], x["v"], x["g"], np.abs(x["beta"]), 0.5,
                                    x["h0"], x["do"], x["dht"])
    out = fla_delta.delta_outputs(*(torch.tensor(ref[n], dtype=torch.float32)
                                    for n in fla_delta.FLA_NAMES))
    assert out["dtypes"]["dbeta"] == "float32"
    for n in fla_delta.FLA_NAMES:
        assert _rel(out[n], ref[n]) < 1e-6


def test_errors_name_the_argument():
    x = _case(1, 4, 1, 2, 2, 2, False)
    with pytest.raises(glaref.ShapeError, match=r"g: got shape \(1, 4, 3\)"):
        fla_delta.delta_inputs(x["q"], x["k"], x["v"], np.zeros((1, 4, 3)))
    with pytest.raises(glaref.ShapeError, match=r"beta: got shape \(1, 4\)"):
        fla_delta.delta_inputs(x["q"], x["k"], x["v"], x["g"], np.zeros((1, 4)))
    with pytest.raises(glaref.ShapeError, match="q: got 4 heads for v's 2"):
        fla_delta.delta_inputs(np.zeros((1, 4, 4, 2)), np.zeros((1, 4, 4, 2)), x["v"])
