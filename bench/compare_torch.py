#!/usr/bin/env python3
"""compare_torch.py -- flexgen beside PyTorch FlexAttention and SDPA, on the same inputs, in one run.

Users choose between flexgen and torch.compile(flex_attention) by numbers
taken the same way on the same tensors, so every figure here is measured
for every system in one process:

  forward time   median of CUDA-event timings after warm-up
                 (triton.testing.do_bench, return_mode='median'; an
                 event-timed loop when triton is missing), each after 2 s
                 of the same call (--sustain): the H100 holds its board to
                 700 W by lowering its clock, the fastest kernels meet that
                 tens of milliseconds into a load, and a short timing from
                 cold would take one system's calls throttled and another's
                 not; --sustain 0 times from a cold card instead;
  TFLOP/s        4 * B * H * S * S * D * density, FlexAttention's count:
                 density is the fraction of non-empty blocks of the block
                 mask (1 - sparsity), the same density for every system in a
                 row so that ratios are ratios of times;
  issue time     the host's time to issue one call (20 in a row, not
                 waited for), forward and backward, and the 1-minute load
                 average at the row's start, in the JSON: a timing whose
                 issue time comes near it measured the host, and is said
                 so on stderr;
  block mask     create_block_mask against flexgen's GPU builder (in-place
                 rebuild, as a training loop uses it, and create + destroy);
  first call     torch.compile's first call after torch._dynamo.reset();
                 flexgen's first call with an empty disk cache (NVRTC
                 compile + load + run) and again after dropping the memory
                 cache (disk load + run), for every mod before any
                 torch.compile runs, after NVRTC's one-time start in the
                 process has been paid by an unrelated kernel (recorded in
                 the JSON's meta);
  accuracy       ||out - ref|| / ||ref|| against a float64 reference computed
                 from the torch mods on a subset of query rows of the timed
                 shape (the first and last rows and random ones, for two
                 (b, h) pairs), which keeps the reference cheap without
                 measuring on a different shape; and flexgen against flex on
                 the whole output.

With --backward, the same for the backward pass, on the same inputs and one
random dout shared by every system:

  backward time  the backward alone: torch.autograd.grad(out, (q, k, v),
                 dout, retain_graph=True) on an out computed once (flexgen's
                 autograd function, flex's compiled backward, SDPA's
                 FlashAttention-2 and cuDNN backward kernels);
  TFLOP/s        2.5 times the forward count (the five S x S products of
                 the backward against the forward's two), same density;
  accuracy       the largest of the dq, dk, dv errors ||g - ref|| / ||ref||
                 against float64 gradients of the two (b, h) heads (autograd
                 through the reference computation, a chunk of query rows at
                 a time: exact, since each row's softmax is whole), and
                 flexgen against flex on the whole gradients;
  train          one training step's attention, forward time + backward
                 time, as TFLOP/s of 3.5 times the forward count.

Inputs are random normal (never zeros), drawn once and shared by all systems.
The gallery's torch equivalents live in torch_mods.py; `--mask FILE [--score
FILE] --torch-mods FILE` adds a mod of your own (see torch_mods.load_file).

Output: a table on stdout, a JSON file (--json) and a bar chart of TFLOP/s
per mod and system (--png).
"""

import argparse
import atexit
import datetime
import json
import math
import os
import platform
import pty
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

import flexgen  # noqa: E402
import torch_mods  # noqa: E402

SYSTEMS = ("flexgen", "flex", "sdpa_flash", "sdpa_cudnn")


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------

def bench_ms(fn, warmup_ms, rep_ms, flush="write"):
    """Median milliseconds of fn() on the GPU. flush "write": triton's
    do_bench, which zeroes 256 MB before each call, so the call starts
    with the L2 full of dirty lines it must write back as it reads;
    "read": the same loop with the L2 emptied by reading 512 MB instead
    (clean_flush_ms), so a call that reads less than the L2 holds starts
    from clean lines."""
    if flush == "read":
        return clean_flush_ms(fn, warmup_ms, rep_ms)
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return event_median_ms(fn, warmup_ms, rep_ms)


