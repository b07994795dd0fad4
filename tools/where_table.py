"""The diagnoses and probes of issue 24, verified: every mutant and every correct kernel audited.

Each kernel is audited as a user's is (``glaref.audit``, fwd_bwd, ``probes="all"``, float32,
seed 0, B=1 G=2 H=4 dk=dv=16 and T=130: nine chunks of 16 and a tail of 2) in the standard and
strong_decay regimes, and its record read back: the diagnosis sentence glaref printed and each
probe's result.

- The structural and pattern mutants of tests/mutants.py (MUTANTS, PATTERN_MUTANTS; chunk_size
  16 declared; odd_truncation at dk = dv = 15, where it shows): right when the pattern named
  (``_where.PATTERNS``, read from the sentence's "points to" clause; "spread" when none) is the
  one tests/test_where.py's EXPECTED gives for that regime (None: the row passes, no diagnosis).
- The probe mutants (PROBE_MUTANTS, which pass the verdict): right when the probe
  ``mutants.PROBE_EXPECTED`` names for it fails.
- The zoo (tests/zoo.py: ``zoo()`` judged with nothing declared, ``field_zoo()`` with the chunk
  size each member declares, the CLI's defaults): right when no diagnosis is printed and no
  probe fails.

Then, with ``--timing``, tools/bench_where.py's measurements (same process, after a warm-up).

    PYTHONPATH=. python3 tools/where_table.py [--out docs/reports/where_cpu.txt] [--timing]
        [--only mutants,zoo]

Prints each line as it is measured and writes the whole report to ``--out``; exit 1 when any
kernel's line is not right.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import glaref  # noqa: E402
from glaref._audit import _where  # noqa: E402

CONFIG = "1,2,4,16,16"
ODD = "1,2,4,15,15"
T = 130
REGIMES = ("standard", "strong_decay")
SHORT = {"determinism": "det", "causality": "caus", "packed": "pack", "cotangents": "cot",
         "chunk_sweep": "sweep"}


def pattern_of(sentence: str | None) -> str | None:
    """The pattern key a diagnosis sentence names (its "points to" clause), SPREAD when it names
    none, None for no sentence."""
    if sentence is None:
        return None
    for key, (_, points) in _where.PATTERNS.items():
        if f"points to {points}" in sentence:
            return key
    return _where.SPREAD


def probes_of(rec: dict) -> str:
    marks = {True: "pass", False: "FAIL", None: "n/a"}
    return " ".join(f"{SHORT[p['probe']]}:{marks[p['passed']]}" for p in rec.get("probes") or [])


def failed_probes(rec: dict) -> list[str]:
    return [p["probe"] for p in rec.get("probes") or [] if p["passed"] is False]


def _emit_row(emit, r: dict, cells: str, right: bool, tail: str) -> None:
    """One kernel x regime line (its cells, whether glaref got it right, its probes, the tail),
    then each failing probe's detail."""
    emit(f"{cells} {'yes' if right else 'NO':<5}  {probes_of(r)}  |  {tail}")
    for p in r.get("probes") or []:
        if p["passed"] is False:
            emit(f"{'':<36}{p['probe']}: {p['detail'][:220]}")


def _audit(kernels: dict, config: str, **claims) -> dict[tuple[str, str], dict]:
    """{(name, regime): record} of one audit of ``kernels`` in both regimes."""
    recs = glaref.audit(list(kernels.values()), config, [T], ["fwd_bwd"], regimes=list(REGIMES),
                        probes="all", repeats=0, **claims)
    names = {getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None): n
             for n, fn in kernels.items()}
    out = {}
    for r in recs:
        short = r["impl"].rsplit(":", 1)[-1].rsplit(".", 1)[-1]
        name = names.get(short, r["impl"])
        out[(name, r["regime"])] = r
    return out


def mutant_lines(emit) -> int:
    from test_where import EXPECTED

    import mutants

    wrong = 0
    emit(f"{'mutant':<22} {'regime':<13} {'want':<12} {'got':<12} {'right':<5}  probes  |  "
         "diagnosis printed")
    structural = {**mutants.MUTANTS, **mutants.PATTERN_MUTANTS}
    odd = {"odd_truncation": structural.pop("odd_truncation")}
    for kernels, config in ((structural, CONFIG), (odd, ODD)):
        recs = _audit(kernels, config, chunk_size=mutants.MUTANT_CHUNK)
        for name in kernels:
            for regime in REGIMES:
                r = recs[(name, regime)]
                want, got = EXPECTED[name][regime], pattern_of(r["diagnosis"])
                right = want == got
                wrong += not right
                emit(f"{name:<22} {regime:<13} {str(want):<12} {str(got):<12} "
                     f"{'yes' if right else 'NO':<5}  {probes_of(r)}  |  {r['diagnosis']}")
    recs = _audit(mutants.PROBE_MUTANTS, CONFIG, chunk_size=mutants.MUTANT_CHUNK)
    for name in mutants.PROBE_MUTANTS:
        for regime in REGIMES:
            r = recs[(name, regime)]
            want = mutants.PROBE_EXPECTED[name]
            right = want in failed_probes(r)
            wrong += not right
            _emit_row(emit, r, f"{name:<22} {regime:<13} {'probe ' + want:<25}", right,
                      r["diagnosis"])
    return wrong


