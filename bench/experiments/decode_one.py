#!/usr/bin/env python3
"""decode_one.py -- N decode calls of one system, for a profiler to take.

    python3 bench/experiments/decode_one.py {flexgen,sdpa} D B KV N

Causal, GQA 32 query heads over 8 KV heads, one query per sequence,
bf16, contiguous BHSD K/V of KV keys; flexgen's prepared call or SDPA
without a mask (the same attention at one query). decode_calls() makes
both for the other decode experiments (kernel_timeline.py,
decode_split_sweep.py). Under ncu, skip the
first calls' kernels (`--launch-skip 6 --launch-count 4`): written for
attention_notes decode d23 (bench/results/2026-11-28_h100_decode_ncu_cudnn.txt).
"""
import math, sys
sys.path.insert(0, "python")
import torch, torch.nn.functional as F
import flexgen


HQ, HKV, Q = 32, 8, 1


def decode_calls(D, B, KV):
    """{"flexgen": prepared call, "sdpa": call} on the same random inputs,
    and the K/V bytes a step reads."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn((B, HQ, Q, D), dtype=torch.bfloat16, device=dev, generator=g)
    k = torch.randn((B, HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    v = torch.randn((B, HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    scale = 1 / math.sqrt(D)
    fg = flexgen.prepare(q, k, v, "mods/causal.c", None, {}, {}, scale=scale, enable_gqa=True, q_offset=KV - Q)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    return {"flexgen": fg, "sdpa": sdpa}, 2 * B * HKV * KV * D * 2


def main():
    system, D, B, KV, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    calls, _ = decode_calls(D, B, KV)
    if system not in calls:
        sys.exit(f"decode_one: unknown system {system!r} (flexgen or sdpa)")
    fn = calls[system]
    for _ in range(N):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
