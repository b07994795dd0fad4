"""The golden vectors (oracles/): integrity, regeneration, the reader, the documented rule, the C
judge of oracles/README.md, the mpmath figures, the size, and the wheel that carries them.

The stored files were generated on one platform (the manifest's generator.platform): on that
platform regeneration must be bit-identical; elsewhere the values are compared within
"golden_recompute" and the bit-for-bit checks skip, saying why.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import glaref.golden as golden
from glaref._inputs import GRADS, Problem
from glaref.cli import main
from glaref.gla import _baseline, _judge
from glaref.gla import _golden as gb
from glaref.gla._problems import round_to_dtype
from glaref.golden import OUTPUTS, OracleFileError
from glaref.tolerances import tol

from conftest import blocked_imports

ROOT = Path(__file__).resolve().parents[1]
ORACLES = ROOT / "oracles"
README = ORACLES / "README.md"
MANIFEST = json.loads((ORACLES / "manifest.json").read_text())
SAME_PLATFORM = None   # set on first use: gb.fingerprint() needs the BLAS libraries loaded

# A handful of cases that cover every kind (seed config with state, regime across a chunk,
# bfloat16, h0 absent, T = 0, T = 1, no final state) and regenerate in seconds.
SUBSET = ["seed_g2h4_dk48_dv40-bfloat16", "regime_strong_decay-float32", "regime_ragged_T1-bfloat16",
          "edge_T0-float32", "edge_h0_absent-bfloat16", "edge_scale-float32"]


def same_platform() -> bool:
    global SAME_PLATFORM
    if SAME_PLATFORM is None:
        spec, dtype = gb.all_cases()["edge_T0-float32"]
        gb.build_arrays(spec, dtype)        # loads numba's and numpy's BLAS
        SAME_PLATFORM = gb.fingerprint() == MANIFEST["generator"]["platform"]
    return SAME_PLATFORM


def need_same_platform() -> None:
    if not same_platform():
        pytest.skip(f"bit-for-bit regeneration holds on the generating platform "
                    f"{MANIFEST['generator']['platform']}, this is {gb.fingerprint()}")


# ------------------------------------------------------------------------------ the stored data

def test_manifest_lists_every_case_with_its_files_hashes_and_the_current_verdict_constants():
    assert MANIFEST["format_version"] == golden.FORMAT_VERSION
    assert list(MANIFEST["cases"]) == list(gb.all_cases())
    assert golden.cases() == list(gb.all_cases())
    for name, e in MANIFEST["cases"].items():
        path = ORACLES / e["file"]
        assert e["file"] == f"{name}.npz"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == e["sha256"], name
        assert path.stat().st_size == e["bytes"], name
    assert (sorted(p.name for p in ORACLES.glob("*.npz"))
            == sorted(e["file"] for e in MANIFEST["cases"].values()))
    assert MANIFEST["total_bytes"] == sum(e["bytes"] for e in MANIFEST["cases"].values())
    # the ratio is read from glaref.tolerances at generation time: a recalibration regenerates
    assert MANIFEST["verdict"] == gb.verdict_entry()
    assert MANIFEST["verdict"]["calibrated_ratio"] == tol("calibrated_ratio")


def test_the_cases_cover_the_issue_list():
    from glaref._audit._presets import SEED_CONFIGS
    from glaref.regimes import DEFAULT_REGIMES, REGIMES

    cases = MANIFEST["cases"].values()
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    names = {n.rsplit("-", 1)[0] for n in MANIFEST["cases"]}
    assert {f"seed_{c}" for c in SEED_CONFIGS} <= names
    for c, (_, G, H, dk, dv) in SEED_CONFIGS.items():
        d = MANIFEST["cases"][f"seed_{c}-float32"]["dims"]
        assert (d["G"], d["H"], d["dk"], d["dv"]) == (G, H, dk, dv) and d["B"] == 1
    assert {c["regime"] for c in cases} == set(DEFAULT_REGIMES)
    ragged_T = {c["dims"]["T"] for c in cases if c["regime"] == "ragged"}
    assert ragged_T == {d.T for d in REGIMES["ragged"].cases(gb.REGIME_DIMS)}
    tags = {t for c in cases for t in c["tags"]}
    for want in ("T = 0", "T = 1", "T = 63 (just below a 64-step chunk)",
                 "T = 65 (just above a 64-step chunk)", "dk = dv = 1", "G < H", "h0 absent",
                 "no final state", "scale != 1", "B > 1"):
        assert want in tags, want


def test_arrays_shapes_and_exact_dtype_rounding():
    for name in golden.cases():
        c = golden.load(name)
        e = c.meta
        d = e["dims"]
        B, G, H, T, dk, dv = (d[k] for k in ("B", "G", "H", "T", "dk", "dv"))
        want = {"q": (B, G, T, dk), "v": (B, H, T, dv), "log_alpha": (B, H, T), "o": (B, H, T, dv),
                "dq": (B, G, T, dk), "dlog_alpha": (B, H, T), "scale_dlog_alpha_direct": (B, H, T),
                "ref_err": (len(golden.REFERENCE_KERNELS), 7), "baseline_err": (3, 7),
                "proven_bound": (3, 7), "u": ()}
        for a, shape in want.items():
            assert c[a].shape == shape, (name, a)
        assert ("h0" in c) == e["h0"] == ("dh0" in c) == ("scale_dh0" in c)
        assert ("dh_T" in c) == e["final_state"] == ("h_T" in c)
        assert c.outputs == tuple(e["outputs"])
        # inputs hold exact values of the case's dtype
        for a in golden.INPUTS:
            if a in c:
                assert np.array_equal(round_to_dtype(c[a], e["dtype"]), c[a]), (name, a)
        # figures are NaN exactly for the outputs the case lacks
        has = np.array([o in c for o in OUTPUTS])
        for a in ("ref_norm", "ref_err", "floor_err", "baseline_err", "underflow_floor", "proven_bound"):
            nan = np.isnan(c[a]).any(axis=0) if c[a].ndim == 2 else np.isnan(c[a])
            assert np.array_equal(nan, ~has), (name, a)


def test_stored_values_are_the_readable_reference_on_the_stored_inputs():
    # the NumPy reference (glaref/gla/_reference.py), not the Numba path that generated them
    import glaref

    for name in ("regime_strong_decay-float32", "edge_G2_H6-bfloat16", "regime_ragged_T65-float32"):
        c = golden.load(name)
        args = (c["q"], c["k"], c["v"], c["log_alpha"], c["h0"])
        o, h_T = glaref.forward(*args, scale=c["scale"], impl="numpy")
        g = glaref.vjp(*args, c["do"], c["dh_T"], scale=c["scale"], impl="numpy")
        for out, x in zip(OUTPUTS, (o, h_T, *g)):
            ref = c[out]
            assert np.linalg.norm(x - ref) <= tol("numba_vs_numpy") * np.linalg.norm(ref), (name, out)


def test_the_folder_fits_in_8_mb():
    total = sum(p.stat().st_size for p in ORACLES.iterdir())
    assert total <= gb.MAX_TOTAL_BYTES, f"oracles/ holds {total} bytes, the limit is {gb.MAX_TOTAL_BYTES}"


def test_zip_members_carry_fixed_dates_and_order():
    for e in MANIFEST["cases"].values():
        with zipfile.ZipFile(ORACLES / e["file"]) as zf:
            infos = zf.infolist()
        assert all(i.date_time == gb.ZIP_DATE and i.compress_type == zipfile.ZIP_DEFLATED for i in infos)
        names = [i.filename[:-4] for i in infos]
        assert names == [a for a in golden.ARRAYS if a in names] == list(e["shapes"])


def test_bfloat16_rounding_is_direct_round_to_nearest_even():
    # ties to even (1 + 2^-8 -> 1, 1 + 3 2^-8 -> 1 + 2^-6), above a tie, bfloat16 subnormals
    # (spacing 2^-133 below 2^-126), zeros, and the largest values (spacing 2^120)
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-40, -(1 + 2**-8), 2.0**-130 * 1.5,
                  2.0**-133 * 0.5, 2.0**-133 * 0.75, 0.0, -0.0, 225.5 * 2.0**120, 226.5 * 2.0**120])
    want = np.array([1.0, 1.0, 1 + 4 * 2**-8, 1 + 2 * 2**-8, -1.0, 2.0**-130 * 1.5, 0.0, 2.0**-133,
                     0.0, -0.0, 226 * 2.0**120, 226 * 2.0**120])
    got = round_to_dtype(x, "bfloat16")
    assert np.array_equal(got, want), got - want
    ml = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    y = np.concatenate([rng.standard_normal(100000) * 10.0 ** rng.integers(-40, 38, 100000),
                        rng.standard_normal(1000) * 2.0**-128])
    assert np.array_equal(round_to_dtype(y, "bfloat16"), y.astype(ml.bfloat16).astype(np.float64))


# ------------------------------------------------------------------------------ regenerate, verify

def test_regenerate_a_subset_into_a_temp_dir_and_verify(tmp_path):
    # the shipped manifest in place: its mpmath figures carry over while the measured arrays are
    # unchanged (their own recomputation is tested below)
    shutil.copy(ORACLES / "manifest.json", tmp_path)
    doc = gb.generate(tmp_path, names=SUBSET)
    assert list(doc["cases"]) == SUBSET
    problems, notes = gb.verify(tmp_path, strict=True, partial=True)
    assert problems == [] and notes == []
    for n in SUBSET:      # the mpmath figures and everything else as in the shipped manifest
        got, want = dict(doc["cases"][n]), dict(MANIFEST["cases"][n])
        if not same_platform():
            for k in ("sha256", "bytes", "mpmath"):
                got.pop(k), want.pop(k)
        assert got == want, n
    # a second run rewrites nothing and gives the same bytes
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    gb.generate(tmp_path, names=SUBSET)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_shipped_subset_is_bit_identical_to_a_regeneration():
    need_same_platform()
    for n in SUBSET:
        spec, dtype = gb.all_cases()[n]
        data = gb.npz_bytes(gb.build_arrays(spec, dtype))
        assert hashlib.sha256(data).hexdigest() == MANIFEST["cases"][n]["sha256"], n


@pytest.mark.slow
def test_full_regeneration_is_bit_identical_and_verify_strict_passes(tmp_path, capsys):
    """Every case (about a minute): regenerated files equal the shipped ones byte for byte, and
    `glaref oracles verify --strict` accepts oracles/."""
    need_same_platform()
    gb.generate(tmp_path, mpmath=False)
    for e in MANIFEST["cases"].values():
        assert (tmp_path / e["file"]).read_bytes() == (ORACLES / e["file"]).read_bytes(), e["file"]
    assert main(["oracles", "verify", "--dir", str(ORACLES), "--strict"]) == 0
    assert "OK: every case" in capsys.readouterr().out


def _copy_subset(tmp_path: Path, names: list[str]) -> Path:
    d = tmp_path / "oracles"
    d.mkdir()
    doc = dict(MANIFEST)
    doc["cases"] = {n: MANIFEST["cases"][n] for n in names}
    doc["total_bytes"] = sum(e["bytes"] for e in doc["cases"].values())
    (d / "manifest.json").write_text(gb.manifest_text(doc))
    for n in names:
        shutil.copy(ORACLES / MANIFEST["cases"][n]["file"], d)
    return d


def _rewrite(d: Path, name: str, change) -> None:
    """Change array(s) of a stored case and re-record its sha256, as a stale or edited file
    that still hashes right would look."""
    c = golden.load(name, d)
    arrays = dict(c.arrays)
    change(arrays)
    data = gb.npz_bytes(arrays)
    (d / c.meta["file"]).write_bytes(data)
    doc = golden.manifest(d)
    doc["cases"][name]["sha256"] = hashlib.sha256(data).hexdigest()
    doc["cases"][name]["bytes"] = len(data)
    doc["total_bytes"] = sum(e["bytes"] for e in doc["cases"].values())
    (d / "manifest.json").write_text(gb.manifest_text(doc))


def test_verify_cli_names_the_case_and_array_of_each_mismatch(tmp_path, capsys):
    names = ["edge_scale-float32", "edge_T0-bfloat16", "regime_ragged_T1-float32"]
    d = _copy_subset(tmp_path, names)
    # the CLI wants every case; a subset folder is checked case by case
    args = ["oracles", "verify", "--dir", str(d)] + [x for n in names for x in ("--case", n)]
    assert main(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    # values within tolerance are the check: no note about bytes, on any BLAS
    assert "note:" not in out and "bytes" not in out, out
    if same_platform():
        assert main(args + ["--strict"]) == 0, capsys.readouterr().out

    def bump_o(a):
        a["o"] = a["o"].copy()
        a["o"][0, 1, 2, 0] *= 1 + 1e-6
    _rewrite(d, "edge_scale-float32", bump_o)

    def bump_input(a):
        a["log_alpha"] = a["log_alpha"] * 0.5
    _rewrite(d, "regime_ragged_T1-float32", bump_input)
    raw = bytearray((d / "edge_T0-bfloat16.npz").read_bytes())
    raw[-100] ^= 0xFF                                    # inside the zip's central directory
    (d / "edge_T0-bfloat16.npz").write_bytes(bytes(raw))
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "MISMATCH case edge_scale-float32: array o: stored" in out
    assert "at index (0, 1, 2, 0)" in out
    assert "MISMATCH case regime_ragged_T1-float32: array log_alpha: differs from the seeded" in out
    assert "MISMATCH golden case 'edge_T0-bfloat16'" in out and "sha256" in out
    assert out.rstrip().endswith(f"mismatch(es) in {d}")


def test_verify_usage_errors_list_the_valid_names(tmp_path, capsys):
    # a typo is a usage error (exit 2) that lists the valid names, not a data mismatch (exit 1)
    assert main(["oracles", "verify", "--case", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--case: got 'nosuch'" in err
    assert all(n in err for n in MANIFEST["cases"]), err
    assert main(["oracles", "verify", "--dir", str(tmp_path / "absent")]) == 2
    assert "--dir: got" in capsys.readouterr().err
    assert main(["oracles", "verify", "--dir", str(tmp_path)]) == 2   # a folder without manifest
    assert "holds no manifest.json" in capsys.readouterr().err
    d = _copy_subset(tmp_path, ["edge_T0-float32"])
    assert main(["oracles", "verify", "--dir", str(d), "--case", "edge_T0-bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "'edge_T0-bfloat16'" in err and err.rstrip().endswith("edge_T0-float32"), err


def test_verify_flags_a_stale_verdict_constant_and_mpmath_entry(tmp_path):
    names = ["edge_scale-bfloat16"]
    d = _copy_subset(tmp_path, names)
    doc = golden.manifest(d)
    doc["verdict"]["calibrated_ratio"] = tol("calibrated_ratio") + 1
    doc["cases"][names[0]]["mpmath"] = None
    (d / "manifest.json").write_text(gb.manifest_text(doc))
    problems, _ = gb.verify(d, names=names)
    assert any(p.startswith("manifest: verdict.calibrated_ratio is") for p in problems), problems
    assert any(p.startswith("case edge_scale-bfloat16: mpmath: got None") for p in problems), problems


def test_generate_cli_needs_mpmath_or_no_mpmath(tmp_path, monkeypatch, capsys):
    import glaref._golden_cli as cli

    monkeypatch.setattr(cli, "_has_mpmath", lambda: False)
    assert main(["oracles", "generate", "--out", str(tmp_path)]) == 3
    assert "needs mpmath" in capsys.readouterr().err
    assert main(["oracles"]) == 2


# ------------------------------------------------------------------------------ the reader

def _label(name: str) -> str:
    # the message opens with the case and its file: golden case 'name' (path)
    return re.escape(f"golden case {name!r}") + r" \([^)]*\)"


def _assert_raised_here(excinfo) -> None:
    # a clear error from glaref.golden itself, not a traceback from inside numpy or zipfile
    e = excinfo.value
    assert Path(str(excinfo.traceback[-1].path)).name == "golden.py"
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)


def test_loader_names_the_case_of_a_truncated_file(tmp_path):
    name = "edge_G2_H6-float32"
    d = _copy_subset(tmp_path, [name])
    f = d / f"{name}.npz"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(OracleFileError, match=_label(name) + ".*sha256.*corrupted, truncated") as ei:
        golden.load(name, d)
    _assert_raised_here(ei)
    with pytest.raises(OracleFileError, match=_label(name) + ".*not a readable .npz.*truncated") as ei:
        golden.load(name, d, check_hash=False)
    _assert_raised_here(ei)


def test_loader_names_the_case_and_array_of_corrupted_data(tmp_path):
    name = "edge_G2_H6-float32"
    d = _copy_subset(tmp_path, [name])
    f = d / f"{name}.npz"
    raw = bytearray(f.read_bytes())
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("dv.npy")
    raw[info.header_offset + 30 + len(info.filename) + 40] ^= 0x55     # inside dv's deflate stream
    f.write_bytes(bytes(raw))
    with pytest.raises(OracleFileError, match=_label(name) + ".*sha256"):
        golden.load(name, d)
    with pytest.raises(OracleFileError, match=_label(name) + ": array 'dv' is unreadable") as ei:
        golden.load(name, d, check_hash=False)
    _assert_raised_here(ei)


def test_loader_errors_for_a_missing_file_an_unknown_name_a_bad_manifest_and_a_bad_shape(tmp_path):
    name = "edge_T0-float32"
    d = _copy_subset(tmp_path, [name])
    with pytest.raises(OracleFileError, match=r"name: got 'nope', expected one of the 1 cases"):
        golden.load("nope", d)
    _rewrite(d, name, lambda a: a.update(o=np.zeros((1, 2, 3))))
    with pytest.raises(OracleFileError, match=_label(name) + r": array 'o' has shape \(1, 2, 3\)"):
        golden.load(name, d)
    (d / f"{name}.npz").unlink()
    with pytest.raises(OracleFileError, match=_label(name) + ": cannot read the file"):
        golden.load(name, d)
    text = (d / "manifest.json").read_text()
    (d / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(OracleFileError, match="is not valid JSON .*corrupted or truncated") as ei:
        golden.cases(root=d)
    _assert_raised_here(ei)
    with pytest.raises(OracleFileError, match="no manifest.json|cannot read"):
        golden.manifest(tmp_path / "nowhere")


_NUMPY_ONLY = blocked_imports("numba", "jax", "jaxlib", "torch", "ml_dtypes", "mpmath",
                              "scipy") + r"""
