#!/usr/bin/env python3
"""Reproduce the seed report's grid with ``glaref audit`` and print our figures beside the seed's.

    python3 tools/bench_grid.py                     # the whole seed grid (minutes; use flock)
    python3 tools/bench_grid.py --quick             # the seed's four configs at T=512 only
    python3 tools/bench_grid.py --from-json r.json  # compare an existing report, run nothing

Machines differ, so times are compared as same-run ratios chunked/scan per row (ours vs the
seed's); memory (XLA temp, residuals) is compared directly since it does not depend on speed.
Our rel_err is against the float64 oracle; the seed's was against its own chunked kernel (its
chunked rows read 0.0), so only ours is an accuracy figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_JSON = ROOT.parent / "shared" / "reference" / "seed_benchmark_cpu.json"


def _index(results):
    return {(r["config"], r["seq"], r["mode"], r["impl"]): r for r in results}


def _ms(r):
    return None if r is None or "skipped" in r else r.get("median_ms")


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _fmt(x, spec):
    width = int(spec.split(".")[0]) if spec[0].isdigit() else 0
    return f"{'-':>{width}}" if x is None else format(x, spec)


def compare(ours: list[dict], seed: list[dict]) -> list[str]:
    """Lines of the side-by-side table, one per (config, seq, mode) of our report."""
    o, s = _index(ours), _index(seed)
    keys = []
    for r in ours:
        k = (r["config"], r["seq"], r["mode"])
        if k not in keys:
            keys.append(k)
    head = (f"{'config':<17} {'T':>5} {'mode':<7} | {'chunked_ms':>10} {'scan_ms':>9} {'c/s':>6} | "
            f"{'seed_c_ms':>9} {'seed_s_ms':>9} {'seed_c/s':>8} | {'c_temp_MB':>9} {'seed':>7} | "
            f"{'s_resid_MB':>10} {'seed':>8} | {'c_rel_err':>9} {'s_rel_err':>9}")
    lines = [head, "-" * len(head)]
    for cfg, T, mode in keys:
        oc, os_ = o.get((cfg, T, mode, "chunked")), o.get((cfg, T, mode, "scan"))
        sc, ss = s.get((cfg, T, mode, "chunked")), s.get((cfg, T, mode, "scan"))
        r_ours = _ratio(_ms(oc), _ms(os_))
        r_seed = _ratio(_ms(sc), _ms(ss))
        get = lambda r, key: None if r is None or "skipped" in r else r.get(key)  # noqa: E731
        lines.append(
            f"{cfg:<17} {T:>5} {mode:<7} | {_fmt(_ms(oc), '10.2f')} {_fmt(_ms(os_), '9.2f')} "
            f"{_fmt(r_ours, '6.3f')} | {_fmt(_ms(sc), '9.2f')} {_fmt(_ms(ss), '9.2f')} "
            f"{_fmt(r_seed, '8.3f')} | {_fmt(get(oc, 'xla_temp_mb'), '9.1f')} "
            f"{_fmt(get(sc, 'xla_temp_mb'), '7.1f')} | {_fmt(get(os_, 'residual_mb'), '10.1f')} "
            f"{_fmt(get(ss, 'residual_mb'), '8.1f')} | {_fmt(get(oc, 'rel_err'), '9.1e')} "
            f"{_fmt(get(os_, 'rel_err'), '9.1e')}")
    skipped = [f"{r['impl']} {r['mode']} {r['config']} T={r['seq']}: {r['skipped']}"
               for r in ours if "skipped" in r]
    if skipped:
        lines.append("skipped (ours): " + "; ".join(skipped))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the seed's four configs at T=512 only")
    ap.add_argument("--json", help="write our report here (seed schema)")
    ap.add_argument("--from-json", help="compare this existing report instead of running")
    ap.add_argument("--seed-json", default=str(SEED_JSON), help="the seed report (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--oracle", choices=("numba", "numpy"), default=None)
    ns = ap.parse_args(argv)

    seed_path = Path(ns.seed_json)
    if not seed_path.exists():
        print(f"bench_grid: error: seed report {seed_path} not found (--seed-json)", file=sys.stderr)
        return 3
    seed = json.loads(seed_path.read_text())["results"]

    if ns.from_json:
        ours = json.loads(Path(ns.from_json).read_text())["results"]
    else:
        from glaref._audit import _report
        from glaref._audit._engine import audit
        from glaref._audit._presets import SEED_CONFIGS

        table = _report.Table(("chunked", "scan"), SEED_CONFIGS, sys.stdout)
        table.print_header()
        ours = audit(None, None, [512] if ns.quick else None, None, preset="seed",
                            repeats=ns.repeats, json_path=ns.json, oracle_impl=ns.oracle,
                            on_record=table.row)
        code, line = _report.summary(ours)
        print(line)
        print()
    print("ours vs the seed (times: same-run ratios chunked/scan; c = chunked, s = scan)")
    for line in compare(ours, seed):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
