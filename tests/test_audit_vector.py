"""Vector gates and packed sequences in the verdict and the audit.

- The zoo of correct vector-gate kernels (tests/zoo.py ``vector_zoo``) passes the verdict judged
  with the CLI's defaults (structure unknown, float32) on every default regime and mixed_dims;
  errors a correct kernel does not make (1% systematic or random, TF32-rounded operands) are
  flagged. Judged by glaref.gla._judge, the audit's own rule, on kernels run as the engine runs them.
- The engine and the CLI: ``gate="vector"`` / ``--gate vector``, ``cu_seqlens`` /
  ``--cu-seqlens`` (explicit offsets or random:N), exit codes 0, 1 and 2, the records' gate and
  cu_seqlens, the table's columns, user kernels given the offsets as ``cu_seqlens=``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

import glaref  # noqa: E402
from glaref import regimes  # noqa: E402
from glaref._audit import _sensitivity  # noqa: E402
from glaref._errors import AuditUsageError  # noqa: E402
from glaref._inputs import ARRAYS, OUTPUTS, Dims  # noqa: E402
from glaref.cli import main  # noqa: E402
from glaref.gla import _judge  # noqa: E402

import zoo  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.jax

KERNELS = Path(__file__).resolve().parent / "audit_kernels_vector.py"
# B, G, H, dk, dv: grouped heads (G < H); T = 65 is one of ragged's lengths, so the default
# regimes run at five shapes only (T = 65, 1, 63, 1000 and dk = dv = 1): each compiles once
ZOO_CONFIG = (1, 1, 2, 8, 8)
ZOO_T = 65
ZOO_REGIMES = tuple(regimes.DEFAULT_REGIMES) + ("mixed_dims",)
JUDGE = dict(final=True, grads=True, compute_dtype="float32", accumulate_dtype=None, chunk_size=None)
VECTOR_ZOO = zoo.vector_zoo()


@functools.lru_cache(maxsize=None)
def _truth(regime: str, dims: Dims) -> _judge.Truth:
    """The float32-rounded vector-gate problem of (regime, dims), its oracle and references
    (computed once, shared by every zoo member)."""
    p = regimes.make_inputs(regime, dims, 0, gate="vector")
    r = lambda x: np.asarray(x).astype(np.float32).astype(np.float64)   # noqa: E731
    p = p._replace(**{n: r(getattr(p, n)) for n in ARRAYS})
    return _judge.Truth(p, 1.0, "numba")


def _cases():
    B, G, H, dk, dv = ZOO_CONFIG
    return [(regime, dims) for regime in ZOO_REGIMES
            for dims in regimes.REGIMES[regime].cases(Dims(B, G, H, ZOO_T, dk, dv))]


@pytest.mark.parametrize("name", list(VECTOR_ZOO))
def test_every_vector_zoo_member_passes_with_the_cli_defaults(name):
    fn = VECTOR_ZOO[name]
    ran = 0
    for regime, dims in _cases():
        if name == "quadratic" and not zoo.quadratic_fits(dims, vector=True):
            continue
        truth = _truth(regime, dims)
        assert truth.p.vector_gate
        outs, dtypes = _sensitivity.jax_outputs(fn, truth, "float32")
        # with the CLI's defaults, and with the dlog_alpha form the member declares (every vector
        # zoo member's is the direct form: held to the sharper direct-form references)
        for form in (None, zoo.dlog_alpha_form(name, "vector")):
            verdicts = _judge.assess_outputs(truth, outs, dtypes, dlog_alpha_form=form, **JUDGE)
            assert set(verdicts) == set(OUTPUTS)
            bad = [a.reason for a in verdicts.values() if not a.ok]
            assert not bad, (name, form, regime, dims, bad)
        ran += 1
    assert ran == len(_cases())          # quadratic fits every case at these sizes


@pytest.mark.parametrize("regime", ["standard", "strong_decay", "large_values", "mixed_dims"])
def test_dlog_alpha_sensitivity_of_either_form(regime):
    """glaref.kernels.chunked computes dlog_alpha of vector gates in the direct form; declared
    so (``dlog_alpha_form="direct"``, chunking unknown, as ``--dlog-alpha-form direct``), the
    smallest dlog_alpha error the verdict flags is within the sensitivity target of its own, and
    so it is undeclared (held to the direct form's references; the built-in chunked kernel is
    judged declared, ``glaref.kernels.dlog_alpha_form``). The identity form (zoo's
    chunked_identity, flash-linear-attention's chunk_gla algorithm) meets the target declared
    "identity"; undeclared it is never FAIL (less accurate under strong decay), and declared
    "direct" it is flagged where its cancellation exceeds the direct form's error by more than
    the allowed ratio."""
    truth = _truth(regime, Dims(*ZOO_CONFIG[:3], ZOO_T, *ZOO_CONFIG[3:]))
    for name, form in (("chunked64", "direct"), ("chunked64", None),
                       ("chunked_identity", "identity")):
        outs, dtypes = _sensitivity.jax_outputs(VECTOR_ZOO[name], truth, "float32")
        for kind in _sensitivity.KINDS:
            judge = functools.partial(_judge.assess_output, dlog_alpha_form=form, **JUDGE)
            r = _sensitivity.threshold(truth, "log_alpha", outs["log_alpha"], dtypes["log_alpha"],
                                       kind, assess=judge)
            assert r["clean"] and r["ratio"] <= zoo.SENSITIVITY_TARGET, (regime, name, kind, r)
    # the identity undeclared: held to the direct form's references, never FAIL (less accurate
    # where its cancellation exceeds the allowed ratio)
    undeclared = _judge.assess_output(truth, "log_alpha", outs["log_alpha"], dtypes["log_alpha"],
                                      **JUDGE)
    assert undeclared.outcome != "fail", undeclared.reason
    if regime == "strong_decay":
        assert undeclared.outcome == "less_accurate", undeclared.reason
        # declared "direct" with the rest unknown, the identity's cancellation is within what a
        # field design (chunk-local cumulative sums) makes: less accurate, not a failure; with the
        # whole design declared (chunks of 64 by segment sums) it FAILs
        wrong = _judge.assess_output(truth, "log_alpha", outs["log_alpha"], dtypes["log_alpha"],
                                     dlog_alpha_form="direct", **JUDGE)
        assert wrong.outcome == "less_accurate", wrong.reason
        declared = dict(JUDGE, chunk_size=64)
        wrong = _judge.assess_output(truth, "log_alpha", outs["log_alpha"], dtypes["log_alpha"],
                                     dlog_alpha_form="direct", decay_form="segment_sums",
                                     **declared)
        assert not wrong.ok and wrong.failed_tier == "calibrated", wrong.reason


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("config", ["g2h8_d128", "g1h24_dk128_dv64", "g1h1_d128", "g2h4_dk48_dv40"])
def test_vector_zoo_passes_at_the_seed_configs(config, dtype):
    """The vector zoo on the seed's four configs (batch 1, heads at most 8, T = 512, one seed),
    every default regime whose sizes follow the config and mixed_dims, judged with the CLI's
    defaults and with each member's declared dlog_alpha form (bfloat16 inputs accumulating in
    float32); the quadratic form where its decay matrices fit."""
    from glaref._audit._presets import SEED_CONFIGS

    B, G, H, dk, dv = SEED_CONFIGS[config]
    dims = Dims(1, G, min(H, 8), 512, dk, dv)
    acc = None if dtype == "float32" else "float32"
    judge = {**JUDGE, "compute_dtype": dtype, "accumulate_dtype": acc}
    bad = []
    for regime in ZOO_REGIMES:
        for d in regimes.REGIMES[regime].cases(dims):
            p = regimes.make_inputs(regime, d, 0, gate="vector")
            r = lambda x: np.asarray(x).astype(jnp_dtype(dtype)).astype(np.float64)  # noqa: E731
            truth = _judge.Truth(p._replace(**{n: r(getattr(p, n)) for n in ARRAYS}), 1.0, "numba")
            for name, fn in VECTOR_ZOO.items():
                if name == "quadratic" and not zoo.quadratic_fits(d, vector=True):
                    continue
                outs, dts = _sensitivity.jax_outputs(fn, truth, dtype)
                for form in dict.fromkeys((None, zoo.dlog_alpha_form(name, "vector"))):
                    bad += [f"{regime} {name} [{form}] T={d.T}: {a.reason}" for a in
                            _judge.assess_outputs(truth, outs, dts, dlog_alpha_form=form,
                                                  **judge).values() if not a.ok]
    assert not bad, bad


def jnp_dtype(name: str):
    import jax.numpy as jnp
    return jnp.dtype(name)


def tf32_operands(q, k, v, log_alpha, h0):
    """glaref.kernels.chunked with q, k, v and h0 rounded to TF32 (10 explicit mantissa bits, as
    an NVIDIA GPU rounds float32 matmul operands at JAX's default precision) before use."""
    from jax import lax

    t = lambda x: lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)   # noqa: E731
    return glaref.kernels.chunked(t(q), t(k), t(v), log_alpha, t(h0), return_final_state=True)


