#!/usr/bin/env bash
# sanitize.sh -- compute-sanitizer over the GPU kernels' paths, on the GPU
# machine: the Hopper forward (its -dense form, its merged walks at head
# dim 64, shared mask column parts), the decode walk (contiguous and paged,
# ragged lengths, the -pairs walk, a split merge) and every path of the
# Hopper backward.
#
#   scripts/sanitize.sh BUILD [NAME_PATTERN]
#
# Each run is one `flexgen check` against the CPU reference under one tool
# (memcheck, racecheck or synccheck). Its kind picks the shape:
#   fwd  B=2 Hq=4 Hkv=2 Q=1000 KV=1300, the forward alone
#   bwd  the same shape, forward and backward (--backward)
#   dec  B=3 Hq=8 Hkv=2 Q=1 (or --q-len given) at position 2999 (one
#        block-mask row for every sequence) over KV lengths 3000, 17
#        and 1000, the decode kernel forced (--decode-kernel 2)
# with the gallery mod's GPU block mask (noop: none, so at head dim 128 the
# -dense forward; 1300 keys end inside a 176-row tile). The backward rows:
# racecheck on causal (plain, deterministic, the -pairs kernel, head dim
# 64), on noop (no block mask: 44 blocks on an H100's 132 SMs, so the
# -lead kernel splits each into pieces, the tail split), sliding_window,
# alibi (its slopes' gradient; at head dim 64 its score made by
# diagonals, memcheck too), softcap at head dim 64, dilated (its mask
# made once per diagonal; memcheck too), and local_global on the -lead
# kernel; memcheck and synccheck on causal and noop.
# It prints one line a run: its name, the check's exit code and the
# tool's summary, and exits 1 if a run reported an error, failed its check
# or did not finish. NAME_PATTERN (a grep -E pattern) keeps the runs whose
# names match. $COMPUTE_SANITIZER names the tool (default: on PATH).
set -uo pipefail
build=${1:?usage: scripts/sanitize.sh BUILD [NAME_PATTERN]}
only=${2:-.}
root=$(cd "$(dirname "$0")/.." && pwd)
cli=$build/tools/flexgen
san=${COMPUTE_SANITIZER:-compute-sanitizer}
[ -x "$cli" ] || { echo "sanitize.sh: no $cli" >&2; exit 2; }
command -v "$san" >/dev/null || { echo "sanitize.sh: no $san" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/gallery_args.sh
. "$root/bench/gallery_args.sh"
gallery_buffers "$tmp"
status=0
run() { # name tool kind mod head_dim [VAR=VALUE ...] [-- check options...]
    local name=$1 tool=$2 kind=$3 mod=$4 d=$5 summary rc shape
    shift 5
    grep -qE "$only" <<<"$name" || return 0
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    case $kind in
    fwd) shape="--batch 2 --heads 4 --kv-heads 2 --q-len 1000 --kv-len 1300" ;;
    bwd) shape="--batch 2 --heads 4 --kv-heads 2 --q-len 1000 --kv-len 1300 --backward" ;;
    dec) shape="--batch 3 --heads 8 --kv-heads 2 --q-len 1 --kv-len 3000 --kv-lens 3000,17,1000 --q-offset 2999 --decode-kernel 2" ;;
    esac
    # shellcheck disable=SC2046,SC2086
    env FLEXGEN_CACHE_DIR="$tmp/cache" "${envs[@]}" "$san" --tool "$tool" "$cli" check \
        $(gallery_mod_args "$root" "$tmp" "$mod") $shape --head-dim "$d" "$@" >"$tmp/log" 2>&1
    rc=$? # the check's own code (5: out of tolerance) where the tool found nothing
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$tmp/log" | tail -1)
    printf '%-22s rc=%d %s\n' "$name" "$rc" "${summary:-(no summary: the run did not finish)}"
    [[ $rc -eq 0 && $summary =~ (^|[^0-9])0\ errors ]] || status=1
}
# the forward
run fwd_mem_noop128 memcheck fwd noop 128
run fwd_race_noop128 racecheck fwd noop 128
run fwd_sync_noop128 synccheck fwd noop 128
run fwd_mem_noop64 memcheck fwd noop 64
run fwd_race_causal64 racecheck fwd causal 64
run fwd_mem_causal128 memcheck fwd causal 128
run fwd_race_lg64 racecheck fwd local_global 64
run fwd_mem_lg64 memcheck fwd local_global 64
run fwd_mem_dilated64 memcheck fwd dilated 64
run fwd_race_flamingo128 racecheck fwd flamingo 128
run fwd_race_softcap128 racecheck fwd softcap 128
run fwd_mem_alibi64 memcheck fwd alibi 64
run fwd_race_alibi64 racecheck fwd alibi 64
# decoding
run dec_mem_causal128 memcheck dec causal 128
run dec_race_causal128 racecheck dec causal 128
run dec_mem_paged128 memcheck dec causal 128 -- --paged --page-size 16
run dec_race_paged64 racecheck dec sliding_window 64 -- --paged --page-size 64
run dec_race_q4_64 racecheck dec causal 64 -- --q-len 4
run dec_mem_split128 memcheck dec causal 128 FLEXGEN_DECODE_SPLITS=8
# the backward
run mem_causal128 memcheck bwd causal 128
run mem_noop128 memcheck bwd noop 128
run sync_causal128 synccheck bwd causal 128
run sync_noop128 synccheck bwd noop 128
run race_causal128 racecheck bwd causal 128
run race_causal128_det racecheck bwd causal 128 -- --deterministic
run race_causal128_pairs racecheck bwd causal 128 FLEXGEN_BWD_HEAD_PAIRS=1
run race_causal64 racecheck bwd causal 64
run race_noop128 racecheck bwd noop 128
run race_sliding128 racecheck bwd sliding_window 128
run race_alibi128 racecheck bwd alibi 128
run race_alibi64 racecheck bwd alibi 64
run mem_alibi64 memcheck bwd alibi 64
run race_softcap64 racecheck bwd softcap 64
run race_dilated64 racecheck bwd dilated 64
run mem_dilated128 memcheck bwd dilated 128
run race_lg128_lead racecheck bwd local_global 128 FLEXGEN_BWD_LEAD_TILES=2
exit $status
