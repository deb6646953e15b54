/*
 * source.c -- from (mod, kernel config) to a kernel spec, and the complete
 * CUDA source behind it.
 *
 * What a kernel's source is made of comes from its row in the registry
 * (kernels.h): its templates, the emitted pieces it takes, the config
 * values it reads. Two things are made from them here and they must never
 * disagree: the cache key and the source. The key is built first and
 * cheaply, from exactly the inputs the source is a function of:
 *   - the mod's canonical text (length-prefixed: it is free text);
 *   - the kernel's label, its own template's file name and a 64-bit hash of
 *     every text that goes into the source besides the mod (common.cuh, the
 *     row's templates, and the emitter's version, bumped whenever emit.c
 *     prints differently);
 *   - the config values the row says the source reads (dtype, head dim,
 *     block sizes; the attention kernels size their q tile from
 *     FG_Q_BLOCK). A value the kernel does not read is neither in the key
 *     nor in the source;
 *   - for approximate math only, a line with the hash of
 *     templates/approx_math.cuh, the one text such a source adds. Nothing
 *     of it is in an accurate kernel's key or source, which are the same
 *     as before approximate math existed.
 *   - for the decode kernel, "l2_prefetch 1" where the context chose its
 *     K/V copies' L2 prefetch for its device (FG_L2_PREFETCH 1 in the
 *     source; fgi_dec_l2_prefetch_at).
 * The cache adds what it knows (arch, NVRTC version, options, its format).
 * The source is generated only on a miss (spec.gen_source), in the order
 * codegen.h documents: header comment, config macros, common.cuh (then
 * approx_math.cuh under approximate math), the emitted pieces, the row's
 * templates.
 *
 * The readable name ("attention_fwd-sliding_window-bf16-d128") names the
 * disk-cache file and the NVRTC program, so it is limited to file-name-safe
 * characters.
 */
#include "codegen/codegen.h"

#include "base/growable.h"

#include <stdatomic.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bump when emit.c or this file changes what the source looks like. */
#define FGI_CODEGEN_VERSION "flexgen-codegen 20"

/* What the source generator needs; owned by the fgi_codegen, so a spec
 * copied out of it stays valid until fgi_codegen_free. */
typedef struct gen_state {
    const fg_mod *mod;
    fg_kernel_config config;
    const fgi_kernel_entry *kernel;
    bool l2_prefetch; /* FGI_CFG_L2_PREFETCH: the context's choice for its device */
    char *name;
    char *arch;
} gen_state;

/* ---- configuration ----------------------------------------------------------- */

static bool pow2_in(int v, int lo, int hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

/* The caller's config (NULL: all defaults) in the library's layout, with
 * its row: the row of `kernel` when given (an internal kernel has no public
 * kind to name it by), else the row of the config's kind. Defaults filled
 * in, general rules and the row's own checked. */
static fg_status fill_config(fg_ctx *ctx, const fgi_kernel_entry *kernel, const fg_kernel_config *in,
                             fg_kernel_config *c, const fgi_kernel_entry **row) {
    if (in) FGI_TRY(FGI_STRUCT_IN(ctx, fg_kernel_config, in, c));
    else *c = fg_kernel_config_init();
    if (kernel) {
        c->kind = kernel->kind;
    } else {
        if (c->kind == 0) c->kind = FG_KERNEL_ATTENTION_FWD;
        kernel = fgi_kernel_find(c->kind);
        if (!kernel) {
            char kinds[256];
            fgi_kernel_kinds_text(0, kinds, sizeof kinds);
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "kernel kind %d is not %s", (int)c->kind,
                             kinds);
        }
    }
    *row = kernel;
    if (c->dtype == 0) c->dtype = FG_BF16;
    if (c->dtype != FG_BF16 && c->dtype != FG_FP16)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "dtype %d is not FG_BF16 or FG_FP16",
                         (int)c->dtype);
    if (c->head_dim == 0) c->head_dim = 128;
    if (c->head_dim < 16 || c->head_dim > 256 || c->head_dim % 16 != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d: supported are multiples of 16 in [16, 256]", c->head_dim);
    if (c->q_block == 0) c->q_block = 128;
    if (c->kv_block == 0) c->kv_block = 128;
    if (!pow2_in(c->q_block, 16, 256) || !pow2_in(c->kv_block, 16, 256))
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block %d x %d: block sizes must be powers of two in [16, 256]",
                         c->q_block, c->kv_block);
    if (c->arch && !*c->arch) c->arch = NULL;
    if (kernel->check) FGI_TRY(kernel->check(ctx, c));
    /* a row without a ragged form has one kernel for every call */
    c->ragged = (kernel->source_config & FGI_CFG_RAGGED) && c->ragged;
    if (c->approx_math != 0 && c->approx_math != 1)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "approx_math %d is not 0 (the context's FG_OPT_APPROX_MATH) or 1 (approximate math)",
                         c->approx_math);
    /* 0 takes the context's choice; a row that runs no score_mod (the
     * block-mask builder, the merge) has one kernel for every call */
    c->approx_math = (kernel->source_config & FGI_CFG_APPROX) && (c->approx_math || ctx->approx_math);
    if (c->lead_first != 0 && c->lead_first != 1)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "lead_first %d is not 0 or 1", c->lead_first);
    if (c->head_pairs != 0 && c->head_pairs != 1)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "head_pairs %d is not 0 or 1", c->head_pairs);
    /* a row without the tile order or the pairs has one kernel for every
     * call */
    const bool order = kernel->source_config & FGI_CFG_ORDER;
    if (order && c->lead_first && c->head_pairs)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "lead_first and head_pairs are two orders of the same pass: set one of them");
    c->lead_first = order && c->lead_first;
    c->head_pairs = (kernel->source_config & FGI_CFG_PAIRS) && c->head_pairs;
    if (c->dense != 0 && c->dense != 1)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "dense %d is not 0 or 1", c->dense);
    c->dense = (kernel->source_config & FGI_CFG_DENSE) && c->dense;
    return FG_OK;
}

