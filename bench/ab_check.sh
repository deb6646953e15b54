#!/usr/bin/env bash
# ab_check.sh -- two builds of flexgen timed against each other, alternated
# in one run on one GPU (the way a kernel change is measured: the same
# machine, clocks and inputs, A and B interleaved so that drift hits both).
#
#   bench/ab_check.sh A_ROOT A_BUILD B_ROOT B_BUILD [MODS] [DIMS] [ROUNDS]
#
# A_ROOT / B_ROOT are source trees (their templates are read at run time,
# so each build needs its own), A_BUILD / B_BUILD build folders relative to
# them or absolute. MODS (default "noop causal sliding_window local_global
# dilated") are gallery names; DIMS (default "64 128") head dims; ROUNDS
# (default 2) how often each pair runs. Every run is
#   flexgen check --mask mods/M.c --batch 4 --heads 16 --q-len 8192
#                 --head-dim D --block-mask --time 20 --no-reference
# (with --score mods/M.c too where the file has a score_mod; noop: --score
# mods/noop.c, no block mask; alibi, document and flamingo with their
# buffers) with
# the mod files of A_ROOT
# for both builds, and prints one line: label, mod, head dim, the median
# time and TFLOP/s. EXTRA, when set, is added to every command (e.g.
# "--backward"). SUSTAIN_MS, when set, runs each timed call that many
# milliseconds before its timing (flexgen check --sustain-ms: the clock
# under sustained load, attention_notes v51). MORE, when set, names
# further builds as "ROOT:BUILD ...", labelled C, D, ... and alternated
# with A and B (several changes, each alone and together, in one run).
# Each build gets a kernel cache of its own, filled first by small runs
# side by side (NVRTC's compiles, one core each, would otherwise take most
# of the time), so that the timed runs only load. With nvidia-smi on the
# machine and SUSTAIN_MS set, each line ends with the run's mean board
# power and SM clock (bench/clock_sample.sh). A run that has not ended
# after AB_TIMEOUT seconds (default 120) is stopped and its line says so,
# and the others go on (a kernel that hangs once in thousands of launches,
# as the first form of attention_notes f28 did, then costs one line).
set -uo pipefail
[ $# -ge 4 ] || { sed -n 2,34p "$0"; exit 2; }
a_root=$(cd "$1" && pwd); a_build=$2; b_root=$(cd "$3" && pwd); b_build=$4
mods=${5:-noop causal sliding_window local_global dilated}
dims=${6:-64 128}
rounds=${7:-2}
abs() { case $2 in /*) echo "$2" ;; *) echo "$1/$2" ;; esac; }
a_cli=$(abs "$a_root" "$a_build")/tools/flexgen
b_cli=$(abs "$b_root" "$b_build")/tools/flexgen
labels=(A B) roots=("$a_root" "$b_root") clis=("$a_cli" "$b_cli")
for more in ${MORE:-}; do
    root=$(cd "${more%%:*}" && pwd) || exit 2
    letters=ABCDEFGHIJ
    labels+=("${letters:${#labels[@]}:1}") roots+=("$root") clis+=("$(abs "$root" "${more#*:}")/tools/flexgen")
done
for cli in "${clis[@]}"; do [ -x "$cli" ] || { echo "ab_check.sh: no $cli" >&2; exit 2; }; done
caches=$(mktemp -d)
trap 'rm -rf "$caches"' EXIT

# shellcheck source=bench/gallery_args.sh
. "$(dirname "$0")/gallery_args.sh"
# shellcheck source=bench/clock_sample.sh
. "$(dirname "$0")/clock_sample.sh"
gallery_buffers "$caches"
mod_args() { gallery_mod_args "$a_root" "$caches" "$1"; } # the mod files of A_ROOT for both builds
warm() { # label root cli mod d: compile (and cache) the kernels of one pair on a small shape
    # shellcheck disable=SC2046
    FLEXGEN_SOURCE_ROOT=$2 FLEXGEN_CACHE_DIR=$caches/$1/$4.$5 timeout "${AB_TIMEOUT:-120}" "$3" check $(mod_args "$4") --batch 1 \
        --heads 2 --q-len 256 --head-dim "$5" --no-reference ${EXTRA:-} >/dev/null 2>&1
}
one() { # label root cli mod d
    local label=$1 root=$2 cli=$3 mod=$4 d=$5 line out rc
    clock_start "$caches/clock.csv"
    # shellcheck disable=SC2046
    out=$(FLEXGEN_SOURCE_ROOT=$root FLEXGEN_CACHE_DIR=$caches/$label/$mod.$d timeout "${AB_TIMEOUT:-120}" "$cli" check \
        $(mod_args "$mod") --batch 4 --heads 16 --q-len 8192 --head-dim "$d" --time 20 \
        ${SUSTAIN_MS:+--sustain-ms "$SUSTAIN_MS"} --no-reference ${EXTRA:-} 2>&1)
    rc=$?
    line=$(grep -i "median" <<<"$out" | sed 's/^ *//' | tr '\n' ' ')
    [ "$rc" -eq 124 ] && line="(no timing: stopped after ${AB_TIMEOUT:-120} s) "
    clock_stop
    printf '%s %-15s D=%-4s %s%s\n' "$label" "$mod" "$d" "${line:-(no timing: the check failed) }" \
        "$(clock_summary "$caches/clock.csv")"
}
for d in $dims; do
    for mod in $mods; do
        for i in "${!labels[@]}"; do warm "${labels[$i]}" "${roots[$i]}" "${clis[$i]}" "$mod" "$d" & done
    done
done
wait
for d in $dims; do
    for mod in $mods; do
        for ((r = 0; r < rounds; r++)); do
            for i in "${!labels[@]}"; do one "${labels[$i]}" "${roots[$i]}" "${clis[$i]}" "$mod" "$d"; done
        done
    done
done
