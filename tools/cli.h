/*
 * cli.h -- what the subcommands of the flexgen tool share (cli_util.c,
 * random.c, paged.c): exit codes, error reporting, number lists, the
 * tool's names of the kernel kinds, the options that name a mod (--mask,
 * --score, --expr-mask, --expr-score, --param), the options that give its
 * parameters values (--set, --buffer), which buffers get gradients in the
 * backward pass, random numbers and paged K/V caches.
 *
 * A subcommand adds FG_CLI_MOD_LONGOPTS (and FG_CLI_BIND_LONGOPTS) to its
 * getopt_long table and passes every option it does not know itself to
 * fg_cli_mod_option, which records it. After parsing:
 *
 *     fg_mod *mod;
 *     int rc = fg_cli_load_mod(ctx, &ma, &mod);          diagnostics printed
 *     if (rc) return rc;
 *     fg_cli_bindings bb;
 *     rc = fg_cli_bind(ctx, mod, &ma, &bb);              host values
 *     ... bb.binds, bb.n ...
 *     fg_cli_bindings_free(&bb);
 *
 * Every function prints its own message to stderr ("flexgen: ...") and
 * returns an exit code, so a caller can simply return what it got.
 */
#ifndef FLEXGEN_TOOLS_CLI_H
#define FLEXGEN_TOOLS_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flexgen.h"

/* ---- exit codes (listed by `flexgen --help`) ---------------------------- */

enum {
    FG_EXIT_OK = 0,        /* success                                        */
    FG_EXIT_USAGE = 1,     /* bad command line                               */
    FG_EXIT_BAD_MOD = 2,   /* the mod does not parse or check (diagnostic)   */
    FG_EXIT_COMPILE = 3,   /* NVRTC failed (log printed)                     */
    FG_EXIT_NO_GPU = 4,    /* no libcuda, driver or device                   */
    FG_EXIT_TOLERANCE = 5, /* a check found results outside tolerance        */
    FG_EXIT_OTHER = 6      /* any other error                                */
};

/* The exit code for a library status. */
int fg_cli_exit_code(fg_status st);

/* Print the error last recorded on ctx to stderr -- the caret diagnostic
 * for mod errors, the NVRTC log for compile errors -- prefixed by `what`
 * (may be NULL), and return fg_cli_exit_code(st). */
int fg_cli_fail(fg_ctx *ctx, fg_status st, const char *what);

/* printf to stderr with a "flexgen: " prefix and a newline; returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
int fg_cli_error(int code, const char *fmt, ...);

/* Parse a whole decimal int in [lo, hi] (`what` names the option in the
 * message). 0 on success, FG_EXIT_USAGE after printing a message. */
int fg_cli_parse_int(const char *s, const char *what, long long lo, long long hi, int *out);
int fg_cli_parse_double(const char *s, const char *what, double *out);
/* A comma-separated list of whole numbers, each in [lo, hi], into a new
 * malloc'd array of *n values (at least one). 0 on success, FG_EXIT_USAGE
 * after printing a message (or FG_EXIT_OTHER when out of memory). */
int fg_cli_parse_int_list(const char *s, const char *what, long long lo, long long hi, int32_t **out, int *n);

/* ---- kernel kinds ---------------------------------------------------------- */

/* The tool's names of the kernel kinds, as `flexgen --kernel` takes them
 * ("attention", "attention-sm90", "decode" ...), in one table with their
 * kinds. */
#define FG_CLI_KERNEL_KINDS 6
extern const char *const fg_cli_kernel_names[FG_CLI_KERNEL_KINDS];
extern const fg_kernel_kind fg_cli_kernel_kinds[FG_CLI_KERNEL_KINDS];
/* The name of `kind`, "?" for none of them. */
const char *fg_cli_kernel_name(fg_kernel_kind kind);

/* ---- mod and binding options -------------------------------------------- */

