"""Where the error is: profiles and diagnoses (glaref._audit._where).

Two kinds of test. Synthetic errors of a known shape (NumPy only, fast) check each criterion of
``_where.pattern`` on its own, and that random noise gets no pattern. Then the mutants of
tests/mutants.py, each a one-bug copy of a correct chunked kernel, are judged as the audit judges
them (``_judge.assess_outputs`` on ``_problems.make_problem``) and must get the pattern their bug
produces (EXPECTED, in the standard and strong_decay regimes), while correct kernels get none.
The default suite runs one mutant per pattern in the standard regime; the whole table, both
regimes, and the zoo are under -m slow.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

import glaref
from glaref._audit import _where
from glaref._audit._claims import Claims
from glaref._inputs import Dims
from glaref.gla import _judge
from glaref.gla._problems import make_problem
from glaref.gla._where import row_profiles

CONFIG = (1, 2, 4, 16, 16)        # B, G, H, dk, dv: G < H so heads share groups
ODD_CONFIG = (1, 2, 4, 15, 15)    # odd_truncation shows only at odd sizes
T = 130                           # nine chunks of 16 and a ragged tail of 2
C = 16                            # the mutants' chunk size (mutants.MUTANT_CHUNK)

# mutant: {regime: pattern} (None: the verdict passes the row, so no diagnosis). Why each:
EXPECTED: dict[str, dict[str, str | None]] = {
    # the gate offset by one step changes every decay: error in every step, head and column,
    # far beyond any rounding (median ~1e6 budget units): no pattern can be claimed
    "gate_late": {"standard": "spread", "strong_decay": "spread"},
    "exclusive_cumsum": {"standard": "spread", "strong_decay": "spread"},
    "h0_not_decayed": {"standard": "first_chunk", "strong_decay": "first_chunk"},
    "h0_decayed_twice": {"standard": "first_chunk", "strong_decay": "first_chunk"},
    "group_sum_wrong_axis": {"standard": "group_sum", "strong_decay": "group_sum"},
    # the <S', dS'> term of the last chunk missing: dlog_alpha wrong in the last chunk only
    "dla_missing_hT": {"standard": "last_chunk", "strong_decay": "last_chunk"},
    # under strong decay the state handed on is ~e^-100 of its terms: the bug is invisible
    "chunk_off_by_one": {"standard": "chunk_jumps", "strong_decay": None},
    "tf32_matmul": {"standard": "uniform", "strong_decay": "uniform"},
    # the state rounded to bfloat16 where it is handed to the next chunk
    "bf16_states": {"standard": "chunk_jumps", "strong_decay": "chunk_jumps"},
    "odd_truncation": {"standard": "columns", "strong_decay": "columns"},
    # exp(b_i) exp(-b_j) overflows only under strong decay
    "split_exp": {"standard": None, "strong_decay": "nonfinite"},
    "head_group_map": {"standard": "heads", "strong_decay": "heads"},
    "ragged_tail": {"standard": "last_chunk", "strong_decay": "last_chunk"},
    "global_cumsum_f16": {"standard": "grows", "strong_decay": "grows"},
    "wrong_scale": {"standard": "scale", "strong_decay": "scale"},
    "dv_tile": {"standard": "columns", "strong_decay": "columns"},
}
# at dk = dv = 1 odd_truncation drops every feature: each output is zero
TINY_CONFIG = (1, 2, 4, 1, 1)
TINY = {"odd_truncation": "zero"}
# the default suite: one mutant per pattern, in the regime where it shows
FAST = {"chunk_off_by_one": "standard", "h0_not_decayed": "standard",
        "group_sum_wrong_axis": "standard", "dla_missing_hT": "standard",
        "tf32_matmul": "standard", "split_exp": "strong_decay", "head_group_map": "standard",
        "ragged_tail": "standard", "global_cumsum_f16": "standard", "wrong_scale": "standard",
        "dv_tile": "standard", "gate_late": "standard"}


# ---------------------------------------------------------------- synthetic errors

DIMS = Dims(1, 2, 4, 128, 8, 8)
F32 = Claims(compute_dtype="float32")          # what profile reads: the unit, chunking unknown
U32 = 2.0**-24


def _synthetic(error: np.ndarray, seed: int = 0):
    """(x, ref, scale) of an o-shaped output: ref random, scale |ref| + 1, x = ref + error *
    u * scale (error in budget units)."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(error.shape)
    scale = np.abs(ref) + 1.0
    return ref + error * U32 * scale, ref, scale


