#!/usr/bin/env python3
"""bwd_spread.py -- where the D=128 sliding_window backward's spread between
runs comes from.

One process, B=4 H=16 S=8192 D=128 bf16, sliding_window with its block
mask, the backward as compare_torch calls it (autograd.grad). Part 1
(workspace): each round times, with do_bench's median (L2 flushed before
every call), the library's pool ("pool", what python/flexgen.py did then), one
torch tensor passed as the workspace ("fixed") and a tensor allocated anew
at a shifted address ("fresh"); from the middle round on q, k, v and dout
are drawn anew. Part 2 (which calls are slow): rounds of per-call CUDA
event timings, with and without a 256 MB flush before each call, of
flexgen, flexgen deterministic (no atomics, no flags) and FlexAttention's
compiled backward, each timing's wall interval printed so that an SM
clock log taken beside the run can be matched to it. Part 3 (when the
calls slow down): after 3 s idle, 240 calls in a row with no flush, each
timed by CUDA events and printed in order, flexgen and flex (nvidia-smi's
clocks.sm changes only every 100 ms, too coarse for a 1.6 ms call; the
steps in the call times show the power cap's clock steps instead).

    FLEXGEN_LIB=BUILD/src/libflexgen.so python3 bench/experiments/bwd_spread.py [PARTS [ROUNDS1 [ROUNDS2]]]

PARTS: the parts to run, "123" by default.
"""
import ctypes, os, random, statistics, sys, time
sys.path.insert(0, "python"); sys.path.insert(0, "bench")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import flexgen, torch_mods
from triton.testing import do_bench
from kernel_timeline import cache as flush_buf  # the experiments' 256 MB L2 flush

dev = torch.device("cuda")
B, H, S, D = 4, 16, 8192, 128
PARTS = sys.argv[1] if len(sys.argv) > 1 else "123"
ROUNDS1 = int(sys.argv[2]) if len(sys.argv) > 2 else 6
ROUNDS2 = int(sys.argv[3]) if len(sys.argv) > 3 else 4
MODES = ("pool", "fixed", "fresh")
state = {"mode": "pool", "fixed": None, "fresh": None, "ptr": 0}
size_fn = flexgen._function("fg_attention_backward_workspace_size")
library_run = flexgen._run_backward
T0 = time.time()


def run_backward(c, mod, bwd, grads, call=None, probe=None, workspace_device=None):
    """flexgen's _run_backward with the workspace of the current mode
    ("pool": none given, so the library's pool, as python/flexgen.py did
    before it took the workspace from torch's allocator)."""
    state["ptr"] = 0
    if state["mode"] != "pool":
        size = ctypes.c_size_t()
        c.check(size_fn(c.handle, mod.handle, ctypes.byref(bwd), ctypes.byref(size)))
        t = state[state["mode"]]
        if t is None or t.numel() < size.value:
            t = state[state["mode"]] = torch.empty(size.value, dtype=torch.uint8, device=dev)
        bwd.workspace, bwd.workspace_size = t.data_ptr(), t.numel()
        state["ptr"] = t.data_ptr()
    return library_run(c, mod, bwd, grads, call, probe)


flexgen._run_backward = run_backward