/* getopt_long values of the shared options (above any short option). */
enum {
    FG_CLI_OPT_MASK = 0x1000, /* --mask FILE                                   */
    FG_CLI_OPT_SCORE,         /* --score FILE                                  */
    FG_CLI_OPT_EXPR_MASK,     /* --expr-mask 'EXPR'                            */
    FG_CLI_OPT_EXPR_SCORE,    /* --expr-score 'EXPR'                           */
    FG_CLI_OPT_PARAM,         /* --param int:NAME=V | float:NAME=V |
                                 buffer-int:NAME | buffer-float:NAME           */
    FG_CLI_OPT_SET,           /* --set NAME=VALUE                              */
    FG_CLI_OPT_BUFFER         /* --buffer NAME=FILE                            */
};

#define FG_CLI_MOD_LONGOPTS                                              \
    {"mask", required_argument, 0, FG_CLI_OPT_MASK},                     \
    {"score", required_argument, 0, FG_CLI_OPT_SCORE},                   \
    {"expr-mask", required_argument, 0, FG_CLI_OPT_EXPR_MASK},           \
    {"expr-score", required_argument, 0, FG_CLI_OPT_EXPR_SCORE},         \
    {"param", required_argument, 0, FG_CLI_OPT_PARAM}
#define FG_CLI_BIND_LONGOPTS                                             \
    {"set", required_argument, 0, FG_CLI_OPT_SET},                       \
    {"buffer", required_argument, 0, FG_CLI_OPT_BUFFER}

/* The help text of those options, for a subcommand's --help. */
extern const char fg_cli_mod_help[];
extern const char fg_cli_bind_help[];

#define FG_CLI_MAX_ITEMS 64

typedef struct fg_cli_mod_args {
    const char *mask_file, *score_file;  /* --mask / --score               */
    const char *mask_expr, *score_expr;  /* --expr-mask / --expr-score     */
    fg_param_decl decls[FG_CLI_MAX_ITEMS]; /* --param, in order            */
    char decl_names[FG_CLI_MAX_ITEMS][64];
    int ndecls;
    const char *sets[FG_CLI_MAX_ITEMS];    /* --set NAME=VALUE, raw        */
    int nsets;
    const char *buffers[FG_CLI_MAX_ITEMS]; /* --buffer NAME=FILE, raw      */
    int nbuffers;
} fg_cli_mod_args;

/* Start with everything empty. */
void fg_cli_mod_args_init(fg_cli_mod_args *a);

/* Record one of the shared options. Returns 1 when `opt` was one of them
 * and is recorded, 0 when it is not one of them, -1 after printing a usage
 * message (then exit with FG_EXIT_USAGE). `arg` is kept by pointer. */
int fg_cli_mod_option(fg_cli_mod_args *a, int opt, const char *arg);

/* Whether any mod was named. */
int fg_cli_has_mod(const fg_cli_mod_args *a);

/* Build the mod: the mask (file or expression) and the score (file or
 * expression) combined with fg_mod_combine. --param declarations apply to
 * the expressions. Prints a caret diagnostic and returns FG_EXIT_BAD_MOD on
 * a bad mod; FG_EXIT_USAGE when no mod or two masks / scores were given. */
int fg_cli_load_mod(fg_ctx *ctx, const fg_cli_mod_args *a, fg_mod **out);

/* Values for the mod's parameters from --set and --buffer (host memory). */
typedef struct fg_cli_bindings {
    fg_binding binds[FG_CLI_MAX_ITEMS];
    size_t n;
    void *owned[FG_CLI_MAX_ITEMS]; /* buffer arrays, freed by _free      */
    char names[FG_CLI_MAX_ITEMS][64];
} fg_cli_bindings;

/* --set NAME=VALUE takes the parameter's declared type (an int parameter
 * needs a whole number in int range). --buffer NAME=FILE reads FILE as the
 * buffer's element type: *.i32 / *.f32 files are raw little-endian arrays,
 * anything else is text, whitespace- or comma-separated numbers. Unknown
 * names, kinds that do not match and unreadable files are errors
 * (FG_EXIT_USAGE / FG_EXIT_OTHER). Buffers not given are left unbound. */
int fg_cli_bind(fg_ctx *ctx, const fg_mod *mod, const fg_cli_mod_args *a, fg_cli_bindings *out);
void fg_cli_bindings_free(fg_cli_bindings *b);

