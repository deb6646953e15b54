/*
 * emit.c -- the checked AST of a mod, printed back out as CUDA.
 *
 * The user's text is never pasted into a kernel. What reaches NVRTC is this
 * file's rendering of the typed tree, so nothing the checker did not accept
 * can appear in it. Each expression is printed by cuda_expr.c in its
 * readable style, the fewest parentheses that keep the reading obvious, and
 * with every operator spelled for the semantics of the mod language rather
 * than C++'s: wrapping int arithmetic, total division, float arithmetic that
 * rounds exactly like the CPU evaluator, bounds-checked buffer reads (that
 * file gives the spelling of each node and why).
 *
 * The output, in order:
 *   - a comment naming the mod, its file(s) and its canonical text;
 *   - FG_HAS_MASK_MOD / FG_HAS_SCORE_MOD;
 *   - struct fg_mod_params, the by-value kernel argument. Its layout is
 *     fgi_param_layout_compute's (mod/bind.c), which the host packs; the struct
 *     is written so that C++ lays it out the same way (natural alignment,
 *     8-byte aligned struct), and static_asserts with the host's offsets
 *     make NVRTC refuse any source where the two would disagree;
 *   - fg_mask_mod and fg_score_mod with fixed signatures (always true /
 *     the identity when the mod lacks one). A composed mask gets one
 *     function per leaf, fg_mask_part0 ..., combined with && and || so the
 *     right side is evaluated only where the left does not decide.
 *
 * Approximate math (FG_OPT_APPROX_MATH): score_mod and its derivatives
 * may be printed with the fast spellings (cuda_expr.c, fgi_math), which
 * only the kernel sources ask for; fg_mask_mod is always printed accurate,
 * so a kernel keeps exactly the keys a block mask built on the CPU keeps.
 *
 * Inside a function every local becomes `const T lN = ...;` in order and
 * the body ends with `return ...;`. Each of those lines is preceded by a
 * #line directive naming the user's file and line, so an NVRTC message or
 * a profiler line points at the mod, and a #line after each function gives
 * the generated file its own numbering back.
 */
#include "codegen/codegen.h"
#include "mod/deriv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The name the generated source goes by when the caller gives none: what
 * src/jit/nvrtc.c calls an unnamed program. */
#define DEFAULT_GENERATED_NAME "flexgen.cu"

typedef struct emitter {
    fg_ctx *ctx;
    const fg_mod *mod;
    fgi_buf *out;
    const char *gen_name; /* file name for the #line that ends user text */
    fg_status st;         /* first internal error                        */
    fgi_math math;        /* how the function being printed spells float
                             math: mask_mod's is always accurate          */
} emitter;

static void fail(emitter *em, const char *what, const fgi_expr *e) {
    if (em->st == FG_OK)
        em->st = fgi_error(em->ctx, FG_ERR_INVALID_ARGUMENT,
                           "cannot emit %s (node kind %d): the mod was not checked",
                           what, e ? (int)e->kind : -1);
}

/* ---- small printing helpers ---------------------------------------------- */

/* Text inside a C comment: "*" "/" would end it, control bytes would break
 * the layout. */
static void put_comment_text(fgi_buf *out, const char *s) {
    for (; s && *s; s++) {
        if (s[0] == '*' && s[1] == '/') fgi_buf_puts(out, "*\\");
        else if ((unsigned char)*s < 0x20 && *s != '\n') fgi_buf_puts(out, "?");
        else fgi_buf_append(out, s, 1);
    }
}

/* A C string literal's body (for #line "file"). */
static void put_string_body(fgi_buf *out, const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fgi_buf_printf(out, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fgi_buf_printf(out, "\\%03o", c);
        else fgi_buf_append(out, s, 1);
    }
}

static int count_lines(const char *s, size_t n) {
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += s[i] == '\n';
    return lines;
}

/* The 1-based line of byte `offset` in fn's source. */
static int source_line(const fgi_func *fn, int offset) {
    if (!fn->src || offset < 0) return 1;
    size_t n = (size_t)offset < fn->src_len ? (size_t)offset : fn->src_len;
    return 1 + count_lines(fn->src, n);
}

static const char *func_file(const emitter *em, const fgi_func *fn) {
    if (fn->filename) return fn->filename;
    return em->mod->filename ? em->mod->filename : "<source>";
}

static void line_user(emitter *em, const fgi_func *fn, int offset) {
    fgi_buf_printf(em->out, "#line %d \"", source_line(fn, offset));
    put_string_body(em->out, func_file(em, fn));
    fgi_buf_puts(em->out, "\"\n");
}

