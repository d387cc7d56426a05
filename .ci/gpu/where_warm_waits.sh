#!/usr/bin/env bash
# Where a warm run waits: a cold run fills the caches (unless COLD=0), then a warm run with the GPU's
# utilization sampled by nvidia-smi every 200 ms (gpuutil.csv: the share of each interval in which a kernel
# ran, the memory controller's share), then a warm run under py-spy (profile_warm.sh). $OUT: cold.tgz,
# util/warm.tgz, gpuutil.csv, pyspy.txt.gz, warm.tgz, summary.txt.
cd "$(dirname "$0")/../.." && source .ci/gpu/common.sh
export CXX=/usr/bin/g++
cache="${SUITE_CACHE_DIR:-/tmp/ci-cache}"
if [ "${COLD:-1}" = 1 ]; then
  rm -rf "$cache" && mkdir -p "$cache"
  OUT="$OUT" SUITE_CACHE_DIR="$cache" RUNS=cold bash .ci/gpu/suite.sh | tail -n 8
fi
nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,pcie.link.gen.current --format=csv,noheader \
  -lms 200 > "$OUT/gpuutil.csv" 2>&1 &
smi=$!
mkdir -p "$OUT/util"
OUT="$OUT/util" SUITE_CACHE_DIR="$cache" RUNS=warm bash .ci/gpu/suite.sh | tail -n 8
kill "$smi"
OUT="$OUT" SUITE_CACHE_DIR="$cache" bash .ci/gpu/profile_warm.sh | tail -n 12
