#!/usr/bin/env bash
# The seed grid on the GPU, twice: jax matmul precision "default" (TF32 for float32 matmuls on
# NVIDIA GPUs since Ampere) and "highest" (true float32), one JSON report each.
#
#   tools/gpu_audit.sh                       # -> docs/reports/gpu_default.json, gpu_highest.json
#   BACKEND=cpu OUTDIR=/tmp/r tools/gpu_audit.sh --config 1,1,2,8,4 --seq 17   # tiny CPU check
#
# Environment: BACKEND (gpu), OUTDIR (docs/reports), PRESET (seed), PYTHON (python3). Extra
# arguments go to both `glaref audit` runs. Both runs use --exit-zero: a TF32 run exceeding
# float32-level tolerances is a finding to report, not a script failure. Exit status: 0 when both
# reports were written, else the first failing run's code (2 usage, 3 environment, ...).
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
exit "$status"
