#!/usr/bin/env bash
# run_compare.sh -- the GPU machine's side of the benchmark.
#
# Run from the repository root on a machine with a CUDA GPU, PyTorch and
# Triton, over a release build made elsewhere:
#     bench/run_compare.sh BUILD_DIR [STEP...]
# Steps (default: env tests compare128 compare64 cbench; the backward's
# steps bwd128 bwd64 run when named):
#     env         the device, driver, clocks and versions
#     tests       python/test_flexgen.py (the GPU part included)
#     quick       compare_torch.py on a small shape (B=1 H=8 S=2048), all mods
#     compare128  compare_torch.py at B=4 H=16 S=8192 D=128 bf16 (the default)
#     compare64   the same at D=64
#     bwd128      compare_torch.py --backward on every gallery mod, D=128
#     bwd64       the same at D=64
#     cbench      flexgen bench (the C benchmark) at the default shape
#     cquick      flexgen bench on the small shape
# $LABEL, when set, is recorded in the comparison's JSON (the commit built);
# $COMPARE_ARGS is added to every compare_torch.py command (--sustain 0, say:
# timings from a cold card instead of under sustained load).
# Logs, JSON and charts go to $OUT (default ./bench-out); the last lines of
# the log are the tables. BUILD_DIR/devlib, if present, is put on
# LD_LIBRARY_PATH (for libraries the build machine has and this one lacks).
set -uo pipefail

BUILD=${1:?usage: bench/run_compare.sh BUILD_DIR [STEP...]}
shift
STEPS=${*:-env tests compare128 compare64 cbench}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"

export FLEXGEN_LIB=$PWD/$BUILD/src/libflexgen.so
export LD_LIBRARY_PATH=$PWD/$BUILD/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NVRTC is linked, not carried: take the toolkit's where the loader does not know it.
[ -d /usr/local/cuda/lib64 ] && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
export FLEXGEN_SOURCE_ROOT=$PWD
export PYTHONUNBUFFERED=1
FLEXGEN_CACHE_DIR=$(mktemp -d)
export FLEXGEN_CACHE_DIR
trap 'rm -rf "$FLEXGEN_CACHE_DIR"' EXIT

LOG=$OUT/log.txt
status=0
step() { # name command...
    local name=$1
    shift
    echo "=== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
    [ "$rc" -eq 0 ] || status=1
}

for s in $STEPS; do
    case $s in
    env)
        step env bash -c 'date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"triton\", triton.__version__)"; nproc'
        ;;
    tests)
        step tests python3 python/test_flexgen.py -v
        ;;
    quick)
        step quick python3 bench/compare_torch.py --batch 1 --heads 8 --seq 2048 \
            --warmup 10 --rep 30 --json "$OUT/quick.json"
        ;;
    compare128)
        step compare128 python3 bench/compare_torch.py --head-dim 128 ${LABEL:+--label "$LABEL"} ${COMPARE_ARGS:-} \
            --json "$OUT/compare_d128.json" --png "$OUT/compare_d128.png"
        ;;
    compare64)
        step compare64 python3 bench/compare_torch.py --head-dim 64 ${LABEL:+--label "$LABEL"} ${COMPARE_ARGS:-} \
            --json "$OUT/compare_d64.json" --png "$OUT/compare_d64.png"
        ;;
    bwd128 | bwd64)
        step "$s" python3 bench/compare_torch.py --backward --head-dim "${s#bwd}" ${LABEL:+--label "$LABEL"} ${COMPARE_ARGS:-} \
            --json "$OUT/backward_d${s#bwd}.json" --png "$OUT/backward_d${s#bwd}.png"
        ;;
    cbench)
        step cbench "$BUILD/tools/flexgen" bench --json "$OUT/bench_c.json"
        ;;
    cquick)
        step cquick "$BUILD/tools/flexgen" bench --batch 1 --heads 8 --seq 2048 \
            --json "$OUT/cquick.json"
        ;;
    *)
        echo "unknown step '$s'" | tee -a "$LOG"
        status=2
        ;;
    esac
done
exit $status
