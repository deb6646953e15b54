#!/usr/bin/env python3
"""decode_mod_one.py -- N flexgen decode calls of one gallery mod, for a profiler to take.

    python3 bench/experiments/decode_mod_one.py MOD D B KV N [PAGE]

compare_decode.py's row for MOD (its tensors, positions, block mask and
paged cache), one query per sequence, GQA 32 query heads over 8 KV heads,
bf16: flexgen's prepared contiguous call, or with PAGE (16, 64, ...) its
paged call on the same K/V scattered over shuffled NHD pages. Environment
options (FLEXGEN_DECODE_HEAD_PAIRS, ...) apply as in any flexgen call. The
output is checked once against compare_decode's float64 reference before
the N calls. decode_one.py is the causal contiguous case beside SDPA; this
one is for pairs of flexgen walks under ncu (noop against causal,
contiguous against paged). With DECODE_FLUSH=1 each call follows a 256
MB write, the L2 flush triton's do_bench makes before each timed call, so
that a kernel starts from the caches the benchmark leaves it (the L2 full
of the flush's dirty lines, each SM's instruction cache as the previous
call left it; `ncu --cache-control all` empties both). Under ncu that
needs `--cache-control none --replay-mode application`: with kernel
replay the metric passes after the first find K and V in the L2
(attention_notes decode d47), or one metric (one pass). The N calls lie
between cudaProfilerStart and Stop, for `ncu --profile-from-start off`.
E.g.

    ncu --clock-control none --cache-control all -k regex:decode_r \\
        --launch-skip 3 --launch-count 1 --section SpeedOfLight \\
        python3 bench/experiments/decode_mod_one.py causal 64 1 131072 6
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: compare_decode, torch_mods
import compare_decode as cd  # noqa: E402  (puts python/ on the path)
import flexgen  # noqa: E402
import torch  # noqa: E402
import torch_mods  # noqa: E402


def mod_call(name, D, B, KV, page=0, Q=1):
    """flexgen's prepared call for compare_decode's row (name, B, KV, Q) and
    the row's float64 reference output."""
    spec = torch_mods.GALLERY[name]
    dev = torch.device("cuda")
    off = KV - Q
    scale = 1.0 / math.sqrt(D)
    g = torch.Generator(device=dev).manual_seed(B * 1000003 + KV + Q)
    q = torch.randn((B, cd.HQ, Q, D), dtype=torch.bfloat16, device=dev, generator=g)
    k = torch.randn((B, cd.HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    v = torch.randn((B, cd.HKV, KV, D), dtype=torch.bfloat16, device=dev, generator=g)
    st = spec.setup(B, cd.HQ, KV, dev)
    params, buffers = st.get("params", {}), st.get("buffers", {})
    ref = cd.reference(q, k, v, st.get("mask_mod"), st.get("score_mod"), off, scale)
    if not page:
        call = flexgen.prepare(q, k, v, spec.mask_file, spec.score_file, params, buffers, scale=scale,
                               enable_gqa=True, q_offset=off)
        return call, ref
    kc, vc, table, lens = cd.paged_copy(k, v, page, seed=page)
    mod = flexgen.load_mod(spec.mask_file, spec.score_file, params, buffers)
    bm = None
    if mod.has_mask:
        bm = flexgen.block_mask(mod, None, None, Q, table.shape[1] * page, params, buffers, q_offset=off)
    qoffs = torch.full((B,), off, dtype=torch.int32, device=dev)
    call = flexgen.prepare_paged(q, kc, vc, table, lens, spec.mask_file, spec.score_file, params, buffers,
                                 scale=scale, q_offsets=qoffs, block_mask=bm)
    return call, ref


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    name, D, B, KV, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    page = int(sys.argv[6]) if len(sys.argv) == 7 else 0
    if name not in torch_mods.GALLERY:
        sys.exit(f"decode_mod_one: no gallery mod {name!r}")
    call, ref = mod_call(name, D, B, KV, page)
    err = cd.rel_err(call().double(), ref)
    print(f"{name} D={D} B={B} KV={KV} page={page or '-'} kernel={call.kernel_kind} err={err:.1e}", file=sys.stderr)
    if not err < 1e-2:
        sys.exit(f"decode_mod_one: error {err} against the float64 reference")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if os.environ.get("DECODE_FLUSH") == "1" else None
    # the N calls alone for a profiler run with --profile-from-start off
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(N):
        if flush is not None:
            flush.zero_()
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
