/* cmd_run.c: `dsv4cp run`, the file contract of SPEC 7: one layer forward (and backward), CP = N
 * under mpirun -np N, results written by rank 0. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "job.h"

static const char *USAGE =
    "usage: dsv4cp run (--config config.json | --preset NAME) (--layer L | --layers A-B) [--weights PATH]\n"
    "                  [--input in.safetensors] [--grad-output g.safetensors] --output out.safetensors\n"
    "                  [--seed S] [--seq S --batch B] [--split MODE] [--quiet]\n"
    "\n"
    "One attention layer forward (and backward with --grad-output, of sum(out * dout) + indexer_loss).\n"
    "Under mpirun -np N the sequence is split over N ranks (two-stage context parallelism); every rank\n"
    "reads only its own rows of the input files; rank 0 writes out, topk_ids, indexer_loss, dx and\n"
    "grad.<weight name>, receiving the other ranks' rows one piece at a time.\n"
    "Without --weights the weights are random from --seed; without --input so is x ([seq, d], or\n"
    "[batch, seq, d] with --batch). Prints one summary line (tokens, ranks, layer kind, time, output\n"
    "file) and, on a terminal, a progress line on stderr; --quiet prints neither.\n"
    "--layers A-B runs layers A..B in order with one shared state (DeepSeek V4.1 layers read their kv\n"
    "source's compressed kv and their index source's top-k) and the backward in reverse: --input holds\n"
    "x.{L} for every layer (or one x for all), --grad-output dout.{L}; the output out.{L}, topk_ids.{L}\n"
    "and indexer_loss.{L} (index sources), dx.{L} and grad.<weight name> of every layer.";

/* One line per message kind and direction: bytes and time of this rank, gathered to rank 0; then
 * each rank's peak resident memory. */
static void print_stats(cli_ctx *c, const dsv4_cp_stats *st) {
  dsv4_cp_stats *all = c->rank == 0 ? calloc((size_t)c->size, sizeof *all) : NULL;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double rss = (double)ru.ru_maxrss / 1024.0, *rss_all = c->rank == 0 ? calloc((size_t)c->size, sizeof(double)) : NULL;
  MPI_Gather(&rss, 1, MPI_DOUBLE, rss_all, 1, MPI_DOUBLE, 0, c->comm);
  if (c->rank == 0 && rss_all)
    for (int r = 0; r < c->size; r++) printf("rank %d: peak resident memory %.1f MiB\n", r, rss_all[r]);
  free(rss_all);
  if (c->size == 1) {
    free(all);
    return;
  }
  MPI_Gather(st, (int)sizeof *st, MPI_BYTE, all, (int)sizeof *st, MPI_BYTE, 0, c->comm);
  if (c->rank == 0 && all) {
    printf("%-22s %4s %14s %14s %9s %10s\n", "message kind", "rank", "bytes sent", "bytes recv", "messages",
           "wait ms");
    for (int k = 0; k < DSV4_MSG_KINDS; k++)
      for (int r = 0; r < c->size; r++)
        printf("%-22s %4d %14llu %14llu %9llu %10.3f\n", dsv4_msg_kind_name((dsv4_msg_kind)k), r,
               (unsigned long long)all[r].bytes_sent[k], (unsigned long long)all[r].bytes_recv[k],
               (unsigned long long)all[r].messages[k], 1e3 * all[r].seconds[k]);
  }
  free(all);
}

/* "sliding window (r = 0)", "CSA (r = 4)", "HCA (r = 128)", "V4.1 reuse layer (r = 2)" ... */
static void layer_kind(const dsv4_config *cfg, int layer, char *buf, size_t n) {
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  const int r = dsv4_config_ratio(cfg, layer);
  if (!cfg->v41 || r == 0 || dsv4_config_layer(cfg, layer, &in) != DSV4_OK) {
    snprintf(buf, n, "%s", r == 0 ? "sliding window (r = 0)" : r == 4 ? "CSA (r = 4)" : "HCA (r = 128)");
    return;
  }
  static const char *ROLE[] = {"window", "own", "kv source", "reindex layer", "reuse layer"};
  snprintf(buf, n, "V4.1 %s (r = %d)", ROLE[in.role], r);
}

