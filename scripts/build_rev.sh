#!/usr/bin/env bash
# build_rev.sh -- a release build of another revision, beside this one, for
# bench/ab_check.sh: the revision's tree (git archive: its templates, which
# its library reads at run time, and its mods) in DEST, its build in DEST/b
# without tests, object files removed so the copy stays small enough to
# travel to a GPU machine.
#   scripts/build_rev.sh REV DEST      e.g. scripts/build_rev.sh exp/fwd-pingpong devrun/pingpong
set -euo pipefail
rev=${1:?usage: scripts/build_rev.sh REV DEST}
dest=${2:?usage: scripts/build_rev.sh REV DEST}
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$dest"
mkdir -p "$dest"
git -C "$root" archive "$rev" | tar -x -C "$dest"
meson setup "$dest/b" "$dest" --buildtype=release -Dtests=disabled -Dpython_tests=false >"$dest/setup.log"
ninja -C "$dest/b" >"$dest/build.log"
find "$dest/b" -name '*.p' -type d -prune -exec rm -rf {} +
echo "$rev built in $dest/b ($(du -sh "$dest" | cut -f1))"
