/*
 * flexgen/mod.h -- lets a host C compiler build a mod file.
 *
 * flexgen never compiles this header: it parses mod files itself and accepts
 * `#include <flexgen/mod.h>` as their only preprocessor line. The header
 * exists so that a mod is also plain C11 an editor, a linter or a unit test
 * can compile (`cc -std=c11 -I include -c mods/natten.c`): it supplies
 * `bool`, INFINITY and the builtin functions of the mod language with their
 * meanings (docs/mod-language.md). abs / min / max / clamp pick their int or
 * float version from the argument types, as the mod language does.
 */
#ifndef FLEXGEN_MOD_H
#define FLEXGEN_MOD_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static inline int fg_mod_min_i(int a, int b) { return a < b ? a : b; }
static inline int fg_mod_max_i(int a, int b) { return a > b ? a : b; }
static inline float fg_mod_min_f(float a, float b) { return fminf(a, b); }
static inline float fg_mod_max_f(float a, float b) { return fmaxf(a, b); }
static inline int fg_mod_clamp_i(int x, int lo, int hi) { return fg_mod_min_i(fg_mod_max_i(x, lo), hi); }
static inline float fg_mod_clamp_f(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
static inline float fg_mod_abs_f(float x) { return fabsf(x); }
static inline int fg_mod_abs_i(int x) { return x < 0 ? -x : x; }

#define FG_MOD_PICK(x, fi, ff) _Generic((x), int: fi, default: ff)
#undef abs
#define abs(x) FG_MOD_PICK((x), fg_mod_abs_i, fg_mod_abs_f)(x)
#define min(a, b) FG_MOD_PICK((a) + (b), fg_mod_min_i, fg_mod_min_f)((a), (b))
#define max(a, b) FG_MOD_PICK((a) + (b), fg_mod_max_i, fg_mod_max_f)((a), (b))
#define clamp(x, lo, hi) FG_MOD_PICK((x) + (lo) + (hi), fg_mod_clamp_i, fg_mod_clamp_f)((x), (lo), (hi))

static inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif /* FLEXGEN_MOD_H */
