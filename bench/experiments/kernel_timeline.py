#!/usr/bin/env python3
"""kernel_timeline.py -- where one call's time goes, kernel by kernel.

Decode (causal, GQA 32/8, Q=1, bf16) at B=1 KV=131072 and B=8 KV=32768,
head dims 128 and 64, flexgen beside SDPA; then the backward of
sliding_window and causal at B=4 H=16 S=8192 D=128 as compare_torch calls
it. For each: the do_bench median (L2 flushed before every call), and the
kernel records (torch.profiler / CUPTI) of the median call after a 256 MB
L2 flush: each kernel's gap after the previous record and its duration.
Run from the repository root on a GPU machine:

    FLEXGEN_LIB=BUILD/src/libflexgen.so python3 bench/experiments/kernel_timeline.py

Written for attention_notes decode d22 (bench/results/2026-11-28_h100_decode_bwd_timeline.txt).
"""
import json, os, sys, tempfile
sys.path.insert(0, "python"); sys.path.insert(0, "bench")
import torch
import flexgen
from triton.testing import do_bench
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_one import decode_calls  # noqa: E402  the decode shapes' inputs and calls
dev = torch.device("cuda")
cache = torch.empty(256 << 20, dtype=torch.int8, device=dev)


def kernel_events(fn, n):
    """The CUDA kernel and memset records (CUPTI, through torch.profiler)
    of n calls of fn, each after a 256 MB L2 flush, in start order."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            cache.zero_(); fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as t:
        p = os.path.join(t, "x.json"); prof.export_chrome_trace(p); ev = json.load(open(p))["traceEvents"]
    return sorted([e for e in ev if e.get("cat") in ("kernel", "gpu_memset")], key=lambda e: e["ts"])


def timeline(fn, n=12):
    """Per call after the third: its span from the flush's end, and each
    of its kernels' gap and duration."""
    ks = kernel_events(fn, n)
    calls, cur = [], None
    for e in ks:
        # the flush (cache.zero_: a fill kernel, or a memset over 30 us) starts a call
        if "elementwise" in e["name"] or (e.get("cat") == "gpu_memset" and e["dur"] > 30):
            cur = {"flush_end": e["ts"] + e["dur"], "k": []}; calls.append(cur); continue
        if cur is not None: cur["k"].append((e["name"][:40], e["ts"], e["dur"]))
    out = []
    for c in calls[2:]:
        t = c["flush_end"]; parts = []
        for name, ts, dur in c["k"]:
            parts.append(f"{name} gap {ts - t:.1f} dur {dur:.1f}"); t = ts + dur
        out.append((t - c["flush_end"], parts))
    return out


def main():
    for D in (128, 64):
        for B, KV in ((1, 131072), (8, 32768)):
            calls, _ = decode_calls(D, B, KV)
            for name, fn in calls.items():
                fn()
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                tl = timeline(fn)
                spans = sorted(s for s, _ in tl)
                print(f"D={D} B={B} {name}: do_bench {ms*1e3:.1f} us; span after flush (us) median {spans[len(spans)//2]:.1f} min {spans[0]:.1f}")
                for p in tl[len(tl)//2][1]: print("   ", p)
    # the backward as compare_torch calls it, D=128 B=4 H=16 S=8192
    B, H, S, D = 4, 16, 8192, 128
    g = torch.Generator(device=dev).manual_seed(2)
    q, k, v = (torch.randn((B, H, S, D), dtype=torch.bfloat16, device=dev, generator=g) for _ in range(3))
    dout = torch.randn((B, H, S, D), dtype=torch.bfloat16, device=dev, generator=g)
    for mname in ("sliding_window", "causal"):
        mod = flexgen.load_mod(f"mods/{mname}.c", None)
        bm = flexgen.block_mask(mod, None, None, S, S, {}, {}, device=dev)
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        out = flexgen.attention(*leaves, mod, None, {}, {}, block_mask=bm)
        fn = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
        fn()
        ms = do_bench(fn, warmup=25, rep=300, return_mode="median")
        tl = timeline(fn, n=8)
        spans = sorted(s for s, _ in tl)
        print(f"bwd {mname}: do_bench {ms*1e3:.1f} us; span after flush median {spans[len(spans)//2]:.1f} min {spans[0]:.1f}")
        for p in tl[len(tl)//2][1]: print("   ", p)


if __name__ == "__main__":
    main()
