/*
 * codegen.c -- from (mod, kernel config) to a kernel spec, and the complete
 * CUDA source behind it.
 *
 * Two things are made here and they must never disagree: the cache key and
 * the source. The key is built first and cheaply, from exactly the inputs
 * the source is a function of:
 *   - the mod's canonical text (length-prefixed: it is free text);
 *   - the kernel template's file name and a 64-bit hash of every text that
 *     goes into the source besides the mod (common.cuh, the kernel template,
 *     and the emitter's version, bumped whenever emit.c prints differently);
 *   - the config values the source uses: dtype, head dim and block sizes
 *     for attention (the q tile follows FG_Q_BLOCK), the block sizes alone
 *     for the block-mask builder. A value the kernel does not read is
 *     neither in the key nor in the source.
 * The cache adds what it knows (arch, NVRTC version, options, its format).
 * The source is generated only on a miss (spec.gen_source), in the order
 * codegen.h documents: header comment, config macros, common.cuh, the
 * emitted mod, the kernel template.
 *
 * The readable name ("attention_fwd-sliding_window-bf16-d128") names the
 * disk-cache file and the NVRTC program, so it is limited to file-name-safe
 * characters.
 */
#include "codegen/codegen.h"

#include <stdatomic.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bump when emit.c or this file changes what the source looks like. */
#define FGI_CODEGEN_VERSION "flexgen-codegen 2"

typedef struct kernel_info {
    fg_kernel_kind kind;
    const char *label;    /* in names and keys                        */
    const char *prelude;  /* templates/ file before tmpl, or NULL       */
    const char *tmpl;     /* templates/ file                          */
    const char *entry;    /* default entry point                      */
    const char *macro;    /* FG_KERNEL_...                            */
    const char *what;     /* for the header comment                   */
    const char *arch;     /* the only arch it compiles for, or NULL   */
} kernel_info;

static const kernel_info kernels[] = {
    {FG_KERNEL_ATTENTION_FWD, "attention_fwd", "attention/attention_common.cuh", "attention/attention_fwd.cuh",
     "fg_attention_fwd", "FG_KERNEL_ATTENTION_FWD", "forward attention (portable, mma.sync)", NULL},
    {FG_KERNEL_BLOCK_MASK, "blockmask", NULL, "blockmask/blockmask.cuh", "fg_block_mask_classify",
     "FG_KERNEL_BLOCK_MASK", "block-mask builder (fg_block_mask_classify, fg_block_mask_compact)",
     NULL},
    {FG_KERNEL_ATTENTION_FWD_SM90, "attention_fwd_sm90", "attention/attention_common.cuh",
     "attention/attention_fwd_sm90.cuh", "fg_attention_fwd", "FG_KERNEL_ATTENTION_FWD_SM90",
     "forward attention (Hopper, wgmma)", "sm_90a"},
};

static const kernel_info *kernel_find(fg_kernel_kind kind) {
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (kernels[i].kind == kind) return &kernels[i];
    return NULL;
}

/* What the source generator needs; owned by the fgi_codegen, so a spec
 * copied out of it stays valid until fgi_codegen_free. */
typedef struct gen_state {
    const fg_mod *mod;
    fg_kernel_config config;
    const kernel_info *kernel;
    char *name;
    char *arch;
} gen_state;

/* ---- configuration ----------------------------------------------------------- */

static bool pow2_in(int v, int lo, int hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

/* What the Hopper kernel takes, on a config with its defaults filled in:
 * wgmma tiles of 64 rows per warp group and 128-column K/V tiles, the head
 * dim one or two 128-byte swizzle rows, code for sm_90a only. A NULL ctx
 * records nothing. */
static fg_status sm90_check(fg_ctx *ctx, const fg_kernel_config *c) {
    if (c->head_dim != 64 && c->head_dim != 128)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d: the Hopper kernel supports 64 and 128 (the portable "
                         "kernel, FG_KERNEL_ATTENTION_FWD, takes every multiple of 16 to 256)",
                         c->head_dim);
    if (c->q_block < 128 || c->kv_block < 128)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "blocks %d x %d: the Hopper kernel needs q and kv blocks of at least 128",
                         c->q_block, c->kv_block);
    if (c->arch && strcmp(c->arch, "sm_90a") != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "arch %s: the Hopper kernel compiles only for sm_90a",
                         c->arch);
    return FG_OK;
}

