"""The float32 error of the gated delta rule's reference kernels (glaref.delta._baseline), per
output and regime, and their CPU time.

    python3 tools/delta_baseline_table.py [--T 512] [--regimes standard,strong_decay]
        [--gates scalar,vector] [--seed 0] [--out FILE]

At the seed config g2h8_d128 with B cut to 1 (G=2, H=8, dk=dv=128), the regime's inputs are
rounded to float32, the float64 oracle (glaref.delta, Numba) runs on them, and so does every
reference kernel in float32 (and with bfloat16 matrix-product operands): the scan (dot products
in lanes, and term by term), the WY / UT chunked form at 64 with segment-sum decays (dlog_alpha
direct) and with chunk-local cumsum decays (dlog_alpha through the cumsum, the identity form:
flash-linear-attention's design). Each cell is the
normwise relative error ||ref - oracle||_2 / ||oracle||_2 of one output; the last column the
kernel's fwd + bwd CPU seconds (process time, all threads; compile excluded by a warm-up).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _reports import save_text  # noqa: E402

from glaref._audit._metrics import rel_err  # noqa: E402
from glaref._inputs import Dims  # noqa: E402
from glaref.delta import _baseline, regimes  # noqa: E402
from glaref.delta._oracle import OUTPUTS, DeltaProblem, backend  # noqa: E402

SCALE = 128 ** -0.5
# (kernel, chunk, decay, order): the scan in lanes (the held-to design) and term by term (a
# field design), the chunked form with either decay form
KERNELS = (("scan", 1, "segment_sums", "lanes"), ("scan", 1, "segment_sums", "sequential"),
           ("chunked", 64, "segment_sums", None), ("chunked", 64, "chunk_cumsum", None))


def _rounded(dp: DeltaProblem) -> DeltaProblem:
    r = lambda x: None if x is None else x.astype(np.float32).astype(np.float64)  # noqa: E731
    p = dp.p
    return DeltaProblem(p._replace(q=r(p.q), k=r(p.k), v=r(p.v), log_alpha=r(p.log_alpha),
                                   h0=r(p.h0), do=r(p.do), dh_T=r(p.dh_T)), r(dp.beta))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--regimes", default="standard,strong_decay")
    ap.add_argument("--gates", default="scalar,vector")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dims = Dims(B=1, G=2, H=8, T=a.T, dk=128, dv=128)
    warm = regimes.make_inputs("standard", Dims(1, 1, 1, 8, 4, 4), 0)
    lines = [f"glaref.delta reference kernels, float32, g2h8_d128 (B=1), T={a.T}, seed {a.seed}; "
             f"load average {os.getloadavg()[0]:.1f}",
             "normwise relative error per output vs the float64 oracle on the float32-rounded "
             "inputs; cpu = fwd + bwd CPU seconds (all threads)", ""]
    head = f"{'regime':14s} {'gate':6s} {'kernel':22s} {'operand':8s} " + " ".join(
        f"{n:>9s}" for n in OUTPUTS) + f" {'cpu s':>6s}"
    lines.append(head)
    for gate in a.gates.split(","):
        for kernel, C, decay, order in KERNELS:
            _baseline.run(kernel, warm, SCALE, chunk=C, decay=decay, order=order)  # compile
        for regime in a.regimes.split(","):
            dp = _rounded(regimes.make_inputs(regime, dims, a.seed, gate=gate))
            p, be = dp.p, backend("numba")
            o, h_T = be.forward(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, SCALE)
            g = be.vjp(p.q, p.k, p.v, dp.beta, p.log_alpha, p.h0, p.do, p.dh_T, SCALE)
            ref = dict(zip(OUTPUTS, (o, h_T, *g)))
            for kernel, C, decay, order in KERNELS:
                for operand in (None, "bfloat16"):
                    t0 = time.process_time()
                    res = _baseline.run(kernel, dp, SCALE, chunk=C, decay=decay, operand=operand,
                                        order=order)
                    cpu = time.process_time() - t0
                    name = f"scan {order}" if kernel == "scan" else f"chunked{C} {decay}"
                    row = (f"{regime:14s} {gate:6s} {name:22s} {operand or '-':8s} "
                           + " ".join(f"{rel_err(res[n], ref[n]):9.2e}" for n in OUTPUTS)
                           + f" {cpu:6.2f}")
                    lines.append(row)
                    print(row, file=sys.stderr, flush=True)
    lines.append(f"load average at the end {os.getloadavg()[0]:.1f}")
    save_text("\n".join(lines) + "\n", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
