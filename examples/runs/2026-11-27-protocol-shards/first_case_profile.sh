#!/usr/bin/env bash
# Where does the GPU-alone phase's first placement case spend its time? One process, no xdist, warm cache
# (the four programs it needs lowered first), under cProfile; run from the repository root on the GPU
# machine: bash examples/runs/2026-11-27-protocol-shards/first_case_profile.sh
source .ci/gpu/common.sh
export CXX=/usr/bin/g++ CONFORMANCE_CACHE_DIR=/tmp/prof-cache CONFORMANCE_CUDA_SYNC=default
python3 -m conformance.prelower --device cuda --dtype float32 --model asr --model llm --jobs 14 > "$OUT/prelower.log" 2>&1
run() {  # name, -k expression
  python3 -m cProfile -o "$OUT/$1.prof" -m pytest conformance/test_device_placement.py -k "$2" -p no:xdist \
    -p harness.pytest_plugin --no-preflight --durations=0 --durations-min=0.05 -q -p no:cacheprovider \
    --results-json="$OUT/$1.json" > "$OUT/$1.log" 2>&1
}
run pcie-1 pcie_bytes   # compiles what prelower did not (the export-time programs)
run pcie-2 pcie_bytes   # warm
run llm-only "pcie_bytes and llm"
run asr-only "pcie_bytes and asr"
for f in pcie-2 llm-only asr-only; do
  echo "== $f"; grep -A8 "slowest durations" "$OUT/$f.log"
  python3 - "$OUT/$f.prof" <<'PY'
import pstats, sys
stats = pstats.Stats(sys.argv[1]).stats
rows = [(ct, f"{file.split('site-packages/')[-1]}:{line}:{fn}") for (file, line, fn), (_, _, _, ct, _) in stats.items()
        if ct > 0.5 and "_pytest" not in file and "pluggy" not in file]
for ct, name in sorted(rows, reverse=True)[:45]:
    print(f"{ct:7.2f} {name[:150]}")
PY
done
