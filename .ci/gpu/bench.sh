#!/usr/bin/env bash
# Every benchmark suite: the main ones through nox into results/bench.json, lowering costs (always cold,
# so the slowest) trimmed with --quick into results/bench-lowering.json; the report merges both.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
timeout 330 python3 -m nox -s bench --no-venv -- --suite mm_out,threads,pipelines,view_pass > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
timeout 240 python3 -m harness.bench --out results/bench-lowering.json --suite lowering --quick > "$OUT/bench-lowering.log" 2>&1
echo "bench lowering rc=$?"
cp results/bench.json results/bench-lowering.json "$OUT/" 2>/dev/null
tail -n 30 "$OUT/bench.log" | cut -c1-200; tail -n 8 "$OUT/bench-lowering.log" | cut -c1-200
