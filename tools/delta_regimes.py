"""The regimes of glaref.delta with their condition: how far a correct float32 loop is from the
truth there.

    python3 tools/delta_regimes.py [--out docs/reports/delta_oracle_cpu.txt]

For every regime of ``glaref.delta.regimes`` (scalar and vector gates) at B=1, G=2, H=4, T=256,
dk=dv=32 (or the sizes the regime runs), the inputs are rounded to float32 and then run

- through glaref.delta (float64, the truth for those rounded inputs), and its ``scales``;
- through a plain float32 torch loop of the recurrence (the definition, step by step, as
  flash-linear-attention's naive references run), differentiated by torch.autograd in float32;
- through glaref.delta's NumPy reference (the gap between the two float64 implementations).

Per output the table gives the float32 loop's normwise relative error max |f32 - truth| /
max |truth| (the condition figure: what a correct float32 design achieves there) and
kappa = max scale / max |truth| (sum of |terms| over the value: the cancellation that
amplifies rounding); the last column is the worst float64 Numba-vs-NumPy gap over all outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

OUTS = ("o", "h_T", "q", "k", "v", "beta", "log_alpha", "h0")
DIMS = dict(B=1, G=2, H=4, T=256, dk=32, dv=32)


def f32_loop(x, cot, scale):
    """o, h_T and the six gradients of a float32 torch loop (autograd in float32)."""
    import torch

    t = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in x]
    q, k, v, beta, la, h0 = t
    B, H, T, dv = v.shape
    G = q.shape[1]
    qh, kh = q.repeat_interleave(H // G, 1), k.repeat_interleave(H // G, 1)
    S, outs = h0, []
    for s in range(T):
        a = la[:, :, s].exp()
        St = S * (a[..., None, None] if la.dim() == 3 else a[..., None])
        u = beta[:, :, s, None] * (v[:, :, s] - torch.einsum("bhkv,bhk->bhv", St, kh[:, :, s]))
        S = St + kh[:, :, s, :, None] * u[:, :, None, :]
        outs.append(scale * torch.einsum("bhkv,bhk->bhv", S, qh[:, :, s]))
    o = torch.stack(outs, 2) if outs else torch.zeros(B, H, 0, dv)
    L = (o * torch.tensor(cot[0], dtype=torch.float32)).sum() + \
        (S * torch.tensor(cot[1], dtype=torch.float32)).sum()
    grads = torch.autograd.grad(L, t, allow_unused=True)
    grads = [np.zeros(a.shape) if g is None else g.double().numpy() for g, a in zip(grads, x)]
    return dict(zip(OUTS, (o.detach().double().numpy(), S.detach().double().numpy(), *grads)))


def rel(a, b):
    den = float(np.max(np.abs(b))) if b.size else 0.0
    num = float(np.max(np.abs(a - b))) if b.size else 0.0
    return num / den if den else num


def measure(regime: str, gate: str, seed: int = 0) -> list[dict]:
    import glaref.delta as gd
    from glaref._inputs import Dims
    from glaref.delta import regimes

    scale = DIMS["dk"] ** -0.5
    rows = []
    for dims in regimes.get(regime).cases(Dims(**DIMS)):
        dp = regimes.make_inputs(regime, dims, seed, gate=gate)
        p = dp.p
        r32 = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731
        x = tuple(r32(a) for a in (p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0))
        cot = (r32(p.do), r32(p.dh_T))
        truth, ref = {}, {}
        for impl, d in (("numba", truth), ("numpy", ref)):
            o, h_T = gd.forward(*x, scale=scale, impl=impl)
            d.update(zip(OUTS, (o, h_T, *gd.vjp(*x, *cot, scale=scale, impl=impl))))
        sc = gd.scales(*x, *cot, scale=scale)
        f32 = f32_loop(x, cot, scale)
        kappa = {}
        for n in OUTS:
            m = float(np.max(np.abs(truth[n]))) if truth[n].size else 0.0
            s = float(np.max(getattr(sc, n))) if truth[n].size else 0.0
            kappa[n] = s / m if m else (0.0 if s == 0 else float("inf"))
        rows.append({"regime": regime, "gate": gate, "T": dims.T, "G": dims.G, "H": dims.H,
                     "dk": dims.dk, "f32": {n: rel(f32[n], truth[n]) for n in OUTS},
                     "kappa": kappa, "f64_gap": max(rel(ref[n], truth[n]) for n in OUTS)})
    return rows


def trust_figures() -> list[str]:
    """The worst figure of each trust check of tests/test_delta_trust.py, measured on its cases
    (the checks' own helpers, loaded from the test file)."""
    import importlib.util

    import glaref.delta as gd

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    spec = importlib.util.spec_from_file_location(
        "test_delta_trust", os.path.join(sys.path[0], "test_delta_trust.py"))
    t = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = t
    spec.loader.exec_module(t)
    cs, fd, mp, jx = {}, {}, {}, {}
    for name, dims, kw, scale in t.SMALL:
        x, cot = t.make_case(*dims, **kw)
        g = gd.vjp(*x, *cot, scale=scale)
        rng = np.random.default_rng(1)
        for i, n in enumerate(t.NAMES):
            u = rng.standard_normal(x[i].shape)
            xc = [a.astype(complex) for a in x]
            xc[i] = xc[i] + 1j * 1e-30 * u
            d = float(np.imag(t.loss(xc, cot, scale))) / 1e-30
            gi = getattr(g, n)
            cs[n] = max(cs.get(n, 0.0), abs(d - np.sum(gi * u)) / np.sum(np.abs(gi * u)))
            h = 1e-5 * max(1.0, float(np.max(np.abs(x[i]))))
            xp, xm = list(x), list(x)
            xp[i], xm[i] = x[i] + h * u, x[i] - h * u
            f = lambda *a: gd.forward(*a[:6], scale=a[6])  # noqa: E731
            d = (t.loss(xp, cot, scale, f) - t.loss(xm, cot, scale, f)) / (2 * h)
            fd[n] = max(fd.get(n, 0.0), abs(d - np.sum(gi * u)) / np.sum(np.abs(gi * u)))
        if name in t.MP_CASES:
            exact = t.mp_reference(x, cot, scale)
            o, h_T = gd.forward(*x, scale=scale)
            ours = dict(zip(OUTS, (o, h_T, *g)))
            for n in OUTS:
                mp[n] = max(mp.get(n, 0.0), rel(ours[n], exact[n]))
    for _name, dims, kw, scale in t.JAX_CASES:
        x, cot = t.make_case(*dims, **kw)
        want = t.jax_scan_vjp(x, cot, scale)
        o, h_T = gd.forward(*x, scale=scale)
        ours = dict(zip(OUTS, (o, h_T, *gd.vjp(*x, *cot, scale=scale))))
        for n in OUTS:
            jx[n] = max(jx.get(n, 0.0), rel(ours[n], want[n]))
    fmt = lambda d: "  ".join(f"{n} {v:.1e}" for n, v in d.items())  # noqa: E731
    return ["trust of glaref.delta (tests/test_delta_trust.py's cases; worst per output):",
            f"  mpmath 50 digits, normwise relative ({', '.join(t.MP_CASES)}): {fmt(mp)}",
            f"  complex step, |cs - vjp| / sum|g u| ({len(t.SMALL)} cases): {fmt(cs)}",
            f"  central differences h = 1e-5, same measure: {fmt(fd)}",
            f"  jax.vjp of a float64 lax.scan, normwise ({len(t.JAX_CASES)} cases): {fmt(jx)}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/reports/delta_oracle_cpu.txt")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--trust-only", action="store_true")
    ap.add_argument("--no-trust", action="store_true")
    a = ap.parse_args(argv)
    if a.trust_only:
        print("\n".join(trust_figures()))
        return 0
    from glaref.delta import regimes

    t0 = time.time()
    lines = ["glaref.delta regimes: a float32 torch loop (autograd in float32) vs the float64 "
             "oracle on the same float32-rounded inputs",
             f"sizes {DIMS} unless the regime sets them; scale = dk^-0.5; seed 0",
             "per output: f32 normwise relative error max|f32 - truth| / max|truth|; "
             "[kappa = max(sum of |terms|) / max|truth|]; f64 gap = worst Numba-vs-NumPy over "
             "all outputs", ""]
    head = f"{'regime':<15}{'gate':<7}{'T':>5}{'G':>3}" + "".join(f"{n:>20}" for n in OUTS)
    lines.append(head + f"{'f64 gap':>10}")
    for name in (a.only or regimes.REGIMES):
        for gate in ("scalar", "vector"):
            for r in measure(name, gate):
                cells = "".join(f"{r['f32'][n]:>9.1e} [{r['kappa'][n]:>7.1e}]" for n in OUTS)
                lines.append(f"{name:<15}{gate:<7}{r['T']:>5}{r['G']:>3}{cells}"
                             f"{r['f64_gap']:>10.1e}")
                print(lines[-1], file=sys.stderr, flush=True)
    if not a.no_trust:
        lines += [""] + trust_figures()
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    lines += ["", f"machine: {os.cpu_count()} cores, load average {load}; "
              f"{time.time() - t0:.0f} s"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
