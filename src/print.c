/* print.c -- placeholder until the module lands. */
#include "internal.h"
typedef int fgi_placeholder_print;
