/* cmd_bench.c: `dsv4cp bench`: one benchmark configuration (layer kind, length, CP = N under
 * mpirun): forward and backward medians over --reps runs after a warm-up, FLOP rate from
 * dsv4_layer_flops, the fraction of a cblas_sgemm measured in the same run with the same threads,
 * peak resident memory and saved activations per rank, per-rank busy-time spread, bytes and time per
 * message kind, and the fraction of the Stage-1 all-gather hidden behind computation. Prints one
 * fixed-width row and appends a JSON object to --json. bench/run_bench.sh loops over
 * configurations (one process each, so peak memory is per configuration). */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "dsv4cp_mpi.h"
#include "job.h"

#define SGEMM_N 2048 /* the reference sgemm's default size (--sgemm-size) */
#define SGEMM_REPS 5
#define DEFAULT_REPS 3
#define BLOCKING_REPS 5

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* GFLOP/s of cblas_sgemm (n cubed, NT like the projections) with this rank's threads, every
 * rank at once: the best of `reps` calls after a warm-up (the best: a noisy neighbour must not make
 * our fraction look larger than it is). Measured right before every timed run (the fraction of
 * that run) and, for the report's reference column, before and after all runs. */
static double sgemm_rate(cli_ctx *c, size_t n, int reps) {
  float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *o = malloc(sizeof(float) * n * n);
  double best = 0;
  if (!a || !b || !o) return NAN;
  for (size_t i = 0; i < n * n; i++) a[i] = b[i] = o[i] = (float)(i % 7) * 0.1f;
  for (int r = 0; r <= reps; r++) {
    MPI_Barrier(c->comm);
    double t0 = MPI_Wtime();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n, b, (int)n, 0.0f, o,
                (int)n);
    const double rate = 2.0 * (double)n * n * n / (MPI_Wtime() - t0) / 1e9;
    if (r > 0 && rate > best) best = rate; /* r = 0 warms up */
  }
  free(a), free(b), free(o);
  return best;
}

/* Seconds of a blocking all-gather of `bytes` per rank (what the overlap has to hide). */
static double blocking_allgather(cli_ctx *c, size_t bytes) {
  if (c->size == 1 || bytes == 0) return 0;
  char *s = calloc(bytes, 1), *r = calloc(bytes * (size_t)c->size, 1);
  double t[BLOCKING_REPS];
  for (int i = 0; i < BLOCKING_REPS; i++) {
    MPI_Barrier(c->comm);
    double t0 = MPI_Wtime();
    MPI_Allgather(s, (int)bytes, MPI_BYTE, r, (int)bytes, MPI_BYTE, c->comm);
    t[i] = MPI_Wtime() - t0;
  }
  free(s), free(r);
  return median(t, BLOCKING_REPS);
}

typedef struct {
  double fwd, bwd, busy;       /* medians, seconds (busy: this rank's time outside message waits) */
  double fraction;             /* median over runs of (GFLOP/s) / (sgemm GFLOP/s of all ranks), the
                                  sgemm measured just before each run: robust to a machine whose
                                  speed drifts (shared hosts do) */
} timing;

/* FLOPs of the range's layers together. */
static void range_flops(const job *j, double *fwd, double *bwd) {
  *fwd = *bwd = 0;
  for (int i = 0; i < j->n_lay; i++) {
    dsv4_flops f = DSV4_FLOPS_INIT;
    dsv4_layer_flops(&j->cfg, j->layer + i, &j->pk, &f);
    *fwd += f.fwd, *bwd += f.bwd;
  }
}

/* Every layer's CP statistics summed (one source group is one row). */
static void range_stats(dsv4_layer **l, int nl, dsv4_cp_stats *sum) {
  *sum = (dsv4_cp_stats)DSV4_CP_STATS_INIT;
  for (int i = 0; i < nl; i++) {
    dsv4_cp_stats s = DSV4_CP_STATS_INIT;
    dsv4_cp_get_stats(dsv4_layer_core(l[i]), &s);
    for (int m = 0; m < DSV4_MSG_KINDS; m++) {
      sum->bytes_sent[m] += s.bytes_sent[m], sum->bytes_recv[m] += s.bytes_recv[m];
      sum->messages[m] += s.messages[m], sum->seconds[m] += s.seconds[m];
    }
  }
}

