#!/usr/bin/env bash
# The GPU run, one prepared script: the seed grid twice, jax matmul precision "default" (TF32 for
# float32 matmuls on NVIDIA GPUs since Ampere) and "highest" (true float32), one JSON report each;
# then flash-linear-attention's Triton kernels through the torch judge in float32 and bfloat16
# (tools/gpu_fla.py: chunk_simple_gla, fused_recurrent_simple_gla, chunk_gla, fused_recurrent_gla).
#
#   tools/gpu_audit.sh     # -> docs/reports/gpu_default.json, gpu_highest.json, fla_gpu.{txt,json}
#   BACKEND=cpu OUTDIR=/tmp/r tools/gpu_audit.sh --config 1,1,2,8,4 --seq 17   # tiny CPU check
#
# Environment: BACKEND (gpu), OUTDIR (docs/reports), PRESET (seed), PYTHON (python3), FLA (1; 0
# skips the FLA part), FLA_ARGS (extra arguments of tools/gpu_fla.py, e.g. "--budget-s 300
# --regimes standard"). Extra arguments go to both `glaref audit` runs. With BACKEND=cpu the FLA
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
exit "$status"
