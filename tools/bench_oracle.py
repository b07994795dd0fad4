"""Benchmark of the float64 Numba oracle against the targets of issue 3.

    flock /tmp/glaref-cpu.lock python tools/bench_oracle.py --json oracle_bench.json

Useful work is the recurrence's flop count (one multiply and one add per state element per
step, for each state product): forward 4*B*H*T*dk*dv (state update k^T v, output q S), forward
+ vjp 16*B*H*T*dk*dv (forward 4; the vjp recomputes the states 2, and forms dq 2, the cotangent
update 2, dk 2, dv 2 and dlog_alpha 2). The baseline is numpy's float64 2048 x 2048 matmul
(2 * 2048**3 flops) measured in the same process as the case (best of 3, numpy's default
threads), so every fraction is a same-run ratio.

Each case runs in its own subprocess, so that its peak resident memory (``ru_maxrss``) is its
own. The subprocess first loads the compiled oracle (from the on-disk cache, filled by the
parent before any case runs) and measures the matmul baseline, then records its resident set
``rss_base_mb`` (interpreter, numpy, numba, LLVM, the compiled code); only then does it make
the case's arrays. ``peak_rss_mb`` is the whole process's peak; ``run_peak_mb`` is
peak - rss_base (the memory of the run itself), which target 2 compares with 1.5 x the float64
bytes of inputs + cotangents + outputs + gradients; both figures are printed. Times are the
best of ``--repeats`` after one untimed warm run (first touches of fresh memory are slow on
this VM and are not the oracle's work).

Targets (PASS/FAIL lines at the end):
  1 fwd+vjp g2h8_d128 T=8192: useful GFLOP/s >= 0.40 x same-run matmul GFLOP/s
  2 peak memory of that run <= 1.5 x the float64 bytes of its arrays
  3 time(T=8192) / time(T=2048) and run memory ratio within 4 x (1 +- 0.25)
  4 the seed grid (4 configs x T in {512, 2048, 8192}, fwd+vjp) in <= 8 s wall after compilation
  5 B=G=H=1, dk=dv=64, T=65536 fwd+vjp runs (time and memory reported)
  6 >= 10x faster than jax.vjp of a float64 lax.scan at g2h8_d128 T=512 (both peak memories)
  7 cold compile time reported; first call in a second process (on-disk cache) <= 1 s
  8 uses every core by default, respects NUMBA_NUM_THREADS, bit-identical to 1 thread
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)



# ----------------------------------------------------------------------------- helpers

def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _matmul_gflops(repeats: int = 3) -> float:
    import numpy as np

    a = np.random.default_rng(0).standard_normal((2048, 2048))
    b = np.random.default_rng(1).standard_normal((2048, 2048))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 2048**3 / best / 1e9


def _inputs(B, G, H, T, dk, dv, seed=0):
    """Standard-regime float64 inputs, made in place (no temporaries of full size)."""
    import numpy as np

    rng = np.random.default_rng([seed, B, G, H, T, dk, dv])
    q = rng.standard_normal((B, G, T, dk))
    q *= 1.0 / np.sqrt(dk)
    k = rng.standard_normal((B, G, T, dk))
    k *= 1.0 / np.sqrt(dk)
    v = rng.standard_normal((B, H, T, dv))
    la = rng.standard_normal((B, H, T))
    la = -np.logaddexp(0.0, -la)
    h0 = rng.standard_normal((B, H, dk, dv))
    do = rng.standard_normal((B, H, T, dv))
    dh_T = rng.standard_normal((B, H, dk, dv))
    return q, k, v, la, h0, do, dh_T


def _data_bytes(B, G, H, T, dk, dv) -> int:
    """float64 bytes of inputs + cotangents + outputs + gradients."""
    qk = B * G * T * dk
    vo = B * H * T * dv
    gate = B * H * T
    state = B * H * dk * dv
    inputs = 2 * qk + vo + gate + state          # q, k, v, log_alpha, h0
    cot = vo + state                             # do, dh_T
    outs = vo + state                            # o, h_T
    grads = 2 * qk + vo + gate + state           # dq, dk, dv, dlog_alpha, dh0
    return 8 * (inputs + cot + outs + grads)


def _useful_flops(B, H, T, dk, dv, with_vjp: bool) -> int:
    return (16 if with_vjp else 4) * B * H * T * dk * dv


def _machine() -> dict:
    import numba
    import numpy as np
    from threadpoolctl import threadpool_info

    from glaref._audit._device import cpu_model
    cpu = cpu_model()
    numpy_blas = [
        {k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                               "threading_layer", "filepath")}
        for i in threadpool_info() if i.get("user_api") == "blas"
    ]
    return {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "numpy": np.__version__, "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(), "numpy_blas": numpy_blas,
    }


def _subprocess(args: list[str], env: dict | None = None, timeout: float = 900) -> dict:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *args],
                       capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"worker {args} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- workers

def worker_case(B, G, H, T, dk, dv, repeats: int) -> dict:
    """One oracle case in this (fresh) process: times, GFLOP/s, baseline, memory."""
    import numba

    from glaref.gla import _numba

    tiny = _inputs(1, 1, 1, 3, 2, 2)
    _numba.forward(*tiny[:5], 1.0)
    _numba.vjp(*tiny, 1.0)
    base = _matmul_gflops()
    rss_base = _rss_mb()

    q, k, v, la, h0, do, dh_T = _inputs(B, G, H, T, dk, dv)
    t_fwd, t_vjp = float("inf"), float("inf")
    for rep in range(repeats + 1):  # the first run is a warm-up, untimed
        t0 = time.perf_counter()
        o, h_T = _numba.forward(q, k, v, la, h0, 1.0)
        t1 = time.perf_counter()
        grads = _numba.vjp(q, k, v, la, h0, do, dh_T, 1.0)
        t2 = time.perf_counter()
        del grads, o, h_T
        if rep:
            t_fwd, t_vjp = min(t_fwd, t1 - t0), min(t_vjp, t2 - t1)
    peak = _peak_rss_mb()
    del q, k, v, la, h0, do, dh_T
    base = max(base, _matmul_gflops())
    t_all = t_fwd + t_vjp
    gf_fwd = _useful_flops(B, H, T, dk, dv, False) / t_fwd / 1e9
    gf_all = _useful_flops(B, H, T, dk, dv, True) / t_all / 1e9
    return {
        "B": B, "G": G, "H": H, "T": T, "dk": dk, "dv": dv,
        "threads": numba.get_num_threads(),
        "time_fwd_s": t_fwd, "time_vjp_s": t_vjp, "time_fwd_vjp_s": t_all,
        "gflops_fwd": gf_fwd, "gflops_fwd_vjp": gf_all,
        "matmul_gflops": base,
        "frac_fwd": gf_fwd / base, "frac_fwd_vjp": gf_all / base,
        "data_mb": _data_bytes(B, G, H, T, dk, dv) / 2**20,
        "rss_base_mb": rss_base, "peak_rss_mb": peak, "run_peak_mb": peak - rss_base,
    }


def worker_grid(repeats: int) -> dict:
    """The seed grid, fwd+vjp, in one process: one warm pass, then timed passes (best)."""
    import numba

    from glaref._audit._presets import SEED_CONFIGS, SEED_SEQS
    from glaref.gla import _numba

    data = {(name, T): _inputs(B, G, H, T, dk, dv)
            for name, (B, G, H, dk, dv) in SEED_CONFIGS.items() for T in SEED_SEQS}
    walls = []
    per_case = {}
    for rep in range(repeats + 1):
        t_start = time.perf_counter()
        for key, (q, k, v, la, h0, do, dh_T) in data.items():
            t0 = time.perf_counter()
            o, h_T = _numba.forward(q, k, v, la, h0, 1.0)
            _numba.vjp(q, k, v, la, h0, do, dh_T, 1.0)
            dt = time.perf_counter() - t0
            del o, h_T
            if rep:
                per_case[f"{key[0]}/T{key[1]}"] = min(per_case.get(f"{key[0]}/T{key[1]}", dt), dt)
        if rep:
            walls.append(time.perf_counter() - t_start)
    return {"wall_s": min(walls), "wall_all_s": walls, "per_case_s": per_case,
            "threads": numba.get_num_threads()}


def worker_jax_scan(B, G, H, T, dk, dv, repeats: int) -> dict:
    """jax.vjp of a float64 lax.scan of the recurrence (jax x64), timed and measured."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    rss_base = _rss_mb()
    q, k, v, la, h0, do, dh_T = _inputs(B, G, H, T, dk, dv)
    hpg = H // G

    def scan_forward(q, k, v, la, h0):
        qh = jnp.repeat(q, hpg, axis=1)  # (B, H, T, dk)
        kh = jnp.repeat(k, hpg, axis=1)

        def step(S, x):
            q_t, k_t, v_t, a_t = x
            S = jnp.exp(a_t)[..., None, None] * S + k_t[..., :, None] * v_t[..., None, :]
            return S, jnp.einsum("bhk,bhkv->bhv", q_t, S)

        xs = (jnp.moveaxis(qh, 2, 0), jnp.moveaxis(kh, 2, 0), jnp.moveaxis(v, 2, 0),
              jnp.moveaxis(la, 2, 0))
        S, o = jax.lax.scan(step, h0, xs)
        return jnp.moveaxis(o, 0, 2), S

    def fwd_vjp(q, k, v, la, h0, do, dh_T):
        (o, S), pullback = jax.vjp(scan_forward, q, k, v, la, h0)
        return (o, S), pullback((do, dh_T))

    args = [jnp.asarray(x) for x in (q, k, v, la, h0, do, dh_T)]
    del q, k, v, la, h0, do, dh_T
    from glaref._audit import _timing

    compiled, compile_s = _timing.compile_fn(fwd_vjp, args)       # as the audit measures them
    temp_mb = _timing.memory(compiled)["xla_temp_mb"]
    jax.block_until_ready(compiled(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - t)
    peak = _peak_rss_mb()
    return {"B": B, "G": G, "H": H, "T": T, "dk": dk, "dv": dv, "time_fwd_vjp_s": best,
            "compile_s": compile_s, "xla_temp_mb": temp_mb, "rss_base_mb": rss_base,
            "peak_rss_mb": peak, "run_peak_mb": peak - rss_base, "jax": jax.__version__}


def worker_first_call() -> dict:
    """Import + first forward/vjp call on a small case, then the same call again."""
    t0 = time.perf_counter()
    from glaref.gla import _numba
    t_import = time.perf_counter() - t0
    x = _inputs(1, 1, 2, 40, 8, 8)
    t0 = time.perf_counter()
    _numba.forward(*x[:5], 1.0)
    _numba.vjp(*x, 1.0)
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    _numba.forward(*x[:5], 1.0)
    _numba.vjp(*x, 1.0)
    t_second = time.perf_counter() - t0
    return {"import_s": t_import, "first_call_s": t_first, "second_call_s": t_second,
            "first_call_overhead_s": t_import + t_first - t_second}


def worker_threads_digest() -> dict:
    """Thread count in use and a digest of every output and gradient of a mid-size case."""
    import numba

    from glaref.gla import _numba

    h = hashlib.sha256()
    for B, G, H, T, dk, dv in [(4, 2, 8, 512, 128, 128), (1, 1, 3, 333, 48, 40)]:
        x = _inputs(B, G, H, T, dk, dv, seed=3)
        for arr in _numba.forward(*x[:5], 0.5) + _numba.vjp(*x, 0.5):
            h.update(arr.tobytes())
    return {"threads": numba.get_num_threads(), "digest": h.hexdigest()}


# ----------------------------------------------------------------------------- driver

def _case_args(B, G, H, T, dk, dv, repeats):
    return ["--worker", "case", "--shape", f"{B},{G},{H},{T},{dk},{dv}", "--repeats", str(repeats)]


def run(args) -> dict:
    report: dict = {"machine": _machine(), "cases": {}, "targets": {}}
    env_cache = dict(os.environ)
    # 7: cold compile into an empty cache dir, then the first call in a second process.
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, GLAREF_CACHE_DIR=cache, NUMBA_CACHE_DIR=cache)
        t0 = time.perf_counter()
        cold = _subprocess(["--worker", "first_call"], env=env)
        cold_wall = time.perf_counter() - t0
        warm = _subprocess(["--worker", "first_call"], env=env)
    report["compile"] = {"cold": cold, "cold_process_wall_s": cold_wall, "second_process": warm}
    # fill the default cache for the cases below
    _subprocess(["--worker", "first_call"], env=env_cache)

    cases = {
        "g2h8_d128_T8192": (4, 2, 8, 8192, 128, 128),
        "g2h8_d128_T2048": (4, 2, 8, 2048, 128, 128),
        "g2h8_d128_T512": (4, 2, 8, 512, 128, 128),
        "long_T65536_d64": (1, 1, 1, 65536, 64, 64),
    }
    for name, shape in cases.items():
        print(f"# case {name} ...", file=sys.stderr, flush=True)
        report["cases"][name] = _subprocess(_case_args(*shape, args.repeats))

    print("# seed grid ...", file=sys.stderr, flush=True)
    report["seed_grid"] = _subprocess(["--worker", "grid", "--repeats", str(args.grid_repeats)])

    print("# jax scan ...", file=sys.stderr, flush=True)
    try:
        report["jax_scan"] = _subprocess(
            ["--worker", "jax", "--shape", "4,2,8,512,128,128", "--repeats", str(args.repeats)])
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        report["jax_scan"] = {"error": str(e)[-500:]}

    print("# threads ...", file=sys.stderr, flush=True)
    default = _subprocess(["--worker", "threads"])
    one = _subprocess(["--worker", "threads"], env=dict(os.environ, NUMBA_NUM_THREADS="1"))
    report["threads"] = {"default": default, "one": one, "cores": os.cpu_count()}
    report["targets"] = targets(report)
    return report


