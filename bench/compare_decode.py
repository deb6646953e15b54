#!/usr/bin/env python3
"""compare_decode.py -- decoding: flexgen beside FlexAttention and SDPA on the same tensors, in one run.

A decode step reads the whole KV cache for a few new queries per sequence,
so its speed is bandwidth: every row here reports

  TB/s     bytes of K and V the step must read / median time, the same
           bytes for every system: 2 (K and V) x B x Hkv x D x 2 bytes x the
           keys some query of the step can see (all of them for a causal
           step; the window for sliding_window);
  ms       median of CUDA-event timings (triton.testing.do_bench) of the
           call alone: flexgen's Prepared call (kernel fetched once),
           flex_attention under torch.compile with a block mask made once
           for the shape, SDPA (noop and causal rows only: a mask or score
           it cannot express has no SDPA figure);
  error    ||out - ref|| / ||ref|| against a float64 reference of the whole
           output computed from the torch mods.

Before each timed call the L2 is emptied: by default as do_bench does it,
writing 256 MB, so a call that reads less than the L2 holds (the
sliding_window rows) finds it full of dirty lines and shares the DRAM
with their write-back; --flush read empties it by reading 512 MB instead,
so such a call starts from clean lines (the same loop, events and median).

With --floors each row also times, under the same flush and timing, two
calls that do no attention: one kernel on one element (launch: what the
method charges any call) and one torch reduction over as many contiguous
bytes as the row's K and V (read: a plain stream of the same bytes). On
the short rows (sliding_window's 1025 keys) they show how much of a call's
time no kernel can avoid, and so the TB/s a row can reach at all.

The queries sit at the end of their sequences (positions KV - Q .. KV - 1),
so mods see the positions a serving loop gives them: flexgen through
q_offset (contiguous) or q_offsets (paged), flex and the reference through
the mods shifted by the same offset, SDPA through a lower-right causal mask.
Paged rows scatter the same K/V over shuffled pages of a cache of page size
16 or 64 (block table, one length per sequence) and time flexgen's paged
call on it; the other systems read the contiguous tensors. The cache is
(num_pages, page_size, Hkv, D) as vLLM and FlashInfer's NHD layout store
it (a row of one KV head every Hkv * D elements); with --page-layouts
nhd,hnd the rows flexgen_paged<N>_hnd read the same cache stored
(num_pages, Hkv, page_size, D) (FlashInfer's HND: a page's rows of one
head contiguous), passed as a permuted view with its strides.

Shapes (the issue's): GQA 32 query heads over 8 KV heads; B=8 KV=32768 Q=1,
B=32 KV=8192 Q=1, B=8 KV=32768 Q=4 (speculative decoding), B=1 KV=131072
Q=1. bf16. Output: a table, and JSON with --json.
"""

import argparse
import datetime
import json
import math
import os
import sys
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
from compare_torch import bench_ms, rel_err  # noqa: E402

SHAPES = ((8, 32768, 1), (32, 8192, 1), (8, 32768, 4), (1, 131072, 1))
HQ, HKV = 32, 8


def shifted(mask_mod, score_mod, off):
    """The torch mods seeing query positions off + i."""
    m = (lambda b, h, q, kv: mask_mod(b, h, q + off, kv)) if mask_mod else None
    s = (lambda sc, b, h, q, kv: score_mod(sc, b, h, q + off, kv)) if score_mod else None
    return m, s


def visible_keys(mask_mod, Q, KV, off, device):
    """How many keys some query of the step can see (every key without a mask)."""
    if mask_mod is None:
        return KV
    q = torch.arange(Q, device=device).view(Q, 1) + off
    kv = torch.arange(KV, device=device).view(1, KV)
    z = torch.zeros((), dtype=torch.int64, device=device)
    return int(mask_mod(z, z, q, kv).expand(Q, KV).any(dim=0).sum())


def reference(q, k, v, mask_mod, score_mod, off, scale):
    """float64 attention of the whole step, one (sequence, KV head) at a time."""
    B, Hq, Q, D = q.shape
    Hkv, KV = k.shape[1], k.shape[2]
    G = Hq // Hkv
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    qi = torch.arange(Q, device=q.device).view(1, Q, 1) + off
    ki = torch.arange(KV, device=q.device).view(1, 1, KV)
    for b in range(B):
        bt = torch.full((1, 1, 1), b, device=q.device)
        for hk in range(Hkv):
            hs = torch.arange(hk * G, hk * G + G, device=q.device).view(G, 1, 1)
            s = (q[b, hk * G:hk * G + G].double() @ k[b, hk].double().T) * scale
            if score_mod is not None:
                s = score_mod(s.float(), bt, hs, qi, ki).double()
            if mask_mod is not None:
                s = s.masked_fill(~mask_mod(bt, hs, qi, ki).expand_as(s), float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)
            out[b, hk * G:hk * G + G] = p @ v[b, hk].double()
    return out