/* Runs reps forward + backward passes of the range (forwards in order with one shared state,
 * backwards in reverse); returns rank-local medians. */
static int measure(cli_ctx *c, job *j, dsv4_layer **l, int reps, int warmup, size_t sgemm_n, timing *tm,
                   dsv4_cp_stats *st, size_t *saved) {
  const int64_t n = j->n, d = j->cfg.dim, k = j->cfg.index_topk;
  const int nl = j->n_lay;
  float *out = malloc(sizeof(float) * (size_t)(nl * n * d + 1)), *dx = malloc(sizeof(float) * (size_t)(n * d + 1));
  int32_t *topk = malloc(sizeof(int32_t) * (size_t)(n * k + 1));
  dsv4_weights **g = calloc((size_t)nl, sizeof *g);
  dsv4_shared *sh = NULL;
  double *tf = calloc((size_t)reps, sizeof(double)), *tb = calloc((size_t)reps, sizeof(double));
  double *busy = calloc((size_t)reps, sizeof(double)), *frac = calloc((size_t)reps, sizeof(double));
  int ok = out && dx && topk && g && tf && tb && busy && frac && !cli_lib(c, dsv4_shared_create(&sh));
  for (int i = 0; i < nl && ok; i++) ok = !cli_lib(c, dsv4_weights_create(&g[i], &j->cfg, j->layer + i));
  double ffwd, fbwd;
  range_flops(j, &ffwd, &fbwd);
  const int cp = c->size > 1;
  float loss;
  for (int r = -warmup; ok && r < reps; r++) { /* r < 0: warm-up */
    char what[48] = "warm-up";
    if (r >= 0) snprintf(what, sizeof what, "run %d of %d", r + 1, reps);
    progress_at(c->progress, what, (double)(r + warmup) / (double)(reps + warmup));
    for (int i = 0; i < nl && r == 0 && cp; i++) dsv4_cp_stats_reset(dsv4_layer_core(l[i]));
    dsv4_cp_stats before = DSV4_CP_STATS_INIT, after = DSV4_CP_STATS_INIT;
    if (cp) range_stats(l, nl, &before);
    double gemm = r >= 0 ? sgemm_rate(c, sgemm_n, 2) : 0; /* this moment's rate, all ranks together */
    MPI_Allreduce(MPI_IN_PLACE, &gemm, 1, MPI_DOUBLE, MPI_SUM, c->comm);
    dsv4_shared_reset(sh);
    /* each run a training step's: fresh gradients, as `train` and the PyTorch binding give (a zero
     * tensor also holds a recomputed backward's weight sums in part: model/wgrad.c) */
    for (int i = 0; i < nl; i++) dsv4_weights_zero(g[i]);
    MPI_Barrier(c->comm);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < nl && ok; i++) {
      const dsv4_layer_fwd_args fa = {DSV4_HEAD(dsv4_layer_fwd_args), .out = out + i * n * d, .topk_ids = topk,
                                      .indexer_loss = &loss, .x = j->lx[i], .n = n, .pk = &j->pk, .train = 1,
                                      .shared = sh};
      ok = !cli_lib(c, dsv4_layer_forward(l[i], &fa));
    }
    const double t1 = MPI_Wtime();
    if (ok && r == reps - 1) {
      *saved = 0;
      for (int i = 0; i < nl; i++) *saved += dsv4_layer_saved_bytes(l[i]);
    }
    for (int i = nl - 1; i >= 0 && ok; i--) {
      const dsv4_layer_bwd_args ba = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = dx, .grads = g[i], .dout = j->ldout[i],
                                      .d_loss = 1.0f};
      ok = !cli_lib(c, dsv4_layer_backward(l[i], &ba));
    }
    const double t2 = MPI_Wtime();
    if (r < 0) continue;
    if (cp) range_stats(l, nl, &after);
    double wait = 0;
    for (int m = 0; m < DSV4_MSG_KINDS; m++) wait += after.seconds[m] - before.seconds[m];
    tf[r] = t1 - t0;
    tb[r] = t2 - t1;
    busy[r] = t2 - t0 - wait;
    double wall = t2 - t0;
    MPI_Allreduce(MPI_IN_PLACE, &wall, 1, MPI_DOUBLE, MPI_MAX, c->comm);
    frac[r] = (ffwd + fbwd) / wall / 1e9 / gemm;
  }
  if (ok) {
    tm->fwd = median(tf, reps);
    tm->bwd = median(tb, reps);
    tm->busy = median(busy, reps);
    tm->fraction = median(frac, reps);
    if (cp) range_stats(l, nl, st);
  }
  free(out), free(dx), free(topk), free(tf), free(tb), free(busy), free(frac);
  for (int i = 0; g && i < nl; i++) dsv4_weights_free(g[i]);
  free(g);
  dsv4_shared_free(sh);
  return ok;
}

