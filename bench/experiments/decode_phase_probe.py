#!/usr/bin/env python3
"""decode_phase_probe.py -- medians of decode-phase-probe.patch's PROBE lines.

    python3 bench/experiments/decode_phase_probe.py FILE

FILE holds a run's output (decode_phase_probe.sh): one PROBE line per block
of KV head 0 and sequence 0 per call. Calls are told apart by their
blocks' start times (globaltimer): a gap of more than 20 us starts a new
call. Prints, for each of the last three calls, the number of blocks that
walk a tile or more and the medians of their phases (SM cycles from the
block's start) and of their start skew (ns after the call's first block).
"""
import re
import statistics
import sys

PHASES = ("plan", "page", "issue", "first", "loop", "merge", "end")
LINE = re.compile(r"PROBE (\w+) split (\d+) n (\d+) gt0 (\d+) " + " ".join(f"{p} (-?\\d+)" for p in PHASES))


def main():
    blocks = []
    for line in open(sys.argv[1]):
        m = LINE.search(line)
        if m:
            blocks.append((int(m.group(4)), int(m.group(3)), [int(m.group(5 + i)) for i in range(len(PHASES))]))
    if not blocks:
        print("  no PROBE lines")
        return
    blocks.sort()
    calls, cur = [], [blocks[0]]
    for blk in blocks[1:]:
        if blk[0] - cur[-1][0] > 20000:
            calls.append(cur)
            cur = []
        cur.append(blk)
    calls.append(cur)
    print("  call  blocks  walking  " + "  ".join(f"{p:>6}" for p in PHASES) + "  skew_ns")
    last = calls[-3:]
    for i, call in enumerate(last):
        t0 = call[0][0]
        walking = [b for b in call if b[1] > 0]
        if not walking:
            continue
        med = [int(statistics.median(b[2][k] for b in walking)) for k in range(len(PHASES))]
        skew = int(statistics.median(b[0] - t0 for b in walking))
        print(f"  {len(calls) - len(last) + i:4d}  {len(call):6d}  {len(walking):7d}  " + "  ".join(f"{v:6d}" for v in med) +
              f"  {skew:7d}")


if __name__ == "__main__":
    main()
