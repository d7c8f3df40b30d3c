/* cmd_check.c: `dsv4cp check`: runs the layer with CP = N over all ranks, recomputes it with one
 * rank on rank 0, and prints per tensor the largest difference and whether it is bitwise equal.
 * Verdict (SPEC 6): max|a - b| <= 1e-5 max(1, max|b|) for outputs and dx, 1e-4 for weight
 * gradients, top-k identical; reported besides: whether forward and top-k, and dx and the weight
 * gradients, are bitwise equal (docs/spec.md section 6: they are, for one BLAS kernel family). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"

#define TOL_OUT 1e-5
#define TOL_GRAD 1e-4

/* One row of the report; returns 1 when within tolerance. */
static int report(const char *name, const float *a, const float *b, int64_t n, double tol, int *all_bitwise) {
  double diff, ref;
  job_diff(a, b, n, &diff, &ref);
  const int bitwise = memcmp(a, b, sizeof(float) * (size_t)n) == 0;
  const int ok = diff <= tol * (ref > 1 ? ref : 1);
  if (all_bitwise) *all_bitwise &= bitwise;
  printf("  %-52s %10.3g %10.3g  %-7s %s\n", name, diff, ref, bitwise ? "yes" : "no", ok ? "ok" : "FAIL");
  return ok;
}

/* Compares CP = N results (a) with the one-rank recomputation (b), layer by layer; prints the
 * report. */
static int compare(const job *j, const job_result *ra, const job_result *rb, int nranks) {
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk;
  int ok = 1, fwd_bitwise = 1, topk_same = 1, bwd_bitwise = 1, bwd = 0;
  if (j->suffixed)
    printf("check: CP = %d against CP = 1, layers %d-%d, T = %lld\n", nranks, j->layer, j->layer + j->n_lay - 1,
           (long long)j->T);
  else
    printf("check: CP = %d against CP = 1, layer %d (compress ratio %d), T = %lld\n", nranks, j->layer, j->ratio,
           (long long)j->T);
  printf("  %-52s %10s %10s  %-7s %s\n", "tensor", "max|diff|", "max|ref|", "bitwise", "verdict");
  for (int l = 0; l < j->n_lay; l++) {
    const job_result *a = &ra[l], *b = &rb[l];
    char name[160];
    job_tensor_name(j, "out", a->layer, name, sizeof name);
    ok &= report(name, a->out, b->out, j->T * d, TOL_OUT, &fwd_bitwise);
    if (a->topk) {
      const int same = memcmp(a->topk, b->topk, sizeof(int32_t) * (size_t)(j->T * k)) == 0;
      job_tensor_name(j, "topk_ids", a->layer, name, sizeof name);
      printf("  %-52s %10s %10s  %-7s %s\n", name, "-", "-", same ? "yes" : "no", same ? "ok" : "FAIL");
      topk_same &= same;
      ok &= same;
      job_tensor_name(j, "indexer_loss", a->layer, name, sizeof name);
      ok &= report(name, &a->loss, &b->loss, 1, TOL_OUT, &fwd_bitwise);
    }
    job_tensor_name(j, "dx", a->layer, name, sizeof name);
    if (a->dx) {
      ok &= report(name, a->dx, b->dx, j->T * d, TOL_OUT, &bwd_bitwise);
      bwd = 1;
    }
    if (a->grads)
      for (int i = 0; i < dsv4_weights_count(a->grads); i++) {
        dsv4_tensor ta = DSV4_TENSOR_INIT, tb = DSV4_TENSOR_INIT;
        dsv4_weights_get(a->grads, i, &ta);
        dsv4_weights_get(b->grads, i, &tb);
        snprintf(name, sizeof name, "grad.%s%s", dsv4_weights_prefix(j->lw[l]), ta.name);
        ok &= report(name, ta.data, tb.data, ta.numel, TOL_GRAD, &bwd_bitwise);
      }
  }
  printf("forward and top-k bitwise equal to CP = 1: %s\n", fwd_bitwise && topk_same ? "yes" : "no");
  if (bwd) printf("dx and weight gradients bitwise equal to CP = 1: %s\n", bwd_bitwise ? "yes" : "no");
  printf("verdict: %s (tolerances of docs/spec.md section 6)\n", ok ? "PASS" : "FAIL");
  return ok;
}