def draw(seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    return [torch.randn((B, H, S, D), generator=g, device=dev, dtype=torch.bfloat16) for _ in range(4)]


def grad_call(forward, q, k, v, dout):
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = forward(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def event_times(fn, n, flush):
    """Per-call milliseconds of n calls, each after a 256 MB flush or not."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        if flush:
            flush_buf.zero_()
        s.record(); fn(); e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def pct(t, p):
    t = sorted(t)
    return t[min(len(t) - 1, int(p * len(t)))]


def main():
    spec = torch_mods.GALLERY["sliding_window"]
    st = spec.setup(B, H, S, dev)
    params, buffers = st.get("params", {}), st.get("buffers", {})
    mod = flexgen.load_mod(spec.mask_file, spec.score_file)
    q, k, v, dout = draw(1)
    keep, rng = [], random.Random(7)
    print(f"T0 {T0:.3f} (epoch s; the bracketed times below are seconds after it)")
    print("part 1: the workspace (do_bench median ms)")
    times = {m: [] for m in MODES}
    for r in range(ROUNDS1 if "1" in PARTS else 0):
        if r >= ROUNDS1 // 2:
            del q, k, v, dout
            torch.cuda.empty_cache()
            keep.append(torch.empty(rng.randrange(1, 64) << 21, dtype=torch.uint8, device=dev))
            q, k, v, dout = draw(100 + r)
        bm = flexgen.block_mask(mod, st.get("mask_b"), st.get("mask_h"), S, S, params, buffers, device=dev)
        call = grad_call(lambda q, k, v: flexgen.attention(q, k, v, mod, None, params, buffers, block_mask=bm),
                         q, k, v, dout)
        for m in MODES:
            state["mode"] = m
            if m == "fresh":
                state["fresh"] = None
                torch.cuda.empty_cache()
                keep.append(torch.empty(rng.randrange(1, 64) << 21, dtype=torch.uint8, device=dev))
            call()
            t0 = time.time() - T0
            ms = do_bench(call, warmup=25, rep=200, return_mode="median")
            times[m].append(ms)
            print(f"  round {r} {m:5s} {ms:.4f}  [{t0:.2f}-{time.time() - T0:.2f} s]  ws {state['ptr']:#x}"
                  f"  q {q.data_ptr():#x}", flush=True)
    for m in MODES if "1" in PARTS else ():
        t = times[m]
        print(f"  {m:5s} median {statistics.median(t):.4f} min {min(t):.4f} max {max(t):.4f}"
              f" spread {100 * (max(t) / min(t) - 1):.1f}%")
    state["mode"] = "pool"

    print("part 2: per-call event times (ms): p10 p50 p90 max, mean of the first and last 10")
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    compiled = torch.compile(flex_attention, dynamic=False)
    fbm = create_block_mask(st["mask_mod"], st.get("mask_b"), st.get("mask_h"), S, S, device=dev)
    bm = flexgen.block_mask(mod, st.get("mask_b"), st.get("mask_h"), S, S, params, buffers, device=dev)
    systems = {
        "flexgen": grad_call(lambda q, k, v: flexgen.attention(q, k, v, mod, None, params, buffers,
                                                               block_mask=bm), q, k, v, dout),
        "flexgen_det": grad_call(lambda q, k, v: flexgen.attention(q, k, v, mod, None, params, buffers,
                                                                   block_mask=bm, deterministic=True),
                                 q, k, v, dout),
        "flex": grad_call(lambda q, k, v: compiled(q, k, v, score_mod=st.get("score_mod"), block_mask=fbm,
                                                   scale=1 / D ** 0.5), q, k, v, dout),
    }
    for fn in systems.values():
        fn(); fn()
    for r in range(ROUNDS2 if "2" in PARTS else 0):
        for name, fn in systems.items():
            for flush in (True, False):
                t0 = time.time() - T0
                t = event_times(fn, 80, flush)
                print(f"  round {r} {name:11s} flush {int(flush)}  {pct(t, .1):.4f} {pct(t, .5):.4f} "
                      f"{pct(t, .9):.4f} {max(t):.4f}  first10 {statistics.mean(t[:10]):.4f} last10 "
                      f"{statistics.mean(t[-10:]):.4f}  [{t0:.2f}-{time.time() - T0:.2f} s]", flush=True)

    if "3" not in PARTS:
        return
    print("part 3: per call after 3 s idle, in order (ms)")
    for name in ("flexgen", "flex"):
        fn = systems[name]
        time.sleep(3)
        t = event_times(fn, 240, False)
        for lo in range(0, 240, 20):
            seg = t[lo:lo + 20]
            print(f"  {name:8s} calls {lo:3d}-{lo + 19:3d}: " + " ".join(f"{x:.3f}" for x in seg[:10])
                  + f" | median {statistics.median(seg):.4f}")


if __name__ == "__main__":
    main()
