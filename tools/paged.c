/*
 * paged.c -- paged K/V caches for the tool's commands (`flexgen check
 * --paged`, `flexgen bench --decode`): the layout of vLLM and FlashInfer,
 * [num_pages, page_size, heads_kv, D], with a block table per sequence.
 *
 * Pages are handed out in the order of a random permutation and a few are
 * left to nobody, as in a cache that has served many requests: a kernel
 * that took a page's position in the table for its id, or read a page no
 * sequence owns, gives a different result. A copy fills every row no key
 * lives in with a value of the caller's choice (`flexgen check` uses NaN,
 * so that a row read by mistake shows in the output).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Sequence b's length and the pages it needs. */
static int seq_len(const int32_t *lens, int kv_len, int b) { return lens ? lens[b] : kv_len; }

static int pages_for(int len, int page_size) { return (len + page_size - 1) / page_size; }

int fg_cli_paging_make(int batch, int kv_len, const int32_t *lens, int page_size, uint64_t seed,
                       fg_cli_paging *p) {
    memset(p, 0, sizeof *p);
    p->batch = batch, p->page_size = page_size;
    p->max_pages = pages_for(kv_len, page_size);
    int64_t owned = 0;
    for (int b = 0; b < batch; b++) owned += pages_for(seq_len(lens, kv_len, b), page_size);
    if (owned + FG_CLI_SPARE_PAGES > INT_MAX) return -1;
    p->num_pages = (int)owned + FG_CLI_SPARE_PAGES;
    p->table = malloc(sizeof(int32_t) * (size_t)batch * (size_t)p->max_pages);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)p->num_pages);
    if (!p->table || !perm) {
        free(perm);
        fg_cli_paging_free(p);
        return -1;
    }
    /* Fisher-Yates; the state must not be 0, where xorshift stays */
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (s == 0) s = 1;
    for (int i = 0; i < p->num_pages; i++) perm[i] = i;
    for (int i = p->num_pages - 1; i > 0; i--) {
        const int j = (int)(fg_cli_rand_u64(&s) % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int next = 0;
    for (int b = 0; b < batch; b++) {
        const int n = pages_for(seq_len(lens, kv_len, b), page_size);
        int32_t *row = p->table + (size_t)b * (size_t)p->max_pages;
        for (int i = 0; i < p->max_pages; i++) row[i] = i < n ? perm[next++] : -1;
    }
    free(perm);
    return 0;
}

void fg_cli_paging_free(fg_cli_paging *p) {
    free(p->table);
    p->table = NULL;
}

size_t fg_cli_paged_elems(const fg_cli_paging *p, int heads_kv, int head_dim) {
    return (size_t)p->num_pages * (size_t)p->page_size * (size_t)heads_kv * (size_t)head_dim;
}

uint16_t *fg_cli_paged_copy(const fg_cli_paging *p, const uint16_t *x, int heads_kv, int kv_len, int head_dim,
                            const int32_t *lens, uint16_t fill) {
    const size_t n = fg_cli_paged_elems(p, heads_kv, head_dim), D = (size_t)head_dim;
    const size_t row = (size_t)heads_kv * D; /* one key of every head */
    uint16_t *c = malloc(n * sizeof *c);
    if (!c) return NULL;
    for (size_t i = 0; i < n; i++) c[i] = fill;
    const int ps = p->page_size;
    for (int b = 0; b < p->batch; b++) {
        const int32_t *table = p->table + (size_t)b * (size_t)p->max_pages;
        const int len = seq_len(lens, kv_len, b);
        for (int h = 0; h < heads_kv; h++) {
            const uint16_t *src = x + ((size_t)b * (size_t)heads_kv + (size_t)h) * (size_t)kv_len * D;
            for (int j = 0; j < len; j++) {
                const size_t at = ((size_t)table[j / ps] * (size_t)ps + (size_t)(j % ps)) * row + (size_t)h * D;
                memcpy(c + at, src + (size_t)j * D, D * sizeof *c);
            }
        }
    }
    return c;
}
