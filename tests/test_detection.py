"""Detection power of the verdict: every mutant is flagged, correct kernels never are.

The driver is ``mutants.check`` (a stand-in for the audit engine: regime inputs rounded to the
kernel's dtype, jax.vjp, float64 oracle on the rounded inputs, glaref._budget scales,
glaref._verdict.judge per output). Sizes are small (B=1, G=2, H=4, T=130, dk=dv=16) so the
default suite stays fast; the whole matrix at larger sizes and the long regime are under -m slow.
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("jax", reason="detection tests run JAX kernels (the jax extra)")

import mutants  # noqa: E402  (tests/ is on sys.path under pytest)

from glaref import regimes  # noqa: E402
from glaref._inputs import Dims  # noqa: E402

DIMS = Dims(B=1, G=2, H=4, T=130, dk=16, dv=16)
ALL = set(mutants.OUTPUT_NAMES)

# Where each bug shows, and which outputs must be flagged there. A regime is named per mutant
# so the test runs one case each; all are regimes of the default suite.
EXPECTED: dict[str, tuple[str, set[str], bool]] = {
    # name: (regime, outputs that must be flagged, True if exactly those)
    "gate_late": ("standard", ALL, True),
    "exclusive_cumsum": ("standard", ALL, True),
    "h0_not_decayed": ("standard", {"o", "q", "h0"}, False),
    "h0_decayed_twice": ("standard", {"o", "q", "h0"}, False),
    "group_sum_wrong_axis": ("standard", {"q", "k"}, True),
    "dla_missing_hT": ("standard", {"log_alpha"}, True),
    "chunk_off_by_one": ("standard", {"o", "h_T", "q", "k", "v", "h0"}, False),
    "tf32_matmul": ("zero_gate", {"o", "h_T", "q", "k", "v", "h0"}, False),
    "bf16_states": ("zero_gate", {"o", "h_T", "q", "k", "v", "h0"}, False),
    "odd_truncation": ("tiny_dims", ALL, True),
    "split_exp": ("strong_decay", {"o"}, False),
}

HAS_KERNELS = importlib.util.find_spec("glaref.kernels") is not None


def test_every_mutant_has_an_expected_regime():
    assert set(EXPECTED) == set(mutants.MUTANTS)
    for regime, _, _ in EXPECTED.values():
        assert regime in regimes.DEFAULT_REGIMES


@pytest.mark.parametrize("name", list(EXPECTED))
def test_mutant_is_flagged(name):
    regime, must, exact = EXPECTED[name]
    res = mutants.check(mutants.MUTANTS[name], regime, DIMS, "float32", mutants.MUTANT_CHUNK)
    flagged = set(mutants.flagged(res))
    reasons = "; ".join(r["reason"] for r in res.values())
    assert must <= flagged, f"{name} on {regime}: flagged {sorted(flagged)}, expected {sorted(must)}: {reasons}"
    if exact:
        assert flagged == must, f"{name} on {regime}: flagged {sorted(flagged)}, expected exactly {sorted(must)}"
    for out in flagged:
        assert res[out]["reason"].startswith(f"{out}: ")   # the failing output is named


def test_split_exp_is_flagged_through_nonfinite_values():
    res = mutants.check(mutants.MUTANTS["split_exp"], "strong_decay", DIMS, "float32", mutants.MUTANT_CHUNK)
    assert "non-finite" in res["o"]["reason"], res["o"]["reason"]


def test_group_bug_is_invisible_when_groups_cannot_be_confused():
    # G = 1: every head reads the one group, so the wrong axis sums the same heads. The verdict
    # must not flag a kernel whose outputs are right (no false alarm on a harmless "mutant").
    res = mutants.check(mutants.MUTANTS["group_sum_wrong_axis"], "standard",
                        Dims(1, 1, 2, 40, 8, 8), "float32", mutants.MUTANT_CHUNK)
    assert mutants.flagged(res) == [], [r["reason"] for r in res.values()]


def _assert_passes(kernel, regime, dtype, chunk_size, dims=DIMS):
    acc = None if dtype == "float32" else "float32"
    res = mutants.check(kernel, regime, dims, dtype, chunk_size, accumulate_dtype=acc)
    bad = [r["reason"] + f" [{r['case']}]" for r in res.values() if not r["ok"]]
    assert not bad, f"false alarm on {regime} {dtype}: {bad}"


@pytest.mark.parametrize("regime", regimes.DEFAULT_REGIMES)
def test_base_kernel_passes_float32(regime):
    # the kernel every mutant modifies is itself correct
    _assert_passes(mutants.base, regime, "float32", mutants.BASE_CHUNK)


def _builtin(name: str):
    if not HAS_KERNELS:
        pytest.skip("glaref.kernels does not exist yet (issue 4): built-in kernels not testable")
    from glaref import kernels

    return _BUILTINS[name](kernels)


def _chunked(kernels):
    return _cached("chunked", lambda q, k, v, la, h0: kernels.chunked(q, k, v, la, h0, return_final_state=True))


def _scan(kernels):
    return _cached("scan", lambda q, k, v, la, h0: kernels.scan(q, k, v, la, h0, return_final_state=True))


_CACHE: dict[str, object] = {}


def _cached(name, fn):
    # one function object per kernel, so mutants.check's jit cache is reused across regimes
    return _CACHE.setdefault(name, fn)


_BUILTINS = {"chunked": _chunked, "scan": _scan}
# chunk_size each built-in is judged with: the chunked kernel's default C, and 1 for the scan
BUILTIN_CHUNK = {"chunked": 64, "scan": 1}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("regime", regimes.DEFAULT_REGIMES)
@pytest.mark.parametrize("kernel", ["chunked", "scan"])
def test_builtin_kernels_pass(kernel, regime, dtype):
    """No false alarm: glaref.kernels in float32 and in bfloat16 (judged as accumulating in
    float32, which their docstring promises) on every default regime."""
    _assert_passes(_builtin(kernel), regime, dtype, BUILTIN_CHUNK[kernel])


# ------------------------------------------------------------------------------- slow sweeps

BIG = Dims(B=2, G=2, H=4, T=300, dk=32, dv=24)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED))
def test_mutant_flagged_at_larger_size(name):
    # Which outputs show a bug can change with the size (e.g. the chunk off-by-one leaves h_T
    # alone when the last chunk is a padded tail), so only "flagged, on an expected output" holds.
    regime, must, _ = EXPECTED[name]
    res = mutants.check(mutants.MUTANTS[name], regime, BIG, "float32", mutants.MUTANT_CHUNK)
    assert must & set(mutants.flagged(res)), [r["reason"] for r in res.values()]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("regime", regimes.DEFAULT_REGIMES)
@pytest.mark.parametrize("kernel", ["base", "scan_kernel", "chunked", "scan"])
def test_correct_kernels_pass_at_larger_size(kernel, regime, dtype):
    if kernel in ("base", "scan_kernel"):
        fn, C = getattr(mutants, kernel), (mutants.BASE_CHUNK if kernel == "base" else 1)
    else:
        fn, C = _builtin(kernel), BUILTIN_CHUNK[kernel]
    _assert_passes(fn, regime, dtype, C, dims=BIG)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernel", ["chunked", "scan"])
def test_builtin_kernels_pass_long(kernel, dtype):
    impl = "numba" if importlib.util.find_spec("glaref._numba") else "numpy"
    fn = _builtin(kernel)
    acc = None if dtype == "float32" else "float32"
    res = mutants.check(fn, "long", DIMS, dtype, BUILTIN_CHUNK[kernel], impl=impl, accumulate_dtype=acc)
    bad = [r["reason"] for r in res.values() if not r["ok"]]
    assert not bad, bad