def paged_copy(k, v, page, seed, layout="nhd"):
    """k, v (B, Hkv, KV, D) scattered over shuffled pages: caches (P, page,
    Hkv, D) with random other rows (with layout "hnd" views of caches
    stored (P, Hkv, page, D)), the block table and the lengths."""
    B, Hkv, KV, D = k.shape
    per = (KV + page - 1) // page
    P = B * per + 7
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(P, generator=g)[:B * per].view(B, per).to(torch.int32).to(k.device)
    if layout == "hnd":
        kc = torch.randn((P, Hkv, page, D), dtype=k.dtype, device=k.device).permute(0, 2, 1, 3)
        vc = torch.randn((P, Hkv, page, D), dtype=k.dtype, device=k.device).permute(0, 2, 1, 3)
    else:
        kc = torch.randn((P, page, Hkv, D), dtype=k.dtype, device=k.device)
        vc = torch.randn((P, page, Hkv, D), dtype=k.dtype, device=k.device)
    for b in range(B):
        kb = k[b].transpose(0, 1)  # (KV, Hkv, D)
        vb = v[b].transpose(0, 1)
        pad = per * page - KV
        if pad:
            kb = torch.cat([kb, kb.new_zeros((pad, Hkv, D))])
            vb = torch.cat([vb, vb.new_zeros((pad, Hkv, D))])
        kc[perm[b].long()] = kb.reshape(per, page, Hkv, D)
        vc[perm[b].long()] = vb.reshape(per, page, Hkv, D)
    lens = torch.full((B,), KV, dtype=torch.int32, device=k.device)
    return kc, vc, perm.contiguous(), lens