/* Rank 0 prints the row and appends the JSON record; per-rank values are gathered first. */
static void report(cli_ctx *c, const job *j, const char *split, int reps, const timing *tm, const dsv4_cp_stats *st,
                   size_t saved, double sgemm, double blocking, double base_mb, const char *json) {
  struct rec {
    double fwd, bwd, busy, rss_mb, saved_mb, sgemm, hidden, planned_mb, base_mb;
    int planned;       /* measured bytes and messages per call == dsv4_cp_plan_traffic, every kind */
    int saved_planned; /* bytes saved for the backward == dsv4_cp_plan_memory */
    dsv4_cp_stats st;
  } mine = {tm->fwd, tm->bwd, tm->busy, 0, (double)saved / 1048576.0, sgemm, 0, 0, base_mb, 1, 1, *st}, *all = NULL;
  dsv4_cp_stats plan = DSV4_CP_STATS_INIT;
  dsv4_memory_plan mem = DSV4_MEMORY_PLAN_INIT;
  const dsv4_plan_opts popts = {DSV4_HEAD(dsv4_plan_opts), .recompute = j->recompute, .threads = omp_get_max_threads()};
  uint64_t saved_plan = 0, total_plan = 0;
  for (int i = 0; i < j->n_lay; i++) { /* a group's layers all keep their activations until the backward */
    dsv4_cp_stats pl = DSV4_CP_STATS_INIT;
    mine.saved_planned &= dsv4_cp_plan_memory(&j->cfg, j->layer + i, &j->pk, &j->cp, &popts, c->rank, c->size,
                                              &mem) == DSV4_OK;
    saved_plan += mem.saved, total_plan += mem.total;
    if (dsv4_cp_plan_traffic_opts(&j->cfg, j->layer + i, &j->pk, &j->cp, &popts, c->rank, c->size, &pl) != DSV4_OK)
      mine.planned = 0;
    for (int m = 0; m < DSV4_MSG_KINDS; m++) {
      plan.bytes_sent[m] += pl.bytes_sent[m], plan.bytes_recv[m] += pl.bytes_recv[m];
      plan.messages[m] += pl.messages[m];
    }
  }
  mine.saved_planned &= saved_plan == saved;
  mine.planned_mb = (double)total_plan / 1048576.0;
  for (int m = 0; m < DSV4_MSG_KINDS && c->size > 1; m++)
    mine.planned &= st->bytes_sent[m] == plan.bytes_sent[m] * (uint64_t)reps &&
                    st->bytes_recv[m] == plan.bytes_recv[m] * (uint64_t)reps &&
                    st->messages[m] == plan.messages[m] * (uint64_t)reps;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  mine.rss_mb = (double)ru.ru_maxrss / 1024.0;
  /* hidden fraction of the Stage-1 all-gathers: 1 - (time still waited) / (time a blocking one takes) */
  const double exposed = st->seconds[DSV4_MSG_SLOT_ALLGATHER] / reps;
  mine.hidden = blocking > 0 ? fmin(1.0, fmax(0.0, 1.0 - exposed / blocking)) : NAN;
  if (c->rank == 0) all = calloc((size_t)c->size, sizeof *all);
  MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, c->comm);
  if (c->rank != 0) return;
  double fwd = 0, bwd = 0, busy_max = 0, busy_min = INFINITY, rss = 0, sv = 0, gemm = 0, hidden = 0;
  double planned = 0, base = 0, rss_above_base = 0;
  int planned_ok = 1, saved_planned = 1;
  for (int r = 0; r < c->size; r++) {
    fwd = fmax(fwd, all[r].fwd);
    bwd = fmax(bwd, all[r].bwd);
    busy_max = fmax(busy_max, all[r].busy);
    busy_min = fmin(busy_min, all[r].busy);
    rss = fmax(rss, all[r].rss_mb);
    planned = fmax(planned, all[r].planned_mb);
    base = fmax(base, all[r].base_mb);
    rss_above_base = fmax(rss_above_base, all[r].rss_mb - all[r].base_mb);
    sv = fmax(sv, all[r].saved_mb);
    gemm += all[r].sgemm;
    hidden += all[r].hidden / c->size;
    planned_ok &= all[r].planned;
    saved_planned &= all[r].saved_planned;
  }
  /* The ranks' cores need not be equally fast (a virtual machine's vCPUs can differ by a few
   * percent: docs/perf.md), and a busy spread mixes that with the code's own imbalance. Each rank's
   * reference sgemm ran on its own core, so busy time times that rate is the rank's work with a
   * steadily slower core taken out (not a neighbour that slows one core for part of the run). */
  double core_max = 0, core_min = INFINITY, work_max = 0, work_min = INFINITY;
  for (int r = 0; r < c->size; r++) {
    const double w = all[r].busy * all[r].sgemm;
    core_min = fmin(core_min, all[r].sgemm), core_max = fmax(core_max, all[r].sgemm);
    work_max = fmax(work_max, w), work_min = fmin(work_min, w);
  }
  const double core_spread = core_min > 0 ? core_max / core_min : NAN;
  const double work_spread = work_min > 0 ? work_max / work_min : NAN;
  dsv4_flops f = DSV4_FLOPS_INIT;
  range_flops(j, &f.fwd, &f.bwd);
  const double gflops = (f.fwd + f.bwd) / (fwd + bwd) / 1e9, spread = busy_min > 0 ? busy_max / busy_min : NAN;
  char hid[16] = "-";
  if (!isnan(hidden)) snprintf(hid, sizeof hid, "%.1f%%", 100 * hidden);
  printf("%5d %6lld %3d %-10s %9.1f %9.1f %8.0f %8.1f %6.1f%% %8.0f %8.0f %6.3f %7s %5s\n", j->ratio,
         (long long)j->T, c->size, split, 1e3 * fwd, 1e3 * bwd, (double)j->T / (fwd + bwd), gflops,
         100.0 * tm->fraction, rss, sv, spread, hid, c->size == 1 ? "-" : planned_ok ? "yes" : "NO");
  fflush(stdout);
  char packing[96];
  if (j->n_docs > 1 && !j->pk.batched)
    snprintf(packing, sizeof packing, "%d documents", j->n_docs);
  else
    snprintf(packing, sizeof packing, "%s", j->pk.batched ? "batch" : "one document");
  FILE *fj = json ? fopen(json, "a") : NULL;
  if (!fj) {
    free(all);
    return;
  }
  char range[32];
  snprintf(range, sizeof range, "%d-%d", j->layer, j->layer + j->n_lay - 1);
  fprintf(fj, "{\"layers\": \"%s\", \"preset\": \"%s\", \"ratio\": %d, \"seq\": %lld, \"ranks\": %d, \"split\": \"%s\", \"threads\": %d, \"reps\": %d, "
              "\"fwd_s\": %.6f, \"bwd_s\": %.6f, \"tokens_per_s\": %.3f, \"gflop_fwd\": %.3f, \"gflop_bwd\": %.3f, "
              "\"gflops\": %.3f, \"sgemm_gflops_per_rank\": %.3f, \"fraction_of_sgemm\": %.4f, "
              "\"peak_rss_mb\": %.1f, \"saved_activation_mb\": %.1f, \"busy_spread\": %.4f, \"core_spread\": %.4f, "
              "\"work_spread\": %.4f, \"allgather_blocking_s\": %.6f, \"allgather_hidden_fraction\": %.4f, "
              "\"bytes_match_plan\": %s, \"saved_bytes_match_plan\": %s, \"recompute\": %s, \"packing\": \"%s\", "
              "\"planned_mb\": %.1f, \"rss_base_mb\": %.1f, \"rss_above_base_mb\": %.1f, \"blas_kernels\": \"%s\", \"per_rank\": [",
          range, j->cfg.v41 ? "v41" : "v4", j->ratio, (long long)j->T, c->size, split, omp_get_max_threads(), reps, fwd, bwd, (double)j->T / (fwd + bwd),
          f.fwd / 1e9, f.bwd / 1e9, gflops, gemm / c->size, tm->fraction, rss, sv, isnan(spread) ? 0 : spread,
          isnan(core_spread) ? 0 : core_spread, isnan(work_spread) ? 0 : work_spread,
          blocking, isnan(hidden) ? -1.0 : hidden, c->size == 1 ? "null" : planned_ok ? "true" : "false",
          saved_planned ? "true" : "false", j->recompute ? "true" : "false", packing, planned, base, rss_above_base,
          openblas_get_corename());
  for (int r = 0; r < c->size; r++) {
    fprintf(fj, "%s{\"rank\": %d, \"fwd_s\": %.6f, \"bwd_s\": %.6f, \"busy_s\": %.6f, \"sgemm_gflops\": %.3f, "
                "\"peak_rss_mb\": %.1f, \"saved_activation_mb\": %.1f, \"messages\": {",
            r ? ", " : "", r, all[r].fwd, all[r].bwd, all[r].busy, all[r].sgemm, all[r].rss_mb, all[r].saved_mb);
    for (int m = 0; m < DSV4_MSG_KINDS; m++)
      fprintf(fj, "%s\"%s\": {\"bytes_sent\": %.0f, \"bytes_recv\": %.0f, \"wait_s\": %.6f}", m ? ", " : "",
              dsv4_msg_kind_name((dsv4_msg_kind)m), (double)all[r].st.bytes_sent[m] / reps,
              (double)all[r].st.bytes_recv[m] / reps, all[r].st.seconds[m] / reps);
    fprintf(fj, "}}");
  }
  fprintf(fj, "]}\n");
  fclose(fj);
  free(all);
}