int cmd_run(cli_ctx *c, int argc, char **argv) {
  job_opts o = {0};
  const char *output = NULL, *threads = NULL;
  int stats = 0, naive = 0, quiet = 0;
  cli_opt opts[24];
  int k = job_common_opts(&o, opts, JOB_CMD_RUN);
  opts[k++] = (cli_opt){"output", "FILE", "where rank 0 writes the results (required)", &output, NULL};
  opts[k++] = (cli_opt){"threads", "N", "OpenMP threads per rank (default: cores / ranks on the node)", &threads, NULL};
  opts[k++] = (cli_opt){"stats", NULL, "print each rank's peak memory, and bytes and time per message kind (CP)", NULL,
                        &stats};
  opts[k++] = (cli_opt){"naive", NULL, "use the naive reference path for every operator and product", NULL, &naive};
  opts[k++] = (cli_opt){"quiet", NULL, "print nothing on success (no summary line, no progress)", NULL, &quiet};
  opts[k] = (cli_opt){0};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  if (p == 0 && !output) cli_error(c, "--output is required");
  if (!c->err[0]) cli_set_threads(c, threads);
  if (!c->err[0]) job_check_output_path(c, "--output", output);
  if (cli_sync(c)) return 1;
  progress prog;
  progress_start(&prog, c->rank, quiet, "dsv4cp run");
  c->progress = &prog;
  progress_at(&prog, "loading", 0);
  job j;
  job_load(c, &j, &o);
  if (cli_sync(c)) {
    c->progress = NULL;
    job_free(&j);
    return 1;
  }
  /* the backward starts after this share of the work (its FLOPs are about twice the forward's) */
  double ffwd = 0, fbwd = 0;
  for (int i = 0; i < j.n_lay; i++) {
    dsv4_flops f = DSV4_FLOPS_INIT;
    dsv4_layer_flops(&j.cfg, j.layer + i, &j.pk, &f);
    ffwd += f.fwd, fbwd += f.bwd;
  }
  const char *phases[] = {"forward", "backward"};
  const double starts[] = {0, j.dout && ffwd + fbwd > 0 ? ffwd / (ffwd + fbwd) : 1};
  progress_phases(&prog, 2, phases, starts);
  job_result *r = calloc((size_t)j.n_lay, sizeof *r);
  dsv4_cp_stats st = DSV4_CP_STATS_INIT;
  j.keep_local = 1; /* job_write streams every rank's rows to rank 0 */
  if (!r) cli_error(c, "out of memory");
  else job_execute(c, &j, 1, naive ? JOB_NAIVE : JOB_FAST, r, &st);
  if (!cli_sync(c)) {
    progress_at(&prog, "writing", 1);
    job_write(c, &j, r, output);
    if (!cli_sync(c)) {
      progress_stop(&prog);
      if (stats) print_stats(c, &st);
      if (!quiet) {
        char bwd[64] = "", what[96];
        if (j.dout) snprintf(bwd, sizeof bwd, " + backward %.3f s", r[0].bwd_seconds);
        if (j.suffixed) snprintf(what, sizeof what, "layers %d-%d", j.layer, j.layer + j.n_lay - 1);
        else {
          char kind[64];
          layer_kind(&j.cfg, j.layer, kind, sizeof kind);
          snprintf(what, sizeof what, "layer %d %s", j.layer, kind);
        }
        cli_say(c, "run: %lld tokens, %d rank%s, %s, forward %.3f s%s, wrote %s\n", (long long)j.T, c->size,
                c->size > 1 ? "s" : "", what, r[0].fwd_seconds, bwd, output);
      }
    }
  }
  progress_stop(&prog);
  c->progress = NULL;
  int failed = c->err[0] != 0;
  if (r) job_result_free(r, j.n_lay);
  free(r);
  job_free(&j);
  return failed;
}
