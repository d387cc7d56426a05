#!/usr/bin/env bash
# Issue 13 evidence: the native C++ mm_out shim — build, mm_out chapter on it (including compiled programs
# calling it), compute-sanitizer memcheck + racecheck, and the bench (mm_out, threads, LLM decode A/B).
# Writes logs under $OUT; prints one summary line per step. About 15-25 minutes on an H100, most of it the
# sanitizers (racecheck is slow) and the first LLM compile if the artifact cache is cold.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
PY=python3
# MM_NATIVE_STEPS picks steps (default all): build tests chapter sanitizer bench host.
step() { [[ " ${MM_NATIVE_STEPS:-build tests chapter sanitizer bench host} " == *" $1 "* ]]; }

if step build; then
# 1. Build (or find in the cache) the native shim and its Python entry module; show what was used.
$PY - > "$OUT/native-build.log" 2>&1 <<'EOF'
from reference_impl.shims.native import build
from reference_impl.shims.path import describe_path
status = build.build_library()
print("status:", status)
if status.available:
    print("command:", " ".join(build.plan_build().command("<out>")))
entry = build.build_entry()
print("entry status:", entry)
if entry.available:
    print("entry command:", " ".join(build.plan_entry_build().command("<out>")))
print(describe_path())
EOF
echo "build rc=$? :: $(grep -E '^status|^entry status|mm_out path' "$OUT/native-build.log" | cut -c1-300 | tr '\n' ' ')"
grep -q "single call, GIL released once" "$OUT/native-build.log" || echo "WARNING: the extension entry is NOT in use (see native-build.log)"
nm -D --defined-only "$(grep -oE "path='[^']+'" "$OUT/native-build.log" | head -1 | cut -d"'" -f2)" \
  > "$OUT/native-exports.txt" 2>&1; grep -cE ' T ' "$OUT/native-exports.txt" | sed 's/^/exported functions: /'

fi
# 2. CPU self-tests of the shim, then the mm_out chapter on the native path (it fails if native is missing).
if step tests; then
$PY -m pytest tests/reference_impl/test_native_shim.py tests/reference_impl/test_native_entry.py \
  tests/reference_impl/test_native_routing.py tests/reference_impl/test_mm_out_validation.py \
  tests/reference_impl/test_mm_out_fast_path.py tests/reference_impl/test_gemm_plan.py -q -p no:cacheprovider \
  > "$OUT/selftests.log" 2>&1
echo "selftests rc=$? :: $(tail -1 "$OUT/selftests.log")"
fi
if step chapter; then
REFIMPL_MM_OUT_PATH=native $PY -m pytest conformance/mm_out/test_mm_out.py -q -p no:cacheprovider -m "not slow" \
  > "$OUT/mm_out-native.log" 2>&1
echo "mm_out chapter (native) rc=$? :: $(tail -1 "$OUT/mm_out-native.log")"
grep -E "^mm_out: " "$OUT/mm_out-native.log" | head -1
REFIMPL_MM_OUT_PATH=native $PY -m pytest conformance/mm_out/test_mm_out.py -q -p no:cacheprovider \
  -k "program_calls_backend_mm_out" -rA > "$OUT/mm_out-program-route.log" 2>&1
echo "compiled programs call the shim rc=$? :: $(tail -1 "$OUT/mm_out-program-route.log")"
if [ "${MM_NATIVE_FALLBACK:-1}" = 1 ]; then
  REFIMPL_MM_OUT_PATH=python $PY -m pytest conformance/mm_out/test_mm_out.py -q -p no:cacheprovider -m "not slow" \
    -k "not program_calls" > "$OUT/mm_out-python.log" 2>&1
  echo "mm_out chapter (python fallback) rc=$? :: $(tail -1 "$OUT/mm_out-python.log")"
fi
fi

# 3. compute-sanitizer: memcheck and racecheck over a chapter subset and an 8-thread stress.
SAN=""
for c in "$(command -v compute-sanitizer)" /usr/local/cuda/bin/compute-sanitizer \
         $($PY -c "import nvidia,os;[print(os.path.join(p,d,'bin','compute-sanitizer')) for p in nvidia.__path__ for d in os.listdir(p)]" 2>/dev/null); do
  [ -n "$c" ] && [ -x "$c" ] && { SAN="$c"; break; }
