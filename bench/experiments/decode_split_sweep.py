#!/usr/bin/env python3
"""decode_split_sweep.py -- the decode walk's time at B=1 by split count.

Causal, GQA 32/8, Q=1, bf16, head dims 128 and 64, KV 131072, 120000 and
100000; FG_OPT_DECODE_SPLITS n (0: the call's own choice) set on the
Python module's context. Prints, per count, the do_bench median of the
call and the walk kernel's median duration (CUPTI, after an L2 flush), us.

    FLEXGEN_LIB=BUILD/src/libflexgen.so python3 bench/experiments/decode_split_sweep.py

Written for attention_notes decode d22 (bench/results/2026-11-28_h100_decode_b1_splits_pdl.txt).
"""
import os, sys
sys.path.insert(0, "python"); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import flexgen
from triton.testing import do_bench
from kernel_timeline import kernel_events  # the flush and the kernel records
from decode_one import decode_calls  # the decode shapes' inputs and calls
dev = torch.device("cuda")


def walk_us(fn, n=10):
    """The decode walk kernel's median duration over n calls, us."""
    d = sorted(e["dur"] for e in kernel_events(fn, n) if e.get("cat") == "kernel" and "decode_r" in e["name"])
    return d[len(d) // 2]


c = flexgen._ctx(0)
for D in (128, 64):
    for KV in (131072, 120000, 100000):
        calls, gb = decode_calls(D, 1, KV)
        res = []
        # the split count is chosen at each launch: one prepared call serves every count
        call = calls["flexgen"]
        for n in (0, 34, 33, 32, 31, 30, 29, 28, 26, 24):
            c.check(c._lib.fg_ctx_set_int(c.handle, flexgen.FG_OPT_DECODE_SPLITS, n))
            call()
            ms = do_bench(call, warmup=20, rep=120, return_mode="median")
            w = walk_us(call)
            res.append(f"n={n}: {ms*1e3:.1f}/{w:.1f}")
        print(f"D={D} KV={KV} ({gb/1e6:.0f} MB): total/walk us  " + "  ".join(res), flush=True)
c.check(c._lib.fg_ctx_set_int(c.handle, flexgen.FG_OPT_DECODE_SPLITS, 0))
