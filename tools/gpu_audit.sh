#!/usr/bin/env bash
# The GPU run, one prepared script: the seed grid twice, jax matmul precision "default" (TF32 for
# float32 matmuls on NVIDIA GPUs since Ampere) and "highest" (true float32), one JSON report each;
# then flash-linear-attention's Triton kernels through the torch judge in float32 and bfloat16
# (tools/gpu_fla.py: chunk_simple_gla, fused_recurrent_simple_gla, chunk_gla, fused_recurrent_gla).
# Then the same for the gated delta rule: `glaref audit --recurrence delta` at both precisions
# (${BACKEND}_delta_default.json, ${BACKEND}_delta_highest.json) and FLA's Triton
# chunk_gated_delta_rule, fused_recurrent_gated_delta_rule and chunk_kda
# (tools/gpu_fla.py --recurrence delta -> fla_delta_gpu.{txt,json}). DELTA=0 skips the delta part;
# DELTA_ARGS are extra arguments of its two audit runs (default: the same as the scalar ones).
# The delta part has been run here only with BACKEND=cpu at tiny sizes (no GPU, no triton on the
# machine that wrote it): its GPU rows are prepared, not yet measured.
#
#   tools/gpu_audit.sh     # -> docs/reports/gpu_default.json, gpu_highest.json, fla_gpu.{txt,json},
#                          #    gpu_delta_default.json, gpu_delta_highest.json, fla_delta_gpu.*
#   BACKEND=cpu OUTDIR=/tmp/r tools/gpu_audit.sh --config 1,1,2,8,4 --seq 17   # tiny CPU check
#
# Environment: BACKEND (gpu), OUTDIR (docs/reports), PRESET (seed), PYTHON (python3), FLA (1; 0
# skips the FLA parts), FLA_ARGS (extra arguments of tools/gpu_fla.py, e.g. "--budget-s 300
# --regimes standard"), FLA_DELTA_ARGS (the same for its --recurrence delta run), DELTA (1; 0
# skips the delta part), DELTA_ARGS (replaces the extra arguments of the delta audit runs). Extra arguments go to both `glaref audit` runs. With BACKEND=cpu the FLA
# part skips the Triton kernels (they need a CUDA GPU; the report says so), runs fla-core's naive
# references in their place at small sizes, and writes OUTDIR/fla_gpu_cpu_check.{txt,json}.
# Every run uses --exit-zero: a TF32 run exceeding float32-level tolerances is a finding to
# report, not a script failure. Exit status: 0 when every report was written, else the first
# failing run's code (2 usage, 3 environment, ...).
set -u
BACKEND="${BACKEND:-gpu}"
OUTDIR="${OUTDIR:-docs/reports}"
PRESET="${PRESET:-seed}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUTDIR"
status=0
for precision in default highest; do
    out="$OUTDIR/${BACKEND}_${precision}.json"
    echo "== glaref audit --preset $PRESET --backend $BACKEND --precision $precision -> $out" >&2
    "$PYTHON" -m glaref audit --preset "$PRESET" --backend "$BACKEND" --precision "$precision" \
        --json "$out" --exit-zero "$@"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
        status=$rc
    fi
done
if [ "${FLA:-1}" != 0 ]; then
    here="$(cd "$(dirname "$0")" && pwd)"
    if [ "$BACKEND" = gpu ]; then fla_out="$OUTDIR/fla_gpu"; else fla_out="$OUTDIR/fla_gpu_cpu_check"; fi
    echo "== tools/gpu_fla.py --backend $BACKEND -> $fla_out.{txt,json}" >&2
    # shellcheck disable=SC2086  # FLA_ARGS is split into arguments on purpose
    "$PYTHON" "$here/gpu_fla.py" --backend "$BACKEND" --out "$fla_out" --exit-zero ${FLA_ARGS:-}
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
        status=$rc
    fi
fi
if [ "${DELTA:-1}" != 0 ]; then
    for precision in default highest; do
        out="$OUTDIR/${BACKEND}_delta_${precision}.json"
        echo "== glaref audit --recurrence delta --preset $PRESET --backend $BACKEND --precision $precision -> $out" >&2
        # shellcheck disable=SC2086  # DELTA_ARGS is split into arguments on purpose
        if [ -n "${DELTA_ARGS+x}" ]; then set -- ${DELTA_ARGS}; fi
        "$PYTHON" -m glaref audit --recurrence delta --preset "$PRESET" --backend "$BACKEND" \
            --precision "$precision" --json "$out" --exit-zero "$@"
        rc=$?
        if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$rc
        fi
    done
    if [ "${FLA:-1}" != 0 ]; then
        here="$(cd "$(dirname "$0")" && pwd)"
        if [ "$BACKEND" = gpu ]; then fla_out="$OUTDIR/fla_delta_gpu"; else fla_out="$OUTDIR/fla_delta_gpu_cpu_check"; fi
        echo "== tools/gpu_fla.py --recurrence delta --backend $BACKEND -> $fla_out.{txt,json}" >&2
        # shellcheck disable=SC2086  # FLA_ARGS is split into arguments on purpose
        "$PYTHON" "$here/gpu_fla.py" --recurrence delta --backend "$BACKEND" --out "$fla_out" \
            --exit-zero ${FLA_DELTA_ARGS:-}
        rc=$?
        if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
            status=$rc
        fi
    fi
fi
exit "$status"
