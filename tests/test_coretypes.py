"""The golden checks and one audit row under three OpenBLAS CPU kernels: the same verdicts and the
same reference errors whichever kernel a machine's OpenBLAS picks.

OpenBLAS chooses its kernels for the CPU when it loads; ``OPENBLAS_CORETYPE`` forces a choice:
Haswell (AVX2 and FMA), SkylakeX (AVX-512) and Prescott (SSE3, the generic x86-64 one). Each runs
in its own subprocess, which reports

* ``glaref oracles verify`` on a few golden cases (exit code and output): the float64 oracle's
  last bits move with the BLAS kernel, and verify compares values within "golden_recompute"
  (glaref/tolerances.py), so it passes, with no note about bytes;
* the figures of glaref's same-precision reference kernels on those cases against the *stored*
  float64 truth, which is the same file on every machine: the bits of the kernels' outputs and
  their normwise errors (summed with math.fsum). The reference kernels compute in a fixed order
  without BLAS (glaref/gla/_baseline.py), so these must be identical, not close;
* one row of ``glaref audit`` (a built-in JAX kernel, float32, JSON record): its verdict, and
  its reference errors as the report prints them (three significant digits). These are measured
  against the truth recomputed on the subprocess's BLAS, whose last bits move (a relative change
  near 1e-16 of the truth against errors near 1e-7), so the figures agree, not their last bits.

SkylakeX kernels need AVX-512: on a CPU without ``avx512f`` OpenBLAS dies with "Illegal
instruction", so that coretype is skipped there, saying so. About a minute on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORETYPES = ("Haswell", "SkylakeX", "Prescott")
# float32 and bfloat16, a regime whose float32 reference error once depended on the BLAS kernel
# (regime_near_one-float32: 0.64 against 0.70 under SkylakeX), h0 absent, a seed config
CASES = ["regime_near_one-float32", "regime_strong_decay-bfloat16", "edge_h0_absent-float32",
         "seed_g2h4_dk48_dv40-bfloat16"]
AUDIT = ["--impl", "chunked", "--config", "g2h4_dk32_dv24", "--seq", "70", "--mode", "fwd_bwd",
         "--regime", "standard", "--repeats", "0", "--no-progress"]

SCRIPT = textwrap.dedent("""
    import contextlib, hashlib, io, json, math, sys
    import numpy as np
    from glaref.gla import _baseline, _golden as gb
    from glaref._audit import _verdict
    from glaref import golden
    from glaref.cli import main
    from glaref.gla._designs import DESIGNS
    from glaref._inputs import Dims, Problem

    cases, audit_args, json_path = json.loads(sys.argv[1])
    out = {}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        out["verify_rc"] = main(["oracles", "verify"] + [x for c in cases for x in ("--case", c)])
    out["verify_out"] = buf.getvalue()
    out["ref"] = {}
    for name in cases:
        c = golden.load(name)
        d = Dims(**c.meta["dims"])
        p = Problem(c["q"], c["k"], c["v"], c["log_alpha"],
                    c["h0"] if "h0" in c else np.zeros((d.B, d.H, d.dk, d.dv)), c["do"],
                    c["dh_T"] if "dh_T" in c else None, d)
        dtype = c.meta["dtype"]
        arith = _verdict.reference_arithmetic(dtype, gb.ACCUMULATE[dtype])
        for kern in golden.REFERENCE_KERNELS:
            design = DESIGNS[kern]
            chunk = {} if design.chunk is None else {"chunk": design.chunk}
            r = _baseline.run(design.kernel, p, float(c["scale"]), **arith, **chunk)
            for o, g in zip(golden.OUTPUTS, golden.GLAREF_NAMES):
                if o in c:
                    x = np.ascontiguousarray(_baseline.round_to(r[g], dtype), dtype="<f8")
                    d = (x - c[o]).ravel()
                    out["ref"][f"{name} {kern} {o}"] = [hashlib.sha256(x.tobytes()).hexdigest(),
                                                       math.sqrt(math.fsum(d * d))]
    with contextlib.redirect_stdout(io.StringIO()):
        out["audit_rc"] = main(["audit"] + audit_args + ["--json", json_path])
    import threadpoolctl
    out["blas"] = sorted({i.get("architecture") or "?" for i in threadpoolctl.threadpool_info()
                          if i.get("user_api") == "blas"})
    out["blas_api"] = sorted({i.get("internal_api") for i in threadpoolctl.threadpool_info()
                              if i.get("user_api") == "blas"})
    print(json.dumps(out))
""")


def _has_avx512f() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def _run(coretype: str, tmp_path: Path) -> dict:
    env = dict(os.environ, OPENBLAS_CORETYPE=coretype, PYTHONPATH=str(ROOT))
    path = tmp_path / f"audit_{coretype}.json"
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([CASES, AUDIT, str(path)])],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"OPENBLAS_CORETYPE={coretype}: {r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["records"] = json.loads(path.read_text())["results"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        pytest.skip("OPENBLAS_CORETYPE names x86-64 kernels")
    tmp = tmp_path_factory.mktemp("coretypes")
    out = {}
    for ct in CORETYPES:
        if ct == "SkylakeX" and not _has_avx512f():
            continue
        out[ct] = _run(ct, tmp)
    if any("openblas" not in r["blas_api"] for r in out.values()):
        pytest.skip(f"numpy's or SciPy's BLAS is not OpenBLAS ({out['Haswell']['blas_api']}): "
                    "OPENBLAS_CORETYPE does not apply")
    return out


@pytest.mark.parametrize("coretype", CORETYPES)
def test_golden_checks_pass_on_each_blas_kernel(runs, coretype):
    if coretype not in runs:
        pytest.skip("SkylakeX: this CPU has no AVX-512 (no avx512f in /proc/cpuinfo), where "
                    "OpenBLAS's SkylakeX kernels die with 'Illegal instruction'")
    r = runs[coretype]
    assert len(set(x["blas"][0] for x in runs.values())) == len(runs), \
        f"OPENBLAS_CORETYPE did not change OpenBLAS's kernels: {[x['blas'] for x in runs.values()]}"
    assert r["verify_rc"] == 0, r["verify_out"]
    assert "note:" not in r["verify_out"] and "bytes" not in r["verify_out"], r["verify_out"]
    assert r["audit_rc"] == 0 and all(x["ok"] is True for x in r["records"]), r["records"]


def test_same_reference_errors_on_every_blas_kernel(runs):
    # against the stored truth (one file for all): identical bits and identical errors
    first, *others = runs
    for ct in others:
        for key, (sha, err) in runs[first]["ref"].items():
            assert runs[ct]["ref"][key] == [sha, err], (f"{key}: {first} {runs[first]['ref'][key]} "
                                                        f"vs {ct} {runs[ct]['ref'][key]}")


def test_same_audit_verdicts_on_every_blas_kernel(runs):
    # against the truth recomputed on each BLAS: the same verdict and the same printed figures
    first, *others = runs
    a = runs[first]["records"]
    for ct in others:
        b = runs[ct]["records"]
        assert len(a) == len(b)
        for ra, rb in zip(a, b):
            assert (ra["ok"], ra.get("failed_tier")) == (rb["ok"], rb.get("failed_tier")), (ct, ra, rb)
            shown = {n: f"{e:.3g}" for n, e in ra["reference_rel_err"].items()}
            assert shown == {n: f"{e:.3g}" for n, e in rb["reference_rel_err"].items()}, (ct, ra, rb)
