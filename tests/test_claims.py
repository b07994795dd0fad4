"""A kernel's claims as one value (glaref._audit._claims), the reference-kernel table (glaref.gla._designs),
and what the one engine gives every framework: packed sequences for NumPy kernels in
check_kernel, a raising kernel's traceback as the AssertionError's cause."""

from __future__ import annotations

import json

import numpy as np
import pytest

import glaref
from glaref._audit._claims import Claims
from glaref.gla import _designs, _judge
from glaref.testing import check_kernel

TINY = "1,1,2,4,3"


@pytest.mark.parametrize("spelled", ["float32", np.float32, np.dtype("float32")])
def test_dtypes_are_accepted_as_users_spell_them(spelled):
    c = Claims(dtype=spelled, compute_dtype=spelled, accumulate_dtype=spelled,
                      operand_dtype=spelled)
    assert (c.dtype, c.compute_dtype, c.accumulate_dtype, c.operand_dtype) == ("float32",) * 4


def test_framework_dtypes_are_accepted_without_importing_the_framework():
    torch = pytest.importorskip("torch")
    assert Claims(dtype=torch.bfloat16).dtype == "bfloat16"
    jnp = pytest.importorskip("jax.numpy")
    assert Claims(dtype=jnp.float16).dtype == "float16"


