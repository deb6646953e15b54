/*
 * builtins.c -- the builtin functions of the mod language as the checker
 * and the emitters ask for them, all read from builtins.def: canonical
 * names, argument counts, whether an int version exists, the C spellings
 * accepted for them, the CUDA spellings by result type (and the float
 * version's under approximate math), the cost, and the derivative rules.
 */
#include "mod/front.h"

#include <string.h>

static const fgi_builtin_info infos[FGI_FN_COUNT] = {
#define FGI_BUILTIN(ID, NAME, ARITY, GENERIC, C_INT, C_FLOAT, CUDA_INT, CUDA_FLOAT, CUDA_APPROX, COSTLY, DX, \
                    DY, DZ)                                                                                 \
    [FGI_FN_##ID] = {NAME, ARITY, GENERIC, CUDA_INT, CUDA_FLOAT, CUDA_APPROX, COSTLY, {DX, DY, DZ}},
#include "builtins.def"
};

/* C's spellings. */
static const struct {
    const char *name;
    fgi_builtin fn;
    bool force_float;
} aliases[] = {
#define FGI_BUILTIN(...)
#define FGI_BUILTIN_ALIAS(NAME, ID, FORCE_FLOAT) {NAME, FGI_FN_##ID, FORCE_FLOAT},
#include "builtins.def"
};

const fgi_builtin_info *fgi_builtin_get(int fn) {
    return fn >= 0 && fn < FGI_FN_COUNT ? &infos[fn] : NULL;
}

int fgi_builtin_lookup(const char *name, bool *force_float) {
    *force_float = false;
    for (int i = 0; i < FGI_FN_COUNT; i++)
        if (strcmp(infos[i].name, name) == 0) return i;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(aliases[i].name, name) == 0) {
            *force_float = aliases[i].force_float;
            return (int)aliases[i].fn;
        }
    return -1;
}

int fgi_builtin_arity(fgi_builtin fn) {
    return (unsigned)fn < FGI_FN_COUNT ? infos[fn].arity : 0;
}

const char *fgi_builtin_name(fgi_builtin fn) {
    return (unsigned)fn < FGI_FN_COUNT ? infos[fn].name : "?";
}
