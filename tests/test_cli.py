"""``glaref audit`` on the command line: exit codes, table, JSON, plot, the GPU script on CPU.

Most runs call ``glaref.cli.main(argv)`` in-process (jax is imported once); one runs
``python -m glaref`` in a subprocess, and one runs tools/gpu_audit.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")

from glaref.cli import main  # noqa: E402

pytestmark = pytest.mark.jax

ROOT = Path(__file__).resolve().parents[1]
KERNELS = Path(__file__).resolve().parent / "audit_kernels.py"
TINY = ["--config", "1,1,2,8,4", "--seq", "9", "--repeats", "1", "--oracle", "numpy",
        "--regime", "standard"]


def run(capsys, *args):
    code = main(["audit", *args])
    out, err = capsys.readouterr()
    return code, out, err


def kernel(name: str) -> str:
    return f"{KERNELS}:{name}"


def row_name(name: str) -> str:
    """How the table names ``kernel(name)``: the file's stem and the function."""
    return f"audit_kernels:{name} "


def test_exit_0_prints_the_table_and_writes_the_json(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, out, err = run(capsys, "--impl", kernel("scan_kernel_final"), *TINY, "--json", str(out_json))
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["impl", "mode", "config", "T"]
    rows = [ln for ln in lines if ln.startswith(row_name("scan_kernel_final"))]
    assert len(rows) == 2 and all(ln.rstrip().endswith("ok") for ln in rows)
    assert any(ln.startswith("OK: 2 rows within 6x the reference kernels' error and the proven bound")
               for ln in lines)
    assert "x_ref: the largest ratio" in out              # the legend under the table
    doc = json.loads(out_json.read_text())
    assert [r["mode"] for r in doc["results"]] == ["fwd", "fwd_bwd"]
    # a file-path kernel: its file's stem and function in the table, the full name in the JSON
    assert lines[0].index(" mode ") == len("audit_kernels:scan_kernel_final"), lines[0]
    assert {r["impl"] for r in doc["results"]} == {kernel("scan_kernel_final")}
    assert doc["config"]["configs"] == {"b1g1h2_dk8_dv4": [1, 1, 2, 8, 4]}
    # progress on stderr, one line per row, even when stderr is not a terminal
    assert [ln.split()[0] for ln in err.splitlines()] == ["[1/2]", "[2/2]"], err


def test_long_kernel_names_are_shortened_to_a_capped_width():
    from glaref._audit._report import IMPL_WIDTH, short_name

    assert short_name("/a/b/my_kernels.py:fused_fwd") == "my_kernels:fused_fwd"
    assert short_name("chunked") == "chunked" and short_name("pkg.mod:fn") == "pkg.mod:fn"
    long = "a_module_with_a_long_name:" + "f" * IMPL_WIDTH
    assert len(short_name(long)) == IMPL_WIDTH and short_name(long).startswith("...")
    assert short_name(long).endswith("f" * 20)


def test_a_missing_kernel_is_a_usage_error_listing_what_the_module_defines(capsys):
    code, _, err = run(capsys, "--impl", "glaref.kernels:nosuch", *TINY)
    assert code == 2
    assert ("--impl: module 'glaref.kernels' has no attribute 'nosuch'; the callables it defines: "
            "chunked, dlog_alpha_form, scan") in err, err     # its __all__, re-exported kernels too
    code, _, err = run(capsys, "--impl", kernel("nosuch"), *TINY)
    assert code == 2 and "the callables it defines: bf16_only_kernel, bool_kernel," in err, err


def test_exit_1_for_a_wrong_kernel_and_exit_zero_overrides(capsys):
    code, out, _ = run(capsys, "--impl", kernel("wrong_kernel"), *TINY, "--mode", "fwd")
    assert code == 1
    assert "FAIL: 1 of 1 rows" in out and "o: beyond any correct kernel: budget_ulps" in out
    row = [ln for ln in out.splitlines() if ln.startswith(row_name("wrong_kernel"))][0]
    assert row.rstrip().endswith("FAIL o:proven")   # the table names the failing outputs and tier
    code, _, _ = run(capsys, "--impl", kernel("wrong_kernel"), *TINY, "--mode", "fwd", "--exit-zero")
    assert code == 0


def test_exit_1_for_a_nan_kernel_without_crashing(capsys):
    code, out, _ = run(capsys, "--impl", kernel("nan_kernel_bthd"), "--layout", "bthd", *TINY)
    assert code == 1
    assert "o: 2 non-finite value(s), first at (0, 5, 1, 0)" in out
    # under each row, numpy.testing's count of the failing output's elements, indexed as the
    # kernel's own "bthd" arrays are (NaN at o[0, 5, 1, 0] and o[0, 6, 1, 2])
    assert ("\n  o: mismatched elements: 2 / 72 (2.78%) beyond the proven bound of ") in out, out
    assert "budget units; worst inf at (0, 5, 1, 0) (bthd)\n" in out, out
    # no finite figure on a row with non-finite outputs: x_ref and proven say nan
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(row_name("nan_kernel_bthd"))]
    assert rows and all(row[-4:-2] == ["nan(o)", "nan"] for row in rows), rows


