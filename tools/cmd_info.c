/* cmd_info.c: `dsv4cp info`: what this build runs on, as the other commands see it: library
 * version, the OpenBLAS kernels chosen (after the CLI's own choice, see dsv4cp.c), threads, and the
 * BLAS probe that decides whether CP = N can be bitwise equal to CP = 1 (src/util/gemm.h). Tests
 * read the probe from here rather than from a separate program, so that it runs under exactly the
 * kernels the CLI uses. */
#include <omp.h>
#include <stdio.h>

#include "cli.h"

/* OpenBLAS's name of the kernels it picked (e.g. "SkylakeX"). */
extern char *openblas_get_corename(void);

static const char *USAGE =
    "usage: dsv4cp info [--threads N]\n"
    "\n"
    "Prints the library version, the OpenBLAS kernels in use, threads per rank, and whether a BLAS\n"
    "row's bits are independent of its position in a call (then CP = N forward outputs are bitwise\n"
    "equal to CP = 1).";

int cmd_info(cli_ctx *c, int argc, char **argv) {
  const char *threads = NULL;
  const cli_opt opts[] = {{"threads", "N", "OpenMP threads per rank (default: cores / ranks)", &threads, NULL},
                          {0}};
  const int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p > 0) return 0;
  if (p == 0) cli_set_threads(c, threads);
  if (cli_sync(c)) return 1;
  const int invariant = dsv4_blas_probe_invariance();
  cli_say(c, "dsv4cp %s (header %s)\n", dsv4_version(), DSV4_VERSION_STRING);
  cli_say(c, "openblas kernels: %s\n", openblas_get_corename());
  cli_say(c, "ranks: %d, threads per rank: %d\n", c->size, omp_get_max_threads());
  cli_say(c, "BLAS rows position invariant: %s\n", invariant ? "yes" : "no");
  return 0;
}
