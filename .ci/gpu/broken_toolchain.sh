#!/usr/bin/env bash
# Issue 31: the toolchain preflight runs beside the first cases, not before them; a broken toolchain must
# still stop the run with exit 3 and its diagnosis. The image's own CXX is such a toolchain (SPEC §3: its
# wrapper builds AOTInductor libraries that fail at load), so: the front door with that CXX, on empty
# artifact and inductor caches. Expected: exit 3 soon after the preflight's compile, the cases that ran
# meanwhile stopped, no later phase, the page and the table written. Output in $OUT/broken-toolchain/.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
B="$OUT/broken-toolchain"; mkdir -p "$B"
export CONFORMANCE_CACHE_DIR="$(mktemp -d /tmp/aoti-broken.XXXXXX)" TORCHINDUCTOR_CACHE_DIR="$(mktemp -d /tmp/inductor-broken.XXXXXX)"
if [ -n "$IMAGE_CXX" ]; then export CXX="$IMAGE_CXX"; else unset CXX; fi
start=$(date +%s)
timeout "${BROKEN_LIMIT:-200}" python3 -m nox -s conformance --no-venv > "$B/conformance.log" 2>&1
echo "broken toolchain (CXX=${CXX:-unset}): rc=$? wall=$(( $(date +%s) - start ))s" | tee "$B/summary.txt"
cp results/conformance.json "$B/" 2>/dev/null
grep -E "preflight|stopped|results: " "$B/conformance.log" | cut -c1-220 | tail -12 | tee -a "$B/summary.txt"
sed -n '/^phase .*wall/,/^total/p' "$B/conformance.log" | tee -a "$B/summary.txt"
