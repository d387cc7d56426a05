#!/usr/bin/env bash
# Issue 30: PyTorch's own AOTInductor runtime (the adapter torch_aoti) on one GPU, one mode per job (a mode
# takes 6-9 minutes on 16 cores, cold: the pre-lowering fills the adapter's package cache beside the cases).
#   .ci/gpu/torch_aoti.sh BACKEND|CHECKED
# First the standalone repros (torch_aoti/repros/run_all.sh, cpu and cuda) when REPROS=1, then every chapter
# through the front door with the mode's known failures and those of the image's torch release
# (known_failures*_torch2.11.toml), as `nox -s conformance_torch_aoti` passes them. Results, journal and log
# go to $OUT/aoti/<MODE>.*; AOTI_DEADLINE (default 470 s) is the run's deadline; AOTI_SELECT adds pytest
# arguments (e.g. "-k test_differential": one chapter).
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
mode="${1:?mode: BACKEND or CHECKED}"
export CXX=/usr/bin/g++  # SPEC §3: the image's compiler wrapper breaks AOTInductor artifacts
A="$OUT/aoti"; mkdir -p "$A"
start=$(date +%s)
if [ "${REPROS:-0}" = 1 ] && [ -f torch_aoti/repros/run_all.sh ]; then
  OUT="$A" timeout "${REPROS_LIMIT:-240}" bash torch_aoti/repros/run_all.sh > "$A/repros.txt" 2>&1
  echo "repros: rc=$? at $(( $(date +%s) - start )) s" | tee -a "$A/summary.txt"
fi
stem=known_failures; [ "$mode" = CHECKED ] && stem=known_failures_checked
release=$(python3 -c "import torch; print('.'.join(torch.__version__.split('.')[:2]))")
known=(--known-failures="torch_aoti/$stem.toml")
[ -f "torch_aoti/${stem}_torch$release.toml" ] && known+=(--known-failures="torch_aoti/${stem}_torch$release.toml")
# Every case lowers its programs through the adapter's package cache, which the pre-lowering fills beside
# them at a lower priority: a case waits on a program's lock while its compile runs.
export CONFORMANCE_WORKERS_PER_GPU="${CONFORMANCE_WORKERS_PER_GPU:-15}"
timeout $(( ${AOTI_DEADLINE:-470} + 60 )) python3 -m nox -s conformance --no-venv -- \
  --backend="torch_aoti:$mode" "${known[@]}" --run-deadline "${AOTI_DEADLINE:-470}" ${AOTI_SELECT:-} \
  > "$A/$mode.log" 2>&1
echo "$mode: rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$A/summary.txt"
cp results/conformance.json "$A/$mode.json" 2>/dev/null
cp results/conformance.jsonl "$A/$mode.jsonl" 2>/dev/null
grep -E "^[a-z_]+: [0-9]+ passed|known failures|declared \(|^results:" "$A/$mode.log" | cut -c1-200
gzip -f "$A/$mode.log" "$A/$mode.jsonl" 2>/dev/null
tail -n 30 "$A/repros.txt" 2>/dev/null
cat "$A/summary.txt"