/* Back to the generated file's own numbering: the line after the directive
 * is the output's next line. */
static void line_generated(emitter *em) {
    int here = em->out->data ? count_lines(em->out->data, em->out->len) : 0;
    fgi_buf_printf(em->out, "#line %d \"", here + 2);
    put_string_body(em->out, em->gen_name);
    fgi_buf_puts(em->out, "\"\n");
}

/* ---- expressions ------------------------------------------------------------ */

/* e in the readable style (cuda_expr.c), the printer's failure reported as
 * the emitter's. */
static void emit_expr(emitter *em, const fgi_func *fn, const fgi_expr *e) {
    if (em->st != FG_OK) return;
    fgi_cuda_printer p = {.out = em->out, .mod = em->mod, .fn = fn, .style = FGI_CUDA_READABLE,
                          .math = em->math};
    fgi_cuda_print_expr(&p, e);
    if (p.failure) fail(em, p.failure, p.failed_at);
}

/* ---- functions --------------------------------------------------------------- */

/* The statements of one mask_mod / score_mod body, each under a #line. */
static void emit_body(emitter *em, const fgi_func *fn) {
    for (int i = 0; i < fn->nlocals && em->st == FG_OK; i++) {
        const fgi_local *l = &fn->locals[i];
        line_user(em, fn, l->offset);
        fgi_buf_printf(em->out, "    const %s l%d = ", fgi_emit_ctype(l->type), i);
        emit_expr(em, fn, l->init);
        fgi_buf_puts(em->out, ";");
        if (l->name) fgi_buf_printf(em->out, " /* %s */", l->name);
        fgi_buf_puts(em->out, "\n");
    }
    line_user(em, fn, fn->ret_offset);
    fgi_buf_puts(em->out, "    return ");
    emit_expr(em, fn, fn->ret);
    fgi_buf_puts(em->out, ";\n");
    line_generated(em);
}

#define MASK_ARGS "const fg_mod_params &p, int b, int h, int q_idx, int kv_idx"
#define SCORE_ARGS "const fg_mod_params &p, float score, int b, int h, int q_idx, int kv_idx"

static void emit_mask_func(emitter *em, const char *name, const fgi_func *fn) {
    if (fn->kind != FGI_FUNC_MASK || !fn->ret || fn->ret->type != FGI_T_BOOL) {
        fail(em, "a mask_mod that does not return bool", fn->ret);
        return;
    }
    fgi_buf_printf(em->out, "__device__ __forceinline__ bool %s(" MASK_ARGS ") {\n", name);
    emit_body(em, fn);
    fgi_buf_puts(em->out, "}\n\n");
}

/* One helper per leaf of a composed mask, numbered left to right. */
static void emit_mask_parts(emitter *em, const fgi_mask_node *n, int *next) {
    if (em->st != FG_OK) return;
    if (n->op == FGI_MASK_LEAF) {
        char name[32];
        snprintf(name, sizeof name, "fg_mask_part%d", (*next)++);
        if (!n->func) fail(em, "a mask leaf without a function", NULL);
        else emit_mask_func(em, name, n->func);
        return;
    }
    if (!n->a || !n->b) {
        fail(em, "a mask composition with a missing side", NULL);
        return;
    }
    emit_mask_parts(em, n->a, next);
    emit_mask_parts(em, n->b, next);
}

/* The && / || tree over the leaf helpers, in the same left-to-right order. */
static void emit_mask_tree(emitter *em, const fgi_mask_node *n, int *next, int parent_op) {
    if (n->op == FGI_MASK_LEAF) {
        fgi_buf_printf(em->out, "fg_mask_part%d(p, b, h, q_idx, kv_idx)", (*next)++);
        return;
    }
    bool paren = parent_op != 0;
    if (paren) fgi_buf_puts(em->out, "(");
    emit_mask_tree(em, n->a, next, n->op);
    fgi_buf_puts(em->out, n->op == FGI_MASK_AND ? " && " : " || ");
    emit_mask_tree(em, n->b, next, n->op);
    if (paren) fgi_buf_puts(em->out, ")");
}

