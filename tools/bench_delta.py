"""Benchmark of the gated delta rule's Numba oracle against the scalar-gate oracle, same run.

    python tools/bench_delta.py [--B 1] [--repeats 2] [--rounds 3] [--json FILE] [--txt FILE]

Each case runs in its own subprocess (its peak resident memory is its own), after a warm-up call
that loads the compiled code from the on-disk cache; the untimed first repeat warms the caches.
Reported: fwd + vjp time of ``glaref.delta._numba`` and ``glaref.gla._numba`` at g2h8_d128
(G = 2, H = 8, dk = dv = 128) for T = 2048 and 8192, and the targets:

  1 delta fwd + vjp at T = 8192 within 3x the scalar-gate oracle's (same run, same inputs)
  2 linear in T: delta's time ratio T 2048 -> 8192 <= 4.6
  3 peak memory of the delta run (process peak - its resident size before the arrays were
    made, minus the inputs themselves) <= 2x the float64 bytes of its inputs

The four cases run ``--rounds`` times, one round after the other, and each target is the median
of the rounds' ratios (on a shared machine a burst of load moves one round, not the verdict).
Times are the best of ``--repeats`` in wall-clock seconds and, beside them, in CPU seconds of
the process (all its threads): on a shared machine the wall clock also counts the time the
workers wait for a core, so targets 1 and 2 are reported on both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEED = dict(G=2, H=8, dk=128, dv=128)
TS = (2048, 8192)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _inputs(B, G, H, T, dk, dv):
    import numpy as np

    rng = np.random.default_rng([0, B, G, H, T, dk, dv])
    q = rng.standard_normal((B, G, T, dk))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k = rng.standard_normal((B, G, T, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, H, T, dv))
    beta = rng.uniform(0.0, 1.0, (B, H, T))
    la = -np.logaddexp(0.0, -rng.standard_normal((B, H, T)))
    h0 = rng.standard_normal((B, H, dk, dv))
    do = rng.standard_normal((B, H, T, dv))
    dh_T = rng.standard_normal((B, H, dk, dv))
    return q, k, v, beta, la, h0, do, dh_T


def worker(family: str, B: int, T: int, repeats: int) -> dict:
    import numba

    from glaref.delta import _numba as delta
    from glaref.gla import _numba as scalar

    tiny = _inputs(1, 1, 1, 3, 2, 2)
    delta.forward(*tiny[:6], 1.0)
    delta.vjp(*tiny, 1.0)
    scalar.forward(*tiny[:2], tiny[2], tiny[4], tiny[5], 1.0)
    scalar.vjp(*tiny[:3], *tiny[4:], 1.0)
    rss_base = _rss_mb()
    arrays = _inputs(B, SEED["G"], SEED["H"], T, SEED["dk"], SEED["dv"])
    in_mb = sum(a.nbytes for a in arrays) / 2**20
    q, k, v, beta, la, h0, do, dh_T = arrays
    if family == "delta":
        def fwd():
            return delta.forward(q, k, v, beta, la, h0, 1.0)

        def bwd():
            return delta.vjp(q, k, v, beta, la, h0, do, dh_T, 1.0)
    else:
        def fwd():
            return scalar.forward(q, k, v, la, h0, 1.0)

        def bwd():
            return scalar.vjp(q, k, v, la, h0, do, dh_T, 1.0)
    t_fwd = t_vjp = c_fwd = c_vjp = float("inf")
    for rep in range(repeats + 1):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fwd()
        c1, t1 = time.process_time(), time.perf_counter()
        grads = bwd()
        c2, t2 = time.process_time(), time.perf_counter()
        del out, grads
        if rep:
            t_fwd, t_vjp = min(t_fwd, t1 - t0), min(t_vjp, t2 - t1)
            c_fwd, c_vjp = min(c_fwd, c1 - c0), min(c_vjp, c2 - c1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"family": family, "B": B, "T": T, **SEED, "threads": numba.get_num_threads(),
            "time_fwd_s": t_fwd, "time_vjp_s": t_vjp, "time_fwd_vjp_s": t_fwd + t_vjp,
            "cpu_fwd_s": c_fwd, "cpu_vjp_s": c_vjp, "cpu_fwd_vjp_s": c_fwd + c_vjp,
            "inputs_mb": in_mb, "rss_base_mb": rss_base, "peak_rss_mb": peak,
            "extra_mb": peak - rss_base - in_mb}


def _sub(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True,
                       text=True, cwd=ROOT, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _loadavg() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def _ratios(cases: dict) -> dict:
    d8, s8, d2 = cases["delta_T8192"], cases["scalar_T8192"], cases["delta_T2048"]
    return {"1_vs_scalar_T8192": d8["time_fwd_vjp_s"] / s8["time_fwd_vjp_s"],
            "1_vs_scalar_T8192_cpu": d8["cpu_fwd_vjp_s"] / s8["cpu_fwd_vjp_s"],
            "2_T2048_to_8192": d8["time_fwd_vjp_s"] / d2["time_fwd_vjp_s"],
            "2_T2048_to_8192_cpu": d8["cpu_fwd_vjp_s"] / d2["cpu_fwd_vjp_s"]}


def run(B: int, repeats: int, rounds: int = 3) -> dict:
    """``rounds`` times the four cases, one after the other (each in its own process); the
    targets are the medians of the rounds' ratios, so that a burst of load on a shared machine
    moves one round's figure, not the verdict."""
    load0 = _loadavg()
    per_round = []
    for i in range(rounds):
        cases = {}
        for T in TS:
            for family in ("scalar", "delta"):
                print(f"round {i + 1}/{rounds}: {family} T={T} ...", file=sys.stderr, flush=True)
                cases[f"{family}_T{T}"] = _sub(["--worker", family, "--B", str(B), "--T", str(T),
                                                "--repeats", str(repeats)])
        per_round.append(cases)
    ratios = [_ratios(c) for c in per_round]
    med = {k: statistics.median(r[k] for r in ratios) for k in ratios[0]}
    # the round whose target 1 is the median stands for the table's case rows
    mid = sorted(range(rounds), key=lambda i: ratios[i]["1_vs_scalar_T8192"])[rounds // 2]
    cases = per_round[mid]
    mem = max(c["delta_T8192"]["extra_mb"] / c["delta_T8192"]["inputs_mb"] for c in per_round)
    limits = {"1_vs_scalar_T8192": 3.0, "1_vs_scalar_T8192_cpu": 3.0, "2_T2048_to_8192": 4.6,
              "2_T2048_to_8192_cpu": 4.6}
    targets = {k: {"ratio": med[k], "limit": lim, "pass": med[k] <= lim,
                   "rounds": [r[k] for r in ratios]} for k, lim in limits.items()}
    targets["3_peak_memory"] = {"extra_over_inputs": mem, "limit": 2.0, "pass": mem <= 2.0}
    return {"cases": cases, "targets": targets, "loadavg_before": load0,
            "loadavg": _loadavg(), "cores": os.cpu_count(), "repeats": repeats,
            "rounds": rounds, "median_round": mid + 1, "all_rounds": per_round}


def table(r: dict) -> str:
    lines = [f"machine: {r['cores']} cores, load average {' '.join(r['loadavg_before'])} before, "
             f"{' '.join(r['loadavg'])} after (shared); best of {r['repeats']} repeats a case, "
             f"{r['rounds']} rounds; case rows: round {r['median_round']} (its target 1 is the "
             f"median); targets: the median over the rounds",
             f"{'case':<16}{'B':>3}{'T':>6}{'thr':>4}{'fwd s':>9}{'vjp s':>9}{'fwd+vjp s':>11}"
             f"{'cpu s':>9}{'inputs MB':>11}{'extra MB':>10}"]
    for name, c in r["cases"].items():
        lines.append(f"{name:<16}{c['B']:>3}{c['T']:>6}{c['threads']:>4}{c['time_fwd_s']:>9.3f}"
                     f"{c['time_vjp_s']:>9.3f}{c['time_fwd_vjp_s']:>11.3f}"
                     f"{c['cpu_fwd_vjp_s']:>9.3f}{c['inputs_mb']:>11.1f}{c['extra_mb']:>10.1f}")
    for name, t in r["targets"].items():
        fig = t.get("ratio", t.get("extra_over_inputs"))
        per = t.get("rounds")
        rounds = f"  rounds: {', '.join(f'{x:.2f}' for x in per)}" if per else ""
        lines.append(f"target {name}: {fig:.2f} (limit {t['limit']}) "
                     f"{'PASS' if t['pass'] else 'FAIL'}{rounds}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("delta", "scalar"))
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="times the four cases run, one round after the other (default 3)")
    ap.add_argument("--json")
    ap.add_argument("--txt")
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker, a.B, a.T, a.repeats)))
        return 0
    r = run(a.B, a.repeats, a.rounds)
    text = table(r)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    if a.txt:
        with open(a.txt, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
