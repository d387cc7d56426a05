#!/usr/bin/env bash
# Issue 27 on a GPU: what the CPU self-tests cannot reach there.
#   probe    — tests/conformance/test_optional_parts.py: every combination of optional parts, now with the CUDA cases
#              running (on a CPU they skip before touching the backend); 0 failures, every combination covered.
#   modern   — the whole suite against a backend without the deprecated runtime options (the reference
#              less set_option/get_option), as a user runs it: 0 failed, the option's cases skipped with why.
#   bench    — the view_pass and lowering suites on the GPU after their CPU changes (records without -cpu).
# FIRST_DAY_STEPS picks steps (default: all three); FIRST_DAY_LIMIT seconds per step (default 900).
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
limit="${FIRST_DAY_LIMIT:-900}"
step() { [[ " ${FIRST_DAY_STEPS:-probe modern bench} " == *" $1 "* ]]; }
if step probe; then
  timeout "$limit" python3 -m pytest tests/conformance/test_optional_parts.py -n 4 -q -rs -s -p no:cacheprovider \
    > "$OUT/optional-parts.log" 2>&1
  echo "optional parts rc=$? :: $(tail -1 "$OUT/optional-parts.log")"
  grep -E "cases, [0-9]+ runs, 0 failures" "$OUT/optional-parts.log"
fi
if step modern; then
  timeout "$limit" python3 -m nox -s conformance --no-venv -- \
    --backend "tests.minimal_backends:runtime_options=absent" > "$OUT/modern-backend.log" 2>&1
  echo "modern backend rc=$?"
  grep -E "^(bad_inputs|device_placement|lowering|mm_out|multi_method|program_format|runtime_options|streams_threads|traffic_meter):" \
    "$OUT/modern-backend.log" | cut -c1-200
  grep -E "failed rules|progress: .* ETA" "$OUT/modern-backend.log" | head -3
  cp results/conformance.json "$OUT/modern-backend.json" 2>/dev/null
fi
if step bench; then
  timeout "$limit" python3 -m harness.bench --suite view_pass,lowering --quick --out "$OUT/bench-view-lowering.json" \
    > "$OUT/bench-view-lowering.log" 2>&1
  echo "bench view_pass,lowering rc=$?"; tail -5 "$OUT/bench-view-lowering.log" | cut -c1-200
fi