done
cat > /tmp/mm_native_stress.py <<'EOF'
import threading, torch
from reference_impl import BACKEND
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
cases = [(torch.randn(64 + 8 * i, 96, device=dev).bfloat16(), torch.randn(96, 48, device=dev).bfloat16().t().contiguous().t()) for i in range(8)]
expect = [(a.float() @ b.float()) for a, b in cases]
errors = []
def worker(i):
    a, b = cases[i]
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = torch.empty(a.shape[0], b.shape[1], device=dev, dtype=a.dtype)
        for _ in range(100):
            BACKEND.mm_out(out, a, b)
        s.synchronize()
        if (out.float() - expect[i]).abs().max().item() > 0.5:
            errors.append(i)
ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("stress errors:", errors)
raise SystemExit(1 if errors else 0)
EOF
# MM_NATIVE_SUBSET narrows it (racecheck runs each kernel ~50x slower; "" is the whole chapter).
SUBSET="${MM_NATIVE_SUBSET-values_match_float64_reference and medium or zero_sizes or bad_input or threads_match or current_stream or does_not_use_tf32}"
# The shim launches cuBLAS's kernels only (and a cudaMemsetAsync for K = 0), so the chapter runs check
# those: torch's own kernels (poisoning, references) run uninstrumented, which keeps racecheck's cost to
# the kernels under test. MM_NATIVE_SAN_KERNELS="" instruments every kernel.
KERNELS="${MM_NATIVE_SAN_KERNELS-regex=gemm|gemv|nvjet|xmma|cutlass|splitK|reduce|dot_kernel|scal_kernel}"
KERNEL_FILTER=()
if [ -n "$KERNELS" ] && [ -n "$SAN" ]; then
  if "$SAN" --tool racecheck --kernel-name "$KERNELS" $PY -c "import torch; torch.ones(1, device='cuda')" \
       > "$OUT/sanitizer-filter-probe.log" 2>&1; then
    KERNEL_FILTER=(--kernel-name "$KERNELS")
  else
    echo "compute-sanitizer rejects --kernel-name $KERNELS (sanitizer-filter-probe.log): every kernel is checked"
  fi
fi
if ! step sanitizer; then
  :
elif [ -z "$SAN" ]; then
  echo "compute-sanitizer: SKIPPED (not found on PATH, /usr/local/cuda/bin or the nvidia wheels)"
