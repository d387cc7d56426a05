#!/usr/bin/env bash
# Issue 26 on one GPU: a faulty CUDA backend never takes the run down. The CUDA faulty backends of
# tests/broken/fault.py (an illegal address, an out-of-memory, a kernel that never ends) each run
# through whole chapters (program_format, bad_inputs; 4 workers) after the reference's run of the same
# chapters (tests/harness/test_fault_robustness.py): the faulty case must be named with its outcome and evidence,
# every other case must get the reference's outcome, case by case, and the result file, JUnit and page
# must be complete. Also the device probe's cost on this GPU, and the watchdog's per-case cost in the
# reference's (green) run, and the illegal address's repro line run as recorded, under compute-sanitizer.
# Evidence: $OUT/faults.tgz (each run's result file, JUnit, page, comparison); the last lines printed are
# the table. About 5-6 minutes on a fresh H100 (the reference run compiles).
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
EVIDENCE="$OUT/faults"
rm -rf "$EVIDENCE" && mkdir -p "$EVIDENCE"
limit="${FAULTS_LIMIT:-450}"
{
  nvidia-smi -L
  python3 -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__)"
  for tool in gdb compute-sanitizer; do echo "$tool: $(command -v "$tool" || echo 'not installed')"; done
} > "$EVIDENCE/environment.txt" 2>&1
python3 -m harness.device_probe --bench 2000 > "$EVIDENCE/probe-bench.txt" 2>&1
start=$(date +%s)
FAULT_EVIDENCE_DIR="$EVIDENCE" timeout "$limit" python3 -m pytest tests/harness/test_fault_robustness.py -k cuda \
  -q -rs -p no:cacheprovider --basetemp=/tmp/faults-pytest > "$EVIDENCE/pytest.log" 2>&1
echo "fault robustness (CUDA): rc=$? wall=$(( $(date +%s) - start ))s :: $(tail -1 "$EVIDENCE/pytest.log")" \
  > "$EVIDENCE/summary.txt"
python3 - "$EVIDENCE" >> "$EVIDENCE/summary.txt" <<'EOF'
import json, sys
from pathlib import Path

from harness.results import load_results

evidence = Path(sys.argv[1])
print(f"{'backend':<28} {'faulty case':<60} {'outcome':<13} {'others = ref':>12} {'wall':>7}")
for contained in sorted(evidence.glob("*/contained.json")):
    data = json.loads(contained.read_text())
    for case, outcome in data["faulty"].items():
        same = f"{data['same_as_reference']}/{data['cases'] - len(data['faulty'])}"
        print(f"{data['backend'].split(':')[1]:<28} {case.split('::')[1][:60]:<60} {outcome:<13} {same:>12} "
              f"{data['wall_s']:>6.0f}s")
reference = evidence / "reference" / "results.json"
if reference.exists():
    run = load_results(reference)
    overhead = run.metadata.get("case_watchdog") or {}
    print(f"reference: {len(run.cases)} cases, {run.summary()['outcomes']['passed']} passed; watchdog and "
          f"device probe {overhead.get('per_case_us', '?')} µs a case over {overhead.get('cases', '?')} cases")
EOF
cat "$EVIDENCE/probe-bench.txt" >> "$EVIDENCE/summary.txt"
# The device fault's repro line, as recorded, run as printed (python3 for the image's python): memcheck
# must name the kernel's out-of-bounds store.
repro=$(python3 -c "
import json, sys
cases = json.load(open(sys.argv[1]))['cases']
print(next(c['repro'] for c in cases if c['outcome'] == 'device-fault'))" \
  "$EVIDENCE/ILLEGAL_ADDRESS_IN_EXECUTE/results.json" 2>/dev/null)
if [[ -n "$repro" ]] && command -v compute-sanitizer >/dev/null; then
  echo "$repro" > "$EVIDENCE/sanitizer-repro.txt"
  timeout 240 bash -c "${repro/ python -m pytest / python3 -m pytest } -p no:cacheprovider" \
    > "$EVIDENCE/sanitizer.log" 2>&1
  echo "repro under compute-sanitizer: rc=$? :: $(grep -m1 -E 'Invalid __global__ (write|read)' "$EVIDENCE/sanitizer.log") :: \
$(grep -m1 'ERROR SUMMARY' "$EVIDENCE/sanitizer.log")" >> "$EVIDENCE/summary.txt"
else
  echo "repro under compute-sanitizer: not run (no device-fault repro, or no compute-sanitizer)" >> "$EVIDENCE/summary.txt"
fi
grep -hE "^(FAILED|ERROR|SKIPPED)" "$EVIDENCE/pytest.log" | cut -c1-220 | head -10
cp "$EVIDENCE/summary.txt" "$OUT/faults-summary.txt"
# One archive: the device tool brings back a limited number of files.
tar -czf "$OUT/faults.tgz" -C "$OUT" faults && rm -rf "$EVIDENCE"
cat "$OUT/faults-summary.txt"
