#!/usr/bin/env bash
# Every benchmark suite, as a user runs it: `nox -s bench` into results/bench.json. About 10-12 minutes
# on an H200; the lowering suite (every compile cold, in fresh processes) is half of that.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
python3 -m nox -s bench --no-venv > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
cp results/bench.json "$OUT/" 2>/dev/null
grep -E "^  [a-z_]+\[" "$OUT/bench.log" | cut -c1-200
