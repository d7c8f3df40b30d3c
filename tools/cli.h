/* cli.h: what every dsv4cp command shares: MPI set-up, option parsing, and the error rule: a
 * failure on any rank becomes one line on stderr on EVERY rank and a non-zero exit, never a hang. */
#ifndef DSV4_CLI_H
#define DSV4_CLI_H

#include <mpi.h>
#include <stdint.h>

#include "dsv4cp.h"
#include "progress.h"

#define CLI_MSG_LEN 512

typedef struct {
  int rank, size;
  MPI_Comm comm;      /* the CLI's own data collectives (gathers, timings) */
  MPI_Comm sync_comm; /* only for cli_sync: never confused with a collective another rank is in */
  char err[CLI_MSG_LEN]; /* this rank's first error, empty when none */
  progress *progress;    /* the command's progress line, or NULL (see progress.h) */
} cli_ctx;

/* Records an error on this rank (the first one wins). The message is escaped (control bytes and
 * bytes >= 0x7f as \xNN): it may quote argv or file contents, and must print as one line. */
void cli_error(cli_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records the library's last error for status rc (no-op when rc is DSV4_OK); returns rc != OK. */
int cli_lib(cli_ctx *c, dsv4_status rc);
/* Collective: 1 when any rank has recorded an error. Then every rank holds the message of the
 * lowest failing rank in c->err and has printed it. When a failing rank's peers do not arrive
 * (blocked in a message that will never come) it aborts the job after CLI_SYNC_TIMEOUT seconds
 * instead of waiting forever. */
int cli_sync(cli_ctx *c);
/* Prints this rank's error and aborts the whole job (for failures inside collective work, where
 * the other ranks may be blocked in a message that will never come). */
void cli_abort(cli_ctx *c);
/* Rank 0 prints to stdout (results), keeping a progress line below it. */
void cli_say(const cli_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Tells the progress line (if any) that the named phase starts (progress_phase). */
void cli_phase(cli_ctx *c, const char *name);

/* Options: --name value, or --name for flags. */
typedef struct {
  const char *name;     /* without the leading dashes */
  const char *meta;     /* value placeholder for --help; NULL for a flag */
  const char *help;
  const char **value;   /* set to the argument (value options) */
  int *flag;            /* set to 1 (flags) */
} cli_opt;

/* Parses argv[first..]. Returns 0 on success, 1 when --help was printed, -1 on error (recorded). */
int cli_parse(cli_ctx *c, int argc, char **argv, int first, const cli_opt *opts, const char *usage);
/* Integer option value within [lo, hi]; records an error naming the option otherwise. */
int cli_int(cli_ctx *c, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);

/* Sets OpenMP threads per rank: --threads when given, else cores / ranks on this node. */
void cli_set_threads(cli_ctx *c, const char *threads_opt);

/* The OpenBLAS kernel family this CPU runs best ("SkylakeX" with AVX-512, "Haswell" with AVX2), or
 * NULL when it has neither (then OpenBLAS's own choice stands). */
const char *cli_cpu_blas_kernels(void);
/* OpenBLAS's name of the kernels it loaded (e.g. "SkylakeX"). */
extern char *openblas_get_corename(void);

/* The commands. */
int cmd_run(cli_ctx *c, int argc, char **argv);
int cmd_demo(cli_ctx *c, int argc, char **argv);
int cmd_check(cli_ctx *c, int argc, char **argv);
int cmd_train(cli_ctx *c, int argc, char **argv);
int cmd_bench(cli_ctx *c, int argc, char **argv);
int cmd_plan(cli_ctx *c, int argc, char **argv);
int cmd_info(cli_ctx *c, int argc, char **argv);
int cmd_weights(cli_ctx *c, int argc, char **argv);

/* SIGINT / SIGTERM: remove the temporary file of an output being written, then die by the signal
 * (the library installs no handlers; it only keeps the registry the handler reads). */
void cli_install_signal_cleanup(void);

#endif
