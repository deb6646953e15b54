/*
 * parallel.h -- work spread over threads (base/parallel.c): how many
 * threads a piece of host work gets, and running one job a thread.
 * The CPU references and the flexgen tool's random inputs use them.
 */
#ifndef FLEXGEN_BASE_PARALLEL_H
#define FLEXGEN_BASE_PARALLEL_H

#include <stddef.h>

/* The most threads fgi_parallel_run starts. */
#define FGI_PARALLEL_MAX 32

/* Threads for `items` independent items needing `bytes_each` bytes of
 * working memory a thread: one a core, at most FGI_PARALLEL_MAX and
 * `items`, and no more than `bytes_max` bytes among them; at least 1. */
int fgi_parallel_threads(long long items, size_t bytes_each, size_t bytes_max);

/* run(job) for each of the n jobs (n <= FGI_PARALLEL_MAX) of `stride`
 * bytes at `jobs`, each on a thread of its own, and wait for all. With
 * n == 1, or where a thread cannot start, the job runs on the calling
 * thread. */
void fgi_parallel_run(void *jobs, size_t stride, int n, void (*run)(void *job));

#endif
