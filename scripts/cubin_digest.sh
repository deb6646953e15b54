#!/usr/bin/env bash
# cubin_digest.sh -- one line per generated kernel: the SHA-256 of its cubin
# and of its CUDA source with comments and #line directives removed.
#
# A change that should not alter any kernel (a restructuring, a rename, a
# comment) is checked by running this before and after and diffing the two
# files: every gallery mod x every kernel the CLI can print (portable and
# Hopper forward, block-mask builder) x bf16/fp16 x head dims, for sm_90a and
# sm_80. Compiles with NVRTC only: no GPU needed.
#
# Usage: scripts/cubin_digest.sh [FLEXGEN_CLI] > digest.txt
#        (default CLI: build/tools/flexgen; run from anywhere)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cli=${1:-$root/build/tools/flexgen}
case "$cli" in /*) ;; *) cli="$PWD/$cli" ;; esac
[ -x "$cli" ] || { echo "cubin_digest.sh: no flexgen at $cli (build first)" >&2; exit 1; }
cd "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One job per line: mod kernel dtype head_dim arch
jobs() {
    for m in mods/*.c; do
        mod=$(basename "$m" .c)
        for dt in bf16 fp16; do
            for d in 32 64 96 128 256; do echo "$mod attention $dt $d sm_90a"; done
            echo "$mod attention $dt 128 sm_80"
            for d in 64 128; do echo "$mod attention-sm90 $dt $d sm_90a"; done
        done
        echo "$mod blockmask bf16 128 sm_90a"
    done
}

one() { # mod kernel dtype head_dim arch
    local out="$work/$1.$2.$3.$4.$5"
    local args=(--mask "mods/$1.c" --kernel "$2" --dtype "$3" --head-dim "$4" --arch "$5")
    "$cli" "${args[@]}" --emit cubin -o "$out.cubin" 2>"$out.err" || { echo "$* compile-failed"; return; }
    "$cli" "${args[@]}" --emit cuda -o "$out.cu"
    # Comments (block and line) and #line directives do not count.
    local src
    src=$(python3 -c '
import re, sys
t = open(sys.argv[1]).read()
t = re.sub(r"/\*.*?\*/", "", t, flags=re.S)
t = re.sub(r"//[^\n]*", "", t)
t = "\n".join(l.rstrip() for l in t.split("\n") if not l.startswith("#line") and l.strip())
sys.stdout.write(t)' "$out.cu" | sha256sum | cut -c1-16)
    echo "$* cubin=$(sha256sum < "$out.cubin" | cut -c1-16) source=$src"
}
export -f one
export cli work
export FLEXGEN_DISK_CACHE=0
jobs | xargs -P "$(nproc)" -L 1 bash -c 'one "$@"' _ | sort
