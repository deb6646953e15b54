#!/usr/bin/env bash
# fwd_ncu_source.sh -- where the Hopper forward's consumer warps spend their
# time, by section of their code: ncu's warp stall samples per SASS
# instruction (SourceCounters, WarpStateStats; one launch after two, clocks
# left alone) of gallery mods at B=4 H=16 S=8192 bf16, exported as the
# source page's CSV and summarised by ncu_sections.py (walk prologue, tile
# loop, walk end). On the GPU machine, from the repository root over a
# release build in build-gpu (with build-gpu/devlib):
#   OUT=... [RUNS="document:128 noop:128 causal:64"] [FLEXGEN=cli] bash bench/experiments/fwd_ncu_source.sh
# NCU_ARGS adds ncu options (--warp-sampling-interval 0 for a short
# kernel: the default interval gives a few hundred samples). SHAPE
# replaces the shape's arguments and KERNEL the kernel's name (a regex):
# the decode walk at B=1, say, with
#   KERNEL='fg_attention_decode_r' SHAPE="--batch 1 --heads 32 --kv-heads 8 --q-len 1 --kv-len 131072" RUNS=causal:64
# (ncu_sections.py then counts the kernel's loops without the forward's
# consumer / producer split).
# The reports stay in /tmp (large); $OUT gets one archive of the CSVs and
# the summary (attention_notes, "Where a short walk's time goes at D=128").
set -u
export LD_LIBRARY_PATH=$PWD/build-gpu/devlib FLEXGEN_SOURCE_ROOT=$PWD FLEXGEN_CACHE_DIR=/tmp/ncu_cache
. bench/gallery_args.sh
B=$(mktemp -d); gallery_buffers $B
W=/tmp/ncu_source; mkdir -p $W
F=${FLEXGEN:-build-gpu/tools/flexgen}
for md in ${RUNS:-document:128 noop:128 causal:64 document:64}; do
  m=${md%:*}; d=${md#*:}
  args="$(gallery_mod_args . $B $m) ${SHAPE:---batch 4 --heads 16 --q-len 8192} --head-dim $d --no-reference --time 3"
  $F check $args > /dev/null 2>&1 # compiled and cached before the profiled run
  timeout 150 ncu --clock-control none ${NCU_ARGS:-} --kernel-name regex:${KERNEL:-fg_attention_fwd} --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -f -o $W/rep_${m}_$d $F check $args > $W/ncu_${m}_$d.log 2>&1
  ncu --import $W/rep_${m}_$d.ncu-rep --page source --print-source sass --csv > $W/src_${m}_$d.csv 2> $W/src_${m}_$d.err
  python3 bench/experiments/ncu_sections.py $W/src_${m}_$d.csv | tee -a $W/summary.txt
done
tar czf $OUT/ncu_source.tgz -C $W $(cd $W && ls *.csv summary.txt)
