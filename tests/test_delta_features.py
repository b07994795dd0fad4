"""The gated delta rule's family beyond JAX kernels: torch and NumPy kernels through the engine
(``check_kernel(framework="torch"|"numpy", recurrence="delta")``). The kernels here are written
for these tests, step by step from the equations of ``glaref.delta``'s docstring."""

from __future__ import annotations

import numpy as np
import pytest

import glaref
from glaref._inputs import Dims
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


@pytest.mark.parametrize("cu, regimes", [("0,5,5,21,40", "standard,converged"),
                                         ("random:3", "standard")])
def test_the_built_in_kernels_pass_packed_sequences(cu, regimes):
    pytest.importorskip("jax")
    recs = glaref.audit(["scan", "chunked"], SMALL, [40], modes="fwd_bwd", repeats=0,
                        recurrence="delta", regimes=regimes, cu_seqlens=cu)
    assert len(recs) == 2 * len(regimes.split(",")) and all(r["ok"] for r in recs), \
        [r["failures"] for r in recs]
    for r in recs:
        assert r["batch"] == 1 and r["cu_seqlens"] is not None
        assert set(r["reference_ratio"]) >= {"h_T", "beta", "h0"}


def test_a_kernel_leaking_state_across_packed_sequences_fails():
    pytest.importorskip("jax")
    recs = glaref.audit([_leaky], SMALL, [40], modes="fwd_bwd", repeats=0, recurrence="delta",
                        regimes="standard", cu_seqlens="0,5,5,21,40")
    assert recs[0]["ok"] is False and "o" in recs[0]["failed_tier"], recs[0]["failures"]


def test_packed_problems_draw_a_state_per_sequence_and_converged_asks_for_its_own():
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


# ---------------------------------------------------------------- probes

def _reads_ahead(q, k, v, beta, log_alpha, h0, scale=1.0):
    """glaref.delta.kernels.scan, but o_t also takes in 1e-3 v_{t+1}: a dependence on the next
    step that no correct kernel has."""
    import jax.numpy as jnp

    from glaref.delta.kernels import scan
    o, h = scan(q, k, v, beta, log_alpha, h0, scale=scale, return_final_state=True)
    ahead = jnp.concatenate([v[:, :, 1:], jnp.zeros_like(v[:, :, :1])], axis=2)
    return o + 1e-3 * ahead, h


def _flip(o):
    """~10% of o's elements, drawn afresh on every call, times (1 + 2^-23): one float32 ulp."""
    o = np.asarray(o)
    return np.where(np.random.default_rng().random(o.shape) < 0.1, 1.0 + 2.0**-23,
                    1.0).astype(o.dtype)


def _nondeterministic(q, k, v, beta, log_alpha, h0, scale=1.0):
    import jax

    from glaref.delta.kernels import scan
    o, h = scan(q, k, v, beta, log_alpha, h0, scale=scale, return_final_state=True)
    factor = jax.pure_callback(_flip, jax.ShapeDtypeStruct(o.shape, o.dtype),
                               jax.lax.stop_gradient(o))
    return o * jax.lax.stop_gradient(factor), h


def test_the_oracle_declares_what_the_causality_probe_checks():
    """The family's causal and anticausal outputs, as the oracle shows them: changing steps
    t >= P leaves o, dq at t < P unchanged (and moves dk, dv, dbeta, dlog_alpha there);
    changing steps t < P and h0 leaves dv at t >= P unchanged (and moves dq, dk, dbeta,
    dlog_alpha there)."""
    from glaref.delta import vjp
    from glaref.delta._family import DELTA, perturb

    p = DELTA.make_problem("standard", Dims(1, 1, 2, 12, 4, 3), 0, "float64")
    names = ("dq", "dk", "dv", "dbeta", "dlog_alpha")

    def grads(x):
        return dict(zip(names, vjp(x.q, x.k, x.v, x.beta, x.log_alpha, x.h0, x.do, x.dh_T,
                                   impl="numpy")))

    def changed(steps, extra):
        rng = np.random.default_rng(1)
        new = {n: np.array(getattr(p, n)) for n in ("q", "k", "v", "beta", "log_alpha", "do")}
        for n, x in new.items():
            x[:, :, steps] = perturb(n, x[:, :, steps], rng)
        return grads(p.with_fields(**new, **extra))

    P, g0 = 6, grads(p)
    late = changed(slice(P, None), {"dh_T": p.dh_T + 1.0})
    early = changed(slice(0, P), {"h0": p.h0 + 1.0})
    moved_before = {n for n in names if not np.array_equal(g0[n][:, :, :P], late[n][:, :, :P])}
    moved_after = {n for n in names if not np.array_equal(g0[n][:, :, P:], early[n][:, :, P:])}
    assert moved_before == {"dk", "dv", "dbeta", "dlog_alpha"}
    assert moved_after == {"dq", "dk", "dbeta", "dlog_alpha"}
    assert DELTA.causal == ("o", "dq") and DELTA.anticausal == ("dv",)


def test_the_perturbation_keeps_beta_in_its_range_and_the_gates_decaying():
    from glaref.delta._family import perturb

    rng = np.random.default_rng(0)
    beta = rng.uniform(1.5, 2.0, (1, 2, 50))
    new = perturb("beta", beta, rng)
    assert new.min() >= beta.min() and new.max() <= beta.max() and not np.array_equal(new, beta)
    la = -rng.random((1, 2, 50))
    assert (perturb("log_alpha", la, rng) <= 0).all()
    k = rng.standard_normal((1, 1, 50, 8))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    assert np.allclose(np.linalg.norm(perturb("k", k, rng), axis=-1), 1.0)