import json
import glaref
names = glaref.golden.cases(dtype="bfloat16")
c = glaref.golden.load(names[0])
print(json.dumps({"n": len(names), "o": list(c["o"].shape), "dtype": c.meta["dtype"]}))
"""


def test_reader_needs_only_numpy():
    r = subprocess.run([sys.executable, "-c", _NUMPY_ONLY], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["n"] == len(golden.cases(dtype="bfloat16")) and got["dtype"] == "bfloat16"


# ------------------------------------------------------------------------------ the rule

def readme_rule(c: golden.Case, out: str, x: np.ndarray, row: int = 0) -> dict:
    """The verdict exactly as oracles/README.md writes it, from the stored arrays only."""
    i = OUTPUTS.index(out)
    ref = c[out]
    x = np.asarray(x, dtype=np.float64)
    nonfinite = int((~np.isfinite(x)).sum())
    d = np.where(np.isfinite(x), x - ref, 0.0)
    err = math.sqrt(math.fsum((d * d).ravel()))
    s, ch, w = c["ref_err"][0, i], c["ref_err"][1, i], c["ref_err"][2, i]
    mR = MANIFEST["verdict"]["calibrated_extreme_margin"] / MANIFEST["verdict"]["calibrated_ratio"]
    base = {0: max(ch, math.sqrt(ch * s), math.sqrt(ch * w), mR * s, mR * w), 1: s, 2: ch}[row]
    baseline = max(base, c["floor_err"][i])
    assert baseline == c["baseline_err"][row, i]
    floor = (tol("calibrated_floor") * c["u"] * c["ref_norm"][i]
             + math.sqrt(ref.size) * c["underflow_floor"][i])
    assert floor == c["floor_err"][i]
    denom = c["u"] * c[f"scale_{out}"] + c["underflow_floor"][i]
    ulps = float(np.max(np.abs(d) / denom)) if d.size else 0.0
    ratio = 0.0 if err == 0 else err / baseline
    R = MANIFEST["verdict"]["calibrated_ratio"]
    ok = nonfinite == 0 and ratio <= R and ulps <= c["proven_bound"][row, i]
    return {"err": err, "baseline": baseline, "ratio": ratio, "budget_ulps": ulps,
            "bound": c["proven_bound"][row, i], "ok": ok}


def _problem(c: golden.Case) -> Problem:
    from glaref._inputs import Dims

    d = Dims(**c.meta["dims"])
    z = np.zeros((d.B, d.H, d.dk, d.dv))
    return Problem(c["q"], c["k"], c["v"], c["log_alpha"], c["h0"] if "h0" in c else z, c["do"],
                   c["dh_T"] if "dh_T" in c else None, d)


def _reference_run(c: golden.Case, kernel: str) -> dict[str, np.ndarray]:
    """A correct kernel's outputs on the case (glaref's reference kernel, as the verdict runs
    it), rounded to the case's dtype, by golden output name."""
    from glaref._audit import _verdict

    dtype = c.meta["dtype"]
    arith = _verdict.reference_arithmetic(dtype, gb.ACCUMULATE[dtype])
    r = _baseline.run(kernel, _problem(c), float(c["scale"]), **arith)
    return {o: _baseline.round_to(r[g], dtype) for o, g in zip(OUTPUTS, golden.GLAREF_NAMES) if o in c}


