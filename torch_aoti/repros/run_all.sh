#!/usr/bin/env bash
# Every repro of this directory, for --device cpu and, when this machine has CUDA, --device cuda.
#
#     torch_aoti/repros/run_all.sh [NAME...]  (from anywhere; plain torch, no project code)
#
# NAME: a script's name without .py, to run only those (all of them by default).
#
# Each script runs in a process of its own, under `timeout`, with an inductor cache of its own in a
# temporary folder removed at the end (two compiles of one model at once into a shared cache can package a
# half-written file), JOBS at a time. Its stdout and stderr go to $OUT/repros/<name>-<device>.txt; a table
# (script, device, exit code, seconds) is printed at the end and kept in $OUT/repros/summary.txt. Exits 0
# when every script exited 0.
#
# Environment: OUT (./repros-out), PYTHON (python, else python3), TIMEOUT seconds per script (600),
# JOBS (a third of the cores, at least 1), DEVICES (cpu, and cuda when torch sees a CUDA device).
# host_input_cuda_model.py is about both devices at once: it runs once, listed as cuda (it says "skipped"
# on a machine without CUDA).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-./repros-out}
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
TIMEOUT=${TIMEOUT:-600}
CORES=$(nproc 2>/dev/null || echo 4)
JOBS=${JOBS:-$((CORES / 3 > 0 ? CORES / 3 : 1))}
WORK=$(mktemp -d)  # status lines and inductor caches
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT/repros" "$WORK/status" "$WORK/cache"

TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__, int(torch.cuda.is_available()))') || {
    echo "run_all.sh: $PYTHON cannot import torch" >&2
    exit 2
}
read -r VERSION HAS_CUDA <<<"$TORCH"
if [ -z "${DEVICES:-}" ]; then
    DEVICES=cpu
    [ "$HAS_CUDA" = 1 ] && DEVICES="cpu cuda"
fi
echo "torch $VERSION, devices: $DEVICES, $JOBS at a time, timeout ${TIMEOUT}s each, output in $OUT/repros"

# The longest first (most child processes or compiles), so that the pool ends together; others after.
ORDER="wrong_shape package_loading wrong_dtype non_tensor_inputs host_input_cuda_model dim_bound
checked_message empty_input non_contiguous kernel_less_op"
[ "$#" -gt 0 ] && ORDER="$*"
NAMES=$(
    for n in $ORDER; do [ -f "$HERE/$n.py" ] && echo "$n"; done
    [ "$#" -gt 0 ] || for f in "$HERE"/[!_]*.py; do
        n=$(basename "$f" .py)
        case " $(echo $ORDER) " in *" $n "*) ;; *) echo "$n" ;; esac
    done
)

run_one() {  # name device [args...]: one script, its output file and its status line
    local name=$1 device=$2 start end rc
    shift 2
    start=$(date +%s.%N)
    TORCHINDUCTOR_CACHE_DIR="$WORK/cache/$name-$device" \
        timeout --kill-after=10 "$TIMEOUT" "$PYTHON" "$HERE/$name.py" "$@" \
        >"$OUT/repros/$name-$device.txt" 2>&1
    rc=$?
    end=$(date +%s.%N)
    [ "$rc" = 124 ] && echo "run_all.sh: timed out after ${TIMEOUT}s" >>"$OUT/repros/$name-$device.txt"
    awk -v n="$name" -v d="$device" -v r="$rc" -v s="$start" -v e="$end" \
        'BEGIN { printf "%-24s %-6s %4s %8.1f\n", n, d, r, e - s }' >"$WORK/status/$name-$device"
    echo "done: $name --device $device (exit $rc)"
}

JOBLIST=()
once=""
for device in $(echo "$DEVICES" | tr ' ' '\n' | sort -r); do  # cuda first: its pass is the long one
    for name in $NAMES; do
        if [ "$name" = host_input_cuda_model ]; then  # no --device: once, in the first pass
            [ -z "$once" ] && JOBLIST+=("$name cuda")
        else
            JOBLIST+=("$name $device")
        fi
    done
    once=done
done

for job in "${JOBLIST[@]}"; do
    read -r name device <<<"$job"
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    if [ "$name" = host_input_cuda_model ]; then
        run_one "$name" "$device" &
    else
        run_one "$name" "$device" --device "$device" &
    fi
done
wait

{
    printf '%-24s %-6s %4s %8s\n' script device exit seconds
    cat "$WORK/status/"* | sort
} | tee "$OUT/repros/summary.txt"
failed=$(awk '$3 != 0' "$WORK/status/"* | wc -l)
echo "torch $VERSION: ${#JOBLIST[@]} runs, $failed with a non-zero exit"
[ "$failed" = 0 ]
