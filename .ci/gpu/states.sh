#!/usr/bin/env bash
# Where a run's threads wait: every 2 s, the machine's threads counted by state, kernel wait channel and
# command (ps), the busiest 25 rows, and each GPU's utilisation, to $1 (default $OUT/states.log). Runs until killed; start it beside a
# suite run to see what a cold run's processes wait for when the cores are idle (issue 31).
# STACKS_AT="90 150": at those seconds, SIGUSR2 to the run's Python processes (pytest and its xdist
# workers, the pre-lowering and its pool), which then print every thread's stack to their logs: run the
# suite with CONFORMANCE_STACKS_SIGNAL=USR2 (harness/stacks.py), or the signal ends them.
out="${1:-${OUT:-.}/states.log}"
start=$(date +%s)
declare -A sent=()
while true; do
  now=$(( $(date +%s) - start ))
  echo "== t=${now}s"
  for at in ${STACKS_AT:-}; do
    if [ "$now" -ge "$at" ] && [ -z "${sent[$at]:-}" ]; then
      sent[$at]=1
      pids=$(pgrep -f 'python.*(-m pytest|conformance[.]prelower|spawn_main|exec[(]eval[(]sys[.]stdin)')
      echo "  stacks asked of: $pids" | tr '\n' ' '; echo
      for pid in $pids; do kill -USR2 "$pid" 2>/dev/null; done
    fi
  done
  ps -eLo stat=,wchan:28=,comm= | awk '{s=substr($1,1,1); print s, $2, $3}' | sort | uniq -c | sort -rn | head -25
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/  gpu /'
  sleep 2
done > "$out" 2>&1
