"""Cold-start cost in CPU seconds: the first ``glaref.forward``, the first ``glaref.vjp`` and the
first default ``glaref audit`` of a process whose compile cache is empty, then the same warm.

    python3 tools/bench_cold.py                                  # writes docs/reports/cold_start_cpu.txt
    python3 tools/bench_cold.py --repeats 3 --against /tmp/before   # same run, two trees, interleaved

Every figure is one fresh subprocess (``PYTHONPATH`` = the tree measured) with a fresh, empty
cache folder (``GLAREF_CACHE_DIR``, and ``NUMBA_CACHE_DIR`` inside it, so that a tree that caches
elsewhere is measured cold too); the warm run repeats the command with the folder the cold run
filled. The figure to compare is the process's CPU seconds (user + system), which a shared
machine's load inflates far less than its wall time; the wall time and the load average are
recorded beside it. With ``--against`` the other tree is measured in the same run, each
measurement alternating between the trees, and the ratios (this tree / the other) are printed:
same-run ratios are what to quote when the machine is shared. The calls and the audit are those
of tools/first_hour.py (one definition of "a new user's first call").
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from first_hour import ROOT, load, machine, time_audit, time_call, write  # noqa: E402

BEGIN = "# ---- tools/bench_cold.py: begin (regenerated; edit outside the markers) ----"
END = "# ---- tools/bench_cold.py: end ----"
# issue 23's targets: CPU seconds of the whole cold process on a 2-core x86-64 machine
TARGETS = {"forward": 6.0, "vjp": 8.0, "audit": 35.0}
STEPS = ("forward", "vjp", "audit")


def measure(tree: str, step: str) -> dict:
    """Cold then warm ``step`` in ``tree``, one fresh cache folder: {state: figures}."""
    cache = tempfile.mkdtemp(prefix="glaref-bench-cold-")
    out = {}
    try:
        for state in ("cold", "warm"):
            r = time_audit(tree, cache, []) if step == "audit" else time_call(tree, step, cache)
            if step == "audit" and r["rc"] != 0:
                raise SystemExit(f"bench_cold: the default audit exited {r['rc']} in {tree}")
            out[state] = r
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return out


def _line(label: str, step: str, state: str, runs: list[dict]) -> str:
    cpu = [r["cpu_s"] for r in runs]
    wall = [r["process_s"] for r in runs]
    loads = ", ".join(r["load"].split()[1] for r in runs)
    many = f" (runs {' '.join(f'{c:.1f}' for c in cpu)})" if len(cpu) > 1 else ""
    return (f"  {label:<8} {step:<8} {state:<5} {min(cpu):6.2f} s CPU{many}, wall "
            f"{min(wall):6.1f} s, load {loads}")


def run(trees: dict[str, str], repeats: int, steps: tuple[str, ...]) -> list[str]:
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out = [*machine(), f"start: {start}, {load()}", f"repeats: {repeats} (the least CPU time is "
           "quoted, every run in parentheses)", ""]
    for label, tree in trees.items():
        out.append(f"{label}: {tree}")
    out.append("")
    res: dict[tuple[str, str], list[dict]] = {}
    notes: dict[str, list[str]] = {}
    for step in steps:
        for _ in range(repeats):
            for label, tree in trees.items():
                r = measure(tree, step)
                for state, fig in r.items():
                    res.setdefault((label, step, state), []).append(fig)
                err = r["cold"].get("stderr") or r["cold"].get("first_stderr") or ""
                notes.setdefault(label, [])
                for line in err.splitlines():
                    if line.startswith("glaref: compiling") and line not in notes[label]:
                        notes[label].append(line)
    for step in steps:
        for label in trees:
            for state in ("cold", "warm"):
                out.append(_line(label, step, state, res[(label, step, state)]))
        target = TARGETS[step]
        first = next(iter(trees))
        cold = min(r["cpu_s"] for r in res[(first, step, "cold")])
        out.append(f"  target {step} cold <= {target:.0f} s CPU: {first} {cold:.2f} s "
                   f"({'met' if cold <= target else 'not met'})")
        if len(trees) == 2:
            other = list(trees)[1]
            for state in ("cold", "warm"):
                a = min(r["cpu_s"] for r in res[(first, step, state)])
                b = min(r["cpu_s"] for r in res[(other, step, state)])
                out.append(f"  ratio {step} {state}: {first} / {other} = {a / b:.2f}")
        out.append("")
    for label, lines in notes.items():
        out.append(f"compile notes on stderr ({label}, cold): " + (" | ".join(
            ln.split(" (cached in")[0] for ln in lines) or "none seen"))
    out.append(f"end: {load()}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=ROOT, help="the checkout measured (default: this one)")
    ap.add_argument("--label", default="this", help="a name for --tree in the report")
    ap.add_argument("--against", help="a second checkout, measured in the same run (ratios)")
    ap.add_argument("--against-label", default="before")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", default=",".join(STEPS),
                    help=f"comma-separated, of {STEPS} (default: all)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "reports", "cold_start_cpu.txt"),
                    help="report file ('-': print only)")
    a = ap.parse_args(argv)
    steps = tuple(s for s in a.steps.split(",") if s)
    bad = [s for s in steps if s not in STEPS]
    if bad or a.repeats < 1:
        ap.error(f"--steps: got {bad}, expected some of {STEPS}" if bad else
                 f"--repeats: got {a.repeats}, expected >= 1")
    trees = {a.label: os.path.abspath(a.tree)}
    if a.against:
        trees[a.against_label] = os.path.abspath(a.against)
    lines = run(trees, a.repeats, steps)
    print("\n".join(lines))
    if a.out != "-":
        write(a.out, lines, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