else
  # The chapter's float64 references run cuBLAS's float64 GEMMs, which the include filter also matches, and
  # a 4096^3 one did not finish under racecheck in 150 s. The shim has no float64 path, so those kernels are
  # never the shim's: "auto" names them (tokens found in the float64 GEMMs' kernel names and in none of the
  # shim's, read from torch.profiler) and racecheck leaves them uninstrumented (memcheck, being cheap, keeps
  # them); MM_NATIVE_SAN_EXCLUDE="" keeps them in racecheck too, any other value is the filter itself.
  EXCLUDE="${MM_NATIVE_SAN_EXCLUDE-auto}"
  if [ "$EXCLUDE" = auto ]; then
    EXCLUDE="$(PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" REFIMPL_MM_OUT_PATH=native $PY .ci/gpu/float64_kernel_names.py 2> "$OUT/sanitizer-exclude-probe.log")"
    if [ -n "$EXCLUDE" ] && ! "$SAN" --tool racecheck "${KERNEL_FILTER[@]}" --kernel-name-exclude "$EXCLUDE" $PY -c \
         "import torch; torch.ones(1, device='cuda')" >> "$OUT/sanitizer-exclude-probe.log" 2>&1; then
      EXCLUDE=""
    fi
    echo "float64 reference kernels left out of racecheck: ${EXCLUDE:-none (sanitizer-exclude-probe.log)}"
  fi
  # The route cases lower the LLM for CUDA: compile it first, outside the sanitizer (the reference caches by
  # content), so the cases under it load the programs and run them.
  if [ "${MM_NATIVE_PRELOWER:-1}" = 1 ]; then
    $PY -m conformance.suite.prelower --device cuda --model llm --jobs 3 > "$OUT/prelower-llm.log" 2>&1
    echo "prelower llm (cuda) rc=$? :: $(tail -1 "$OUT/prelower-llm.log")"
  fi
  for tool in memcheck racecheck; do
    # racecheck over the chapter takes long; MM_NATIVE_CHAPTER_TOOLS limits which tools run it, and
    # MM_NATIVE_SUBSET_MEMCHECK / MM_NATIVE_SUBSET_RACECHECK give a tool its own selection.
    subset_var="MM_NATIVE_SUBSET_${tool^^}"
    subset="${!subset_var-$SUBSET}"
    exclude_filter=()
    [ "$tool" = racecheck ] && [ -n "$EXCLUDE" ] && exclude_filter=(--kernel-name-exclude "$EXCLUDE")
    if [[ " ${MM_NATIVE_CHAPTER_TOOLS:-memcheck racecheck} " == *" $tool "* ]]; then
      REFIMPL_MM_OUT_PATH=native timeout "${MM_NATIVE_SAN_LIMIT:-900}" "$SAN" --tool "$tool" --error-exitcode 9 \
        "${KERNEL_FILTER[@]}" "${exclude_filter[@]}" --target-processes all $PY -m pytest conformance/mm_out/test_mm_out.py \
        -p no:cacheprovider --no-preflight -k "$subset" -v --durations=10 > "$OUT/sanitizer-$tool-chapter.log" 2>&1
      echo "compute-sanitizer $tool (chapter: ${subset:-all}) rc=$? :: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/sanitizer-$tool-chapter.log" | tail -2 | tr '\n' ' ')"
    fi
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" REFIMPL_MM_OUT_PATH=native "$SAN" --tool "$tool" --error-exitcode 9 $PY /tmp/mm_native_stress.py \
      > "$OUT/sanitizer-$tool-stress.log" 2>&1
    echo "compute-sanitizer $tool (8-thread stress) rc=$? :: $(grep -E 'ERROR SUMMARY|stress errors' "$OUT/sanitizer-$tool-stress.log" | tr '\n' ' ')"
  done
fi

# 4. Bench: mm_out (GPU + host time vs torch.mm, and the LLM decode A/B) and threads, on the native path.
if step bench; then
REFIMPL_MM_OUT_PATH=native $PY -m harness.bench --suite mm_out,threads --quick --out "$OUT/bench-mm-native.json" \
  > "$OUT/bench-mm-native.log" 2>&1
echo "bench rc=$?"
grep -E "^  (mm_out|threads)\[" "$OUT/bench-mm-native.log" | cut -c1-220
$PY - "$OUT/bench-mm-native.json" <<'EOF'
import json, math, sys
doc = json.load(open(sys.argv[1]))
recs = doc.get("run", doc).get("benchmarks", [])
def m(r, k):
    v = r.get("metrics", {}).get(k)
    return None if v is None else v.get("value")
mm = [r for r in recs if r.get("suite") == "mm_out" and "shape" in r.get("params", {})]
speeds = [m(r, "speed_vs_torch_mm") for r in mm if m(r, "speed_vs_torch_mm")]
hosts = [m(r, "host_speed_vs_torch_mm") for r in mm if m(r, "host_speed_vs_torch_mm")]
if speeds:
    geo = math.exp(sum(map(math.log, speeds)) / len(speeds))
    print(f"TARGET gpu-time geomean vs torch.mm {geo:.3f} (>= 0.99: {geo >= 0.99}); min {min(speeds):.3f} (>= 0.95: {min(speeds) >= 0.95})")
if hosts:
    print(f"TARGET host call-rate vs torch.mm: min {min(hosts):.3f}, median {sorted(hosts)[len(hosts)//2]:.3f} (>= 1.0: {min(hosts) >= 1.0})")