def _pattern(error: np.ndarray, chunk_size=16, noise: float = 2.0) -> _where.Finding:
    rng = np.random.default_rng(1)
    shape = error.shape
    x, ref, scale = _synthetic(error + noise * rng.standard_normal(shape))
    base, _, _ = _synthetic(noise * rng.standard_normal(shape))
    p = _where.profile("o", x, ref, scale, claims=Claims(compute_dtype="float32",
                                                          chunk_size=chunk_size),
                       dims=DIMS, baseline=[base], ratio=6.0)
    return _where.pattern(p)


def _shape():
    return (DIMS.B, DIMS.H, DIMS.T, DIMS.dv)


def test_noise_at_the_references_level_has_no_pattern_beyond_uniform_or_spread():
    f = _pattern(np.zeros(_shape()))
    assert f.pattern in ("uniform", "spread")


def test_jumps_at_chunk_boundaries():
    t = np.arange(DIMS.T)
    e = np.zeros(_shape())
    e[:, :, :, :] = (1e4 * np.exp(-(t % 16)) * (t >= 16))[None, None, :, None]
    assert _pattern(e).pattern == "chunk_jumps"


def test_jumps_infer_the_chunk_size():
    t = np.arange(DIMS.T)
    e = np.broadcast_to((1e4 * np.exp(-(t % 32)) * (t >= 32))[None, None, :, None], _shape()).copy()
    x, ref, scale = _synthetic(e + np.random.default_rng(2).standard_normal(e.shape))
    p = _where.profile("o", x, ref, scale, dims=DIMS,
                       claims=Claims(compute_dtype="float32", chunk_size=None))
    assert (p.chunk, p.chunk_inferred) == (32, True)
    assert _where.pattern(p).pattern == "chunk_jumps"


def test_first_chunk():
    t = np.arange(DIMS.T)
    e = np.broadcast_to((1e5 * np.exp(-t / 3.0))[None, None, :, None], _shape()).copy()
    assert _pattern(e).pattern == "first_chunk"


def test_last_chunk():
    e = np.zeros(_shape())
    e[:, :, -3:] = 1e5
    f = _pattern(e)
    assert f.pattern == "last_chunk" and f.figures["start"] == 112


def test_growth():
    t = np.arange(DIMS.T)
    e = np.broadcast_to((50.0 * (1 + t))[None, None, :, None], _shape()).copy()
    assert _pattern(e).pattern == "grows"


def test_heads_and_columns():
    e = np.zeros(_shape())
    e[:, 1] = 1e5
    f = _pattern(e)
    assert f.pattern == "heads" and f.figures == {"which": [1], "n": 4}
    e = np.zeros(_shape())
    e[..., 6:] = 1e5
    f = _pattern(e)
    assert f.pattern == "columns" and f.figures["which"] == [6, 7]


def test_scale_and_zero():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(_shape())
    scale = np.abs(ref) + 0.1
    for x, key in ((ref * (1 + 1e-3), "scale"), (np.zeros_like(ref) + 1e-9 * ref, "zero")):
        p = _where.profile("o", x, ref, scale, claims=F32, dims=DIMS)
        assert _where.pattern(p).pattern == key


def test_nonfinite_names_the_first_index():
    x, ref, scale = _synthetic(np.zeros(_shape()))
    x[0, 2, 5, 1] = np.nan
    p = _where.profile("o", x, ref, scale, claims=F32, dims=DIMS)
    f = _where.pattern(p)
    assert f.pattern == "nonfinite" and f.figures["first"] == (0, 2, 5, 1)
    # the sentence names the axes of glaref's canonical index, for readers of another layout
    assert "the first at (b, h, t, d) = (0, 2, 5, 1)" in f.words()


