"""Do two audit reports (``glaref audit --json``) give the same figures? For refactors.

    python3 tools/compare_audit.py BEFORE.json AFTER.json

Compares the configuration and every row's fields, the accuracy figures (rel_err, budget_ulps,
reference_*, bounds, verdicts, ...) exactly, leaving out what is measured anew on every run: the
timings (compile_s, inner, median_ms, q1_ms, q3_ms, oracle_ms) and the device description.
Exit 0 when they agree, 1 listing the first differences otherwise.
"""

from __future__ import annotations

import json
import sys

TIMING = frozenset({"compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "oracle_ms"})


def differences(before: dict, after: dict) -> list[str]:
    out = []
    if before["config"] != after["config"]:
        out.append(f"config: {before['config']} != {after['config']}")
    rb, ra = before["results"], after["results"]
    if len(rb) != len(ra):
        out.append(f"rows: {len(rb)} != {len(ra)}")
    for i, (b, a) in enumerate(zip(rb, ra)):
        for key in sorted((set(b) | set(a)) - TIMING):
            if b.get(key, "<absent>") != a.get(key, "<absent>"):
                out.append(f"row {i} ({b.get('impl')} {b.get('mode')} {b.get('config')} "
                           f"T={b.get('seq')}) {key}: {b.get(key, '<absent>')!r} != "
                           f"{a.get(key, '<absent>')!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        before = json.load(f)
    with open(argv[1]) as f:
        after = json.load(f)
    diff = differences(before, after)
    n = len(before["results"])
    if diff:
        print(f"{len(diff)} difference(s):")
        print("\n".join(diff[:40]))
        return 1
    print(f"identical: {n} rows, every field but the timings ({', '.join(sorted(TIMING))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
