"""Kernels written in other projects' conventions, checked through glaref.conventions and the
``glaref_check`` fixture (installed with glaref as a pytest plugin)."""

import numpy as np
import pytest

from glaref.conventions import mamba2
from glaref.tolerances import tol

# ---- an FLA-style JAX kernel, through the plugin fixture -------------------------------------

def fla_style_jax(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """simple_gla in JAX with FLA's signature: [B, T, H, *] arrays, scale None meaning K ** -0.5."""
    import jax
    import jax.numpy as jnp

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    S0 = jnp.zeros(q.shape[:1] + q.shape[2:] + v.shape[-1:], q.dtype) \
        if initial_state is None else initial_state

    def step(S, xs):
        q_t, k_t, v_t, g_t = xs
        S = jnp.exp(g_t)[..., None, None] * S + k_t[..., :, None] * v_t[..., None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", q_t, S)

    ht, o = jax.lax.scan(step, S0, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g)))
    return jnp.moveaxis(o, 0, 1), (ht if output_final_state else None)


def test_fla_style_kernel(glaref_check):
    pytest.importorskip("jax", reason="jax is not installed (pip install 'glaref[jax]')")
    K = 16                                               # the fixture's default config has dk = 16

    def kernel(q, k, v, log_alpha, h0):                  # glaref's signature, FLA's layout
        return fla_style_jax(q, k, v, log_alpha, initial_state=h0, output_final_state=True)

    # FLA's layout is glaref's "bthd" (G = H here: FLA's q and k have one head per value head);
    # the kernel applies FLA's default scale itself, so the oracle is told which
    glaref_check(kernel, configs="1,4,4,16,16", layout="bthd", scale=K ** -0.5, chunk_size=1)


# ---- a Mamba2 SSD kernel in torch, under Mamba2's own names ------------------------------------

def ssd_scan(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
             initial_states=None):
    """Stand-in for mamba_chunk_scan_combined(..., return_final_states=True): step by step, the
    state [batch, nheads, headdim, dstate]."""
    import torch

    b, T, h, P = x.shape
    rep = h // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, dim=2), C.repeat_interleave(rep, dim=2)
    dt = dt if dt_bias is None else dt + dt_bias
    dt = torch.nn.functional.softplus(dt) if dt_softplus else dt
    S = x.new_zeros(b, h, P, B.shape[-1]) if initial_states is None else initial_states
    ys = []
    for t in range(T):
        S = torch.exp(A * dt[:, t])[..., None, None] * S \
            + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append((S * Ch[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, 1)
    if D is not None:
        y = y + x * (D[:, None] if D.dim() == 1 else D)
    if z is not None:
        y = y * torch.nn.functional.silu(z)
    return y, S


def test_mamba2_kernel_float64_every_gradient():
    # runs today: each result and gradient under Mamba2's names against the oracle (glaref's
    # recurrence, then the chain rule), element by element in units of its sum of |terms|
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'glaref[torch]')")
    c = mamba2.ssd_case(batch=2, seqlen=16, nheads=4, headdim=8, ngroups=2, dstate=8,
                        dtype=torch.float64)
    inputs = {n: c[n] for n in mamba2.INPUT_NAMES}
    y, final = ssd_scan(**inputs, dt_softplus=c["dt_softplus"])
    (y * c["dy"]).sum().add_((final * c["dfinal_states"]).sum()).backward()
    got = {"y": y, "final_states": final, **{f"d{n}": t.grad for n, t in inputs.items()}}
    args = dict(dt_softplus=c["dt_softplus"], cotangents=(c["dy"], c["dfinal_states"]))
    ref = mamba2.ssd_reference(**inputs, **args)
    scale = mamba2.ssd_scales(**inputs, **args)
    for name, x in got.items():
        err = np.abs(x.detach().numpy() - ref[name])
        # F.softplus returns its argument above 20, 2e-9 away from softplus: not reached here
        assert np.all(err <= tol("convention_mamba2_vs_segsum_f64") * scale[name]), name
