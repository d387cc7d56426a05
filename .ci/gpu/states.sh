#!/usr/bin/env bash
# Where a run's threads wait: every 2 s, the machine's threads counted by state, kernel wait channel and
# command (ps), the busiest 25 rows, and each GPU's utilisation, to $1 (default $OUT/states.log). Runs until killed; start it beside a
# suite run to see what a cold run's processes wait for when the cores are idle (issue 31).
out="${1:-${OUT:-.}/states.log}"
start=$(date +%s)
while true; do
  echo "== t=$(( $(date +%s) - start ))s"
  ps -eLo stat=,wchan:28=,comm= | awk '{s=substr($1,1,1); print s, $2, $3}' | sort | uniq -c | sort -rn | head -25
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/  gpu /'
  sleep 2
done > "$out" 2>&1
