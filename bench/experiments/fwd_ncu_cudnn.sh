#!/usr/bin/env bash
# fwd_ncu_cudnn.sh -- ncu on the GPU machine, from the repository root over
# a release build in build-gpu (with build-gpu/devlib): flexgen's Hopper
# forward at head dim 64 (noop, causal) beside SDPA's cuDNN kernel on the
# same shape (B=4 H=16 S=8192 bf16), one launch each after two, clocks left
# alone: time, active cycles per SM (min / avg / max), instructions, issue,
# tensor and MUFU (xu) utilisation, stall latencies. CSVs to $OUT.
# (bench/attention_notes.md, "D=64 beside cuDNN under ncu".) MODS names
# other gallery mods for flexgen (with the block mask; default "noop
# causal"), CUDNN=0 leaves cuDNN out, HEAD_DIM another head dim, FLEXGEN
# another build's CLI.
set -u
export LD_LIBRARY_PATH=$PWD/build-gpu/devlib FLEXGEN_SOURCE_ROOT=$PWD FLEXGEN_CACHE_DIR=/tmp/cc
M=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,launch__registers_per_thread,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio,smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,smsp__average_warp_latency_issue_stalled_branch_resolving.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,smsp__average_warp_latency_issue_stalled_selected.ratio
F=${FLEXGEN:-build-gpu/tools/flexgen}
D=${HEAD_DIM:-64}
for m in ${MODS:-noop causal}; do
  args="--mask mods/$m.c --block-mask"; [ $m = noop ] && args="--score mods/noop.c"
  $F check $args --batch 4 --heads 16 --q-len 8192 --head-dim $D --no-reference --time 3 >/dev/null 2>&1
  timeout 120 ncu --clock-control none --kernel-name regex:fg_attention_fwd --launch-skip 2 --launch-count 1 --metrics $M --csv \
    $F check $args --batch 4 --heads 16 --q-len 8192 --head-dim $D --no-reference --time 3 > $OUT/ncu_fg_$m.csv 2>$OUT/ncu_fg_$m.err
done
[ "${CUDNN:-1}" = 0 ] && exit 0
cat > /tmp/sd.py <<'PY'
import sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
causal = sys.argv[1] == "causal"
q = torch.randn(4, 16, 8192, int(sys.argv[2]), device="cuda", dtype=torch.bfloat16)
k = torch.randn_like(q); v = torch.randn_like(q)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(4):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
PY
for m in noop causal; do
  timeout 150 ncu --clock-control none --kernel-name regex:'cudnn|fmha|sm90|flash' --launch-skip 2 --launch-count 1 --metrics $M --csv \
    python3 /tmp/sd.py $m $D > $OUT/ncu_cudnn_$m.csv 2>$OUT/ncu_cudnn_$m.err
done
