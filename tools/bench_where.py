"""What localisation and the probes cost: the audit's time with and without them.

Two measurements, each the wall time of whole audits run one after the other in this process
(JAX and the Numba oracle warmed up first, so that neither compile time lands in one side only):

1. profiles: the quick preset (``glaref audit``'s default grid) as it runs now, with every
   record's ``where`` and ``diagnosis``, against the same audit with ``_where.row_profiles``
   replaced by a stub returning no profile (what the audit cost before). Target: within 1.1x.
2. probes: per fwd_bwd row, the time the probes add (``probes="all"``) over the row's own audit
   time (compile, timing loop, oracle, verdict, profiles). Target: at most 2x.

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


def _quick() -> None:
    glaref.audit(preset="quick")


def profiles_ratio(repeats: int) -> tuple[float, float]:
    """(seconds with profiles, seconds without), the median of ``repeats`` alternating runs."""
    real = _where.row_profiles
    with_p, without = [], []
    for _ in range(repeats):
        with_p.append(_timed(_quick))
        _where.row_profiles = lambda *a, **k: {}
        try:
            without.append(_timed(_quick))
        finally:
            _where.row_profiles = real
    return sorted(with_p)[len(with_p) // 2], sorted(without)[len(without) // 2]


def probes_ratio(seq: int, which="all") -> list[tuple[str, float, float]]:
    """(kernel, row seconds, probe seconds) per fwd_bwd row of the built-in kernels at ``seq``."""
    out = []
    for impl in ("chunked", "scan"):
        row = functools.partial(glaref.audit, [impl], "1,2,4,16,16", [seq], ["fwd_bwd"])
        t_row = _timed(row)
        t_all = _timed(functools.partial(row, probes=which))
        out.append((impl, t_row, t_all - t_row))
    return out


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
        print(f"quick preset: {w:.2f} s with profiles, {wo:.2f} s without: ratio {w / wo:.3f} "
              f"(target <= 1.1)", flush=True)
    else:
        glaref.audit(["scan"], "1,2,4,16,16", [8], ["fwd_bwd"], repeats=0)     # warm-up
    for impl, row, probes in probes_ratio(ns.probe_seq, ns.probes):
        print(f"{impl} fwd_bwd T={ns.probe_seq}: row {row:.2f} s, probes ({ns.probes}) add "
              f"{probes:.2f} s: ratio {probes / row:.2f} (target <= 2)", flush=True)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
