#!/usr/bin/env bash
# fuzz.sh -- run the libFuzzer target over the mod front end and evaluator.
#
#   scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
#
# Builds fuzz/fuzz_mod.c with clang -fsanitize=fuzzer,address,undefined
# together with the library sources that do not need CUDA at link time for
# this path, then runs it for SECONDS (default 60) on a scratch copy of the
# seed corpus (fuzz/corpus is only read). Crashes land in build-fuzz/ as
# crash-* files; replay one with `build-fuzz/fuzz_mod build-fuzz/crash-...`.
# Without clang the script says so and exits 0: the meson test
# fuzz_mod_replay still replays the corpus through the same entry point.
set -euo pipefail

seconds=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build-fuzz
cc=${CLANG:-clang}

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "fuzz.sh: $cc not found; skipping the libFuzzer run" >&2
    exit 0
fi

mkdir -p "$out/corpus"
cp -n "$root"/fuzz/corpus/* "$out/corpus/" 2>/dev/null || true

# The library is built from source here, so the sanitizers and the
# coverage instrumentation see all of it.
cuda_inc=()
for d in /usr/local/cuda/include /usr/include; do
    [ -f "$d/nvrtc.h" ] && cuda_inc=(-I"$d") && break
done
# The library's sources and include folders: src/ and its stage folders
# (src/meson.build lists the same files), and every template.
mapfile -t srcs < <(find "$root/src" -name '*.c' | sort)
incs=(-I"$root/include")
while read -r d; do incs+=(-I"$d"); done < <(find "$root/src" -type d | sort)
mapfile -t templates < <(find "$root/templates" -name '*.cuh' | sort)
python3 "$root/scripts/embed_templates.py" "$out/templates.c" "$root/templates" "${templates[@]}"
srcs+=("$out/templates.c")

cuda_lib=()
for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -f "$d/libnvrtc.so" ] && cuda_lib=(-L"$d" -Wl,-rpath,"$d" -lnvrtc) && break
done

"$cc" -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined -DFLEXGEN_BUILDING \
    "${incs[@]}" "${cuda_inc[@]}" \
    "$root/fuzz/fuzz_mod.c" "${srcs[@]}" \
    "${cuda_lib[@]}" -ldl -lm -lpthread -o "$out/fuzz_mod"

cd "$out"
exec ./fuzz_mod -max_total_time="$seconds" -max_len=4096 -timeout=10 \
    -rss_limit_mb=4096 -dict="$root/fuzz/mod.dict" "$@" corpus
