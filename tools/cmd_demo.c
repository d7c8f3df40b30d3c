/* cmd_demo.c: `dsv4cp demo`, the main job on a built-in default: a V4-Flash-shaped layer of each
 * kind (sliding window, CSA, HCA) and a V4.1-Flash source group (a kv source and the layers that
 * read its compressed kv) on a seeded sequence, forward and backward, with
 *   - time and tokens/s of the fast path (CP = N under mpirun -np N),
 *   - a self-check against the naive operators on a shorter sequence (rank 0),
 *   - under mpirun: CP = N against CP = 1 recomputed on rank 0 (forward bitwise, dx tolerance). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "job.h"

#define DEMO_SEQ "1024"
#define DEMO_CHECK_SEQ "256"
#define SELF_CHECK_TOL 1e-4 /* fp32 fast kernels against the naive double-accumulating ones */
#define CP_TOL 1e-5         /* SPEC 6 */

/* Layers of the V4-Flash pattern: 0 is sliding window only, 2 is CSA, 3 is HCA; V4.1-Flash's layer
 * 14 is a kv source (r = 2) and index source, 15 and 16 reuse its compressed kv and top-k. */
static const struct {
  const char *preset, *layer, *layers, *kind;
} KINDS[] = {{"flash", "0", NULL, "SWA (r = 0)"},
             {"flash", "2", NULL, "CSA (r = 4)"},
             {"flash", "3", NULL, "HCA (r = 128)"},
             {"flash41", NULL, "14-16", "V4.1 group (r = 2)"}};

/* max |a - b| / max(1, max |b|) */
static double rel_diff(const float *a, const float *b, int64_t n) {
  double d, m;
  job_diff(a, b, n, &d, &m);
  return d / (m > 1 ? m : 1);
}

/* The largest relative difference of out and dx over the range's layers; top-k all identical. */
static void diff_all(const job *j, const job_result *a, const job_result *b, double *e_out, double *e_dx,
                     int *topk_same, int *out_bitwise) {
  const int64_t nd = j->T * j->cfg.dim;
  *e_out = *e_dx = 0, *topk_same = *out_bitwise = 1;
  for (int i = 0; i < j->n_lay; i++) {
    *e_out = fmax(*e_out, rel_diff(a[i].out, b[i].out, nd));
    *e_dx = fmax(*e_dx, rel_diff(a[i].dx, b[i].dx, nd));
    *out_bitwise &= !memcmp(a[i].out, b[i].out, sizeof(float) * (size_t)nd);
    if (a[i].topk)
      *topk_same &= !memcmp(a[i].topk, b[i].topk, sizeof(int32_t) * (size_t)(j->T * j->cfg.index_topk));
  }
}

/* Rank 0: the layers on check_seq tokens with the fast path and with the naive operators. */
static int self_check(cli_ctx *c, job_opts o, const char *check_seq) {
  cli_ctx one = {.rank = 0, .size = 1, .comm = MPI_COMM_SELF, .sync_comm = MPI_COMM_SELF};
  job j;
  job_result fast[4] = {0}, naive[4] = {0};
  o.seq = check_seq;
  job_load(&one, &j, &o);
  if (!one.err[0]) job_execute(&one, &j, 0, JOB_FAST, fast, NULL);
  if (!one.err[0]) job_execute(&one, &j, 0, JOB_NAIVE_OPS, naive, NULL);
  int ok = 0;
  if (one.err[0]) {
    cli_error(c, "self-check: %s", one.err);
  } else {
    double e_out, e_dx;
    int topk_same, bitwise;
    diff_all(&j, fast, naive, &e_out, &e_dx, &topk_same, &bitwise);
    ok = e_out <= SELF_CHECK_TOL && e_dx <= SELF_CHECK_TOL;
    printf("    self-check vs naive operators (%s tokens): out %.2g, dx %.2g%s -> %s\n", check_seq, e_out, e_dx,
           fast[0].topk ? (topk_same ? ", top-k identical" : ", top-k differs (near ties?)") : "", ok ? "ok" : "FAIL");
  }
  job_result_free(fast, j.n_lay);
  job_result_free(naive, j.n_lay);
  job_free(&j);
  return ok;
}

