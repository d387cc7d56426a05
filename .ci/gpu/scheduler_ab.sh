#!/usr/bin/env bash
# The cold run's scheduler on one machine, back to back (issue 49 item 2, issue 47's cold budget): the plain
# design first (the compile pool at a lower priority beside the case workers, nothing paused:
# CONFORMANCE_CPU_BUDGET=0), then the CPU budget that pauses compiles to keep the run within its cores,
# each on empty caches of its own. The first run pays the fresh machine's cold file cache (torch's
# libraries read from disk once), so a second run that wins by less than that is no win.
#   VARIANTS="plain budget" COLD_LIMIT=280 .ci/gpu/scheduler_ab.sh   ->  $OUT/<variant>/cold.tgz, summary.txt
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
root="$OUT"
if [ "${MEASURE_HOST:-0}" = 1 ]; then python3 .ci/gpu/host_scaling.py "$root/host.json" > "$root/host.txt"; fi
for variant in ${VARIANTS:-plain budget}; do
  caches="/tmp/suite-$variant"
  rm -rf /tmp/torchinductor_* "$caches"
  mkdir -p "$root/$variant"
  budget=""; [ "$variant" = plain ] && budget=0
  OUT="$root/$variant" CONFORMANCE_CPU_BUDGET="$budget" TRITON_CACHE_DIR="$caches/triton" \
    SUITE_CACHE_DIR="$caches" RUNS=cold COLD_LIMIT="${COLD_LIMIT:-280}" bash .ci/gpu/suite.sh | tail -n 12
  echo "$variant: $(cat "$root/$variant/summary.txt")" | tee -a "$root/summary.txt"
done