static void emit_mask(emitter *em) {
    const fgi_mask_node *m = em->mod->mask;
    if (!m) {
        fgi_buf_puts(em->out, "/* No mask_mod: every position is kept. */\n"
                              "__device__ __forceinline__ bool fg_mask_mod(" MASK_ARGS ") {\n"
                              "    return true;\n}\n\n");
        return;
    }
    if (m->op == FGI_MASK_LEAF) {
        if (!m->func) fail(em, "a mask leaf without a function", NULL);
        else emit_mask_func(em, "fg_mask_mod", m->func);
        return;
    }
    int next = 0;
    emit_mask_parts(em, m, &next);
    fgi_buf_puts(em->out, "/* The composition: the right side runs only where the left does not\n"
                          " * decide (FlexAttention's and_masks / or_masks). */\n"
                          "__device__ __forceinline__ bool fg_mask_mod(" MASK_ARGS ") {\n"
                          "    return ");
    next = 0;
    emit_mask_tree(em, m, &next, 0);
    fgi_buf_puts(em->out, ";\n}\n\n");
}

static void emit_score(emitter *em) {
    const fgi_func *fn = em->mod->score;
    if (!fn) {
        fgi_buf_puts(em->out, "/* No score_mod: scores are used as they are. */\n"
                              "__device__ __forceinline__ float fg_score_mod(" SCORE_ARGS ") {\n"
                              "    return score;\n}\n\n");
        return;
    }
    if (fn->kind != FGI_FUNC_SCORE || !fn->ret || fn->ret->type != FGI_T_FLOAT) {
        fail(em, "a score_mod that does not return float", fn->ret);
        return;
    }
    fgi_buf_puts(em->out, "__device__ __forceinline__ float fg_score_mod(" SCORE_ARGS ") {\n");
    emit_body(em, fn);
    fgi_buf_puts(em->out, "}\n\n");
}

/* ---- parameters ------------------------------------------------------------- */

/* The struct is written in declaration order with C++'s natural alignment,
 * which is the host's rule (a buffer's pointer aligned to 8); __align__(8)
 * rounds the size up to 8 as the host does. The asserts turn any drift
 * between the two into a compile error instead of garbage parameters. */
static void emit_params(emitter *em) {
    const fg_mod *mod = em->mod;
    if (mod->nparams > FGI_MAX_PARAMS) {
        if (em->st == FG_OK)
            em->st = fgi_error(em->ctx, FG_ERR_LIMIT, "%d parameters: at most %d are supported",
                               mod->nparams, FGI_MAX_PARAMS);
        return;
    }
    fgi_param_layout layout;
    fgi_param_layout_compute(mod, &layout);
    fgi_buf *out = em->out;
    fgi_buf_puts(out, "/* The mod's parameters, passed by value to every kernel; the host packs\n"
                      " * the same layout (fgi_param_layout_compute). */\n"
                      "struct __align__(8) fg_mod_params {\n");
    for (int i = 0; i < mod->nparams; i++) {
        const fgi_param *prm = &mod->params[i];
        if (prm->kind == FG_PARAM_BUFFER)
            fgi_buf_printf(out, "    const %s *__restrict__ %s;\n    long long fg_len_%s;\n",
                           fgi_emit_ctype(prm->type), prm->name, prm->name);
        else
            fgi_buf_printf(out, "    %s %s;\n", fgi_emit_ctype(prm->type), prm->name);
    }
    for (int i = 0; i < mod->nparams; i++)
        if (fgi_param_has_rcp(&mod->params[i]))
            fgi_buf_printf(out, "    float fg_rcp_%s; /* 1 / %s rounded to nearest (fg_fdiv_by) */\n",
                           mod->params[i].name, mod->params[i].name);
        else if (mod->params[i].divisor)
            fgi_buf_printf(out, "    fg_divisor fg_div_%s; /* %s as a divisor (fg_idiv_by) */\n",
                           mod->params[i].name, mod->params[i].name);
    fgi_buf_puts(out, "    int fg_pad; /* never empty */\n};\n");
    for (int i = 0; i < mod->nparams; i++) {
        const char *n = mod->params[i].name;
        fgi_buf_printf(out, "static_assert(fg_offsetof(fg_mod_params, %s) == %zu, \"%s\");\n",
                       n, layout.offsets[i], n);
        if (mod->params[i].divisor)
            fgi_buf_printf(out, "static_assert(fg_offsetof(fg_mod_params, fg_%s_%s) == %zu, \"%s divisor\");\n",
                           fgi_param_has_rcp(&mod->params[i]) ? "rcp" : "div", n, layout.div_offsets[i], n);
        if (mod->params[i].kind == FG_PARAM_BUFFER)
            fgi_buf_printf(out,
                           "static_assert(fg_offsetof(fg_mod_params, fg_len_%s) == %zu, "
                           "\"%s length\");\n",
                           n, layout.offsets[i] + 8, n);
    }
    fgi_buf_printf(out, "static_assert(sizeof(fg_mod_params) == %zu, \"fg_mod_params size\");\n\n",
                   layout.size);
}

