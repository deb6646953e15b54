/*
 * ast.c -- the vocabulary of the typed tree that every stage shares: type
 * names, the canonical argument names, parameter lookup by name. It depends
 * on nothing but internal.h, so the checker, the printer, the bindings and
 * the emitter can all use it without calling each other.
 */
#include "mod/front.h"

#include <string.h>

const char *const fgi_canonical_arg_names[5] = {"b", "h", "q_idx", "kv_idx", "score"};

const char *fgi_type_name(fgi_type t) {
    switch (t) {
    case FGI_T_BOOL: return "bool";
    case FGI_T_INT: return "int";
    case FGI_T_FLOAT: return "float";
    default: return "none";
    }
}

int fgi_mod_find_param(const fg_mod *mod, const char *name) {
    if (!mod || !name) return -1;
    for (int i = 0; i < mod->nparams; i++)
        if (strcmp(mod->params[i].name, name) == 0) return i;
    return -1;
}