th = {(r["params"]["dtype"], r["params"]["shape"], r["params"]["threads"]): r for r in recs if r.get("suite") == "threads"}
for shape in ("64x64x64", "256x256x256"):
    one, eight = th.get(("bfloat16", shape, "1")), th.get(("bfloat16", shape, "8"))
    if one and eight:
        ours8, torch8, ours1 = m(eight, "calls_per_s"), m(eight, "torch_mm_calls_per_s"), m(one, "calls_per_s")
        print(f"TARGET threads {shape} bf16: ours@8 {ours8:,.0f}/s vs torch.mm@8 {torch8:,.0f}/s ({ours8 >= torch8}); "
              f"ours@8/ours@1 {ours8 / ours1:.2f}x (>= 3: {ours8 / ours1 >= 3})")
for r in recs:
    if r.get("params", {}).get("model") == "llm-decode":
        print(f"TARGET LLM decode step: ours {m(r, 'step_time')*1e6:.1f} us, libtorch mm {m(r, 'libtorch_mm_step_time')*1e6:.1f} us, "
              f"ratio {m(r, 'speed_vs_libtorch_mm'):.3f} (>= 0.98: {m(r, 'speed_vs_libtorch_mm') >= 0.98}); calls/step {r['conditions'].get('mm_out_calls_per_execute')}")
EOF
fi
# Host cost per call and 1/8-thread calls/s (64^3 bf16), each entry in its own process: the extension
# (native), the native library through the ctypes fallback entry (native-ctypes), the Python shim (python).
step host && for variant in native native-ctypes python; do
  path=${variant%%-*}; disable=0; [ "$variant" = native-ctypes ] && disable=1
  REFIMPL_MM_OUT_PATH=$path REFIMPL_NATIVE_ENTRY_DISABLE=$disable VARIANT=$variant $PY - <<'EOF'
import os, threading, time, torch
from reference_impl import BACKEND
from reference_impl.shims.path import describe_path
print(f"[{os.environ['VARIANT']}] {describe_path()[:160]}")
a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16); b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
o1, o2 = torch.empty_like(a), torch.empty_like(a)
for _ in range(200): BACKEND.mm_out(o1, a, b); torch.mm(a, b, out=o2)
torch.cuda.synchronize()
def per_call(f, n=50, reps=41):
    best = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(n): f()
        best.append((time.perf_counter() - t) / n); torch.cuda.synchronize()
    return sorted(best)[len(best) // 2]
ours = per_call(lambda: BACKEND.mm_out(o1, a, b)); theirs = per_call(lambda: torch.mm(a, b, out=o2))
print(f"host per call 64^3 bf16 [{os.environ['VARIANT']}]: ours {ours*1e6:.2f} us, torch.mm {theirs*1e6:.2f} us, rate ratio {theirs/ours:.3f}")
def rate(make, threads, calls=2000):
    barrier, done = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
    def work():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            f = make(); f(); s.synchronize(); barrier.wait()
            for _ in range(calls): f()
            s.synchronize(); done.wait()
    ts = [threading.Thread(target=work) for _ in range(threads)]; [t.start() for t in ts]
    barrier.wait(); t0 = time.perf_counter(); done.wait(); dt = time.perf_counter() - t0; [t.join() for t in ts]
    return threads * calls / dt
mm = BACKEND.mm_out
def ours_f():
    o = torch.empty_like(a); return lambda: mm(o, a, b)
def torch_f():
    o = torch.empty_like(a); return lambda: torch.mm(a, b, out=o)
r = {(n, k): max(rate(f, n) for _ in range(3)) for n in (1, 8) for k, f in (("ours", ours_f), ("torch", torch_f))}
print(f"threads 64^3 bf16 [{os.environ['VARIANT']}]: ours 1t {r[1,'ours']:,.0f}/s 8t {r[8,'ours']:,.0f}/s ({r[8,'ours']/r[1,'ours']:.2f}x); "
      f"torch.mm 1t {r[1,'torch']:,.0f}/s 8t {r[8,'torch']:,.0f}/s ({r[8,'torch']/r[1,'torch']:.2f}x); ours@8/torch@8 {r[8,'ours']/r[8,'torch']:.3f}")
EOF
done