int cmd_check(cli_ctx *c, int argc, char **argv) {
  static const char *USAGE =
      "usage: mpirun -np N dsv4cp check (--config config.json | --preset NAME) (--layer L | --layers A-B)\n"
      "                        [options]\n"
      "\n"
      "Runs the layer (or layers A..B in order, one shared state) forward and backward with CP = N,\n"
      "recomputes it with CP = 1 on rank 0, and prints\n"
      "the largest difference per tensor and whether forward and top-k, and dx and the weight gradients,\n"
      "are bitwise equal. Exit status 1\n"
      "when a difference exceeds the tolerance of docs/spec.md section 6. dout is random from --seed\n"
      "unless --grad-output. On a terminal, a progress line on stderr.";
  job_opts o = {.random_dout = 1};
  const char *threads = NULL;
  int fwd_only = 0;
  cli_opt opts[24];
  int k = job_common_opts(&o, opts, JOB_CMD_CHECK);
  opts[k++] = (cli_opt){"threads", "N", "OpenMP threads per rank (default: cores / ranks on the node)", &threads, NULL};
  opts[k++] = (cli_opt){"forward-only", NULL, "skip the backward (compare out, topk_ids and indexer_loss only)", NULL,
                        &fwd_only};
  opts[k] = (cli_opt){0};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  if (fwd_only) o.random_dout = 0;
  if (p == 0 && fwd_only && o.grad) cli_error(c, "--grad-output is the backward's dout; --forward-only has no backward");
  if (!c->err[0]) cli_set_threads(c, threads);
  if (cli_sync(c)) return 1;
  progress prog;
  progress_start(&prog, c->rank, 0, "dsv4cp check");
  c->progress = &prog;
  progress_at(&prog, "loading", 0);
  job j, j1;
  job_result *rn = NULL, *r1 = NULL;
  memset(&j1, 0, sizeof j1);
  job_load(c, &j, &o);
  int failed = cli_sync(c);
  if (!failed && (!(rn = calloc((size_t)j.n_lay, sizeof *rn)) || !(r1 = calloc((size_t)j.n_lay, sizeof *r1))))
    cli_error(c, "out of memory");
  failed = cli_sync(c);
  /* the CP = 1 recomputation on one rank takes about N times the CP = N run */
  const double share = 1.0 / (1 + c->size);
  if (!failed) {
    cli_say(c, "check: running CP = %d ...\n", c->size);
    char what[48];
    snprintf(what, sizeof what, "CP = %d, forward%s", c->size, fwd_only ? "" : " and backward");
    progress_at(&prog, what, 0);
    job_execute(c, &j, 1, JOB_FAST, rn, NULL);
    failed = cli_sync(c);
  }
  if (!failed && c->rank == 0) {
    /* the one-rank recomputation: rank 0 alone, the whole input */
    cli_ctx one = {.rank = 0, .size = 1, .comm = MPI_COMM_SELF, .sync_comm = MPI_COMM_SELF};
    cli_say(c, "check: recomputing CP = 1 on rank 0 ...\n");
    progress_at(&prog, "CP = 1 on rank 0", share);
    job_load(&one, &j1, &o);
    if (!one.err[0]) job_execute(&one, &j1, 0, JOB_FAST, r1, NULL);
    if (one.err[0]) cli_error(c, "CP = 1 recomputation: %s", one.err);
    progress_stop(&prog);
    if (!one.err[0] && !compare(&j, rn, r1, c->size)) cli_error(c, "CP = %d differs from CP = 1 beyond tolerance", c->size);
  }
  failed = cli_sync(c);
  progress_stop(&prog);
  c->progress = NULL;
  if (rn) job_result_free(rn, j.n_lay);
  if (r1) job_result_free(r1, j.n_lay);
  free(rn);
  free(r1);
  job_free(&j);
  job_free(&j1);
  return failed;
}
