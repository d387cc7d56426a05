#!/usr/bin/env bash
# Issue 13: the native ceiling of thread scaling (.ci/gpu/thread_ceiling.cpp: cublasGemmEx from 1-8 C++
# threads, no Python), built with the headers and libraries the native shim builds with. Writes
# $OUT/thread-ceiling.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
read -r -a cmd < <(python3 - <<'PY'
from reference_impl.shims.native.build import plan_build
p = plan_build()
args = [p.compiler, "-O2", "-std=c++17", "-pthread", *(a for d in p.include_dirs for a in ("-isystem", d)),
        ".ci/gpu/thread_ceiling.cpp", "-o", "/tmp/thread_ceiling", *p.libraries]
args += [f"-Wl,-rpath,{__import__('os').path.dirname(l)}" for l in p.libraries]
print(" ".join(args))
PY
)
"${cmd[@]}" || { echo "thread ceiling: build failed"; exit 1; }
for shape in 64 256; do /tmp/thread_ceiling "$shape" "${CEILING_CALLS:-20000}" 5; done | tee "$OUT/thread-ceiling.txt"