def test_worst_index_and_profile_summary_are_json():
    e = np.zeros(_shape())
    e[0, 3, 77, 5] = 1e6
    x, ref, scale = _synthetic(e)
    p = _where.profile("o", x, ref, scale, dims=DIMS,
                       claims=Claims(compute_dtype="float32", chunk_size=16))
    assert p.worst_index == [0, 3, 77, 5]
    assert np.argmax(p.time) == 77 and np.argmax(p.heads) == 3 and len(p.chunk_position) == 16
    json.dumps(p.summary(), allow_nan=False)


def test_long_time_profiles_are_binned_by_maxima():
    dims = Dims(1, 1, 1, 5000, 2, 2)
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 1, 5000, 2))
    x = ref.copy()
    x[0, 0, 4321, 1] += 1.0
    p = _where.profile("o", x, ref, np.abs(ref) + 1, claims=F32, dims=dims)
    assert p.time_bin == 5 and len(p.time) == 1000 and np.argmax(p.time) == 4321 // 5


def test_diagnose_needs_a_failing_output_and_a_shared_pattern():
    assert _where.diagnose({}, []) == (None, None)
    t = np.arange(DIMS.T)
    e = np.broadcast_to((1e4 * np.exp(-(t % 16)) * (t >= 16))[None, None, :, None], _shape())
    x, ref, scale = _synthetic(e.copy())
    p = _where.profile("o", x, ref, scale, dims=DIMS,
                       claims=Claims(compute_dtype="float32", chunk_size=16))
    text, key = _where.diagnose({"o": p}, ["o"])
    assert key == "chunk_jumps" and text.startswith("o: the error jumps at multiples of C = 16")


def test_profile_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="x: got shape"):
        _where.profile("o", np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 3)), np.ones((1, 1, 3, 3)),
                       claims=F32, dims=DIMS)


# ---------------------------------------------------------------- mutants and the zoo (JAX)

def _row(kernel, regime: str, config=CONFIG, chunk_size=C):
    """(failing outputs, profiles, (sentence, pattern)) of one fwd_bwd row, judged as the audit
    judges it."""
    from glaref._audit._frameworks import Call, run_kernel

    B, G, H, dk, dv = config
    p = make_problem(regime, Dims(B, G, H, T, dk, dv), 0, "float32")
    r = run_kernel(kernel, p, "float32", call=Call(framework="jax"))
    assert r.error is None, r.error
    canon = {**r.outputs, **r.grads}
    dts = {n: "float32" for n in canon}
    truth = _judge.Truth(p, 1.0, "numba")
    kw = dict(final=True, grads=True, compute_dtype="float32", chunk_size=chunk_size)
    per = _judge.assess_outputs(truth, canon, dts, **kw)
    failing = [n for n, a in per.items() if not a.ok]
    profiles = row_profiles(truth, canon, dts, **kw)
    return failing, profiles, _where.diagnose(profiles, failing)


@functools.lru_cache(maxsize=None)
def _mutant_row(name: str, regime: str, config=None):
    pytest.importorskip("jax")
    import mutants

    kernel = {**mutants.MUTANTS, **mutants.PATTERN_MUTANTS}[name]
    return _row(kernel, regime, config or (ODD_CONFIG if name == "odd_truncation" else CONFIG))


def test_every_mutant_and_pattern_has_an_expectation():
    pytest.importorskip("jax")
    import mutants

    assert set(EXPECTED) == set(mutants.MUTANTS) | set(mutants.PATTERN_MUTANTS)
    shown = {k for e in EXPECTED.values() for k in e.values()} | set(TINY.values())
    assert set(_where.PATTERNS) <= shown, set(_where.PATTERNS) - shown
    assert set(FAST) <= set(EXPECTED)


def _check(name: str, regime: str) -> None:
    failing, _, (sentence, key) = _mutant_row(name, regime)
    want = EXPECTED[name][regime]
    if want is None:
        assert not failing and sentence is None
        return
    assert failing, f"{name} passes the verdict in {regime}"
    assert key == want, f"{name} ({regime}): {sentence}"
    if want != "spread":
        assert _where.PATTERNS[want][1] in sentence


