#!/usr/bin/env python3
"""decode_half_splits_model.py -- decode-half-tile-splits.patch's ranges, checked without a GPU.

fgd_decode (with the patch, HS) gives split s of n_split the half tiles
[u0, u1) of the plan's 2 n_items, walks tiles [u0 / 2, ceil(u1 / 2)) and
gives away the first half of its first tile when u0 is odd and the second
half of its last when u1 is odd (half_out). This checks that every half of
every item is walked by exactly one split, and prints the longest split's
work in tiles against whole-tile splits for a few short walks.
"""


def ranges(n_items, n_split, hu):
    units = hu * n_items
    per = (units + n_split - 1) // n_split
    for s in range(n_split):
        u0 = min(units, s * per)
        u1 = min(units, u0 + per)
        it0 = u0 // hu
        it1 = (u1 + hu - 1) // hu if u1 > u0 else it0
        n = it1 - it0
        first = 1 if hu == 2 and u0 & 1 else 0
        last = 2 if hu == 2 and u1 & 1 else 0
        yield [(it0 + t, (first if t == 0 else 0) | (last if t == n - 1 else 0)) for t in range(n)]


def main():
    for n_items in range(70):
        for n_split in range(1, 40):
            cover = [0] * (2 * n_items)
            for tiles in ranges(n_items, n_split, 2):
                for tile, out in tiles:
                    assert out != 3, "a tile with both halves given away"
                    for h in range(2):
                        if not (out >> h) & 1:
                            cover[2 * tile + h] += 1
            assert all(c == 1 for c in cover), (n_items, n_split, cover)
    print("every half of every item walked once (0-69 items, 1-39 splits)")
    for n_items, n_split in ((9, 8), (9, 4), (9, 2), (9, 32), (256, 8), (1024, 32)):
        whole = max(len(t) for t in ranges(n_items, n_split, 1))
        half = max(sum(1 if out == 0 else 0.5 for _, out in t) for t in ranges(n_items, n_split, 2))
        print(f"{n_items:5d} tiles in {n_split:2d} splits: longest split {whole} tiles whole, {half:g} in halves")


if __name__ == "__main__":
    main()
