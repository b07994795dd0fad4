"""Every tolerance glaref uses, in one table, each with its reason.

Tests and the audit look tolerances up here by name; no test carries a bare literal. A figure is
derived from the unit roundoff ``u`` of the dtype involved and the size of the problem, never
widened until a test passes. Add an entry with its justification rather than a literal elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SMALLEST_NORMAL", "TOLERANCES", "Tolerance", "UNIT_ROUNDOFF", "lookup", "tol"]

# Unit roundoff u = 2**-p for a p-bit significand (round to nearest).
UNIT_ROUNDOFF = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "tf32": 2.0**-11,  # NVIDIA TensorFloat-32: float32 range, 10 explicit mantissa bits
}


@dataclass(frozen=True)
class Tolerance:
    value: float
    reason: str


U64 = UNIT_ROUNDOFF["float64"]

TOLERANCES: dict[str, Tolerance] = {
    "numba_vs_numpy": Tolerance(
        1e-13,
        "Normwise relative gap between the two float64 oracles. Both sum the same terms in a "
        "different order (blocked vs. step by step); the gap is bounded by ~ n * u64 * kappa with "
        "n the accumulation length (<= T + dk) and kappa the ratio of the sum of |terms| to |sum|. "
        "1e-13 ~ 900 u64 leaves room for n up to ~1e3 on well-scaled inputs.",
    ),
    # ---- trust of the oracle from outside it (tests/test_reference_trust.py, test_structure.py) ----
    # Shared derivation. A float64 evaluation of any element of o, h_T or a gradient, in any
    # summation order, is within gamma_n ~ n u of the exact value *in units of its term scale*
    # (the same element evaluated on |q|, |k|, |v|, |h0|, |do|, |dh_T|; decays are positive), n
    # being the roundings on one term's path: per time step the exp of log_alpha (libm, <= 1 u),
    # the multiply by alpha, the k v^T product and the add (4 per step), one dot product over dk
    # or dv, ceil(log2 N) for numpy's pairwise sums of N elements, and a few for scale and casts.
    # The trust tests use T <= 16, dk, dv <= 8, N <= 4096 (the tests assert it), so per
    # evaluation n <= 4*16 + 8 + 8 + 12 + 8 = 100. An oracle that formed exp(b_t - b_s) from
    # cumulative sums b of log_alpha would add |b_t - b_s| u (exp's condition number); the Numba
    # oracle forms every decay as a running product of alphas (glaref/gla/_numba.py: j - i roundings,
    # counted in the per-step 4), so the |b_t - b_s| allowances below are margin it does not use.
# Vector gates (log_alpha (B, H, T, dk), docs/math.md section 9) and packed sequences use the
# same entries, by the same derivation: a term's path has the same roundings per step (the exp of
# its own dimension's gate, the row scaling by it, the k v^T product, the add), the dot products
# are over dk or dv as before (A[t, s] = sum_i q_t[i] k_s[i] e^{c_t[i] - c_s[i]} is one more dot
# product over dk), and the Numba oracle forms every per-dimension decay as a running product of
# alphas (no cumulative-sum exponent, so no |b_t - b_s| term); a packed sequence is one such
# evaluation of its own, never longer than T. The vector-gate trust cases keep to the same sizes
# (tests/test_reference_trust.py asserts it).
    "trust_f64_evaluation": Tolerance(
        100 * U64,
        "One float64 evaluation of the loss L on the trust shapes, relative to L on absolute "
        "values: n <= 100 roundings per term (see the derivation above). Used to bound the "
        "rounding part n u L_abs / eps of a central finite difference.",
    ),
    "trust_complex_step": Tolerance(
        400 * U64,
        "|complex-step <g,u> - vjp <g,u>| over the term scale of the projection. Complex side: "
        "the imaginary part is a forward-mode derivative in complex128, about two roundings per "
        "real one (a complex multiply-add), so <= 2 * 100 u; vjp side <= 100 u plus the "
        "projection's own sum (log2 N + 1 <= 13) plus <= 80 u of margin for cumulative "
        "log-decays (|b_t - b_s| <= 16 * 5 on these gates, see above): ~ 400 u in all. h = 1e-30 makes the "
        "truncation (h^2 |L'''|) vanish.",
    ),
    "trust_mpmath": Tolerance(
        300 * U64,
        "max |oracle - exact| / term scale with the exact value from an independent mpmath "
        "closed form at 50 digits (the exact side has no error). One float64 evaluation on "
        "T <= 8, dk, dv <= 3: n <= 4*8 + 3 + 3 + 12 + 8 = 58, plus up to |b_t - b_s| <= 8 * 30 = "
        "240 of margin for cumulative log-decays at log_alpha = -30 (see above): ~ 300 u.",
    ),
    "trust_jax_scan_f64": Tolerance(
        300 * U64,
        "max |oracle - jax.vjp(lax.scan)| / term scale, both float64 on the trust shapes: two "
        "evaluations each within 100 u, plus <= 80 u of margin for cumulative log-decays "
        "(|b_t - b_s| <= 16 * 5 on standard gates, see above): 280 u, rounded up to 300 u.",
    ),
    "trust_structural": Tolerance(
        300 * U64,
        "max |a - b| / term scale for two float64 evaluations of the same exact quantity that "
        "differ only in arrangement (linearity in q or v, a head run alone, scale folded into "
        "do): two evaluations within 100 u each plus <= 80 u of margin for cumulative "
        "log-decays on the trust shapes with standard gates (see above); rounded up to 300 u.",
    ),
    "trust_multichunk": Tolerance(
        2000 * U64,
        "The trust checks (complex step, mpmath, jax scan) on the sizes that cross the Numba "
        "oracle's chunks (glaref.gla._numba.CHUNK = 32 steps): T <= 160, dk, dv <= 4, N <= 4096. "
        "Per float64 evaluation n <= 4*160 + 4 + 4 + 12 + 8 = 668 roundings (derivation above); "
        "a comparison involves at most three evaluations' worth (complex step: 2 for the "
        "complex side + 1 for vjp): ~ 2000 u. Still ~1e-13 of the term scale: any wrong term shows as O(1).",
    ),
    "dlog_alpha_identity": Tolerance(
        300 * U64,
        "|identity - direct dlog_alpha| over (identity's term scale + direct's term scale). The "
        "identity's reverse cumsum adds T <= 16 terms of dot products over dk <= 8 built from dq "
        "and dk that are themselves within 100 u of their scales; the direct form is within "
        "100 u: 16 + 8 + 100 + 100 + margin for the h_T.dh_T term ~ 300 u. Relative to the result "
        "itself the error is this times the cancellation ratio (scale / |dlog_alpha|), which is "
        "what blows up under strong decay (docs/math.md).",
    ),
}

# ---- normwise sanity figures for float64 / float32 kernels (tests/test_kernels.py, test_audit.py) ----
# The audit's verdict is the error budget (glaref/_audit/_verdict.py, "budget_*" entries below); these
# normwise figures remain as the tests' plain check that a correct float32/float64 kernel's
# relative error is of the size rounding explains. Normwise relative error of a kernel output vs
# the float64 oracle run on the kernel's own (rounded) inputs, so input quantisation is not
# counted: random-walk rounding growth sqrt(n) u over accumulation lengths n <= 2**14 (T up to
# 8192 plus dk up to 8192 on the seed grid; decay shortens the effective length further), hence
# 128 u.
U32 = UNIT_ROUNDOFF["float32"]
TOLERANCES.update({
    "audit_rel_err_float64": Tolerance(
        128 * U64, "float64 kernel: sqrt(n) u64 with accumulation length n <= 2**14 (see above)."),
    "audit_rel_err_float32": Tolerance(
        128 * U32, "float32 kernel: sqrt(n) u32 with accumulation length n <= 2**14 (see above); "
        "the seed's float32 kernels measured <= 3.2e-6 against float64, this is 7.6e-6."),
})


# ---- error budgets and the verdict rule (glaref/gla/_budget.py, _metrics.py, _verdict.py, docs/budgets.md)
# Smallest positive *normal* number of each format: the most a product or sum can lose to
# underflow when subnormals are flushed to zero (XLA does so on CPU and GPU).
SMALLEST_NORMAL = {
    "float64": 2.0**-1022,
    "float32": 2.0**-126,
    "bfloat16": 2.0**-126,   # float32's exponent range
    "float16": 2.0**-14,
    "tf32": 2.0**-126,       # float32's exponent range
}
TOLERANCES.update({
    "budget_step_ops": Tolerance(
        4,
        "Roundings on a term's path per recurrence step (step-by-step kernels) or per chunk "
        "hand-over (chunked kernels): exp of the gate (correctly rounded to <= 1 u in XLA and "
        "libm), the multiply by the decay, the k v^T (or q^T do) product, the add into the state. "
        "Enters the accumulation depth n of gamma_n = n u / (1 - n u) (docs/budgets.md, sec. 2).",
    ),
    "budget_gate_factor": Tolerance(
        2,
        "A decay factor exp(b_i - b_j) is formed from two chunk-local cumulative sums b of "
        "log_alpha, each with absolute error <= gamma_C * Lambda_C (Lambda_C: largest sum of "
        "|log_alpha| over a chunk of C steps), so the exponent's error is <= 2 (C + 1) Lambda_C u "
        "including the rounding of the difference; exp turns an absolute exponent error into the "
        "same relative error of the factor (docs/budgets.md, sec. 2).",
    ),
    "budget_narrow_roundings": Tolerance(
        6,
        "Mixed precision (16-bit inputs, accumulate_dtype float32): roundings to the 16-bit "
        "compute format on one term's path when only matmul operands and results are stored "
        "narrow. Longest path is the backward's: do . v^T scores rounded as an operand (1), "
        "those times k or q (operand, 1), the state or its cotangent rounded as an operand of "
        "the inter-chunk matmul (1), and the decayed operand q exp(b) or k exp(b_last - b) (1), "
        "the gradient rounded on return (1), and the group sum of per-head gradients if done "
        "in the narrow format (1): 6 (docs/budgets.md, sec. 5).",
    ),
    "scale_dominates_f64": Tolerance(
        400 * U64,
        "|ref| <= scale * (1 + tol) elementwise, both float64 evaluations in the same order, of "
        "the signed terms and of their absolute values: |fl(sum t)| <= (1 + gamma_n) sum |t| and "
        "fl(sum |t|) >= (1 - gamma_n) sum |t|, so the ratio is <= 1 + 2 gamma_n. Per term n <= "
        "4 T + dk + dv + T (identity's reverse cumsum) + a few; the tests use T <= 33 and dk, dv "
        "<= 8 (they assert it): n <= 200, 2 n u = 400 u64.",
    ),
})


# ---- glaref.kernels (tests/test_kernels.py, tools/bench_kernels.py) ----
TOLERANCES.update({
    "kernel_seed_grid_float32": Tolerance(
        1e-5,
        "Issue 4's accuracy target for the float32 kernels on the seed grid (4 configs x T in "
        "{512, 2048, 8192}, gates logsigmoid(N(0,1))): normwise relative error of o, h_T and every "
        "gradient vs the oracle on the same float32 inputs. Consistent with the random-walk growth "
        "sqrt(n) u32 of audit_rel_err_float32 (128 u32 = 7.6e-6 for n <= 2**14) plus the "
        "cancellation of the chunked kernel's dlog_alpha identity (terms summed within a chunk of "
        "64 steps, measured ~1e-6 on small shapes); the seed's kernels measured <= 3.2e-6.",
    ),    # glaref.kernels promise (glaref/kernels/__init__.py): 16-bit inputs are upcast to float32 on
    # entry, everything is computed in float32, and o and each gradient are rounded to the input
    # dtype exactly once, at return. One rounding is <= u |x| per element, hence <= u normwise;
    # the float32 arithmetic before it adds at most audit_rel_err_float32 (128 u32).
    "kernel_rel_err_bfloat16": Tolerance(
        UNIT_ROUNDOFF["bfloat16"] + 128 * U32,
        "glaref.kernels with bfloat16 inputs: one rounding of the float32 result to bfloat16 "
        "(u_bf16 normwise) plus float32 accumulation (128 u32). A kernel that stored "
        "intermediates in bfloat16 (several roundings) would fail this.",
    ),
    "kernel_rel_err_float16": Tolerance(
        UNIT_ROUNDOFF["float16"] + 128 * U32,
        "glaref.kernels with float16 inputs: one rounding of the float32 result to float16 "
        "(u_f16 normwise) plus float32 accumulation (128 u32).",
    ),
})
# ---- the calibrated verdict (glaref/_audit/_verdict.py, glaref/gla/_baseline.py, docs/budgets.md 8) ----
TOLERANCES.update({
    "calibrated_ratio": Tolerance(
        6.0,
        "Largest normwise error a kernel may make, as a multiple of the same-precision reference "
        "kernels' error on the same inputs (the baseline of _verdict.widen). Derived from "
        "the measured spread of correct kernels: over the zoo of tests/zoo.py (chunked at C = 16 "
        "to 256, scan, checkpointed scan, quadratic attention form, direct-form and identity "
        "dlog_alpha; float32 and bfloat16 accumulating in float32; the six default regimes; 5 "
        "seeds; B=1 G=2 H=4 dk=dv=16, T = 130 and 300: 1080 rows, `python tools/sensitivity.py "
        "--quick --seeds '' --zoo-seeds 0,1,2,3,4`) the worst ratio to the baseline is 3.43 "
        "(float32, 128-step chunks, h0_dominant, dlog_alpha) and 2.77 in bfloat16 (the scan, "
        "near_one, h_T): 6 leaves a margin of 1.75 against false alarms, while a kernel whose "
        "structure is unknown is flagged at no more than ~6 x baseline / natural error, i.e. "
        "the sensitivity targets of <= 30 (docs/reports/sensitivity_cpu.txt).",
    ),
    "calibrated_extreme_margin": Tolerance(
        1.5,
        "For a kernel of unknown structure, how many times the error of the step-by-step scan "
        "reference (or of the 256-step chunked one) a kernel may make and still pass, whatever the "
        "64-step chunks err (_verdict.widen: the terms m s / R, m w / R): each extreme is a "
        "correct kernel, and two implementations of one algorithm differ by their summation order "
        "only. Measured: glaref's JAX scan against the scan reference, bfloat16 inputs, near_one, "
        "g1h1_d128, T = 8192, h_T: 2.07e-5 vs 2.065e-5 (1.003x), where the scan errs ~200x the "
        "chunks. 1.5 keeps the terms inactive wherever the scan errs less than (R / m)^2 = 16 "
        "times the chunks (float32 at T = 8192: 12.1x on dlog_alpha under near_one, the cell "
        "that sets the sensitivity target), so the sensitivity figures there are unchanged.",
    ),
    "calibrated_floor": Tolerance(
        1.0,
        "Least baseline of the calibrated tier, in units of u ||ref||_2 (u of the dtype the "
        "kernel returned the output in): one rounding of every element of the result, the error "
        "any correct kernel may make even where the reference kernels happen to be exact (T = 1, "
        "dk = dv = 1, exactly representable results). Plus the underflow allowance of every "
        "element (_metrics.underflow_floor).",
    ),
})
TOLERANCES.update({
    "figure_closed_form": Tolerance(
        1e-12,
        "A budget_ulps figure computed in float64 by the code from a handful of exactly "
        "representable values, against its closed form (tests/test_budget.py, test_audit.py): a "
        "few u64 (~1e-16) of rounding, plus the underflow floor, which at these scales is below "
        "1e-29 of u * scale. A wrong formula would be off by O(1).",
    ),
    "figure_by_difference": Tolerance(
        1e-6,
        "A ratio of error norms built in float64 from x = ref + f e with |ref| ~ 1 and |e| ~ 1e-7 "
        "(tests/test_budget.py): each difference x - ref recovers f e to within u64 |ref|, i.e. "
        "~1e-9 of it; a wrong rule would be off by O(1).",
    ),
    "audit_figure_by_hand": Tolerance(
        1e-6,
        "An audit record's rel_err / budget_ulps against the same figure computed by hand in "
        "tests/test_audit.py: same float32-rounded inputs, same NumPy oracle, same formula; the "
        "audit runs the kernel compiled whole (jit), the hand run op by op (jax.vjp), and XLA "
        "could round the float32 outputs differently between the two. Measured gap on CPU: 0.0 "
        "(2026-12-02). A mis-paired or mislabelled output would be off by O(1).",
    ),
})


def tol(name: str) -> float:
    """The value of tolerance ``name`` (KeyError names what exists)."""
    try:
        return TOLERANCES[name].value
    except KeyError:
        raise KeyError(f"no tolerance named {name!r}; known: {sorted(TOLERANCES)}") from None


def lookup(table: dict, key: str, what: str):
    """``table[key]`` (a per-dtype table above), or a ValueError naming the argument ``what``, the
    value it got and the keys the table holds."""
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"{what}: got {key!r}, expected one of {sorted(table)}") from None


# ---- glaref.conventions against independent float64 implementations (tests/test_conventions_*.py) ----
# Both sides are float64 evaluations of the same exact quantity; the error is measured element by
# element in units of the element's sum of |terms| (its error scale). Shared counts, on the shapes
# these tests use (they assert them: T <= 16, dk, dv (K, V, dstate, headdim) <= 8, batch * T <= 32,
# per-step |log_alpha| <= 6): one evaluation of the recurrence or its vjp is within 100 u of the
# scale (the trust derivation above), and a form built on cumulative log-decays c_t (the Numba
# oracle, FLA's chunked form, Mamba2's segsum) adds |c_t - c_s| u <= 16 * 6 u ~ 100 u.
TOLERANCES.update({
    "convention_fla_vs_naive_f64": Tolerance(
        300 * U64,
        "glaref.conventions.fla (the oracle through FLA's names) vs a float64 torch loop of FLA's "
        "naive recurrent definition with torch.autograd, max |a - b| / scale: two evaluations "
        "within 100 u each, plus <= 100 u of the oracle's cumulative log-decays (the loop "
        "multiplies step by step); the renaming and g + g_gamma add <= 1 u. ~300 u.",
    ),
    "convention_mamba2_vs_segsum_f64": Tolerance(
        700 * U64,
        "glaref.conventions.mamba2 (the oracle, then the chain rule) vs an independent float64 "
        "quadratic segsum form of ssd_minimal with torch.autograd, max |a - b| / scale. Per side: "
        "100 u for the recurrence and its vjp, 100 u for cumulative log-decays (both sides form "
        "exp(c_t - c_s)), 100 u more for the rounding of dt' and A dt' entering those sums "
        "(relative error u of each log_alpha, times |c| <= 100), and <= 50 u for the chain rule "
        "(sums over batch * T <= 32 for dA, ddt_bias, dD, over headdim <= 8 for ddt, and a few "
        "products, softplus, sigmoid and silu, each a few u): 350 u per side, 700 u in all.",
    ),
    "convention_mamba2_scales": Tolerance(
        200 * U64,
        "|ssd_scales - scale from the independent segsum form run on absolute values| relative to "
        "the latter, for the results that are sums of products of the inputs with positive "
        "coefficients (y, final_states, dx, dB, dC, dD, dinitial_states without z or softplus): "
        "two float64 evaluations of the same sums of positive terms, no cancellation, within "
        "100 u each.",
    ),
})


# ---- glaref._audit._frameworks: kernels run through torch / NumPy / JAX (tests/test_frameworks.py) ----
TOLERANCES.update({
    "frameworks_loop_f64": Tolerance(
        300 * U64,
        "A float64 step-by-step kernel run through glaref._audit._frameworks (torch.autograd, NumPy, "
        "jax.vjp) vs the oracle on the inputs the runner reports, max |a - b| / scale on T <= 16, "
        "dk, dv <= 8 with standard gates: as trust_jax_scan_f64 (two evaluations within 100 u "
        "each plus <= 80 u of the oracle's cumulative log-decays). A result under the wrong name, "
        "layout or group sum is off by O(1).",
    ),
    "frameworks_loop_f32": Tolerance(
        128 * U32,
        "The same float32 step-by-step kernel vs the oracle on its own float32-rounded inputs, "
        "max |a - b| / scale: n <= 100 float32 roundings per term on T <= 16, dk, dv <= 8 (the "
        "trust derivation's count, now in u32), plus the cotangents' and outputs' single "
        "rounding to float32; the oracle's own error (~1e-14) is negligible: 128 u32.",
    ),
})


# ---- golden vectors (glaref/gla/_golden.py: `glaref oracles verify`, tests/test_golden.py) ----
TOLERANCES.update({
    "golden_recompute": Tolerance(
        16384 * U64,
        "|stored - recomputed| over the element's error scale, for the golden vectors' float64 "
        "outputs, gradients and scales when verify runs on another platform (another BLAS or libm "
        "sums in another order; on the generating platform they are bit-identical). Two float64 "
        "evaluations of the same exact value, each within n u64 of the scale with, on the stored "
        "sizes (T <= 1000, dk, dv <= 128, |log_alpha| <= ~50 per step): n <= 5 T + dk + dv + "
        "ceil(log2 N) + a margin of |b_t - b_s| over 64 steps (<= 64 * 50 / 4 on average gates; "
        "the Numba oracle's running products of alphas do not need it) ~ 6000; "
        "two of them, rounded up to 2^14 u64 (3.6e-12). A wrong value is off by O(1).",
    ),
    "golden_rule_figures": Tolerance(
        2.0**-36,
        "Relative gap between one verdict figure (normwise error, ratio, baseline, budget_ulps) "
        "computed by two float64 implementations of oracles/README.md's rule: glaref's "
        "(np.linalg.norm), the test's (a correctly rounded sum) or the README's C judge (a "
        "plain loop, printed with 17 digits). A sum of N <= 2^15 squares (the largest stored "
        "output; the test asserts it) in any order is within N u64 = 2^-38 of the exact one, the "
        "square root halves it, a ratio adds a rounding: 2^-36 (1.5e-11) with margin. A wrong "
        "rule is off by O(1).",
    ),
})


# ---- which arithmetic a same-precision reference kernel ran in (tests/test_baseline_vector.py) ----
# The reference kernels (glaref/gla/_baseline.py) must *make* the rounding errors of their precision,
# not merely stay within a bound (a kernel secretly computing in float64 would pass any bound). On
# the test shapes (T = 70, dk = 8, dv = 6, random inputs, hundreds of elements per output) the
# normwise error of one precision sits near a small multiple of its u: float64 kernels measured
# <= 4.2e-15 (~40 u64), float32 ones >= 2.3e-8 (~0.4 u32), TF32- or bfloat16-operand ones
# >= 2.6e-4 (~0.5 u_tf32) (2026-12-03).
# The geometric mean of two unit roundoffs lies four (tf32 vs float32: 2.5) orders of magnitude
# from either side, so an error above it cannot come from the finer arithmetic and one below it
# cannot come from the coarser.
TOLERANCES.update({
    "arith_separator_f32_f64": Tolerance(
        (UNIT_ROUNDOFF["float32"] * UNIT_ROUNDOFF["float64"]) ** 0.5,
        "sqrt(u32 u64) ~ 2.6e-12: a reference kernel's normwise error above it was made in float32 "
        "(or coarser), below it in float64 (see the comment above).",
    ),
    "arith_separator_tf32_f32": Tolerance(
        (UNIT_ROUNDOFF["tf32"] * UNIT_ROUNDOFF["float32"]) ** 0.5,
        "sqrt(u_tf32 u32) ~ 1.4e-5: a reference kernel's normwise error above it comes from "
        "operands rounded to TF32 (10 mantissa bits), below it from float32 operands.",
    ),
})


# ---- the gated delta rule (glaref.delta; tests/test_delta_*.py, tools/judge_fla_delta.py) ----
# Figures are normwise relative errors, max |a - b| / max |b| per output (b the truth). A float64
# evaluation of one output element adds n roundings per term (per step: the exp of log_alpha, the
# decay, the dot product S~^T k over dk, the residual, beta, the rank-one update, o's dot product
# over dk: about 2 dk + 6; the backward about twice that), so its error is <= n u times the sum
# of |terms|; normwise that is n u kappa, with kappa the ratio of the largest sum of |terms| to
# the largest value. The trust cases (T <= 8, dk, dv <= 4, beta <= 1, standard gates) have
# n <= 8 * (2 * 4 + 6) * 2 = 224 and kappa <= 4 (measured by the tests from glaref.delta.scales):
# ~ 900 u = 1e-13, the figure.
TOLERANCES.update({
    "delta_numba_vs_numpy": Tolerance(
        1e-13,
        "Normwise relative gap between glaref.delta's Numba path and its NumPy reference on the "
        "test shapes (T <= 130, dk, dv <= 8, standard gates, beta <= 2): the same terms per step "
        "summed in another order (row axpys and 8-way dot products vs einsum), each within "
        "n u kappa of the truth (see above); measured <= 1e-15."),
    "delta_trust_mpmath": Tolerance(
        1e-13,
        "glaref.delta vs an independent mpmath implementation at 50 digits (forward, and every "
        "gradient by central differences in mpmath with h = 1e-20: truncation ~ 1e-40), on the "
        "trust cases: n u kappa <= 224 * 1.1e-16 * 4 (see above); the issue's 1e-13."),
    "delta_trust_complex_step": Tolerance(
        1e-13,
        "|complex-step <g, u> - vjp <g, u>| / sum |g_i u_i| per input, the reference run in "
        "complex128 with h = 1e-30 (no truncation, no cancellation): both sides within n u of "
        "their term scales, n <= 224 each (see above), ~ 450 u = 5e-14, rounded to 1e-13."),
    "delta_trust_fd": Tolerance(
        1e-6,
        "Central finite differences along random projections, step h = 1e-5 relative to the "
        "input's size: truncation h^2 |L'''| / 6 ~ 1e-10 relative and rounding "
        "u |L_abs| / h ~ 1e-11 * kappa_L; 1e-6 leaves room for kappa_L (sum of |terms| of L over "
        "|L|) up to 1e5 while any wrong gradient term shows as O(1)."),
    "delta_trust_jax_f64": Tolerance(
        1e-12,
        "glaref.delta vs jax.vjp of a float64 lax.scan of the recurrence (written in the test), "
        "normwise per output on T <= 64: two float64 evaluations, each n u kappa with "
        "n <= 64 * 14 * 2 and kappa <= 4: 8e-13; the issue's 1e-12."),
    "delta_fla_f64": Tolerance(
        1e-12,
        "glaref.delta vs flash-linear-attention's naive references run in float64 (casts "
        "rewritten), forward and every gradient through torch.autograd, normwise: the chunked "
        "references form decays exp(b_i - b_j) from in-chunk cumulative sums (error ~ |b| u, "
        "|b| <= 64 * 30 under strong decay: 2e-13) and solve the chunk's triangular system by "
        "substitution (n ~ 64 more roundings); the issue's 1e-12."),
    "delta_kernel_f64": Tolerance(
        1e-12,
        "glaref.delta.kernels (scan; chunked at C = 1..64) run in float64 under jax x64 vs "
        "glaref.delta, forward and every gradient through jax.vjp, normwise, on the test shapes "
        "(T <= 70, dk, dv <= 8, beta <= 2): the scan evaluates the oracle's lines in another "
        "order (n u kappa each, as delta_trust_jax_f64: 8e-13); the chunked form adds a unit "
        "triangular solve of C rows and segment sums of C gates per decay (~2 C more roundings "
        "per term); measured <= 1e-15."),
})


# ---- the gated delta rule's same-precision reference kernels (glaref.delta._baseline;
# tests/test_delta_baseline.py) ----
# Run in float64 the reference kernels are exact algorithms of the recurrence evaluated in another
# order than the oracle: the scan the oracle's lines with the sums one term after another, the
# chunked form a unit triangular solve of C rows, the WY products and segment sums of up to C gates
# per decay (~3 C more roundings per term than the scan). On the test shapes (T = 70, dk, dv <= 8,
# beta up to 2, C <= 64) that is n <= 2 (2 dk + 6) + 3 C ~ 250 roundings per term and, normwise,
# kappa of the standard regime's ~1-10 (the recurrence contracts: |I - beta k k^T| <= 1):
# n u kappa <= 250 * 1.1e-16 * 10 ~ 3e-13.
TOLERANCES.update({
    "delta_baseline_f64": Tolerance(
        1e-12,
        "glaref.delta._baseline's kernels run in float64 vs the float64 oracle, normwise per "
        "output (see above: <= 3e-13 by the rounding count; the issue's 1e-12 for two float64 "
        "evaluations of one recurrence)."),
    "delta_baseline_f32_standard": Tolerance(
        1e-5,
        "Normwise error of a reference kernel run in float32 on the standard regime at the test "
        "shapes (T <= 70, dk, dv <= 8): each step rounds every state element a few times, and "
        "the contracting recurrence (|I - beta k k^T| <= 1, alpha < 1) keeps the accumulated "
        "error near sqrt(T) u to T u per element: <= 70 * 6e-8 = 4e-6 at worst, measured "
        "~1e-7 (docs/reports/delta_oracle_cpu.txt: 0.6e-7 to 4e-7 for a float32 loop over "
        "the regimes at T = 256). 1e-5 is ~170 u32: any wrong term (O(1)) or a kernel in a "
        "coarser arithmetic (bfloat16 operands: ~4e-3) is far above it."),
})