@pytest.mark.parametrize("regime", ["standard", "strong_decay", "mixed_dims"])
def test_injected_errors_and_tf32_are_flagged_on_vector_gates(regime):
    truth = _truth(regime, Dims(*ZOO_CONFIG[:3], ZOO_T, *ZOO_CONFIG[3:]))
    outs, dtypes = _sensitivity.jax_outputs(VECTOR_ZOO["chunked64"], truth, "float32")
    for name in OUTPUTS:
        assert _judge.assess_output(truth, name, outs[name], dtypes[name], **JUDGE).ok
        for kind in _sensitivity.KINDS:         # 1% systematic, 1% random: every output flagged
            x = _sensitivity.inject(outs[name], 0.01, kind)
            a = _judge.assess_output(truth, name, x, dtypes[name], **JUDGE)
            assert not a.ok and a.failed_tier in ("calibrated", "proven"), (regime, name, kind, a.reason)
    outs, dtypes = _sensitivity.jax_outputs(tf32_operands, truth, "float32")
    flagged = {n for n, a in _judge.assess_outputs(truth, outs, dtypes, **JUDGE).items() if not a.ok}
    # every output that a rounded q, k, v or h0 reaches through a product (all of them)
    assert flagged == set(OUTPUTS), (regime, flagged)