int cmd_bench(cli_ctx *c, int argc, char **argv) {
  static const char *USAGE =
      "usage: [mpirun -np N] dsv4cp bench [--preset flash] (--layer L | --layers A-B) --seq S [--reps K]\n"
      "                                   [--json FILE] [options]\n"
      "\n"
      "One benchmark configuration: forward and backward of one layer, or of layers A..B together (a\n"
      "V4.1 source group: forwards in order, backwards in reverse; CP = N under mpirun), medians of\n"
      "--reps runs after a warm-up; prints one row (--header prints the column names) and appends a JSON\n"
      "object to --json. `make bench` (bench/run_bench.sh) runs the whole report. On a terminal, a\n"
      "progress line on stderr.";
  job_opts o = {.random_dout = 1};
  const char *reps_s = NULL, *json = NULL, *threads = NULL, *warmup_s = NULL, *sgemm_s = NULL;
  int header = 0;
  cli_opt opts[24];
  int k = job_common_opts(&o, opts, JOB_CMD_BENCH);
  opts[k++] = (cli_opt){"reps", "K", "timed repetitions after the warm-up (default 3)", &reps_s, NULL};
  opts[k++] = (cli_opt){"warmup", "W", "untimed calls before them (default 1; 0 for very long runs)", &warmup_s, NULL};
  opts[k++] = (cli_opt){"sgemm-size", "N", "the reference cblas_sgemm's size, N cubed (default 2048; smaller for a "
                                          "quick smoke run, whose fraction then means little)", &sgemm_s, NULL};
  opts[k++] = (cli_opt){"json", "FILE", "append the result as one JSON object per line", &json, NULL};
  opts[k++] = (cli_opt){"threads", "N", "OpenMP threads per rank (default: cores / ranks on the node)", &threads, NULL};
  opts[k++] = (cli_opt){"header", NULL, "print the column names first", NULL, &header};
  opts[k] = (cli_opt){0};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  if (!o.preset && !o.config) o.preset = "flash";
  int64_t reps = DEFAULT_REPS;
  if (p == 0 && reps_s) cli_int(c, "reps", reps_s, 1, 1000, &reps);
  int64_t warmup = 1;
  if (p == 0 && warmup_s) cli_int(c, "warmup", warmup_s, 0, 100, &warmup);
  int64_t sgemm_n = SGEMM_N;
  if (p == 0 && sgemm_s) cli_int(c, "sgemm-size", sgemm_s, 16, 8192, &sgemm_n);
  if (!c->err[0]) cli_set_threads(c, threads);
  if (cli_sync(c)) return 1;
  if (header)
    cli_say(c, "%5s %6s %3s %-10s %9s %9s %8s %8s %7s %8s %8s %6s %7s %5s\n", "ratio", "seq", "N", "split", "fwd ms",
            "bwd ms", "tok/s", "GFLOP/s", "sgemm", "RSS MB", "act MB", "spread", "hidden", "plan");
  struct rusage ru0;
  getrusage(RUSAGE_SELF, &ru0); /* the runtime's own memory (MPI, OpenBLAS), before anything of ours */
  const double base_mb = (double)ru0.ru_maxrss / 1024.0;
  job j;
  job_load(c, &j, &o);
  dsv4_layer **l = NULL;
  dsv4_comm *comm = NULL;
  timing tm = {0};
  dsv4_cp_stats st = DSV4_CP_STATS_INIT;
  size_t saved = 0;
  progress prog;
  progress_start(&prog, c->rank, 0, "dsv4cp bench");
  c->progress = &prog;
  if (!cli_sync(c)) {
    double gemm = sgemm_rate(c, (size_t)sgemm_n, SGEMM_REPS);
    if (!(l = calloc((size_t)j.n_lay, sizeof *l))) cli_error(c, "out of memory");
    for (int i = 0; l && i < j.n_lay && !c->err[0]; i++) job_make_layer(c, &j, i, 1, &l[i], &comm);
    if (!cli_sync(c) && measure(c, &j, l, (int)reps, (int)warmup, (size_t)sgemm_n, &tm, &st, &saved) && !cli_sync(c)) {
      const double gemm_after = sgemm_rate(c, (size_t)sgemm_n, SGEMM_REPS); /* before and after: the better */
      if (gemm_after > gemm) gemm = gemm_after;
      const int64_t blk = j.ratio > 0 ? (j.n + j.ratio - 1) / j.ratio : 0; /* slot buffer rows (about) */
      double blocking = blocking_allgather(c, sizeof(float) * (size_t)(blk * j.cfg.head_dim));
      if (j.ratio == 4 || j.cfg.v41) /* the indexer keys (V4: r = 4; V4.1: every kv source) */
        blocking += blocking_allgather(c, sizeof(float) * (size_t)(blk * j.cfg.index_head_dim));
      progress_stop(&prog);
      report(c, &j, o.split ? o.split : "contiguous", (int)reps, &tm, &st, saved, gemm, blocking, base_mb, json);
    }
  }
  int failed = cli_sync(c);
  progress_stop(&prog);
  c->progress = NULL;
  for (int i = 0; l && i < j.n_lay; i++) dsv4_layer_free(l[i]);
  free(l);
  dsv4_comm_free(comm);
  job_free(&j);
  return failed;
}
