/*
 * random.c -- the flexgen tool's pseudo-random numbers: xorshift64*, which is
 * small, fast and good enough for test inputs, and the two ways of turning
 * its top 53 bits into a double. `flexgen check` draws from [0, 1) and
 * `flexgen bench` from (0, 1] (Box-Muller takes the log of it); each keeps
 * its own, so that a seed goes on giving the inputs it always gave.
 */
#include "cli.h"

uint64_t fg_cli_rand_u64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

double fg_cli_rand_uniform(uint64_t *state) {
    return (double)(fg_cli_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0);
}

double fg_cli_rand_uniform_pos(uint64_t *state) {
    return ((double)(fg_cli_rand_u64(state) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}
