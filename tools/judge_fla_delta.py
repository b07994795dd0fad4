"""flash-linear-attention's own references of the gated delta rule, run in float64, against
glaref.delta.

    python3 tools/judge_fla_delta.py                 # -> docs/reports/fla_delta_cpu.txt
    python3 tools/judge_fla_delta.py --out FILE

The references are the installed fla-core's (0.6.0) pure-torch ones, loaded from the
distribution's files (no triton needed): fla/ops/gated_delta_rule/naive.py
(``naive_recurrent_gated_delta_rule``, ``naive_chunk_gated_delta_rule``) and fla/ops/kda/naive.py
(``naive_recurrent_kda``, ``naive_chunk_kda``). They cast their inputs to float32 on entry; this
tool rewrites those casts to float64 in the source text when it loads it (``torch.float32`` and
``torch.float`` -> ``torch.float64``, ``.float()`` -> ``.double()``) and executes the rewritten
text as a module: nothing of FLA is stored here.

Each case draws float64 inputs in FLA's layout [B, T, H, *] (seeded), calls the reference with
an explicit scale, initial_state and output_final_state=True, differentiates
L = sum(o * do) + sum(S_T * dh_T) with torch.autograd, and compares o, S_T and the gradients of
q, k, v, beta, g and initial_state with glaref.delta (layout "bthd", impl "numba"): the figure is
the normwise relative error max |fla - glaref| / max |glaref| per output.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import sys
import types
from dataclasses import dataclass

import numpy as np

OUTS = ("o", "h_T", "q", "k", "v", "beta", "log_alpha", "h0")


class MissingField(RuntimeError):
    """fla-core, torch or einops is not installed."""


def load_naive(module: str, *, float64: bool = False) -> types.ModuleType:
    """fla-core's fla/ops/<module>/naive.py executed as a module from the installed
    distribution's file, as shipped (float32), or with its float32 casts rewritten to float64."""
    rel = f"fla/ops/{module}/naive.py"
    try:
        files = importlib.metadata.files("fla-core") or []
    except importlib.metadata.PackageNotFoundError:
        raise MissingField("fla-core is not installed") from None
    found = [f for f in files if str(f).replace(os.sep, "/") == rel]
    if not found:
        raise MissingField(f"fla-core {importlib.metadata.version('fla-core')} has no {rel}")
    path = found[0].locate()
    with open(path) as f:
        src = f.read()
    if float64:
        src = re.sub(r"\btorch\.float32\b", "torch.float64", src)
        src = re.sub(r"\btorch\.float\b(?!\d)", "torch.float64", src)
        src = src.replace(".float()", ".double()")
        if "float32" in src or re.search(r"\.float\(\)|torch\.float\b(?!64)", src):
            raise RuntimeError(f"{rel}: a float32 cast survived the rewrite")
    mod = types.ModuleType(f"fla_core_naive_{module}" + ("_f64" if float64 else ""))
    mod.__file__ = str(path)
    how = " (float64 rewrite)" if float64 else ""
    try:
        exec(compile(src, f"{path}{how}", "exec"), mod.__dict__)
    except ImportError as exc:
        raise MissingField(f"{rel} needs {exc.name}: {exc}") from None
    return mod


def load_naive_f64(module: str) -> types.ModuleType:
    """fla-core's fla/ops/<module>/naive.py with its float32 casts rewritten to float64."""
    return load_naive(module, float64=True)


@dataclass(frozen=True)
class Reference:
    module: str
    vector: bool          # KDA: g [B, T, H, K]
    gva: bool             # accepts q, k with fewer heads than v
    chunk: bool           # needs T % chunk_size == 0 (naive_chunk_kda) or pads (GDN)


REFERENCES = {
    "naive_recurrent_gated_delta_rule": Reference("gated_delta_rule", False, False, False),
    "naive_chunk_gated_delta_rule": Reference("gated_delta_rule", False, False, True),
    "naive_recurrent_kda": Reference("kda", True, True, False),
    "naive_chunk_kda": Reference("kda", True, True, True),
}


@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    G: int
    H: int
    T: int
    K: int
    V: int
    gates: str            # standard | zero | strong | near_one
    beta_max: float
    l2: bool              # L2-normalised keys
    chunk_size: int = 64  # naive_chunk_kda needs it to divide T


SHAPES = (
    Shape("b2h3_T37_k5v7", 2, 3, 3, 37, 5, 7, "standard", 1.0, True, 37),
    Shape("h2_T100_k16v8_beta2", 1, 2, 2, 100, 16, 8, "standard", 2.0, True, 20),
    Shape("h2_T128_deltanet", 1, 2, 2, 128, 8, 8, "zero", 1.0, True),
    Shape("h4_T70_k12v20_strong", 1, 4, 4, 70, 12, 20, "strong", 1.0, False, 14),
    Shape("g1h2_T96_k6v5", 2, 1, 2, 96, 6, 5, "standard", 2.0, True, 32),
    Shape("g2h4_T100_k8v12", 1, 2, 4, 100, 8, 12, "near_one", 2.0, False, 25),
    Shape("g1h3_T65_k4v6_unnorm", 1, 1, 3, 65, 4, 6, "standard", 1.5, False, 13),
)
QUICK = ("b2h3_T37_k5v7", "g1h2_T96_k6v5")


