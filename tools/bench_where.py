"""What localisation and the probes cost: the audit's time with and without them.

Two measurements, each the wall time of whole audits run one after the other in this process
(JAX and the Numba oracle warmed up first, so that neither compile time lands in one side only):

1. profiles: the quick preset (``glaref audit``'s default grid) as it runs now, with every
   record's ``where`` and ``diagnosis``, against the same audit with ``_where.row_profiles``
   replaced by a stub returning no profile (what the audit cost before). Target: within 1.1x.
2. probes: the time the probes add (``probes="all"``) to the quick preset's audit (on each of
   its fwd_bwd rows), and, the worst case, to one small fwd_bwd row alone (B=1 G=2 H=4
   dk=dv=16, T 130: the row's time is almost all its compilation, which the probes' extra shapes
   repeat) over the row's own audit time (compile, timing loop, oracle, verdict, profiles).
   Target: at most 2x. Wall and CPU seconds of this process (every thread) both.

    PYTHONPATH=. python3 tools/bench_where.py [--repeats N] [--probe-seq T]

Prints one line per measurement and the ratios; the machine's load (os.getloadavg) beside them,
since the figures are wall times.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import glaref
from glaref import _where


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
    real = _where.row_profiles
    with_p, without = [], []
    for _ in range(repeats):
        with_p.append(_cpu(_quick))
        _where.row_profiles = lambda *a, **k: {}
        try:
            without.append(_cpu(_quick))
        finally:
            _where.row_profiles = real

    def median(xs):
        return tuple(sorted(x[i] for x in xs)[len(xs) // 2] for i in (0, 1))
    return median(with_p), median(without)


def probes_ratio(seq: int, which="all", impls=("chunked", "scan"),
                 regimes=("standard",)) -> list[tuple[str, tuple, tuple]]:
    """(kernel, (row wall, row CPU), (probes' wall, probes' CPU)) per fwd_bwd row of ``impls``
    at ``seq``: the audit of the rows alone, then the same audit with the probes, in one
    process (both compile the row's program afresh: a new function per audit)."""
    out = []
    for impl in impls:
        row = functools.partial(glaref.audit, [impl], "1,2,4,16,16", [seq], ["fwd_bwd"],
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="quick-preset runs per side (median)")
    ap.add_argument("--probe-seq", type=int, default=130, help="T of the probed rows")
    ap.add_argument("--probes", default="all", help="the probes timed: all, or names")
    ap.add_argument("--no-quick", dest="quick", action="store_false",
                    help="skip the quick-preset measurement")
    ns = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}", flush=True)
    if ns.quick:
        _timed(_quick)                               # warm-up: jit caches, the Numba oracle
        w, wo = profiles_ratio(ns.repeats)
        print(f"quick preset: {w[0]:.2f} s wall / {w[1]:.2f} s CPU with profiles, {wo[0]:.2f} s "
              f"wall / {wo[1]:.2f} s CPU without: ratio {w[0] / wo[0]:.3f} wall, "
              f"{w[1] / wo[1]:.3f} CPU (target <= 1.1)", flush=True)
    else:
        glaref.audit(["scan"], "1,2,4,16,16", [8], ["fwd_bwd"], repeats=0)     # warm-up
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
