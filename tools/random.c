/*
 * random.c -- the flexgen tool's pseudo-random numbers: xorshift64*, which is
 * small, fast and good enough for test inputs, and the two ways of turning
 * its top 53 bits into a double. `flexgen check` draws from [0, 1) and
 * `flexgen bench` from (0, 1] (Box-Muller takes the log of it); each keeps
 * its own, so that a seed goes on giving the inputs it always gave.
 *
 * Long tensors are drawn on several threads (fg_cli_rand_fill) without
 * changing a single value: the generator's state step is linear over
 * GF(2), so the state n draws ahead is a 64 x 64 bit matrix power applied
 * to the state now (fg_cli_rand_skip), and each thread starts where one
 * thread drawing everything in order would have been.
 */
#include "base/parallel.h"
#include "cli.h"

static uint64_t next_state(uint64_t x) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    return x;
}

uint64_t fg_cli_rand_u64(uint64_t *state) {
    *state = next_state(*state);
    return *state * 0x2545F4914F6CDD1Dull;
}

double fg_cli_rand_uniform(uint64_t *state) {
    return (double)(fg_cli_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0);
}

double fg_cli_rand_uniform_pos(uint64_t *state) {
    return ((double)(fg_cli_rand_u64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* ---- jumping ahead -------------------------------------------------------- */

/* A linear map of 64-bit vectors over GF(2): col[j] is the image of bit j. */
typedef struct gf2_map {
    uint64_t col[64];
} gf2_map;

static uint64_t gf2_apply(const gf2_map *m, uint64_t x) {
    uint64_t y = 0;
    for (int j = 0; x; j++, x >>= 1)
        if (x & 1) y ^= m->col[j];
    return y;
}

void fg_cli_rand_skip(uint64_t *state, uint64_t draws) {
    gf2_map p; /* the step raised to 2^i, i the bit of `draws` at hand */
    for (int j = 0; j < 64; j++) p.col[j] = next_state(1ull << j);
    uint64_t x = *state;
    while (draws) {
        if (draws & 1) x = gf2_apply(&p, x); /* powers of one map commute */
        draws >>= 1;
        if (draws) {
            gf2_map sq;
            for (int j = 0; j < 64; j++) sq.col[j] = gf2_apply(&p, p.col[j]);
            p = sq;
        }
    }
    *state = x;
}

/* ---- drawing on threads --------------------------------------------------- */

/* Pieces shorter than this are not worth a thread. */
#define FILL_MIN_PIECE ((size_t)1 << 18)

typedef struct fill_piece {
    fg_cli_fill_fn *fill;
    void *arg;
    size_t begin, end;
    uint64_t state;
} fill_piece;

static void fill_run(void *p) {
    fill_piece *f = p;
    f->fill(f->arg, f->begin, f->end, &f->state);
}

void fg_cli_rand_fill(uint64_t *state, size_t n, unsigned draws, fg_cli_fill_fn *fill, void *arg) {
    const int pieces = fgi_parallel_threads((long long)(n / FILL_MIN_PIECE), 0, 0);
    fill_piece f[FGI_PARALLEL_MAX];
    for (int i = 0; i < pieces; i++) {
        f[i] = (fill_piece){fill, arg, n * (size_t)i / (size_t)pieces, n * (size_t)(i + 1) / (size_t)pieces, *state};
        fg_cli_rand_skip(&f[i].state, (uint64_t)f[i].begin * draws);
    }
    fgi_parallel_run(f, sizeof f[0], pieces, fill_run);
    fg_cli_rand_skip(state, (uint64_t)n * draws);
}