/* ---- the whole mod ------------------------------------------------------------- */

static bool seen_file(const char **files, int n, const char *f) {
    for (int i = 0; i < n; i++)
        if (strcmp(files[i], f) == 0) return true;
    return false;
}

static void collect_files(const fgi_mask_node *n, const char **files, int *nfiles, int cap) {
    if (!n) return;
    if (n->op == FGI_MASK_LEAF) {
        if (n->func && n->func->filename && *nfiles < cap &&
            !seen_file(files, *nfiles, n->func->filename))
            files[(*nfiles)++] = n->func->filename;
        return;
    }
    collect_files(n->a, files, nfiles, cap);
    collect_files(n->b, files, nfiles, cap);
}

static void emit_header(emitter *em) {
    const fg_mod *mod = em->mod;
    const char *files[16];
    int nfiles = 0;
    collect_files(mod->mask, files, &nfiles, 16);
    if (mod->score && mod->score->filename && nfiles < 16 &&
        !seen_file(files, nfiles, mod->score->filename))
        files[nfiles++] = mod->score->filename;
    if (nfiles == 0 && mod->filename) files[nfiles++] = mod->filename;

    fgi_buf *out = em->out;
    fgi_buf_puts(out, "/* ---- the mod: ");
    put_comment_text(out, mod->name ? mod->name : "mod");
    fgi_buf_puts(out, " (");
    for (int i = 0; i < nfiles; i++) {
        if (i) fgi_buf_puts(out, ", ");
        put_comment_text(out, files[i]);
    }
    fgi_buf_puts(out, ")\n * Emitted by flexgen from the checked syntax tree, not copied from the\n"
                      " * file. Its canonical text (the kernel cache key's part):\n *\n");
    const char *c = mod->canonical ? mod->canonical : "";
    while (*c) {
        const char *nl = strchr(c, '\n');
        size_t n = nl ? (size_t)(nl - c) : strlen(c);
        char *line = malloc(n + 1);
        if (!line) {
            out->oom = true;
            return;
        }
        memcpy(line, c, n);
        line[n] = 0;
        fgi_buf_puts(out, n ? " *   " : " *");
        put_comment_text(out, line);
        fgi_buf_puts(out, "\n");
        free(line);
        c += n + (nl ? 1 : 0);
    }
    fgi_buf_puts(out, " */\n");
    const bool runs_score = fgi_mod_runs_score(mod);
    if (mod->score && !runs_score)
        fgi_buf_puts(out, "/* score_mod returns its score unchanged: the kernels skip it. */\n");
    fgi_buf_printf(out, "#define FG_HAS_MASK_MOD %d\n#define FG_HAS_SCORE_MOD %d\n\n",
                   mod->mask ? 1 : 0, runs_score ? 1 : 0);
}

fg_status fgi_emit_mod_math(fg_ctx *ctx, const fg_mod *mod, const char *generated_name, fgi_math math,
                            fgi_buf *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output buffer");
    emitter em = {ctx, mod, out, generated_name && *generated_name ? generated_name
                                                                   : DEFAULT_GENERATED_NAME,
                  FG_OK, FGI_MATH_ACCURATE};
    emit_header(&em);
    emit_params(&em);
    if (em.st == FG_OK) emit_mask(&em);
    em.math = math;
    if (em.st == FG_OK) emit_score(&em);
    if (em.st != FG_OK) return em.st;
    if (out->oom) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory emitting the mod");
    return FG_OK;
}

fg_status fgi_emit_mod_named(fg_ctx *ctx, const fg_mod *mod, const char *generated_name,
                             fgi_buf *out) {
    return fgi_emit_mod_math(ctx, mod, generated_name, FGI_MATH_ACCURATE, out);
}

fg_status fgi_emit_mod(fg_ctx *ctx, const fg_mod *mod, fgi_buf *out) {
    return fgi_emit_mod_math(ctx, mod, NULL, FGI_MATH_ACCURATE, out);
}

/* ---- the derivatives, for the backward kernels ------------------------------------- */

/* A function of score_mod's arguments returning `ret`: the body of one of
 * deriv.c's trees, with #line back to score_mod. */