def targets(r: dict) -> dict:
    c8, c2 = r["cases"]["g2h8_d128_T8192"], r["cases"]["g2h8_d128_T2048"]
    out = {}
    out["1_fraction_of_matmul"] = {
        "value": c8["frac_fwd_vjp"], "limit": ">= 0.40", "pass": c8["frac_fwd_vjp"] >= 0.40}
    lim = 1.5 * c8["data_mb"]
    out["2_peak_memory"] = {
        "run_peak_mb": c8["run_peak_mb"], "process_peak_mb": c8["peak_rss_mb"],
        "limit_mb": lim, "pass": c8["run_peak_mb"] <= lim,
        "process_peak_also_within": c8["peak_rss_mb"] <= lim}
    tr = c8["time_fwd_vjp_s"] / c2["time_fwd_vjp_s"]
    mr = c8["run_peak_mb"] / c2["run_peak_mb"]
    out["3_linear_scaling"] = {"time_ratio": tr, "memory_ratio": mr, "limit": "[3, 5]",
                               "pass": 3.0 <= tr <= 5.0 and 3.0 <= mr <= 5.0}
    g = r["seed_grid"]["wall_s"]
    out["4_seed_grid_wall"] = {"value_s": g, "limit_s": 8.0, "pass": g <= 8.0}
    lc = r["cases"]["long_T65536_d64"]
    out["5_long_T65536"] = {"time_fwd_vjp_s": lc["time_fwd_vjp_s"], "peak_rss_mb": lc["peak_rss_mb"],
                            "run_peak_mb": lc["run_peak_mb"], "pass": True}
    js = r["jax_scan"]
    if "error" in js:
        out["6_vs_jax_scan"] = {"pass": False, "error": js["error"]}
    else:
        o512 = r["cases"]["g2h8_d128_T512"]
        sp = js["time_fwd_vjp_s"] / o512["time_fwd_vjp_s"]
        out["6_vs_jax_scan"] = {
            "speedup": sp, "limit": ">= 10", "pass": sp >= 10.0,
            "oracle_peak_rss_mb": o512["peak_rss_mb"], "oracle_run_peak_mb": o512["run_peak_mb"],
            "jax_peak_rss_mb": js["peak_rss_mb"], "jax_run_peak_mb": js["run_peak_mb"],
            "jax_xla_temp_mb": js["xla_temp_mb"]}
    w = r["compile"]["second_process"]["first_call_overhead_s"]
    out["7_compile"] = {"cold_first_call_s": r["compile"]["cold"]["first_call_s"],
                        "second_process_overhead_s": w, "limit_s": 1.0, "pass": w <= 1.0}
    t = r["threads"]
    out["8_threads"] = {
        "default_threads": t["default"]["threads"], "cores": t["cores"],
        "one_thread_env_respected": t["one"]["threads"] == 1,
        "bit_identical": t["default"]["digest"] == t["one"]["digest"],
        "pass": (t["default"]["threads"] == t["cores"] and t["one"]["threads"] == 1
                 and t["default"]["digest"] == t["one"]["digest"])}
    return out


