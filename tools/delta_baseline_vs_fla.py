"""The delta reference kernels' float32 errors beside flash-linear-attention's own float32
references on the same inputs: is the yardstick the size of the field's correct designs?

    python3 tools/delta_baseline_vs_fla.py [--T 256] [--out FILE]

fla-core's ``naive_recurrent_gated_delta_rule``, ``naive_chunk_gated_delta_rule`` (chunk 64),
``naive_recurrent_kda`` and ``naive_chunk_kda`` (chunk 64) are loaded from the installed package's
files as they are (float32; never vendored), run through torch.autograd in float32 on the
float32-rounded inputs of glaref.delta.regimes (standard and strong_decay; B=1, G=H=4, dk=dv=64,
scale dk^-1/2), beside glaref.delta._baseline's scan and chunked kernels at 64 (segment-sum and
chunk-local cumsum decays). Each cell: the normwise relative error against the float64 oracle
(glaref.delta, Numba). Exit 3 when fla-core or torch is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _reports import save_text  # noqa: E402

from glaref._audit._metrics import rel_err  # noqa: E402
from glaref._inputs import Dims  # noqa: E402
from glaref.delta import _baseline, regimes  # noqa: E402
from glaref.delta._oracle import OUTPUTS, DeltaProblem, backend  # noqa: E402

MODULES = {"scalar": ("gated_delta_rule", "gated_delta_rule"), "vector": ("kda", "kda")}


def load_naive(module: str) -> types.ModuleType:
    """fla-core's fla/ops/<module>/naive.py as installed (its own float32 casts kept)."""
    rel = f"fla/ops/{module}/naive.py"
    found = [f for f in importlib.metadata.files("fla-core") or []
             if str(f).replace(os.sep, "/") == rel]
    if not found:
        raise FileNotFoundError(f"fla-core {importlib.metadata.version('fla-core')} has no {rel}")
    path = found[0].locate()
    mod = types.ModuleType(f"fla_core_naive_{module}")
    with open(path) as f:
        exec(compile(f.read(), str(path), "exec"), mod.__dict__)
    return mod


def run_fla(fn, dp: DeltaProblem, scale: float, chunk: int | None) -> dict[str, np.ndarray]:
    """o, h_T and the gradients of an FLA reference in float32 (layout [B, T, H, *])."""
    import torch

    p = dp.p
    f32 = lambda x: torch.tensor(np.ascontiguousarray(np.swapaxes(x, 1, 2)),  # noqa: E731
                                 dtype=torch.float32, requires_grad=True)
    q, k, v, g, beta = f32(p.q), f32(p.k), f32(p.v), f32(p.log_alpha), f32(dp.beta)
    h0 = torch.tensor(p.h0, dtype=torch.float32, requires_grad=True)
    kw = dict(scale=scale, initial_state=h0, output_final_state=True)
    if chunk:
        kw["chunk_size"] = chunk
    o, hT = fn(q, k, v, beta=beta, g=g, **kw)
    do = torch.tensor(np.swapaxes(p.do, 1, 2), dtype=torch.float32)
    loss = (o * do).sum() + (hT * torch.tensor(p.dh_T, dtype=torch.float32)).sum()
    grads = torch.autograd.grad(loss, [q, k, v, beta, g, h0])
    back = lambda x: np.swapaxes(x.detach().double().numpy(), 1, 2)  # noqa: E731
    return dict(zip(OUTPUTS, (back(o), hT.detach().double().numpy(),
                              *(back(x) for x in grads[:5]), grads[5].double().numpy())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
        naive = {gate: load_naive(m) for gate, (m, _) in MODULES.items()}
    except (ImportError, FileNotFoundError, importlib.metadata.PackageNotFoundError) as e:
        print(f"delta_baseline_vs_fla: {e}", file=sys.stderr)
        return 3
    dims = Dims(B=1, G=4, H=4, T=a.T, dk=64, dv=64)
    scale = dims.dk ** -0.5
    r32 = lambda x: None if x is None else x.astype(np.float32).astype(np.float64)  # noqa: E731
    lines = [f"float32 errors vs the float64 oracle, normwise per output; B=1, G=H=4, T={a.T}, "
             f"dk=dv=64, seed 0; fla-core {importlib.metadata.version('fla-core')}; load average "
             f"{os.getloadavg()[0]:.1f}",
             f"{'regime':13s} {'gate':6s} {'kernel':36s} " + " ".join(f"{n:>9s}" for n in OUTPUTS)]
    for gate, (_, stem) in MODULES.items():
        for regime in ("standard", "strong_decay"):
            dp = regimes.make_inputs(regime, dims, 0, gate=gate)
            p = dp.p
            dp = DeltaProblem(p._replace(q=r32(p.q), k=r32(p.k), v=r32(p.v),
                                         log_alpha=r32(p.log_alpha), h0=r32(p.h0), do=r32(p.do),
                                         dh_T=r32(p.dh_T)), r32(dp.beta))
            p, be = dp.p, backend("numba")
            o, h_T = be.forward(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, scale)
            g = be.vjp(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, p.do, p.dh_T, scale)
            ref = dict(zip(OUTPUTS, (o, h_T, *g)))
            rows = {
                f"fla naive_recurrent_{stem}": run_fla(
                    getattr(naive[gate], f"naive_recurrent_{stem}"), dp, scale, None),
                f"fla naive_chunk_{stem} (64)": run_fla(
                    getattr(naive[gate], f"naive_chunk_{stem}"), dp, scale, 64),
                "glaref scan": _baseline.run("scan", dp, scale),
                "glaref chunked64 segment_sums": _baseline.run("chunked", dp, scale),
                "glaref chunked64 chunk_cumsum": _baseline.run("chunked", dp, scale,
                                                               decay="chunk_cumsum"),
            }
            for name, res in rows.items():
                row = f"{regime:13s} {gate:6s} {name:36s} " + " ".join(
                    f"{rel_err(res[n], ref[n]):9.2e}" for n in OUTPUTS)
                lines.append(row)
                print(row, file=sys.stderr, flush=True)
    save_text("\n".join(lines) + "\n", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
