/* flexgen -- the command-line tool (placeholder until the CLI lands). */
#include <stdio.h>
#include "flexgen.h"
int main(void) {
    printf("flexgen %s\n", fg_version_string());
    return 0;
}
