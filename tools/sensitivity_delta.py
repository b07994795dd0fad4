"""Sensitivity of the gated delta rule's verdict (``--recurrence delta``): the smallest injected
error that makes each output not ok, as a multiple of the output's natural error.

    python tools/sensitivity_delta.py --quick             # b1g2h4_d16 at T = 130, a few minutes
    python tools/sensitivity_delta.py --txt docs/reports/sensitivity_delta_cpu.txt   # seed configs

For each subject (glaref.delta.kernels' chunked as a user's callable, its structure unknown: the
CLI's defaults; chunked and scan by name, their design declared), input dtype, regime, config
and T, each output (o, h_T and the six gradients, dbeta included) is measured by the audit's own
runner (``glaref._audit._runners.JaxRunner``) and judged by the family's verdict
(``glaref.delta._family.assess_output``); ``glaref._audit._sensitivity.threshold`` finds the smallest
systematic x (1 + eps) and random x + eps |x| N(0, 1) error whose outcome is not ok. Target:
eps / natural <= 30 for every output (tests/zoo.py's SENSITIVITY_TARGET). Batch is cut to 1 and
heads to at most 8 on the seed configs (tools/sensitivity.py says why). Exit 0 when the target
holds everywhere.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from glaref._audit import (  # noqa: E402
    _claims,
    _device,  # noqa: E402
    _sensitivity,
)
from glaref._audit._presets import SEED_CONFIGS  # noqa: E402
from glaref._audit._runners import JaxRunner  # noqa: E402
from glaref._audit._subjects import Subject, resolve  # noqa: E402
from glaref._inputs import Dims  # noqa: E402
from glaref.delta import _family  # noqa: E402
from glaref.delta._family import AUDIT_REGIMES, DELTA  # noqa: E402

from zoo import MAX_HEADS  # noqa: E402
from zoo import SENSITIVITY_TARGET as TARGET  # noqa: E402

QUICK = {"b1g2h4_d16": ((1, 2, 4, 16, 16), 130)}
SUBJECTS = ("chunked (user)", "chunked", "scan")


def _seed_cases() -> dict:
    out = {}
    for name, (_, G, H, dk, dv) in SEED_CONFIGS.items():
        h = min(H, MAX_HEADS)
        out[name] = ((1, min(G, h), h, dk, dv), 512)
    return out


def measure(subject: str, dtype: str, regime: str, cfg: tuple, T: int, seed: int) -> list[dict]:
    """One problem's rows: per output, its natural error and the not-ok threshold per kind."""
    import jax

    from glaref.delta import kernels

    device = _device.select_device("cpu")
    claims = _claims.Claims(dtype=dtype, recurrence="delta")
    cdtype = claims.dtype
    with jax.default_device(device):
        if subject == "chunked (user)":     # a user's callable: nothing declared
            fn = _family_fn(kernels.chunked)
            s = Subject(subject, fn, claims.resolved(cdtype))
        else:
            s = resolve(subject, claims=claims, compute_dtype=cdtype, precision="default",
                        scale=1.0, family=DELTA)
        runner = JaxRunner(device=device, dtype=dtype, precision="default", layout="bhtd",
                           repeats=0, memory_guard=False, family=DELTA)
        B, G, H, dk, dv = cfg
        dp = DELTA.make_problem(regime, Dims(B, G, H, T, dk, dv), seed, dtype)
        truth = DELTA.truth(dp, 1.0, "numba")
        m = runner.measure(s, "fwd_bwd", truth, runner.prepare(dp))
    if m.failure:
        raise RuntimeError(f"{subject} {regime}: {m.failure}")

    def assess(t, name, x, dt):
        return _family.assess_output(t, name, x, dt, final=True, grads=True, claims=s.claims)

    rows = []
    for name, x in m.values.items():
        row = {"subject": subject, "dtype": dtype, "regime": regime, "T": T, "output": name}
        for kind in _sensitivity.KINDS:
            r = _sensitivity.threshold(truth, name, x, m.dtypes[name], kind, assess=assess)
            row.update(natural=r["natural"], clean=r["clean"], **{kind: r["ratio"]})
        rows.append(row)
    return rows


def _family_fn(chunked):
    def kernel(q, k, v, beta, log_alpha, h0, scale=1.0):
        return chunked(q, k, v, beta, log_alpha, h0, scale=scale, return_final_state=True)

    return kernel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="b1g2h4_d16 at T = 130")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--regimes", default=",".join(AUDIT_REGIMES))
    ap.add_argument("--subjects", default=",".join(SUBJECTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--txt")
    a = ap.parse_args(argv)
    cases = QUICK if a.quick else _seed_cases()
    t0 = time.perf_counter()
    rows = []
    for cname, (cfg, T) in cases.items():
        for subject in a.subjects.split(","):
            for dtype in a.dtypes.split(","):
                for regime in a.regimes.split(","):
                    print(f"{cname} T={T} {subject} {dtype} {regime}", file=sys.stderr,
                          flush=True)
                    rows += [replace_config(r, cname) for r in
                             measure(subject, dtype, regime, cfg, T, a.seed)]
    worst = {}
    for r in rows:
        key = (r["output"],)
        worst[key] = max(worst.get(key, 0.0), r["systematic"], r["random"])
    lines = [f"{'config':<18} {'subject':<15} {'dtype':<9} {'regime':<13} {'output':<10} "
             f"{'natural':>9} {'system.':>8} {'random':>8}"]
    for r in rows:
        lines.append(f"{r['config']:<18} {r['subject']:<15} {r['dtype']:<9} {r['regime']:<13} "
                     f"{r['output']:<10} {r['natural']:>9.2e} {r['systematic']:>8.3g} "
                     f"{r['random']:>8.3g}" + ("" if r["clean"] else "  (not clean)"))
    lines.append("worst threshold / natural per output: "
                 + ", ".join(f"{k[0]} {v:.3g}" for k, v in worst.items()))
    ok = all(v <= TARGET for v in worst.values()) and all(r["clean"] for r in rows)
    command = shlex.join(["python3", "tools/sensitivity_delta.py"]
                         + list(sys.argv[1:] if argv is None else argv))
    head = (f"glaref sensitivity, gated delta rule: {time.strftime('%Y-%m-%d')}\n"
            f"command: {command}\nwall {time.perf_counter() - t0:.0f} s; target <= {TARGET:g}")
    text = head + "\n" + "\n".join(lines) + "\n" + ("PASS" if ok else "FAIL")
    print(text)
    if a.txt:
        pathlib.Path(a.txt).write_text(text + "\n")
    return 0 if ok else 1


def replace_config(row: dict, cname: str) -> dict:
    return {"config": cname, **row}


if __name__ == "__main__":
    sys.exit(main())