static const char *dtype_name(fg_dtype t) { return t == FG_FP16 ? "fp16" : "bf16"; }

/* ---- names and keys -------------------------------------------------------------- */

/* The mod's name reduced to [A-Za-z0-9_], at most 48 characters. */
static void safe_mod_name(const fg_mod *mod, char *out, size_t cap) {
    const char *s = mod->name && *mod->name ? mod->name : "mod";
    size_t n = 0;
    for (; *s && n + 1 < cap && n < 48; s++) {
        char ch = *s;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '_';
        out[n++] = ok ? ch : '_';
    }
    out[n] = 0;
}

/* "-bf16-d128" or "-q128-kv64": the config values that name the kernel. */
static void config_suffix(const fgi_kernel_entry *k, const fg_kernel_config *c, char *out, size_t cap) {
    fgi_buf b = {0};
    if (k->name_config & FGI_CFG_DTYPE) fgi_buf_printf(&b, "-%s", dtype_name(c->dtype));
    if (k->name_config & FGI_CFG_HEAD_DIM) fgi_buf_printf(&b, "-d%d", c->head_dim);
    if (k->name_config & FGI_CFG_BLOCKS) fgi_buf_printf(&b, "-q%d-kv%d", c->q_block, c->kv_block);
    if ((k->name_config & FGI_CFG_RAGGED) && c->ragged) fgi_buf_puts(&b, "-ragged");
    if ((k->name_config & FGI_CFG_APPROX) && c->approx_math) fgi_buf_puts(&b, "-approx");
    if ((k->name_config & FGI_CFG_ORDER) && c->lead_first) fgi_buf_puts(&b, "-lead");
    if ((k->name_config & FGI_CFG_PAIRS) && c->head_pairs) fgi_buf_puts(&b, "-pairs");
    if ((k->name_config & FGI_CFG_DENSE) && c->dense) fgi_buf_puts(&b, "-dense");
    snprintf(out, cap, "%s", b.data && !b.oom ? b.data : "");
    fgi_buf_free(&b);
}

/* The kernel's own template: the last of its row's. */
static const char *own_template(const fgi_kernel_entry *k) {
    const char *last = NULL;
    for (int i = 0; k->templates[i]; i++) last = k->templates[i];
    return last;
}

/* The fixed texts a kernel's source is made of: common.cuh, then the row's
 * templates in order; `texts` has room for FGI_KERNEL_MAX_TEMPLATES + 1. */
static fg_status find_templates(fg_ctx *ctx, const fgi_kernel_entry *k, const fgi_template **texts,
                                int *n) {
    texts[0] = fgi_template_find("common.cuh");
    if (!texts[0])
        return fgi_error(ctx, FG_ERR_NOT_FOUND, "template %s is not built into this library",
                         "common.cuh");
    *n = 1;
    for (int i = 0; k->templates[i]; i++) {
        texts[*n] = fgi_template_find(k->templates[i]);
        if (!texts[*n])
            return fgi_error(ctx, FG_ERR_NOT_FOUND, "template %s is not built into this library",
                             k->templates[i]);
        ++*n;
    }
    return FG_OK;
}

