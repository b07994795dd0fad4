"""The gated delta rule's family beyond JAX kernels: torch and NumPy kernels through the engine
(``check_kernel(framework="torch"|"numpy", recurrence="delta")``). The kernels here are written
for these tests, step by step from the equations of ``glaref.delta``'s docstring."""

from __future__ import annotations

import numpy as np
import pytest

import glaref
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


# ---------------------------------------------------------------- packed sequences

def _leaky(q, k, v, beta, log_alpha, h0, *, cu_seqlens, scale=1.0):
    """A kernel that runs the packed stream as one sequence from h0[0]: each sequence starts
    from the state the one before it left (a leak across sequences)."""
    import jax.numpy as jnp

    from glaref.delta.kernels import scan
    o, h = scan(q, k, v, beta, log_alpha, h0[:1], scale=scale, return_final_state=True)
    return o, jnp.repeat(h, h0.shape[0], axis=0)


@pytest.mark.parametrize("cu", ["0,5,5,21,40", "random:3"])
def test_the_built_in_kernels_pass_packed_sequences(cu):
    pytest.importorskip("jax")
    recs = glaref.audit(["scan", "chunked"], SMALL, [40], modes="fwd_bwd", repeats=0,
                        recurrence="delta", regimes="standard,converged", cu_seqlens=cu)
    assert len(recs) == 4 and all(r["ok"] for r in recs), [r["failures"] for r in recs]
    for r in recs:
        assert r["batch"] == 1 and r["cu_seqlens"] is not None
        assert set(r["reference_ratio"]) >= {"h_T", "beta", "h0"}


def test_a_kernel_leaking_state_across_packed_sequences_fails():
    pytest.importorskip("jax")
    recs = glaref.audit([_leaky], SMALL, [40], modes="fwd_bwd", repeats=0, recurrence="delta",
                        regimes="standard", cu_seqlens="0,5,5,21,40")
    assert recs[0]["ok"] is False and "o" in recs[0]["failed_tier"], recs[0]["failures"]


def test_packed_problems_draw_a_state_per_sequence_and_converged_asks_for_its_own():
    from glaref._inputs import Dims
    from glaref.delta import regimes
    cu = np.array([0, 3, 3, 9])
    dp = regimes.make_inputs("converged", Dims(1, 1, 2, 9, 4, 5), 0, cu_seqlens=cu)
    assert dp.h0.shape == (3, 2, 4, 5) and dp.dh_T.shape == (3, 2, 4, 5)
    assert dp.cu_seqlens.tolist() == cu.tolist() and dp.n_states == 3
    kh = np.repeat(dp.k, 2, axis=1)        # v_t = W_n^T k_t + 1e-6 noise, W_n = h0[n]
    for n, (t0, t1) in enumerate([(0, 3), (3, 3), (3, 9)]):
        want = np.einsum("bhtk,hkv->bhtv", kh[:, :, t0:t1], dp.h0[n])
        assert np.abs(dp.v[:, :, t0:t1] - want).max(initial=0.0) < 1e-5
    unpacked = regimes.make_inputs("standard", Dims(1, 1, 2, 9, 4, 5), 0)
    assert unpacked.cu_seqlens is None and unpacked.h0.shape == (1, 2, 4, 5)
