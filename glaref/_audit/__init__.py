"""The judging layer, shared by every recurrence family: what a kernel claims (``_claims``), the
verdict (``_verdict``, the shape of a yardstick in ``_designs``), the error figures
(``_metrics``), where the error is (``_where``), the probes (``_probes``), running a kernel in
its framework (``_frameworks``), how sharp the verdict is (``_sensitivity``), and the audit
engine behind ``glaref.audit``: per-output, per-gradient accuracy and cost of a kernel vs the
float64 oracle.

    import glaref
    records = glaref.audit(impls="chunked,scan", configs="g1h1_d128", seqs=[512], json_path="r.json")

Each record has the seed report's fields (impl, mode, config, batch, groups, heads, seq, dk, dv,
compile_s, inner, median_ms, q1_ms, q3_ms, xla_temp_mb, xla_arg_mb, xla_out_mb, residual_mb,
rel_err, rel_err_grads) plus ``_report.RECORD_ADDITIONS``; ``rel_err`` is the worst normwise
relative error over the outputs measured in the row (o and, when the kernel returns it, h_T;
every gradient too in mode fwd_bwd), ``rel_err_out`` the forward outputs' own. Per output,
``budget_ulps`` (error in units of the compute dtype's u times the element's sum of |terms|) and
``budget_bound`` (what a correct kernel can reach) give the verdict (``_verdict``): ``ok`` is
false when an output is non-finite or over its bound, or the kernel raised or returned the wrong
structure or dtype, and ``failures`` then names each failing output with its figure (or the
reason). ``ok`` is null for a row glaref skipped (not enough memory for the kernel's XLA buffers
or the oracle's arrays), the reason in ``skipped``. The CLI (``glaref audit``) is a thin face
over ``_engine.audit``.

What a family brings (its oracle, problems, reference kernels and judge) sits behind
``_family.Family``: ``glaref.gla._family.SCALAR_GATE`` and ``glaref.delta._family.DELTA``.
``glaref.audit`` is ``_engine.audit`` itself (a plain function, loaded on first use);
``glaref.AuditUsageError`` and ``glaref.AuditEnvironmentError`` are its refusals. This package
is private, and its ``__init__`` imports nothing: importing one judging module (the verdict, say)
never loads the engine. The CLI, ``glaref.testing`` and the tools import what they use from the
modules themselves (``_report.summary``, ``_presets.PRESETS``).
"""
