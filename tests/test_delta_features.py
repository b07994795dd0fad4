"""The gated delta rule's family beyond JAX kernels: torch and NumPy kernels through the engine
(``check_kernel(framework="torch"|"numpy", recurrence="delta")``). The kernels here are written
for these tests, step by step from the equations of ``glaref.delta``'s docstring."""

from __future__ import annotations

import numpy as np
import pytest

from glaref.testing import check_kernel

SMALL = "1,1,2,8,6"                 # B, G, H, dk, dv: two heads sharing q, k (G < H)
FAST = dict(recurrence="delta", configs=SMALL, seqs=[21], regimes="standard,beta_two")


def _torch_gdn(decay_after=False):
    """A float32 step-by-step Gated DeltaNet kernel in torch, "bhtd", scalar gate:
    S~ = alpha S; u = beta (v - S~^T k); S = S~ + k u^T; o = S^T q. ``decay_after``: the
    mutant that applies the decay after the delta update (S = alpha (S + k u^T), u from S)."""
    import torch

    def kernel(q, k, v, beta, log_alpha, h0):
        B, G, T, dk = q.shape
        H = v.shape[1]
        rep = H // G
        qh, kh = q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)
        S, outs = h0, []
        for t in range(T):
            a = torch.exp(log_alpha[:, :, t])[:, :, None, None]
            kt = kh[:, :, t]
            if decay_after:
                u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
                S = a * (S + kt[..., None] * u[..., None, :])
            else:
                S = a * S
                u = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
                S = S + kt[..., None] * u[..., None, :]
            outs.append(torch.einsum("bhkv,bhk->bhv", S, qh[:, :, t]))
        return torch.stack(outs, 2), S
    return kernel


def _numpy_gdn(q, k, v, beta, log_alpha, h0):
    """The same kernel in NumPy, float32 (forward only)."""
    H = v.shape[1]
    rep = H // q.shape[1]
    qh, kh = np.repeat(q, rep, 1), np.repeat(k, rep, 1)
    S, outs = h0.copy(), []
    for t in range(q.shape[2]):
        S = np.exp(log_alpha[:, :, t])[:, :, None, None] * S
        kt = kh[:, :, t]
        u = beta[:, :, t, None] * (v[:, :, t] - np.einsum("bhkv,bhk->bhv", S, kt))
        S = S + kt[..., None] * u[..., None, :]
        outs.append(np.einsum("bhkv,bhk->bhv", S, qh[:, :, t]))
    return np.stack(outs, 2).astype(q.dtype), S.astype(q.dtype)


def test_a_torch_kernel_of_the_family_passes_with_every_gradient_judged():
    pytest.importorskip("torch")
    recs = check_kernel(_torch_gdn(), framework="torch", chunk_size=1, **FAST)
    assert len(recs) == 2 and all(r["ok"] for r in recs), [r["failures"] for r in recs]
    for r in recs:          # autograd's gradients of all six inputs, beta's included
        assert r["framework"] == "torch" and r["mode"] == "fwd_bwd"
        assert set(r["reference_ratio"]) == {"o", "h_T", "q", "k", "v", "beta", "log_alpha",
                                             "h0"}


def test_a_torch_kernel_that_decays_after_the_update_fails():
    pytest.importorskip("torch")
    with pytest.raises(AssertionError, match=r"calibrated tier"):
        check_kernel(_torch_gdn(decay_after=True), framework="torch", chunk_size=1, **FAST)


def test_a_numpy_kernel_of_the_family_is_judged_forward_only():
    recs = check_kernel(_numpy_gdn, framework="numpy", chunk_size=1, **FAST)
    assert all(r["ok"] and r["mode"] == "fwd" for r in recs), [r["failures"] for r in recs]
    assert all(set(r["reference_ratio"]) == {"o", "h_T"} for r in recs)

    def no_h0_decay(q, k, v, beta, log_alpha, h0):     # the initial state never decayed
        return _numpy_gdn(q, k, v, beta, np.where(np.arange(q.shape[2]) == 0, 0.0,
                                                  log_alpha).astype(q.dtype), h0)
    with pytest.raises(AssertionError, match=r"calibrated tier"):
        check_kernel(no_h0_decay, framework="numpy", chunk_size=1, **FAST)


def test_a_kernel_taking_the_scalar_gate_arguments_fails_naming_the_error():
    with pytest.raises(AssertionError, match="TypeError"):
        check_kernel(lambda q, k, v, log_alpha, h0: (v, h0), framework="numpy",
                     recurrence="delta", configs=SMALL, seqs=[5], regimes="standard")
