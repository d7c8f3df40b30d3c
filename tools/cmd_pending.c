/* TEMPORARY: commands not yet written. */
#include "cli.h"
#define PENDING(name) int name(cli_ctx *c, int argc, char **argv) { (void)argc, (void)argv; cli_error(c, #name " not built yet"); return cli_sync(c); }
PENDING(cmd_plan)
