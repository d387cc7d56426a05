#!/usr/bin/env bash
# Device placement on one GPU: the two placement chapters and the multi-method chapter, the reference's
# placement self-tests and broken backends, then the pipelines bench (copy / runtime option / export time).
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
start=$(date +%s)
python3 -m conformance.suite.prelower --device=cuda --jobs=8 --model asr --model llm > "$OUT/prelower.log" 2>&1
echo "prelower rc=$? ($(( $(date +%s) - start )) s)"
python3 -m pytest conformance/device_placement/test_device_placement.py conformance/runtime_options/test_runtime_options.py \
  conformance/multi_method/test_multi_method.py -n 4 -q -p harness.pytest_plugin --no-preflight \
  --results-json="$OUT/placement.json" --junitxml="$OUT/placement.junit.xml" > "$OUT/placement.log" 2>&1
echo "chapters rc=$? ($(( $(date +%s) - start )) s)"
python3 -m pytest tests/reference_impl/test_placement.py tests/conformance/test_placement_broken_backends.py -q -n 4 \
  > "$OUT/selftests.log" 2>&1
echo "self-tests rc=$? ($(( $(date +%s) - start )) s)"
python3 -m harness.bench --suite pipelines --out="$OUT/bench-pipelines.json" > "$OUT/bench-pipelines.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - start )) s)"
grep -E "^[a-z_]+: [0-9]+ passed|results:" "$OUT/placement.log" | cut -c1-240
tail -3 "$OUT/selftests.log"
grep -E "saving|placed" "$OUT/bench-pipelines.log" | cut -c1-260
