# Sourced by the scripts: nox from carried wheels (.whl/, see .ci/offline-wheels), caches, output folder.
set -u
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
if ! python3 -m nox --version >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 CONFORMANCE_CACHE_DIR="${CONFORMANCE_CACHE_DIR:-/tmp/aoti-cache}"
# The three caches in one folder, as a CI job keeps them between runs: the artifact cache, inductor's, Triton's.
use_cache_folder() { export CONFORMANCE_CACHE_DIR="$1" TORCHINDUCTOR_CACHE_DIR="$1/inductor" TRITON_CACHE_DIR="$1/triton"; }
IMAGE_CXX="${CXX:-}"
