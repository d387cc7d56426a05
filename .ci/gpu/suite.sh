#!/usr/bin/env bash
# The whole suite as a GPU CI job runs it, then the report.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
timeout 520 python3 -m nox -s conformance --no-venv > "$OUT/conformance.log" 2>&1; echo "conformance rc=$?"
cp results/*.json "$OUT/" 2>/dev/null
grep -E "^[a-z_]+: [0-9]+ passed|results:|prelower:" "$OUT/conformance.log" | cut -c1-200
