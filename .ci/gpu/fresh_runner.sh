#!/usr/bin/env bash
# Issue 50's figures on one machine, as a GPU CI job lives them (README "CI"): a cold run that fills the
# caches, a warm run on them, then a fresh runner's job: the caches archived as the CI cache action
# archives them (tar, zstd where present), removed, then restored (unpacked) and `nox -s conformance`,
# timed together. The three caches live in one folder, as the workflow keeps them: the artifact cache,
# inductor's and Triton's. $OUT: host.txt, cold.tgz, warm.tgz, restored/warm.tgz, summary.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
cache=/tmp/ci-cache
archive=/tmp/ci-cache.tar
secs() { local ms=$(( ($(date +%s%N) - $1) / 1000000 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
rm -rf "$cache" "$archive"* /tmp/torchinductor_* && mkdir -p "$cache"
use_cache_folder "$cache"
# RUNS: which of the cold and warm runs to make first (both by default; the restore needs the cold one).
SUITE_CACHE_DIR="$cache" RUNS="${RUNS:-cold warm}" bash .ci/gpu/suite.sh | tail -n 30
if command -v zstd >/dev/null; then pack=(zstd -q -T0); unpack=(zstd -dc); archive+=.zst
else pack=(gzip -1); unpack=(gzip -dc); archive+=.gz; fi
start=$(date +%s%N)
tar -C "$(dirname "$cache")" -cf - "$(basename "$cache")" | "${pack[@]}" > "$archive"
echo "archive: ${pack[0]}, $(du -sm "$cache" | cut -f1) MiB of caches -> $(du -sm "$archive" | cut -f1) MiB in $(secs "$start") s" | tee -a "$OUT/summary.txt"
rm -rf "$cache"
# A fresh machine also reads torch's libraries from disk; dropping the file cache needs privileges.
sync; if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then dropped="file cache dropped"; else dropped="file cache kept (no privilege to drop it)"; fi
start=$(date +%s%N)
"${unpack[@]}" "$archive" | tar -C "$(dirname "$cache")" -xf -
restored=$(secs "$start")
mkdir -p "$OUT/restored"
OUT="$OUT/restored" MEASURE_HOST=0 SUITE_CACHE_DIR="$cache" RUNS=warm bash .ci/gpu/suite.sh | tail -n 12
echo "restore + run: restore $restored s, end to end $(secs "$start") s ($dropped)" | tee -a "$OUT/summary.txt"
cat "$OUT/restored/summary.txt" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
