/*
 * paged_step.c -- the host side of a paged step of `flexgen bench
 * --decode` (bench.h: bench_paged_step): every sequence the same length,
 * its queries at the same offset, pages handed out by tools/paged.c. The
 * timed step (decode.c) and its check against the CPU reference
 * (accuracy.c) both lay out their cache with it, so they agree.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

fg_status bench_paged_step_make(fg_ctx *ctx, const fg_attention_args *a, int page, bench_paged_step *p) {
    const int B = a->batch;
    memset(p, 0, sizeof *p);
    p->kv_lens = malloc(sizeof(int32_t) * (size_t)B);
    p->q_offsets = malloc(sizeof(int32_t) * (size_t)B);
    if (!p->kv_lens || !p->q_offsets || fg_cli_paging_make(B, a->kv_len, NULL, page, (uint64_t)page, &p->pg) != 0)
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the block table");
    for (int b = 0; b < B; b++) p->kv_lens[b] = a->kv_len, p->q_offsets[b] = a->q_offset;
    return FG_OK;
}

void bench_paged_step_apply(const bench_paged_step *p, fg_attention_args *a) {
    a->kv_lens = p->kv_lens, a->q_offsets = p->q_offsets, a->block_table = p->pg.table;
    a->page_size = p->pg.page_size, a->num_pages = p->pg.num_pages, a->max_pages = p->pg.max_pages;
}

void bench_paged_step_free(bench_paged_step *p) {
    free(p->kv_lens), free(p->q_offsets);
    p->kv_lens = p->q_offsets = NULL;
    fg_cli_paging_free(&p->pg);
}
