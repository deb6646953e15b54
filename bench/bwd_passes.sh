#!/usr/bin/env bash
# bwd_passes.sh -- where one backward call's time goes, pass by pass: the
# preprocess (delta, lse * log2(e)), the dK/dV pass, the dQ conversion
# (and the deterministic dQ pass or the buffer-gradient conversion where
# they run), each timed by ncu with the clocks left alone, beside the
# whole call as `flexgen check --time` measures it; what the kernels do
# not account for is the accumulators' memsets and the gaps between
# launches.
#
#   bench/bwd_passes.sh BUILD [MODS] [DIMS]
#
# Run from the repository root on the GPU machine, over a release build
# (BUILD/tools/flexgen; BUILD/devlib joins LD_LIBRARY_PATH when present).
# MODS (default "noop sliding_window document") are gallery names, DIMS
# (default 128) head dims; the shape is bench/ab_check.sh's (B=4 H=16
# S=8192 bf16, the block mask for masked mods, buffer gradients off).
# Prints one line per mod and head dim: the whole call's median, each
# pass's median and its share, and the rest.
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,20p "$0"; exit 2; }
build=$1
mods=${2:-noop sliding_window document}
dims=${3:-128}
cli=$build/tools/flexgen
[ -x "$cli" ] || { echo "bwd_passes.sh: no $cli" >&2; exit 2; }
command -v ncu >/dev/null || { echo "bwd_passes.sh: ncu not found" >&2; exit 2; }
[ -d "$build/devlib" ] && export LD_LIBRARY_PATH="$build/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FLEXGEN_SOURCE_ROOT=${FLEXGEN_SOURCE_ROOT:-$PWD}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export FLEXGEN_CACHE_DIR=$work/cache

# shellcheck source=bench/gallery_args.sh
. "$(dirname "$0")/gallery_args.sh"
gallery_buffers "$work"
for d in $dims; do
    for mod in $mods; do
        # shellcheck disable=SC2046
        set -- $(gallery_mod_args . "$work" "$mod") --batch 4 --heads 16 --q-len 8192 --head-dim "$d" --no-reference \
            --backward --no-buffer-grads
        # the whole call, unprofiled (this also fills the kernel cache)
        whole=$("$cli" check "$@" --time 20 2>&1 | sed -n 's/^time backward.*median \([0-9.]*\) ms.*/\1/p')
        # each backward kernel of the timed launches, profiled
        ncu --clock-control none --kernel-name regex:fg_attention_bwd --metrics gpu__time_duration.sum \
            --csv "$cli" check "$@" --time 5 >"$work/ncu.csv" 2>/dev/null
        python3 - "$work/ncu.csv" "$mod" "$d" "${whole:-0}" <<'EOF'
import csv, statistics, sys
path, mod, d, whole = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
times = {}
with open(path) as f:
    lines = [l for l in f if l.startswith('"')]
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(row["Metric Value"].replace(",", ""))
    unit = row.get("Metric Unit", "ns")  # nsecond, usecond or msecond (ns, us, ms in older ncu)
    ms = v / 1e6 if unit.startswith("n") else v / 1e3 if unit.startswith("u") else v
    name = row["Kernel Name"].split("(")[0].replace("fg_attention_bwd_", "")
    times.setdefault(name, []).append(ms)
parts = {k: statistics.median(v) for k, v in times.items()}
total = sum(parts.values())
line = f"{mod:15s} D={d:<4s} call {whole:.3f} ms"
for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
    line += f" | {k} {v:.3f} ms ({100 * v / whole:.0f}%)" if whole else f" | {k} {v:.3f} ms"
if whole:
    line += f" | rest {whole - total:.3f} ms ({100 * (whole - total) / whole:.0f}%)"
print(line)
EOF
    done
done