@pytest.mark.jax
@pytest.mark.parametrize("name", sorted(FAST))
def test_one_mutant_per_pattern(name):
    _check(name, FAST[name])


@pytest.mark.jax
def test_an_output_never_written():
    for name, want in TINY.items():
        failing, _, (sentence, key) = _mutant_row(name, "standard", TINY_CONFIG)
        assert failing and key == want, sentence


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("regime", ["standard", "strong_decay"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_mutant_in_both_regimes(name, regime):
    _check(name, regime)


@pytest.mark.jax
@pytest.mark.parametrize("member", ["scan", pytest.param("chunked16", marks=pytest.mark.slow)])
def test_correct_kernels_pass_and_get_no_diagnosis(member):
    pytest.importorskip("jax")
    import zoo

    failing, profiles, diagnosis = _row(zoo.zoo()[member], "standard", chunk_size=None)
    assert failing == [] and diagnosis == (None, None)
    assert set(profiles) == set(_where.PROFILED)


@pytest.mark.jax
@pytest.mark.slow
@pytest.mark.parametrize("regime", ["standard", "strong_decay"])
def test_the_whole_zoo_gets_no_diagnosis(regime):
    import zoo

    for name, kernel in zoo.zoo().items():
        failing, _, diagnosis = _row(kernel, regime, chunk_size=None)
        assert failing == [] and diagnosis == (None, None), name


# ---------------------------------------------------------------- the faces: records, CLI, testing

@pytest.mark.jax
def test_records_carry_where_diagnosis_and_probes():
    pytest.importorskip("jax")
    import mutants

    bad, good = glaref.audit([mutants.PATTERN_MUTANTS["ragged_tail"], "scan"], "1,2,4,16,16", [40],
                             ["fwd_bwd"], repeats=0, chunk_size=16,
                             probes="determinism,cotangents")
    assert "confined to the last chunk" in bad["diagnosis"]
    assert len(bad["where"]["o"]["time"]) == 40 and bad["where"]["o"]["worst_index"][2] == 39
    assert [p["probe"] for p in bad["probes"]] == ["determinism", "cotangents"]
    # the cotangent cases are judged (their oracle side computed once for both kernels)
    assert bad["probes"][0]["passed"] and bad["probes"][1]["passed"] is False
    assert [p["passed"] for p in good["probes"]] == [True, True]
    assert good["ok"] and good["diagnosis"] is None
    assert set(good["where"]) == set(_where.PROFILED) and good["where"]["o"]["time"] is None
    json.dumps([bad, good], allow_nan=False)


@pytest.mark.jax
def test_the_cli_prints_probe_lines_and_a_failing_probe_fails(capsys):
    pytest.importorskip("jax")
    from glaref.cli import main

    code = main(["audit", "--impl", "tests/mutants.py:nondeterministic", "--chunk-size", "16",
                 "--config", "1,2,4,16,16", "--seq", "40", "--mode", "fwd_bwd", "--repeats", "0",
                 "--probes", "determinism", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL probe determinism" in out and "  probe determinism  FAIL  two runs" in out
    assert main(["audit", "--impl", "scan", "--probes", "speed", "--seq", "4"]) == 2


@pytest.mark.jax
def test_check_kernel_says_where_and_runs_probes():
    pytest.importorskip("jax")
    from glaref.testing import check_kernel

    import mutants

    with pytest.raises(AssertionError) as e:
        check_kernel(mutants.PATTERN_MUTANTS["ragged_tail"], chunk_size=16, seqs=(40,))
    text = str(e.value)
    assert "o: worst element" in text and "at (b, h, t, d) = (0," in text
    assert "first at t = 39" in text and "diagnosis: o, q, k, v: the error is confined" in text
    with pytest.raises(AssertionError, match="probe causality: outputs depend on steps"):
        check_kernel(mutants.PROBE_MUTANTS["reads_ahead"], chunk_size=16, seqs=(40,),
                     probes=["causality"])
