"""Other projects' conventions for the same recurrence, both ways.

    from glaref.conventions import fla, mamba2

``fla``: flash-linear-attention's simple_gla (q, k, v, g, g_gamma, scale=None meaning K**-0.5,
initial_state, state_v_first; [B, T, H, *]). ``mamba2``: Mamba2's SSD (x, dt, A, B, C, D, z,
dt_bias, dt_softplus, initial_states; state (headdim, dstate)). Each module turns a call's
arguments into glaref's canonical problem (``*_inputs``: a plain dict of float64 "bhtd" arrays
with the keys of ``glaref.vjp`` -- q, k, v, log_alpha, h0, do, dh_T, scale, layout -- plus
``dtype``, the dtype the kernel received), runs the float64 oracle under the convention's own
names (``*_reference``) with per-element error scales (``*_scales``), and reads a kernel's
results (``*_outputs``). The derivations are in docs/math.md, section "Conventions".

Loading these modules needs numpy only; torch is imported when a torch case is asked for.
"""

from __future__ import annotations

# glaref's names for a kernel's outputs and gradients (o, h_T, then the five inputs)
from .._inputs import OUTPUTS as GLAREF_NAMES

# A result glaref's seven names cannot hold: the gradient of a per-head constant log decay
# (flash-linear-attention's g_gamma, RetNet's gamma), i.e. dlog_alpha summed over batch and
# time, shape (H,).
LOG_ALPHA_BT_SUM = "log_alpha_bt_sum"

__all__ = ["GLAREF_NAMES", "LOG_ALPHA_BT_SUM"]
