"""glaref._audit._frameworks.run_kernel: torch, NumPy and JAX kernels run on one problem, results read back
as canonical float64 (no verdict). A correct step-by-step kernel written here in each framework
must agree with the oracle on the inputs the runner says it gave, under every name and layout."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest

import glaref
from glaref import DTypeError, LayoutError
from glaref._audit._frameworks import Call, detect_framework, run_kernel
from glaref._inputs import GRADS
from glaref.tolerances import tol

from conftest import assert_scaled, rand_problem

try:
    import torch
except ImportError:
    torch = None
# the NumPy and JAX tests run without torch
needs_torch = pytest.mark.skipif(torch is None,
                                 reason="torch is not installed (pip install 'glaref[torch]')")



def torch_loop(q, k, v, log_alpha, h0, scale=1.0, layout="bhtd", final=True):
    """The recurrence step by step in torch (autograd differentiates it)."""
    if layout == "bthd":
        q, k, v, log_alpha = (x.transpose(1, 2) for x in (q, k, v, log_alpha))
    G, H = q.shape[1], v.shape[1]
    q, k = (x.repeat_interleave(H // G, dim=1) for x in (q, k))
    S, outs = h0, []
    for t in range(q.shape[2]):
        S = S * torch.exp(log_alpha[:, :, t])[..., None, None] + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(scale * (q[:, :, t, :, None] * S).sum(-2))
    o = torch.stack(outs, 2)
    if layout == "bthd":
        o = o.transpose(1, 2)
    return (o, S) if final else o


def numpy_loop(q, k, v, log_alpha, h0, scale=1.0):
    G, H = q.shape[1], v.shape[1]
    q, k = (np.repeat(x, H // G, axis=1) for x in (q, k))
    S, outs = h0.astype(np.float64), []
    for t in range(q.shape[2]):
        S = S * np.exp(log_alpha[:, :, t])[..., None, None] + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(scale * (q[:, :, t, :, None] * S).sum(-2))
    return np.stack(outs, 2).astype(q.dtype), S.astype(q.dtype)


def check_against_oracle(run, tolerance, with_grads=True, scale=1.0):
    """Every output and gradient of ``run`` within ``tolerance`` of the oracle on run.inputs."""
    p = run.inputs
    args = (p.q, p.k, p.v, p.log_alpha, p.h0)
    o, h_T = glaref.forward(*args, scale=scale)
    sc = glaref.scales(*args, p.do, p.dh_T if run.final_state else None, scale=scale)
    assert_scaled(run.outputs["o"], o, sc.o, tolerance, "o")
    if run.final_state:
        assert_scaled(run.outputs["h_T"], h_T, sc.h_T, tolerance, "h_T")
    if with_grads:
        g = glaref.vjp(*args, p.do, p.dh_T if run.final_state else None, scale=scale)
        for n in GRADS:
            assert_scaled(run.grads[n], getattr(g, n), getattr(sc, n), tolerance, f"d{n}")


@needs_torch
@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_torch_float64_kernel_every_gradient(layout):
    p = rand_problem(2, 2, 4, 13, 5, 3, seed=1)
    run = run_kernel(functools.partial(torch_loop, layout=layout), p, "float64",
                     call=Call(layout=layout))
    assert run.ok and run.framework == "torch" and run.final_state
    assert run.outputs["o"].shape == (2, 4, 13, 3) and run.grads["q"].shape == (2, 2, 13, 5)
    assert set(run.dtypes.values()) == {"float64"}
    assert set(run.dtypes) == {"o", "h_T", "dq", "dk", "dv", "dlog_alpha", "dh0"}
    np.testing.assert_array_equal(run.inputs.q, p.q)       # float64: nothing rounded
    check_against_oracle(run, tol("frameworks_loop_f64"))


@needs_torch
def test_torch_float32_kernel_sees_rounded_inputs():
    p = rand_problem(1, 1, 2, 16, 8, 8, seed=2)
    run = run_kernel(torch_loop, p, "float32")
    assert run.ok and set(run.dtypes.values()) == {"float32"}
    np.testing.assert_array_equal(run.inputs.v, p.v.astype(np.float32).astype(np.float64))
    assert not np.array_equal(run.inputs.v, p.v)
    check_against_oracle(run, tol("frameworks_loop_f32"))


@needs_torch
def test_torch_bfloat16_dtypes_are_recorded():
    p = rand_problem(1, 1, 1, 4, 2, 2, seed=3)

    def bf16_out(q, k, v, log_alpha, h0):        # computes in float32, returns bfloat16
        o, h = torch_loop(q.float(), k.float(), v.float(), log_alpha.float(), h0.float())
        return o.bfloat16(), h
    run = run_kernel(bf16_out, p, "bfloat16")
    assert run.ok
    assert run.dtypes["o"] == "bfloat16" and run.dtypes["h_T"] == "float32"
    assert run.dtypes["dq"] == "bfloat16"      # gradients come back in the inputs' dtype
    want = torch.from_numpy(p.q).bfloat16().double().numpy()
    np.testing.assert_array_equal(run.inputs.q, want)


@needs_torch
def test_scale_is_passed_when_the_signature_takes_it():
    p = rand_problem(1, 1, 2, 5, 3, 3, seed=4)
    run = run_kernel(torch_loop, p, "float64", call=Call(scale=0.3))
    check_against_oracle(run, tol("frameworks_loop_f64"), scale=0.3)


@needs_torch
def test_kernel_returning_o_only():
    p = rand_problem(1, 2, 2, 6, 3, 4, seed=5)
    run = run_kernel(functools.partial(torch_loop, final=False), p, "float64")
    assert run.ok and run.final_state is False and set(run.outputs) == {"o"}
    check_against_oracle(run, tol("frameworks_loop_f64"))


@needs_torch
def test_unused_input_has_zero_gradient():
    p = rand_problem(1, 1, 1, 5, 2, 2, seed=6)

    def ignores_h0(q, k, v, log_alpha, h0):
        return torch_loop(q, k, v, log_alpha, torch.zeros_like(h0))
    run = run_kernel(ignores_h0, p, "float64")
    assert run.ok
    np.testing.assert_array_equal(run.grads["h0"], np.zeros_like(p.h0))


def test_numpy_kernel_forward_only():
    p = rand_problem(2, 1, 2, 9, 4, 3, seed=7)
    run = run_kernel(numpy_loop, p, "float64")
    assert run.ok and run.framework == "numpy" and run.grads is None
    assert "forward only" in run.no_grads
    check_against_oracle(run, tol("frameworks_loop_f64"), with_grads=False)
    run32 = run_kernel(numpy_loop, p, "float32")
    assert run32.dtypes == {"o": "float32", "h_T": "float32"}
    check_against_oracle(run32, tol("frameworks_loop_f32"), with_grads=False)


def test_jax_kernel_through_vjp():
    pytest.importorskip("jax")
    p = rand_problem(1, 1, 2, 12, 4, 4, seed=8)
    run = run_kernel(glaref.kernels.scan, p, "float32")      # detected from its module
    assert run.ok and run.framework == "jax" and run.final_state is False
    check_against_oracle(run, tol("frameworks_loop_f32"))


@needs_torch
def test_torch_kernel_without_grad_runs_forward_only():
    p = rand_problem(1, 1, 1, 4, 2, 2, seed=9)

    def detached(q, k, v, log_alpha, h0):
        with torch.no_grad():
            return torch_loop(q, k, v, log_alpha, h0)
    run = run_kernel(detached, p, "float64")
    assert run.ok and run.grads is None and "do not require grad" in run.no_grads
    check_against_oracle(run, tol("frameworks_loop_f64"), with_grads=False)


@needs_torch
def test_kernel_that_raises_is_reported_not_raised():
    p = rand_problem(1, 1, 1, 3, 2, 2, seed=10)

    def broken(q, k, v, log_alpha, h0):
        raise RuntimeError("triton: out of shared memory")
    run = run_kernel(broken, p, "float32", call=Call(framework="torch"))
    assert not run.ok and run.outputs == {}
    assert run.error["stage"] == "forward" and run.error["type"] == "RuntimeError"
    assert "out of shared memory" in run.error["message"] and "broken" in run.error["traceback"]


@needs_torch
def test_backward_that_raises_keeps_the_outputs():
    p = rand_problem(1, 1, 1, 3, 2, 2, seed=11)

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise NotImplementedError("backward not written yet")

    def kernel(q, k, v, log_alpha, h0):
        o, h = torch_loop(q, k, v, log_alpha, h0)
        return NoBackward.apply(o), h
    run = run_kernel(kernel, p, "float64")
    assert run.error["stage"] == "backward" and run.error["type"] == "NotImplementedError"
    assert "o" in run.outputs and run.grads is None


@pytest.mark.parametrize("ret,msg", [
    (lambda o, h: (o, h, o), "kernel returned 3 values"),
    (lambda o, h: o[:, :1], r"o: got shape \(1, 1, 3, 2\), expected \(1, 2, 3, 2\)"),
    (lambda o, h: (o, h[..., :1]), r"h_T: got shape"),
])
@needs_torch
def test_wrong_structure_is_an_error_record(ret, msg):
    import re
    p = rand_problem(1, 1, 2, 3, 2, 2, seed=12)

    def kernel(q, k, v, log_alpha, h0):
        return ret(*torch_loop(q, k, v, log_alpha, h0))
    run = run_kernel(kernel, p, "float64")
    assert run.error["type"] == "KernelOutputError" and re.search(msg, run.error["message"])


@needs_torch
def test_detection():
    import jax.numpy as jnp  # noqa: F401  (referenced by jax_kernel's code)

    def jax_kernel(q, k, v, log_alpha, h0):
        return jnp.cumsum(v, axis=2)

    class Module(torch.nn.Module):
        def forward(self, q, k, v, log_alpha, h0):
            return v

    assert detect_framework(torch_loop) == "torch"
    assert detect_framework(functools.partial(torch_loop, scale=2.0)) == "torch"
    assert detect_framework(Module()) == "torch"
    assert detect_framework(torch.exp) == "torch"
    assert detect_framework(numpy_loop) == "numpy"
    assert detect_framework(jax_kernel) == "jax"
    p = rand_problem(1, 1, 1, 3, 2, 2, seed=13)
    # an explicit framework wins: a torch kernel run as "numpy" gets numpy arrays and fails there
    run = run_kernel(torch_loop, p, "float32", call=Call(framework="numpy"))
    assert run.framework == "numpy" and run.error["stage"] == "forward"


def test_detection_sees_local_imports_module_attributes_and_callable_objects():
    pytest.importorskip("jax", reason="jax is not installed (pip install 'glaref[jax]')")
    import glaref.kernels

    def local_import(q, k, v, log_alpha, h0):
        import jax.numpy as jnp  # imported in the body: no global names it
        return jnp.cumsum(v, axis=2)

    def through_a_module(q, k, v, log_alpha, h0):
        return glaref.kernels.scan(q, k, v, log_alpha, h0)    # a module's attribute's attribute

    class Callable:
        def __call__(self, q, k, v, log_alpha, h0):
            import jax.numpy as jnp
            return jnp.asarray(v)

    assert detect_framework(local_import) == "jax"
    assert detect_framework(through_a_module) == "jax"
    assert detect_framework(Callable()) == "jax"
    assert detect_framework(numpy_loop) == "numpy"


def test_the_framework_of_the_returned_arrays_is_recorded():
    p = rand_problem(1, 1, 1, 3, 2, 2, seed=15)
    assert run_kernel(numpy_loop, p, "float32").returned == "numpy"


def test_bad_arguments_raise():
    p = rand_problem(1, 1, 1, 3, 2, 2, seed=14)
    with pytest.raises(ValueError, match=r"^framework: got 'tf'"):
        run_kernel(numpy_loop, p, call=Call(framework="tf"))
    with pytest.raises(DTypeError, match=r"^dtype: got 'float8'"):
        run_kernel(numpy_loop, p, "float8")
    with pytest.raises(LayoutError):
        run_kernel(numpy_loop, p, call=Call(layout="tbhd"))
    with pytest.raises(ValueError, match=r"^device: got 'cuda' for a numpy kernel"):
        run_kernel(numpy_loop, p, call=Call(device="cuda"))
    with pytest.raises(TypeError, match=r"^kernel: got int"):
        run_kernel(3, p)


def test_numpy_kernel_does_not_import_torch_or_jax():
    code = r"""
import importlib.abc, json, sys
sys.path.insert(0, "tests")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "jax", "jaxlib"):
            raise ImportError(f"{name} is blocked for this test")
sys.meta_path.insert(0, Block())
import numpy as np
from glaref._audit._frameworks import run_kernel
from conftest import rand_problem
def kernel(q, k, v, log_alpha, h0):
    return np.cumsum(v, axis=2)
run = run_kernel(kernel, rand_problem(1, 1, 1, 3, 2, 2), "float32")
print(json.dumps({"ok": run.ok, "fw": run.framework}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"ok": True, "fw": "numpy"}