def _stored_truth(c: golden.Case) -> _judge.Truth:
    """glaref's Truth for the case, holding the stored oracle values rather than this machine's
    recomputation. The README's rule reads the stored files; the recomputed oracle may differ from
    them in the last bits where another BLAS kernel runs (``oracles verify`` holds that gap to
    its value tolerance), and a ratio of a float32 error to the baseline carries such a gap times
    |value|/error (~1e7), beyond golden_rule_figures. Both sides judge against one truth here, so
    the test compares the two implementations of the rule and nothing else."""
    truth = _judge.Truth(_problem(c), float(c["scale"]), "numba")
    final = bool(c.meta["final_state"])
    live = truth.forward() + truth.grads(final)   # what no file stores (dh0 without an h0)
    stored = tuple(c[o] if o in c else x for o, x in zip(OUTPUTS, live))
    truth._fwd, truth._grads[final] = stored[:2], stored[2:]
    return truth


RULE_CASES = ["regime_strong_decay-bfloat16", "regime_near_one-float32", "edge_h0_absent-float32",
              "seed_g2h8_d128-bfloat16", "edge_T0-bfloat16"]


@pytest.mark.parametrize("name", RULE_CASES)
def test_readme_rule_is_glarefs_verdict(name):
    """Candidates judged by the README's rule from the stored files get glaref's own verdict
    (_judge.assess_outputs, the audit's judging loop; dlog_alpha in the identity form the stored
    figures are of, as the README says) with the same figures: a correct kernel,
    and the oracle pushed by R/2 and 2R times the baseline along a random direction."""
    c = golden.load(name)
    dtype = c.meta["dtype"]
    assert max(c[o].size for o in c.outputs) <= 2**15      # golden_rule_figures' derivation
    truth = _stored_truth(c)
    R = MANIFEST["verdict"]["calibrated_ratio"]
    rng = np.random.default_rng(1)
    chunked = _reference_run(c, "chunked")
    candidates = {"chunked reference": chunked}
    for k in (R / 2, 2 * R):
        cand = {}
        for o in c.outputs:
            u = rng.standard_normal(c[o].shape)
            n = np.linalg.norm(u)
            j = OUTPUTS.index(o)
            cand[o] = c[o] + (k * c["baseline_err"][0, j] / n) * u if n else c[o]
        candidates[f"{k:g} x baseline"] = cand
    t = tol("golden_rule_figures")
    for label, cand in candidates.items():
        outs = {g: cand[o] for o, g in zip(OUTPUTS, golden.GLAREF_NAMES) if o in cand}
        per = _judge.assess_outputs(truth, outs, {g: dtype for g in outs}, final=c.meta["final_state"],
                                    grads=True, compute_dtype=dtype,
                                    accumulate_dtype=gb.ACCUMULATE[dtype], chunk_size=None,
                                    dlog_alpha_form="identity")
        for o, g in zip(OUTPUTS, golden.GLAREF_NAMES):
            if o not in cand:
                continue
            mine, a = readme_rule(c, o, cand[o]), per[g]
            where = f"{name} {label} {o}"
            assert mine["ok"] == a.ok, (where, mine, a)
            assert mine["bound"] == a.bound, where
            assert math.isclose(mine["budget_ulps"], a.budget_ulps, rel_tol=t, abs_tol=0), where
            assert math.isclose(mine["ratio"], a.ratio, rel_tol=t, abs_tol=0), where
            ref_norm = c["ref_norm"][OUTPUTS.index(o)]
            got_base = a.baseline_rel_err * ref_norm if ref_norm else a.baseline_rel_err
            assert math.isclose(mine["baseline"], got_base, rel_tol=t, abs_tol=0), where
        if label == "chunked reference":
            assert all(a.ok for a in per.values()), label
        if label.startswith(f"{2 * R:g}"):
            assert not any(a.ok for a in per.values() if a.ratio), label


