#!/usr/bin/env bash
# Upstream ExecuTorch from PyPI (1.5.1, carried as wheels: `.ci/offline-wheels 3.12 executorch`) through the
# adapter upstream_executorch:BACKEND on one GPU: its self-tests, one small two-method model lowered for CUDA
# with per-stage seconds, then the lowering chapter (view pass, and every zoo model x dtype lowered through
# upstream's CUDA path; the lower-and-run cases skip: the wheel has no CUDA runtime) with upstream's known
# failures declared, and the placement validation cases (what upstream does with a misspelt method name or
# a non-bool flag). Result files and logs go to $OUT/executorch/.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
E="$OUT/executorch"; mkdir -p "$E"
if ! python3 -c "import executorch.exir" >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-et \
    .whl/executorch-*.whl .whl/ruamel_yaml-*.whl .whl/flatbuffers-*.whl .whl/tabulate-*.whl
  export PYTHONPATH=/tmp/site-et${PYTHONPATH:+:$PYTHONPATH}
fi
export CXX=/usr/bin/g++  # SPEC §3: the image's compiler wrapper breaks AOTInductor artifacts
start=$(date +%s)
{ python3 -c "import importlib.metadata as m, torch, triton
print('executorch', m.version('executorch'), 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'triton', triton.__version__)"; nvidia-smi -L; echo "image CXX=$IMAGE_CXX cores=$(nproc)"; } > "$E/env.txt" 2>&1
timeout 60 python3 -m pytest tests/upstream_executorch/test_upstream_executorch.py -q -p no:cacheprovider > "$E/selftests.txt" 2>&1
echo "rc=$? at $(( $(date +%s) - start )) s" >> "$E/selftests.txt"
timeout 150 python3 -m upstream_executorch.smoke --out "$E/smoke" > "$E/smoke.txt" 2>&1
echo "rc=$? at $(( $(date +%s) - start )) s" >> "$E/smoke.txt"
# The differential chapter's view pass section too (its runtime section skips: the adapter has no runtime);
# upstream's failures there are declared, so they are not shrunk (a verdict, not a repro, is wanted here).
timeout "${EXECUTORCH_SUITE_S:-330}" python3 -m pytest conformance/lowering/test_lowering.py conformance/device_placement/test_device_placement.py \
  conformance/differential/test_differential.py --generated-no-shrink \
  -k "not test_device_placement or (validated and (unknown-method or int-in-mapping))" -n "${EXECUTORCH_JOBS:-8}" \
  -p harness.pytest_plugin -p no:cacheprovider -q --backend upstream_executorch:BACKEND \
  --known-failures upstream_executorch/known_failures.toml --results-json="$E/conformance-executorch.json" \
  --junitxml="$E/conformance-executorch.junit.xml" > "$E/suite.txt" 2>&1
echo "rc=$? at $(( $(date +%s) - start )) s" >> "$E/suite.txt"
for f in "$E"/*.txt; do echo "== $(basename "$f")"; tail -n 8 "$f"; done | cut -c1-240