# ---------------------------------------------------------------- the engine and the CLI

CFG = {"c": (2, 2, 4, 8, 8)}       # batch 2: packed audits run it with batch 1


def _audit(impls, **kw):
    return glaref.audit(impls, CFG, kw.pop("seqs", None), ["fwd_bwd"], repeats=0, **kw)


def test_engine_vector_gates_and_packed_sequences_records():
    recs = _audit(["chunked", "scan"], gate="vector", cu_seqlens=[0, 0, 17, 40])
    assert [r["impl"] for r in recs] == ["chunked", "scan"]
    for r in recs:
        assert r["ok"], r["failures"]
        assert r["dlog_alpha_form"] == "direct"      # both built-ins' form with vector gates
        assert (r["gate"], r["cu_seqlens"], r["batch"], r["seq"]) == ("vector", [0, 0, 17, 40], 1, 40)
        assert set(r["budget_bound"]) == set(OUTPUTS)
        assert all(np.isfinite(b) for b in r["budget_bound"].values())   # the proven tier is live
    (r,) = _audit(["chunked"], seqs=[20])                               # the defaults unchanged
    assert (r["gate"], r["cu_seqlens"], r["batch"]) == ("scalar", None, 2)
    assert r["dlog_alpha_form"] == "identity"          # scalar gates: the chunk-local identity


def test_engine_random_packing_draws_offsets_per_length():
    recs = _audit(["scan"], cu_seqlens="random:3", seqs=[30, 50], regimes="standard,ragged")
    assert all(r["ok"] for r in recs), [r["failures"] for r in recs]
    for r in recs:
        cu = r["cu_seqlens"]
        assert len(cu) == 4 and cu[0] == 0 and cu[-1] == r["seq"] and cu == sorted(cu)
        assert r["gate"] == "scalar" and r["batch"] == 1
    assert sorted({r["seq"] for r in recs}) == sorted({30, 50, *regimes.RAGGED_T})
    assert recs[0]["cu_seqlens"] == regimes.random_cu_seqlens(30, 3, 0).tolist()


def test_user_kernels_receive_cu_seqlens_and_are_judged_per_sequence():
    good = f"{KERNELS}:per_sequence"
    recs = _audit([good], gate="vector", cu_seqlens="0,5,5,40")
    assert recs[0]["ok"], recs[0]["failures"]
    (bad,) = _audit([f"{KERNELS}:no_restart"], cu_seqlens="0,5,5,40")
    assert not bad["ok"] and {"o", "h_T"} <= {f.split(":", 1)[0] for f in bad["failures"]}


