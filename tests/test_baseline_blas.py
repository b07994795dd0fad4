"""The reference kernels' figures do not depend on the BLAS kernel a machine picks (issue 23).

``np.matmul`` in float32 sums in an order that differs between OpenBLAS's kernels (Haswell,
SkylakeX, Prescott), so reference kernels that called it gave other reference errors, and other
verdicts, on other CPUs. glaref's reference kernels (glaref/gla/_baseline.py) sum every product in a
fixed order of their own (``_baseline_scan.bmm``) and every sum over steps by cumulative sums.
Here each runs in subprocesses under OPENBLAS_CORETYPE=Haswell and Prescott (SkylakeX needs
AVX-512, which not every CPU has) and must give the same bytes; the same subprocesses show that
np.matmul itself differs there, so that the comparison can fail.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from glaref import regimes
from glaref._inputs import Dims
from glaref.gla import _baseline
from glaref.tolerances import tol

CORETYPES = ("Haswell", "Prescott")
DIMS = Dims(B=1, G=1, H=2, T=70, dk=24, dv=20)

_CHILD = r"""
import hashlib, json, sys
import numpy as np
from glaref.gla import _baseline
from glaref import regimes
from glaref._inputs import Dims
from glaref.tolerances import tol

d = Dims(**json.loads(sys.argv[1]))
out = {}
rng = np.random.default_rng(0)
a = rng.standard_normal((64, 128)).astype(np.float32)
b = rng.standard_normal((128, 48)).astype(np.float32)
out["np.matmul"] = hashlib.sha256((a @ b).tobytes()).hexdigest()
for gate in ("scalar", "vector"):
    p = regimes.make_inputs("strong_decay", d, 0, gate=gate)
    for kernel, decay in (("scan", "segment_sums"), ("chunked", "segment_sums"),
                          ("chunked", "chunk_cumsum")):
        for operand, order in ((None, None), ("bfloat16", None), (None, "sequential")):
            r = _baseline.run(kernel, p, 0.3, chunk=32, decay=decay, operand=operand, order=order)
            h = hashlib.sha256()
            for name in sorted(r):
                h.update(name.encode() + r[name].tobytes())
            out[f"{gate} {kernel} {decay} {operand} {order}"] = h.hexdigest()
print(json.dumps(out))
"""


def _run_under(coretype: str) -> dict[str, str]:
    env = dict(os.environ, OPENBLAS_CORETYPE=coretype, OPENBLAS_VERBOSE="0")
    res = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(dataclasses.asdict(DIMS))],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow        # two subprocesses, each compiling the reference kernels: ~1 min
@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"),
                    reason="OPENBLAS_CORETYPE names x86-64 kernels")
def test_reference_kernels_give_the_same_bytes_under_every_blas_kernel():
    runs = {c: _run_under(c) for c in CORETYPES}
    first, *others = CORETYPES
    for c in others:
        same = {k for k in runs[first] if k != "np.matmul" and runs[first][k] == runs[c][k]}
        differ = sorted(set(runs[first]) - {"np.matmul"} - same)
        assert not differ, f"reference kernels differ between {first} and {c}: {differ}"
    matmuls = {runs[c]["np.matmul"] for c in CORETYPES}
    if len(matmuls) == 1:
        pytest.skip("np.matmul float32 gives the same bytes under every coretype tried here, so "
                    "this machine cannot show the dependence the test guards against")


@pytest.mark.parametrize("order", _baseline.ORDERS)
def test_the_fixed_order_product_is_a_matrix_product(order):
    """_dot against float64 products: within float32 accumulation's bound, batch axes broadcast,
    and exactly its documented order on one entry."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 1, 5, 37)).astype(np.float32)
    b = rng.standard_normal((4, 37, 6)).astype(np.float32)
    got = _baseline._dot(a, b, order)
    exact = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == (3, 4, 5, 6) and got.dtype == np.float32
    bound = 37 * np.finfo(np.float32).eps * np.matmul(np.abs(a.astype(np.float64)),
                                                      np.abs(b.astype(np.float64)))
    assert np.all(np.abs(got - exact) <= bound)
    f = np.float32
    prod = (a[0, 0, 0] * b[0, :, 0]).astype(np.float32)        # each product rounded first
    if order == "sequential":                                  # one term after another
        acc = f(0)
        for k in range(37):
            acc = f(acc + prod[k])
        assert got[0, 0, 0, 0] == acc
        return
    # lanes: lane l sums the terms k = l, l + 8, ... (k < 32) in turn, the lanes combine as
    # ((0+1)+(2+3))+((4+5)+(6+7)), the 5 remaining terms summed apart and added last
    lanes = [f(0)] * 8
    for k in range(32):
        lanes[k % 8] = f(lanes[k % 8] + prod[k])
    rest = f(0)
    for k in range(32, 37):
        rest = f(rest + prod[k])
    tree = f(f(f(lanes[0] + lanes[1]) + f(lanes[2] + lanes[3]))
             + f(f(lanes[4] + lanes[5]) + f(lanes[6] + lanes[7])))
    assert got[0, 0, 0, 0] == f(tree + rest)


@pytest.mark.parametrize("gate", ("scalar", "vector"))
def test_decay_forms_agree_in_float64_and_differ_in_float32(gate):
    """The cumulative-sum decays are the same kernel in exact arithmetic (float64 agrees with the
    segment sums to float64 rounding) and a different rounding in float32."""
    p = regimes.make_inputs("strong_decay", DIMS, 1, gate=gate)
    seg64 = _baseline.run("chunked", p, 0.3, arith="float64", chunk=32)
    cum64 = _baseline.run("chunked", p, 0.3, arith="float64", chunk=32, decay="chunk_cumsum")
    seg32 = _baseline.run("chunked", p, 0.3, chunk=32)
    cum32 = _baseline.run("chunked", p, 0.3, chunk=32, decay="chunk_cumsum")
    sep = tol("arith_separator_f32_f64")
    for name in seg64:
        err = np.linalg.norm(cum64[name] - seg64[name]) / np.linalg.norm(seg64[name])
        assert err < sep, (name, err)
    assert any(not np.array_equal(cum32[n], seg32[n]) for n in seg32)


def test_decay_form_is_checked():
    p = regimes.make_inputs("standard", DIMS, 0)
    with pytest.raises(ValueError, match="decay: got 'global'"):
        _baseline.run("chunked", p, 0.3, decay="global")
