#!/usr/bin/env bash
# Run the GPU test executables and the examples straight from a build folder
# (for a GPU machine where `meson test` cannot run on the build folder, e.g.
# one copied from another machine). Usage: scripts/gpu_suite.sh BUILD [OUTDIR]
# Prints one line per program (or shard) and exits non-zero when any of them
# failed.
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
# The programs run side by side, FLEXGEN_SUITE_JOBS at a time (default: the
# machine's cores): their time goes mostly to NVRTC compiles, which use one
# CPU core each, so on a GPU machine with many cores the suite takes a
# fraction of its serial time. None of them times anything it checks. Each
# program (or shard) has a kernel cache folder of its own under
# $FLEXGEN_CACHE_DIR.
jobs_max=${FLEXGEN_SUITE_JOBS:-$(nproc 2>/dev/null || echo 8)}
cache_root=$FLEXGEN_CACHE_DIR
names=()
run() { # name, command...  (exit 77: skipped, as meson counts it)
    local name=$1; shift
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    (
        t0=$(date +%s%N)
        FLEXGEN_CACHE_DIR=$cache_root/$name "$@" >"$out/$name.log" 2>&1
        rc=$?
        echo "$rc $(( ($(date +%s%N) - t0) / 1000000 ))" >"$out/$name.rc"
    ) &
}

# One line per program: its exit code and time, or "not finished" where a
# stop (a time limit's TERM) came first; sets `fail`.
summary() {
    fail=0
    for name in "${names[@]}"; do
        local rc ms note=""
        if ! { read -r rc ms <"$out/$name.rc"; } 2>/dev/null; then
            printf '%-44s rc=%-3s %6s ms  (not finished)\n' "$name" - -
            fail=1
            continue
        fi
        [ "$rc" -eq 77 ] && note="  (skipped)"
        # a shard whose filter matched no test ran nothing: count it as failed
        if [ "$rc" -eq 0 ] && [[ $name == *.* ]] && ! grep -Eq 'PASSED  \] [1-9][0-9]* test' "$out/$name.log"; then
            rc=1 note="  (no test matched its filter)"
        fi
        # a Python class whose every test skipped (ContextParallel on one GPU)
        if [ "$rc" -eq 0 ] && [[ $name == python_* ]] && grep -q '^0 passed' "$out/$name.log"; then
            rc=77 note="  (skipped: every test of the class skipped)"
        fi
        printf '%-44s rc=%-3d %6d ms%s\n' "$name" "$rc" "$ms" "$note"
        [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || fail=1
    done
}
# A stop before the end (timeout's TERM, or ^C): the programs still
# running are ended and the summary shows those that finished, so a device
# call cut short by its time limit still says what passed. Exit 124.
# shellcheck disable=SC2317 # run by the trap below
on_stop() {
    trap - TERM INT
    local p
    for p in $(jobs -p); do
        pkill -TERM -P "$p" 2>/dev/null
        kill -TERM "$p" 2>/dev/null
    done
    wait
    echo "gpu_suite.sh: stopped before every program finished"
    summary
    exit 124
}
trap on_stop TERM INT

# The three long programs run in shards, one process per test
# (FLEXGEN_TEST_FILTER, a cmocka name): whole, each takes longer than a
# device call may (gpu_attention_bwd alone ran past 600 s). The names are
# read from the program's own table of tests (tests/NAME.c: MODE_TEST(f,
# mode) is "f/mode", cmocka_unit_test(f) and _setup(f, ..) are "f"); a shard
# that runs no test fails (see below), so a name read wrongly shows.
shards() { # program: its test names, one per line (none: run it whole)
    case $1 in
    gpu_attention_bwd | gpu_attention | gpu_attention_decode)
        sed -nE 's/^[[:space:]]*MODE_TEST\(([A-Za-z0-9_]+), ([A-Za-z0-9_]+)\).*/\1\/\2/p
                 s/^[[:space:]]*cmocka_unit_test(_setup)?\(([A-Za-z0-9_]+).*/\2/p' \
            "$FLEXGEN_SOURCE_ROOT/tests/$1.c" | awk '!seen[$0]++' ;;
    esac
}
# FLEXGEN_SUITE_PROGRAMS, when set, names the programs to run (e.g.
# "gpu_attention_bwd train_step": test programs and examples by name);
# unset, every one runs.
programs=${FLEXGEN_SUITE_PROGRAMS:-}
wanted() { [ -z "$programs" ] || [[ " $programs " == *" $1 "* ]]; }
for t in gpu_attention_bwd gpu_attention gpu_attention_decode gpu_jit gpu_blockmask gpu_split gpu_capture gpu_cp; do
    wanted "$t" || continue
    [ -x "$build/tests/$t" ] || continue
    filters=$(shards "$t")
    if [ -z "$filters" ]; then
        run "$t" "$build/tests/$t"
        continue
    fi
    while read -r f; do
        run "$t.$(printf '%s' "$f" | tr -c 'A-Za-z0-9_' '_' | sed 's/_*$//')" env FLEXGEN_TEST_FILTER="$f" "$build/tests/$t"
    done <<<"$filters"
done
# gpu_cp again with both ranks on GPU 0 through the loopback communicator
# (tests/loopback_nccl.c): one GPU and no NCCL needed.
loopback=$build/tests/libloopback_nccl.so
[ -x "$build/tests/gpu_cp" ] && [ -f "$loopback" ] && wanted gpu_cp &&
    run gpu_cp_loopback env FLEXGEN_NCCL_LIB="$loopback" "$build/tests/gpu_cp"
for e in causal sliding_window document_packing alibi serving_loop train_step context_parallel; do
    [ -x "$build/examples/$e" ] && wanted "$e" && run "example_$e" "$build/examples/$e"
done
[ -x "$build/examples/serving_loop" ] && wanted serving_loop && run example_serving_loop_graph "$build/examples/serving_loop" --graph
[ -x "$build/examples/custom_mod" ] && wanted custom_mod && run example_custom_mod "$build/examples/custom_mod" mods/softcap.c
# The Python wrapper's GPU classes (python/test_flexgen.py; its CPU classes
# run in `meson test`), one process each, on this build's library: they
# need torch (without it the file exits 77, skipped). "python" in
# FLEXGEN_SUITE_PROGRAMS names them all.
if [ -f "$build/src/libflexgen.so" ]; then
    for c in Gpu GpuBackward TorchCompile CudaGraphs ContextParallel; do
        { wanted python || wanted "python_$c"; } || continue
        run "python_$c" env FLEXGEN_LIB="$build/src/libflexgen.so" \
            python3 "$FLEXGEN_SOURCE_ROOT/python/test_flexgen.py" "$c"
    done
fi
wait
summary
exit $fail
