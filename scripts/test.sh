#!/usr/bin/env bash
# Set up and run the whole test suite: installs what is missing, builds,
# runs `meson test` (suites cpu and gpu; gpu tests are reported as skipped
# without a CUDA device), then builds the cpu suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer and runs it, and last
# installs the Python package with `pip install .` into a fresh virtual
# environment and checks it (python/test_install.py).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v meson >/dev/null 2>&1 || need+=(meson)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
pkg-config --exists cmocka 2>/dev/null || need+=(libcmocka-dev)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
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

jobs=$(nproc 2>/dev/null || echo 2)

echo "== build (debugoptimized)"
[ -d build/meson-private ] || meson setup build -Dtests=enabled
meson compile -C build
echo "== meson test (suites cpu and gpu)"
meson test -C build --print-errorlogs --num-processes "$jobs"

echo "== cpu suite under address,undefined sanitizers"
[ -d build-asan/meson-private ] || meson setup build-asan -Dtests=enabled -Dpython_tests=false -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debug
meson compile -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-asan --suite cpu --print-errorlogs --num-processes "$jobs"
echo "== pip install . in a fresh virtual environment, then the installed package"
venv=$(mktemp -d)
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet .
# run from a copy: beside python/flexgen.py the import would find the source
cp python/test_install.py "$venv/"
(cd "$venv" && "$venv/bin/python" test_install.py)
rm -rf "$venv"
echo "== all tests passed"
