#!/usr/bin/env bash
# The generated chapters on the GPU: the differential and metamorphic chapters' CUDA cases against the
# reference (they must pass), then the CUDA broken backends of their rules (each must fail with its rule).
# Console and result files go to $OUT; the last lines are a short table.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
run() {  # name, then pytest arguments
  local name=$1; shift
  local start; start=$(date +%s)
  python3 -m pytest -p harness.pytest_plugin --results-json="$OUT/$name.json" -q -p no:cacheprovider "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $(( $(date +%s) - start ))s $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/summary.txt"
}
run reference-cuda conformance/differential/test_differential.py conformance/metamorphic/test_metamorphic.py -k cuda \
  --durations=10 -n "${WORKERS:-4}"
run broken-output-device conformance/differential/test_differential.py -k "protocol_calls and cuda" \
  --generated-no-shrink --no-preflight --backend=tests.broken.generated:KEEPS_OUTPUTS_ON_DEVICE_WHEN_LISTED
grep -h "^\[differential\|CheckFailure: \[" "$OUT"/broken-*.log | cut -c1-300 | head -5
cat "$OUT/summary.txt"