static fg_status fill_config(fg_ctx *ctx, const fg_kernel_config *in, fg_kernel_config *c) {
    if (in) *c = *in;
    else memset(c, 0, sizeof *c);
    if (c->kind == 0) c->kind = FG_KERNEL_ATTENTION_FWD;
    if (!kernel_find(c->kind))
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "kernel kind %d is not FG_KERNEL_ATTENTION_FWD, FG_KERNEL_BLOCK_MASK or "
                         "FG_KERNEL_ATTENTION_FWD_SM90",
                         (int)c->kind);
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
    if (c->kind == FG_KERNEL_ATTENTION_FWD_SM90) return sm90_check(ctx, c);
    return FG_OK;
}

bool fgi_codegen_sm90_applies(const fg_kernel_config *config) {
    fg_kernel_config c = *config;
    if (c.head_dim == 0) c.head_dim = 128;
    if (c.q_block == 0) c.q_block = 128;
    if (c.kv_block == 0) c.kv_block = 128;
    if (c.arch && !*c.arch) c.arch = NULL;
    return sm90_check(NULL, &c) == FG_OK;
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

static void config_suffix(const fg_kernel_config *c, char *out, size_t cap) {
    if (c->kind == FG_KERNEL_BLOCK_MASK)
        snprintf(out, cap, "q%d-kv%d", c->q_block, c->kv_block);
    else
        snprintf(out, cap, "%s-d%d", dtype_name(c->dtype), c->head_dim);
}

/* Hash of every fixed text the source is made of. The texts are compiled
 * into the library, so the hash is computed once per kernel kind and kept:
 * it is on the path of every fg_attention_forward call, where hashing the
 * ~100 KB of template text each time would cost tens of microseconds. A
 * race between two first callers only computes the same value twice. */
/* The fixed texts a kernel's source is made of: common.cuh, the prelude (or
 * NULL) and the kernel template. */
static fg_status find_templates(fg_ctx *ctx, const kernel_info *k, const fgi_template **common,
                                const fgi_template **prelude, const fgi_template **kernel) {
    *common = fgi_template_find("common.cuh");
    *prelude = k->prelude ? fgi_template_find(k->prelude) : NULL;
    *kernel = fgi_template_find(k->tmpl);
    if (!*common || !*kernel || (k->prelude && !*prelude))
        return fgi_error(ctx, FG_ERR_NOT_FOUND, "template %s is not built into this library",
                         !*common ? "common.cuh" : !*kernel ? k->tmpl : k->prelude);
    return FG_OK;
}

static fg_status template_hash(fg_ctx *ctx, const kernel_info *k, uint64_t *out) {
    static _Atomic uint64_t memo[sizeof kernels / sizeof kernels[0]];
    size_t slot = (size_t)(k - kernels);
    uint64_t h = atomic_load_explicit(&memo[slot], memory_order_acquire);
    if (h) {
        *out = h;
        return FG_OK;
    }
    const fgi_template *common, *prelude, *kernel;
    FGI_TRY(find_templates(ctx, k, &common, &prelude, &kernel));
    h = fgi_fnv1a(FGI_FNV_SEED, FGI_CODEGEN_VERSION, strlen(FGI_CODEGEN_VERSION));
    h = fgi_fnv1a(h, common->text, strlen(common->text) + 1);
    if (prelude) h = fgi_fnv1a(h, prelude->text, strlen(prelude->text) + 1);
    h = fgi_fnv1a(h, kernel->text, strlen(kernel->text) + 1);
    if (!h) h = 1; /* 0 means "not computed yet" */
    atomic_store_explicit(&memo[slot], h, memory_order_release);
    *out = h;
    return FG_OK;
}

static char *build_key(const gen_state *g, uint64_t thash) {
    const fg_kernel_config *c = &g->config;
    const char *canon = g->mod->canonical ? g->mod->canonical : "";
    fgi_buf b = {0};
    fgi_buf_printf(&b, "%s\nkernel %s\ntemplate %s %016llx\n", FGI_CODEGEN_VERSION,
                   g->kernel->label, g->kernel->tmpl, (unsigned long long)thash);
    if (c->kind == FG_KERNEL_BLOCK_MASK)
        fgi_buf_printf(&b, "q_block %d\nkv_block %d\n", c->q_block, c->kv_block);
    else /* the attention template sizes its q tile from FG_Q_BLOCK */
        fgi_buf_printf(&b, "dtype %s\nhead_dim %d\nq_block %d\nkv_block %d\n", dtype_name(c->dtype),
                       c->head_dim, c->q_block, c->kv_block);
    fgi_buf_printf(&b, "mod %zu\n", strlen(canon));
    fgi_buf_puts(&b, canon);
    return fgi_buf_take(&b);
}

/* ---- the source ------------------------------------------------------------------- */

static void put_header(fgi_buf *b, const gen_state *g) {
    const fg_kernel_config *c = &g->config;
    fgi_buf_printf(b,
                   "/*\n * %s.cu -- generated by flexgen %s: do not edit.\n"
                   " * Kernel: %s, from templates/%s.\n",
                   g->name, FLEXGEN_VERSION_STRING, g->kernel->what, g->kernel->tmpl);
    if (c->kind == FG_KERNEL_BLOCK_MASK)
        fgi_buf_printf(b, " * Config: blocks of %d x %d.\n", c->q_block, c->kv_block);
    else
        fgi_buf_printf(b, " * Config: %s inputs, head dim %d.\n", dtype_name(c->dtype),
                       c->head_dim);
    fgi_buf_puts(b, " * Regenerate with the flexgen command-line tool (flexgen --help).\n */\n\n");
}

static void put_macros(fgi_buf *b, const gen_state *g) {
    const fg_kernel_config *c = &g->config;
    fgi_buf_printf(b, "#define %s 1\n", g->kernel->macro);
    if (c->kind == FG_KERNEL_BLOCK_MASK) {
        fgi_buf_printf(b, "#define FG_Q_BLOCK %d\n#define FG_KV_BLOCK %d\n", c->q_block,
                       c->kv_block);
    } else {
        fgi_buf_printf(b, "#define %s 1\n", c->dtype == FG_FP16 ? "FG_DTYPE_FP16" : "FG_DTYPE_BF16");
        fgi_buf_printf(b, "#define FG_HEAD_DIM %d\n", c->head_dim);
        fgi_buf_printf(b, "#define FG_Q_BLOCK %d\n#define FG_KV_BLOCK %d\n", c->q_block,
                       c->kv_block);
    }
    fgi_buf_puts(b, "\n");
}

static void put_template(fgi_buf *b, const char *file, const char *text) {
    fgi_buf_printf(b, "/* ==== templates/%s ==== */\n", file);
    fgi_buf_puts(b, text);
    if (b->len && b->data[b->len - 1] != '\n') fgi_buf_puts(b, "\n");
    fgi_buf_puts(b, "\n");
}

static fg_status gen_source(fg_ctx *ctx, void *arg, char **source) {
    const gen_state *g = arg;
    const fgi_template *common, *prelude, *kernel;
    FGI_TRY(find_templates(ctx, g->kernel, &common, &prelude, &kernel));
    char file[160];
    snprintf(file, sizeof file, "%s.cu", g->name);
    fgi_buf b = {0};
    put_header(&b, g);
    put_macros(&b, g);
    put_template(&b, "common.cuh", common->text);
    fg_status st = fgi_emit_mod_named(ctx, g->mod, file, &b);
    /* The attention kernel evaluates the mods split by dependency. */
    if (st == FG_OK && g->kernel->kind != FG_KERNEL_BLOCK_MASK) {
        fgi_buf_puts(&b, "\n");
        st = fgi_emit_split(ctx, g->mod, &b);
    }
    if (st == FG_OK) {
        fgi_buf_puts(&b, "\n");
        if (prelude) put_template(&b, g->kernel->prelude, prelude->text);
        put_template(&b, g->kernel->tmpl, kernel->text);
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

fg_status fgi_codegen_init(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                           fgi_codegen *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out, "NULL codegen output");
    memset(out, 0, sizeof *out);
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    fg_kernel_config cfg;
    FGI_TRY(fill_config(ctx, config, &cfg));
    const kernel_info *k = kernel_find(cfg.kind);
    uint64_t thash = 0;
    FGI_TRY(template_hash(ctx, k, &thash));

    gen_state *g = calloc(1, sizeof *g);
    if (!g) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (codegen)");
    g->mod = mod;
    g->kernel = k;
    g->config = cfg;
    char modname[64], suffix[48], name[160];
    safe_mod_name(mod, modname, sizeof modname);
    config_suffix(&cfg, suffix, sizeof suffix);
    snprintf(name, sizeof name, "%s-%s-%s", k->label, modname, suffix);
    g->name = strdup(name);
    if (!cfg.arch) cfg.arch = k->arch; /* a kernel made for one arch compiles for it */
    g->arch = cfg.arch ? strdup(cfg.arch) : NULL;
    g->config.arch = g->arch;
    char *key = g->name && (!cfg.arch || g->arch) ? build_key(g, thash) : NULL;
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
    out->config = g->config;
    out->spec.key = out->key;
    out->spec.name = out->name;
    out->spec.entry = k->entry;
    out->spec.arch = g->arch;
    out->spec.gen_source = gen_source;
    out->spec.gen_arg = g;
    return FG_OK;
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
