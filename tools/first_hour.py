"""A kernel author's first minutes, timed: the first ``glaref.forward``, the first ``glaref.vjp``
and the first default ``glaref audit``, each with a cold Numba cache and then a warm one.

    python3 tools/first_hour.py                       # this checkout; writes the report below
    python3 tools/first_hour.py --tree /tmp/before --label before --out /tmp/before.txt

Every measurement runs in a fresh subprocess (``PYTHONPATH`` = the tree measured) with a fresh,
empty cache folder (``GLAREF_CACHE_DIR`` and ``NUMBA_CACHE_DIR`` both point into it, so that a
tree that predates ``GLAREF_CACHE_DIR`` is measured cold too); the warm run repeats the same
command with the folder the cold run filled. Times are wall seconds: the call itself (from after
``import glaref`` to its return), the whole process, and for the audit the silence before its
first line on stderr; beside them the process's CPU seconds (user + system), which the load
does not inflate. The load average is recorded beside every figure, since the compiler shares
the CPU with whatever else runs. The report goes to docs/reports/first_hour_cpu.txt between the
markers below; text outside them (the dependency-bounds section) is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BEGIN = "# ---- tools/first_hour.py: begin (regenerated; edit outside the markers) ----"
END = "# ---- tools/first_hour.py: end ----"

# The first call a new user makes: a small problem (its size hardly matters next to compiling).
CALL = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import glaref
t1 = time.perf_counter()
rng = np.random.default_rng(0)
B, H, T, d = 1, 2, 64, 16
q, k, v, do = (rng.standard_normal((B, H, T, d)) for _ in range(4))
log_alpha = -np.abs(rng.standard_normal((B, H, T)))
h0 = np.zeros((B, H, d, d))
if sys.argv[1] == "forward":
    glaref.forward(q, k, v, log_alpha, h0)
else:
    glaref.vjp(q, k, v, log_alpha, h0, do)
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "call_s": t2 - t1}))
"""


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _env(tree: str, cache: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = tree
    env["GLAREF_CACHE_DIR"] = cache
    env["NUMBA_CACHE_DIR"] = os.path.join(cache, "numba_env")
    return env


def time_call(tree: str, what: str, cache: str) -> dict:
    """One process making the first ``what`` call; its figures, its stderr, the load before."""
    before = load()
    c = _child_cpu()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CALL, what], env=_env(tree, cache), cwd=tree,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"first_hour: {what} failed (exit {r.returncode}):\n{r.stderr}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out.update(process_s=wall, cpu_s=_child_cpu() - c, load=before, stderr=r.stderr.strip())
    return out


def time_audit(tree: str, cache: str, args: list[str]) -> dict:
    """``python -m glaref audit ARGS``: wall time, exit code, seconds before its first stderr
    line (and that line)."""
    before = load()
    c = _child_cpu()
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "glaref", "audit", *args], env=_env(tree, cache),
                         cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: list = []
    err: list[str] = []

    def read_err():
        for line in p.stderr:
            if not first:
                first.append((time.perf_counter() - t, line.rstrip()))
            err.append(line)

    reader = threading.Thread(target=read_err)
    reader.start()
    stdout = p.stdout.read()
    p.wait()
    reader.join()
    wall = time.perf_counter() - t
    lines = stdout.strip().splitlines()
    return {"process_s": wall, "cpu_s": _child_cpu() - c, "rc": p.returncode, "load": before,
            "first_stderr_s": first[0][0] if first else None,
            "first_stderr": first[0][1] if first else None,
            "last_stdout": lines[-1] if lines else "", "stderr_lines": len(err)}


def machine() -> list[str]:
    import numba
    import numpy

    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return [f"machine: {platform.machine()}, {os.cpu_count()} cores ({model}), "
            f"python {platform.python_version()}, numpy {numpy.__version__}, "
            f"numba {numba.__version__}",
            f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}"]


def run(tree: str, label: str, audit_args: list[str], skip_audit: bool) -> list[str]:
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out = [f"{label}: tree {tree}", *machine(), f"start: {start}, {load()}", ""]
    for what in ("forward", "vjp"):
        cache = tempfile.mkdtemp(prefix="glaref-first-hour-")
        try:
            for state in ("cold", "warm"):
                r = time_call(tree, what, cache)
                out.append(f"first glaref.{what:<7} {state}: call {r['call_s']:6.2f} s  (import glaref "
                           f"{r['import_s']:.2f} s, whole process {r['process_s']:6.2f} s wall, "
                           f"{r['cpu_s']:6.2f} s CPU; {r['load']})")
                for line in r["stderr"].splitlines():
                    out.append(f"    stderr: {line}")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    if not skip_audit:
        cache = tempfile.mkdtemp(prefix="glaref-first-hour-")
        try:
            for state in ("cold", "warm"):
                r = time_audit(tree, cache, audit_args)
                first = ("none" if r["first_stderr_s"] is None
                         else f"{r['first_stderr_s']:.2f} s: {r['first_stderr']!r}")
                out.append(f"glaref audit {' '.join(audit_args)} {state}: {r['process_s']:6.2f} s wall, "
                           f"{r['cpu_s']:6.2f} s CPU, exit {r['rc']} ({r['load']})")
                out.append(f"    first stderr line after {first}")
                out.append(f"    last stdout line: {r['last_stdout']!r}")
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    out.append(f"end: {load()}")
    return out


def write(path: str, lines: list[str], begin: str = BEGIN, end: str = END) -> None:
    """``lines`` into ``path`` between the markers ``begin`` and ``end`` (replacing what was
    between them, keeping the rest; at the top when the file has no markers yet)."""
    block = "\n".join([begin, *lines, end]) + "\n"
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        text = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        text = block + ("\n" + old if old else "")
    with open(path, "w") as f:
        f.write(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=ROOT, help="the checkout measured (default: this one)")
    ap.add_argument("--label", default="after", help="a name for the tree in the report")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "reports", "first_hour_cpu.txt"))
    ap.add_argument("--audit-args", default="", help="arguments after `glaref audit` (default: "
                    "none, the default audit)")
    ap.add_argument("--skip-audit", action="store_true")
    a = ap.parse_args(argv)
    lines = run(os.path.abspath(a.tree), a.label, a.audit_args.split(), a.skip_audit)
    print("\n".join(lines))
    write(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
