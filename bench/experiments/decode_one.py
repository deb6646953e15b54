#!/usr/bin/env python3
"""decode_one.py -- N decode calls of one system, for a profiler to take.

    python3 bench/experiments/decode_one.py {flexgen,sdpa} D B KV N

Causal, GQA 32 query heads over 8 KV heads, one query per sequence,
bf16, contiguous BHSD K/V of KV keys; flexgen's prepared call or SDPA
without a mask (the same attention at one query). Under ncu, skip the
first calls' kernels (`--launch-skip 6 --launch-count 4`): written for
attention_notes decode d23 (bench/results/2026-11-28_h100_decode_ncu_cudnn.txt).
"""
import math, sys
sys.path.insert(0, "python")
import torch, torch.nn.functional as F
import flexgen


def main():
    system, D, B, KV, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    dev = torch.device("cuda")
    HQ, HKV, Q = 32, 8, 1
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn((B, HQ, Q, D), dtype=torch.bfloat16, device=dev, generator=g)
    k = torch.randn((B, HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    v = torch.randn((B, HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    scale = 1 / math.sqrt(D)
    if system == "flexgen":
        fn = flexgen.prepare(q, k, v, "mods/causal.c", None, {}, {}, scale=scale, enable_gqa=True, q_offset=KV - Q)
    elif system == "sdpa":
        def fn():
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    else:
        sys.exit(f"decode_one: unknown system {system!r} (flexgen or sdpa)")
    for _ in range(N):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
