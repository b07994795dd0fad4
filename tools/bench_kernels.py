"""Benchmark of the JAX kernels (glaref.kernels) against the issue-4 targets, on this machine.

Run it alone on the machine (two cores are shared):

    flock /tmp/glaref-cpu.lock python tools/bench_kernels.py --json kernels_bench.json

Parts (``--parts``, all by default):
  accuracy    float32 kernels vs the float64 oracle on the seed grid (4 configs x --seqs), gates
              log_alpha = logsigmoid(N(0,1)) (regime "standard"): normwise relative error of o,
              h_T and every gradient. The oracle runs on the float32-rounded inputs (exactly
              representable in float64), so the figure is the kernel's own error. The scan rows
              use checkpoint_every=64 (plain autodiff would need B*H*T*dk*dv*8 bytes of residuals,
              32 GiB at g2h8_d128 T=8192); the arithmetic is the same as plain autodiff.
  speed       g2h8_d128 T=2048: fwd and fwd_bwd of chunked and of scan (plain autodiff), timed
              as the audit times them (glaref._audit._timing: a warm-up, then --repeats timings
              of `inner` back-to-back calls calibrated to TARGET_S, median and quartiles per
              call); compile time from lower().compile().
  memory      XLA temp memory of chunked fwd_bwd at g2h8_d128 T=8192 (compiled.memory_analysis(),
              through the same module).
  checkpoint  scan with checkpoint_every=64, fwd_bwd at g2h8_d128 T=8192: compiles, runs, finite.

``--recurrence delta``: the same speed and memory parts for the gated delta rule's kernels
(glaref.delta.kernels: chunked in the WY / UT form, scan by lax.scan with its written-out adjoint),
inputs of glaref.delta.regimes' "standard" regime; its target is issue 26's (chunked fwd_bwd at
least 10x faster than the scan at g2h8_d128 T=2048) and its XLA temp memory is reported.

fwd_bwd is the forward and jax.vjp's backward with random cotangents for o and h_T (the audit's
own fwd_bwd program). residual_mb counts the bytes JAX saves between forward and backward that
are not the inputs themselves (``_timing.residual_bytes``, as in the audit's records).
Prints a table, then each target with PASS/FAIL and its figure; --json writes everything.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from glaref._audit import _timing
from glaref._audit._metrics import rel_err
from glaref._audit._presets import SEED_CONFIGS
from glaref._inputs import GRADS

TARGETS = {
    "accuracy_max_rel_err": 1e-5,          # every output and gradient, both kernels, float32
    "fwd_bwd_speedup_min": 20.0,           # scan fwd_bwd / chunked fwd_bwd at g2h8_d128 T=2048
    "fwd_ratio_max": 0.5,                  # chunked fwd / scan fwd at the same shape
    "chunked_fwd_bwd_temp_mb_max": 1284.0,  # the seed's figure at g2h8_d128 T=8192
}
# the gated delta rule's kernels (issue 26): the chunked form's fwd_bwd against the scan's
DELTA_TARGETS = {"fwd_bwd_speedup_min": 10.0}
RECURRENCE = {"name": "scalar_gate"}       # set by --recurrence before any part runs


def device_info() -> dict:
    """The audit's device block (the seed report's keys, versions, x64, matmul precision, cpu)."""
    import jax

    from glaref._audit._device import device_info as audit_device_info
    return audit_device_info(jax.devices()[0], str(jax.config.jax_default_matmul_precision))


def _inputs(cfg: str, T: int, seed: int = 0):
    """float32 jax inputs + cotangents, and the same values exactly in float64 numpy."""
    import jax.numpy as jnp

    from glaref._inputs import Dims
    from glaref.regimes import make_inputs
    B, G, H, dk, dv = SEED_CONFIGS[cfg]
    if RECURRENCE["name"] == "delta":
        from glaref.delta.regimes import make_inputs as make_delta
        dp = make_delta("standard", Dims(B, G, H, T, dk, dv), seed)
        p = dp.p
        arrays = (p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, p.do, p.dh_T)
    else:
        p = make_inputs("standard", Dims(B, G, H, T, dk, dv), seed)
        arrays = (p.q, p.k, p.v, p.log_alpha, p.h0, p.do, p.dh_T)
    arrs32 = [jnp.asarray(x, jnp.float32) for x in arrays]
    arrs64 = [np.asarray(x, dtype=np.float64) for x in arrs32]
    return arrs32, arrs64


def _n_inputs() -> int:
    return 6 if RECURRENCE["name"] == "delta" else len(GRADS)


def _kernel(impl: str, chunk_size: int, checkpoint_every):
    if RECURRENCE["name"] == "delta":
        from glaref.delta import kernels as dk
        if impl == "chunked":
            return lambda q, k, v, b, la, h0: dk.chunked(q, k, v, b, la, h0, chunk_size=chunk_size,
                                                         return_final_state=True)
        return lambda q, k, v, b, la, h0: dk.scan(q, k, v, b, la, h0,
                                                  checkpoint_every=checkpoint_every,
                                                  return_final_state=True)
    from glaref import kernels
    if impl == "chunked":
        return lambda q, k, v, la, h0: kernels.chunked(q, k, v, la, h0, chunk_size=chunk_size,
                                                       return_final_state=True)
    return lambda q, k, v, la, h0: kernels.scan(q, k, v, la, h0, checkpoint_every=checkpoint_every,
                                                return_final_state=True)


def _fwd_bwd(f):
    from glaref._audit._runners import fwd_bwd_program as fwd_bwd
    return fwd_bwd(f, final=True, n_inputs=_n_inputs())


def _record(impl, mode, cfg, T, **kw):
    B, G, H, dk, dv = SEED_CONFIGS[cfg]
    return {"impl": impl, "mode": mode, "config": cfg, "batch": B, "groups": G, "heads": H,
            "seq": T, "dk": dk, "dv": dv, **kw}


def part_accuracy(cfgs, seqs, chunk_size, log):
    import jax

    import glaref
    out = []
    for cfg in cfgs:
        for T in seqs:
            a32, a64 = _inputs(cfg, T)
            q, k, v, la, h0, do, dh_T = a64
            t0 = time.perf_counter()
            o_ref, hT_ref = glaref.forward(q, k, v, la, h0)
            g_ref = glaref.vjp(q, k, v, la, h0, do, dh_T)
            oracle_s = time.perf_counter() - t0
            for impl, ck in (("chunked", None), ("scan", 64)):
                fn = _fwd_bwd(_kernel(impl, chunk_size, ck))
                (o, hT), grads = jax.block_until_ready(jax.jit(fn)(*a32))
                out_np = [np.asarray(x) for x in (o, hT, *grads)]
                errs = {n: rel_err(g, r) for n, g, r in zip(GRADS, grads, g_ref)}
                rec = _record(impl, "accuracy", cfg, T, checkpoint_every=ck,
                              chunk_size=chunk_size if impl == "chunked" else None,
                              rel_err=rel_err(o, o_ref), rel_err_h_T=rel_err(hT, hT_ref),
                              rel_err_grads=errs, oracle_s=oracle_s,
                              finite=bool(all(np.isfinite(x).all() for x in out_np)))
                out.append(rec)
                log(rec)
            del a32, a64, o_ref, hT_ref, g_ref
    return out


def part_timed(impl, mode, cfg, T, chunk_size, checkpoint_every, repeats, log):
    a32, _ = _inputs(cfg, T)
    f = _kernel(impl, chunk_size, checkpoint_every)
    n = _n_inputs()
    if mode == "fwd":
        fn, args = f, a32[:n]
    else:
        fn, args = _fwd_bwd(f), a32
    compiled, compile_s = _timing.compile_fn(fn, args)
    mem = _timing.memory(compiled)
    out, timing = _timing.time_calls(compiled, args, repeats)
    import jax
    finite = bool(all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(out)))
    rec = _record(impl, mode, cfg, T, checkpoint_every=checkpoint_every,
                  chunk_size=chunk_size if impl == "chunked" else None, compile_s=compile_s,
                  **timing, **mem, finite=finite)
    if mode == "fwd_bwd":
        rec["residual_mb"] = _timing.residual_bytes(f, tuple(a32[:n])) / _timing.MIB
    log(rec)
    return rec


def _fmt(x, spec=".3g"):
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
    return ("-".rjust(int(width)) if width else "-") if x is None else format(x, spec)


def print_table(results):
    print(f"{'impl':9} {'mode':9} {'config':17} {'seq':>5} {'ms':>9} {'compile_s':>9} {'temp_MB':>8} "
          f"{'resid_MB':>8}  rel_err o / h_T / q k v log_alpha h0")
    for r in results:
        impl = r["impl"] + ("" if not r.get("checkpoint_every") else f"/ck{r['checkpoint_every']}")
        errs = ""
        if "rel_err" in r:
            errs = (f"{r['rel_err']:.2e} / {r['rel_err_h_T']:.2e} / "
                    + " ".join(f"{r['rel_err_grads'][n]:.2e}" for n in GRADS))
        print(f"{impl:9} {r['mode']:9} {r['config']:17} {r['seq']:5d} {_fmt(r.get('median_ms'), '9.1f')} "
              f"{_fmt(r.get('compile_s'), '9.2f')} {_fmt(r.get('xla_temp_mb'), '8.1f')} "
              f"{_fmt(r.get('residual_mb'), '8.1f')}  {errs}")


def evaluate(results) -> list[dict]:
    """Each target with its figure and PASS/FAIL (MISSING when its part was not run)."""
    def find(impl, mode, T, ck=None):
        for r in results:
            if (r["impl"], r["mode"], r["config"], r["seq"]) == (impl, mode, "g2h8_d128", T) \
                    and r.get("checkpoint_every") == ck:
                return r
        return None

    verdicts = []

    def add(name, figure, ok, detail):
        verdicts.append({"target": name, "figure": figure,
                         "verdict": "MISSING" if ok is None else ("PASS" if ok else "FAIL"),
                         "detail": detail})

    acc = [r for r in results if r["mode"] == "accuracy"]
    if acc:
        worst, where = 0.0, ""
        for r in acc:
            for name, e in [("o", r["rel_err"]), ("h_T", r["rel_err_h_T"])] + \
                    [(n, r["rel_err_grads"][n]) for n in GRADS]:
                if not e <= worst:   # also catches NaN
                    worst, where = e, f"{r['impl']} {r['config']} T={r['seq']} {name}"
        add("accuracy: max normwise rel err <= 1e-5 (o, h_T, 5 grads, both kernels, seed grid)",
            worst, worst <= TARGETS["accuracy_max_rel_err"], f"worst at {where}")
    else:
        add("accuracy", None, None, "part not run")

    cf, sf = find("chunked", "fwd_bwd", 2048), find("scan", "fwd_bwd", 2048)
    if RECURRENCE["name"] == "delta":
        if cf and sf:
            s = sf["median_ms"] / cf["median_ms"]
            add("delta: chunked fwd_bwd >= 10x faster than scan fwd_bwd (g2h8_d128 T=2048)", s,
                s >= DELTA_TARGETS["fwd_bwd_speedup_min"],
                f"scan {sf['median_ms']:.1f} ms / chunked {cf['median_ms']:.1f} ms")
        m = find("chunked", "fwd_bwd", 8192)
        if m and m.get("xla_temp_mb") is not None:
            add("delta: chunked fwd_bwd XLA temp memory (g2h8_d128 T=8192), reported",
                m["xla_temp_mb"], True, f"residual_mb {m.get('residual_mb')}")
        return verdicts
    if cf and sf:
        s = sf["median_ms"] / cf["median_ms"]
        add("chunked fwd_bwd >= 20x faster than scan fwd_bwd (g2h8_d128 T=2048)", s,
            s >= TARGETS["fwd_bwd_speedup_min"],
            f"scan {sf['median_ms']:.1f} ms / chunked {cf['median_ms']:.1f} ms")
    else:
        add("fwd_bwd speedup", None, None, "part not run")
    cf, sf = find("chunked", "fwd", 2048), find("scan", "fwd", 2048)
    if cf and sf:
        rr = cf["median_ms"] / sf["median_ms"]
        add("chunked fwd / scan fwd <= 0.5 (g2h8_d128 T=2048)", rr, rr <= TARGETS["fwd_ratio_max"],
            f"chunked {cf['median_ms']:.1f} ms / scan {sf['median_ms']:.1f} ms")
    else:
        add("fwd ratio", None, None, "part not run")
    m = find("chunked", "fwd_bwd", 8192)
    if m and m.get("xla_temp_mb") is not None:
        add("chunked fwd_bwd XLA temp <= 1284 MB (g2h8_d128 T=8192)", m["xla_temp_mb"],
            m["xla_temp_mb"] <= TARGETS["chunked_fwd_bwd_temp_mb_max"], f"residual_mb {m.get('residual_mb')}")
    else:
        add("chunked fwd_bwd temp memory", None, None, "part not run or no memory_analysis")
    ck = find("scan", "fwd_bwd", 8192, ck=64)
    if ck:
        add("scan checkpoint_every=64 runs fwd_bwd at g2h8_d128 T=8192", ck["median_ms"], ck["finite"],
            f"{ck['median_ms']:.0f} ms, temp {_fmt(ck.get('xla_temp_mb'))} MB, residual "
            f"{ck.get('residual_mb'):.1f} MB, finite={ck['finite']}")
    else:
        add("scan checkpoint_every=64 at T=8192", None, None, "part not run")
    return verdicts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="accuracy,speed,memory,checkpoint")
    ap.add_argument("--seqs", default="512,2048,8192", help="sequence lengths of the accuracy grid")
    ap.add_argument("--configs", default=",".join(SEED_CONFIGS), help="configs of the accuracy grid")
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write device, config, results and verdicts here")
    ap.add_argument("--recurrence", default="scalar_gate", choices=("scalar_gate", "delta"),
                    help="the kernels benchmarked: glaref.kernels or glaref.delta.kernels "
                         "(delta: the speed and memory parts)")
    args = ap.parse_args(argv)
    RECURRENCE["name"] = args.recurrence
    parts = [p for p in args.parts.split(",") if p]
    if args.recurrence == "delta" and set(parts) - {"speed", "memory"}:
        ap.error("--recurrence delta: only the parts speed and memory (the audit judges accuracy)")
    unknown = set(parts) - {"accuracy", "speed", "memory", "checkpoint"}
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}")
    try:
        import jax  # noqa: F401
    except ImportError:
        print("bench_kernels: jax is not installed (pip install 'glaref[jax]')", file=sys.stderr)
        return 3

    results: list[dict] = []

    def log(rec):
        results.append(rec)
        msg = {k: rec[k] for k in ("impl", "mode", "config", "seq") if k in rec}
        extra = f" {rec['median_ms']:.1f} ms" if "median_ms" in rec else f" o err {rec.get('rel_err', 0):.2e}"
        print(f"[bench] {msg}{extra}", file=sys.stderr, flush=True)

    cs = args.chunk_size
    if "accuracy" in parts:
        part_accuracy([c for c in args.configs.split(",") if c],
                      [int(s) for s in args.seqs.split(",") if s], cs, log)
    if "speed" in parts:
        for mode in ("fwd", "fwd_bwd"):
            for impl in ("chunked", "scan"):
                part_timed(impl, mode, "g2h8_d128", 2048, cs, None, args.repeats, log)
    if "memory" in parts:
        part_timed("chunked", "fwd_bwd", "g2h8_d128", 8192, cs, None, max(1, args.repeats // 2), log)
    if "checkpoint" in parts:
        part_timed("scan", "fwd_bwd", "g2h8_d128", 8192, cs, 64, 1, log)

    print_table(results)
    verdicts = evaluate(results)
    print()
    for v in verdicts:
        fig = "-" if v["figure"] is None else f"{v['figure']:.4g}"
        print(f"{v['verdict']:7} {v['target']}: {fig}  ({v['detail']})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device_info(),
                       "config": {"configs": SEED_CONFIGS, "recurrence": args.recurrence,
                                  "seq_lens": [int(s) for s in args.seqs.split(",") if s],
                                  "chunk_size": cs, "repeats": args.repeats, "targets": TARGETS,
                                  "gates": "log_alpha = logsigmoid(N(0,1)) (regime standard)",
                                  "dtype": "float32"},
                       "results": results, "verdicts": verdicts}, fh, indent=1)
    return 0 if all(v["verdict"] == "PASS" for v in verdicts if v["verdict"] != "MISSING") else 1


if __name__ == "__main__":
    sys.exit(main())
