#!/usr/bin/env bash
# Stream holds without spinning kernels (harness/stream_hold.py) on a GPU: their own self-tests (a held
# stream waits until its block ends; a hold ends by itself while the waiting call keeps the GIL), a cold
# run and two warm runs of the whole suite (suite.sh), then the broken backends whose cases hold a stream
# (streams_threads' lazy returns, the differential chapter's) failing on the rules they break, on the warm
# caches. $OUT: hold.txt, cold.tgz, warm.tgz, warm2.tgz, broken.txt, summary.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
cache="${SUITE_CACHE_DIR:-/tmp/ci-cache}"
rm -rf "$cache" && mkdir -p "$cache" && use_cache_folder "$cache"
python3 -m pytest tests/harness/test_stream_hold.py -v -p no:cacheprovider 2>&1 | tail -n 8 | tee "$OUT/hold.txt"
OUT="$OUT" SUITE_CACHE_DIR="$cache" bash .ci/gpu/suite.sh | tail -n 4
mkdir -p "$OUT/again" && OUT="$OUT/again" SUITE_CACHE_DIR="$cache" RUNS=warm bash .ci/gpu/suite.sh > /dev/null
mv "$OUT/again/warm.tgz" "$OUT/warm2.tgz" && cat "$OUT/again/summary.txt" | sed 's/^warm/warm2/' >> "$OUT/summary.txt"
rm -rf "${OUT:?}/again"
for run in warm warm2; do
  echo "== $run" >> "$OUT/summary.txt"
  tar -xzf "$OUT/$run.tgz" -O warm/conformance.log | grep -E "^(cases|total)" | cut -c1-200 >> "$OUT/summary.txt"
done
broken="RETURNS_EARLY_CONSUMER or RETURNS_EARLY_CHAIN or KEEPS_OUTPUTS_ON_DEVICE_WHEN_LISTED or STATS_OF_THE_LAST_EXECUTE_ANYWHERE"
start=$(date +%s)
python3 -m pytest tests/conformance/test_broken_chapter_backends.py -m proof -k "$broken" -n 4 -v -p no:cacheprovider \
  2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" | tail -n 12 | tee "$OUT/broken.txt"
echo "broken backends: $(( $(date +%s) - start ))s" | tee -a "$OUT/broken.txt"
cat "$OUT/summary.txt"
