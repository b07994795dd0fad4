"""What localisation and the probes cost: the audit's time with and without them.

Two measurements, each the time of whole audits run one after the other in one process (JAX and
the Numba oracle warmed up first, so that neither compile time lands in one side only):

1. profiles: the quick preset (``glaref audit``'s default grid) as it runs now, with every
   record's ``where`` and ``diagnosis``, against the same audit with the family's
   ``Judge.row_profiles`` hook (``glaref.gla._where.row_profiles``) removed, so that no profile is
   made (what the audit cost before). Target: within 1.1x.
2. probes: the time the probes add (``probes="all"``) to an audit over the audit alone, per row
   kind: one small fwd_bwd row (B=1 G=2 H=4 dk=dv=16, T 130: the row's time is almost all its
   compilation, which the probes' extra shapes repeat) of the chunked kernel and of the scan;
   the same scan row at two lengths (T 130 and 260: the chunk sweep's programs serve both); and
   the quick preset (its fwd_bwd rows probed). Target: at most 2x. Wall and CPU seconds of the
   process (every thread) both; CPU seconds are the figure to read on a loaded machine.

    PYTHONPATH=. python3 tools/bench_where.py [--repeats N] [--probe-seq T] [--no-quick]
    PYTHONPATH=. python3 tools/bench_where.py --before REV [--out docs/reports/where_bench_cpu.txt]

``--before REV`` measures the probes' ratios twice in one run, each side in a fresh process:
glaref as committed at REV (``git archive``, the same measuring code) and the working tree, and
prints (``--out``: writes) the ratios side by side. The machine's load (os.getloadavg) is given
beside every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time

import glaref
from glaref._audit import _args

SMALL = "1,2,4,16,16"           # the small row's config: B, G, H, dk, dv


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, every thread) of fn()."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _quick() -> None:
    glaref.audit(preset="quick")


def profiles_ratio(repeats: int) -> tuple[tuple, tuple]:
    """((wall, CPU) seconds with profiles, (wall, CPU) without), each the median of ``repeats``
    alternating runs."""
    real = _args.family

    def unprofiled(recurrence: str):
        # the family as the engine resolves it by name, its judge without the profile hook (a
        # Judge holds the function itself: rebinding a module's row_profiles would not reach it)
        fam = real(recurrence)
        return dataclasses.replace(fam, judge=dataclasses.replace(fam.judge, row_profiles=None))

    with_p, without = [], []
    for _ in range(repeats):
        with_p.append(_cpu(_quick))
        _args.family = unprofiled
        try:
            without.append(_cpu(_quick))
        finally:
            _args.family = real

    def median(xs):
        return tuple(sorted(x[i] for x in xs)[len(xs) // 2] for i in (0, 1))
    return median(with_p), median(without)


def _added(audit) -> tuple[tuple, tuple]:
    """((wall, CPU) of ``audit()``, (wall, CPU) the probes add to it): the audit, then the same
    audit with every probe (both compile the rows' programs afresh: a new function per audit)."""
    base = _cpu(audit)
    with_probes = _cpu(functools.partial(audit, probes="all"))
    return base, (with_probes[0] - base[0], with_probes[1] - base[1])


def probes_ratio(seq: int, which="all", impls=("chunked", "scan"),
                 regimes=("standard",)) -> list[tuple[str, tuple, tuple]]:
    """(kernel, (row wall, row CPU), (probes' wall, probes' CPU)) per fwd_bwd row of ``impls``
    at ``seq``: the audit of the rows alone, then the same audit with the probes, in one
    process."""
    out = []
    for impl in impls:
        row = functools.partial(glaref.audit, [impl], SMALL, [seq], ["fwd_bwd"],
                                regimes=list(regimes))
        w_row, c_row = _cpu(row)
        w_all, c_all = _cpu(functools.partial(row, probes=which))
        out.append((impl, (w_row, c_row), (w_all - w_row, c_all - c_row)))
    return out


def quick_probes_ratio(which="all") -> tuple[tuple, tuple]:
    """((wall, CPU) of the quick preset, (wall, CPU) the probes add to it): the preset's
    audit, then the same audit with the probes on each of its fwd_bwd rows."""
    base = _cpu(_quick)
    with_probes = _cpu(functools.partial(glaref.audit, preset="quick", probes=which))
    return base, (with_probes[0] - base[0], with_probes[1] - base[1])


def row_kinds(seq: int, quick: bool) -> dict[str, tuple]:
    """{row kind: ((wall, CPU) of the audit, (wall, CPU) the probes add)} for every kind the
    report compares (module docstring, 2.)."""
    kinds = {f"small chunked T={seq}": functools.partial(glaref.audit, ["chunked"], SMALL, [seq],
                                                         ["fwd_bwd"]),
             f"small scan T={seq}": functools.partial(glaref.audit, ["scan"], SMALL, [seq],
                                                      ["fwd_bwd"]),
             f"small scan T={seq},{2 * seq}": functools.partial(glaref.audit, ["scan"], SMALL,
                                                                [seq, 2 * seq], ["fwd_bwd"])}
    if quick:
        kinds["quick preset"] = functools.partial(glaref.audit, preset="quick")
    out = {}
    for name, audit in kinds.items():
        out[name] = _added(audit)
        print(f"  {name}: {_line(*out[name])}", file=sys.stderr, flush=True)
    return out


def _line(base, added) -> str:
    return (f"audit {base[1]:.2f} s CPU / {base[0]:.2f} s wall, probes add {added[1]:.2f} s CPU "
            f"/ {added[0]:.2f} s wall: {added[1] / base[1]:.2f}x CPU, {added[0] / base[0]:.2f}x "
            "wall")


def _side(tree: str, args: list[str]) -> dict:
    """The row kinds measured in a fresh process importing glaref from ``tree``."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = {**os.environ, "PYTHONPATH": tree}
        subprocess.run([sys.executable, os.path.abspath(__file__), "--kinds-json", f.name, *args],
                       env=env, check=True)
        return json.load(open(f.name))


def before_after(rev: str, args: list[str]) -> list[str]:
    """The report: the row kinds' probe ratios with glaref at ``rev`` and in the working tree,
    measured one after the other in this run."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    sha = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True, cwd=root).stdout.strip()
    lines = [f"# tools/bench_where.py --before {rev} {' '.join(args)}",
             f"# {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}; "
             f"before: glaref at {sha}, after: the working tree ({root})",
             f"# load average at start {tuple(round(x, 1) for x in os.getloadavg())}"]
    # kept between runs, so that its Numba cache is warm the next time
    old = os.path.join(tempfile.gettempdir(), f"glaref_bench_where_{sha}")
    if not os.path.isdir(os.path.join(old, "glaref")):
        archive = subprocess.run(["git", "archive", "--format=tar", rev, "glaref"], cwd=root,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
    print(f"before ({sha}, {old}):", file=sys.stderr, flush=True)
    before = _side(old, args)
    print("after (working tree):", file=sys.stderr, flush=True)
    after = _side(root, args)
    lines.append(f"# load average at end {tuple(round(x, 1) for x in os.getloadavg())}")
    lines.append(f"{'row kind':<26} {'side':<7} {'audit CPU s':>11} {'+probes CPU s':>13} "
                 f"{'ratio CPU':>9} {'audit wall s':>12} {'+probes wall s':>14} {'ratio wall':>10}")
    for kind in after:
        for side, got in (("before", before), ("after", after)):
            if kind not in got:
                continue
            (bw, bc), (pw, pc) = got[kind]
            lines.append(f"{kind:<26} {side:<7} {bc:>11.2f} {pc:>13.2f} {pc / bc:>9.2f} "
                         f"{bw:>12.2f} {pw:>14.2f} {pw / bw:>10.2f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="quick-preset runs per side (median)")
    ap.add_argument("--probe-seq", type=int, default=130, help="T of the probed rows")
    ap.add_argument("--probes", default="all", help="the probes timed: all, or names")
    ap.add_argument("--no-quick", dest="quick", action="store_false",
                    help="skip the quick-preset measurements")
    ap.add_argument("--before", metavar="REV", help="compare the probes' ratios with glaref at "
                    "the git revision REV, measured in the same run")
    ap.add_argument("--out", help="with --before: write the report to this file too")
    ap.add_argument("--kinds-json", help=argparse.SUPPRESS)    # one side of --before
    ns = ap.parse_args(argv)
    side_args = [f"--probe-seq={ns.probe_seq}"] + ([] if ns.quick else ["--no-quick"])
    if ns.kinds_json:
        glaref.audit(["scan"], SMALL, [8], ["fwd_bwd"], repeats=0)              # warm-up
        if ns.quick:
            _timed(_quick)
        json.dump(row_kinds(ns.probe_seq, ns.quick), open(ns.kinds_json, "w"))
        return 0
    if ns.before:
        lines = before_after(ns.before, side_args)
        print("\n".join(lines))
        if ns.out:
            with open(ns.out, "w") as f:
                f.write("\n".join(lines) + "\n")
        return 0
    print(f"load average before: {os.getloadavg()}", flush=True)
    if ns.quick:
        _timed(_quick)                               # warm-up: jit caches, the Numba oracle
        w, wo = profiles_ratio(ns.repeats)
        print(f"quick preset: {w[0]:.2f} s wall / {w[1]:.2f} s CPU with profiles, {wo[0]:.2f} s "
              f"wall / {wo[1]:.2f} s CPU without: ratio {w[0] / wo[0]:.3f} wall, "
              f"{w[1] / wo[1]:.3f} CPU (target <= 1.1)", flush=True)
    else:
        glaref.audit(["scan"], SMALL, [8], ["fwd_bwd"], repeats=0)     # warm-up
    if ns.quick:
        (w, c), (pw, pc) = quick_probes_ratio(ns.probes)
        print(f"quick preset: {w:.2f} s wall / {c:.2f} s CPU, probes ({ns.probes}) on its fwd_bwd "
              f"rows add {pw:.2f} s wall / {pc:.2f} s CPU: ratio {pw / w:.2f} wall, {pc / c:.2f} "
              "CPU (target <= 2)", flush=True)
    for impl, row, probes in probes_ratio(ns.probe_seq, ns.probes):
        print(f"{impl} fwd_bwd T={ns.probe_seq}: row {row[0]:.2f} s wall / {row[1]:.2f} s CPU, "
              f"probes ({ns.probes}) add {probes[0]:.2f} s wall / {probes[1]:.2f} s CPU: "
              f"ratio {probes[0] / row[0]:.2f} wall, {probes[1] / row[1]:.2f} CPU (target <= 2)",
              flush=True)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
