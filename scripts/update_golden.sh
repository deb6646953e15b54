#!/bin/sh
# update_golden.sh -- regenerate tests/golden/*.cu with the flexgen tool.
#
# tests/test_emit.c compares the emitter's output byte for byte with these
# files. After an intended change to src/codegen/emit.c, src/codegen/source.c or a template,
# run this, read the diff (git diff tests/golden) and commit it with the
# change. Usage: scripts/update_golden.sh [path/to/flexgen]
# (default: build/tools/flexgen). Paths in the files are relative to the
# source root, so the script runs there.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cli=${1:-build/tools/flexgen}
case "$cli" in /*) ;; *) cli="$root/$cli" ;; esac
[ -x "$cli" ] || { echo "update_golden.sh: no flexgen at $cli (build first)" >&2; exit 1; }
mkdir -p tests/golden
for mod in causal sliding_window alibi; do
    "$cli" --mask "mods/$mod.c" --emit mod -o "tests/golden/$mod.mod.cu"
    "$cli" --mask "mods/$mod.c" -o "tests/golden/$mod.attention_fwd.cu"
done
echo "regenerated $(ls tests/golden/*.cu | wc -l) golden files in tests/golden"
