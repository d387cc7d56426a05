#!/usr/bin/env bash
# Front-end stream holds as the suite's default (harness/stream_hold.py), checked on a GPU: the holds' own
# self-tests (the profiler after fifty holds among them), a cold run and two warm runs with the defaults,
# each run's profiles that missed a device-to-host copy a later profile saw (ProfilerMissedACopy) and its
# failures, each warm run's start-up (startup.py), then the broken backends whose cases hold a stream or
# profile output copies, on the warm caches. $OUT: hold.txt, cold.tgz, warm.tgz, warm2.tgz, broken.txt,
# summary.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
cache="${SUITE_CACHE_DIR:-/tmp/ci-cache}"
rm -rf "$cache" && mkdir -p "$cache" && use_cache_folder "$cache"
python3 -m pytest tests/harness/test_stream_hold.py tests/meta/test_method_runs_meta.py -v -p no:cacheprovider \
  2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|missed" | tail -n 14 > "$OUT/hold.txt"
OUT="$OUT" SUITE_CACHE_DIR="$cache" bash .ci/gpu/suite.sh | tail -n 4
mkdir -p "$OUT/again" && OUT="$OUT/again" SUITE_CACHE_DIR="$cache" RUNS=warm bash .ci/gpu/suite.sh > /dev/null
mv "$OUT/again/warm.tgz" "$OUT/warm2.tgz" && sed 's/^warm/warm2/' "$OUT/again/summary.txt" >> "$OUT/summary.txt"
rm -rf "${OUT:?}/again"
for run in cold warm warm2; do
  dir=$(mktemp -d) && tar -xzf "$OUT/$run.tgz" -C "$dir"
  folder="$dir/$(ls "$dir")"
  {
    echo "== $run"
    grep -E "^(cases|total)" "$folder/conformance.log" | cut -c1-170
    echo "profiles that missed a copy: $(cat "$folder"/conformance*.log | grep -c "ProfilerMissedACopy")"
    grep -h -B1 "ProfilerMissedACopy" "$folder"/conformance*.log | cut -c1-200 | head -n 8
    grep -hE "^FAILED|\] FAILED" "$folder"/conformance*.log | cut -c1-240 | head -n 6
    [ "$run" = cold ] || python3 .ci/gpu/startup.py "$folder"
  } >> "$OUT/summary.txt"
  rm -rf "$dir"
done
broken="RETURNS_EARLY_CONSUMER or RETURNS_EARLY_CHAIN or KEEPS_OUTPUTS_ON_DEVICE_WHEN_LISTED"
broken="$broken or STATS_OF_THE_LAST_EXECUTE_ANYWHERE or MEMOISES_HOST_OUTPUTS"
start=$(date +%s)
python3 -m pytest tests/conformance/test_broken_chapter_backends.py -m proof -k "$broken" -n 6 -v -p no:cacheprovider \
  2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed|\[[a-z_]+/[a-z0-9-]+\]" | cut -c1-240 | tail -n 24 \
  > "$OUT/broken.txt"
echo "broken backends: $(( $(date +%s) - start ))s" >> "$OUT/broken.txt"
cat "$OUT/hold.txt" "$OUT/summary.txt" "$OUT/broken.txt"
