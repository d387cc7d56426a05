#!/usr/bin/env bash
# Where a run's threads wait: every 2 s, the machine's threads counted by state, kernel wait channel and
# command (ps), the busiest 25 rows, and each GPU's utilisation, to $1 (default $OUT/states.log). Runs until killed; start it beside a
# suite run to see what a cold run's processes wait for when the cores are idle (issue 31).
# STACKS_AT="90 150": at those seconds, SIGUSR2 to the run's Python processes (pytest and its xdist
# workers, the pre-lowering and its pool) that catch it, which then print every thread's stack to their
# logs: run the suite with CONFORMANCE_STACKS_SIGNAL=USR2 (harness/stacks.py). A process that does not
# catch it yet (still importing) is left alone: the signal would end it (it killed a warm run's twelve
# starting workers and its --is-done question once).
# PYSPY=/path/to/py-spy: at the same seconds, also `py-spy dump` of every Python process of the
# machine to $OUT/pyspy-<t>.txt: it needs no help from the process, so it also sees a compile stuck in C.
out="${1:-${OUT:-.}/states.log}"
start=$(date +%s)
# SigCgt is the hex mask of the signals a process catches; SIGUSR2 (12) is bit 11.
catches_usr2() {
  local mask
  mask=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null)
  [ -n "$mask" ] && (( (16#$mask >> 11) & 1 ))
}
declare -A sent=()
while true; do
  now=$(( $(date +%s) - start ))
  echo "== t=${now}s"
  for at in ${STACKS_AT:-}; do
    if [ "$now" -ge "$at" ] && [ -z "${sent[$at]:-}" ]; then
      sent[$at]=1
      pids=$(pgrep -f 'python.*(-m pytest|conformance[.]prelower|spawn_main|exec[(]eval[(]sys[.]stdin)')
      echo "  stacks asked of: $pids" | tr '\n' ' '; echo
      for pid in $pids; do catches_usr2 "$pid" && kill -USR2 "$pid" 2>/dev/null; done
      if [ -n "${PYSPY:-}" ]; then
        for pid in $(pgrep -f '^[^ ]*python'); do
          echo "=== pid $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
          timeout 20 "$PYSPY" dump --pid "$pid" 2>&1
        done > "$(dirname "$out")/pyspy-${at}.txt" 2>&1 &
      fi
    fi
  done
  ps -eLo stat=,wchan:28=,comm= | awk '{s=substr($1,1,1); print s, $2, $3}' | sort | uniq -c | sort -rn | head -25
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/  gpu /'
  sleep 2
done > "$out" 2>&1