def event_median_ms(fn, warmup_ms, rep_ms, before=None):
    """do_bench's loop without triton: warm-up and repeats by time, CUDA
    events around each call of fn, the median; before(), when given, runs
    ahead of each call outside its events."""

    def timed():
        if before is not None:
            before()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        return s, e

    fn()
    torch.cuda.synchronize()
    s, e = timed()
    torch.cuda.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    for _ in range(max(1, int(warmup_ms / one))):
        timed()
    times = [timed() for _ in range(max(5, int(rep_ms / one)))]
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in times)
    return ms[len(ms) // 2]


_CLEAN_FLUSH = []


def clean_flush_ms(fn, warmup_ms, rep_ms):
    """event_median_ms with the L2 emptied before each call by a read of
    512 MB (several times an H100's or H200's L2) where do_bench writes
    256 MB: the lines the call finds are clean, so its reads do not share
    the DRAM with the flush's write-backs."""
    if not _CLEAN_FLUSH:
        _CLEAN_FLUSH.append(torch.ones(128 << 20, dtype=torch.float32, device="cuda"))
    buf = _CLEAN_FLUSH[0]
    return event_median_ms(fn, warmup_ms, rep_ms, before=buf.sum)  # every line of buf read once


def issue_ms(fn, n=20):
    """Host time to issue one call, the GPU work not waited for: the mean
    over n calls in a row. Where it comes near bench_ms's figure the
    timing measured the host, not the GPU (a busy CPU, say)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3 / n


class ClockLog:
    """The GPU's SM clock, throttle reasons and board power, read every 25
    ms by one `nvidia-smi -lms` process for the whole run (reading only:
    nothing is set), so that each timing records the state it ran in.

    Each sample carries nvidia-smi's own timestamp, and nvidia-smi writes
    to a pseudo-terminal, which it line-buffers: into a pipe it buffered
    about 4 KB (seconds of samples), and stamping lines on arrival put
    them in the wrong timings (bench/attention_notes.md v51).

    The H100 holds its board power to its limit (700 W) by lowering the SM
    clock, on a power average of about a second (the software power cap,
    reason bit 0x4): a kernel fast enough to draw more runs at 1400-1800
    MHz once the average has caught up, and a timing taken right after a
    heavy one inherits the lowered clock. With --sustain 0, settle()
    waits before each timing until the power has fallen back, so that
    every system's timing starts from the same cold state instead of from
    whatever ran before it. Without nvidia-smi it records nothing and
    settles at once."""

    QUERY = "timestamp,clocks.sm,clocks_throttle_reasons.active,power.draw"
    SW_POWER_CAP = 0x4  # the throttle reason of the software power cap

    def __init__(self, index):
        self.samples = []  # (nvidia-smi's time, MHz, throttle reasons, watts)
        self.proc = None
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        # nvidia-smi numbers GPUs its own way: name this one by its PCI address
        try:
            p = torch.cuda.get_device_properties(index)
            gpu = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        except Exception:  # an older torch, or no device to ask
            gpu = str(index)
        master, slave = pty.openpty()
        try:
            self.proc = subprocess.Popen(
                [exe, "-i", gpu, "--query-gpu=" + self.QUERY, "--format=csv,noheader,nounits", "-lms", "25"],
                stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except OSError:
            os.close(master)
            return
        finally:
            os.close(slave)
        atexit.register(self.stop)
        threading.Thread(target=self._read, args=(master,), daemon=True).start()

    @staticmethod
    def parse(line):
        """(time.time() of the sample, MHz, reasons, watts) of one line, or
        None. nvidia-smi prints its local time, as time.mktime reads it."""
        try:
            stamp, mhz, reasons, watts = (f.strip() for f in line.split(","))
            day, frac = stamp.split(".") if "." in stamp else (stamp, "0")
            t = time.mktime(time.strptime(day, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
            return t, float(mhz), int(reasons, 16), float(watts)
        except ValueError:
            return None

    def _read(self, master):
        with os.fdopen(master, "r", errors="replace") as f:
            try:
                for line in f:
                    x = self.parse(line)
                    if x is not None:
                        self.samples.append(x)
            except OSError:  # the terminal closes when nvidia-smi ends
                pass

    def between(self, t0, t1):
        """The samples of [t0, t1]: median and lowest MHz, their count, the
        share with the software power cap on (reason bit 0x4) and the
        median watts; None without any."""
        sel = [x for x in self.samples if t0 <= x[0] <= t1]
        if not sel:
            return None
        def median(i):
            return sorted(x[i] for x in sel)[len(sel) // 2]
        return {"median_mhz": median(1), "min_mhz": min(x[1] for x in sel), "samples": len(sel),
                "power_cap_share": round(sum(1 for x in sel if x[2] & self.SW_POWER_CAP) / len(sel), 2),
                "median_watts": median(3)}

    def settle(self, watts, timeout=10.0):
        """Wait until a sample taken after this call shows the board under
        `watts` with the power cap off, at most `timeout` seconds; the
        seconds waited (None without nvidia-smi or samples)."""
        if self.proc is None:
            return None
        t0 = time.time()
        while time.time() - t0 < timeout:
            last = self.samples[-1] if self.samples else None
            if last is not None and last[0] >= t0 - 0.05 and last[3] < watts and not last[2] & self.SW_POWER_CAP:
                return round(time.time() - t0, 3)
            if self.proc.poll() is not None and not self.samples:
                return None
            time.sleep(0.02)
        return round(time.time() - t0, 3)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()


CLOCKS = None  # the run's ClockLog (main)


def time_into(row, ms_key, issue_key, system, call, opts):
    """row[ms_key][system] = bench_ms of call, row[issue_key][system] its
    issue_ms, row["clock"][ms_key][system] the SM clock and power during the
    timing (ClockLog); says on stderr when the timing is within 20% of its
    issue time (host-bound, not a GPU figure). Before the timing the call
    runs --sustain seconds (eight calls between synchronisations), so that
    every system is timed in its own steady state under the GPU's power
    cap; with --sustain 0 the card is let cool under --settle-watts instead
    (ClockLog.settle), so that every system starts cold."""
    waited = None
    if opts.sustain > 0:
        t_end = time.time() + opts.sustain
        while time.time() < t_end:
            for _ in range(8):
                call()
            torch.cuda.synchronize()
    elif CLOCKS is not None and opts.settle_watts > 0:
        waited = CLOCKS.settle(opts.settle_watts)
    t0 = time.time()
    ms = row[ms_key][system] = bench_ms(call, opts.warmup, opts.rep)
    clock = CLOCKS.between(t0, time.time()) if CLOCKS is not None else None
    if clock is not None:
        clock["settled_s"] = waited
        row.setdefault("clock", {}).setdefault(ms_key, {})[system] = clock
    issue = row[issue_key][system] = issue_ms(call)
    if issue > 0.8 * ms:
        print(f"# {row['name']}: {system} ({ms_key}): issuing a call takes {issue:.3f} ms of its "
              f"{ms:.3f} ms: host-bound, not a GPU figure", file=sys.stderr)


def wall_ms(fn):
    """Host wall time of one call, the GPU work included."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, r


# ---------------------------------------------------------------------------
# The float64 reference, from the torch mods
# ---------------------------------------------------------------------------

def reference_rows(q, k, v, b, h, rows, mask_mod, score_mod, scale):
    """out[b, h, rows] in float64, computed directly: scores, score_mod,
    mask, softmax, times v. The mods are called on broadcast index tensors
    (b and h as 1x1 tensors, q_idx a column, kv_idx a row). A fully masked
    row gives 0, as both kernels define it."""
    hk = h // (q.shape[1] // k.shape[1])
    return _attend(q[b, h, rows].double(), k[b, hk].double(), v[b, hk].double(), b, h, rows,
                   mask_mod, score_mod, scale)


def reference_grads(q, k, v, dout, b, h, mask_mod, score_mod, scale, wrt=(), chunk=1024):
    """The float64 gradients through query head (b, h) of sum(out * dout):
    dq[b, h] (Q_LEN x D), this head's share of dk and dv of its k/v head
    (KV_LEN x D: the whole of them without GQA), and a float64 gradient for
    each tensor in `wrt` (tensors the torch mods capture, requiring grad;
    zeros when the head does not reach one). Autograd through reference_rows'
    computation, one chunk of query rows at a time: each row's softmax is
    whole within its chunk, so the sums over chunks are exact and only a
    chunk x KV_LEN score matrix is held."""
    hk = h // (q.shape[1] // k.shape[1])
    S = q.shape[2]
    kd = k[b, hk].detach().double().requires_grad_()
    vd = v[b, hk].detach().double().requires_grad_()
    dq = torch.empty(S, q.shape[3], dtype=torch.float64, device=q.device)
    dk, dv = torch.zeros_like(kd), torch.zeros_like(vd)
    dw = [torch.zeros(w.shape, dtype=torch.float64, device=w.device) for w in wrt]
    for r0 in range(0, S, chunk):
        rows = torch.arange(r0, min(S, r0 + chunk), device=q.device)
        qd = q[b, h, rows].detach().double().requires_grad_()
        with torch.enable_grad():
            out = _attend(qd, kd, vd, b, h, rows, mask_mod, score_mod, scale)
            g = torch.autograd.grad(out, [qd, kd, vd, *wrt], dout[b, h, rows].double(),
                                    allow_unused=True)
        dq[rows] = g[0]
        dk += g[1]
        dv += g[2]
        for acc, gw in zip(dw, g[3:]):
            if gw is not None:
                acc += gw.double()
    return dq, dk, dv, dw


def _attend(qd, kd, vd, b, h, rows, mask_mod, score_mod, scale):
    """softmax(mods(qd kd^T * scale)) vd for the query rows `rows` of head
    (b, h), differentiable (the row maximum is a constant shift)."""
    dev = qd.device
    s = (qd @ kd.T) * scale
    bi = torch.tensor(b, device=dev).view(1, 1)
    hi = torch.tensor(h, device=dev).view(1, 1)
    qi = rows.view(-1, 1)
    ki = torch.arange(kd.shape[0], device=dev).view(1, -1)
    if score_mod is not None:
        s = score_mod(s, bi, hi, qi, ki)
    if mask_mod is not None:
        keep = torch.broadcast_to(mask_mod(bi, hi, qi, ki), s.shape)
        s = s.masked_fill(~keep, -math.inf)
    mx = s.detach().amax(dim=-1, keepdim=True)
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    p = torch.exp(s - mx)
    den = p.sum(dim=-1, keepdim=True)
    return (p @ vd) / torch.where(den == 0, torch.ones_like(den), den)


def probe_rows(S, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = min(S, 64)
    picks = torch.cat([torch.arange(n), torch.arange(S - n, S),
                       torch.randint(0, S, (min(S, 128),), generator=g)])
    return torch.unique(picks).to(device)


def rel_err(x, ref):
    x = x.double()
    num = torch.linalg.vector_norm(x - ref)
    den = torch.linalg.vector_norm(ref)
    return float(num / den) if float(den) > 0 else float(num)


# ---------------------------------------------------------------------------
# flexgen's first calls, measured before any torch.compile runs
# ---------------------------------------------------------------------------

def flexgen_first_calls(spec, inputs):
    """The first block-mask build and attention call of one mod with an
    empty disk cache (NVRTC compile + load + run), then the attention call
    again after dropping the memory cache (disk load + run). Measured for
    every mod before any torch.compile: its background compile workers
    otherwise share the CPU with NVRTC and inflate these figures several
    times over (seen on the H100 machine, 2026-11-22)."""
    q, k, v = inputs
    B, H, S, _ = q.shape
    st = spec.setup(B, H, S, q.device)
    params, buffers = st.get("params", {}), st.get("buffers", {})
    mB, mH = st.get("mask_b"), st.get("mask_h")
    first = {}
    cache = tempfile.mkdtemp(prefix="flexgen-cold-")
    try:
        flexgen.set_cache_dir(cache)
        flexgen.forget_memory_cache()
        mod = flexgen.load_mod(spec.mask_file, spec.score_file)
        bm = None
        if mod.has_mask:
            first["flexgen_block_mask"], bm = wall_ms(
                lambda: flexgen.block_mask(mod, mB, mH, S, S, params, buffers, device=q.device))

        def call():
            return flexgen.attention(q, k, v, mod, None, params, buffers, block_mask=bm)
        before = flexgen.cache_stats()
        first["flexgen_cold"], _ = wall_ms(call)
        after = flexgen.cache_stats()
        first["nvrtc_compile_ms"] = after["compile_ms"] - before["compile_ms"]
        flexgen.forget_memory_cache()
        before = flexgen.cache_stats()
        first["flexgen_warm_disk"], _ = wall_ms(call)
        after = flexgen.cache_stats()
        first["disk_load_ms"] = after["load_ms"] - before["load_ms"]
        first["disk_hits"] = after["disk_hits"] - before["disk_hits"]
    finally:
        flexgen.set_cache_dir(None)
        shutil.rmtree(cache, ignore_errors=True)
    return first


def nvrtc_process_warmup(device):
    """NVRTC's one-time start in a process (about 0.2 to 0.7 s on the H100
    machine) is paid here, by an unrelated mod, so that no row carries it."""
    cache = tempfile.mkdtemp(prefix="flexgen-warmup-")
    try:
        flexgen.set_cache_dir(cache)
        ms, _ = wall_ms(lambda: flexgen.block_mask("q_idx >= kv_idx + 1", 1, 1, 128, 128,
                                                   device=device))
    finally:
        flexgen.set_cache_dir(None)
        shutil.rmtree(cache, ignore_errors=True)
    return ms


# ---------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------

def run_case(spec, inputs, opts, first=None, dout=None):
    """Measure one mod for every system that applies; failures of one system
    are recorded in the row and do not stop the others. `first`: flexgen's
    first-call figures from flexgen_first_calls. `dout`: the gradient of
    out for the backward measurements (with --backward)."""
    q, k, v = inputs
    B, H, S, D = q.shape
    dev = q.device
    st = spec.setup(B, H, S, dev)
    params, buffers = st.get("params", {}), st.get("buffers", {})
    t_mask, t_score = st.get("mask_mod"), st.get("score_mod")
    mB, mH = st.get("mask_b"), st.get("mask_h")
    scale = 1.0 / math.sqrt(D)
    row = {"name": spec.name, "mask_file": spec.mask_file, "score_file": spec.score_file,
           "params": {n: v for n, v in params.items()},
           "buffers": {n: [str(t.dtype), list(t.shape)] for n, t in buffers.items()},
           "ms": {}, "tflops": {}, "block_mask_ms": {}, "first_call_ms": {}, "error": {},
           "failures": {}}
    if opts.backward:
        row.update({"bwd_ms": {}, "bwd_issue_ms": {}, "bwd_tflops": {}, "bwd_error": {}})
    row["issue_ms"] = {}
    row["loadavg_1min"] = os.getloadavg()[0]
    outs, grads = {}, {}

    def attempt(system, fn):
        try:
            fn()
        except Exception as e:  # keep measuring the other systems
            row["failures"][system] = f"{type(e).__name__}: {e}"
            print(f"[{spec.name}] {system} failed:", file=sys.stderr)
            traceback.print_exc()

    def kernel_profile(call):
        """The kernels one call runs, each with its time and launch shape, and
        the device's free memory: what tells a slow run's cause afterwards
        (which pass, which variant: the Hopper and portable passes differ in
        block size and registers)."""
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(trace)
            with open(trace) as f:
                events = json.load(f)["traceEvents"]
        free, _ = torch.cuda.mem_get_info()
        return {"free_gib": round(free / 2**30, 2), "kernels": [
            {"name": e["name"], "ms": e["dur"] / 1000, "grid": e["args"].get("grid"),
             "block": e["args"].get("block"), "regs": e["args"].get("registers per thread"),
             "smem": e["args"].get("shared memory")}
            for e in events if e.get("cat") == "kernel"]}

    def backward(system, forward):
        """Time the backward alone of out = forward(q, k, v) on leaves that
        share q, k, v's storage, and keep its gradients for the accuracy."""
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        out = forward(*leaves)

        def call():
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)
        row["first_call_ms"][system + "_backward"], _ = wall_ms(call)
        time_into(row, "bwd_ms", "bwd_issue_ms", system, call, opts)
        if system == "flexgen":
            row["bwd_kernels"] = kernel_profile(call)
        grads[system] = call()

    def attempt_backward(system, forward):
        if opts.backward:
            attempt(system + "_backward", lambda: backward(system, forward))

    # --- flexgen -----------------------------------------------------------
    def run_flexgen():
        for key in ("flexgen_block_mask", "flexgen_cold", "flexgen_warm_disk"):
            if first and key in first:
                row["first_call_ms"][key] = first[key]
        for key in ("nvrtc_compile_ms", "disk_load_ms", "disk_hits"):
            if first and key in first:
                row[key] = first[key]
        mod = flexgen.load_mod(spec.mask_file, spec.score_file)
        row["mod_name"], row["mod_hash"] = mod.name, f"{mod.hash:016x}"
        bm = None
        if mod.has_mask:
            bm = flexgen.block_mask(mod, mB, mH, S, S, params, buffers, device=dev)
            row["block_mask_ms"]["flexgen_rebuild"] = bench_ms(
                lambda: bm.rebuild(params, buffers), opts.warmup, opts.rep)
            row["block_mask_ms"]["flexgen_create"] = bench_ms(
                lambda: flexgen.block_mask(mod, mB, mH, S, S, params, buffers, device=dev),
                opts.warmup, opts.rep)
            row["density_flexgen"] = bm.density()
        else:
            row["density_flexgen"] = 1.0

        def call():
            return flexgen.attention(q, k, v, mod, None, params, buffers, block_mask=bm)
        time_into(row, "ms", "issue_ms", "flexgen", call, opts)
        outs["flexgen"] = call()
        # The same kernel without the per-call Python argument handling.
        prepared = flexgen.prepare(q, k, v, mod, None, params, buffers, block_mask=bm)
        row["ms"]["flexgen_prepared"] = bench_ms(prepared, opts.warmup, opts.rep)
        attempt_backward("flexgen", lambda q, k, v: flexgen.attention(
            q, k, v, mod, None, params, buffers, block_mask=bm, deterministic=opts.deterministic))

    # --- FlexAttention -----------------------------------------------------
    def run_flex():
        torch._dynamo.reset()
        compiled = torch.compile(flex_attention, dynamic=False)
        bm = None
        if t_mask is not None:
            ms, bm = wall_ms(lambda: create_block_mask(t_mask, mB, mH, S, S, device=dev))
            row["first_call_ms"]["flex_block_mask"] = ms
            row["block_mask_ms"]["flex"] = bench_ms(
                lambda: create_block_mask(t_mask, mB, mH, S, S, device=dev), opts.warmup, opts.rep)
            row["density_flex"] = 1.0 - float(bm.sparsity()) / 100.0
        else:
            row["density_flex"] = 1.0

        def call():
            return compiled(q, k, v, score_mod=t_score, block_mask=bm, scale=scale)
        row["first_call_ms"]["flex"], _ = wall_ms(call)
        time_into(row, "ms", "issue_ms", "flex", call, opts)
        outs["flex"] = call()
        attempt_backward("flex", lambda q, k, v: compiled(q, k, v, score_mod=t_score,
                                                          block_mask=bm, scale=scale))

    # --- SDPA --------------------------------------------------------------
    def run_sdpa(system, backend):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        be = getattr(SDPBackend, backend)
        causal = spec.sdpa == "causal"

        def sdpa(q, k, v):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

        def call():
            return sdpa(q, k, v)
        call()
        time_into(row, "ms", "issue_ms", system, call, opts)
        outs[system] = call()
        attempt_backward(system, sdpa)  # the backend is chosen by the forward

    if "flexgen" in opts.systems:
        attempt("flexgen", run_flexgen)
    if "flex" in opts.systems:
        attempt("flex", run_flex)
    if spec.sdpa is not None:
        if "sdpa_flash" in opts.systems:
            attempt("sdpa_flash", lambda: run_sdpa("sdpa_flash", "FLASH_ATTENTION"))
        if "sdpa_cudnn" in opts.systems:
            attempt("sdpa_cudnn", lambda: run_sdpa("sdpa_cudnn", "CUDNN_ATTENTION"))

    # --- FLOPs: one density for the row (flex's when it ran, as the notebook) --
    density = row.get("density_flex", row.get("density_flexgen"))
    row["density"] = density
    if density is not None:
        flops = 4.0 * B * H * S * S * D * density
        for system, ms in row["ms"].items():
            row["tflops"][system] = flops / (ms * 1e-3) / 1e12
    if "flexgen" in row["tflops"] and "flex" in row["tflops"]:
        row["ratio_flexgen_over_flex"] = row["tflops"]["flexgen"] / row["tflops"]["flex"]
    if opts.backward and density is not None:
        flops = 2.5 * 4.0 * B * H * S * S * D * density
        for system, ms in row["bwd_ms"].items():
            row["bwd_tflops"][system] = flops / (ms * 1e-3) / 1e12
        if "flexgen" in row["bwd_tflops"] and "flex" in row["bwd_tflops"]:
            row["ratio_bwd_flexgen_over_flex"] = (row["bwd_tflops"]["flexgen"]
                                                  / row["bwd_tflops"]["flex"])
        # one training step's attention: the forward and the backward, timed
        # apart on the same inputs, FLOPs 3.5x the forward's
        row["train_tflops"] = {
            system: 3.5 * 4.0 * B * H * S * S * D * density / ((row["ms"][system] + bms) * 1e-3) / 1e12
            for system, bms in row["bwd_ms"].items() if system in row["ms"]}
        if "flexgen" in row["train_tflops"] and "flex" in row["train_tflops"]:
            row["ratio_train_flexgen_over_flex"] = (row["train_tflops"]["flexgen"]
                                                    / row["train_tflops"]["flex"])

    # --- accuracy ----------------------------------------------------------
    def accuracy():
        rows = probe_rows(S, dev, opts.seed)
        pairs = sorted({(0, 0), (B - 1, H - 1)})
        for b, h in pairs:
            ref = reference_rows(q, k, v, b, h, rows, t_mask, t_score, scale)
            for system, out in outs.items():
                e = rel_err(out[b, h, rows], ref)
                row["error"][system] = max(row["error"].get(system, 0.0), e)
        if "flexgen" in outs and "flex" in outs:
            row["error"]["flexgen_vs_flex"] = rel_err(outs["flexgen"], outs["flex"].double())
    attempt("accuracy", accuracy)

    def grad_accuracy():
        for b, h in sorted({(0, 0), (B - 1, H - 1)}):
            ref = reference_grads(q, k, v, dout, b, h, t_mask, t_score, scale)[:3]
            for system, g in grads.items():
                errs = row["bwd_error"].setdefault(system, {})
                for name, x, r in zip(("dq", "dk", "dv"), g, ref):
                    errs[name] = max(errs.get(name, 0.0), rel_err(x[b, h], r))
        if "flexgen" in grads and "flex" in grads:
            row["bwd_error"]["flexgen_vs_flex"] = {
                name: rel_err(x, y.double())
                for name, x, y in zip(("dq", "dk", "dv"), grads["flexgen"], grads["flex"])}
    if grads:
        attempt("grad_accuracy", grad_accuracy)
    outs.clear()  # free the outputs and gradients before the next case
    grads.clear()
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def table(rows):
    """The markdown table: forward TFLOP/s, block masks, first calls and
    errors, then (when the rows have them) the backward's TFLOP/s and
    errors, each error the largest of dq, dk and dv, and one training step
    (forward + backward) in TFLOP/s."""
    head = ["mod", "dens", "flexgen", "flex", "fg/flex", "sdpa-fa", "cudnn",
            "bm fg ms", "bm flex ms", "1st fg cold", "1st fg disk", "1st flex",
            "err fg", "err flex", "fg~flex"]
    backward = any("bwd_ms" in r for r in rows)
    if backward:
        head += ["bwd fg", "bwd flex", "bwd fg/flex", "bwd sdpa-fa", "bwd cudnn",
                 "bwd err fg", "bwd err flex", "bwd fg~flex", "train fg", "train flex", "train fg/flex"]

    def worst(errors, system):
        e = errors.get(system)
        return max(e.values()) if e else None
    lines = []
    for r in rows:
        t, bm, fc, er = r["tflops"], r["block_mask_ms"], r["first_call_ms"], r["error"]
        bt, be = r.get("bwd_tflops", {}), r.get("bwd_error", {})
        lines.append([
            r["name"], fmt(r.get("density"), "{:.3f}"),
            fmt(t.get("flexgen")), fmt(t.get("flex")),
            fmt(r.get("ratio_flexgen_over_flex"), "{:.2f}"),
            fmt(t.get("sdpa_flash")), fmt(t.get("sdpa_cudnn")),
            fmt(bm.get("flexgen_rebuild"), "{:.4f}"), fmt(bm.get("flex"), "{:.3f}"),
            fmt(fc.get("flexgen_cold"), "{:.0f}"), fmt(fc.get("flexgen_warm_disk"), "{:.1f}"),
            fmt(fc.get("flex"), "{:.0f}"),
            fmt(er.get("flexgen"), "{:.1e}"), fmt(er.get("flex"), "{:.1e}"),
            fmt(er.get("flexgen_vs_flex"), "{:.1e}"),
        ] + ([
            fmt(bt.get("flexgen")), fmt(bt.get("flex")),
            fmt(r.get("ratio_bwd_flexgen_over_flex"), "{:.2f}"),
            fmt(bt.get("sdpa_flash")), fmt(bt.get("sdpa_cudnn")),
            fmt(worst(be, "flexgen"), "{:.1e}"), fmt(worst(be, "flex"), "{:.1e}"),
            fmt(worst(be, "flexgen_vs_flex"), "{:.1e}"),
            fmt(r.get("train_tflops", {}).get("flexgen")), fmt(r.get("train_tflops", {}).get("flex")),
            fmt(r.get("ratio_train_flexgen_over_flex"), "{:.2f}"),
        ] if backward else []))
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h)
              for i, h in enumerate(head)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for l in lines:
        out.append("| " + " | ".join(c.rjust(w) if i else c.ljust(w)
                                      for i, (c, w) in enumerate(zip(l, widths))) + " |")
    return "\n".join(out)


