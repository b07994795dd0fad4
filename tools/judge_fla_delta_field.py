"""flash-linear-attention's float32 references of the gated delta rule, run as users run them,
judged by glaref's testing API (``glaref.testing.check_kernel(..., recurrence="delta")``).

    python3 tools/judge_fla_delta_field.py --quick          # T = 130 only, cut configs
    python3 tools/judge_fla_delta_field.py --seqs 130,2048  # -> docs/reports/fla_delta_field_cpu.*
    python3 tools/judge_fla_delta_field.py --refs naive_chunk_kda --seqs 8192 --configs cut

The references are the installed fla-core's (0.6.0) pure-torch ones, loaded from the
distribution's files as shipped (float32; ``judge_fla_delta.load_naive``): fla/ops/
gated_delta_rule/naive.py (``naive_recurrent_gated_delta_rule``, ``naive_chunk_gated_delta_rule``)
and fla/ops/kda/naive.py (``naive_recurrent_kda``, ``naive_chunk_kda``).

The convention (``glaref.conventions.fla_delta``'s table) is the identity under glaref's
layout "bthd": FLA's q, k [B, T, HQ, K], v [B, T, H, V], beta [B, T, H], g [B, T, H] (GDN) or
[B, T, H, K] (KDA), initial_state and the final state [B, H, K, V] are glaref.delta's q, k, v,
beta, log_alpha, h0, h_T; scale is passed explicitly; the in-kernel L2 normalisation and beta
sigmoid are off (the naive references have neither). ``naive_chunk_kda`` asserts T % chunk_size
== 0: where T is not a multiple of 64 the inputs are padded at the end with zeros (k = v = beta =
g = 0 leave the state unchanged) and o is cut back, as a user must; the GDN chunk reference pads
itself. The GDN references take q and k with H heads (no grouped heads): their rows use G = H.

The delta family is audited as JAX kernels only (``glaref.delta._family.DELTA.frameworks_too``
is False: ``check_kernel(..., framework="torch", recurrence="delta")`` is refused), so each torch
reference is handed to check_kernel as a JAX kernel whose forward and backward are the torch
reference's own (``jax.pure_callback`` into torch, float32 in and out; the backward is
``torch.autograd`` through the reference, recomputing its forward, under a ``jax.custom_vjp``):
the arithmetic judged is FLA's, in float32, differentiated by torch as users differentiate it.

Claims: dtype float32, layout "bthd", chunk_size 1 for the recurrent references and 64 with
decay_form "chunk_cumsum" (both chunk references take the cumulative sum of g inside each chunk)
for the chunk ones, gate "vector" for KDA; the family's default regimes (standard, strong_decay,
converged, beta_two), seed 0, scale dk ** -0.5. Each row's outcome and, per output, the ratio of
its error to the allowed (the calibrated tier's figure) are written as a table and JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import judge_fla_delta as jfd  # noqa: E402
from _reports import finish  # noqa: E402

REFS = tuple(jfd.REFERENCES)
GRADS = ("q", "k", "v", "beta", "log_alpha", "h0")
OUTS = ("o", "h_T") + GRADS
CHUNK = 64      # the chunk references' default chunk_size, as users call them
# The seed's four configs (B, G, H, dk, dv), and the same with batch and heads cut for long T
# (autograd through the references' Python loops over T and over the chunk's rows).
SEED = {"g2h8_d128": (4, 2, 8, 128, 128), "g1h24_dk128_dv64": (2, 1, 24, 128, 64),
        "g1h1_d128": (4, 1, 1, 128, 128), "g2h4_dk48_dv40": (4, 2, 4, 48, 40)}
CUT = {"g2h8_d128": (1, 2, 2, 128, 128), "g1h24_dk128_dv64": (1, 1, 2, 128, 64),
       "g1h1_d128": (1, 1, 1, 128, 128), "g2h4_dk48_dv40": (1, 2, 2, 48, 40)}


def torch_reference(name: str):
    """FLA's float32 reference ``name`` as a torch function of glaref.delta's arrays in layout
    "bthd": (q, k, v, beta, log_alpha, h0, scale) -> (o, h_T)."""
    import torch

    ref = jfd.REFERENCES[name]
    fn = getattr(jfd.load_naive(ref.module), name)

    def run(q, k, v, beta, g, h0, scale):
        T = q.shape[1]
        kw = dict(scale=scale, initial_state=h0, output_final_state=True)
        if ref.chunk:
            kw["chunk_size"] = CHUNK
        pad = (-T) % CHUNK if ref.chunk and ref.vector else 0
        if pad:          # naive_chunk_kda asserts T % chunk_size == 0: zero steps at the end
            def padded(x):
                return torch.cat([x, x.new_zeros((x.shape[0], pad) + x.shape[2:])], 1)

            q, k, v, beta, g = map(padded, (q, k, v, beta, g))
        o, h_T = fn(q, k, v, beta=beta, g=g, **kw)
        return o[:, :T], h_T

    return run


def jax_kernel(torch_fn, scale: float):
    """A JAX kernel of glaref's delta contract whose forward and backward are ``torch_fn``'s
    (float32 torch through ``jax.pure_callback``; the backward torch.autograd under a
    custom_vjp): (q, k, v, beta, log_alpha, h0) -> (o, h_T), layout "bthd"."""
    import jax
    import torch

    def shapes(q, v, h0):
        B, T, H, V = v.shape
        return (jax.ShapeDtypeStruct((B, T, H, V), np.float32),
                jax.ShapeDtypeStruct(h0.shape, np.float32))

    def host_fwd(*xs):
        with torch.no_grad():
            o, h_T = torch_fn(*(torch.from_numpy(np.array(x)) for x in xs), scale)
        return o.numpy().astype(np.float32), h_T.numpy().astype(np.float32)

    def host_bwd(*xs):
        t = [torch.from_numpy(np.array(x)).requires_grad_() for x in xs[:6]]
        o, h_T = torch_fn(*t, scale)
        do, dh_T = (torch.from_numpy(np.array(x)) for x in xs[6:])
        grads = torch.autograd.grad((o, h_T), t, (do.to(o.dtype), dh_T.to(h_T.dtype)),
                                    allow_unused=True)
        return tuple((torch.zeros_like(x) if g is None else g).numpy().astype(np.float32)
                     for g, x in zip(grads, t))

    @jax.custom_vjp
    def kernel(q, k, v, beta, log_alpha, h0):
        return jax.pure_callback(host_fwd, shapes(q, v, h0), q, k, v, beta, log_alpha, h0)

    def fwd(*xs):
        return kernel(*xs), xs

    def bwd(xs, cts):
        out = tuple(jax.ShapeDtypeStruct(x.shape, np.float32) for x in xs)
        return jax.pure_callback(host_bwd, out, *xs, *cts)

    kernel.defvjp(fwd, bwd)
    return kernel


def claims(name: str) -> dict:
    ref = jfd.REFERENCES[name]
    c = dict(recurrence="delta", dtype="float32", layout="bthd",
             gate="vector" if ref.vector else "scalar")
    c.update(dict(chunk_size=CHUNK, decay_form="chunk_cumsum") if ref.chunk else
             dict(chunk_size=1))
    return c


def dims_for(name: str, dims: tuple) -> tuple:
    """(B, G, H, dk, dv) the reference can take: G = H for the GDN references (no grouped
    heads)."""
    B, G, H, dk, dv = dims
    return dims if jfd.REFERENCES[name].gva else (B, H, H, dk, dv)


def judge(name: str, cfg: str, dims: tuple, T: int, *, regimes=None, seed: int = 0) -> list:
    """check_kernel's records of FLA's ``name`` at one config and T (every regime), with the
    outcome it ended in: "ok", "less_accurate" (LessAccurateWarning) or "FAIL"."""
    import glaref
    import glaref.testing as gt

    scale = dims[3] ** -0.5
    kern = jax_kernel(torch_reference(name), scale)
    c0 = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            records = gt.check_kernel(kern, framework="jax", configs={cfg: dims}, seqs=(T,),
                                      regimes=regimes, seed=seed, scale=scale,
                                      **claims(name))
            raised = None
        except AssertionError as exc:
            records, raised = getattr(exc, "records", []), str(exc)
        except (glaref.AuditUsageError, glaref.AuditEnvironmentError) as exc:
            # glaref declined the row (e.g. the oracle's error scales overflow at long T)
            records = [dict(ok=None, outcome="not_judged", regime=r, mode="fwd_bwd",
                            notes=[f"{type(exc).__name__}: {exc}"])
                       for r in (regimes or ("(family default)",))]
            raised = str(exc)
    cpu = time.process_time() - c0
    less = any(issubclass(w.category, Warning) and "less accurate" in str(w.message)
               for w in caught)
    for r in records:
        r["_cpu_s"] = cpu / max(len(records), 1)
        r["_raised"] = raised
        r["_less_warned"] = less
    return records


def judge_torch(fn, dims: tuple, T: int, regime: str, *, claims: dict, dtype: str = "float32",
                device: str = "cpu", seed: int = 0) -> dict:
    """One row through the delta family's records API, for a torch kernel on any device (the
    GPU path of tools/gpu_fla.py: Triton kernels on CUDA tensors): the family's problem
    (``make_problem``) in FLA's layout and ``dtype`` on ``device``, ``fn(q, k, v, beta, g, h0,
    scale) -> (o, h_T)`` run and differentiated by torch.autograd, and each output judged by
    ``glaref.delta._family.assess_outputs`` (the verdict check_kernel gives) under ``claims``
    (compute_dtype "tf32" allowed here, unlike for JAX kernels). Returns a dict: outcome (ok,
    less_accurate, FAIL), per output its outcome, ratio to the allowed and reason."""
    import torch

    from glaref._audit._claims import Claims
    from glaref._inputs import Dims, from_canonical, to_canonical
    from glaref.delta._family import KINDS, Truth, assess_outputs, fields, make_problem

    B, G, H, dk, dv = dims
    c = Claims(**{**claims, "recurrence": "delta", "dtype": dtype, "layout": "bthd"})
    dp = make_problem(regime, Dims(B, G, H, T, dk, dv), seed, dtype,
                      gate=claims.get("gate", "scalar"))
    scale = dk ** -0.5
    tdt = getattr(torch, dtype)
    x = {n: torch.tensor(from_canonical(a, KINDS[n], "bthd"), dtype=tdt, device=device)
         for n, a in fields(dp).items()}
    ins = [x[n].requires_grad_() for n in GRADS]
    t0 = time.perf_counter()
    o, h_T = fn(*ins, scale)
    grads = torch.autograd.grad((o, h_T), ins, (x["do"].to(o.dtype), x["dh_T"].to(h_T.dtype)))
    if device != "cpu":
        torch.cuda.synchronize()
    kernel_s = time.perf_counter() - t0
    got = dict(zip(OUTS, (o, h_T, *grads)))
    values = {n: to_canonical(v.detach().double().cpu().numpy(), KINDS[n], "bthd")
              for n, v in got.items()}
    dtypes = {n: str(v.dtype).removeprefix("torch.") for n, v in got.items()}
    per = assess_outputs(Truth(dp, scale, "numba"), values, dtypes, final=True, grads=True,
                         claims=c)
    outs = {}
    for n, a in per.items():
        out = "FAIL" if a.failed_tier else ("less_accurate" if a.ratio > a.allowed_ratio
                                            else "ok")
        outs[n] = dict(outcome=out, ratio_to_allowed=a.ratio / a.allowed_ratio,
                       rel_err=a.rel_err, reason=a.reason)
    worst = ("FAIL" if any(o["outcome"] == "FAIL" for o in outs.values()) else
             "less_accurate" if any(o["outcome"] == "less_accurate" for o in outs.values())
             else "ok")
    return dict(outcome=worst, outputs=outs, dims=list(dims), T=T, regime=regime, dtype=dtype,
                claims=claims, device=device, kernel_s=kernel_s)


def ratios(rec: dict) -> dict[str, float | None]:
    """Per output: its error over the allowed, the calibrated tier's figure (the record's
    reference_ratio, error / that of glaref's best same-precision reference kernels, over its
    allowed_ratio); > 1 is not ok."""
    allowed = rec.get("allowed_ratio")
    return {n: (None if r is None or not allowed else r / allowed)
            for n, r in (rec.get("reference_ratio") or {}).items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", default=",".join(REFS))
    ap.add_argument("--seqs", default="130,2048,8192")
    ap.add_argument("--configs", choices=("seed", "cut", "auto"), default="auto",
                    help="seed: the seed's four configs; cut: batch 1 and 2 value heads; auto: "
                         "seed at T <= 130, cut beyond")
    ap.add_argument("--config-names", default=None,
                    help=f"comma list among {list(SEED)} (default: all four)")
    ap.add_argument("--regimes", default=None, help="comma list (default: the family's)")
    ap.add_argument("--quick", action="store_true", help="T = 130, cut configs")
    ap.add_argument("--out", default="docs/reports/fla_delta_field_cpu")
    a = ap.parse_args(argv)
    try:
        import jax  # noqa: F401
        import torch
        for m in {r.module for r in jfd.REFERENCES.values()}:
            jfd.load_naive(m)
    except (ImportError, jfd.MissingField) as e:
        print(f"judge_fla_delta_field: {e}", file=sys.stderr)
        return 3
    torch.set_num_threads(1)
    refs = [r for r in a.refs.split(",") if r]
    bad = sorted(set(refs) - set(REFS))
    if bad:
        ap.error(f"--refs: got {bad}, expected among {REFS}")
    seqs = [130] if a.quick else [int(s) for s in a.seqs.split(",")]
    regimes = a.regimes.split(",") if a.regimes else None
    rows, lines = [], []
    head = (f"{'reference':<34}{'config':<18}{'B,G,H,dk,dv':<16}{'T':>6}  {'regime':<13}"
            f"{'mode':<8}{'outcome':<14}" + "".join(f"{n:>10}" for n in OUTS) + f"{'cpu_s':>8}")
    for name in refs:
        for T in seqs:
            use = CUT if a.quick or a.configs == "cut" or (a.configs == "auto" and T > 130) \
                else SEED
            for cfg, d in use.items():
                if a.config_names and cfg not in a.config_names.split(","):
                    continue
                dims = dims_for(name, d)
                recs = judge(name, cfg, dims, T, regimes=regimes)
                for r in recs:
                    outcome = "FAIL" if r.get("ok") is False else str(r.get("outcome"))
                    if outcome == "not_judged":
                        rows.append(dict(reference=name, config=cfg, dims=list(dims), T=T,
                                         regime=r["regime"], outcome=outcome, notes=r["notes"]))
                        lines.append(f"{name:<34}{cfg:<18}{','.join(map(str, dims)):<16}{T:>6}  "
                                     f"not judged: {r['notes'][0][:300]}")
                        print(lines[-1], file=sys.stderr, flush=True)
                        continue
                    rat = ratios(r)
                    row = dict(reference=name, config=cfg, dims=list(dims), T=T,
                               regime=r.get("regime"), mode=r.get("mode"), outcome=outcome,
                               ratio_to_allowed=rat, cpu_s=round(r["_cpu_s"], 2),
                               notes=r.get("notes"), outcomes=r.get("outcomes"),
                               rel_err=r.get("rel_err_out"), rel_err_grads=r.get("rel_err_grads"),
                               allowed_ratio=r.get("allowed_ratio"),
                               reference_rel_err=r.get("reference_rel_err"))
                    rows.append(row)
                    line = (f"{name:<34}{cfg:<18}{','.join(map(str, dims)):<16}{T:>6}  "
                            f"{str(r.get('regime')):<13}{str(r.get('mode')):<8}{outcome:<14}"
                            + "".join(f"{rat[n]:>10.3g}" if rat.get(n) is not None else
                                      f"{'-':>10}" for n in OUTS) + f"{r['_cpu_s']:>8.1f}")
                    lines.append(line)
                    print(line, file=sys.stderr, flush=True)
    load = os.getloadavg()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    env = dict(fla_core=importlib.metadata.version("fla-core"), torch=torch.__version__,
               jax=jax.__version__, python=platform.python_version(), machine=platform.node(),
               loadavg=[round(x, 2) for x in load], cpu_s=round(ru.ru_utime + ru.ru_stime, 1),
               torch_threads=1)
    text = "\n".join(
        [f"fla-core {env['fla_core']} float32 references judged by glaref.testing.check_kernel("
         "recurrence='delta'), fwd_bwd; per output the error over the allowed (calibrated tier: "
         "ratio to glaref's same-precision reference kernels / calibrated_ratio; > 1 is not ok)",
         head, *lines,
         f"env: {json.dumps(env)}",
         "configs: seed = the seed's four (B, G, H, dk, dv); cut = batch 1, at most 2 value "
         "heads (G <= H); GDN references run with G = H"]) + "\n"
    return finish(text, a.out, env, rows)


if __name__ == "__main__":
    sys.exit(main())
