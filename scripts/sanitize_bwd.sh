#!/usr/bin/env bash
# sanitize_bwd.sh -- compute-sanitizer over every path of the Hopper
# backward, on the GPU machine.
#
#   scripts/sanitize_bwd.sh BUILD
#
# Each run is `flexgen check --backward` (the forward and the backward
# against the CPU reference) at B=2 Hq=4 Hkv=2 Q=1000 KV=1300 bf16 with
# the GPU block mask, under one tool: memcheck and synccheck on causal
# and on noop, racecheck on causal (plain, deterministic, the -pairs
# kernel, head dim 64), on noop (no block mask: 44 blocks on an H100's
# 132 SMs, so the -lead kernel splits each into pieces, the tail split),
# sliding_window, alibi (its slopes' gradient), softcap at head dim 64,
# and local_global on the -lead kernel. It prints one line a run: its
# name, the check's exit code and the tool's summary, and exits 1 if a
# run reported an error, failed its check or did not finish. $COMPUTE_SANITIZER names the tool (default: on PATH).
set -uo pipefail
build=${1:?usage: scripts/sanitize_bwd.sh BUILD}
root=$(cd "$(dirname "$0")/.." && pwd)
cli=$build/tools/flexgen
san=${COMPUTE_SANITIZER:-compute-sanitizer}
[ -x "$cli" ] || { echo "sanitize_bwd.sh: no $cli" >&2; exit 2; }
command -v "$san" >/dev/null || { echo "sanitize_bwd.sh: no $san" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/gallery_args.sh
. "$root/bench/gallery_args.sh"
gallery_buffers "$tmp"
status=0
run() { # name tool mod head_dim [VAR=VALUE ...] [-- check options...]
    local name=$1 tool=$2 mod=$3 d=$4 summary rc
    shift 4
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    # shellcheck disable=SC2046
    env FLEXGEN_CACHE_DIR="$tmp/cache" "${envs[@]}" "$san" --tool "$tool" "$cli" check \
        $(gallery_mod_args "$root" "$tmp" "$mod") --batch 2 --heads 4 --kv-heads 2 --q-len 1000 \
        --kv-len 1300 --head-dim "$d" --backward "$@" >"$tmp/log" 2>&1
    rc=$? # the check's own code (5: out of tolerance) where the tool found nothing
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$tmp/log" | tail -1)
    printf '%-22s rc=%d %s\n' "$name" "$rc" "${summary:-(no summary: the run did not finish)}"
    [[ $rc -eq 0 && $summary =~ (^|[^0-9])0\ errors ]] || status=1
}
run mem_causal128 memcheck causal 128
run mem_noop128 memcheck noop 128
run sync_causal128 synccheck causal 128
run sync_noop128 synccheck noop 128
run race_causal128 racecheck causal 128
run race_causal128_det racecheck causal 128 -- --deterministic
run race_causal128_pairs racecheck causal 128 FLEXGEN_BWD_HEAD_PAIRS=1
run race_causal64 racecheck causal 64
run race_noop128 racecheck noop 128
run race_sliding128 racecheck sliding_window 128
run race_alibi128 racecheck alibi 128
run race_softcap64 racecheck softcap 64
run race_lg128_lead racecheck local_global 128 FLEXGEN_BWD_LEAD_TILES=2
exit $status
