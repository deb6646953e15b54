/* test_cli_random.c -- the flexgen tool's random streams (tools/random.c):
 * jumping ahead by a bit-matrix power lands where drawing one value at a
 * time does, and a tensor drawn on threads holds the values, and leaves
 * the stream where, one thread drawing in order would (so `flexgen check
 * --seed N` keeps giving the inputs it always gave). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const uint64_t seeds[] = {1, 42, 0x9E3779B97F4A7C15ull, 0xFFFFFFFFFFFFFFFFull};

static void test_skip_is_drawing(void **state) {
    (void)state;
    static const uint64_t skips[] = {0, 1, 2, 3, 63, 64, 65, 1000, 123457};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        for (size_t k = 0; k < sizeof skips / sizeof skips[0]; k++) {
            uint64_t drawn = seeds[i], jumped = seeds[i];
            for (uint64_t d = 0; d < skips[k]; d++) fg_cli_rand_u64(&drawn);
            fg_cli_rand_skip(&jumped, skips[k]);
            if (drawn != jumped) print_error("seed %zu, %llu draws\n", i, (unsigned long long)skips[k]);
            assert_true(drawn == jumped);
        }
}

/* A tensor of draws: element i from `draws` consecutive draws. */
typedef struct draws_fill {
    uint64_t *x;
    unsigned draws;
} draws_fill;

static void fill_draws(void *arg, size_t begin, size_t end, uint64_t *s) {
    const draws_fill *f = arg;
    for (size_t i = begin; i < end; i++) {
        uint64_t v = 0;
        for (unsigned d = 0; d < f->draws; d++) v = v * 31 + fg_cli_rand_u64(s);
        f->x[i] = v;
    }
}

static void test_fill_is_one_thread_in_order(void **state) {
    (void)state;
    /* Under, at and past the length that takes threads, and lengths that
     * do not split evenly. */
    static const size_t lens[] = {0, 1, 1000, (size_t)1 << 18, ((size_t)1 << 19) + 3, ((size_t)1 << 21) + 12345};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
        for (unsigned draws = 1; draws <= 2; draws++) {
            const size_t n = lens[l];
            draws_fill one = {malloc((n + 1) * sizeof(uint64_t)), draws};
            draws_fill many = {malloc((n + 1) * sizeof(uint64_t)), draws};
            assert_non_null(one.x);
            assert_non_null(many.x);
            uint64_t s_one = seeds[2], s_many = seeds[2];
            fill_draws(&one, 0, n, &s_one);
            fg_cli_rand_fill(&s_many, n, draws, fill_draws, &many);
            if (memcmp(one.x, many.x, n * sizeof(uint64_t)) || s_one != s_many)
                print_error("n %zu, %u draws an element\n", n, draws);
            assert_memory_equal(one.x, many.x, n * sizeof(uint64_t));
            assert_true(s_one == s_many);
            free(one.x), free(many.x);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_is_drawing),
        cmocka_unit_test(test_fill_is_one_thread_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
