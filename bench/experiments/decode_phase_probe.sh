#!/usr/bin/env bash
# decode_phase_probe.sh -- where a decode walk's block spends its time,
# phase by phase, in the benchmark's cache state: decode-phase-probe.patch's
# build (thread 0 of each block of KV head 0, sequence 0 prints its SM
# cycles at the walk's phases) under decode_mod_one.py with DECODE_FLUSH=1
# (the 256 MB write before each call that do_bench makes), for the rows
# where paged and contiguous differ most at D=64: sliding_window B=1 and
# B=8, contiguous, paged 16 with the -pairs walk and with one head a walk;
# causal B=1 contiguous and paged 16 for a long walk beside them. On the
# GPU machine from the repository root:
#   OUT=... bash bench/experiments/decode_phase_probe.sh PROBE_BUILD
# (ONLY=REGEX: only the runs whose names match it, e.g. ONLY=b32)
# Phases (cycles from the block's first instruction): plan (the split's
# range known: the block mask's counts read), page (the first tile's page
# id arrived, paged; its index entry, contiguous), issue (the first tiles'
# copies issued: the index entries and, paged, the page ids read), first
# (the first tile landed, every warp past its barrier), loop (the last
# tile's P V done), merge (the warps' parts merged in shared memory), end
# (the cluster's merge and the row's store, or the part's store). `skew`
# is the block's start (globaltimer) after the call's first block's, in
# ns. decode_phase_probe.py prints the medians over the blocks that walk
# a tile or more, of the last three calls.
set -u
build=${1:?usage: decode_phase_probe.sh PROBE_BUILD}
out=${OUT:?set OUT}
here=$(cd "$(dirname "$0")" && pwd)
export FLEXGEN_LIB=$PWD/$build/src/libflexgen.so FLEXGEN_SOURCE_ROOT=$PWD FLEXGEN_CACHE_DIR=/tmp/phase_probe_cache DECODE_FLUSH=1
runs=(
    "swin_b1:1:sliding_window 64 1 131072 6"
    "swin_b1_paged16_pairs:1:sliding_window 64 1 131072 6 16"
    "swin_b1_paged16_onehead:0:sliding_window 64 1 131072 6 16"
    "swin_b8:1:sliding_window 64 8 32768 6"
    "swin_b8_paged16_pairs:1:sliding_window 64 8 32768 6 16"
    "swin_b8_paged16_onehead:0:sliding_window 64 8 32768 6 16"
    "swin_b32:1:sliding_window 64 32 8192 6"
    "swin_b32_paged16_pairs:1:sliding_window 64 32 8192 6 16"
    "swin_b32_paged16_onehead:0:sliding_window 64 32 8192 6 16"
    "causal_b1:1:causal 64 1 131072 6"
    "causal_b1_paged16_pairs:1:causal 64 1 131072 6 16"
)
for r in "${runs[@]}"; do
    name=${r%%:*}; rest=${r#*:}; hp=${rest%%:*}; args=${rest#*:}
    [[ $name =~ ${ONLY:-.} ]] || continue
    FLEXGEN_DECODE_HEAD_PAIRS=$hp timeout 120 python3 "$here/decode_mod_one.py" $args > "$out/phase_$name.txt" 2>&1
    echo "== $name (rc $?, FLEXGEN_DECODE_HEAD_PAIRS=$hp): $args"
    python3 "$here/decode_phase_probe.py" "$out/phase_$name.txt"
done