/* Rank 0: CP = 1 recomputation compared with the CP = N result. */
static int cp_check(cli_ctx *c, const job_opts *o, const job_result *rn) {
  cli_ctx one = {.rank = 0, .size = 1, .comm = MPI_COMM_SELF, .sync_comm = MPI_COMM_SELF};
  job j;
  job_result r1[4] = {0};
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads * c->size); /* the other ranks are idle meanwhile */
  job_load(&one, &j, o);
  if (!one.err[0]) job_execute(&one, &j, 0, JOB_FAST, r1, NULL);
  omp_set_num_threads(threads);
  int ok = 0;
  if (one.err[0]) {
    cli_error(c, "CP = 1 recomputation: %s", one.err);
  } else {
    double e_out, e_dx;
    int topk_same, bitwise;
    diff_all(&j, rn, r1, &e_out, &e_dx, &topk_same, &bitwise);
    const int fwd_bitwise = bitwise && topk_same;
    ok = e_out <= CP_TOL && e_dx <= CP_TOL && (!rn[0].topk || fwd_bitwise || e_out == 0);
    printf("    CP = %d vs CP = 1: forward%s bitwise equal%s, out %.2g, dx %.2g -> %s\n", c->size,
           rn[0].topk ? " and top-k" : "", fwd_bitwise ? "" : " NOT", e_out, e_dx, ok ? "ok" : "FAIL");
  }
  job_result_free(r1, j.n_lay);
  job_free(&j);
  return ok;
}

int cmd_demo(cli_ctx *c, int argc, char **argv) {
  static const char *USAGE =
      "usage: [mpirun -np N] dsv4cp demo [--seq S] [--check-seq S] [--threads N]\n"
      "\n"
      "The main job on a built-in default: a V4-Flash-shaped layer of each kind (sliding window, CSA,\n"
      "HCA) and a V4.1-Flash source group (kv source layer 14 and the two layers that reuse its compressed\n"
      "kv and top-k) with seeded random weights and input, forward and backward; prints time and\n"
      "tokens/s, a self-check against the naive operators, and (under mpirun) CP = N against CP = 1.";
  const char *seq = DEMO_SEQ, *check_seq = DEMO_CHECK_SEQ, *threads = NULL;
  const cli_opt opts[] = {
      {"seq", "S", "tokens of the timed run (default " DEMO_SEQ ")", &seq, NULL},
      {"check-seq", "S", "tokens of the naive self-check (default " DEMO_CHECK_SEQ ")", &check_seq, NULL},
      {"threads", "N", "OpenMP threads per rank (default: cores / ranks on the node)", &threads, NULL},
      {NULL, NULL, NULL, NULL, NULL}};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  if (!c->err[0]) cli_set_threads(c, threads);
  if (cli_sync(c)) return 1;
  cli_say(c, "dsv4cp demo: V4-Flash-shaped layers (d 4096, 64 heads x 512, q rank 1024, window 128, top-k 512),\n"
             "             a V4.1-Flash source group (d 5120, 64 heads x 512, q rank 1280, top-k 512)\n"
             "             seeded random weights and input, %s tokens, CP = %d, %d thread(s) per rank\n",
          seq, c->size, omp_get_max_threads());
  int all_ok = 1;
  for (size_t k = 0; k < sizeof KINDS / sizeof KINDS[0]; k++) {
    job_opts o = {.preset = KINDS[k].preset, .layer = KINDS[k].layer, .layers = KINDS[k].layers, .seq = seq,
                  .random_dout = 1};
    job j;
    job_result r[4] = {0};
    job_load(c, &j, &o);
    if (cli_sync(c)) return 1;
    job_execute(c, &j, 1, JOB_FAST, r, NULL);
    if (cli_sync(c)) return 1;
    double fl = 0;
    for (int i = 0; i < j.n_lay; i++) {
      dsv4_flops f = DSV4_FLOPS_INIT;
      dsv4_layer_flops(&j.cfg, j.layer + i, &j.pk, &f);
      fl += f.fwd + f.bwd;
    }
    cli_say(c, "  layer%s %-5s %-18s forward %8.1f ms  backward %8.1f ms  %6.0f tokens/s  %6.1f GFLOP/s (fwd + bwd)\n",
            KINDS[k].layers ? "s" : " ", KINDS[k].layers ? KINDS[k].layers : KINDS[k].layer, KINDS[k].kind,
            1e3 * r[0].fwd_seconds, 1e3 * r[0].bwd_seconds, (double)j.T / (r[0].fwd_seconds + r[0].bwd_seconds),
            fl / (r[0].fwd_seconds + r[0].bwd_seconds) / 1e9);
    if (c->rank == 0) {
      all_ok &= self_check(c, o, check_seq);
      if (c->size > 1) all_ok &= cp_check(c, &o, r);
    }
    job_result_free(r, j.n_lay);
    job_free(&j);
    if (cli_sync(c)) return 1;
  }
  MPI_Bcast(&all_ok, 1, MPI_INT, 0, c->comm);
  cli_say(c, "demo: %s\n", all_ok ? "all checks passed" : "SOME CHECKS FAILED");
  return all_ok ? 0 : 1;
}
