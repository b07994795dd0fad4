"""The probes (glaref._audit._probes): each fails on the mutant built for it and passes on correct kernels.

The probe mutants of tests/mutants.py (PROBE_MUTANTS) all pass the verdict: a race that flips
the last bit of a few elements, a causal mask one step wide (small next to the error budget only
where the decays are strong, but a dependence no correct kernel has), and packed sequences that
leak state into each other. Correct kernels: glaref's NumPy/Numba oracle itself through
``function_runner`` (the generic path), and JAX zoo members through ``jax_runner``. The default
suite runs each probe once on a failing and a passing kernel at small sizes; every probe on every
probe mutant and zoo member, in standard and strong_decay, is under -m slow.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

import glaref
from glaref._audit import _probes
from glaref._audit._engine import check_probes
from glaref._inputs import Dims
from glaref.gla._family import SCALAR_GATE

DIMS = Dims(1, 2, 4, 40, 16, 16)
C = 16                         # the mutants' chunk size


def _oracle_runner():
    def forward(q, k, v, la, h0, cu_seqlens=None):
        return glaref.forward(q, k, v, la, h0, cu_seqlens=cu_seqlens)

    def vjp(q, k, v, la, h0, do, dh_T, cu_seqlens=None):
        return tuple(glaref.vjp(q, k, v, la, h0, do, dh_T, cu_seqlens=cu_seqlens))
    return _probes.function_runner(SCALAR_GATE, forward, vjp)


def _problem(regime="standard", dims=DIMS):
    return SCALAR_GATE.make_problem(regime, dims, 0, "float32")


@functools.lru_cache(maxsize=None)
def _jax(name: str):
    pytest.importorskip("jax")
    import mutants
    import zoo

    kernel = {**mutants.PROBE_MUTANTS, **mutants.MUTANTS}.get(name) or zoo.zoo()[name]
    return _probes.jax_runner(kernel, "float32", SCALAR_GATE)


# ---------------------------------------------------------------- the generic runner, no JAX

def test_the_oracle_passes_the_bit_identity_probes_through_the_generic_runner():
    run = _oracle_runner()
    which = ("determinism", "causality", "packed")
    row = _probes.RowProblem("standard", Dims(1, 2, 4, 20, 4, 4), 0, "float64")
    results = _probes.run_probes(run, row, None, family=SCALAR_GATE, which=which)
    assert [r.probe for r in results] == list(which)
    assert all(r.passed for r in results), [r.line() for r in results]
    assert "changing sequence" in results[2].detail


@pytest.mark.slow
def test_the_oracle_passes_every_probe_through_the_generic_runner():
    judge = _probes.verdict_judge(SCALAR_GATE, compute_dtype="float64", chunk_size=1)
    results = _probes.run_probes(_oracle_runner(), _probes.RowProblem(
        "standard", Dims(1, 2, 4, 20, 4, 4), 0, "float64"), judge, family=SCALAR_GATE, chunk_size=8)
    assert [r.probe for r in results] == list(_probes.PROBES)
    assert all(r.passed for r in results), [r.line() for r in results]


def test_a_leak_through_a_numpy_kernel_fails_causality():
    """A NumPy kernel whose o_t sees v_{t+1}: the causality probe names o and the step."""
    def forward(q, k, v, la, h0, cu_seqlens=None):
        o, h_T = glaref.forward(q, k, v, la, h0)
        o[:, :, :-1] += 1e-3 * v[:, :, 1:]
        return o, h_T

    def vjp(q, k, v, la, h0, do, dh_T, cu_seqlens=None):
        return tuple(glaref.vjp(q, k, v, la, h0, do, dh_T))
    r = _probes.causality(_probes.function_runner(SCALAR_GATE, forward, vjp),
                          _problem(dims=Dims(1, 1, 2, 9, 3, 3)), SCALAR_GATE)
    assert r.passed is False and "o at (0, 0, 4, 0) (inputs changed at t >= 5)" in r.detail


def test_a_kernel_that_raises_fails_with_its_error():
    def forward(*a, **kw):
        raise RuntimeError("boom")
    r = _probes.determinism(_probes.function_runner(SCALAR_GATE, forward), _problem())
    assert r.passed is False and "RuntimeError: boom" in r.detail


def test_unknown_probe_names_are_refused():
    # checked once, where the audit's faces parse them (check_kernel and glaref.audit call it)
    with pytest.raises(ValueError, match="probes: got 'speed'"):
        check_probes(["speed"])


def test_the_probes_read_the_family_value():
    """What the causality probe compares and how it changes inputs come from the audit's Family
    (its causal and anticausal outputs, its perturb), not from names in glaref._audit._probes."""
    p = _problem(dims=Dims(1, 1, 2, 9, 3, 3))
    calls = []

    def perturb(name, part, rng):
        calls.append(name)
        return part * 2.0

    fam = dataclasses.replace(SCALAR_GATE, causal=("o",), anticausal=(), perturb=perturb)
    r = _probes.causality(_oracle_runner(), p, fam)
    assert r.passed is True and r.detail.startswith("o at t < 5 unchanged by t >= 5;"), r.detail
    assert "dk" not in r.detail and "seen through o (the kernel" in r.detail
    # late steps: every timed input and do; early steps: those and h0 (never dh_T)
    assert calls == ["q", "k", "v", "log_alpha", "do", "q", "k", "v", "log_alpha", "h0", "do"]
    none = _probes.causality(_oracle_runner(), p, dataclasses.replace(fam, causal=()))
    assert none.passed is None and "declares no causal" in none.detail


def test_judges_share_the_oracle_side_of_a_problem_by_its_contents():
    """verdict_judge(truths=): a second judge on a problem with the same contents (made anew)
    reuses its oracle side; a problem that differs in one element gets its own."""
    truths: dict = {}
    dims = Dims(1, 1, 2, 9, 3, 3)
    out = _oracle_runner()(_problem(dims=dims), True)
    for _ in range(2):
        judge = _probes.verdict_judge(SCALAR_GATE, compute_dtype="float64", chunk_size=1,
                                      dtypes=dict.fromkeys(SCALAR_GATE.outputs
                                                           + SCALAR_GATE.grads, "float64"),
                                      truths=truths)
        assert judge(_problem(dims=dims), out) == {}
    assert len(truths) == 1
    p = _problem(dims=dims)
    q = p.q.copy()
    q[0, 0, 4, 1] += 1.0
    fails = judge(p._replace(q=q), out)
    assert len(truths) == 2 and "o" in fails


def test_bit_identity_tells_signed_zeros_and_keeps_nans_equal():
    a = np.array([0.0, np.nan, 1.0])
    assert _probes._same(a, a.copy())
    assert not _probes._same(a, np.array([-0.0, np.nan, 1.0]))
    assert not _probes._same(a, np.nextafter(a, 2))


# ---------------------------------------------------------------- JAX mutants and zoo members

@pytest.mark.jax
def test_a_nondeterministic_kernel_fails_determinism_and_passes_the_verdict():
    p = _problem()
    r = _probes.determinism(_jax("nondeterministic"), p)
    assert r.passed is False and "o at" in r.detail
    fails = _probes.verdict_judge(SCALAR_GATE, chunk_size=C)(p, _jax("nondeterministic")(p, True))
    assert fails == {}             # one ulp on a few elements: within every tolerance
    assert _probes.determinism(_jax("scan"), p).passed is True


@pytest.mark.jax
def test_a_kernel_reading_one_step_ahead_fails_causality():
    p = _problem()
    r = _probes.causality(_jax("reads_ahead"), p, SCALAR_GATE)
    assert r.passed is False and "o at (0, 0, 20, 0) (inputs changed at t >= 21)" in r.detail
    assert _probes.causality(_jax("chunked16"), p, SCALAR_GATE).passed is True


@pytest.mark.jax
def test_packed_sequences_that_leak_fail_isolation():
    r = _probes.packed(_jax("packed_leak"), "standard", DIMS, 0, "float32", SCALAR_GATE)
    # sequence 1 is [10, 21): its state reaches sequence 2, which starts at t = 21
    assert r.passed is False and "changed the others' outputs: o at (0, 0, 21, 0)" in r.detail
    ok = _probes.packed(_jax("scan"), "standard", DIMS, 0, "float32", SCALAR_GATE)
    assert ok.passed is True, ok.detail


@pytest.mark.jax
def test_a_state_that_reads_past_its_sequence_fails_causality():
    """The future leaks into the final states only (outputs right): causality sees h_T[1], the
    state at P = 21 of the packing [0, 10, 21, 40], change with the inputs at t >= 21."""
    run = _jax("state_reads_ahead")
    p = _problem()
    r = _probes.causality(run, p, SCALAR_GATE,
                          packing=_probes.Packing(run, "standard", DIMS, 0, "float32", SCALAR_GATE))
    assert r.passed is False and "h_T at (1, 0, 0, 0) (packed at offsets [0, 10, 21, 40]" \
        in r.detail, r.detail
    # unpacked, the same kernel is right: o and dq at t < 21 see nothing of the future
    assert _probes.causality(run, p, SCALAR_GATE).passed is True


@pytest.mark.jax
@pytest.mark.slow
def test_a_correct_packed_kernel_passes_causality_with_its_states_seen_whole():
    p = _problem()
    ok = _probes.causality(_jax("scan"), p, SCALAR_GATE,
                           packing=_probes.Packing(_jax("scan"), "standard", DIMS, 0, "float32",
                                                   SCALAR_GATE))
    assert ok.passed is True and "h_T[0], h_T[1] = h_21 included" in ok.detail, ok.detail


@pytest.mark.jax
def test_a_kernel_without_packed_sequences_is_not_applicable():
    r = _probes.packed(_jax("quadratic"), "standard", DIMS, 0, "float32", SCALAR_GATE)
    assert r.passed is None and "does not take packed sequences" in r.detail


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("regime", ["standard", "strong_decay"])
def test_probe_mutants_fail_their_probe_in_both_regimes(regime):
    import mutants

    for name, probe in mutants.PROBE_EXPECTED.items():
        judge = _probes.verdict_judge(SCALAR_GATE, chunk_size=C)
        row = _probes.RowProblem(regime, DIMS, 0, "float32")
        results = {r.probe: r for r in _probes.run_probes(_jax(name), row, judge,
                                                          family=SCALAR_GATE, chunk_size=C)}
        assert results[probe].passed is False, (name, results[probe].line())


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("regime", ["standard", "strong_decay"])
def test_the_zoo_passes_every_probe(regime):
    import zoo

    for name in zoo.zoo():
        judge = _probes.verdict_judge(SCALAR_GATE)
        results = _probes.run_probes(_jax(name), _probes.RowProblem(regime, DIMS, 0, "float32"),
                                     judge, family=SCALAR_GATE)
        assert all(r.passed is not False for r in results), [r.line() for r in results]
        assert [r.probe for r in results if r.passed is None] in ([], ["packed"]), name


@pytest.mark.jax
@pytest.mark.slow
def test_structured_cotangents_and_the_chunk_sweep_catch_a_chunked_bug():
    judge = _probes.verdict_judge(SCALAR_GATE, chunk_size=C)
    p = _problem()
    assert _probes.cotangents(_jax("chunk_off_by_one"), p, judge, SCALAR_GATE).passed is False
    sweep = _probes.chunk_sweep(_jax("chunk_off_by_one"), "standard", DIMS, 0, "float32", judge,
                                chunk_size=C, family=SCALAR_GATE)
    assert sweep.passed is False and "T = 17" in sweep.detail