static void emit_score_shaped(emitter *em, const char *ret, const char *name, int k, const fgi_func *fn) {
    fgi_buf_printf(em->out, "__device__ __forceinline__ %s %s", ret, name);
    if (k >= 0) fgi_buf_printf(em->out, "%d", k);
    fgi_buf_puts(em->out, "(" SCORE_ARGS ") {\n");
    emit_body(em, fn);
    fgi_buf_puts(em->out, "}\n\n");
}

/* The gradient struct: one float pointer and length per buffer that gets a
 * gradient, laid out as fgi_grad_layout_compute says (the host packs it). */
static void emit_grad_struct(emitter *em, const fgi_grad_layout *L) {
    fgi_buf *out = em->out;
    fgi_buf_puts(out, "/* Where the gradients of the float buffers score_mod reads go (NULL: not\n"
                      " * wanted): the backward template's fixed-point accumulators, FGB_FIXED_LIMBS\n"
                      " * int64 per element (fg_grad_add). The host packs the same layout\n"
                      " * (fgi_grad_layout_compute). */\n"
                      "struct __align__(8) fg_mod_grads {\n");
    for (int k = 0; k < L->n; k++) {
        const char *n = em->mod->params[L->param[k]].name;
        fgi_buf_printf(out, "    long long *__restrict__ %s;\n    long long fg_len_%s;\n", n, n);
    }
    fgi_buf_puts(out, "    int fg_pad; /* never empty */\n};\n");
    for (int k = 0; k < L->n; k++) {
        const char *n = em->mod->params[L->param[k]].name;
        fgi_buf_printf(out, "static_assert(fg_offsetof(fg_mod_grads, %s) == %zu, \"%s\");\n", n,
                       L->offset[k], n);
    }
    fgi_buf_printf(out, "static_assert(sizeof(fg_mod_grads) == %zu, \"fg_mod_grads size\");\n\n", L->size);
}

/* The buffer gradients' accumulation. Each thread keeps, per read of
 * score_mod (a site), the element it last added to and its running sum, and
 * hands the sum (a double) to the template's fixed-point fg_grad_add only
 * when the element changes and once at the end (fg_grad_flush, where a
 * warp's threads that hold the same element combine first): a read at an
 * index that stays put over a thread's pairs (ALiBi's slopes[h], a per-head
 * temperature) costs a few atomics per warp instead of one per pair. */
static void emit_grad_accumulate(emitter *em, const fgi_mod_grad *g) {
    fgi_buf *out = em->out;
    fgi_buf_puts(out, "/* The template's: add v to gradient element i's accumulator;\n"
                      " * fg_grad_add_warp first combines the warp's lanes that add to the same\n"
                      " * element (every lane of the warp calls it). */\n"
                      "__device__ __forceinline__ void fg_grad_add(long long *acc, int i, double v);\n"
                      "__device__ __forceinline__ void fg_grad_add_warp(long long *acc, int i, double v);\n\n");
    fgi_buf_printf(out, "/* The number of float buffer reads whose gradients a thread keeps. */\n"
                        "#define FG_GRAD_SITES %d\n",
                   g->nsites);
    fgi_buf_puts(out, "/* A thread's pending sums: per buffer read, the element (-1: none) and the sum. */\n"
                      "struct fg_grad_cache {\n");
    for (int k = 0; k < g->nsites; k++) fgi_buf_printf(out, "    int i%d;\n    double s%d;\n", k, k);
    fgi_buf_puts(out, "    int fg_pad;\n};\n\n"
                      "__device__ __forceinline__ void fg_grad_cache_init(fg_grad_cache &c) {\n");
    for (int k = 0; k < g->nsites; k++) fgi_buf_printf(out, "    c.i%d = -1;\n    c.s%d = 0.0;\n", k, k);
    fgi_buf_puts(out, "    c.fg_pad = 0;\n}\n\n"
                      "/* Add ds * d score_mod / d buf[i] to the gradient of every buffer read. */\n"
                      "__device__ __forceinline__ void fg_accumulate_grads(const fg_mod_params &p, const fg_mod_grads &g, "
                      "fg_grad_cache &c, float ds, float score, int b, int h, int q_idx, int kv_idx) {\n");
    for (int k = 0; k < g->nsites; k++) {
        const char *n = em->mod->params[g->sites[k].param].name;
        fgi_buf_printf(out,
                       "    if (g.%s) {\n"
                       "        const int i = fg_grad_index%d(p, score, b, h, q_idx, kv_idx);\n"
                       "        if (i >= 0 && (long long)i < g.fg_len_%s) {\n"
                       "            const double v = (double)ds * (double)fg_grad_value%d(p, score, b, h, q_idx, kv_idx);\n"
                       "            if (i == c.i%d) {\n"
                       "                c.s%d += v;\n"
                       "            } else {\n"
                       "                if (c.i%d >= 0) fg_grad_add(g.%s, c.i%d, c.s%d);\n"
                       "                c.i%d = i;\n"
                       "                c.s%d = v;\n"
                       "            }\n"
                       "        }\n"
                       "    }\n",
                       n, k, n, k, k, k, k, n, k, k, k, k);
    }
    if (g->nsites == 0)
        fgi_buf_puts(out, "    (void)p, (void)g, (void)c, (void)ds, (void)score, (void)b, (void)h, (void)q_idx, "
                          "(void)kv_idx;\n");
    fgi_buf_puts(out, "}\n\n"
                      "/* The pending sums, at the end (every lane of the warp calls it). */\n"
                      "__device__ __forceinline__ void fg_grad_flush(const fg_mod_grads &g, fg_grad_cache &c) {\n");
    for (int k = 0; k < g->nsites; k++) {
        const char *n = em->mod->params[g->sites[k].param].name;
        fgi_buf_printf(out, "    if (g.%s) fg_grad_add_warp(g.%s, c.i%d, c.s%d);\n", n, n, k, k);
    }
    if (g->nsites == 0) fgi_buf_puts(out, "    (void)g, (void)c;\n");
    fgi_buf_puts(out, "}\n\n"
                      "/* Whether any buffer gradient is wanted (the same for the whole launch). */\n"
                      "__device__ __forceinline__ bool fg_grads_wanted(const fg_mod_grads &g) {\n"
                      "    return false");
    for (int k = 0; k < g->nsites; k++)
        fgi_buf_printf(out, " || g.%s", em->mod->params[g->sites[k].param].name);
    fgi_buf_puts(out, ";\n}\n\n");
}