def chart(rows, meta, path, key="tflops", what="forward"):
    """Bars of rows[i][key] (TFLOP/s) per mod and system."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["name"] for r in rows]
    systems = [s for s in SYSTEMS if any(s in r.get(key, {}) for r in rows)]
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(names)), 4.5))
    for i, s in enumerate(systems):
        xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(names))]
        ys = [r.get(key, {}).get(s, 0.0) for r in rows]
        bars = ax.bar(xs, ys, width, label=s)
        ax.bar_label(bars, labels=[f"{y:.0f}" if y else "" for y in ys], fontsize=6)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel(f"{what} TFLOP/s")
    sh = meta["shape"]
    ax.set_title(f"{meta['device']}  B={sh['B']} H={sh['H']} S={sh['S']} D={sh['D']} "
                 f"{meta['dtype']}  ({meta['date']})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", "-B", type=int, default=4)
    p.add_argument("--heads", "-H", type=int, default=16)
    p.add_argument("--seq", "-S", type=int, default=8192)
    p.add_argument("--head-dim", "--d", "-D", dest="head_dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--mods", default=",".join(torch_mods.GALLERY),
                   help="comma-separated gallery mods, or 'none' (default: all)")
    p.add_argument("--mask", help="extra mod: a mask_mod file")
    p.add_argument("--score", help="extra mod: a score_mod file")
    p.add_argument("--torch-mods", help="extra mod: the Python file with its torch equivalents")
    p.add_argument("--name", help="extra mod: its name in the table")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--backward", action="store_true",
                   help="also time the backward pass and check the gradients")
    p.add_argument("--deterministic", action="store_true",
                   help="with --backward: flexgen's deterministic backward")
    p.add_argument("--warmup", type=float, default=25, help="warm-up per timing, ms")
    p.add_argument("--rep", type=float, default=100, help="timed repetitions per timing, ms")
    p.add_argument("--sustain", type=float, default=2,
                   help="run each call this many seconds before its timing (default 2): every "
                        "system timed in its steady state under the GPU's power cap, as in a "
                        "training or serving loop; 0: time from a cold card (--settle-watts)")
    p.add_argument("--settle-watts", type=float, default=250,
                   help="with --sustain 0, wait before each timing until the board draws under "
                        "this many watts with the power cap off (0: do not wait; see ClockLog)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", help="recorded in the JSON (e.g. the commit the build came from)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--png", help="draw the TFLOP/s chart here (with --backward, also "
                   "the backward's beside it, as NAME_bwd.png)")
    a = p.parse_args(argv)
    a.systems = set(s for s in a.systems.split(",") if s)
    unknown = a.systems - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems: {sorted(unknown)}")
    if a.deterministic and not a.backward:
        p.error("--deterministic is an option of --backward")
    if (a.mask or a.score) and not a.torch_mods:
        p.error("--mask/--score need --torch-mods FILE with the torch equivalents")
    return a


def clock_lines(rows):
    """One line per row: the SM clock (median MHz) and board power (median
    W) each system's timings ran at, '*' where the power cap was on for
    some of its samples."""
    out = ["SM clock and power during each timing (median MHz / W; * power cap on in some samples):"]
    for r in rows:
        parts = []
        for key, label in (("ms", "fwd"), ("bwd_ms", "bwd")):
            for system, c in r.get("clock", {}).get(key, {}).items():
                parts.append(f"{system} {label} {c['median_mhz']:.0f}/{c['median_watts']:.0f}"
                             f"{'*' if c['power_cap_share'] > 0 else ''}")
        out.append(f"  {r['name']:15s} " + ("  ".join(parts) if parts else "(no samples)"))
    return "\n".join(out)


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("compare_torch: no CUDA device", file=sys.stderr)
        return 2
    specs = []
    if opts.mods != "none":
        for name in opts.mods.split(","):
            if name not in torch_mods.GALLERY:
                print(f"compare_torch: unknown gallery mod '{name}'", file=sys.stderr)
                return 2
            specs.append(torch_mods.GALLERY[name])
    if opts.torch_mods:
        specs.append(torch_mods.load_file(opts.torch_mods, opts.mask, opts.score, opts.name))

    dtype = torch.bfloat16 if opts.dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(opts.seed)
    shape = (opts.batch, opts.heads, opts.seq, opts.head_dim)
    inputs = tuple(torch.randn(shape, generator=g, device=dev, dtype=dtype) for _ in range(3))
    dout = torch.randn(shape, generator=g, device=dev, dtype=dtype) if opts.backward else None
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 bench/compare_torch.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
        "flexgen": flexgen.version(), "flexgen_lib": flexgen.library_path(),
        "host": platform.node(), "label": opts.label,
        "shape": {"B": opts.batch, "H": opts.heads, "S": opts.seq, "D": opts.head_dim},
        "dtype": opts.dtype, "timing": {"warmup_ms": opts.warmup, "rep_ms": opts.rep,
                                        "median": True},
        "flops": "4*B*H*S*S*D*density, density = 1 - block sparsity (flex's block mask)",
        "error": "||out-ref||/||ref|| vs float64 on rows of (b,h) in {(0,0),(B-1,H-1)}",
    }
    if opts.backward:
        meta["backward"] = {
            "timing": "torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), "
                      "the backward alone, median",
            "flops": "2.5 * 4*B*H*S*S*D*density",
            "error": "||g-ref||/||ref|| for g in dq, dk, dv vs float64 autograd gradients "
                     "of the heads (b,h) in {(0,0),(B-1,H-1)}",
            "flexgen_deterministic": opts.deterministic,
        }
    print(f"# {meta['device']}  torch {meta['torch']}  flexgen {meta['flexgen']}  "
          f"B={opts.batch} H={opts.heads} S={opts.seq} D={opts.head_dim} {opts.dtype}", flush=True)
    global CLOCKS
    CLOCKS = ClockLog(dev.index if dev.index is not None else torch.cuda.current_device())
    meta["clock"] = ("SM clock and board power per timing (row 'clock'): nvidia-smi -lms 25 samples, by "
                     "their own timestamps, inside the timing's wall interval; power_cap_share: the share "
                     "with the software power cap on; settled_s: the wait before the timing for the board "
                     "to fall under settle_watts")
    meta["settle_watts"], meta["sustain_s"] = opts.settle_watts, opts.sustain
    rows, firsts = [], {}
    if "flexgen" in opts.systems:
        meta["flexgen_process_first_compile_ms"] = nvrtc_process_warmup(dev)
        for spec in specs:
            try:
                firsts[spec.name] = flexgen_first_calls(spec, inputs)
            except Exception:
                print(f"[{spec.name}] flexgen first calls failed:", file=sys.stderr)
                traceback.print_exc()
    for spec in specs:
        t0 = time.perf_counter()
        rows.append(run_case(spec, inputs, opts, firsts.get(spec.name), dout))
        print(f"# {spec.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    CLOCKS.stop()
    print(table(rows))
    print(clock_lines(rows))
    failures = {r["name"]: r["failures"] for r in rows if r["failures"]}
    if failures:
        print("failures:", json.dumps(failures, indent=1))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if opts.png:
        try:
            chart(rows, meta, opts.png)
            if opts.backward:
                stem, ext = os.path.splitext(opts.png)
                chart(rows, meta, stem + "_bwd" + (ext or ".png"), "bwd_tflops", "backward")
        except ImportError as e:
            print(f"compare_torch: no chart ({e})", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