/* Hash of every fixed text the source is made of. The texts are compiled
 * into the library, so the hash is computed once per registry row and kept:
 * it is on the path of every fg_attention_forward call, where hashing the
 * ~100 KB of template text each time would cost tens of microseconds. A
 * race between two first callers only computes the same value twice. */
static fg_status template_hash(fg_ctx *ctx, const fgi_kernel_entry *k, uint64_t *out) {
    static _Atomic uint64_t memo[FGI_KERNEL_SLOTS];
    size_t slot = fgi_kernel_index(k);
    uint64_t h = atomic_load_explicit(&memo[slot], memory_order_acquire);
    if (h) {
        *out = h;
        return FG_OK;
    }
    const fgi_template *texts[FGI_KERNEL_MAX_TEMPLATES + 1];
    int n = 0;
    FGI_TRY(find_templates(ctx, k, texts, &n));
    h = fgi_fnv1a(FGI_FNV_SEED, FGI_CODEGEN_VERSION, strlen(FGI_CODEGEN_VERSION));
    for (int i = 0; i < n; i++) h = fgi_fnv1a(h, texts[i]->text, strlen(texts[i]->text) + 1);
    if (!h) h = 1; /* 0 means "not computed yet" */
    atomic_store_explicit(&memo[slot], h, memory_order_release);
    *out = h;
    return FG_OK;
}

/* The text approximate math adds to a source, and its hash (kept as
 * template_hash keeps the rows'). */
#define APPROX_TEMPLATE "approx_math.cuh"

static fg_status approx_template(fg_ctx *ctx, const fgi_template **t, uint64_t *hash) {
    static _Atomic uint64_t memo;
    *t = fgi_template_find(APPROX_TEMPLATE);
    if (!*t)
        return fgi_error(ctx, FG_ERR_NOT_FOUND, "template %s is not built into this library", APPROX_TEMPLATE);
    uint64_t h = atomic_load_explicit(&memo, memory_order_acquire);
    if (!h) {
        h = fgi_fnv1a(FGI_FNV_SEED, (*t)->text, strlen((*t)->text) + 1);
        if (!h) h = 1;
        atomic_store_explicit(&memo, h, memory_order_release);
    }
    *hash = h;
    return FG_OK;
}

static char *build_key(const gen_state *g, uint64_t thash, uint64_t ahash) {
    const fg_kernel_config *c = &g->config;
    const unsigned use = g->kernel->source_config;
    const char *canon = g->mod->canonical ? g->mod->canonical : "";
    fgi_buf b = {0};
    fgi_buf_printf(&b, "%s\nkernel %s\ntemplate %s %016llx\n", FGI_CODEGEN_VERSION,
                   g->kernel->label, own_template(g->kernel), (unsigned long long)thash);
    if (use & FGI_CFG_DTYPE) fgi_buf_printf(&b, "dtype %s\n", dtype_name(c->dtype));
    if (use & FGI_CFG_HEAD_DIM) fgi_buf_printf(&b, "head_dim %d\n", c->head_dim);
    if (use & FGI_CFG_BLOCKS) fgi_buf_printf(&b, "q_block %d\nkv_block %d\n", c->q_block, c->kv_block);
    if (use & FGI_CFG_RAGGED) fgi_buf_printf(&b, "ragged %d\n", c->ragged);
    /* only when set: the accurate kernels' keys stay as they were */
    if ((use & FGI_CFG_APPROX) && c->approx_math)
        fgi_buf_printf(&b, "approx_math 1 %s %016llx\n", APPROX_TEMPLATE, (unsigned long long)ahash);
    if ((use & FGI_CFG_ORDER) && c->lead_first) fgi_buf_puts(&b, "lead_first 1\n");
    if ((use & FGI_CFG_PAIRS) && c->head_pairs) fgi_buf_puts(&b, "head_pairs 1\n");
    if ((use & FGI_CFG_DENSE) && c->dense) fgi_buf_puts(&b, "dense 1\n");
    if (g->l2_prefetch) fgi_buf_puts(&b, "l2_prefetch 1\n");
    fgi_buf_printf(&b, "mod %zu\n", strlen(canon));
    fgi_buf_puts(&b, canon);
    return fgi_buf_take(&b);
}