def applies(ref: Reference, s: Shape) -> bool:
    return ref.gva or s.G == s.H


def inputs(s: Shape, vector: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Float64 inputs in FLA's layout [B, T, H, *] and the cotangents do, dh_T."""
    rng = np.random.default_rng([seed, s.B, s.G, s.H, s.T, s.K, s.V, int(vector)])
    q = rng.standard_normal((s.B, s.T, s.G, s.K))
    k = rng.standard_normal((s.B, s.T, s.G, s.K))
    if s.l2:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
    else:
        k /= np.sqrt(s.K)
    gshape = (s.B, s.T, s.H, s.K) if vector else (s.B, s.T, s.H)
    z = rng.standard_normal(gshape)
    g = {"standard": -np.logaddexp(0.0, -z), "zero": np.zeros(gshape),
         "strong": -np.logaddexp(0.0, -z) / 0.1,
         "near_one": -1e-3 * rng.uniform(0.5, 1.5, gshape)}[s.gates]
    return {"q": q, "k": k, "v": rng.standard_normal((s.B, s.T, s.H, s.V)),
            "beta": rng.uniform(0.0, s.beta_max, (s.B, s.T, s.H)), "g": g,
            "h0": rng.standard_normal((s.B, s.H, s.K, s.V)),
            "do": rng.standard_normal((s.B, s.T, s.H, s.V)),
            "dh_T": rng.standard_normal((s.B, s.H, s.K, s.V))}


def run_reference(name: str, s: Shape, x: dict[str, np.ndarray], scale: float) -> dict:
    """o, h_T and the gradients of the FLA reference ``name`` in float64, through autograd."""
    import torch

    ref = REFERENCES[name]
    fn = getattr(load_naive_f64(ref.module), name)
    t = {n: torch.tensor(x[n], dtype=torch.float64, requires_grad=True)
         for n in ("q", "k", "v", "beta", "g", "h0")}
    kw = dict(scale=scale, initial_state=t["h0"], output_final_state=True)
    if ref.chunk:
        kw["chunk_size"] = s.chunk_size if ref.vector else 64
    o, hT = fn(t["q"], t["k"], t["v"], beta=t["beta"], g=t["g"], **kw)
    loss = (o * torch.tensor(x["do"])).sum() + (hT * torch.tensor(x["dh_T"])).sum()
    grads = torch.autograd.grad(loss, [t[n] for n in ("q", "k", "v", "beta", "g", "h0")])
    vals = [o, hT, *grads]
    return {n: v.detach().numpy() for n, v in zip(OUTS, vals)}


def run_glaref(x: dict[str, np.ndarray], scale: float, impl: str = "numba") -> dict:
    import glaref.delta as gd

    args = (x["q"], x["k"], x["v"], x["beta"], x["g"], x["h0"])
    o, h_T = gd.forward(*args, scale=scale, layout="bthd", impl=impl)
    g = gd.vjp(*args, x["do"], x["dh_T"], scale=scale, layout="bthd", impl=impl)
    return dict(zip(OUTS, (o, h_T, *g)))


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Normwise relative error max |a - b| / max |b| (b the truth)."""
    den = float(np.max(np.abs(b))) if b.size else 0.0
    num = float(np.max(np.abs(a - b))) if a.size else 0.0
    return num / den if den else num


def judge(name: str, s: Shape, seed: int = 0) -> dict[str, float]:
    x = inputs(s, REFERENCES[name].vector, seed)
    scale = s.K ** -0.5
    fla = run_reference(name, s, x, scale)
    ours = run_glaref(x, scale)
    return {n: rel(fla[n], ours[n]) for n in OUTS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/reports/fla_delta_cpu.txt")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        for ref in {r.module for r in REFERENCES.values()}:
            load_naive_f64(ref)
    except (ImportError, MissingField) as e:
        print(f"judge_fla_delta: {e}", file=sys.stderr)
        return 3
    shapes = [s for s in SHAPES if not a.quick or s.name in QUICK]
    lines = [f"fla-core {importlib.metadata.version('fla-core')} references in float64 "
             "(casts rewritten at load) vs glaref.delta (numba); normwise relative error "
             "max|fla - glaref| / max|glaref| per output",
             f"{'reference':<34}{'shape':<24}" + "".join(f"{n:>10}" for n in OUTS)]
    worst = 0.0
    for name, ref in REFERENCES.items():
        for s in shapes:
            if not applies(ref, s):
                continue
            e = judge(name, s)
            worst = max(worst, *e.values())
            lines.append(f"{name:<34}{s.name:<24}" + "".join(f"{e[n]:>10.1e}" for n in OUTS))
            print(lines[-1], file=sys.stderr, flush=True)
    lines.append(f"worst over every reference, shape and output: {worst:.2e} (target <= 1e-12)")
    lines.append("shapes: " + "; ".join(
        f"{s.name}: B={s.B} G={s.G} H={s.H} T={s.T} K={s.K} V={s.V} gates={s.gates} "
        f"beta<={s.beta_max} l2keys={s.l2} kda_chunk={s.chunk_size}" for s in shapes))
    lines.append("h0 and dh_T random N(0, 1) in every case; GDN's references take q, k with H "
                 "heads only (no GVA), so G < H shapes run on the KDA references")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0 if worst <= 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