def run_row(spec, shape, D, opts, compiled_flex):
    B, KV, Q = shape
    dev = torch.device("cuda")
    off = KV - Q
    scale = 1.0 / math.sqrt(D)
    g = torch.Generator(device=dev).manual_seed(B * 1000003 + KV + Q)
    q = torch.randn((B, HQ, Q, D), dtype=torch.bfloat16, device=dev, generator=g)
    k = torch.randn((B, HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    v = torch.randn((B, HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    st = spec.setup(B, HQ, KV, dev)
    params, buffers = st.get("params", {}), st.get("buffers", {})
    t_mask, t_score = shifted(st.get("mask_mod"), st.get("score_mod"), off)
    keys = visible_keys(st.get("mask_mod"), Q, KV, off, dev)
    gbytes = 2 * B * HKV * D * 2 * keys
    row = {"mod": spec.name, "B": B, "KV": KV, "Q": Q, "D": D, "Hq": HQ, "Hkv": HKV,
           "visible_keys": keys, "bytes": gbytes, "ms": {}, "tbps": {}, "error": {}, "failures": {}}
    ref = reference(q, k, v, st.get("mask_mod"), st.get("score_mod"), off, scale)
    outs = {}

    def attempt(system, make):
        """make() returns the call to time (its setup fails like the call)."""
        if opts.systems and not any(system.startswith(s) for s in opts.systems):
            return
        try:
            fn = make()
            out = fn()
            row["ms"][system] = bench_ms(fn, opts.warmup, opts.rep, opts.flush)
            row["tbps"][system] = gbytes / (row["ms"][system] * 1e-3) / 1e12
            row["error"][system] = rel_err(out.double(), ref)
            outs[system] = out
        except Exception as e:  # keep measuring the others
            row["failures"][system] = f"{type(e).__name__}: {e}"
            print(f"[{spec.name} {shape}] {system} failed:", file=sys.stderr)
            traceback.print_exc()

    def flexgen_contiguous():
        call = flexgen.prepare(q, k, v, spec.mask_file, spec.score_file, params, buffers, scale=scale,
                               enable_gqa=True, q_offset=off)
        row["kernel"] = call.kernel_kind
        return call
    attempt("flexgen", flexgen_contiguous)

    def flexgen_paged(page, layout):
        kc, vc, table, lens = paged_copy(k, v, page, seed=page, layout=layout)
        bm = None
        mod = flexgen.load_mod(spec.mask_file, spec.score_file, params, buffers)
        if mod.has_mask:  # one mask for the step's positions, every sequence the same length
            bm = flexgen.block_mask(mod, None, None, Q, table.shape[1] * page, params, buffers, q_offset=off)
        qoffs = torch.full((B,), off, dtype=torch.int32, device=dev)
        return flexgen.prepare_paged(q, kc, vc, table, lens, spec.mask_file, spec.score_file, params,
                                     buffers, scale=scale, q_offsets=qoffs, block_mask=bm)
    for page in opts.pages:
        for layout in opts.page_layouts:
            name = f"flexgen_paged{page}" + ("" if layout == "nhd" else f"_{layout}")
            attempt(name, lambda: flexgen_paged(page, layout))

    def flex_call():
        bm = create_block_mask(t_mask, None, None, Q, KV, device=dev) if t_mask else None
        return lambda: compiled_flex(q, k, v, score_mod=t_score, block_mask=bm, scale=scale, enable_gqa=True)
    attempt("flex", flex_call)

    if spec.sdpa in ("none", "causal"):
        def sdpa_call():
            from torch.nn.attention.bias import causal_lower_right
            # one query sees every key of a causal step: no mask is the same
            # attention and lets SDPA take its fastest kernel
            mask = causal_lower_right(Q, KV) if spec.sdpa == "causal" and Q > 1 else None
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        attempt("sdpa", sdpa_call)
    if opts.floors:
        one = torch.zeros(1, dtype=torch.float32, device=dev)
        stream = torch.empty(gbytes // 2, dtype=torch.bfloat16, device=dev).normal_()
        row["floors"] = {"launch": bench_ms(lambda: one.add_(1.0), opts.warmup, opts.rep, opts.flush),
                         "read": bench_ms(lambda: stream.sum(dtype=torch.float32), opts.warmup, opts.rep, opts.flush)}
        del stream
    if "flexgen" in outs and "flex" in outs:
        row["flexgen_vs_flex"] = rel_err(outs["flexgen"].double(), outs["flex"].double())
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--mods", default="causal,sliding_window,alibi,softcap")
    ap.add_argument("--pages", default="16,64", help="page sizes of the paged rows ('' for none)")
    ap.add_argument("--page-layouts", default="nhd",
                    help="cache layouts of the paged rows: nhd (num_pages, page_size, Hkv, D), hnd "
                         "(num_pages, Hkv, page_size, D)")
    ap.add_argument("--shapes", default=None, help="B:KV:Q,... (default: the four decode shapes)")
    ap.add_argument("--warmup", type=float, default=25)
    ap.add_argument("--rep", type=float, default=100)
    ap.add_argument("--systems", default="", help="only these systems (prefixes: flexgen,flex,sdpa)")
    ap.add_argument("--floors", action="store_true",
                    help="also time one kernel on one element and one read of the row's bytes")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="how the L2 is emptied before each timed call: write (do_bench's 256 MB of zeros, "
                         "the default) or read (512 MB read: the call finds clean lines)")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    opts.pages = [int(p) for p in opts.pages.split(",") if p]
    opts.page_layouts = [x for x in opts.page_layouts.split(",") if x]
    for x in opts.page_layouts:
        if x not in ("nhd", "hnd"):
            ap.error(f"--page-layouts: {x} is not nhd or hnd")
    opts.systems = [s for s in opts.systems.split(",") if s]
    shapes = SHAPES
    if opts.shapes:
        shapes = tuple(tuple(int(x) for x in s.split(":")) for s in opts.shapes.split(","))
    rows = []
    for name in opts.mods.split(","):
        spec = torch_mods.GALLERY[name]
        for shape in shapes:
            # a fresh compile per row: every row is a new shape and new mods,
            # and past torch._dynamo's recompile limit flex_attention would
            # silently run eagerly
            torch._dynamo.reset()
            compiled_flex = torch.compile(flex_attention, dynamic=False)
            row = run_row(spec, shape, opts.head_dim, opts, compiled_flex)
            rows.append(row)
            sysnames = list(row["tbps"])
            print(f"{name:15s} B={shape[0]:<3d} KV={shape[1]:<7d} Q={shape[2]:<2d} D={opts.head_dim} keys={row['visible_keys']:<7d} "
                  + "  ".join(f"{s} {row['tbps'][s]:.3f} TB/s ({row['ms'][s] * 1e3:.1f} us, err {row['error'][s]:.1e})"
                              for s in sysnames)
                  + "".join(f"  floor_{f} {ms * 1e3:.1f} us" + (f" ({row['bytes'] / (ms * 1e-3) / 1e12:.2f} TB/s)" if f == "read" else "")
                            for f, ms in row.get("floors", {}).items()), flush=True)
    if opts.json:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "command": " ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))}
        with open(opts.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
