#!/usr/bin/env python3
"""compare_cp.py -- flexgen's context parallelism on N GPUs beside one GPU and PyTorch's own, in one run.

Start it with one process per GPU,

    torchrun --nproc-per-node 2 bench/compare_cp.py [--json cp.json]

or as `python3 bench/compare_cp.py` for one process (N = 1: the one-GPU
figures, and the ring's own cost with a single rank). Rank 0 first times
the one-GPU call on the whole sequence while the other ranks wait, then
every rank times the sharded call together, so the scaling efficiency of
each row comes out of the one run:

  t1      rank 0 alone, the whole sequence: flexgen.attention with a block
          mask built once beforehand (a training step builds it once for
          all its layers; its build time is the row's 'mask' column);
  tN      every rank its shard (flexgen.shard of the same tensors):
          flexgen.context_parallel_attention with a plan made once
          beforehand (flexgen.context_parallel_plan: the ring's pair masks
          and schedule, the counterpart of t1's block mask; its build time
          is the 'plan' column), and 'no plan': the same call building them
          at every call (two host synchronisations);
  eff     t1 / (N * tN), 1 for perfect scaling; eff+mask counts the one-GPU
          mask build in t1;
  error   ||out_N - out_1|| / ||out_1||: the ranks' outputs sent to rank 0
          and put back in order (flexgen.unshard) against the one-GPU output.

Timing: CUDA events around each call on every rank, every call started on
all ranks together after a barrier; --warmup calls first, then --iters
timed ones; a call's time is its slowest rank's, and the figure is the
median over the calls. (triton's do_bench, which compare_torch.py uses,
picks its number of calls from each process's own timings, and ranks must
make the same calls.)

Masks (bench/torch_mods.py's gallery setups): causal under zig-zag,
sliding_window (WINDOW 1024) and document (12 documents of random lengths)
under contiguous and zig-zag (--cases adds others, e.g. causal:contiguous).
Shapes: S in {131072, 262144}, B=1 H=16 D=128 bf16 by default.

The anchor is PyTorch's context parallelism for SDPA
(torch.distributed.tensor.experimental.context_parallel over a 1-D
DeviceMesh, q, k, v sharded on dim 2, its default head-tail load balancing,
which orders the rows as the zig-zag layout does), for the causal mask only
(its ring takes is_causal, no mask tensor), once per rotate method that
torch.distributed.tensor.experimental._attention.set_rotate_method offers
('allgather', 'alltoall'); its t1 is F.scaled_dot_product_attention on rank
0 with the same SDPA backend (--sdpa-backend). The JSON records the options
it ran with.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and its PyTorch and NVSHMEM
equivalents are set before torch loads).

Output: a table on rank 0, and JSON with --json.
"""

import os

# NVLink multicast must stay off on the GPU hosts this runs on: set before
# NCCL or torch read them, in every rank (torchrun starts each with this file).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flexgen  # noqa: E402
import torch_mods  # noqa: E402
from compare_torch import rel_err, wall_ms  # noqa: E402

DEFAULT_CASES = ("causal:zigzag,sliding_window:contiguous,sliding_window:zigzag,"
                 "document:contiguous,document:zigzag")
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION"}


# ---------------------------------------------------------------------------
# Timing across ranks
# ---------------------------------------------------------------------------

def timed_calls(fn, warmup, iters, together=True):
    """Milliseconds of each of `iters` calls of fn() on this rank (CUDA
    events), after `warmup` calls; with `together`, every call starts after
    a barrier of all ranks (the NCCL barrier returns once every rank has
    reached it)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if together:
            dist.barrier(device_ids=[torch.cuda.current_device()])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def slowest_rank_median(times):
    """The median over the calls of the slowest rank's time of each call
    (every rank passes its own list; collective), and each rank's median."""
    world = dist.get_world_size()
    mine = torch.tensor(times, dtype=torch.float64, device="cuda")
    every = torch.empty(world * len(times), dtype=torch.float64, device="cuda")
    dist.all_gather_into_tensor(every, mine)
    every = every.view(world, len(times))
    return (float(every.max(dim=0).values.median()),
            [float(statistics.median(r)) for r in every.tolist()])