def test_a_raising_kernel_is_a_failed_row_beside_a_passing_one(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, out, _ = run(capsys, "--impl", f"{kernel('raising_kernel')},{kernel('scan_kernel')}",
                       "--config", "1,1,2,8,4", "--seq", "20", "--repeats", "1", "--oracle",
                       "numpy", "--mode", "fwd", "--regime", "standard", "--json", str(out_json))
    assert code == 1
    row = [ln for ln in out.splitlines() if ln.startswith(row_name("raising_kernel"))][0]
    assert row.endswith("FAIL: kernel raised ValueError: unsupported shape: T=20"), row
    assert "FAIL: 1 of 2 rows fail the verdict" in out and "skipped" not in out
    # in the JSON too a failure, never keyed "skipped" (the seed's key for rows glaref declines)
    raised = json.loads(out_json.read_text())["results"][0]
    assert raised["ok"] is False and "skipped" not in raised, raised
    assert raised["error"] == "kernel raised ValueError: unsupported shape: T=20", raised
    assert "Traceback" in raised["traceback"], raised


@pytest.mark.parametrize("args", [
    ["--no-such-flag"], ["--mode", "backward"], ["--config", "1,2,3"], ["--config", "nope"],
    ["--preset", "huge"], ["--impl", "missing_file.py:f"], ["--dtype", "int8"], ["--seq", "x"],
    ["--repeats", "two"], ["--repeats", "-1"], ["--chunk-size", "0"],
    ["--accumulate-dtype", "int8"], ["--accumulate-dtype", "bfloat16"],
])
def test_exit_2_for_usage_errors_with_one_line_reason(capsys, args):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert "error:" in err.splitlines()[-1]
    assert out == ""                      # no table header before a refusal


def test_repeats_0_chunk_size_and_accumulate_dtype_reach_the_engine(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code, out, err = run(capsys, "--impl", kernel("bf16_only_kernel"), "--config", "1,1,2,8,4",
                         "--seq", "9", "--mode", "fwd", "--repeats", "0", "--oracle", "numpy",
                         "--dtype", "bfloat16", "--chunk-size", "1", "--accumulate-dtype", "float32",
                         "--regime", "standard", "--json", str(out_json))
    assert code == 0, out + err
    (r,) = json.loads(out_json.read_text())["results"]
    assert r["chunk_size"] == 1 and r["accumulate_dtype"] == "float32" and r["median_ms"] is None
    assert r["budget_bound"]["o"] is not None        # finite (JSON null would mean infinite)


def test_exit_2_without_a_command(capsys):
    assert main([]) == 2
    assert "a command is required" in capsys.readouterr().err


def test_exit_3_when_the_backend_is_missing(capsys):
    import jax
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    code, out, err = run(capsys, *TINY, "--backend", "gpu")
    assert code == 3 and out == ""
    assert err.startswith("glaref audit: error: --backend 'gpu' is not available here")


def test_python_dash_m_glaref_is_the_same_command():
    import jax
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, "-m", "glaref", "audit", "--backend", "gpu"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 3
    assert len(r.stderr.strip().splitlines()) == 1 and "not available" in r.stderr


def test_plot_is_written(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "audit.png"
    code, out, _ = run(capsys, "--impl", f"{kernel('scan_kernel_final')},{kernel('custom_vjp_kernel')}",
                       "--config", "1,1,2,8,4", "--seq", "9,17", "--repeats", "1", "--oracle", "numpy",
                       "--plot", str(png))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.slow      # ~75 s on two cores: two full audits through the shell script
def test_gpu_audit_script_runs_both_precisions_on_cpu(tmp_path):
    # DELTA=0: the script's delta part takes delta kernels (--impl here is a scalar-gate one)
    env = {**os.environ, "BACKEND": "cpu", "OUTDIR": str(tmp_path), "PYTHON": sys.executable,
           "DELTA": "0"}
    r = subprocess.run(["bash", str(ROOT / "tools" / "gpu_audit.sh"), "--impl", kernel("scan_kernel"),
                        *TINY, "--mode", "fwd"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for precision in ("default", "highest"):
        doc = json.loads((tmp_path / f"cpu_{precision}.json").read_text())
        assert doc["config"]["precision"] == precision
        assert doc["device"]["matmul_precision"] == precision and doc["device"]["backend"] == "cpu"
        assert len(doc["results"]) == 1 and doc["results"][0]["ok"]


def test_bench_grid_prints_same_run_ratios_beside_the_seeds(tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_grid", ROOT / "tools" / "bench_grid.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def row(impl, ms, resid=None):
        r = {"impl": impl, "mode": "fwd_bwd", "config": "g1h1_d128", "seq": 512, "median_ms": ms,
             "xla_temp_mb": 3.0, "rel_err": 1e-7}
        if resid is not None:
            r["residual_mb"] = resid
        return r

    ours = tmp_path / "ours.json"
    seed = tmp_path / "seed.json"
    ours.write_text(json.dumps({"results": [row("chunked", 10.0, 0.0), row("scan", 40.0, 259.0)]}))
    seed.write_text(json.dumps({"results": [row("chunked", 20.0, 0.0), row("scan", 40.0, 250.0)]}))
    assert bench.main(["--from-json", str(ours), "--seed-json", str(seed)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("g1h1_d128")][0]
    cells = line.replace("|", " ").split()
    # ours 10/40, the seed's 20/40; scan residuals 259 (ours) beside 250 (seed)
    assert cells[3:6] == ["10.00", "40.00", "0.250"] and cells[6:9] == ["20.00", "40.00", "0.500"]
    assert cells[11:13] == ["259.0", "250.0"]


@pytest.mark.parametrize("flag", ["--no-progress", "--quiet"])
def test_progress_goes_to_stderr_and_can_be_switched_off(capsys, flag):
    code, out, err = run(capsys, "--impl", kernel("scan_kernel"), *TINY, "--mode", "fwd")
    assert code == 0
    assert err.startswith("[1/1] ") and "T=9" in err and "[1/1]" not in out
    code, out, err = run(capsys, "--impl", kernel("scan_kernel"), *TINY, "--mode", "fwd", flag)
    assert code == 0 and err == "" and "OK: 1 rows" in out


def test_importing_the_cli_and_engine_loads_no_jax():
    r = subprocess.run([sys.executable, "-c", "import sys, glaref, glaref.cli, "
                        "glaref._audit._engine; glaref.audit; "
                        "print(sorted(m for m in ('jax', 'numba', 'matplotlib', 'torch') "
                        "if m in sys.modules))"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


# ---------------------------------------------------------------- through a subprocess (issues 10, 17)

def cli(*args, cwd=ROOT, timeout=180, script=None):
    """``python -m glaref audit ...`` (or ``python script audit ...``) in a fresh process:
    (exit code, stdout, stderr). stderr is a pipe, not a terminal."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    head = [sys.executable, str(script)] if script else [sys.executable, "-m", "glaref"]
    r = subprocess.run([*head, "audit", *args], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def _one_line_error(err: str, start: str) -> None:
    __tracebackhide__ = True
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(start), err


@pytest.mark.parametrize("args, start", [
    (["--seed", "-1"], "glaref audit: error: --seed: got -1, expected an integer >= 0"),
    (["--config", "1,2,3,4,x"], "glaref audit: error: --config '1,2,3,4,x': got 'x' as dv"),
    (["--chunk-size", "0", "--impl", "m:f"],
     "glaref audit: error: --chunk-size: got 0, expected a positive integer"),
    (["--impl", "chunked", "--chunk-size", "16"], "glaref audit: error: --chunk-size: got 16, but it "
                                                  "describes user kernels"),
    (["--scale", "1e400"], "glaref audit: error: --scale: got inf, expected a finite number"),
    (["--json", "."], "glaref audit: error: --json: got '.', which is a directory"),
    (["--json", "/proc/version"], "glaref audit: error: --json: cannot write '/proc/version'"),
    (["--plot", "."], "glaref audit: error: --plot: got '.', which is a directory"),
    (["--plot", "r.txt"], "glaref audit: error: --plot: got 'r.txt', expected a file name ending in .png"),
    (["--plot", "report"], "glaref audit: error: --plot: got 'report', expected a file name ending in"),
    (["--preset", "nope"], "glaref audit: error: argument --preset: invalid choice: 'nope'"),
    (["--impl", f"{KERNELS}:not_a_kernel"], "glaref audit: error: --impl: "),
])
def test_usage_errors_exit_2_with_one_line_before_any_work(args, start):
    code, out, err = cli(*TINY, *args)
    assert code == 2, (out, err)
    _one_line_error(err, start)
    assert out == ""                          # nothing measured, no table
    if "--chunk-size" in args:
        assert "None" not in err
    if "--preset" in args:                    # the audit's usage, not the top-level one
        assert err.startswith("usage: glaref audit ")


@pytest.mark.parametrize("args", [
    ["--config", "64,8,64,128,128", "--seq", "100000", "--mode", "fwd"],
    ["--seq", "1000000000000"],
    ["--seq", "1" + "0" * 30],
    ["--config", "100000000000,1,1,8,8", "--seq", "9"],
])
def test_rows_too_large_for_the_oracle_are_skipped_with_their_reason_and_exit_3(args):
    code, out, err = cli("--impl", kernel("scan_kernel"), "--oracle", "numpy", "--repeats", "1",
                         *(TINY[:2] if "--config" not in args else []), *args, timeout=120)
    assert code == 3, (out, err)
    assert "Traceback" not in err
    rows = [ln for ln in out.splitlines() if ln.startswith(row_name("scan_kernel"))]
    assert rows and all("skipped: the oracle needs about" in ln and "GiB of host memory" in ln
                        for ln in rows), out
    assert out.splitlines()[-1].startswith("INCOMPLETE: 0 rows within "), out


def test_failing_kernels_exit_1_each_row_failed_and_progress_on_stderr(tmp_path):
    out_json = tmp_path / "new" / "dir" / "r.json"     # missing directories are created
    code, out, err = cli("--impl", f"{kernel('memory_error_kernel')},{kernel('exiting_kernel')}",
                         "--config", "1,1,2,8,4", "--seq", "9,20", "--mode", "fwd", "--repeats", "1",
                         "--oracle", "numpy", "--regime", "standard", "--json", str(out_json))
    assert code == 1, (out, err)
    assert "Traceback" not in err
    rows = {(ln.split()[0].rsplit(":", 1)[1], ln.split()[3]): ln for ln in out.splitlines()
            if ln.startswith("audit_kernels:")}
    assert rows[("memory_error_kernel", "9")].endswith("ok")
    assert rows[("memory_error_kernel", "20")].endswith(
        "FAIL: kernel raised MemoryError: cannot allocate the states for T=20")
    assert all(rows[("exiting_kernel", T)].endswith("FAIL: kernel raised SystemExit (sys.exit(7))")
               for T in ("9", "20"))
    assert "FAIL: 3 of 4 rows fail the verdict" in out and "skipped" not in out
    # one progress line per row on stderr, although it is not a terminal
    assert [ln.split()[0] for ln in err.splitlines()] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], err
    assert [r["ok"] for r in json.loads(out_json.read_text())["results"]] == [True, False, False, False]


def test_the_console_script_imports_sibling_modules_of_a_kernel_file(tmp_path):
    # as the installed `glaref` script runs: sys.path[0] is the script's own directory, and the
    # current directory is not on sys.path (python -m would put it there)
    bindir, kdir = tmp_path / "bin", tmp_path / "kdir"
    bindir.mkdir()
    kdir.mkdir()
    script = bindir / "glaref"
    script.write_text("import sys\nfrom glaref.cli import main\nsys.exit(main())\n")
    (kdir / "glaref_sibling_helper.py").write_text(
        f"import sys\nsys.path.insert(0, {str(KERNELS.parent)!r})\n"
        "from audit_kernels import scan_kernel as kernel\n")
    (kdir / "kernel.py").write_text("from glaref_sibling_helper import kernel\n")
    code, out, err = cli("--impl", "kdir/kernel.py:kernel", *TINY, "--mode", "fwd", cwd=tmp_path,
                         script=script)
    assert code == 0, (out, err)
    assert "OK: 1 rows within " in out


def test_plot_checks_matplotlib_before_measuring(tmp_path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        code, out, err = cli(*TINY, "--plot", str(tmp_path / "missing_dir" / "x.png"))
        assert code == 3 and out == "" and not (tmp_path / "missing_dir").exists()
        _one_line_error(err, "glaref audit: error: --plot needs matplotlib")
        return
    png = tmp_path / "missing_dir" / "x.png"
    code, out, err = cli("--impl", kernel("scan_kernel"), *TINY, "--mode", "fwd", "--plot", str(png))
    assert code == 0, (out, err)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot written to {png}" in out


def test_a_kernel_module_that_calls_sys_exit_on_import_is_reported_not_obeyed(tmp_path):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(7)\n")
    code, out, err = cli("--impl", f"{tmp_path / 'exits.py'}:fn", *TINY)
    assert code == 2 and out == "", (code, out, err)
    _one_line_error(err, "glaref audit: error: --impl: importing ")
    assert err.rstrip().endswith("exits.py' failed: it called sys.exit(7)"), err


def test_a_kernel_whose_backward_raises_exits_1_with_its_row_failed():
    # issue 10: NotImplementedError in a custom_vjp's backward was "skipped" and the run exited 0
    code, out, err = cli("--impl", kernel("no_backward_kernel"), *TINY)
    assert code == 1, (out, err)
    assert "Traceback" not in err
    rows = [ln for ln in out.splitlines() if ln.startswith(row_name("no_backward_kernel"))]
    assert rows[0].split()[1] == "fwd" and rows[0].endswith("  ok"), rows
    assert rows[1].split()[1] == "fwd_bwd" and rows[1].endswith(
        "FAIL: kernel raised NotImplementedError: backward not written yet"), rows
    assert out.splitlines()[-1].startswith("FAIL: 1 of 2 rows fail the verdict (first: ")
    assert "skipped" not in out
