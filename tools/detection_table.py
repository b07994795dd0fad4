"""Print the detection matrix of the audit and the correct kernels' budgets, through the engine.

    python tools/detection_table.py                 # default regimes, B=1 G=2 H=4 T=130 dk=dv=16
    python tools/detection_table.py --slow          # adds the long regime (T = 65536)
    python tools/detection_table.py --dims 2,2,4,300,32,24 --json table.json

Everything is measured by ``glaref.audit(...)`` (mode fwd_bwd, accuracy only: repeats=0), as a
user's kernel would be. A regime with several cases (ragged: T in 1, 63, 65, 1000) contributes
every case: a cell shows the union of the outputs flagged, a budget figure the worst case.

Part 1: every mutant of tests/mutants.py (float32, user callables declared chunked with C = 16)
against every regime: which outputs were flagged ("all" = all seven, "-" = none, "!" marks a
non-finite value).
Part 2: the correct kernels (glaref.kernels.chunked and .scan by name, the mutants' correct base
and a plain lax.scan as user callables with their chunk length), in float32 and in bfloat16
judged as accumulating in float32: per output per regime, the worst ratio of its error to the
same-precision reference kernels' (the calibrated tier, against ``calibrated_ratio``) and the
worst budget_ulps with the proven bound it was judged against.
Exit 0 when every mutant is flagged somewhere and no correct kernel is, else 1.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from glaref._inputs import OUTPUTS  # noqa: E402


def _failed(rec: dict) -> list[str]:
    return [f.split(":", 1)[0] for f in rec.get("failures", [])]


def _cell(recs: list[dict]) -> str:
    if any("skipped" in r for r in recs):
        return "skipped"
    if any("error" in r for r in recs):      # the kernel raised or returned the wrong structure
        return "error"
    bad = {n for r in recs for n in _failed(r)}
    if not bad:
        return "-"
    mark = "!" if any(r["nonfinite"].get(n) for r in recs for n in bad) else ""
    if bad == set(OUTPUTS):
        return "all" + mark
    return ",".join(n for n in OUTPUTS if n in bad) + mark


def _worst(recs: list[dict], name: str) -> tuple[float, float, float]:
    """(reference ratio, budget_ulps, bound) for one output: the largest ratio to the reference
    kernels' error (the calibrated tier) and the largest budget_ulps / bound (the proven tier)
    over the cases."""
    ratio = max(r["reference_ratio"][name] for r in recs)
    best = None
    for r in recs:
        u, b = r["budget_ulps"][name], r["budget_bound"][name]
        x = u / b if b else float("inf")
        if best is None or x > best[0]:
            best = (x, u, b)
    return ratio, best[1], best[2]


def main(argv=None) -> int:
    import glaref
    from glaref import regimes
    from glaref.tolerances import tol

    import mutants

    allowed = tol("calibrated_ratio")

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="1,2,4,130,16,16", help="B,G,H,T,dk,dv")
    ap.add_argument("--slow", action="store_true", help="include the long regime (T = 65536)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--oracle", default=None, choices=("numpy", "numba"),
                    help="oracle implementation (default: the engine's, numba when installed)")
    ap.add_argument("--skip-correct", action="store_true", help="only the mutant matrix")
    ap.add_argument("--json", help="write every record to this file")
    a = ap.parse_args(argv)
    try:
        B, G, H, T, dk, dv = (int(x) for x in a.dims.split(","))
    except ValueError:
        print(f"--dims: got {a.dims!r}, expected six integers B,G,H,T,dk,dv", file=sys.stderr)
        return 2
    config = {"detect": (B, G, H, dk, dv)}
    names = [n for n, r in regimes.REGIMES.items() if a.slow or not r.slow]
    common = dict(configs=config, seqs=[T], modes=["fwd_bwd"], repeats=0, seed=a.seed,
                  oracle_impl=a.oracle)
    record: dict = {"dims": a.dims, "seed": a.seed, "mutants": {}, "correct": {}}
    t0 = time.perf_counter()

    def by(recs, key):
        out: dict = {}
        for r in recs:
            out.setdefault(r[key], []).append(r)
        return out

    print(f"Mutant x regime through glaref.audit (float32, chunk_size={mutants.MUTANT_CHUNK}, "
          f"dims B,G,H,T,dk,dv = {a.dims}): outputs flagged ('all' = all seven, '-' = none, "
          "'!' = non-finite values)")
    cells: dict[str, dict[str, str]] = {m: {} for m in mutants.MUTANT_NAMES}
    for r in names:
        recs = glaref.audit(list(mutants.MUTANTS.values()), regimes=r,
                            chunk_size=mutants.MUTANT_CHUNK, **common)
        for m, rs in by(recs, "impl").items():
            cells[m][r] = _cell(rs)
            record["mutants"].setdefault(m, {})[r] = rs
    w = max(len(n) for n in mutants.MUTANT_NAMES)
    cols = [max([len(r)] + [len(cells[m][r]) for m in mutants.MUTANT_NAMES]) for r in names]
    print(" " * w + " | " + " | ".join(r.ljust(c) for r, c in zip(names, cols)))
    for m in mutants.MUTANT_NAMES:
        print(m.ljust(w) + " | " + " | ".join(cells[m][r].ljust(c) for r, c in zip(names, cols)))
    missed = [m for m in mutants.MUTANT_NAMES if all(cells[m][r] in ("-", "skipped") for r in names)]
    print(f"undetected mutants: {missed or 'none'}", flush=True)

    ok_all = True
    if not a.skip_correct:
        # (label, impls, chunk_size for user callables)
        kernels = [("kernels.chunked, kernels.scan", "chunked,scan", None),
                   (f"mutants.base (C={mutants.BASE_CHUNK})", [mutants.base], mutants.BASE_CHUNK),
                   ("mutants.scan_kernel (lax.scan, C=1)", [mutants.scan_kernel], 1)]
        for label, impls, C in kernels:
            for dtype, acc in (("float32", None), ("bfloat16", "float32")):
                # built-in kernels carry their own chunk size and accumulation (float32)
                recs = glaref.audit(impls, regimes=",".join(names), dtype=dtype, chunk_size=C,
                                    accumulate_dtype=acc if C is not None else None, **common)
                for impl, rs in by(recs, "impl").items():
                    title = f"{impl}, {dtype}" + (f" (accumulating in {acc})" if acc else "")
                    print(f"\nWorst ratio to the reference kernels' error (allowed {allowed:g}x) "
                          f"| budget_ulps (proven bound) per output, {title}  [{label}]")
                    print("regime".ljust(13) + "".join(n.rjust(24) for n in OUTPUTS)
                          + "  verdict")
                    for r, cases in by(rs, "regime").items():
                        record["correct"].setdefault(f"{impl} {dtype}", {})[r] = cases
                        if any("skipped" in c for c in cases):
                            print(r.ljust(13) + "skipped: " + cases[0]["skipped"])
                            ok_all = False
                            continue
                        figs = [_worst(cases, n) for n in OUTPUTS]
                        ok = all(c["ok"] for c in cases)
                        ok_all &= ok
                        print(r.ljust(13) + "".join(f"{x:.2g}x | {u:.3g} ({b:.3g})".rjust(24)
                                                    for x, u, b in figs)
                              + ("  pass" if ok else "  FAIL " + ",".join(
                                  sorted({n for c in cases for n in _failed(c)}))), flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(glaref._audit._report.jsonable(record), indent=1))
    return 0 if (not missed and ok_all) else 1


if __name__ == "__main__":
    sys.exit(main())
