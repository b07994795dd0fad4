"""Speed of the Numba oracle with vector gates beside scalar gates (issue 13's target: fwd+vjp
with vector gates within 3x of the scalar case at g2h8_d128, T = 2048).

    flock /tmp/glaref-cpu.lock python tools/bench_vector_gate.py [--T 2048] [--repeats 5]

Same inputs for both gate kinds except log_alpha ((B, H, T) against (B, H, T, dk), both
logsigmoid(N(0, 1))). One untimed warm call each (compilation, first touches), then the
scalar and vector cases alternate, ``--repeats`` times, and the best time of each is kept, so
that load from other processes on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="4,2,8,128,128", help="B,G,H,dk,dv (default g2h8_d128)")
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args(argv)
    from numba import get_num_threads

    from glaref.gla import _numba

    B, G, H, dk, dv = (int(x) for x in a.config.split(","))
    T = a.T
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, G, T, dk)) / np.sqrt(dk)
    k = rng.standard_normal((B, G, T, dk)) / np.sqrt(dk)
    v, do = rng.standard_normal((B, H, T, dv)), rng.standard_normal((B, H, T, dv))
    h0, dh_T = rng.standard_normal((B, H, dk, dv)), rng.standard_normal((B, H, dk, dv))
    gates = {"scalar": -np.logaddexp(0, -rng.standard_normal((B, H, T))),
             "vector": -np.logaddexp(0, -rng.standard_normal((B, H, T, dk)))}
    best = {g: {"fwd": np.inf, "vjp": np.inf} for g in gates}
    for la in gates.values():   # warm: compilation and first touches
        _numba.forward(q, k, v, la, h0, 1.0)
        _numba.vjp(q, k, v, la, h0, do, dh_T, 1.0)
    for _ in range(a.repeats):
        for g, la in gates.items():
            t0 = time.perf_counter()
            _numba.forward(q, k, v, la, h0, 1.0)
            t1 = time.perf_counter()
            _numba.vjp(q, k, v, la, h0, do, dh_T, 1.0)
            t2 = time.perf_counter()
            best[g]["fwd"] = min(best[g]["fwd"], t1 - t0)
            best[g]["vjp"] = min(best[g]["vjp"], t2 - t1)
    for g in best:
        best[g]["fwd_vjp"] = best[g]["fwd"] + best[g]["vjp"]
    ratio = {p: best["vector"][p] / best["scalar"][p] for p in ("fwd", "vjp", "fwd_vjp")}
    out = {"B": B, "G": G, "H": H, "T": T, "dk": dk, "dv": dv, "threads": get_num_threads(),
           "chunk_scalar": _numba.CHUNK, "chunk_vector": _numba.VCHUNK, "repeats": a.repeats,
           "best_s": best, "vector_over_scalar": ratio}
    for g in best:
        print(f"{g:7s} fwd {best[g]['fwd']:.3f} s   vjp {best[g]['vjp']:.3f} s   "
              f"fwd+vjp {best[g]['fwd_vjp']:.3f} s")
    print("vector / scalar: " + "   ".join(f"{p} {r:.2f}x" for p, r in ratio.items()))
    verdict = "PASS" if ratio["fwd_vjp"] <= 3.0 else "FAIL"
    print(f"{verdict} fwd+vjp vector within 3x of scalar ({ratio['fwd_vjp']:.2f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
