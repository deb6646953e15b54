#!/usr/bin/env bash
# Run the GPU test executables and the examples straight from a build folder
# (for a GPU machine where `meson test` cannot run on the build folder, e.g.
# one copied from another machine). Usage: scripts/gpu_suite.sh BUILD [OUTDIR]
# Prints one line per program and exits non-zero when any of them failed.
set -u
build=${1:?usage: scripts/gpu_suite.sh BUILD [OUTDIR]}
out=${2:-/tmp/flexgen-gpu-suite}
mkdir -p "$out"
export FLEXGEN_SOURCE_ROOT=${FLEXGEN_SOURCE_ROOT:-$PWD}
export FLEXGEN_CACHE_DIR=${FLEXGEN_CACHE_DIR:-$out/cache}
[ -d "$build/devlib" ] && export LD_LIBRARY_PATH="$build/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Context parallelism needs libnccl: the one PyTorch's nvidia-nccl wheel
# ships when nothing else is named, and NVLink multicast off.
if [ -z "${FLEXGEN_NCCL_LIB:-}" ]; then
    nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    [ -n "$nccl" ] && [ -f "$nccl" ] && export FLEXGEN_NCCL_LIB=$nccl
fi
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
fail=0
run() { # name, command...  (exit 77: skipped, as meson counts it)
    local name=$1; shift
    local t0=$(date +%s%N)
    "$@" >"$out/$name.log" 2>&1
    local rc=$?
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '%-28s rc=%-3d %6d ms%s\n' "$name" "$rc" "$ms" "$([ $rc -eq 77 ] && echo '  (skipped)')"
    [ $rc -eq 0 ] || [ $rc -eq 77 ] || fail=1
}
for t in gpu_jit gpu_blockmask gpu_split gpu_attention gpu_attention_bwd gpu_attention_decode gpu_capture gpu_cp; do
    [ -x "$build/tests/$t" ] && run "$t" "$build/tests/$t"
done
# gpu_cp again with both ranks on GPU 0 through the loopback communicator
# (tests/loopback_nccl.c): one GPU and no NCCL needed.
loopback=$build/tests/libloopback_nccl.so
[ -x "$build/tests/gpu_cp" ] && [ -f "$loopback" ] &&
    run gpu_cp_loopback env FLEXGEN_NCCL_LIB="$loopback" "$build/tests/gpu_cp"
for e in causal sliding_window document_packing alibi serving_loop train_step context_parallel; do
    [ -x "$build/examples/$e" ] && run "example_$e" "$build/examples/$e"
done
[ -x "$build/examples/serving_loop" ] && run example_serving_loop_graph "$build/examples/serving_loop" --graph
[ -x "$build/examples/custom_mod" ] && run example_custom_mod "$build/examples/custom_mod" mods/softcap.c
exit $fail
