"""``glaref.testing``: check a JAX kernel against the float64 oracle from a test suite.

    import glaref.testing

    def test_my_kernel():
        glaref.testing.check_kernel(my_kernel, chunk_size=64)

``check_kernel`` is a thin face over the audit engine (:func:`glaref.audit.audit`, accuracy only:
``repeats=0``): it holds no judgement of its own. Each row the engine records (one per regime,
config, sequence length and mode) passes when every output and gradient is finite and within the
two tiers of ``glaref._verdict`` (within ``calibrated_ratio`` times the error of glaref's
same-precision reference kernels on the same inputs, and within the proven worst-case bound);
otherwise ``check_kernel`` raises ``AssertionError`` listing, per failing row and output, the
tier that failed and the figures (ratio to the reference kernels, rel_err of both, budget_ulps
and the proven bound, max_abs_err, first non-finite index), as ``numpy.testing`` does. As in ``numpy.testing``, the
argument under test comes first; the truth (the oracle) is implied.

Loading this module is cheap; jax is imported when ``check_kernel`` runs.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["DEFAULT_CONFIG", "DEFAULT_SEQS", "check_kernel"]

# Small enough to run in seconds on a CPU, large enough to exercise what kernels get wrong:
# grouped heads (G=2 < H=4), T=1 (a single step), and lengths just below and above a multiple of
# common chunk lengths (16, 32, 64 divide 64), so ragged last chunks and chunk hand-overs occur.
DEFAULT_CONFIG = "1,2,4,16,16"    # B, G, H, dk, dv
DEFAULT_SEQS = (1, 63, 65)


def _figure(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def _describe(rec: dict[str, Any]) -> str:
    """One failing row: where it ran, then each failing output's figures (or why nothing ran)."""
    where = (f"{rec['impl']} {rec['mode']} config {rec['config']} "
             f"(B={rec['batch']} G={rec['groups']} H={rec['heads']} dk={rec['dk']} dv={rec['dv']}) "
             f"T={rec['seq']} regime {rec.get('regime')}")
    if "skipped" in rec:
        return f"{where}: kernel not measured: {rec['skipped']}"
    lines = [f"{where}: {rec.get('verdict')}"]
    rel = {**(rec.get("rel_err_out") or {}), **(rec.get("rel_err_grads") or {})}
    first_bad = rec.get("nonfinite_first_index") or {}
    ratios = rec.get("reference_ratio") or {}
    base = rec.get("reference_rel_err") or {}
    tiers = rec.get("failed_tier") or {}
    for reason in rec.get("failures", []):
        name = reason.split(":", 1)[0]
        label = name if name in ("o", "h_T") else f"{name} (gradient)"
        figures = (f"{tiers.get(name)} tier: {_figure(ratios.get(name))}x the reference kernels' "
                   f"error (allowed {_figure(rec.get('allowed_ratio'))}x; rel_err "
                   f"{_figure(rel.get(name))} vs {_figure(base.get(name))}), "
                   f"budget_ulps {_figure(rec['budget_ulps'].get(name))} "
                   f"(proven bound {_figure(rec['budget_bound'].get(name))}), "
                   f"max_abs_err {_figure(rec['max_abs_err'].get(name))}")
        if rec["nonfinite"].get(name):
            figures += (f", {rec['nonfinite'][name]} non-finite, first at "
                        f"{tuple(first_bad.get(name, ()))}")
        lines.append(f"  {label}: {figures}")
    return "\n".join(lines)


def check_kernel(kernel: Callable | str, *, configs=DEFAULT_CONFIG, seqs=DEFAULT_SEQS,
                 dtype: str = "float32", regimes="standard", layout: str = "bhtd",
                 scale: float = 1.0, chunk_size: int | None = None,
                 accumulate_dtype: str | None = None, modes=("fwd_bwd",), seed: int = 0,
                 backend: str | None = None, precision: str = "default") -> list[dict[str, Any]]:
    """Assert that ``kernel`` agrees with the float64 oracle within the error bound; return the
    audit records (one per row, as :func:`glaref.audit.audit` gives them).

    kernel: a callable ``(q, k, v, log_alpha, h0) -> o | (o, h_T)`` on JAX arrays in ``layout``
        (it receives ``scale`` when its signature takes it, else must apply it itself), a
        built-in name ("chunked", "scan") or a "package.module:function" spec.
    chunk_size: the kernel's chunk length (1 for a step-by-step scan); None (unknown) judges it
        with the larger bound of the two extremes. accumulate_dtype: what a 16-bit kernel
        accumulates in (None: float32). The other arguments are those of the engine; configs,
        seqs and regimes default to a few seconds' worth of small cases on a CPU.

    Raises AssertionError naming every failing row and output with its figures. A kernel that
    raises, or returns the wrong structure, fails too (the message gives the exception): the
    caller asked for this kernel to be checked. Bad arguments raise
    ``glaref.audit.AuditUsageError`` (a ValueError); missing jax, ``AuditEnvironmentError``.
    """
    __tracebackhide__ = True
    from .audit import audit

    records = audit([kernel], configs, seqs, list(modes), dtype=dtype, precision=precision,
                    backend=backend, layout=layout, scale=scale, repeats=0, seed=seed,
                    regimes=regimes, chunk_size=chunk_size, accumulate_dtype=accumulate_dtype)
    bad = [r for r in records if not r.get("ok")]
    if bad:
        rows = "\n".join(_describe(r) for r in bad)
        raise AssertionError(
            f"kernel disagrees with the glaref oracle on {len(bad)} of {len(records)} rows "
            f"(dtype {dtype}, compute dtype {bad[0].get('compute_dtype')}, "
            f"chunk_size={bad[0].get('chunk_size')}; calibrated tier: normwise error against "
            f"glaref's same-precision reference kernels on the same inputs; proven tier: "
            f"budget_ulps, error in units of u x the element's sum of |terms|, against the "
            f"worst case of any correct kernel):\n{rows}")
    return records
