#!/usr/bin/env bash
# Warm runs side by side on one machine's caches: a cold run fills them (unless COLD=0: an earlier call on
# this still-warm machine did), then each variant of VARIANTS runs warm, in turn. A variant is a name; the
# command in $CHANGE_<name> (if any) changes this copy of the tree before its run, e.g.
# CHANGE_nowarmup="sed -i ... file"; each variant's changes are undone (the copy restored) before the next. $OUT: <variant>.tgz (as suite.sh's),
# micro.txt (pinned memory's costs), summary.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
cache="${SUITE_CACHE_DIR:-/tmp/ci-cache}"
use_cache_folder "$cache"
python3 - > "$OUT/micro.txt" 2>&1 <<'PY'
import os, subprocess, sys, time
import torch
t = time.perf_counter(); host = torch.empty(8 << 30, dtype=torch.uint8, pin_memory=True)
print(f"pin 8 GiB: {time.perf_counter() - t:.2f} s")
t = time.perf_counter(); del host; torch._C._host_emptyCache(); print(f"free it: {time.perf_counter() - t:.2f} s")
child = ("import os, sys, time, torch\nh = torch.empty(8 << 30, dtype=torch.uint8, pin_memory=True)\n"
         "d = torch.empty(8 << 30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
         "print(time.time(), flush=True); os._exit(0)\n")
p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
said = float(p.stdout.readline()); p.wait(); print(f"exit holding 8 GiB pinned + 8 GiB device: {time.time() - said:.2f} s")
child = "import os, time, torch\ntorch.empty(1, device='cuda'); torch.cuda.synchronize()\nprint(time.time(), flush=True); os._exit(0)\n"
p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
said = float(p.stdout.readline()); p.wait(); print(f"exit holding a CUDA context: {time.time() - said:.2f} s")
t = time.perf_counter(); subprocess.run([sys.executable, "-c", "import torch"]); print(f"import torch: {time.perf_counter() - t:.2f} s")
PY
cat "$OUT/micro.txt"
if [ "${COLD:-1}" = 1 ]; then
  rm -rf "$cache" /tmp/torchinductor_* && mkdir -p "$cache"
  OUT="$OUT" SUITE_CACHE_DIR="$cache" RUNS=cold bash .ci/gpu/suite.sh | tail -n 8
fi
git_free_copy=$(mktemp -d); cp -a conformance harness runner "$git_free_copy/"
for name in ${VARIANTS:-base}; do
  change_var="CHANGE_${name//[^a-zA-Z0-9_]/_}"; change="${!change_var:-}"
  if [ -n "$change" ]; then eval "$change"; fi
  mkdir -p "$OUT/$name"; rm -f "$OUT/$name.tgz"
  OUT="$OUT/$name" SUITE_CACHE_DIR="$cache" RUNS=warm bash .ci/gpu/suite.sh > /dev/null
  mv "$OUT/$name/warm.tgz" "$OUT/$name.tgz"
  { echo "== $name"; cat "$OUT/$name/summary.txt"; } >> "$OUT/summary.txt"; rm -rf "${OUT:?}/$name"
  tar -xzf "$OUT/$name.tgz" -O warm/conformance.log | grep -E "^(preflight|cases|report|total|nox > Session)" | cut -c1-230 | tee -a "$OUT/summary.txt"
  cp -a "$git_free_copy"/* .
done
cat "$OUT/summary.txt"