def zoo_lines(emit) -> int:
    import zoo

    wrong = 0
    emit(f"{'kernel':<22} {'regime':<13} {'claims':<14} {'right':<5}  probes  |  verdict, diagnosis")
    groups = [({n: k for n, k in zoo.zoo().items()}, {}, "none")]
    by_chunk: dict = {}
    for name, (fn, C, _form) in zoo.field_zoo().items():
        fn.__qualname__ = getattr(fn, "__qualname__", None) or name
        by_chunk.setdefault(C, {})[name] = fn
    groups += [(ks, {"chunk_size": C} if C else {}, f"C={C}" if C else "none")
               for C, ks in by_chunk.items()]
    for kernels, claims, said in groups:
        named = {}
        for name, fn in kernels.items():
            def wrapped(q, k, v, log_alpha, h0, cu_seqlens=None, _fn=fn):
                # a kernel without cu_seqlens is called without it (the packed probe: n/a)
                kw = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
                return _fn(q, k, v, log_alpha, h0, **kw)
            wrapped.__name__ = wrapped.__qualname__ = name
            named[name] = wrapped
        recs = _audit(named, CONFIG, **claims)
        for name in named:
            for regime in REGIMES:
                r = recs[(name, regime)]
                right = r["diagnosis"] is None and not failed_probes(r)
                wrong += not right
                _emit_row(emit, r, f"{name:<22} {regime:<13} {said:<14}", right,
                          f"{r['verdict']}, {r['diagnosis']}")
    return wrong


def timing_lines(emit, repeats: int = 3) -> None:
    import bench_where

    bench_where._quick()                               # warm-up
    w, wo = bench_where.profiles_ratio(repeats)
    emit(f"quick preset (median of {repeats}): {w[0]:.2f} s wall / {w[1]:.2f} s CPU with "
         f"profiles, {wo[0]:.2f} s wall / {wo[1]:.2f} s CPU without (row_profiles stubbed): ratio "
         f"{w[0] / wo[0]:.3f} wall, {w[1] / wo[1]:.3f} CPU (target <= 1.1)")
    (w, c), (pw, pc) = bench_where.quick_probes_ratio()
    emit(f"quick preset: {w:.2f} s wall / {c:.2f} s CPU; --probes adds {pw:.2f} s wall / "
         f"{pc:.2f} s CPU: ratio {pw / w:.2f} wall, {pc / c:.2f} CPU (target <= 2)")
    for impl, row, probes in bench_where.probes_ratio(T):
        emit(f"one row, {impl} fwd_bwd {CONFIG} T={T}: row {row[0]:.2f} s wall / {row[1]:.2f} s "
             f"CPU, probes add {probes[0]:.2f} s wall / {probes[1]:.2f} s CPU: ratio "
             f"{probes[0] / row[0]:.2f} wall, {probes[1] / row[1]:.2f} CPU")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "reports" / "where_cpu.txt"))
    ap.add_argument("--timing", action="store_true", help="also tools/bench_where.py's ratios")
    ap.add_argument("--only", default="mutants,zoo", help="sections: mutants, zoo")
    ap.add_argument("--repeats", type=int, default=3,
                    help="quick-preset runs per side of the profiles' ratio (median)")
    ns = ap.parse_args(argv)
    lines: list[str] = []

    def emit(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    import jax
    t0, c0 = time.perf_counter(), time.process_time()
    emit(f"# tools/where_table.py: glaref audit --probes, fwd_bwd float32 seed 0, {CONFIG} "
         f"T={T}, regimes {', '.join(REGIMES)}")
    emit(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__} "
         f"on {jax.devices()[0].platform}; load average at start {os.getloadavg()}")
    wrong = 0
    if ns.timing:
        emit("\n## timing (tools/bench_where.py)")
        timing_lines(emit, ns.repeats)
    if "mutants" in ns.only:
        emit("\n## mutants (tests/mutants.py): diagnosis wanted (tests/test_where.py EXPECTED) "
             "and printed, probes")
        wrong += mutant_lines(emit)
    if "zoo" in ns.only:
        emit("\n## the zoo (tests/zoo.py): no diagnosis, every probe passes or is n/a")
        wrong += zoo_lines(emit)
    emit(f"\n# {wrong} line(s) not right; {time.perf_counter() - t0:.0f} s wall, "
         f"{time.process_time() - c0:.0f} s CPU; load average at end {os.getloadavg()}")
    pathlib.Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(ns.out).write_text("\n".join(lines) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