/* ---- the source ------------------------------------------------------------------- */

static void put_header(fgi_buf *b, const gen_state *g) {
    const fg_kernel_config *c = &g->config;
    const unsigned use = g->kernel->name_config;
    fgi_buf_printf(b,
                   "/*\n * %s.cu -- generated by flexgen %s: do not edit.\n"
                   " * Kernel: %s, from templates/%s.\n",
                   g->name, FLEXGEN_VERSION_STRING, g->kernel->what, own_template(g->kernel));
    if (use) {
        const char *sep = " * Config: ";
        if (use & FGI_CFG_DTYPE) {
            fgi_buf_printf(b, "%s%s inputs", sep, dtype_name(c->dtype));
            sep = ", ";
        }
        if (use & FGI_CFG_HEAD_DIM) {
            fgi_buf_printf(b, "%shead dim %d", sep, c->head_dim);
            sep = ", ";
        }
        if (use & FGI_CFG_BLOCKS) fgi_buf_printf(b, "%sblocks of %d x %d", sep, c->q_block, c->kv_block);
        if ((use & FGI_CFG_RAGGED) && c->ragged) fgi_buf_puts(b, ", ragged lengths and paged K/V");
        if ((use & FGI_CFG_APPROX) && c->approx_math) fgi_buf_puts(b, ", approximate math");
        if ((use & FGI_CFG_ORDER) && c->lead_first) fgi_buf_puts(b, ", leading kv tiles first");
        if ((use & FGI_CFG_PAIRS) && c->head_pairs) fgi_buf_puts(b, ", kv heads in pairs");
        if ((use & FGI_CFG_DENSE) && c->dense) fgi_buf_puts(b, ", no block mask (176-row kv tiles)");
        fgi_buf_puts(b, ".\n");
    }
    fgi_buf_puts(b, " * Regenerate with the flexgen command-line tool (flexgen --help).\n */\n\n");
}

static void put_macros(fgi_buf *b, const gen_state *g) {
    const fg_kernel_config *c = &g->config;
    const unsigned use = g->kernel->source_config;
    fgi_buf_printf(b, "#define %s 1\n", g->kernel->macro);
    if (use & FGI_CFG_DTYPE)
        fgi_buf_printf(b, "#define %s 1\n", c->dtype == FG_FP16 ? "FG_DTYPE_FP16" : "FG_DTYPE_BF16");
    if (use & FGI_CFG_HEAD_DIM) fgi_buf_printf(b, "#define FG_HEAD_DIM %d\n", c->head_dim);
    if (use & FGI_CFG_BLOCKS)
        fgi_buf_printf(b, "#define FG_Q_BLOCK %d\n#define FG_KV_BLOCK %d\n", c->q_block,
                       c->kv_block);
    if (use & FGI_CFG_RAGGED) fgi_buf_printf(b, "#define FG_RAGGED %d\n", c->ragged);
    if ((use & FGI_CFG_APPROX) && c->approx_math) fgi_buf_puts(b, "#define FG_APPROX_MATH 1\n");
    if ((use & FGI_CFG_ORDER) && c->lead_first) fgi_buf_puts(b, "#define FG_LEAD_FIRST 1\n");
    if ((use & FGI_CFG_PAIRS) && c->head_pairs) fgi_buf_puts(b, "#define FG_HEAD_PAIRS 1\n");
    if ((use & FGI_CFG_DENSE) && c->dense) fgi_buf_puts(b, "#define FG_DENSE 1\n");
    if (g->l2_prefetch) fgi_buf_puts(b, "#define FG_L2_PREFETCH 1\n");
    /* The launch geometry the host will use for each entry point
     * (kernels.c's geometry), so that a template can check its own sizes
     * against it at compile time: the two are written twice, once per
     * side, and a mismatch must not reach a launch. */
    for (int i = 0; g->kernel->geometry && i < FGI_KERNEL_MAX_ENTRIES && g->kernel->entries[i]; i++) {
        const fgi_kernel_geom geom = g->kernel->geometry(c, g->mod, i);
        const char *e = g->kernel->entries[i];
        fgi_buf_printf(b, "#define FG_LAUNCH_THREADS_%s %d\n#define FG_LAUNCH_SMEM_%s %zu\n", e, geom.threads, e,
                       geom.smem);
        fgi_buf_printf(b, "#define FG_LAUNCH_BLOCK_M_%s %d\n#define FG_LAUNCH_BLOCK_N_%s %d\n", e, geom.block_m, e,
                       geom.block_n);
        fgi_buf_printf(b, "#define FG_LAUNCH_O_MAP_%s %d\n", e, geom.o_map);
    }
    fgi_buf_puts(b, "\n");
}