def all_ok(ok):
    """Whether every rank's attempt succeeded (collective), so that every
    rank skips the rest of a case together."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device="cuda")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def time_one_gpu(rank, row, opts, make_call):
    """The one-GPU figure of a row: on rank 0 alone, make_call() (which may
    time and record its own setup in row) gives the call on the whole
    sequence; its median time goes to row['t1_ms'] and, with --check, its
    output is kept. Collective: returns (every rank succeeded, the output
    on rank 0), with the failure in row."""
    out1, ok = None, True
    if rank == 0:
        try:
            call = make_call()
            row["t1_ms"] = statistics.median(timed_calls(call, opts.warmup, opts.iters, together=False))
            if opts.check:
                out1 = call()
        except Exception as e:
            ok = False
            row["failure"] = f"one GPU: {type(e).__name__}: {e}"
            traceback.print_exc()
    if not all_ok(ok):
        row.setdefault("failure", "one GPU: failed on rank 0")
        return False, None
    return True, out1


def time_n_gpus(rank, world, row, run):
    """The N-GPU figure of a row: run() on every rank gives (the sharded
    call's times, its output); the slowest rank's median goes to
    row['tN_ms'], each rank's to row['tN_ms_per_rank'], and the scaling
    efficiency against row['t1_ms'] to row['efficiency']. Collective:
    returns (every rank succeeded, this rank's output), with the failure in
    row."""
    times, out = None, None
    try:
        times, out = run()
    except Exception as e:
        row["failure"] = f"{world} GPUs, rank {rank}: {type(e).__name__}: {e}"
        traceback.print_exc()
    if not all_ok(times is not None):
        row.setdefault("failure", f"{world} GPUs: failed on another rank")
        return False, None
    row["tN_ms"], row["tN_ms_per_rank"] = slowest_rank_median(times)
    if "t1_ms" in row:
        row["efficiency"] = row["t1_ms"] / (world * row["tN_ms"])
    return True, out


def record_tflops(row, flops):
    """TFLOP/s of the one-GPU call (where it ran) and of all N GPUs together."""
    if "t1_ms" in row:
        row["tflops_1"] = flops / (row["t1_ms"] * 1e-3) / 1e12
    row["tflops_N"] = flops / (row["tN_ms"] * 1e-3) / 1e12


def gather_to_rank0(piece, shapes):
    """Every rank's piece on rank 0 (a list in rank order there; None
    elsewhere). shapes: every rank's piece shape."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.send(piece.contiguous(), dst=0)
        return None
    pieces = [piece]
    for r in range(1, world):
        buf = torch.empty(shapes[r], dtype=piece.dtype, device=piece.device)
        dist.recv(buf, src=r)
        pieces.append(buf)
    return pieces


# ---------------------------------------------------------------------------
# flexgen: one GPU against N
# ---------------------------------------------------------------------------

def run_flexgen_case(spec, layout, full, opts):
    """One row: the one-GPU call on rank 0, then the sharded call on every
    rank. Collective."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = full
    B, H, S, D = q.shape
    dev = q.device
    st = spec.setup(B, H, S, dev)
    params, buffers = st.get("params", {}), st.get("buffers", {})
    row = {"system": "flexgen", "mask": spec.name, "layout": layout, "S": S, "params": params,
           "buffers": {n: [str(t.dtype), list(t.shape)] for n, t in buffers.items()}}
    mod = flexgen.load_mod(spec.mask_file, spec.score_file)

    def one_gpu():
        bm = None
        if mod.has_mask:
            row["t1_block_mask_ms"], bm = wall_ms(lambda: flexgen.block_mask(
                mod, st.get("mask_b"), st.get("mask_h"), S, S, params, buffers, device=dev))
            row["density"] = bm.density()
        return lambda: flexgen.attention(q, k, v, mod, None, params, buffers, block_mask=bm)
    ok, out1 = time_one_gpu(rank, row, opts, one_gpu)
    if not ok:
        return row

    shards = [flexgen.shard(t, world, rank, layout) for t in full]

    def sharded():
        row["tN_plan_ms"], plan = wall_ms(lambda: flexgen.context_parallel_plan(
            *shards, mod, None, params, buffers, layout=layout, seq_len=S))

        def n_gpus(plan=plan):
            return flexgen.context_parallel_attention(*shards, mod, None, params, buffers, layout=layout,
                                                      seq_len=S, plan=plan)
        times = timed_calls(n_gpus, opts.warmup, opts.iters)
        row["tN_noplan_ms"], _ = slowest_rank_median(timed_calls(lambda: n_gpus(None), opts.warmup,
                                                                 opts.iters))
        out = n_gpus()
        plan.close()
        return times, out
    ok, out = time_n_gpus(rank, world, row, sharded)
    if not ok:
        return row
    row["comm"] = sorted({c.kind for c in flexgen._cp_comms.values()})
    if "t1_ms" in row and "t1_block_mask_ms" in row:
        row["efficiency_with_mask"] = ((row["t1_ms"] + row["t1_block_mask_ms"])
                                       / (world * row["tN_ms"]))
    if "density" in row or not mod.has_mask:
        record_tflops(row, 4.0 * B * H * S * S * D * row.get("density", 1.0))
    if opts.check:
        shapes = [(B, H, sum(n for _, n in flexgen.shard_rows(S, world, r, layout)), D)
                  for r in range(world)]
        pieces = gather_to_rank0(out, shapes)
        if rank == 0:
            row["error_vs_1gpu"] = rel_err(flexgen.unshard(pieces, layout), out1.double())
    return row


# ---------------------------------------------------------------------------
# PyTorch's context parallelism for SDPA (the anchor)
# ---------------------------------------------------------------------------

def torch_cp_api():
    """(context_parallel, set_rotate_method, _cp_options), as far as this
    torch has them."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError:
        return None, None, None
    try:
        from torch.distributed.tensor.experimental import _attention
    except ImportError:
        return context_parallel, None, None
    return (context_parallel, getattr(_attention, "set_rotate_method", None),
            getattr(_attention, "_cp_options", None))


def cp_options_record(options):
    if options is None:
        return None
    return {name: str(getattr(options, name)) for name in ("enable_load_balance", "rotate_method",
                                                            "convert_to_f32") if hasattr(options, name)}


def run_torch_case(full, rotate, opts, mesh):
    """One row of torch's SDPA context parallelism, causal. Collective."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    context_parallel, set_rotate_method, options = torch_cp_api()
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = full
    B, H, S, D = q.shape
    backend = getattr(SDPBackend, SDPA_BACKENDS[opts.sdpa_backend])
    row = {"system": "torch_cp_sdpa", "mask": "causal", "layout": "head-tail", "S": S,
           "rotate": rotate, "sdpa_backend": opts.sdpa_backend}

    def one_gpu():
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return call
    ok, out1 = time_one_gpu(rank, row, opts, one_gpu)
    if not ok:
        return row

    def sharded():
        if set_rotate_method is not None:
            set_rotate_method(rotate)
        row["options"] = cp_options_record(options)
        # context_parallel shards its buffers in place: copies of the inputs
        qc, kc, vc = (t.clone() for t in full)

        def n_gpus():
            # looked up at each call: inside the context F's attribute is
            # torch's context-parallel replacement
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
        with context_parallel(mesh, buffers=[qc, kc, vc], buffer_seq_dims=[2, 2, 2],
                              no_restore_buffers={qc, kc, vc}):
            times = timed_calls(n_gpus, opts.warmup, opts.iters)
            out = n_gpus()
        return times, out
    ok, out = time_n_gpus(rank, world, row, sharded)
    if not ok:
        return row
    record_tflops(row, 4.0 * B * H * S * S * D * 0.5)  # causal: half the score matrix
    if opts.check:
        try:
            from torch.distributed.tensor.experimental._attention import context_parallel_unshard
            whole = context_parallel_unshard(mesh, [out], [2])[0]
            if rank == 0:
                row["error_vs_1gpu"] = rel_err(whole, out1.double())
        except Exception as e:
            row["check_failure"] = f"{type(e).__name__}: {e}"
    return row


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def table(rows, world):
    head = ["system", "mask", "layout", "S", "mask ms", "t1 ms", "plan ms", f"t{world} ms",
            f"t{world} no plan", "eff", "eff+mask", "TF/s 1", f"TF/s {world}", "err", "comm"]
    lines = []
    for r in rows:
        system = r["system"] + (f" ({r['rotate']})" if "rotate" in r else "")
        lines.append([system, r["mask"], r["layout"], str(r["S"]),
                      fmt(r.get("t1_block_mask_ms"), "{:.2f}"), fmt(r.get("t1_ms"), "{:.2f}"),
                      fmt(r.get("tN_plan_ms"), "{:.2f}"), fmt(r.get("tN_ms"), "{:.2f}"),
                      fmt(r.get("tN_noplan_ms"), "{:.2f}"), fmt(r.get("efficiency"), "{:.3f}"),
                      fmt(r.get("efficiency_with_mask"), "{:.3f}"), fmt(r.get("tflops_1")),
                      fmt(r.get("tflops_N")), fmt(r.get("error_vs_1gpu"), "{:.1e}"),
                      ",".join(r.get("comm", [])) or "-"])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for l in lines:
        out.append("| " + " | ".join(c.rjust(w) if i >= 3 else c.ljust(w)
                                      for i, (c, w) in enumerate(zip(l, widths))) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", "-B", type=int, default=1)
    p.add_argument("--heads", "-H", type=int, default=16)
    p.add_argument("--seqs", "-S", default="131072,262144", help="comma-separated sequence lengths")
    p.add_argument("--head-dim", "--d", "-D", dest="head_dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--cases", default=DEFAULT_CASES,
                   help="comma-separated gallery mod:layout pairs (layout zigzag or contiguous)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each timing")
    p.add_argument("--iters", type=int, default=10, help="timed calls per timing (median)")
    p.add_argument("--rotate", default="allgather,alltoall",
                   help="torch's rotate methods to time ('' or --no-torch: none)")
    p.add_argument("--no-torch", dest="torch", action="store_false",
                   help="skip PyTorch's context parallelism")
    p.add_argument("--sdpa-backend", choices=sorted(SDPA_BACKENDS), default="flash",
                   help="the SDPA kernel of torch's rows, on one GPU and in its ring")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip comparing the N-GPU outputs with the one-GPU ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", help="recorded in the JSON (e.g. the commit the build came from)")
    p.add_argument("--json", help="write the results here (rank 0)")
    a = p.parse_args(argv)
    try:
        a.seqs = [int(s) for s in a.seqs.split(",") if s]
    except ValueError:
        p.error("--seqs takes comma-separated integers")
    a.cases = [tuple(c.split(":", 1)) if ":" in c else (c, "zigzag") for c in a.cases.split(",") if c]
    for name, layout in a.cases:
        if name not in torch_mods.GALLERY:
            p.error(f"unknown gallery mod '{name}'")
        if layout not in ("zigzag", "contiguous"):
            p.error(f"unknown layout '{layout}' (zigzag or contiguous)")
    a.rotate = [m for m in a.rotate.split(",") if m] if a.torch else []
    if a.warmup < 0 or a.iters < 1:
        p.error("--warmup must be >= 0 and --iters >= 1")
    return a


def init_distributed():
    """torchrun's process group, or a one-process one. No device_id: the
    group's NCCL communicator is then made lazily, in blocking mode, which
    lets flexgen use it (flexgen.py, "Context parallelism")."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        return None
    torch.cuda.set_device(0)
    folder = tempfile.mkdtemp(prefix="compare-cp-")
    dist.init_process_group("nccl", init_method=f"file://{folder}/store", rank=0, world_size=1)
    return folder


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("compare_cp: no CUDA device", file=sys.stderr)
        return 2
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.bfloat16 if opts.dtype == "bf16" else torch.float16
    context_parallel, set_rotate_method, options = torch_cp_api()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "bench/compare_cp.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "world": world, "device": torch.cuda.get_device_name(dev),
        "devices": None, "torch": torch.__version__, "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None,
        "flexgen": flexgen.version(), "flexgen_lib": flexgen.library_path(),
        "host": platform.node(), "label": opts.label, "dtype": opts.dtype,
        "cp_streams": 1 if os.environ.get("FLEXGEN_CP_STREAMS") == "1" else 2,
        "shape": {"B": opts.batch, "H": opts.heads, "D": opts.head_dim, "S": opts.seqs},
        "cases": [f"{n}:{l}" for n, l in opts.cases],
        "timing": {"warmup_calls": opts.warmup, "timed_calls": opts.iters,
                   "figure": "median over calls of the slowest rank's CUDA-event time, calls started "
                             "together after a barrier; t1 on rank 0 alone"},
        "efficiency": "t1 / (world * tN)",
        "error": "||out_N - out_1|| / ||out_1||, the N-GPU output put back in order against "
                 "the one-GPU one",
        "env": {n: os.environ.get(n) for n in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                               "NVSHMEM_DISABLE_NVLS", "FLEXGEN_CP_COMM",
                                               "FLEXGEN_NCCL_LIB")},
        "torch_cp": {"context_parallel": context_parallel is not None,
                     "set_rotate_method": set_rotate_method is not None,
                     "rotate_methods": opts.rotate if set_rotate_method is not None else [],
                     "options_default": cp_options_record(options),
                     "sdpa_backend": opts.sdpa_backend},
    }
    names = [None] * world
    dist.all_gather_object(names, torch.cuda.get_device_name(dev))
    meta["devices"] = names
    if rank == 0:
        print(f"# {meta['device']} x{world}  torch {meta['torch']}  NCCL {meta['nccl']}  flexgen "
              f"{meta['flexgen']}  B={opts.batch} H={opts.heads} D={opts.head_dim} {opts.dtype}",
              flush=True)
    mesh = None
    if opts.rotate and context_parallel is not None:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (world,))
    rows = []
    for S in opts.seqs:
        shape = (opts.batch, opts.heads, S, opts.head_dim)
        full = []
        for i in range(3):  # drawn on rank 0 and sent, so every rank shards the same numbers
            t = torch.empty(shape, device=dev, dtype=dtype)
            if rank == 0:
                t.normal_(generator=torch.Generator(device=dev).manual_seed(opts.seed * 3 + i))
            dist.broadcast(t, src=0)
            full.append(t)
        for name, layout in opts.cases:
            row = run_flexgen_case(torch_mods.GALLERY[name], layout, full, opts)
            rows.append(row)
            if rank == 0:
                print(f"# flexgen {name}/{layout} S={S}: t1 {fmt(row.get('t1_ms'), '{:.2f}')} ms, "
                      f"t{world} {fmt(row.get('tN_ms'), '{:.2f}')} ms, eff "
                      f"{fmt(row.get('efficiency'), '{:.3f}')}" + (f"  FAILED: {row['failure']}"
                                                                   if "failure" in row else ""),
                      file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        if mesh is not None:
            for rotate in (opts.rotate if set_rotate_method is not None else ["default"]):
                row = run_torch_case(full, rotate, opts, mesh)
                rows.append(row)
                if rank == 0:
                    print(f"# torch ({rotate}) causal S={S}: "
                          f"t{world} {fmt(row.get('tN_ms'), '{:.2f}')} ms"
                          + (f"  FAILED: {row['failure']}" if "failure" in row else ""),
                          file=sys.stderr, flush=True)
                torch.cuda.empty_cache()
        del full
        torch.cuda.empty_cache()
    failures = {f"{r['system']} {r['mask']}/{r['layout']} S={r['S']}": r["failure"]
                for r in rows if "failure" in r}
    if rank == 0:
        print(table(rows, world))
        if failures:
            print("failures:", json.dumps(failures, indent=1))
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.barrier(device_ids=[torch.cuda.current_device()])
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
