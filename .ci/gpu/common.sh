# Sourced by the scripts: nox from carried wheels (.whl/, see .ci/offline-wheels), caches, output folder.
set -u
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
if ! python3 -m nox --version >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 CONFORMANCE_CACHE_DIR="${CONFORMANCE_CACHE_DIR:-/tmp/aoti-cache}"
IMAGE_CXX="${CXX:-}"
