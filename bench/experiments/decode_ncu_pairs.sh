#!/usr/bin/env bash
# decode_ncu_pairs.sh -- two flexgen decode walks that should read at the
# same rate, one kernel each under ncu, for the gaps the A/B runs could
# not explain (attention_notes decode d44, d45): noop against causal at
# D=64 B=1 (the same attention at one query; 0.9% apart), and
# sliding_window contiguous against paged (pages of 16; the -pairs walk
# and one KV head a walk) at D=64 B=8, the rows furthest from the issue's
# 5% (6-13%). On the GPU machine from the repository root, over a release
# build (its src/libflexgen.so):
#   OUT=... bash bench/experiments/decode_ncu_pairs.sh [BUILD]
# Each run: decode_mod_one.py (checked against the float64 reference
# first), the walk's fourth launch (the first ones compile and warm),
# SpeedOfLight, MemoryWorkloadAnalysis, WarpStateStats, LaunchStats,
# SchedulerStats and a few counters; the summary lines go to
# $OUT/decode_ncu_pairs.txt, each run's whole report to $OUT/ncu_NAME.txt.
set -u
build=${1:-build-gpu}
export FLEXGEN_LIB=$PWD/$build/src/libflexgen.so FLEXGEN_SOURCE_ROOT=$PWD FLEXGEN_CACHE_DIR=/tmp/ncu_pairs_cache
out=${OUT:?set OUT}
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section SchedulerStats"
M="--metrics smsp__inst_executed.sum,sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum"
# name : environment : decode_mod_one.py's arguments
runs=(
    "noop64_b1::noop 64 1 131072 6"
    "causal64_b1::causal 64 1 131072 6"
    "swin64_b8::sliding_window 64 8 32768 6"
    "swin64_b8_paged16_pairs:FLEXGEN_DECODE_HEAD_PAIRS=1:sliding_window 64 8 32768 6 16"
    "swin64_b8_paged16_onehead:FLEXGEN_DECODE_HEAD_PAIRS=0:sliding_window 64 8 32768 6 16"
)
: > "$out/decode_ncu_pairs.txt"
for r in "${runs[@]}"; do
    name=${r%%:*}; rest=${r#*:}; envs=${rest%%:*}; args=${rest#*:}
    env $envs timeout 120 ncu --clock-control none --cache-control all -k regex:decode_r --launch-skip 3 \
        --launch-count 1 $S $M python3 bench/experiments/decode_mod_one.py $args > "$out/ncu_$name.txt" 2>&1
    echo "== $name (rc $?): $envs $args" >> "$out/decode_ncu_pairs.txt"
    grep -E "fg_attention_decode_r|err=|Duration|DRAM Throughput|Registers Per|Dynamic Shared|Achieved Occupancy|Warp Cycles Per Issued|Waves Per SM|inst_executed|cycles_active|dram__bytes_read|lts__t_sectors" \
        "$out/ncu_$name.txt" >> "$out/decode_ncu_pairs.txt"
done
cat "$out/decode_ncu_pairs.txt"