# ------------------------------------------------------------------------------ the C judge

def _c_source() -> str:
    m = re.search(r"```c\n(.*?)```", README.read_text(), re.S)
    assert m, "oracles/README.md has no ```c block"
    return m.group(1)


def _compiler() -> str | None:
    for cc in ("cc", "gcc", "clang"):
        if shutil.which(cc):
            return cc
    return None


def test_the_c_example_is_short_and_complete():
    src = _c_source()
    assert len(src.splitlines()) <= gb.C_EXAMPLE_MAX_LINES
    assert "int main(" in src and "#include" in src


def _extract(npz: Path, dest: Path) -> None:
    if shutil.which("unzip"):
        subprocess.run(["unzip", "-q", "-o", str(npz), "-d", str(dest)], check=True)
    else:
        with zipfile.ZipFile(npz) as zf:
            zf.extractall(dest)


def _judge_c(exe: Path, case_dir: Path, out: str, cand: Path, row: int = 0):
    r = subprocess.run([str(exe), str(case_dir), out, str(cand), str(ORACLES / "manifest.json"), str(row)],
                       capture_output=True, text=True, timeout=60)
    figs = {}
    m = re.match(r"(\w+): err (\S+) baseline (\S+) ratio (\S+) allowed (\S+) budget_ulps (\S+) "
                 r"bound (\S+) nonfinite (\d+): (PASS|FAIL)", r.stdout)
    if m:
        figs = dict(zip(("err", "baseline", "ratio", "allowed", "budget_ulps", "bound"),
                        map(float, m.groups()[1:7])))
        figs["verdict"] = m.group(9)
    return r.returncode, figs, r.stdout + r.stderr


