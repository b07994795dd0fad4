"""flash-linear-attention's Triton kernels judged by glaref on a GPU, float32 and bfloat16.

    python3 tools/gpu_fla.py                          # GPU: -> docs/reports/fla_gpu.{txt,json}
    python3 tools/gpu_fla.py --backend cpu --quick --out /tmp/fla_gpu_check    # CPU dry run

Run by tools/gpu_audit.sh after the seed preset (one prepared script for a lent GPU machine).
The kernels (fla-core 0.6.0, ``pip install 'glaref[field]'`` plus the machine's CUDA torch and
triton): ``chunk_simple_gla``, ``fused_recurrent_simple_gla`` (scalar gates), ``chunk_gla``,
``fused_recurrent_gla`` (vector gates), each called with FLA's signature on CUDA tensors and
differentiated by torch.autograd, then judged by ``glaref.testing.assert_close_to_oracle`` on the
inputs they received (tools/judge_fla.py's ``judge_case``: same cases, same record format).
What the verdict is told (KERNELS): the chunk kernels' 64-step chunks and TF32 matmuls for float32
(Triton's ``tl.dot`` default on NVIDIA GPUs; FLA's simple_gla/gla kernels do not turn it off), the
fused recurrent kernels' step-by-step float32 arithmetic (no ``tl.dot``); bfloat16 inputs are
judged with float32 accumulation (glaref's default, what FLA's kernels do), and for the chunk
kernels with bfloat16 matmul operands (``operand_dtype``: they cast their float32 states and
scores to the input dtype before each ``tl.dot``).

With ``--backend cpu`` the Triton kernels are skipped with the reason recorded (they need a CUDA
GPU), and fla-core's pure-torch references stand in for them at the same sizes and dtypes, so
that the script, the judge and the report are exercised before a GPU is lent. Those figures are
CPU figures of the references, never to be quoted as GPU ones: the report says which ran.

``--recurrence delta``: the gated delta rule instead (fla-core 0.6.0's Triton
``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule`` and ``chunk_kda``, called with
FLA's signature through the convention of glaref.conventions.fla_delta, which is the identity
under glaref's layout "bthd" with use_qk_l2norm_in_kernel, the beta sigmoid and the in-kernel
gate off), judged by the delta family's records API (tools/judge_fla_delta_field.py's
``judge_torch``: the family's problems, torch.autograd, ``glaref.delta._family.assess_outputs``)
with the claims of DELTA_KERNELS (chunk kernels: 64-step chunks, chunk-local cumulative gates,
TF32 matmuls for float32 and bfloat16 matmul operands for bfloat16; the fused recurrent kernel:
step by step in float32). Rows: the seed configs at T = 130 and 2048 (G = H for the GDN
kernels, which take q, k with H heads), g1h1_d128 at T = 8192; with ``--backend cpu`` B = 1,
heads <= 2, T = 33 and 130, and fla-core's pure-torch naive references stand in for the Triton
kernels (this is how the script was tested here: no GPU and no triton on the machine that wrote
it; the GPU rows have not been run).

Budget: ``--budget-s`` stops starting new cases after that many seconds (the report keeps what
was measured, and lists the cases not run); every record is written as soon as it is measured.
Exit status: 0 every case ran and passed (or --exit-zero), 1 a case failed or was not run, 3
fla-core/torch missing or no CUDA device with --backend gpu.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import judge_fla  # tools/judge_fla.py: cases, judging, report format
from judge_fla import REFERENCES, Reference

# name: (module, Reference, naive stand-in on CPU, compute dtype of float32 inputs)
KERNELS = {
    "chunk_simple_gla": ("fla.ops.simple_gla", Reference("simple_gla", "scalar", 64, True,
                         "Triton, 64-step chunks (chunk_size=64)"),
                         "naive_chunk_simple_gla", "tf32"),
    "fused_recurrent_simple_gla": ("fla.ops.simple_gla", Reference("simple_gla", "scalar", 1, True,
                                   "Triton, step by step (chunk_size=1)"),
                                   "naive_recurrent_simple_gla", "float32"),
    "chunk_gla": ("fla.ops.gla", Reference("gla", "vector", 64, True,
                  "Triton, 64-step chunks, vector gates (chunk_size=64)"),
                  "naive_recurrent_gla", "tf32"),
    "fused_recurrent_gla": ("fla.ops.gla", Reference("gla", "vector", 1, True,
                            "Triton, step by step, vector gates (chunk_size=1)"),
                            "naive_recurrent_gla", "float32"),
}
# name: (module, naive stand-in on CPU, claims, compute dtype of float32 inputs)
DELTA_KERNELS = {
    "chunk_gated_delta_rule": ("fla.ops.gated_delta_rule", "naive_chunk_gated_delta_rule",
                               dict(chunk_size=64, decay_form="chunk_cumsum"), "tf32"),
    "fused_recurrent_gated_delta_rule": ("fla.ops.gated_delta_rule",
                                         "naive_recurrent_gated_delta_rule",
                                         dict(chunk_size=1), "float32"),
    "chunk_kda": ("fla.ops.kda", "naive_chunk_kda",
                  dict(chunk_size=64, decay_form="chunk_cumsum", gate="vector"), "tf32"),
}
DTYPES = ("float32", "bfloat16")
QUICK_SEQS, QUICK_HEADS = (33, 130), 2


def plan(quick: bool, regimes: list[str], kernels: list[str], dtypes: list[str]):
    """[(kernel, dtype, config, B, T, H, K, V, regime)]: the seed configs (G = H) at T = 130 and
    2048 and g1h1_d128 at T = 8192 at the seed's full batch on a GPU; quick: B = 1, heads <= 2,
    T in QUICK_SEQS."""
    from glaref._audit._presets import SEED_CONFIGS

    rows = []
    seqs = QUICK_SEQS if quick else judge_fla.SEQS + (judge_fla.LONG_SEQ,)
    for T in seqs:
        for config, (B, _G, H, K, V) in SEED_CONFIGS.items():
            if T == judge_fla.LONG_SEQ and config != judge_fla.LONG_CONFIG:
                continue
            b, h = (1, min(H, QUICK_HEADS)) if quick else (B, H)
            for name in kernels:
                for dtype in dtypes:
                    for regime in regimes:
                        rows.append((name, dtype, config, b, T, h, K, V, regime))
    return rows


def load(name: str, backend: str):
    """(callable, what ran, skip reason): the Triton kernel on a GPU; on CPU the naive stand-in."""
    module, _ref, naive, _cd = KERNELS[name]
    if backend == "cpu":
        why = (f"{name}: Triton kernel needs a CUDA GPU (BACKEND=cpu): fla-core's {naive} ran "
               "in its place, at CPU sizes")
        return judge_fla.reference_function(naive), naive, why
    import torch
    if not torch.cuda.is_available():
        raise judge_fla.MissingField("torch sees no CUDA device (use --backend cpu for a dry run)")
    try:
        return getattr(importlib.import_module(module), name), name, None
    except ImportError as exc:
        raise judge_fla.MissingField(f"{module} does not import ({exc}): fla-core and triton "
                                     "are needed") from None


def triton_delta(name: str):
    """FLA's Triton ``name`` as ``(q, k, v, beta, g, h0, scale) -> (o, h_T)`` in layout "bthd"
    (glaref.conventions.fla_delta's table with its in-kernel options off)."""
    fn = getattr(importlib.import_module(DELTA_KERNELS[name][0]), name)

    def run(q, k, v, beta, g, h0, scale):
        return fn(q, k, v, g=g, beta=beta, scale=scale, initial_state=h0,
                  output_final_state=True, use_qk_l2norm_in_kernel=False)

    return run


def delta_plan(quick: bool, kernels: list[str], dtypes: list[str], regimes: list[str]):
    """[(kernel, dtype, config, dims, T, regime)] for --recurrence delta (see the docstring)."""
    from glaref._audit._presets import SEED_CONFIGS

    rows = []
    for T in (QUICK_SEQS if quick else (130, 2048, 8192)):
        for config, (B, G, H, K, V) in SEED_CONFIGS.items():
            if T == 8192 and config != "g1h1_d128":
                continue
            b, h = (1, min(H, QUICK_HEADS)) if quick else (B, H)
            for name in kernels:
                g = min(G, h) if DELTA_KERNELS[name][2].get("gate") == "vector" else h
                while h % g:
                    g -= 1
                rows += [(name, dtype, config, (b, g, h, K, V), T, regime)
                         for dtype in dtypes for regime in regimes]
    return rows


def write_delta(out: str, args, gpu: bool, records: list, not_run: list, t_start: float) -> None:
    """OUT.json (records, cases not started) and OUT.txt (one line per record)."""
    import torch

    doc = dict(tool="tools/gpu_fla.py " + " ".join(args.argv),
               device=torch.cuda.get_device_name(0) if gpu else
               "cpu (BACKEND=cpu dry run: fla-core's naive references stood in; no Triton "
               "kernel ran)", elapsed_s=round(time.perf_counter() - t_start, 1),
               records=records, not_run=not_run)
    with open(out + ".json", "w") as f:
        json.dump(doc, f, indent=1, default=str)
    with open(out + ".txt", "w") as f:
        f.write(f"{doc['device']}\n" + "".join(
            f"{r['ran']:<36}{r['dtype']:<10}{r['config']:<18}{str(r['dims']):<22}"
            f"T={r['T']:<6}{r['regime']:<14}{r['outcome']:<15}" + " ".join(
                f"{n}={o['ratio_to_allowed']:.3g}" for n, o in r["outputs"].items())
            + "\n" for r in records))


def main_delta(args, out: str) -> int:
    """--recurrence delta: FLA's Triton delta-rule kernels (naive stand-ins with --backend cpu)
    judged row by row; OUT.json and OUT.txt rewritten after every row."""
    import judge_fla_delta_field as jdf
    import torch

    from glaref.delta._family import AUDIT_REGIMES

    kernels = [s for s in args.only.split(",") if s] if args.only != ",".join(KERNELS) \
        else list(DELTA_KERNELS)
    regimes = [s for s in args.regimes.split(",") if s] \
        if args.regimes != ",".join(judge_fla.REGIMES) else list(AUDIT_REGIMES)
    dtypes = [s for s in args.dtypes.split(",") if s]
    bad = [k for k in kernels if k not in DELTA_KERNELS]
    if bad:
        print(f"gpu_fla: --only: got {bad}, expected some of {list(DELTA_KERNELS)}",
              file=sys.stderr)
        return 2
    gpu = args.backend == "gpu"
    if gpu and not torch.cuda.is_available():
        print("gpu_fla: torch sees no CUDA device (use --backend cpu for a dry run)",
              file=sys.stderr)
        return 3
    fns, ran = {}, {}
    try:
        for name in kernels:
            if gpu:
                fns[name], ran[name] = triton_delta(name), name
            else:
                naive = DELTA_KERNELS[name][1]
                fns[name], ran[name] = jdf.torch_reference(naive), naive
    except (ImportError, jdf.jfd.MissingField) as exc:
        print(f"gpu_fla: {exc} (fla-core and triton are needed)", file=sys.stderr)
        return 3
    if not gpu:
        torch.set_num_threads(1)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    t_start, records, not_run = time.perf_counter(), [], []
    cases = delta_plan(args.quick or not gpu, kernels, dtypes, regimes)
    for i, (name, dtype, config, dims, T, regime) in enumerate(cases):
        if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
            not_run.append(dict(kernel=name, dtype=dtype, config=config, T=T, regime=regime))
            continue
        claims = dict(DELTA_KERNELS[name][2])
        if dtype == "bfloat16":
            claims["accumulate_dtype"] = "float32"      # FLA's kernels accumulate in float32
        if gpu and claims["chunk_size"] > 1 and dtype == "float32":
            claims["compute_dtype"] = "tf32"            # Triton's tl.dot default
        elif gpu and claims["chunk_size"] > 1:
            claims["operand_dtype"] = "bfloat16"        # states and scores cast before tl.dot
        try:
            rec = jdf.judge_torch(fns[name], dims, T, regime, claims=claims, dtype=dtype,
                                  device="cuda" if gpu else "cpu")
        except Exception as exc:  # noqa: BLE001 (a kernel that raises fails its case)
            rec = dict(outcome=f"FAIL raised {type(exc).__name__}: {str(exc)[:200]}",
                       outputs={}, dims=list(dims), T=T, regime=regime, dtype=dtype,
                       claims=claims)
        rec.update(kernel=name, ran=ran[name], config=config)
        records.append(rec)
        worst = max((o["ratio_to_allowed"] for o in rec["outputs"].values()), default=None)
        print(f"[{i + 1}/{len(cases)}] {ran[name]} {dtype} {config} {dims} T={T} {regime}: "
              f"{rec['outcome']} worst ratio/allowed {worst if worst is None else f'{worst:.3g}'}",
              file=sys.stderr, flush=True)
        write_delta(out, args, gpu, records, not_run, t_start)
    write_delta(out, args, gpu, records, not_run, t_start)
    if args.exit_zero:
        return 0
    return 0 if records and not not_run and all(r["outcome"] == "ok" for r in records) else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("gpu", "cpu"), default=os.environ.get("BACKEND", "gpu"))
    ap.add_argument("--quick", action="store_true",
                    help=f"B=1, heads <= {QUICK_HEADS}, T in {QUICK_SEQS} (the default on CPU)")
    ap.add_argument("--only", default=",".join(KERNELS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--regimes", default=",".join(judge_fla.REGIMES))
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new case after this many seconds")
    ap.add_argument("--out", default=None,
                    help="writes OUT.json and OUT.txt (default docs/reports/fla_gpu on a GPU, "
                         "docs/reports/fla_gpu_cpu_check with --backend cpu)")
    ap.add_argument("--exit-zero", action="store_true",
                    help="exit 0 when every report was written, failing cases included (a "
                         "finding to report, not a script failure)")
    ap.add_argument("--recurrence", choices=("scalar_gate", "delta"), default="scalar_gate",
                    help="delta: FLA's gated delta rule and KDA kernels (DELTA_KERNELS)")
    args = ap.parse_args(argv)
    args.argv, args.seed, args.exact_gate_sums = argv, 0, False
    if args.recurrence == "delta":
        return main_delta(args, args.out or ("docs/reports/fla_delta_gpu" if args.backend ==
                                             "gpu" else "docs/reports/fla_delta_gpu_cpu_check"))
    kernels = [s for s in args.only.split(",") if s]
    dtypes = [s for s in args.dtypes.split(",") if s]
    regimes = [s for s in args.regimes.split(",") if s]
    for flag, got, allowed in (("--only", kernels, KERNELS), ("--dtypes", dtypes, DTYPES),
                               ("--regimes", regimes, judge_fla.REGIMES)):
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            ap.error(f"{flag}: got {bad or got}, expected some of {list(allowed)}")
    quick = args.quick or args.backend == "cpu"
    out = args.out or ("docs/reports/fla_gpu" if args.backend == "gpu"
                       else "docs/reports/fla_gpu_cpu_check")
    device = "cuda" if args.backend == "gpu" else "cpu"
    try:
        loaded = {name: load(name, args.backend) for name in kernels}
    except judge_fla.MissingField as exc:
        print(f"gpu_fla: {exc}", file=sys.stderr)
        return 3
    import torch
    if device == "cpu":
        torch.set_num_threads(1)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    records, not_run = [], []
    t_start = time.perf_counter()
    cases = plan(quick, regimes, kernels, dtypes)

    def header():
        h = judge_fla._header(args, time.perf_counter() - t_start)
        h["tool"] = "tools/gpu_fla.py " + " ".join(args.argv)
        h["device"] = (torch.cuda.get_device_name(0) if device == "cuda"
                       else "cpu (BACKEND=cpu dry run: no Triton kernel ran)")
        h["sizes"] = ("quick: B=1, heads <= 2" if quick else
                      f"seed configs (G = H) at T={judge_fla.SEQS}, {judge_fla.LONG_CONFIG} at "
                      f"T={judge_fla.LONG_SEQ}, the seed's batch")
        h["dtype"] = ",".join(dtypes)
        skipped = sorted({why for _fn, _ran, why in loaded.values() if why})
        if skipped:
            h["skipped"] = skipped
        if not_run:
            h["not_run_budget"] = f"{len(not_run)} cases not started (--budget-s {args.budget_s})"
        return h

    for i, (name, dtype, config, B, T, H, K, V, regime) in enumerate(cases):
        if args.budget_s is not None and time.perf_counter() - t_start > args.budget_s:
            not_run.append((name, dtype, config, B, T, H, regime))
            continue
        fn, ran, _why = loaded[name]
        if device == "cpu":
            torch.set_num_threads(1)            # the judge's thread limits may reset it
        _module, ref, _naive, cd32 = KERNELS[name]
        if ran != name:                          # the CPU stand-in: judged as what it is
            ref = REFERENCES[ran]
        triton = ran == name
        cdtype = cd32 if (dtype == "float32" and triton) else None
        # FLA's bfloat16 chunk kernels round their float32 states and scores to bfloat16 before
        # each tl.dot (cd32 == "tf32" marks the kernels with tl.dot)
        operand = "bfloat16" if (dtype == "bfloat16" and triton and cd32 == "tf32") else None
        try:
            rec = judge_fla.judge_case(ran, fn, config, B, T, H, K, V, regime, ref=ref,
                                       dtype=dtype, device=device, compute_dtype=cdtype,
                                       operand_dtype=operand)
        except Exception as exc:  # noqa: BLE001 (a kernel that raises, anyhow, fails its case)
            rec = {"reference": ran, "config": config, "batch": B, "heads": H, "dk": K, "dv": V,
                   "seq": T, "regime": regime, "dtype": dtype, "compute_dtype": cdtype or dtype,
                   "device": device, "verdict": f"FAIL raised {type(exc).__name__}: "
                   f"{str(exc).splitlines()[0][:200] if str(exc) else ''}",
                   "worst_output": None, "worst_ratio_to_allowed": None,
                   "worst_proven_output": None, "worst_proven_fraction": None,
                   "allowed_ratio": None, "kernel_s": 0.0, "judge_s": 0.0, "outputs": {}}
        rec["kernel"] = name
        records.append(rec)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        judge_fla.write(out, records, header())
        print(f"[{i + 1}/{len(cases)}] {ran} {dtype} {config} B={B} H={H} T={T} {regime}: "
              f"{rec['verdict']} worst x_ref/allowed {judge_fla._fig(rec['worst_ratio_to_allowed'])}"
              f"; kernel {rec['kernel_s']:.2f}s judge {rec['judge_s']:.1f}s",
              file=sys.stderr, flush=True)
    judge_fla.write(out, records, header())
    if not_run:
        with open(out + ".json") as f:
            doc = json.load(f)
        doc["not_run"] = [dict(zip(("kernel", "dtype", "config", "batch", "seq", "heads",
                                    "regime"), c)) for c in not_run]
        with open(out + ".json", "w") as f:
            json.dump(doc, f, indent=1)
    if args.exit_zero:
        return 0
    return 0 if records and not not_run and all(r["verdict"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