fg_status fgi_emit_grad_math(fg_ctx *ctx, const fg_mod *mod, const char *generated_name, fgi_math math,
                             fgi_buf *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output buffer");
    fgi_mod_grad g;
    FGI_TRY(fgi_mod_derive(ctx, mod, &g));
    /* every function here is score_mod's, or its derivative */
    emitter em = {ctx, mod, out, generated_name && *generated_name ? generated_name
                                                                   : DEFAULT_GENERATED_NAME,
                  FG_OK, math};
    fgi_grad_layout L;
    fgi_grad_layout_compute(&g, &L);
    fgi_buf_puts(out, "/* ---- the derivatives of score_mod (src/mod/deriv.c), emitted from its\n"
                      " * checked tree: d score_mod / d score, and for each float buffer read the\n"
                      " * element read and d score_mod / d (the value read). */\n");
    emit_grad_struct(&em, &L);
    /* A derivative that is a finite constant (1 without a score_mod, as
     * for ALiBi's score + bias) is finite wherever P underflows to 0, so
     * the backward's element loop needs no guard there (FG_SCORE_GRAD_CONST,
     * templates/attention/attention_bwd_sm90.cuh). */
    float grad_value = 1.0f;
    const bool grad_const = !g.d_score || (fgi_func_const_float(g.d_score, &grad_value) && isfinite(grad_value));
    fgi_buf_printf(out, "#define FG_SCORE_GRAD_CONST %d\n\n", grad_const ? 1 : 0);
    if (g.d_score) {
        emit_score_shaped(&em, "float", "fg_score_grad", -1, g.d_score);
    } else {
        fgi_buf_puts(out, "/* No score_mod: the score is used as it is, its derivative is 1. */\n"
                          "__device__ __forceinline__ float fg_score_grad(" SCORE_ARGS ") {\n"
                          "    return 1.0f;\n}\n\n");
    }
    for (int k = 0; k < g.nsites && em.st == FG_OK; k++) {
        emit_score_shaped(&em, "int", "fg_grad_index", k, g.sites[k].index);
        emit_score_shaped(&em, "float", "fg_grad_value", k, g.sites[k].grad);
    }
    emit_grad_accumulate(&em, &g);
    fgi_mod_grad_free(&g);
    if (em.st != FG_OK) return em.st;
    if (out->oom) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory emitting the derivatives");
    return FG_OK;
}

fg_status fgi_emit_grad(fg_ctx *ctx, const fg_mod *mod, const char *generated_name, fgi_buf *out) {
    return fgi_emit_grad_math(ctx, mod, generated_name, FGI_MATH_ACCURATE, out);
}