def test_the_c_example_compiles_and_judges_like_the_rule(tmp_path):
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) on this machine")
    src = tmp_path / "judge.c"
    src.write_text(_c_source())
    exe = tmp_path / "judge"
    subprocess.run([cc, "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-o", str(exe), str(src), "-lm"],
                   check=True, capture_output=True, text=True)
    t = tol("golden_rule_figures")
    runs = 0
    for name, outs in (("edge_scale-float32", ("o", "dlog_alpha", "dh0")),
                       ("regime_strong_decay-bfloat16", ("dq", "h_T")),
                       ("seed_g2h4_dk48_dv40-float32", ("dv",)), ("edge_T0-float32", ("o", "h_T"))):
        c = golden.load(name)
        case_dir = tmp_path / name
        _extract(ORACLES / c.meta["file"], case_dir)
        chunked = _reference_run(c, "chunked")
        for out in outs:
            # a correct kernel (saved as float32, as a kernel's test would), with row 0 and 2
            cand = tmp_path / f"{name}_{out}.npy"
            np.save(cand, chunked[out].astype(np.float32))
            for row in (0, 2):
                code, figs, text = _judge_c(exe, case_dir, out, cand, row)
                want = readme_rule(c, out, chunked[out], row)
                assert code == 0 and figs["verdict"] == "PASS", text
                for k in ("err", "baseline", "ratio", "budget_ulps", "bound"):
                    assert math.isclose(figs[k], want[k], rel_tol=t, abs_tol=0), (name, out, k, text)
                assert figs["allowed"] == MANIFEST["verdict"]["calibrated_ratio"]
                runs += 1
            if c[out].size:
                # a wrong one (float64 .npy): 2 R times the baseline, spread evenly, and one NaN
                i = OUTPUTS.index(out)
                bad = c[out] + (2 * MANIFEST["verdict"]["calibrated_ratio"] * c["baseline_err"][0, i]
                                / math.sqrt(c[out].size))
                np.save(cand, bad)
                code, figs, text = _judge_c(exe, case_dir, out, cand)
                assert code == 1 and figs["verdict"] == "FAIL" and not readme_rule(c, out, bad)["ok"], text
                bad = c[out].copy()
                bad.flat[0] = np.nan
                np.save(cand, bad)
                code, figs, text = _judge_c(exe, case_dir, out, cand)
                assert code == 1 and "nonfinite 1: FAIL" in text, text
    assert runs == 16
    code, _, text = _judge_c(exe, tmp_path / "edge_scale-float32", "q", cand)
    assert code == 2 and "OUTPUT must be" in text
    np.save(cand, np.zeros(3))
    code, _, text = _judge_c(exe, tmp_path / "edge_scale-float32", "o", cand)
    assert code == 2 and "wrong number of elements" in text


