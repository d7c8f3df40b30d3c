/* cmd_info.c: `dsv4cp info`: what this build runs on, as the other commands see it: library
 * version, the OpenBLAS kernels chosen (after the CLI's own choice, see dsv4cp.c), threads, and the
 * BLAS probe that decides whether CP = N can be bitwise equal to CP = 1 (src/util/gemm.h), and the
 * BLAS fingerprint the ranks of a CP job must share (compared across ranks under mpirun). Tests
 * read the probe from here rather than from a separate program, so that it runs under exactly the
 * kernels the CLI uses. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "cli.h"
#include "dsv4cp_io.h"

static const char *USAGE =
    "usage: dsv4cp info [--threads N]\n"
    "\n"
    "Prints the library version, the OpenBLAS kernels in use (and a note when they are slower than\n"
    "the ones this CPU can run), threads per rank, and whether a BLAS row's bits are independent of\n"
    "its position in a call (then CP = N forward outputs are bitwise equal to CP = 1), and the BLAS\n"
    "fingerprint every CP forward compares between ranks (under mpirun: whether the ranks share it,\n"
    "naming each kernel family that differs).";

/* How wide the kernels of an OpenBLAS core name are: 3 for the AVX-512 families, 2 for AVX2 (Zen runs
 * the Haswell kernels), 1 for anything older. */
static int kernel_tier(const char *name) {
  static const char *avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"}, *avx2[] = {"Haswell", "Zen"};
  for (size_t i = 0; i < sizeof avx512 / sizeof avx512[0]; i++)
    if (!strcasecmp(name, avx512[i])) return 3;
  for (size_t i = 0; i < sizeof avx2 / sizeof avx2[0]; i++)
    if (!strcasecmp(name, avx2[i])) return 2;
  return 1;
}

/* Before a CP job: the BLAS fingerprint every CP forward compares (dsv4cp.h), and under mpirun
 * whether the ranks share it, naming each kernel family that differs from rank 0's with its first
 * rank (a job over ranks that differ stops at its first forward). */
static int blas_agreement(cli_ctx *c, const char *core) {
  typedef struct {
    uint64_t fp;
    char name[40];
  } rec;
  rec mine = {dsv4_blas_fingerprint(), {0}};
  snprintf(mine.name, sizeof mine.name, "%s", core ? core : "?");
  if (c->size == 1) {
    cli_say(c, "BLAS fingerprint: %016llx (every rank of a CP job must have the same)\n", (unsigned long long)mine.fp);
    return 0;
  }
  rec *all = c->rank == 0 ? calloc((size_t)c->size, sizeof *all) : NULL;
  if (c->rank == 0 && !all) cli_error(c, "out of memory");
  if (cli_sync(c)) return 1; /* (before the gather: rank 0 has somewhere to put it) */
  MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, c->comm);
  if (c->rank == 0) {
    int same = 1;
    for (int q = 1; q < c->size; q++) same &= all[q].fp == all[0].fp;
    if (same) {
      cli_say(c, "BLAS fingerprint: %016llx on every rank (the ranks round alike)\n",
              (unsigned long long)all[0].fp);
    } else {
      cli_say(c, "BLAS fingerprint: the ranks differ, so a CP job over them stops at its first forward: "
              "rank 0 '%s' %016llx", all[0].name, (unsigned long long)all[0].fp);
      for (int q = 1; q < c->size; q++) {
        int seen = all[q].fp == all[0].fp;
        for (int p = 1; p < q && !seen; p++) seen = all[p].fp == all[q].fp;
        if (!seen) cli_say(c, ", rank %d '%s' %016llx", q, all[q].name, (unsigned long long)all[q].fp);
      }
      cli_say(c, "\n");
    }
  }
  free(all);
  return 0;
}

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
  const char *core = openblas_get_corename(), *best = cli_cpu_blas_kernels(), *env = getenv("OPENBLAS_CORETYPE");
  cli_say(c, "openblas kernels: %s\n", core);
  /* An inherited OPENBLAS_CORETYPE=Haswell on an AVX-512 machine halves every large product
   * (docs/perf.md measures 98 against 202 GFLOP/s on a Zen 5); say so, since nothing else does. */
  if (best && kernel_tier(core) < kernel_tier(best)) {
    char e[64]; /* the user's text, printed as such: control characters escaped */
    if (env)
      cli_say(c, "note: this CPU runs the %s kernels, but OPENBLAS_CORETYPE=%s selects %s; large products may "
              "run at half speed or less (unset it to let dsv4cp choose)\n", best, dsv4_escape(e, sizeof e, env), core);
    else
      cli_say(c, "note: this CPU runs the %s kernels, but OpenBLAS loaded %s; large products may run at half "
              "speed or less (set OPENBLAS_CORETYPE=%s)\n", best, core, best);
  }
  cli_say(c, "ranks: %d, threads per rank: %d\n", c->size, omp_get_max_threads());
  cli_say(c, "BLAS rows position invariant: %s\n", invariant ? "yes" : "no");
  return blas_agreement(c, core);
}
