#!/usr/bin/env bash
# Preflight (image compiler vs /usr/bin/g++), zoo lowering cold then warm, first-load probe.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
L="$OUT/lowering"; mkdir -p "$L"
echo "image CXX=$IMAGE_CXX  cores=$(nproc)" > "$L/env.txt"
timeout 240 python3 -m reference_impl.lowering.preflight --device cuda --timeout 230 > "$L/preflight-image-cxx.txt" 2>&1
echo "rc=$?" >> "$L/preflight-image-cxx.txt"
export CXX=/usr/bin/g++
timeout 240 python3 -m reference_impl.lowering.preflight --device cuda --timeout 230 > "$L/preflight-usr-bin-gpp.txt" 2>&1
echo "rc=$?" >> "$L/preflight-usr-bin-gpp.txt"
timeout 420 python3 -m conformance.suite.prelower --device cuda --jobs 8 > "$L/prelower-cold.txt" 2>&1
timeout 200 python3 -m conformance.suite.prelower --device cuda --jobs 8 > "$L/prelower-warm.txt" 2>&1
timeout 150 python3 -m reference_impl.lowering.load_probe --device cuda --variants torch/cold,fast,fast/cold-pyc \
  --timeout 70 --out "$L/probe" > "$L/load-probe.txt" 2>&1
echo "rc=$?" >> "$L/load-probe.txt"
for f in "$L"/*.txt; do echo "== $(basename "$f")"; tail -n 5 "$f"; done | cut -c1-200