# ------------------------------------------------------------------------------ mpmath

def test_manifest_mpmath_figures_are_within_the_trust_tolerances():
    n = 0
    for name in golden.cases():
        spec, _ = gb.all_cases()[name]
        c = golden.load(name)
        assert gb._check_mpmath_entry(spec, c.meta["mpmath"], c.arrays) is None, name
        m = c.meta["mpmath"]
        if m is not None:
            n += 1
            assert m["dps"] == 50 and set(m["scaled"]) == set(c.outputs)
            assert max(m["scale_rel"].values()) <= m["tolerance_value"], name
    assert n == sum(gb.mpmath_tolerance(s.dims) is not None for s, _ in gb.all_cases().values())
    assert n >= len(golden.cases()) // 2


@pytest.mark.parametrize("name", ["edge_scale-float32", "regime_ragged_T1-bfloat16", "edge_G2_H6-bfloat16"])
def test_manifest_mpmath_figures_recompute_exactly(name):
    pytest.importorskip("mpmath")
    spec, _ = gb.all_cases()[name]
    c = golden.load(name)
    assert gb.mpmath_figures(spec, c.arrays) == MANIFEST["cases"][name]["mpmath"]


def test_mpmath_figures_see_a_wrong_stored_value():
    pytest.importorskip("mpmath")
    name = "edge_scale-float32"
    spec, _ = gb.all_cases()[name]
    arrays = dict(golden.load(name).arrays)
    arrays["dk"] = arrays["dk"] * (1 + 1e-9)
    m = gb.mpmath_figures(spec, arrays)
    assert m["scaled"]["dk"] > 1e3 * m["tolerance_value"] and m["scaled"]["o"] <= m["tolerance_value"]


