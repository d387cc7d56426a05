#!/usr/bin/env bash
# The whole suite as a GPU CI job runs it on a fresh machine: cold (empty artifact and inductor caches),
# then warm (the same caches again). Each run's console, result files and per-phase table go to
# $OUT/cold and $OUT/warm; the last lines printed are both tables.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
export CONFORMANCE_CACHE_DIR="${SUITE_CACHE_DIR:-$(mktemp -d /tmp/aoti-suite.XXXXXX)}"
# Limits a little above the targets (cold ≤ 360 s, warm ≤ 120 s), so a slow run still ends with its table.
declare -A limit=([cold]="${COLD_LIMIT:-380}" [warm]="${WARM_LIMIT:-170}")
# RUNS picks the runs (default both); with SUITE_CACHE_DIR fixed, a warm run in a later call on the same
# (still warm) machine uses the cold run's caches.
RUNS="${RUNS:-cold warm}"
# MEASURE_HOST=1: first the host's cores (.ci/gpu/host_scaling.py, about 30 s): machines of one kind differ
# in core speed by more than a change to the suite does, so a run's time is read beside its host's.
if [ "${MEASURE_HOST:-0}" = 1 ]; then python3 .ci/gpu/host_scaling.py "$OUT/host.json" | tee "$OUT/host.txt"; fi
for run in $RUNS; do
  mkdir -p "$OUT/$run"
  start=$(date +%s)
  # SUITE_ARGS: the front door's own arguments (e.g. --no-contract-monitor, to measure what the monitor costs).
  timeout "${limit[$run]}" python3 -m nox -s conformance --no-venv -- ${SUITE_ARGS:-} > "$OUT/$run/conformance.log" 2>&1
  echo "$run: rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$OUT/summary.txt"
  # The journals too: a run cut short by its limit leaves only them (every finished case is in them).
  cp results/conformance*.json results/conformance*.jsonl results/conformance*.junit.xml \
    results/conformance.suite.prelower.log results/conformance.busy.tsv results/conformance*.console.log \
    results/conformance*.forkserver.log \
    "$OUT/$run/" 2>/dev/null
done
for run in $RUNS; do
  echo "== $run"; grep -E "^[a-z_]+: [0-9]+ passed|prelower: [0-9]+ lowered" "$OUT/$run/conformance.log" | cut -c1-160
  sed -n '/^phase .*wall/,/^nox > results/p' "$OUT/$run/conformance.log" | grep -v "^nox >"
done
cat "$OUT/summary.txt"
# One archive per run: the device tool brings back a limited number of files.
for run in $RUNS; do tar -czf "$OUT/$run.tgz" -C "$OUT" "$run" && rm -rf "${OUT:?}/$run"; done
