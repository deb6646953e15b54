/*
 * parallel.c -- work spread over threads (parallel.h).
 */
#include "base/parallel.h"

#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

int fgi_parallel_threads(long long items, size_t bytes_each, size_t bytes_max) {
    long long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n > FGI_PARALLEL_MAX) n = FGI_PARALLEL_MAX;
    if (n > items) n = items;
    if (bytes_each > 0 && (size_t)n > bytes_max / bytes_each) n = (long long)(bytes_max / bytes_each);
    return n < 1 ? 1 : (int)n;
}

typedef struct parallel_job {
    void (*run)(void *job);
    void *job;
} parallel_job;

static void *parallel_thread(void *arg) {
    const parallel_job *p = arg;
    p->run(p->job);
    return NULL;
}

void fgi_parallel_run(void *jobs, size_t stride, int n, void (*run)(void *job)) {
    pthread_t th[FGI_PARALLEL_MAX];
    parallel_job pj[FGI_PARALLEL_MAX];
    bool started[FGI_PARALLEL_MAX];
    if (n > FGI_PARALLEL_MAX) n = FGI_PARALLEL_MAX;
    for (int i = 0; i < n; i++) {
        pj[i] = (parallel_job){run, (char *)jobs + (size_t)i * stride};
        started[i] = n > 1 && pthread_create(&th[i], NULL, parallel_thread, &pj[i]) == 0;
        if (!started[i]) run(pj[i].job);
    }
    for (int i = 0; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
}
