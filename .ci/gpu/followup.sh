#!/usr/bin/env bash
# After a suite run on the same machine (its artifact cache in $CONFORMANCE_CACHE_DIR): the pipelines bench
# (bytes saved per mechanism, NVML and counters), the mm_out bench with the LLM decode A/B and the
# sanitizers' 8-thread stress (issue 13), and the CUDA-only broken backends (issue 15). Each step has its
# own time limit (FOLLOWUP_LIMIT seconds, default 240: the broken step takes ~145 s on a warm H100), so one
# slow step cannot eat the others' time. The broken backends that need two GPUs skip on one (reason shown).
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
limit="${FOLLOWUP_LIMIT:-240}"
step() { [[ " ${FOLLOWUP_STEPS:-pipelines mm broken} " == *" $1 "* ]]; }
if step pipelines; then
  timeout "$limit" python3 -m harness.bench --suite pipelines --quick --out "$OUT/bench-pipelines.json" \
    > "$OUT/bench-pipelines.log" 2>&1
  echo "bench pipelines rc=$?"; grep -E "saving" "$OUT/bench-pipelines.log" | cut -c1-260
fi
if step mm; then
  MM_NATIVE_STEPS="bench sanitizer" MM_NATIVE_CHAPTER_TOOLS="" timeout "$limit" bash .ci/gpu/mm_native.sh
  echo "mm_native rc=$?"
fi
if step broken; then
  # Names of the CUDA-only broken backends; those judged on NVML (device-wide counters) run last and alone,
  # with the reference's run of their selection: other processes' copies would be in the counters.
  names() { python3 -c "
from tests.rule_coverage import broken_backends
print(' or '.join(b.spec.split(':')[1] for b in broken_backends() if b.breaks.cuda and b.breaks.alone == $1))"; }
  cuda_only=$(names False); alone=$(names True)
  timeout "$limit" python3 -m pytest tests/conformance/test_broken_chapter_backends.py \
    tests/conformance/test_placement_broken_backends.py \
    -k "($cuda_only or host_inputs or pageable or reference_passes) and not alone" -n 6 -q -rs \
    -p no:cacheprovider > "$OUT/broken-gpu.log" 2>&1
  echo "broken backends (CUDA) rc=$? :: $(tail -1 "$OUT/broken-gpu.log")"
  timeout "$limit" python3 -m pytest tests/conformance/test_broken_chapter_backends.py -k "$alone or alone" -q -rs \
    -p no:cacheprovider > "$OUT/broken-gpu-nvml.log" 2>&1
  echo "broken backends judged on NVML, alone rc=$? :: $(tail -1 "$OUT/broken-gpu-nvml.log")"
  grep -hE "^(FAILED|SKIPPED|ERROR)" "$OUT"/broken-gpu*.log | cut -c1-240 | head -20
fi
