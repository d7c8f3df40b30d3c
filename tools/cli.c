/* cli.c: shared CLI machinery (see cli.h): errors (escaped, synchronised over ranks), option
 * parsing, threads, and the SIGINT/SIGTERM clean-up of a half-written output file. */
#include "cli.h"

#include <errno.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsv4cp_io.h"

/* How long a failing rank waits for the others to reach the error check before aborting the job
 * (they may be blocked in a message the failing rank will never send). */
#define CLI_SYNC_TIMEOUT 10.0

void cli_error(cli_ctx *c, const char *fmt, ...) {
  if (c->err[0]) return;
  char raw[CLI_MSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  dsv4_escape(c->err, sizeof c->err, raw);
}

/* Unlinks pending output temporaries (async-signal-safe), then dies by the same signal. */
static void on_fatal_signal(int sig) {
  dsv4_st_remove_pending();
  raise(sig); /* SA_RESETHAND restored the default action: delivered when this handler returns */
}

void cli_install_signal_cleanup(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int cli_lib(cli_ctx *c, dsv4_status rc) {
  if (rc == DSV4_OK) return 0;
  cli_error(c, "%s", dsv4_last_error());
  return 1;
}

void cli_say(const cli_ctx *c, const char *fmt, ...) {
  if (c->rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  progress_hold(c->progress);
  vprintf(fmt, ap);
  fflush(stdout);
  progress_release(c->progress);
  va_end(ap);
}

void cli_phase(cli_ctx *c, const char *name) { progress_phase(c->progress, name); }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

void cli_abort(cli_ctx *c) {
  progress_stop(c->progress);
  fprintf(stderr, "dsv4cp: error: %s\n", c->err[0] ? c->err : "unknown failure");
  fflush(stderr);
  if (c->size > 1) MPI_Abort(c->comm, 1);
  exit(1);
}

int cli_sync(cli_ctx *c) {
  /* lowest failing rank, or size when none */
  int mine = c->err[0] ? c->rank : c->size, first = c->size;
  if (c->size > 1) {
    MPI_Request req;
    MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, c->sync_comm, &req);
    const double t0 = now();
    int done = 0;
    while (!done) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      /* only a rank that failed gives up: a healthy rank may be waiting for long work elsewhere */
      if (!done && c->err[0] && now() - t0 > CLI_SYNC_TIMEOUT) cli_abort(c);
      if (!done) usleep(200);
    }
    if (first < c->size) MPI_Bcast(c->err, CLI_MSG_LEN, MPI_CHAR, first, c->sync_comm);
  } else {
    first = mine;
  }
  if (first == c->size) return 0;
  progress_stop(c->progress);
  fprintf(stderr, "dsv4cp: error: %s\n", c->err);
  fflush(stderr);
  return 1;
}

static void print_help(const cli_opt *opts, const char *usage) {
  printf("%s\n\noptions:\n", usage);
  for (const cli_opt *o = opts; o->name; o++) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", o->name, o->meta ? " " : "", o->meta ? o->meta : "");
    printf("  %-28s %s\n", left, o->help);
  }
  printf("  %-28s %s\n", "--help", "print this help");
}

int cli_parse(cli_ctx *c, int argc, char **argv, int first, const cli_opt *opts, const char *usage) {
  for (int i = first; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      if (c->rank == 0) print_help(opts, usage);
      return 1;
    }
    if (strncmp(a, "--", 2) != 0) {
      cli_error(c, "unexpected argument '%s' (see --help)", a);
      return -1;
    }
    const cli_opt *o = opts;
    while (o->name && strcmp(o->name, a + 2)) o++;
    if (!o->name) {
      cli_error(c, "unknown option '%s' (see --help)", a);
      return -1;
    }
    if (o->meta) {
      if (i + 1 >= argc) {
        cli_error(c, "option '%s' needs a value (%s)", a, o->meta);
        return -1;
      }
      *o->value = argv[++i];
    } else {
      *o->flag = 1;
    }
  }
  return 0;
}

int cli_int(cli_ctx *c, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || !*s || *end || v < lo || v > hi) {
    cli_error(c, "--%s: '%s' is not an integer in [%lld, %lld]", opt, s, (long long)lo, (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

const char *cli_cpu_blas_kernels(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
}

void cli_set_threads(cli_ctx *c, const char *threads_opt) {
  int64_t t = 0;
  if (threads_opt && cli_int(c, "threads", threads_opt, 1, 1024, &t) == 0) {
    omp_set_num_threads((int)t);
    return;
  }
  if (getenv("OMP_NUM_THREADS")) return;
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  long ranks_here = local ? atol(local) : c->size;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long per = ranks_here > 0 ? cores / ranks_here : cores;
  omp_set_num_threads(per > 0 ? (int)per : 1);
}
