#!/usr/bin/env bash
# The main job in one command: install what is missing, build flexgen in
# release mode, show the CUDA it generates for a gallery mod, compile that
# with NVRTC to a cubin, and run the causal example. Everything but the last
# step's GPU part works without a GPU; there the example does its CPU part
# and says "no CUDA device: skipping the GPU part".
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v meson >/dev/null 2>&1 || need+=(meson)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing: ${need[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y "${need[@]}" || { $SUDO apt-get update && $SUDO apt-get install -y "${need[@]}"; }
fi

# The CUDA toolkit: nvcc's folder on PATH lets meson find it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi

build=build-release
echo "== build ($build, release)"
[ -d $build/meson-private ] || meson setup $build --buildtype=release
meson compile -C $build

flexgen=$build/tools/flexgen
mod=mods/sliding_window.c
out=$build/demo
mkdir -p $out

echo
echo "== the mod: $mod"
cat $mod

echo
echo "== flexgen --mask $mod  (the generated CUDA, saved to $out/sliding_window.cu)"
$flexgen --mask $mod >$out/sliding_window.cu
# The part made from the mod (re-emitted from the checked tree, with #line
# directives back to the file); the rest is the template around it.
awk '/---- the mod:/{p=1} /==== templates\//{if(p)exit} p' $out/sliding_window.cu
echo "... $(wc -l <$out/sliding_window.cu) lines in all, template included: less $out/sliding_window.cu"

echo
echo "== flexgen --mask $mod --emit cubin -o $out/sliding_window.cubin  (NVRTC, no GPU needed)"
start=$(date +%s%N)
$flexgen --mask $mod --emit cubin -o $out/sliding_window.cubin
end=$(date +%s%N)
echo "$(wc -c <$out/sliding_window.cubin) bytes in $(( (end - start) / 1000000 )) ms"

echo
echo "== flexgen blockmask --mask $mod --q-len 2048  (the block mask, CPU builder)"
$flexgen blockmask --mask $mod --q-len 2048

echo
echo "== examples/causal (one causal attention call, checked against the CPU reference)"
$build/examples/causal
echo
echo "== done: more in README.md; run the tests with: bash scripts/test.sh"
