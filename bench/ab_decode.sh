#!/usr/bin/env bash
# ab_decode.sh -- two builds of flexgen's decode path timed against each other,
# alternated in one run on one GPU (bench/ab_check.sh's method for the
# decode kernel): bench/compare_decode.py with flexgen alone, first build A,
# then B, ROUNDS times, each build with a kernel cache of its own (its first
# round compiles).
#
#   bench/ab_decode.sh A_ROOT A_BUILD B_ROOT B_BUILD [MODS] [DIMS] [ROUNDS]
#
# A_ROOT / B_ROOT are source trees, A_BUILD / B_BUILD build folders relative
# to them or absolute (scripts/build_rev.sh makes one of another revision);
# the library each run loads is BUILD/src/libflexgen.so. MODS (default
# "causal softcap") are compare_decode's mods, DIMS (default "128") head
# dims, ROUNDS (default 2). PAGES (default 16), PAGE_LAYOUTS (nhd when
# unset), SHAPES (compare_decode's four when unset) and FLUSH (write when
# unset: compare_decode's --flush) pass through;
# A_ENV / B_ENV (assignments, e.g. "FLEXGEN_DECODE_HEAD_PAIRS=0") set a
# build's environment, so one build can run against itself under two
# options. STOP_AFTER (seconds) starts no round past that time, so that a
# run under a limit still prints its means. Prints compare_decode's lines,
# each prefixed with its build's label and head dim (a run that printed
# none: the end of its output instead), then the means over the rounds of
# each row and layout, B against A in percent.
set -uo pipefail
[ $# -ge 4 ] || { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 2; }
a_root=$(cd "$1" && pwd); a_build=$2; b_root=$(cd "$3" && pwd); b_build=$4
mods=${5:-causal softcap}
dims=${6:-128}
rounds=${7:-2}
here=$(cd "$(dirname "$0")" && pwd)
abs() { case $2 in /*) echo "$2" ;; *) echo "$1/$2" ;; esac; }
a_lib=$(abs "$a_root" "$a_build")/src/libflexgen.so
b_lib=$(abs "$b_root" "$b_build")/src/libflexgen.so
for lib in "$a_lib" "$b_lib"; do [ -e "$lib" ] || { echo "ab_decode.sh: no $lib" >&2; exit 2; }; done
caches=$(mktemp -d)
trap 'rm -rf "$caches"' EXIT
export PYTHONUNBUFFERED=1
one() { # label root lib d [assignments]
    local out
    out=$(env ${5:-} FLEXGEN_LIB=$3 FLEXGEN_SOURCE_ROOT=$2 FLEXGEN_CACHE_DIR=$caches/$1 python3 "$here/compare_decode.py" \
        --head-dim "$4" --mods "${mods// /,}" --pages "${PAGES:-16}" ${PAGE_LAYOUTS:+--page-layouts "$PAGE_LAYOUTS"} ${SHAPES:+--shapes "$SHAPES"} ${FLUSH:+--flush "$FLUSH"} \
        --systems flexgen --warmup 10 --rep 50 2>&1)
    if grep -q "TB/s" <<<"$out"; then
        grep "TB/s" <<<"$out" | sed "s/^/$1 D=$4 /"
    else
        echo "$1 D=$4 (no timing:)"
        tail -5 <<<"$out" | sed "s/^/    /"
    fi
}
# STOP_AFTER (seconds, unset: none) starts no round past that time since
# the start, so that a run under a time limit still ends with its means
# (over the rounds it ran; a row A and B did not both run is left out).
start=$(date +%s)
for d in $dims; do
    for ((r = 0; r < rounds; r++)); do
        if [ -n "${STOP_AFTER:-}" ] && [ $(($(date +%s) - start)) -ge "$STOP_AFTER" ]; then
            echo "STOP_AFTER=$STOP_AFTER s reached: D=$d round $((r + 1)) and after not run"
            break 2
        fi
        one A "$a_root" "$a_lib" "$d" "${A_ENV:-}"
        one B "$b_root" "$b_lib" "$d" "${B_ENV:-}"
    done
done | tee "$caches/lines"
# The means over the rounds, a line per (head dim, mod, shape, layout): A's
# TB/s, B's and B against A, and the rounds behind them where fewer than
# ROUNDS ran.
echo "means over $rounds rounds (TB/s):"
awk '{
    for (i = 7; i + 2 <= NF; i++)
        if ($(i + 2) == "TB/s" && $(i + 1) ~ /^[0-9.]+$/) {
            k = sprintf("%s %-15s %-5s %-9s %-4s %-16s", $2, $3, $4, $5, $6, $i)
            s[k, $1] += $(i + 1); n[k, $1]++
            if (!(k in seen)) { seen[k] = 1; order[++m] = k }
        }
} END {
    for (j = 1; j <= m; j++) {
        k = order[j]
        if (n[k, "A"] && n[k, "B"]) {
            a = s[k, "A"] / n[k, "A"]; b = s[k, "B"] / n[k, "B"]
            printf "  %s  A %.3f  B %.3f  %+.1f%%%s\n", k, a, b, 100 * (b / a - 1),
                   n[k, "A"] < rounds || n[k, "B"] < rounds ? sprintf("  (%d / %d rounds)", n[k, "A"], n[k, "B"]) : ""
        }
    }
}' rounds="$rounds" "$caches/lines"
