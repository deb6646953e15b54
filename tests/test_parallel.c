/* test_parallel.c -- host work spread over threads (base/parallel.c): the
 * thread count's bounds (items, cores, the cap, a memory budget) and
 * fgi_parallel_run running each job once, on the calling thread when
 * there is one job. */
#include "testutil.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "base/parallel.h"

static void test_thread_counts(void **state) {
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    const long long cap = cores < FGI_PARALLEL_MAX ? cores : FGI_PARALLEL_MAX;
    static const struct {
        long long items;
        size_t each, max;
        long long bound; /* the count is min(cap, bound), at least 1 */
    } rows[] = {
        {0, 0, 0, 1},                /* nothing to do: still one thread          */
        {1, 0, 0, 1},                /* one item                                  */
        {3, 0, 0, 3},                /* fewer items than cores, maybe             */
        {1000, 0, 0, 1000},          /* no memory bound: the cores and the cap    */
        {1000, 100, 250, 2},         /* the budget holds two                      */
        {1000, 100, 99, 1},          /* one does not fit: still one               */
        {1000, (size_t)1 << 40, (size_t)1 << 30, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const int n = fgi_parallel_threads(rows[i].items, rows[i].each, rows[i].max);
        long long want = rows[i].bound < cap ? rows[i].bound : cap;
        if (want < 1) want = 1;
        if (n != want) print_error("row %zu: %d threads, expected %lld\n", i, n, want);
        assert_int_equal(n, want);
    }
}

typedef struct job {
    int runs;
    pthread_t on;
} job;

static void note_run(void *p) {
    job *j = p;
    j->runs++;
    j->on = pthread_self();
}

static void test_each_job_once(void **state) {
    (void)state;
    static const int counts[] = {1, 2, 7, FGI_PARALLEL_MAX};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        job jobs[FGI_PARALLEL_MAX];
        memset(jobs, 0, sizeof jobs);
        fgi_parallel_run(jobs, sizeof jobs[0], counts[c], note_run);
        for (int i = 0; i < FGI_PARALLEL_MAX; i++) assert_int_equal(jobs[i].runs, i < counts[c] ? 1 : 0);
        if (counts[c] == 1) assert_true(pthread_equal(jobs[0].on, pthread_self()));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_counts),
        cmocka_unit_test(test_each_job_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
