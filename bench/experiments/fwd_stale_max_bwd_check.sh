#!/usr/bin/env bash
# fwd_stale_max_bwd_check.sh -- the one GPU shard that failed on
# fwd-stale-max.patch (attention_notes f36): gpu_attention_bwd's
# test_features_1 in deterministic mode, on main's build and on the patch's,
# each case's line (dq / dk / dv / buffer-gradient errors against the CPU
# reference, "ok" or "FAIL"), so the two builds' margins sit side by side.
# Build the patch with its tests first, here:
#   git worktree add /tmp/exp-f36 HEAD && git -C /tmp/exp-f36 am "$PWD/bench/experiments/fwd-stale-max.patch"
#   meson setup build-gpu/devrun/f36t /tmp/exp-f36 --buildtype=release -Dtests=enabled && ninja -C build-gpu/devrun/f36t
#   find build-gpu/devrun/f36t -name '*.p' -type d -prune -exec rm -rf {} +
# then on the GPU machine, from the repository root (carry build-gpu; each
# run takes ~110 s, so the two run side by side):
#   OUT=... bash bench/experiments/fwd_stale_max_bwd_check.sh build-gpu build-gpu/devrun/f36t
set -u
export LD_LIBRARY_PATH=$PWD/build-gpu/devlib FLEXGEN_SOURCE_ROOT=$PWD
for b in "$@"; do
    n=$(echo "$b" | tr '/' '_')
    FLEXGEN_CACHE_DIR=/tmp/f36c_$n FLEXGEN_TEST_FILTER="test_features_1/deterministic_mode" \
        timeout 300 "$b/tests/gpu_attention_bwd" > "$OUT/bwd_$n.log" 2>&1 &
done
wait
for b in "$@"; do
    n=$(echo "$b" | tr '/' '_')
    echo "== $b"; grep -E "^(ok|FAIL) " "$OUT/bwd_$n.log"
done | tee "$OUT/bwd_compare.txt"
