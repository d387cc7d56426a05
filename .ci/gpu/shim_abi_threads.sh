#!/usr/bin/env bash
# Issue 13: calls/s of the C ABI aoti_torch_cuda_mm_out from 1-8 C++ threads, libtorch's and our native
# shim's in one process (.ci/gpu/shim_abi_threads.cpp): the call path of compiled programs, no Python.
# Builds the shim (cached), then the driver with the headers and libraries the shim builds with, plus
# libtorch's. Writes $OUT/shim-abi-threads.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
read -r shim < <(python3 -c "
from reference_impl.shims.native import build
s = build.build_library()
print(s.path if s.available else 'MISSING: ' + s.reason)")
[[ "$shim" == MISSING* ]] && { echo "native shim: $shim"; exit 1; }
read -r -a cmd < <(python3 - <<'PY'
import os
from reference_impl.shims.native.build import plan_build
p = plan_build()
libs = [*p.libraries, *(os.path.join(p.torch_lib_dir, f"lib{n}.so") for n in ("torch", "torch_cpu", "torch_cuda", "c10", "c10_cuda"))]
args = [p.compiler, "-O2", "-std=c++17", "-pthread", *(a for d in p.include_dirs for a in ("-isystem", d)),
        ".ci/gpu/shim_abi_threads.cpp", "-o", "/tmp/shim_abi_threads", "-Wl,--no-as-needed", *libs, "-ldl"]
args += sorted({f"-Wl,-rpath,{os.path.dirname(l)}" for l in libs})
print(" ".join(args))
PY
)
"${cmd[@]}" || { echo "shim ABI threads: build failed"; exit 1; }
for shape in 64 256; do /tmp/shim_abi_threads "$shim" "$shape" "${ABI_CALLS:-20000}" 5; done | tee "$OUT/shim-abi-threads.txt"