static void put_template(fgi_buf *b, const char *file, const char *text) {
    fgi_buf_printf(b, "/* ==== templates/%s ==== */\n", file);
    fgi_buf_puts(b, text);
    if (b->len && b->data[b->len - 1] != '\n') fgi_buf_puts(b, "\n");
    fgi_buf_puts(b, "\n");
}

/* The emitted pieces (kernels.h, FGI_PIECE_*), in the order they are
 * printed. `file` is the generated source's name, for #line directives;
 * `math` how score_mod's float math is spelled. */
static fg_status emit_mod(fg_ctx *ctx, const gen_state *g, const char *file, fgi_math math, fgi_buf *b) {
    return fgi_emit_mod_math(ctx, g->mod, file, math, b);
}

static fg_status emit_split(fg_ctx *ctx, const gen_state *g, const char *file, fgi_math math, fgi_buf *b) {
    (void)file;
    return fgi_emit_split_math(ctx, g->mod, math, fgi_kernel_split_flags(g->kernel, &g->config), b);
}

static fg_status emit_grad(fg_ctx *ctx, const gen_state *g, const char *file, fgi_math math, fgi_buf *b) {
    return fgi_emit_grad_math(ctx, g->mod, file, math, b);
}

static const struct {
    unsigned piece;
    fg_status (*emit)(fg_ctx *ctx, const gen_state *g, const char *file, fgi_math math, fgi_buf *b);
} pieces[] = {
    {FGI_PIECE_MOD, emit_mod},
    {FGI_PIECE_SPLIT, emit_split},
    {FGI_PIECE_GRAD, emit_grad},
};

static fg_status gen_source(fg_ctx *ctx, void *arg, char **source) {
    const gen_state *g = arg;
    const fgi_template *texts[FGI_KERNEL_MAX_TEMPLATES + 1];
    int n = 0;
    FGI_TRY(find_templates(ctx, g->kernel, texts, &n));
    char file[160];
    snprintf(file, sizeof file, "%s.cu", g->name);
    const fgi_math math = g->config.approx_math ? FGI_MATH_APPROX : FGI_MATH_ACCURATE;
    const fgi_template *approx = NULL;
    uint64_t ahash = 0;
    if (math == FGI_MATH_APPROX) FGI_TRY(approx_template(ctx, &approx, &ahash));
    fgi_buf b = {0};
    put_header(&b, g);
    put_macros(&b, g);
    put_template(&b, "common.cuh", texts[0]->text);
    if (approx) put_template(&b, APPROX_TEMPLATE, approx->text);
    fg_status st = FG_OK;
    bool first = true;
    for (size_t i = 0; st == FG_OK && i < sizeof pieces / sizeof pieces[0]; i++) {
        if (!(g->kernel->pieces & pieces[i].piece)) continue;
        if (!first) fgi_buf_puts(&b, "\n");
        first = false;
        st = pieces[i].emit(ctx, g, file, math, &b);
    }
    if (st == FG_OK) {
        fgi_buf_puts(&b, "\n");
        for (int i = 1; i < n; i++) put_template(&b, g->kernel->templates[i - 1], texts[i]->text);
    }
    if (st == FG_OK && b.oom) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory generating source");
    if (st != FG_OK) {
        fgi_buf_free(&b);
        return st;
    }
    *source = fgi_buf_take(&b);
    if (!*source) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory generating source");
    return FG_OK;
}

/* ---- spec ------------------------------------------------------------------------- */

static void state_free(gen_state *g) {
    if (!g) return;
    free(g->name);
    free(g->arch);
    free(g);
}

/* The context's choice for the decode kernel's L2 prefetch: its option, or
 * the rule for its device (the device asked only then). */
static bool l2_prefetch_of(fg_ctx *ctx) {
    const int opt = ctx->decode_l2_prefetch;
    return fgi_dec_l2_prefetch_at(opt, opt < 0 ? fgi_cuda_dram_per_sm_clock(ctx) : 0);
}

