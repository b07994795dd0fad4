"""flash-linear-attention's pure-torch references judged by glaref, as an FLA test would judge them.

    python3 tools/judge_fla.py                      # the full grid -> docs/reports/fla_cpu.{txt,json}
    python3 tools/judge_fla.py --quick --out /tmp/fla_quick        # small sizes, a minute or two
    python3 tools/judge_fla.py --only naive_chunk_simple_gla --regimes strong_decay

The references are those of the installed fla-core (``pip install 'glaref[field]'``), loaded from
the distribution's own files (``importlib.metadata.files``): fla/ops/simple_gla/naive.py
(``naive_recurrent_simple_gla``, ``naive_chunk_simple_gla``, ``naive_parallel_simple_gla``) and
fla/ops/gla/naive.py (``naive_recurrent_gla``, vector gates) import only torch and einops, so no
triton is needed (importing the ``fla`` package would need it). Nothing of FLA is copied here.

Each case: inputs drawn by ``glaref.conventions.fla.simple_gla_case`` / ``gla_case`` in FLA's
layout [B, T, H, *] (float32, glaref's regimes, seed 0), the reference called with FLA's defaults
(scale None = K ** -0.5; initial_state and output_final_state where it takes them), L = sum(o do)
+ sum(ht dht) differentiated by torch.autograd, and every output and gradient judged by
``glaref.testing.assert_close_to_oracle`` (the two-tier verdict of ``glaref audit``) on the inputs
the reference received. What the verdict is told of each reference's structure (``chunk_size``)
is in REFERENCES. Configs: the seed's four (``glaref._audit._presets.SEED_CONFIGS``, G = H: FLA's
simple_gla has no grouped q/k) at T = 130 and 2048, and g1h1_d128 at T = 8192, batch and heads
cut where SIZE_CUT says (autograd through a Python loop keeps every step's state).

The JSON (one record per case, rewritten after each case, so an interrupted run keeps what was
measured; ``--resume`` skips the cases already there) and the text table are written together.
Exit status: 0 no case FAILs (less accurate is a pass), 1 some case FAILs, 2 usage error, 3
fla-core/torch/einops absent.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glaref._inputs import FORWARD, OUTPUTS

REGIMES = ("standard", "strong_decay", "near_one")
SEQS = (130, 2048)
LONG_CONFIG, LONG_SEQ = "g1h1_d128", 8192
# Sizes cut from the seed's (B, H), the same inputs going to every reference: the recurrent
# references keep every step's (B, H, K, V) state for autograd (about three float32 copies per
# step: 4.9 GB peak measured for B=1 of g1h24 at T=2048) and took 100-270 s per case for B=1 of
# g2h8_d128 at T=2048 on this shared 2-core machine (load average 7-12 during the run), which
# would have put the whole grid well past 40 minutes. Cut to (B, H): g2h8_d128 at T=2048 to B=1
# (H=8 kept), g1h24 at T=2048 to B=1 and H=8 heads of 24, g1h1_d128 at T=8192 to B=1.
SIZE_CUT = {("g2h8_d128", 2048): (1, 8), ("g1h24_dk128_dv64", 2048): (1, 8),
            (LONG_CONFIG, LONG_SEQ): (1, 1)}
QUICK_SEQS, QUICK_LONG_SEQ, QUICK_HEADS = (33, 130), 520, 2


@dataclass(frozen=True)
class Reference:
    module: str                 # fla/ops/<module>/naive.py
    gate: str                   # "scalar" (g [B, T, H]) or "vector" (g [B, T, H, K])
    chunk_size: int | None      # what the verdict is told: 1 step by step, C chunks, None unknown
    state: bool                 # takes initial_state and returns the final state
    structure: str              # for the report


REFERENCES: dict[str, Reference] = {
    "naive_recurrent_simple_gla": Reference("simple_gla", "scalar", 1, True,
                                            "step by step (chunk_size=1)"),
    "naive_chunk_simple_gla": Reference("simple_gla", "scalar", 64, True,
                                        "64-step chunks, in-chunk cumsum decays (chunk_size=64)"),
    # one T x T block with decays exp(b_i - b_j) of a cumsum over the whole sequence; the verdict
    # is told nothing (chunk_size=None: between the scan and 64/256-step chunks), as a user would
    "naive_parallel_simple_gla": Reference("simple_gla", "scalar", None, False,
                                           "one T x T block (chunk_size unknown)"),
    "naive_recurrent_gla": Reference("gla", "vector", 1, True,
                                     "step by step, vector gates (chunk_size=1)"),
}


class MissingField(RuntimeError):
    """fla-core, torch or einops is not installed."""


def load_naive(module: str):
    """fla-core's ``fla/ops/<module>/naive.py``, loaded from the installed distribution's files
    (no triton: these import only torch and einops). MissingField when fla-core is absent."""
    rel = f"fla/ops/{module}/naive.py"
    try:
        files = importlib.metadata.files("fla-core") or []
    except importlib.metadata.PackageNotFoundError:
        raise MissingField("fla-core is not installed (pip install 'glaref[field]')") from None
    found = [f for f in files if str(f).replace(os.sep, "/") == rel]
    if not found:
        raise MissingField(f"fla-core {importlib.metadata.version('fla-core')} has no {rel}")
    spec = importlib.util.spec_from_file_location(f"fla_core_naive_{module}", found[0].locate())
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except ImportError as exc:      # torch or einops
        raise MissingField(f"{rel} needs {exc.name}: {exc}") from None
    return mod


def reference_function(name: str) -> Callable:
    return getattr(load_naive(REFERENCES[name].module), name)


def exact_sum_grid(g):
    """``g`` rounded to the coarsest power-of-two grid 2**-s on which every float32 partial sum
    over time is exact (|sum| < 2**(24 - s)): cumulative sums, and differences of them, are then
    exact, so decays exp(b_i - b_j) are as accurate as exp of any segment sum. A diagnostic: it
    separates the rounding of cumsum-difference decays from every other error of a kernel."""
    import torch

    total = float(g.detach().abs().sum(dim=1).max()) if g.numel() else 0.0
    s = 23 - max(0, math.ceil(math.log2(total + 1.0)))
    if s < 4:
        raise ValueError(f"g: total |log decay| {total:.3g} leaves a grid coarser than 2**-4")
    return (torch.round(g.detach() * 2.0 ** s) / 2.0 ** s).requires_grad_(g.requires_grad)


def run_case(name: str, fn: Callable, B: int, T: int, H: int, K: int, V: int, regime: str,
             seed: int = 0, exact_sums: bool = False, *, ref: Reference | None = None,
             dtype: str = "float32", device: str = "cpu"):
    """Call ``fn`` (FLA's signature; ``ref`` says what it takes, by default REFERENCES[name]) on
    one case and differentiate it: (actual, inputs, kernel_s), the results under glaref's names
    and the inputs it received, both as the judge takes them. exact_sums: the gates rounded by
    :func:`exact_sum_grid` first. dtype, device: of the inputs (torch names)."""
    import torch

    from glaref.conventions import fla

    ref = REFERENCES[name] if ref is None else ref
    case = fla.gla_case if ref.gate == "vector" else fla.simple_gla_case
    q, k, v, g, h0, do, dht = case(B, T, H, K, V, dtype=getattr(torch, dtype), seed=seed,
                                   regime=regime, device=device)
    if exact_sums:
        g = exact_sum_grid(g)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    if ref.state:
        o, ht = fn(q, k, v, g, initial_state=h0, output_final_state=True)
        loss = (o * do).sum() + (ht * dht).sum()
    else:
        o, _ = fn(q, k, v, g)
        ht = h0 = dht = None
        loss = (o * do).sum()
    loss.backward()
    sync()
    kernel_s = time.perf_counter() - t0
    dh0 = None if h0 is None else h0.grad
    if ref.gate == "vector":
        actual = fla.gla_outputs(o, ht, q.grad, k.grad, v.grad, g.grad, dh0)
        inputs = fla.gla_inputs(q, k, v, g, initial_state=h0, do=do, dht=dht)
    else:
        actual = fla.simple_gla_outputs(o, ht, q.grad, k.grad, v.grad, g.grad, dh0)
        inputs = fla.simple_gla_inputs(q, k, v, g, initial_state=h0, do=do, dht=dht)
    return actual, inputs, kernel_s


def _f(x):
    return None if x is None else float(x)


def judge_case(name: str, fn: Callable, config: str, B: int, T: int, H: int, K: int, V: int,
               regime: str, seed: int = 0, exact_sums: bool = False, *,
               ref: Reference | None = None, dtype: str = "float32", device: str = "cpu",
               compute_dtype: str | None = None,
               operand_dtype: str | None = None) -> dict[str, Any]:
    """One record: ``fn`` run on one case (:func:`run_case`) and judged by
    ``assert_close_to_oracle`` (compute_dtype: "tf32" for float32 Triton ``tl.dot``s;
    operand_dtype: "bfloat16" for bfloat16 Triton kernels that round their float32 states and
    scores to bfloat16 before each ``tl.dot``)."""
    import glaref.testing as gt

    ref = REFERENCES[name] if ref is None else ref
    actual, inputs, kernel_s = run_case(name, fn, B, T, H, K, V, regime, seed, exact_sums,
                                        ref=ref, dtype=dtype, device=device)
    chunk = ref.chunk_size
    t0 = time.perf_counter()
    try:
        per = gt.assert_close_to_oracle(actual, inputs, chunk_size=chunk,
                                        compute_dtype=compute_dtype, operand_dtype=operand_dtype)
    except AssertionError as exc:
        per = getattr(exc, "assessments", None)
        if per is None:
            raise
    judge_s = time.perf_counter() - t0
    outputs = {n: {"ok": a.ok, "x_ref": _f(a.ratio), "allowed_ratio": _f(a.allowed_ratio),
                   "rel_err": _f(a.rel_err), "ref_rel_err": _f(a.baseline_rel_err),
                   "budget_ulps": _f(a.budget_ulps), "proven_bound": _f(a.bound),
                   "max_abs_err": _f(a.max_abs_err), "nonfinite": int(a.nonfinite),
                   "failed_tier": a.failed_tier, "reason": a.reason or None,
                   "outcome": a.outcome, "x_envelope": _f(a.envelope_ratio), "design": a.design}
               for n, a in per.items()}
    ratios = {n: r["x_ref"] / r["allowed_ratio"] for n, r in outputs.items()
              if r["x_ref"] is not None}
    worst = max(ratios, key=ratios.get) if ratios else None
    proven = {n: r["budget_ulps"] / r["proven_bound"] for n, r in outputs.items()
              if r["budget_ulps"] is not None and r["proven_bound"] not in (None, 0.0)
              and r["proven_bound"] != float("inf")}
    worst_p = max(proven, key=proven.get) if proven else None
    failing = [n for n, r in outputs.items() if not r["ok"]]
    less = [n for n, r in outputs.items() if r["outcome"] == "less_accurate"]
    return {"reference": name, "config": config, "batch": B, "heads": H, "dk": K, "dv": V,
            "seq": T, "regime": regime, "seed": seed, "exact_gate_sums": exact_sums,
            "dtype": dtype, "compute_dtype": compute_dtype or dtype, "device": device,
            "operand_dtype": operand_dtype,
            "gate": ref.gate, "chunk_size": chunk, "structure": ref.structure,
            "not_computed": [n for n in OUTPUTS if n not in outputs],
            "verdict": ("FAIL " + ",".join(failing) if failing else
                        "less accurate " + ",".join(less) if less else "ok"),
            "worst_output": worst, "worst_x_ref": outputs[worst]["x_ref"] if worst else None,
            "allowed_ratio": outputs[worst]["allowed_ratio"] if worst else None,
            "worst_ratio_to_allowed": ratios.get(worst),
            "worst_proven_output": worst_p, "worst_proven_fraction": proven.get(worst_p),
            "kernel_s": kernel_s, "judge_s": judge_s, "outputs": outputs}


def plan(quick: bool, only: list[str], regimes: list[str], seqs: list[int] | None = None,
         configs: list[str] | None = None):
    """[(reference, config, B, T, H, K, V, regime)]: every case of the run, cheapest first;
    ``seqs``, ``configs``: only these of the run's sequence lengths and configs."""
    from glaref._audit._presets import SEED_CONFIGS

    rows = []
    long_seq = QUICK_LONG_SEQ if quick else LONG_SEQ
    every = (QUICK_SEQS if quick else SEQS) + (long_seq,)
    for T in (every if seqs is None else [t for t in every if t in seqs]):
        for config, (B, _G, H, K, V) in SEED_CONFIGS.items():
            if (T == long_seq and config != LONG_CONFIG) or (configs and config not in configs):
                continue
            b, h = SIZE_CUT.get((config, T), (B, H))
            if quick:
                b, h = 1, min(H, QUICK_HEADS)
            for name in only:
                for regime in regimes:
                    rows.append((name, config, b, T, h, K, V, regime))
    return rows


def _fig(x, fmt="{:.3g}"):
    return "-" if x is None else fmt.format(x)


def _dtype(r: dict[str, Any]) -> str:
    """The dtype column: the inputs' dtype, and the arithmetic judged when it differs (tf32)."""
    cd = r.get("compute_dtype") or r["dtype"]
    return r["dtype"] if cd == r["dtype"] else f"{r['dtype']}/{cd}"


def table(records: list[dict[str, Any]], header: dict[str, Any]) -> str:
    head = ("reference", "config", "B", "H", "T", "regime", "dtype") + tuple(
        ("d" + n if n not in FORWARD else n) for n in OUTPUTS) + (
        "worst/allowed", "proven", "verdict")
    rows = [head]
    for r in records:
        x = [_fig(r["outputs"][n]["x_ref"], "{:.2f}") if n in r["outputs"] else "-" for n in OUTPUTS]
        worst = (f"{r['worst_ratio_to_allowed']:.3f} ({r['worst_output']})"
                 if r["worst_output"] else "-")
        proven = (f"{r['worst_proven_fraction']:.1e} ({r['worst_proven_output']})"
                  if r["worst_proven_output"] else "-")
        rows.append((r["reference"], r["config"], str(r["batch"]), str(r["heads"]),
                     str(r["seq"]), r["regime"], _dtype(r), *x, worst, proven, r["verdict"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"# {k}: {v}" for k, v in header.items()]
    lines.append("")
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    legend = ("Columns o .. dh0: x_ref (x_best), each output's normwise error over that of the most "
              "accurate of glaref's same-precision reference kernels on the same inputs "
              f"(calibrated tier; ok at <= {records[0]['allowed_ratio'] if records else '-'}x; "
              "'-' = not computed). worst/allowed: the largest x_ref / allowed and its output. "
              "proven: the largest budget_ulps / proven bound (ok at <= 1). verdict: ok; less "
              "accurate (beyond the most accurate designs' rule, within that of the field's "
              "correct designs, docs/budgets.md section 9: a pass unless strict); FAIL (beyond "
              "every correct design).")
    lines += ["", legend, ""]
    failed = [r for r in records if r["verdict"] != "ok"]
    if failed:
        lines.append("Outputs not ok (FAIL or less accurate):")
        for r in failed:
            for o in r["outputs"].values():
                if o.get("outcome", "ok" if o["ok"] else "fail") != "ok":
                    lines.append(f"  {r['reference']} {r['config']} T={r['seq']} {r['regime']}: "
                                 f"{o['reason']} (x_ref {_fig(o['x_ref'])}, rel_err "
                                 f"{_fig(o['rel_err'])} vs reference kernels "
                                 f"{_fig(o['ref_rel_err'])}, budget_ulps "
                                 f"{_fig(o['budget_ulps'])} / bound {_fig(o['proven_bound'])})")
    lines.append("")
    lines.append("Worst per reference and T:")
    seen: dict[tuple, dict] = {}
    for r in records:
        key = (r["reference"], _dtype(r), r["seq"])
        if key not in seen or (r["worst_ratio_to_allowed"] or 0) > (
                seen[key]["worst_ratio_to_allowed"] or 0):
            seen[key] = r
    for (name, dt, T), r in seen.items():
        mine = [x for x in records if (x["reference"], _dtype(x), x["seq"]) == (name, dt, T)]
        fails = sum(1 for x in mine if x["verdict"].startswith("FAIL"))
        less = sum(1 for x in mine if x["verdict"].startswith("less"))
        n = len(mine)
        lines.append(f"  {name:28s} {dt:8s} T={T:<5d} worst x_ref/allowed {_fig(r['worst_ratio_to_allowed'])}"
                     f" ({r['worst_output']}, {r['config']}, {r['regime']}); {n - fails - less}/{n} ok,"
                     f" {less} less accurate, {fails} FAIL")
    return "\n".join(lines) + "\n"


def _header(args, elapsed: float) -> dict[str, Any]:
    import numpy
    import torch

    return {"tool": "tools/judge_fla.py " + " ".join(args.argv),
            "fla_core": importlib.metadata.version("fla-core"),
            "torch": torch.__version__, "numpy": numpy.__version__,
            "glaref": importlib.metadata.version("glaref") if _installed("glaref") else "source",
            "machine": f"{platform.machine()} {platform.processor() or ''} "
                       f"{os.cpu_count()} cpus, torch threads {torch.get_num_threads()}".strip(),
            "dtype": "float32", "seed": args.seed,
            "gates": ("rounded to a grid with exact float32 sums (--exact-gate-sums, diagnostic)"
                      if args.exact_gate_sums else "as drawn"),
            "sizes": (f"quick: B=1, heads <= {QUICK_HEADS}" if args.quick else
                      f"seed configs (G = H) at T={SEQS}, {LONG_CONFIG} at T={LONG_SEQ}; cut "
                      + ", ".join(f"{c} T={t} to B={b} H={h}" for (c, t), (b, h) in SIZE_CUT.items())),
            "elapsed_s": round(elapsed, 1)}


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def write(out: str, records, header) -> None:
    with open(out + ".json.tmp", "w") as f:
        json.dump({"header": header, "records": records}, f, indent=1)
    os.replace(out + ".json.tmp", out + ".json")
    with open(out + ".txt", "w") as f:
        f.write(table(records, header))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"small sizes: B=1, heads <= {QUICK_HEADS}, T in {QUICK_SEQS} and "
                         f"{QUICK_LONG_SEQ} for {LONG_CONFIG}")
    ap.add_argument("--only", default=",".join(REFERENCES),
                    help="comma-separated references (default: all four)")
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", help="comma-separated seed configs of the run to keep (default: "
                    "all of them)")
    ap.add_argument("--seqs", help="comma-separated sequence lengths of the run to keep (default: "
                    "all of them)")
    ap.add_argument("--out", default="docs/reports/fla_cpu",
                    help="writes OUT.json and OUT.txt")
    ap.add_argument("--exact-gate-sums", action="store_true",
                    help="diagnostic: round the gates to a grid on which float32 cumulative sums "
                         "are exact (separates cumsum-difference decay rounding from the rest)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: the Python loops' small ops gain nothing "
                         "from more, and spin-waiting threads slow down on a shared machine)")
    ap.add_argument("--resume", action="store_true",
                    help="keep OUT.json's records and run only the cases missing there")
    args = ap.parse_args(argv)
    args.argv = argv
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in REFERENCES]
    if bad or not only:
        ap.error(f"--only: got {bad or args.only!r}, expected some of {list(REFERENCES)}")
    regimes = [s.strip() for s in args.regimes.split(",") if s.strip()]
    from glaref import regimes as _regimes
    bad = [s for s in regimes if s not in _regimes.REGIMES]
    if bad or not regimes:
        ap.error(f"--regimes: got {bad or args.regimes!r}, expected some of {list(_regimes.REGIMES)}")
    if args.seed < 0:
        ap.error(f"--seed: got {args.seed}, expected >= 0")
    if args.threads < 1:
        ap.error(f"--threads: got {args.threads}, expected >= 1")
    try:
        fns = {name: reference_function(name) for name in only}
    except MissingField as exc:
        print(f"judge_fla: {exc}", file=sys.stderr)
        return 3
    import torch
    torch.set_num_threads(args.threads)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    records: list[dict[str, Any]] = []
    if args.resume and os.path.exists(args.out + ".json"):
        with open(args.out + ".json") as f:
            records = json.load(f)["records"]
    done = {(r["reference"], r["config"], r["batch"], r["seq"], r["heads"], r["regime"])
            for r in records}
    t_start = time.perf_counter() - sum(r["kernel_s"] + r["judge_s"] for r in records)
    seqs = None if args.seqs is None else [int(t) for t in args.seqs.split(",") if t]
    configs = None if args.configs is None else args.configs.split(",")
    cases = plan(args.quick, only, regimes, seqs, configs)
    for i, (name, config, B, T, H, K, V, regime) in enumerate(cases):
        if (name, config, B, T, H, regime) in done:
            continue
        torch.set_num_threads(args.threads)     # the judge's thread limits may reset it
        rec = judge_case(name, fns[name], config, B, T, H, K, V, regime, args.seed,
                         args.exact_gate_sums)
        records.append(rec)
        gc.collect()
        write(args.out, records, _header(args, time.perf_counter() - t_start))
        print(f"[{i + 1}/{len(cases)}] {name} {config} B={B} H={H} T={T} {regime}: "
              f"{rec['verdict']} worst x_ref/allowed {_fig(rec['worst_ratio_to_allowed'])} "
              f"({rec['worst_output']}); kernel {rec['kernel_s']:.1f}s judge {rec['judge_s']:.1f}s",
              file=sys.stderr, flush=True)
    write(args.out, records, _header(args, time.perf_counter() - t_start))
    return 0 if not any(r["verdict"].startswith("FAIL") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