def test_the_chunked_kernel_passes_the_bit_identity_probes():
    pytest.importorskip("jax")
    which = ("determinism", "causality", "packed")
    recs = glaref.audit(["chunked"], SMALL, [40], modes="fwd_bwd", repeats=0,
                        recurrence="delta", regimes="standard", probes=",".join(which))
    assert recs[0]["ok"] and [(p["probe"], p["passed"]) for p in recs[0]["probes"]] == \
        [(w, True) for w in which], recs[0]["probes"]


@pytest.mark.slow
@pytest.mark.parametrize("regime", ["standard", "strong_decay", "beta_two"])
def test_the_built_in_kernels_pass_every_probe(regime):
    pytest.importorskip("jax")
    recs = glaref.audit(["scan", "chunked"], SMALL, [40], modes="fwd_bwd", repeats=0,
                        recurrence="delta", regimes=regime, probes=True)
    for r in recs:
        assert r["ok"], [p for p in r["probes"] if not p["passed"]]
        assert {p["probe"]: p["passed"] for p in r["probes"]} == dict.fromkeys(
            ("determinism", "causality", "packed", "cotangents", "chunk_sweep"), True)


def test_a_delta_kernel_reading_one_step_ahead_fails_causality():
    pytest.importorskip("jax")
    from glaref._audit import _probes
    from glaref.delta._family import DELTA

    p = DELTA.make_problem("standard", Dims(1, 1, 2, 20, 8, 6), 0, "float32")
    r = _probes.causality(_probes.jax_runner(_reads_ahead, "float32", DELTA), p, DELTA)
    assert r.passed is False and "o at (0, 0, 10, 0) (inputs changed at t >= 11)" in r.detail, \
        r.detail


def test_a_nondeterministic_delta_kernel_fails_determinism():
    pytest.importorskip("jax")
    from glaref._audit import _probes
    from glaref.delta._family import DELTA

    p = DELTA.make_problem("standard", Dims(1, 1, 2, 20, 8, 6), 0, "float32")
    r = _probes.determinism(_probes.jax_runner(_nondeterministic, "float32", DELTA), p)
    assert r.passed is False and "o at" in r.detail, r.detail


def test_a_torch_kernel_of_the_family_is_probed():
    pytest.importorskip("torch")
    recs = check_kernel(_torch_gdn(), framework="torch", chunk_size=1, recurrence="delta",
                        configs=SMALL, seqs=[9], regimes="standard",
                        probes="determinism,causality,cotangents")
    assert [(p["probe"], p["passed"]) for p in recs[0]["probes"]] == [
        ("determinism", True), ("causality", True), ("cotangents", True)]


# ---------------------------------------------------------------- the report and the guard

def test_the_summary_names_the_proven_bound_only_where_it_bounded_something():
    from glaref._audit._report import summary
    from glaref.tolerances import tol

    R = f"{tol('calibrated_ratio'):g}x"
    recs = check_kernel(_numpy_gdn, framework="numpy", chunk_size=1, recurrence="delta",
                        configs=SMALL, seqs=[7], regimes="standard")
    code, line = summary(recs)
    assert code == 0 and line.startswith(f"OK: 1 rows within {R} the reference kernels' error; ran")
    scalar = check_kernel(lambda q, k, v, la, h0: glaref.forward(q, k, v, la, h0),
                          framework="numpy", configs=SMALL, seqs=[7], regimes="standard",
                          dtype="float64", compute_dtype="float64")
    assert "error and the proven bound; ran" in summary(scalar)[1]


def test_the_memory_guard_counts_the_familys_oracle_side(monkeypatch):
    """The delta family's estimate covers the peak its oracle side holds (the float64 oracle in
    NumPy, its scales and the three reference kernels of an unknown structure, traced), counts
    more than the scalar gate's for the same sizes (beta, a third reference kernel), and a row
    beyond the host's memory is skipped, naming it."""
    import tracemalloc

    from glaref._audit import _device, _engine
    from glaref._audit._verdict import reference_arithmetic
    from glaref.delta._family import DELTA
    from glaref.gla._family import SCALAR_GATE

    d = Dims(1, 1, 2, 256, 16, 16)          # arrays, not fixed overheads, dominate
    arith = reference_arithmetic("float32", "float32", None)

    def oracle_side():
        t = DELTA.truth(DELTA.make_problem("standard", d, 0, "float32"), 1.0, "numpy")
        t.forward(), t.grads(True), t.scales(True, True), t.references(True, True, None, arith)
        return t

    oracle_side()                       # compiled and imported outside the trace
    tracemalloc.start()
    try:
        oracle_side()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    need = _engine.oracle_bytes(d, ["fwd", "fwd_bwd"], DELTA)
    assert peak <= need and need > _engine.oracle_bytes(d, ["fwd", "fwd_bwd"], SCALAR_GATE)
    monkeypatch.setattr(_device, "host_available_bytes", lambda: need - 1)
    recs = glaref.audit(["scan"], "1,1,2,16,16", [256], modes="fwd_bwd", repeats=0,
                        recurrence="delta", regimes="standard")
    assert recs[0]["ok"] is None and recs[0]["skipped"].startswith(
        f"the oracle needs about {need / 2**30:.3g} GiB"), recs[0]
