#!/usr/bin/env bash
# Where a warm run's time goes: `nox -s conformance` on the caches an earlier call on this (still warm)
# machine left (SUITE_CACHE_DIR, default /tmp/ci-cache, as fresh_runner.sh keeps them), sampled by py-spy
# (a static binary, carried as .whl/py-spy) in every process, idle frames included (a worker waiting for the
# GPU is wall time too). $OUT: warm.tgz (as suite.sh), pyspy.txt.gz (collapsed stacks, one line per stack
# and process: `process;frame;frame count`), summary.txt. Read it with .ci/gpu/pyspy_table.py.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
cache="${SUITE_CACHE_DIR:-/tmp/ci-cache}"
use_cache_folder "$cache"
mkdir -p "$OUT/warm"
start=$(date +%s)
timeout "${WARM_LIMIT:-200}" .whl/py-spy record --subprocesses --idle --nonblocking --rate "${RATE:-50}" \
  --format raw --output "$OUT/pyspy.txt" -- python3 -m nox -s conformance --no-venv > "$OUT/warm/conformance.log" 2>&1
echo "warm under py-spy: rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$OUT/summary.txt"
cp results/conformance*.json results/conformance.busy.tsv results/conformance*.console.log "$OUT/warm/" 2>/dev/null
sed -n '/^phase .*wall/,/^nox > results/p' "$OUT/warm/conformance.log" | grep -v "^nox >" | tee -a "$OUT/summary.txt"
tail -n 5 "$OUT/warm/conformance.log"
gzip -f "$OUT/pyspy.txt" 2>/dev/null
tar -czf "$OUT/warm.tgz" -C "$OUT" warm && rm -rf "${OUT:?}/warm"
