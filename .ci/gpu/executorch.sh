#!/usr/bin/env bash
# Upstream ExecuTorch from PyPI (1.5.1, carried as wheels: `.ci/offline-wheels 3.12 executorch`) through the
# adapter upstream_executorch:BACKEND: its self-tests, one small two-method model lowered for CUDA (plain,
# then with export-time skip_h2d/skip_d2h), and the lowering chapter (view pass; the zoo cases skip: the
# wheel has no CUDA runtime). EXECUTORCH_ZOO=1 also lowers every zoo model in float32 (long: ~1 min each).
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
E="$OUT/executorch"; mkdir -p "$E"
if ! python3 -c "import executorch.exir" >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-et \
    .whl/executorch-*.whl .whl/ruamel_yaml-*.whl .whl/flatbuffers-*.whl .whl/tabulate-*.whl
  export PYTHONPATH=/tmp/site-et${PYTHONPATH:+:$PYTHONPATH}
fi
export CXX=/usr/bin/g++  # SPEC §3: the image's compiler wrapper breaks AOTInductor artifacts
{ python3 -c "import importlib.metadata as m, torch, triton
print('executorch', m.version('executorch'), 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'triton', triton.__version__)"; nvidia-smi -L; echo "image CXX=$IMAGE_CXX cores=$(nproc)"; } > "$E/env.txt" 2>&1
timeout 60 python3 -m pytest tests/test_upstream_executorch.py -q -p no:cacheprovider > "$E/selftests.txt" 2>&1
echo "rc=$?" >> "$E/selftests.txt"
timeout 200 python3 -m upstream_executorch.smoke --out "$E/smoke" > "$E/smoke.txt" 2>&1
echo "rc=$?" >> "$E/smoke.txt"
timeout 120 python3 -m pytest conformance/test_lowering.py -p harness.pytest_plugin -p no:cacheprovider -q \
  --backend upstream_executorch:BACKEND --results-json="$E/conformance-executorch.json" > "$E/lowering.txt" 2>&1
echo "rc=$?" >> "$E/lowering.txt"
timeout 200 python3 -m upstream_executorch.smoke --skip-copies --out "$E/smoke-skip" > "$E/smoke-skip.txt" 2>&1
echo "rc=$?" >> "$E/smoke-skip.txt"
if [ "${EXECUTORCH_ZOO:-0}" = 1 ]; then
  timeout 580 python3 -m conformance.prelower --device cuda --dtype float32 --jobs 4 \
    --backend upstream_executorch:BACKEND > "$E/zoo-float32.txt" 2>&1
  echo "rc=$?" >> "$E/zoo-float32.txt"
fi
for f in "$E"/*.txt; do echo "== $(basename "$f")"; tail -n 6 "$f"; done | cut -c1-240
