#!/usr/bin/env bash
# Issue 50's fresh-runner figures with stream holds (fresh_runner.sh: cold, warm, restore + run), then on
# its warm caches: the holds' self-tests, the differential machine against the broken backend that keeps
# the decoder's outputs on the GPU (its proof failed in stream_holds.sh's call) with holds, with spin holds
# (CONFORMANCE_STREAM_HOLDS=spin, the cases as they were) and with three times the examples, and the
# streams_threads broken backends' proofs. $OUT: cold.tgz, warm.tgz, restored/warm.tgz, summary.txt,
# hold.txt, broken.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
bash .ci/gpu/fresh_runner.sh > /dev/null 2>&1
rm -f "$OUT/restored/summary.txt" "$OUT/host.json"
use_cache_folder /tmp/ci-cache
python3 -m pytest tests/harness/test_stream_hold.py -v -p no:cacheprovider 2>&1 | tail -n 7 > "$OUT/hold.txt"
machine() {  # $1: a name for the run; the rest: extra pytest arguments
  local name=$1; shift
  python3 -m pytest conformance/differential/test_differential.py -k "protocol_calls and cuda" \
    --backend=tests.broken.generated:KEEPS_OUTPUTS_ON_DEVICE_WHEN_LISTED -p harness.pytest_plugin -q \
    -p no:cacheprovider --no-preflight --generated-no-shrink --results-json="/tmp/$name.json" "$@" \
    > "/tmp/$name.log" 2>&1
  { echo "== $name"; grep -E "^[0-9]+ (passed|failed)|^FAILED|\[differential/output-device\]" "/tmp/$name.log" \
      | cut -c1-240 | head -n 6; } > "/tmp/$name.txt"
}
machine holds & machine examples3 --generated-examples=3 &
CONFORMANCE_STREAM_HOLDS=spin machine spin-holds & wait
cat /tmp/holds.txt /tmp/spin-holds.txt /tmp/examples3.txt > "$OUT/broken.txt"
python3 -m pytest tests/conformance/test_broken_chapter_backends.py -m proof -n 2 -p no:cacheprovider \
  -k "RETURNS_EARLY_CONSUMER or RETURNS_EARLY_CHAIN" 2>&1 | grep -E "PASSED|FAILED|passed|failed" >> "$OUT/broken.txt"
cat "$OUT/summary.txt" "$OUT/hold.txt" "$OUT/broken.txt"
