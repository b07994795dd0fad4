"""Third-party JAX implementations of the gated delta rule, fetched as a user would, judged by
glaref's audit of the delta family (``glaref.testing.check_kernel(..., recurrence="delta")``).

    python3 tools/judge_delta_thirdparty.py --maxtext DIR --linearnexus DIR [--seqs 130,2048]
        -> docs/reports/delta_thirdparty_cpu.txt / .json

DIR is a checkout (or exported tree) of the project: nothing of it is stored in glaref. Each
project imports much of itself (flax, its own layers), so this tool reads the one source file,
takes the named top-level functions out of it with ``ast`` and executes only those, with jax,
jax.numpy and lax in their namespace (:func:`extract`):

- MaxText (AI-Hypercomputer/maxtext) src/maxtext/models/qwen3.py (or the older
  src/MaxText/layers/qwen3.py): ``jax_chunk_gated_delta_rule(query, key, value, g, beta,
  chunk_size=64, initial_state, use_qk_norm_in_gdn, compute_dtype)``, layout [B, T, H, *], scale
  fixed at K ** -0.5 inside, h_T returned only when initial_state is given. Run with
  use_qk_norm_in_gdn=False, chunk_size 64, and compute_dtype float32 (a float32 model) or
  bfloat16 (its default: q, k, v, beta and the WY factors u, w rounded to bfloat16), the latter
  twice: claimed as bfloat16 inputs accumulating in float32, and with ``operand_dtype=
  "bfloat16"`` too (the claim closest to what it does: bfloat16 factors in its products
  k_beta k^T, q k^T, A v_beta and w h; but also u, S and q k^T rounded to bfloat16 as results,
  which no claim covers).
- linearnexus (saran-gangster/linearnexus) linearnexus/modules/linear_attn/gated_deltanet.py:
  ``gated_delta_rule_recurrent`` (a lax.scan over steps) and ``gated_delta_rule_chunkwise``
  (WY form, chunk 64, sub-tiles of 16), layout [B, H, T, *], scale passed, use_qk_l2norm=False.

The kernel contract is glaref's delta one, ``kernel(q, k, v, beta, log_alpha, h0) -> (o, h_T)``
(g = log_alpha, initial_state = h0); neither project groups q, k heads under value heads in
these functions, so every config has G = H. Gradients through jax.vjp (plain autodiff: neither
defines a custom_vjp). Claims: dtype, layout, chunk_size (1 for the scan, 64 with decay_form
"chunk_cumsum" for the chunked ones: both take the cumulative sum of g inside each chunk).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import resource
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _reports import finish  # noqa: E402

OUTS = ("o", "h_T", "q", "k", "v", "beta", "log_alpha", "h0")
MAXTEXT_FILES = ("src/maxtext/models/qwen3.py", "src/MaxText/layers/qwen3.py")
LINEARNEXUS_FILE = "linearnexus/modules/linear_attn/gated_deltanet.py"
# small configs (B, G, H, dk, dv), G = H; the second at T = 130 only
CONFIGS = {"b1h4_dk16_dv16": (1, 4, 4, 16, 16), "b2h2_dk48_dv40": (2, 2, 2, 48, 40)}


def extract(path: str, names: tuple[str, ...]) -> dict[str, Callable]:
    """The top-level functions ``names`` of the Python file ``path``, compiled alone (the rest of
    the file, its imports included, is not executed) in a namespace holding jax, jax.numpy as
    jnp, lax, math and the typing names they annotate with."""
    import math

    import jax
    import jax.numpy as jnp
    from jax import lax

    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names}
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"{path}: no top-level function {missing}")
    ns: dict[str, Any] = dict(jax=jax, jnp=jnp, lax=lax, math=math, Array=jax.Array,
                              Optional=Optional, Tuple=Tuple, Any=Any)
    mod = ast.Module(body=[found[n] for n in names], type_ignores=[])
    exec(compile(mod, path, "exec"), ns)
    return {n: ns[n] for n in names}


def source(root: str, candidates: tuple[str, ...], flag: str) -> str:
    for rel in candidates:
        p = os.path.join(root, rel)
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(f"{flag}: got {root!r}, expected a folder holding one of {candidates}")


@dataclass
class Subject:
    name: str
    kernel: Callable
    claims: dict
    fixed_scale: bool = False         # the implementation applies K ** -0.5 itself
    modes: tuple = ("fwd", "fwd_bwd")
    note: str = ""
    extra: dict = field(default_factory=dict)


def maxtext_subjects(root: str) -> list[Subject]:
    import jax.numpy as jnp

    path = source(root, MAXTEXT_FILES, "--maxtext")
    fn = extract(path, ("jax_chunk_gated_delta_rule",))["jax_chunk_gated_delta_rule"]

    def make(compute):
        def maxtext_chunk_gdr(q, k, v, beta, log_alpha, h0):
            return fn(q, k, v, log_alpha, beta, chunk_size=64, initial_state=h0,
                      use_qk_norm_in_gdn=False, compute_dtype=compute)
        return maxtext_chunk_gdr

    base = dict(layout="bthd", chunk_size=64, decay_form="chunk_cumsum")
    bf16 = dict(base, dtype="bfloat16", accumulate_dtype="float32")
    return [Subject("maxtext_chunk[compute=float32]", make(jnp.float32),
                    dict(base, dtype="float32"), True, note=os.path.relpath(path, root)),
            Subject("maxtext_chunk[compute=bfloat16]", make(jnp.bfloat16), bf16, True,
                    note="its default compute_dtype, bfloat16 inputs"),
            Subject("maxtext_chunk[compute=bfloat16,operand=bf16]", make(jnp.bfloat16),
                    dict(bf16, operand_dtype="bfloat16"), True,
                    note="as above, claiming operand_dtype='bfloat16'")]


def linearnexus_subjects(root: str) -> list[Subject]:
    path = source(root, (LINEARNEXUS_FILE,), "--linearnexus")
    f = extract(path, ("gated_delta_rule_recurrent", "gated_delta_rule_chunkwise"))

    def recurrent(q, k, v, beta, log_alpha, h0, scale):
        return f["gated_delta_rule_recurrent"](q, k, v, log_alpha, beta, scale=scale,
                                               initial_state=h0, use_qk_l2norm=False)

    def chunkwise(q, k, v, beta, log_alpha, h0, scale):
        return f["gated_delta_rule_chunkwise"](q, k, v, log_alpha, beta, scale=scale,
                                               initial_state=h0, chunk_size=64,
                                               use_qk_l2norm=False)

    return [Subject("linearnexus_recurrent", recurrent,
                    dict(layout="bhtd", chunk_size=1, dtype="float32")),
            Subject("linearnexus_chunkwise", chunkwise,
                    dict(layout="bhtd", chunk_size=64, decay_form="chunk_cumsum",
                         dtype="float32"))]


def judge(s: Subject, cfg: str, dims: tuple, T: int, regimes=None) -> list[dict]:
    """check_kernel's records for one subject, config and T (every regime, both modes)."""
    import glaref.testing as gt

    scale = dims[3] ** -0.5
    kern = s.kernel
    if not s.fixed_scale:
        import functools
        kern = functools.partial(s.kernel, scale=scale)
        kern.__name__ = s.name
    c0 = time.process_time()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            recs = gt.check_kernel(kern, framework="jax", configs={cfg: dims}, seqs=(T,),
                                   regimes=regimes, modes=s.modes, scale=scale,
                                   recurrence="delta", **s.claims)
        except AssertionError as exc:
            recs = getattr(exc, "records", [])
    cpu = time.process_time() - c0
    for r in recs:
        r["_cpu_s"] = cpu / max(len(recs), 1)
    return recs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--maxtext", help="a MaxText checkout or exported tree")
    ap.add_argument("--linearnexus", help="a linearnexus checkout or exported tree")
    ap.add_argument("--seqs", default="130,2048")
    ap.add_argument("--only", default=None, help="comma list of subject names")
    ap.add_argument("--regimes", default=None, help="comma list (default: the family's)")
    ap.add_argument("--out", default="docs/reports/delta_thirdparty_cpu")
    a = ap.parse_args(argv)
    if not (a.maxtext or a.linearnexus):
        ap.error("give at least one of --maxtext DIR, --linearnexus DIR")
    try:
        import jax
    except ImportError as e:
        print(f"judge_delta_thirdparty: {e}", file=sys.stderr)
        return 3
    subjects = []
    try:
        if a.maxtext:
            subjects += maxtext_subjects(a.maxtext)
        if a.linearnexus:
            subjects += linearnexus_subjects(a.linearnexus)
    except (FileNotFoundError, LookupError) as e:
        print(f"judge_delta_thirdparty: {e}", file=sys.stderr)
        return 2
    if a.only:
        subjects = [s for s in subjects if s.name in a.only.split(",")]
    seqs = [int(x) for x in a.seqs.split(",")]
    regimes = a.regimes.split(",") if a.regimes else None
    rows, lines = [], []
    head = (f"{'implementation':<46}{'config':<16}{'T':>6}  {'regime':<13}{'mode':<8}"
            f"{'outcome':<15}" + "".join(f"{n:>10}" for n in OUTS) + f"{'cpu_s':>7}")
    for s in subjects:
        for T in seqs:
            cfgs = CONFIGS if T <= 130 else dict(list(CONFIGS.items())[:1])
            for cfg, dims in cfgs.items():
                for r in judge(s, cfg, dims, T, regimes):
                    allowed = r.get("allowed_ratio")
                    rat = {n: (x / allowed if allowed and x is not None else None)
                           for n, x in (r.get("reference_ratio") or {}).items()}
                    outcome = "FAIL" if r.get("ok") is False else str(r.get("outcome"))
                    rows.append(dict(implementation=s.name, config=cfg, dims=list(dims), T=T,
                                     regime=r.get("regime"), mode=r.get("mode"),
                                     outcome=outcome, outcomes=r.get("outcomes"),
                                     ratio_to_allowed=rat, allowed_ratio=allowed,
                                     rel_err=r.get("rel_err_out"),
                                     rel_err_grads=r.get("rel_err_grads"),
                                     reference_rel_err=r.get("reference_rel_err"),
                                     nonfinite=r.get("nonfinite"), failures=r.get("failures"),
                                     notes=r.get("notes"), claims=s.claims,
                                     cpu_s=round(r["_cpu_s"], 2)))
                    lines.append(f"{s.name:<46}{cfg:<16}{T:>6}  {str(r.get('regime')):<13}"
                                 f"{str(r.get('mode')):<8}{outcome:<15}" + "".join(
                                     f"{rat[n]:>10.3g}" if rat.get(n) is not None else
                                     f"{'-':>10}" for n in OUTS) + f"{r['_cpu_s']:>7.1f}")
                    print(lines[-1], file=sys.stderr, flush=True)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    env = dict(jax=jax.__version__, backend=jax.default_backend(),
               python=platform.python_version(),
               loadavg=[round(x, 2) for x in os.getloadavg()],
               cpu_s=round(ru.ru_utime + ru.ru_stime, 1),
               sources={s.name: s.note for s in subjects if s.note})
    text = "\n".join(
        ["third-party JAX gated delta rule implementations judged by glaref.testing.check_kernel("
         "recurrence='delta'); per output the error over the allowed (calibrated tier: ratio to "
         "glaref's same-precision reference kernels / allowed_ratio; > 1 is not ok)",
         head, *lines, f"env: {json.dumps(env)}",
         "configs (B, G, H, dk, dv): " + "; ".join(f"{k}={v}" for k, v in CONFIGS.items())
         + f" (T > 130: {list(CONFIGS)[0]} only)"]) + "\n"
    return finish(text, a.out, env, rows)


if __name__ == "__main__":
    sys.exit(main())