# ------------------------------------------------------------------------------ the wheel

def test_pyproject_lists_every_package():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = sorted(".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "glaref").rglob("__init__.py"))
    assert sorted(p for p in cfg["packages"] if p != "glaref.oracles") == found
    assert cfg["package-dir"] == {"glaref.oracles": "oracles"}


def test_wheel_carries_the_golden_vectors(tmp_path):
    """Builds the wheel from a copy of the source tree (about 10 s) and loads a case from an
    install of it, with the repository out of sight."""
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 64:
        pytest.skip(f"setuptools {setuptools.__version__} < 64 cannot build this project offline")
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src)
    shutil.copytree(ROOT / "glaref", src / "glaref", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ORACLES, src / "oracles")
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(dist)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = dist.glob("glaref-*.whl")
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
    want = {f"glaref/oracles/{e['file']}" for e in MANIFEST["cases"].values()}
    want |= {"glaref/oracles/manifest.json", "glaref/oracles/README.md", "glaref/golden.py",
             "glaref/_audit/__init__.py", "glaref/gla/__init__.py", "glaref/kernels/__init__.py",
             "glaref/conventions/__init__.py"}
    assert want <= names, sorted(want - names)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                        str(whl)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    probe = ("import json, glaref, glaref.golden as g; c = g.load(g.cases()[-1]); "
             "print(json.dumps([glaref.__file__, str(g.default_root()), len(g.cases()), c.name]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    file, root, n, last = json.loads(r.stdout.strip().splitlines()[-1])
    assert file == str(site / "glaref" / "__init__.py") and root == str(site / "glaref" / "oracles")
    assert n == len(MANIFEST["cases"]) and last == list(MANIFEST["cases"])[-1]


# ------------------------------------------------------------------------------ the README

def test_readme_documents_every_array_and_lists_every_case():
    text = README.read_text()
    for a in golden.ARRAYS:
        generic = a.startswith("scale_") and a[6:] in OUTPUTS and "`scale_<output>`" in text
        assert f"`{a}`" in text or generic, a
    for row in gb.case_table():
        assert row in text, row
    assert f"{len(MANIFEST['cases'])} canonical cases" in text
    mb = MANIFEST["total_bytes"] / 1e6
    assert f"Total {mb:.1f} MB" in text
    top = (ROOT / "docs" / "golden.md").read_text()   # moved from README.md (issue 23)
    assert f"holds the truth of {len(MANIFEST['cases'])} canonical cases as data ({mb:.1f} MB" in top


@pytest.mark.jax
def test_the_jax_kernels_pass_and_a_wrong_one_fails_on_the_golden_cases():
    """End to end as a downstream suite would: glaref's JAX chunked kernel fed the stored inputs
    in the case's dtype, judged by the README rule; a kernel that drops one decay step fails."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from glaref import kernels

    for name in ("regime_h0_dominant-bfloat16", "edge_G2_H6-float32"):
        c = golden.load(name)
        dt = jnp.dtype(c.meta["dtype"])
        args = [jnp.asarray(c[a], dt) for a in GRADS]

        def run(f):
            (o, h_T), pull = jax.vjp(  # noqa: B023 - called in this iteration
                lambda *a: f(*a, scale=float(c["scale"]), return_final_state=True), *args)  # noqa: B023
            g = pull((jnp.asarray(c["do"], o.dtype), jnp.asarray(c["dh_T"], h_T.dtype)))  # noqa: B023
            return dict(zip(OUTPUTS, (o, h_T, *g)))

        for o, x in run(kernels.chunked).items():
            verdict = readme_rule(c, o, np.asarray(x, np.float64))
            assert verdict["ok"], (name, o, verdict)

    def wrong(q, k, v, la, h0, **kw):      # the first step's decay forgotten
        return kernels.chunked(q, k, v, la.at[:, :, 0].set(0), h0, **kw)
    bad = run(wrong)                       # on the last case
    assert not readme_rule(c, "o", np.asarray(bad["o"], np.float64))["ok"]
    assert not readme_rule(c, "dlog_alpha", np.asarray(bad["dlog_alpha"], np.float64))["ok"]
