#!/usr/bin/env bash
# fwd_overlap_probe.sh -- run fwd-overlap-probe.patch's build (each Hopper
# forward consumer's cycles by phase of a tile, and the first walk's tile
# times, printed by block 0) on gallery mods at B=4 H=16 S=8192 bf16, one
# launch each. Build the probe first, here:
#   git worktree add /tmp/exp-ov HEAD && git -C /tmp/exp-ov am "$PWD/bench/experiments/fwd-overlap-probe.patch"
#   scripts/build_rev.sh "$(git -C /tmp/exp-ov rev-parse HEAD)" build-gpu/devrun/ov
# then on the GPU machine, from the repository root (carry build-gpu/devlib
# and build-gpu/devrun/ov):
#   OUT=... [RUNS="noop:64 causal:64 document:64 noop:128"] bash bench/experiments/fwd_overlap_probe.sh build-gpu/devrun/ov
# Output: $OUT/overlap_probe.txt, the PROBE lines by run.
set -u
root=$(cd "${1:?usage: fwd_overlap_probe.sh PROBE_TREE}" && pwd)
export LD_LIBRARY_PATH=$PWD/build-gpu/devlib
. bench/gallery_args.sh
B=$(mktemp -d); gallery_buffers "$B"
for md in ${RUNS:-noop:64 causal:64 document:64 noop:128}; do
    m=${md%:*} d=${md#*:}
    echo "== $m D=$d"
    # shellcheck disable=SC2046
    FLEXGEN_SOURCE_ROOT=$root FLEXGEN_CACHE_DIR=/tmp/overlap_probe timeout 150 "$root/b/tools/flexgen" check \
        $(gallery_mod_args . "$B" "$m") --batch 4 --heads 16 --q-len 8192 --head-dim "$d" --no-reference 2>&1 | grep PROBE
done | tee "$OUT/overlap_probe.txt"