@pytest.mark.parametrize("kw, what", [
    (dict(gate="diagonal"), "gate"),
    (dict(cu_seqlens="0,5,3,40"), "cu_seqlens"),               # decreasing
    (dict(cu_seqlens="1,5,40"), "cu_seqlens"),                 # not starting at 0
    (dict(cu_seqlens="0,2.5,40"), "cu_seqlens"),               # not integers
    (dict(cu_seqlens="random:0"), "cu_seqlens"),
    (dict(cu_seqlens="0,5,40", seqs=[30]), "seq"),             # T is fixed by the offsets
    (dict(cu_seqlens="0,5,40", regimes="ragged"), "regime"),   # ragged sets its own T
    (dict(cu_seqlens="0,5,40", impls=[f"{KERNELS}:mean_gate"]), "cu_seqlens"),   # no keyword
    (dict(dlog_alpha_form="autodiff", impls=[f"{KERNELS}:mean_gate"]), "dlog_alpha_form"),
    (dict(dlog_alpha_form="direct"), "dlog_alpha_form"),       # built-ins carry their own
])
def test_bad_gate_and_packing_arguments_are_usage_errors(kw, what):
    impls = kw.pop("impls", ["scan"])
    with pytest.raises(AuditUsageError, match=what):
        _audit(impls, **kw)


def run_cli(capsys, *args):
    code = main(["audit", "--config", "1,2,4,8,8", "--repeats", "0", "--mode", "fwd_bwd",
                 "--regime", "standard", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_vector_packed_exit_0_table_and_json(capsys, tmp_path):
    path = tmp_path / "r.json"
    code, out, err = run_cli(capsys, "--gate", "vector", "--cu-seqlens", "random:3", "--seq", "50",
                             "--json", str(path))
    assert code == 0, out + err
    head = out.splitlines()[0].split()
    assert head[:6] == ["impl", "mode", "gate", "N_seq", "config", "T"]
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("chunked ", "scan "))]
    assert len(rows) == 2 and all(r[2:4] == ["vector", "3"] and r[-1] == "ok" for r in rows)
    doc = json.loads(path.read_text())
    assert doc["config"]["gate"] == "vector" and doc["config"]["cu_seqlens"] == "random:3"
    assert all(len(r["cu_seqlens"]) == 4 for r in doc["results"])
    code, out, _ = run_cli(capsys, "--impl", "scan", "--seq", "20")      # defaults: no new columns
    assert code == 0 and out.splitlines()[0].split()[:4] == ["impl", "mode", "config", "T"]


def test_cli_exit_1_for_wrong_vector_and_packed_kernels(capsys):
    code, out, _ = run_cli(capsys, "--impl", f"{KERNELS}:mean_gate", "--gate", "vector", "--seq", "40")
    assert code == 1 and "vector gates" in out.splitlines()[-1]
    code, out, _ = run_cli(capsys, "--impl", f"{KERNELS}:no_restart", "--cu-seqlens", "0,0,17,40")
    assert code == 1 and "packed [0, 0, 17, 40]" in out.splitlines()[-1]


def test_cli_exit_2_for_bad_packing(capsys):
    code, _, err = run_cli(capsys, "--cu-seqlens", "0,5,3,40")
    assert code == 2 and "cu_seqlens[2] = 3" in err           # names the first bad position
    code, _, err = run_cli(capsys, "--impl", f"{KERNELS}:mean_gate", "--cu-seqlens", "0,5,40")
    assert code == 2 and "cu_seqlens" in err
    code, _, err = run_cli(capsys, "--gate", "diagonal")
    assert code == 2 and "gate" in err


def test_cli_dlog_alpha_form_for_user_kernels(capsys, tmp_path):
    # a direct-form kernel is held to the direct form's references, declared or not: ok, and no
    # note (an undeclared form no longer loosens the verdict, docs/budgets.md section 9)
    args = ("--impl", "glaref.kernels:chunked", "--gate", "vector", "--regime", "strong_decay",
            "--seq", "130")
    code, out, err = run_cli(capsys, *args)
    assert code == 0 and "note: " not in out, out + err
    path = tmp_path / "r.json"
    code, out, err = run_cli(capsys, *args, "--dlog-alpha-form", "direct", "--json", str(path))
    assert code == 0 and "note: " not in out, out + err
    doc = json.loads(path.read_text())
    assert doc["config"]["dlog_alpha_form"] == "direct"
    assert [(r["dlog_alpha_form"], r["notes"]) for r in doc["results"]] == [("direct", [])]
    code, _, err = run_cli(capsys, "--impl", "scan", "--dlog-alpha-form", "direct")
    assert code == 2 and "--dlog-alpha-form: got 'direct', but it describes user kernels" in err