static fg_status codegen_init(fg_ctx *ctx, const fg_mod *mod, const fgi_kernel_entry *kernel,
                              const fg_kernel_config *config, fgi_codegen *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out, "NULL codegen output");
    memset(out, 0, sizeof *out);
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    fg_kernel_config cfg;
    const fgi_kernel_entry *k = NULL;
    FGI_TRY(fill_config(ctx, kernel, config, &cfg, &k));
    /* the dense form only where it changes the kernel: elsewhere the plain
     * kernel's key, name and source */
    cfg.dense = fgi_fwd_dense_applies(&cfg, mod);
    uint64_t thash = 0, ahash = 0;
    FGI_TRY(template_hash(ctx, k, &thash));
    if (cfg.approx_math) {
        const fgi_template *approx;
        FGI_TRY(approx_template(ctx, &approx, &ahash));
    }

    gen_state *g = calloc(1, sizeof *g);
    if (!g) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (codegen)");
    g->mod = mod;
    g->kernel = k;
    g->config = cfg;
    g->l2_prefetch = (k->source_config & FGI_CFG_L2_PREFETCH) && l2_prefetch_of(ctx);
    char modname[64], suffix[48], name[160];
    safe_mod_name(mod, modname, sizeof modname);
    config_suffix(k, &cfg, suffix, sizeof suffix);
    snprintf(name, sizeof name, "%s-%s%s", k->label, modname, suffix);
    g->name = strdup(name);
    if (!cfg.arch) cfg.arch = k->arch; /* a kernel made for one arch compiles for it */
    g->arch = cfg.arch ? strdup(cfg.arch) : NULL;
    g->config.arch = g->arch;
    char *key = g->name && (!cfg.arch || g->arch) ? build_key(g, thash, ahash) : NULL;
    if (!key) {
        state_free(g);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (codegen)");
    }
    out->key = key;
    out->name = strdup(g->name);
    if (!out->name) {
        free(key);
        state_free(g);
        memset(out, 0, sizeof *out);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (codegen)");
    }
    out->mod = mod;
    out->kernel = k;
    out->config = g->config;
    out->spec.key = out->key;
    out->spec.name = out->name;
    out->spec.entry = k->entries[0];
    out->spec.arch = g->arch;
    out->spec.gen_source = gen_source;
    out->spec.gen_arg = g;
    return FG_OK;
}

fg_status fgi_codegen_init(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                           fgi_codegen *out) {
    return codegen_init(ctx, mod, NULL, config, out);
}

fg_status fgi_codegen_init_kernel(fg_ctx *ctx, const fg_mod *mod, const fgi_kernel_entry *kernel,
                                  const fg_kernel_config *config, fgi_codegen *out) {
    if (ctx && !kernel) return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "NULL kernel row");
    return codegen_init(ctx, mod, kernel, config, out);
}

void fgi_codegen_free(fgi_codegen *cg) {
    if (!cg) return;
    free(cg->key);
    free(cg->name);
    if (cg->spec.gen_source == gen_source) state_free(cg->spec.gen_arg);
    memset(cg, 0, sizeof *cg);
}

/* ---- public ----------------------------------------------------------------------- */

fg_status fg_generate_source(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                             char **source) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, source, "NULL source output");
    *source = NULL;
    fgi_clear_error(ctx);
    fgi_codegen cg;
    FGI_TRY(fgi_codegen_init(ctx, mod, config, &cg));
    fg_status st = cg.spec.gen_source(ctx, cg.spec.gen_arg, source);
    fgi_codegen_free(&cg);
    return st;
}

fg_status fg_compile(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                     fg_emit_kind kind, void **image, size_t *size) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, image && size, "NULL image or size output");
    *image = NULL;
    *size = 0;
    FGI_CHECK_ARG(ctx, kind == FG_EMIT_PTX || kind == FG_EMIT_CUBIN,
                  "emit kind %d is not FG_EMIT_PTX or FG_EMIT_CUBIN", (int)kind);
    fgi_clear_error(ctx);
    fgi_codegen cg;
    FGI_TRY(fgi_codegen_init(ctx, mod, config, &cg));
    char *src = NULL;
    fg_status st = cg.spec.gen_source(ctx, cg.spec.gen_arg, &src);
    if (st == FG_OK) {
        const char *arch = cg.spec.arch ? cg.spec.arch : fgi_effective_arch(ctx);
        st = fgi_nvrtc_compile(ctx, src, cg.name, arch, kind, image, size, NULL);
    }
    free(src);
    fgi_codegen_free(&cg);
    return st;
}
