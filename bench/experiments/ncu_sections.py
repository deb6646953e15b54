#!/usr/bin/env python3
"""ncu_sections.py -- a Hopper forward's warp stall samples by section of
its consumers' code, from ncu's source page as CSV (`ncu --import REP --page
source --print-source sass --csv`; fwd_ncu_source.sh makes it).

The consumers' code lies between the warp group's register allocation
(USETMAXREG.TRY_ALLOC) and the producer's release (USETMAXREG.DEALLOC); a
kernel without them (the decode walk) is read whole. In it the longest
backward branch closes the walk loop (one q tile a turn) and the longest
one inside it the tile loop; the sections are the walk's prologue (walk top
to tile loop), the tile loop, and the walk's end (the last P V, the store). Prints each section's share of the consumer samples, the
consumers' stall reasons, and the instructions that hold the most samples.

    python3 bench/experiments/ncu_sections.py src.csv [TOP]
"""
import csv
import sys


def main(path, top=12):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], [r for r in rows[head + 1:] if r and r[0].startswith("0x")]
    ix = {h: i for i, h in enumerate(hdr)}
    samples = [int(r[ix["Warp Stall Sampling (All Samples)"]] or 0) for r in data]
    addr = {int(r[0], 16): n for n, r in enumerate(data)}
    # without the forward's split (the decode walk, say): the whole kernel
    lo = next((n for n, r in enumerate(data) if "TRY_ALLOC" in r[1]), 0)
    hi = next((n for n, r in enumerate(data) if "DEALLOC" in r[1]), len(data))

    def back_branches(a, b):
        """(target, branch) of backward branches in [a, b), longest first"""
        out = []
        for n in range(a, b):
            t = data[n][1]
            if "BRA" not in t or "0x" not in t:
                continue
            tgt = addr.get(int(t.split("0x")[-1].split()[0].rstrip(";"), 16))
            if tgt is not None and tgt < n:
                out.append((tgt, n))
        return sorted(out, key=lambda x: x[0] - x[1])

    loops = back_branches(lo, hi)
    walk = loops[0] if loops else (lo, hi - 1)
    inner = back_branches(walk[0] + 1, walk[1])
    tile = inner[0] if inner else walk
    total = sum(samples[lo:hi]) or 1
    cuts = [("before the walks", lo, walk[0]), ("walk prologue", walk[0], tile[0]),
            ("tile loop", tile[0], tile[1] + 1), ("walk end", tile[1] + 1, walk[1] + 1), ("after", walk[1] + 1, hi)]
    print(f"{path}: {sum(samples)} samples, consumers' code {100 * total / max(sum(samples), 1):.1f}%")
    for name, a, b in cuts:
        print(f"  {name:16s} SASS {a:5d}-{b - 1:5d}  {100 * sum(samples[a:b]) / total:5.1f}% of the consumers' samples")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    by = {h[6:]: sum(int(data[n][ix[h]] or 0) for n in range(lo, hi)) for h in reasons}
    print("  stall reasons: " + ", ".join(f"{k} {100 * v / total:.1f}" for k, v in sorted(by.items(), key=lambda x: -x[1])[:8]))
    for n in sorted(range(lo, hi), key=lambda n: -samples[n])[:top]:
        print(f"  {n:5d} {100 * samples[n] / total:5.1f}%  {data[n][1].strip()[:70]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12)