def print_table(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, numba {m['numba']} "
          f"({m['numba_threads']} threads), numpy {m['numpy']}")
    for b in m["numpy_blas"]:
        print(f"  BLAS: {b['internal_api']} {b['version']} {b['architecture']} "
              f"threads={b['num_threads']} ({os.path.basename(b['filepath'] or '')})")
    hdr = (f"{'case':<18} {'B,G,H,T,dk,dv':<22} {'thr':>3} {'fwd s':>8} {'fwd+vjp s':>10} "
           f"{'GF/s':>7} {'matmul':>7} {'frac':>6} {'data MB':>8} {'peak MB':>8} {'run MB':>8}")
    print(hdr)
    print("-" * len(hdr))
    for name, c in r["cases"].items():
        shape = f"{c['B']},{c['G']},{c['H']},{c['T']},{c['dk']},{c['dv']}"
        print(f"{name:<18} {shape:<22} {c['threads']:>3} {c['time_fwd_s']:>8.4f} "
              f"{c['time_fwd_vjp_s']:>10.4f} {c['gflops_fwd_vjp']:>7.1f} {c['matmul_gflops']:>7.1f} "
              f"{c['frac_fwd_vjp']:>6.3f} {c['data_mb']:>8.0f} {c['peak_rss_mb']:>8.0f} "
              f"{c['run_peak_mb']:>8.0f}")
    from glaref._audit._presets import SEED_SEQS

    g = r["seed_grid"]
    print(f"seed grid (4 configs x T in {SEED_SEQS}, fwd+vjp): {g['wall_s']:.2f} s wall "
          f"({g['threads']} threads)")
    for k, v in g["per_case_s"].items():
        print(f"  {k:<28} {v:8.4f} s")
    js = r["jax_scan"]
    if "error" not in js:
        print(f"jax.vjp(lax.scan) f64 g2h8_d128 T=512: {js['time_fwd_vjp_s']:.3f} s, "
              f"peak RSS {js['peak_rss_mb']:.0f} MB (run {js['run_peak_mb']:.0f} MB), "
              f"XLA temp {js['xla_temp_mb']} MB, compile {js['compile_s']:.2f} s")
    c = r["compile"]
    print(f"compile: cold first call {c['cold']['first_call_s']:.2f} s (import "
          f"{c['cold']['import_s']:.2f} s); second process: import {c['second_process']['import_s']:.2f} s, "
          f"first call {c['second_process']['first_call_s']:.3f} s, overhead "
          f"{c['second_process']['first_call_overhead_s']:.3f} s")
    t = r["threads"]
    print(f"threads: default {t['default']['threads']} of {t['cores']} cores; NUMBA_NUM_THREADS=1 -> "
          f"{t['one']['threads']}; digests equal: {t['default']['digest'] == t['one']['digest']}")
    print()
    for name, v in r["targets"].items():
        detail = ", ".join(f"{k}={_fmt(x)}" for k, x in v.items() if k != "pass")
        print(f"{'PASS' if v['pass'] else 'FAIL'} target {name}: {detail}")


def _fmt(x):
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the report as JSON to this file")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per case (best kept)")
    p.add_argument("--grid-repeats", type=int, default=2, help="timed passes over the seed grid")
    p.add_argument("--worker", choices=["case", "grid", "jax", "first_call", "threads"],
                   help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        shape = tuple(int(x) for x in a.shape.split(",")) if a.shape else None
        res = {"case": lambda: worker_case(*shape, a.repeats),
               "grid": lambda: worker_grid(a.repeats),
               "jax": lambda: worker_jax_scan(*shape, a.repeats),
               "first_call": worker_first_call,
               "threads": worker_threads_digest}[a.worker]()
        print(json.dumps(res))
        return 0
    report = run(a)
    print_table(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(v["pass"] for v in report["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