@pytest.mark.parametrize("kw, argument", [
    ({"dtype": "int8"}, "dtype"),
    ({"dtype": np.int32}, "dtype"),
    ({"compute_dtype": "tf16"}, "compute_dtype"),
    ({"layout": "bhdt"}, "layout"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": 2.5}, "chunk_size"),
    ({"chunk_size": True}, "chunk_size"),
    ({"dlog_alpha_form": "autodiff"}, "dlog_alpha_form"),
    ({"decay_form": "cumsum"}, "decay_form"),
    ({"gate": "diagonal"}, "gate"),
    ({"grads": "q,dq"}, "grads"),
    ({"strict": "yes"}, "strict"),
    ({"accumulate_dtype": "bfloat16"}, "accumulate_dtype"),       # less precise than float32
    # contradictions: a step-by-step kernel has no chunks
    ({"chunk_size": 1, "dlog_alpha_form": "identity"}, "dlog_alpha_form"),
    ({"chunk_size": 1, "decay_form": "chunk_cumsum"}, "decay_form"),
])
def test_every_bad_claim_is_one_error_type_naming_its_argument(kw, argument):
    with pytest.raises(glaref.ClaimError) as info:
        Claims(**kw)
    e = info.value
    assert e.argument == argument and str(e).startswith(f"{argument}: got ")
    # a usage error of the audit and a dtype error of the testing API at once
    assert isinstance(e, glaref.AuditUsageError) and isinstance(e, glaref.DTypeError)


def test_the_cli_names_a_bad_claim_by_its_flag(capsys):
    from glaref.cli import main

    code = main(["audit", "--impl", "tests/audit_kernels.py:scan_kernel", "--config", TINY,
                 "--seq", "9", "--chunk-size", "1", "--dlog-alpha-form", "identity"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: --dlog-alpha-form: got 'identity' with chunk_size 1" in err, err


def test_claims_resolved_at_a_compute_dtype_promise_float32_accumulation_only_when_narrower():
    assert Claims(dtype="bfloat16").resolved("bfloat16").accumulate_dtype == "float32"
    assert Claims(dtype="float32").resolved("float32").accumulate_dtype is None
    assert Claims(dtype="bfloat16", accumulate_dtype="bfloat16").resolved(
        "bfloat16").accumulate_dtype is None
    assert Claims().judged("log_alpha") and not Claims(grads=("q", "k")).judged("log_alpha")
    assert Claims(grads=("q",)).judged("o")          # forward outputs are always judged


def test_one_table_says_which_reference_kernels_run_and_which_the_kernel_is_held_to():
    # the dlog_alpha form declared: the structure's table alone
    scan, chunked, unknown = (_designs.yardstick(c, None, "direct") for c in (1, 128, None))
    assert (list(scan.designs), scan.held_to, scan.extremes, scan.field) == (
        ["scan", "scan_sequential"], "scan", (), ("scan_sequential",))
    assert chunked.designs["chunked"].chunk == 128 and chunked.extremes == ()
    assert chunked.field == ("chunked_cumsum",) and chunked.designs["chunked_cumsum"].chunk == 128
    assert unknown.held_to == "chunked" and set(unknown.extremes) == {"scan", "chunked_wide"}
    assert {d.chunk for d in unknown.designs.values()} == {None, 64, 256}
    assert set(unknown.field) == {"chunked_cumsum", "scan_sequential"}
    # a declared decay form binds: the chunk-cumsum design alone, or the segment sums alone
    own = _designs.yardstick(128, "chunk_cumsum", "identity")
    assert (list(own.designs), own.held_to, own.field) == (["chunked_cumsum"], "chunked_cumsum", ())
    assert list(_designs.yardstick(128, "segment_sums", "direct").designs) == ["chunked"]
    # the verdict reads the same table: held to its reference, widened by the extremes
    errs = {"scan": 9.0, "chunked": 1.0, "chunked_wide": 1.0}
    assert _judge.baseline_error(errs, 1) == 9.0
    assert _judge.baseline_error({"chunked": 2.0}, 128) == 2.0
    assert _judge.baseline_error(errs, None) == 3.0


def test_an_undeclared_dlog_alpha_form_is_held_to_the_direct_form_the_identity_in_the_envelope():
    # every output reads the direct form of dlog_alpha; each chunked reference read by the
    # identity is a field design of dlog_alpha alone (the envelope), not of the other outputs
    unknown = _designs.yardstick(None)
    ident = ("chunked_identity", "chunked_wide_identity", "chunked_cumsum_identity")
    assert unknown.field == ("chunked_cumsum", "scan_sequential") + ident
    assert [unknown.designs[r].chunk for r in ident] == [64, 256, 64]
    assert unknown.designs["chunked_cumsum_identity"].decay == "chunk_cumsum"
    assert [unknown.designs[r].declares for r in ident] == [
        "dlog_alpha_form='identity'", "dlog_alpha_form='identity'",
        "dlog_alpha_form='identity' and decay_form='chunk_cumsum'"]
    assert "reverse-cumsum identity over 256 steps" in unknown.designs["chunked_wide_identity"].family
    assert unknown.key("chunked", "log_alpha") == "log_alpha_direct"
    assert unknown.key("scan", "log_alpha") == "log_alpha_direct"
    assert unknown.key("chunked_identity", "log_alpha") == "log_alpha"
    assert unknown.key("chunked_identity", "o") is None and unknown.key("chunked", "o") == "o"
    assert unknown.roles("o") == [r for r in unknown.designs if r not in ident]
    assert unknown.roles("log_alpha") == list(unknown.designs)
    # declared identity: every reference read in its own form (the chunked ones' identity)
    declared = _designs.yardstick(None, None, "identity")
    assert declared.key("chunked", "log_alpha") == "log_alpha" and declared.field == unknown.field[:2]
    assert list(_designs.yardstick(128, "segment_sums").designs) == ["chunked", "chunked_identity"]
    # a step-by-step kernel: no chunked reference, nothing to add
    assert _designs.yardstick(1) == _designs.yardstick(1, None, "direct")


def _packed_numpy(ignore_packing: bool):
    """A NumPy kernel over packed sequences: the float64 oracle, rounded to float32 (correct),
    or run as one sequence ignoring the offsets (a packing bug)."""
    def kernel(q, k, v, log_alpha, h0, cu_seqlens):
        args = [np.asarray(x, np.float64) for x in (q, k, v, log_alpha)]
        if ignore_packing:
            o, h = glaref.forward(*args, np.asarray(h0, np.float64)[:1], impl="numpy")
            h = np.repeat(h, h0.shape[0], axis=0)
        else:
            o, h = glaref.forward(*args, np.asarray(h0, np.float64), impl="numpy",
                                  cu_seqlens=cu_seqlens)
        return o.astype(np.float32), h.astype(np.float32)
    return kernel


def test_check_kernel_checks_packed_sequences_of_numpy_kernels():
    recs = check_kernel(_packed_numpy(False), framework="numpy", configs=TINY,
                        cu_seqlens="0,3,3,11", chunk_size=1, dlog_alpha_form="direct",
                        regimes="standard")
    assert len(recs) == 1 and recs[0]["ok"] and recs[0]["cu_seqlens"] == [0, 3, 3, 11]
    with pytest.raises(AssertionError, match="FAIL"):
        check_kernel(_packed_numpy(True), framework="numpy", configs=TINY,
                     cu_seqlens="0,3,3,11", regimes="standard")


def test_a_raising_kernels_traceback_is_the_assertions_cause():
    def broken_numpy_kernel(q, k, v, log_alpha, h0):
        return np.linalg.inv(q)           # q (1, 1, 5, 4) is not square: LinAlgError

    with pytest.raises(AssertionError) as info:
        check_kernel(broken_numpy_kernel, framework="numpy", configs=TINY, seqs=[5],
                     regimes="standard")
    assert str(info.value).startswith("kernel raised on 1 of 1 rows"), str(info.value)
    cause = str(info.value.__cause__)
    assert "broken_numpy_kernel" in cause and "np.linalg.inv(q)" in cause, cause
    assert "_frameworks.py" not in cause and "_engine.py" not in cause, cause


def test_the_cli_shows_a_raising_kernels_traceback_under_the_table(capsys, tmp_path):
    from glaref.cli import main

    code = main(["audit", "--impl", "tests/audit_kernels.py:raising_kernel", "--config", TINY,
                 "--seq", "20", "--mode", "fwd", "--repeats", "0", "--oracle", "numpy",
                 "--regime", "standard", "--no-progress", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 1
    tb = out[out.index("traceback of "):]
    assert "Traceback (most recent call last)" in tb and "audit_kernels.py" in tb, out
    assert "_runners.py" not in tb and "_engine.py" not in tb, tb
    row, = json.loads((tmp_path / "r.json").read_text())["results"]
    assert row["ok"] is False and "audit_kernels.py" in row["traceback"]