/* Read a numbers file as above into a malloc'd int32_t or float array. */
int fg_cli_read_numbers(const char *path, fg_type type, void **data, int64_t *count);

/* ---- the backward pass --------------------------------------------------- */

/* The float buffer parameters of mod whose gradients the backward computes:
 * those score_mod's value depends on (the ones a gradient binding may name),
 * in parameter order. Their names (owned by mod) go to names[0 .. *n);
 * none without a score_mod. Returns a library status, the error recorded
 * on ctx (FG_ERR_NOT_SUPPORTED when there are more than `max`). */
fg_status fg_cli_grad_buffers(fg_ctx *ctx, const fg_mod *mod, const char **names, int max, int *n);

/* ---- random numbers (random.c) ------------------------------------------ */

/* xorshift64*: the stream of every subcommand's random inputs, so a seed
 * gives the same numbers wherever it is used (a state of 0 stays 0). */
uint64_t fg_cli_rand_u64(uint64_t *state);
/* 53 random bits as a double in [0, 1). */
double fg_cli_rand_uniform(uint64_t *state);
/* The same bits as a double in (0, 1]: never 0, so its log is finite. */
double fg_cli_rand_uniform_pos(uint64_t *state);
/* Advance *state by `draws` draws at once (a bit-matrix power). */
void fg_cli_rand_skip(uint64_t *state, uint64_t draws);
/* What draws elements begin..end-1 of a tensor from the stream at *state,
 * `draws` draws each, in order. */
typedef void fg_cli_fill_fn(void *arg, size_t begin, size_t end, uint64_t *state);
/* fill(arg, 0, n, state) in pieces on up to one thread a core: each piece
 * starts from the state one thread drawing the elements before it in order
 * would reach, so every value is the one a single run gives, and *state
 * ends n * draws draws on, where that run leaves it. */
void fg_cli_rand_fill(uint64_t *state, size_t n, unsigned draws, fg_cli_fill_fn *fill, void *arg);

/* ---- paged K/V caches (paged.c) ---------------------------------------- */

/* A block table for a paged cache [num_pages, page_size, heads_kv, D] (the
 * layout of vLLM and FlashInfer): sequence b owns the first
 * ceil(len_b / page_size) entries of its row of `table`, [batch][max_pages];
 * the entries past them are -1. */
typedef struct fg_cli_paging {
    int batch, page_size, max_pages, num_pages;
    int32_t *table;
} fg_cli_paging;

/* Pages no sequence owns, mixed among the owned ones. */
#define FG_CLI_SPARE_PAGES 5

/* Hand out pages to `batch` sequences of lengths lens[b] (NULL: kv_len
 * each; every length at most kv_len >= 1) in the order of a random
 * permutation of [0, num_pages) drawn from `seed`, with
 * FG_CLI_SPARE_PAGES pages left over, so that page ids are neither in
 * order nor all used. 0, or -1 when out of memory or past the int range. */
int fg_cli_paging_make(int batch, int kv_len, const int32_t *lens, int page_size, uint64_t seed,
                       fg_cli_paging *p);
void fg_cli_paging_free(fg_cli_paging *p);

/* A new cache holding x, a contiguous [batch, heads_kv, kv_len, D] tensor
 * of 16-bit values, in p's pages: key j of sequence b at row j % page_size
 * of page table[b][j / page_size]. Rows past a sequence's length (lens as
 * above) and the pages nobody owns hold `fill`. NULL when out of memory. */
uint16_t *fg_cli_paged_copy(const fg_cli_paging *p, const uint16_t *x, int heads_kv, int kv_len, int head_dim,
                            const int32_t *lens, uint16_t fill);
/* Elements of p's cache. */
size_t fg_cli_paged_elems(const fg_cli_paging *p, int heads_kv, int head_dim);

/* ---- subcommands (cmd_*.c, bench/; absent ones print "not available") --- */

int fg_cmd_blockmask(int argc, char **argv);
int fg_cmd_check(int argc, char **argv);
int fg_cmd_bench(int argc, char **argv);

#endif
