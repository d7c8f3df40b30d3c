/* dsv4cp.c: the command-line program: dispatch to the commands, MPI start/stop, and the choice of
 * OpenBLAS kernels. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "dsv4cp_io.h"

static const char *USAGE =
    "usage: dsv4cp <command> [options]     (under mpirun -np N the work is split over N ranks)\n"
    "\n"
    "commands:\n"
    "  run     one layer forward (and backward with --grad-output) on files or random data\n"
    "  demo    V4-Flash-shaped layers of every kind: speed, self-check against the naive path,\n"
    "          and CP = N against CP = 1\n"
    "  check   CP = N against CP = 1 recomputed on rank 0: max differences, bitwise equality\n"
    "  train   K steps of plain SGD on a synthetic objective; the loss per step\n"
    "  bench   the benchmark report (also: make bench)\n"
    "  plan    bytes per message kind and resident memory per rank, from the formulas in docs/\n"
    "  info    version, BLAS kernels, threads, and whether CP results can be bitwise equal\n"
    "  weights the tensors a layer needs from a checkpoint (sharded, FP8): list, load and check, export\n"
    "\n"
    "Run 'dsv4cp <command> --help' for a command's options.";

/* OpenBLAS picks its kernels when the library loads, from OPENBLAS_CORETYPE or cpuid; on CPUs newer
 * than its table (Sapphire Rapids, for Debian's 0.3.21) cpuid falls back to SSE3
 * "Prescott" kernels, 8x slower. So, unless the user chose, pick the AVX-512 or AVX2 kernels and
 * re-execute once (before MPI_Init, so every rank does the same). A user's OPENBLAS_CORETYPE is
 * honoured even when it is slower than the CPU's own family; `dsv4cp info` says so. */
static void choose_blas_kernels(char **argv) {
  if (getenv("OPENBLAS_CORETYPE") || getenv("DSV4_NO_REEXEC")) return;
  const char *core = cli_cpu_blas_kernels();
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);
  /* exec failed: continue with whatever kernels OpenBLAS chose */
}

/* Started without a process manager (no mpirun, srun, hydra), Open MPI 4.1 makes this process a
 * singleton: it forks a helper daemon, and its default messaging layer opens the Omni-Path
 * component, whose library's constructor sleeps ~0.2 s calibrating hardware most machines lack.
 * A one-process run talks to nobody, so unless the user set them, ask for a singleton without the
 * daemon and for the plain ob1 layer: start-up 0.45 -> 0.07 s on the test machine, the same
 * results (ob1 is what the default falls back to). An isolated singleton always takes the same job
 * name, so two started at once made and removed the same session directory
 * (/tmp/ompi.<host>.<uid>/jf.0/1) and one of them, about 1 start in 200 with three running side by
 * side, failed in MPI_Init with "mkdir ... File exists"; a lone process needs no session directory
 * (no shared-memory peers), so none is made. Under a launcher nothing is changed. */
static void quiet_singleton_mpi(void) {
  static const char *launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD",
                                   "SLURM_PROCID", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK"};
  for (size_t i = 0; i < sizeof launched / sizeof launched[0]; i++)
    if (getenv(launched[i])) return;
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  setenv("OMPI_MCA_pml", "ob1", 0);
  setenv("OMPI_MCA_orte_create_session_dirs", "0", 0);
}

int main(int argc, char **argv) {
  choose_blas_kernels(argv);
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    puts(USAGE);
    return argc < 2 ? 2 : 0;
  }
  static const struct {
    const char *name;
    int (*fn)(cli_ctx *, int, char **);
  } cmds[] = {{"run", cmd_run},     {"demo", cmd_demo},   {"check", cmd_check},
              {"train", cmd_train}, {"bench", cmd_bench}, {"plan", cmd_plan},
              {"info", cmd_info},   {"weights", cmd_weights}};
  int (*fn)(cli_ctx *, int, char **) = NULL;
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) fn = cmds[i].fn;
  if (!fn) {
    char e[256];
    fprintf(stderr, "dsv4cp: error: unknown command '%s' (see dsv4cp --help)\n", dsv4_escape(e, sizeof e, argv[1]));
    return 2;
  }
  int provided = 0;
  quiet_singleton_mpi();
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  cli_ctx c = {.comm = MPI_COMM_WORLD};
  MPI_Comm_rank(c.comm, &c.rank);
  MPI_Comm_size(c.comm, &c.size);
  MPI_Comm_dup(MPI_COMM_WORLD, &c.sync_comm);
  cli_install_signal_cleanup(); /* after MPI_Init, so that ours are the handlers in place */
  int rc = fn(&c, argc, argv);
  MPI_Comm_free(&c.sync_comm);
  MPI_Finalize();
  return rc;
}
