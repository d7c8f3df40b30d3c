/* cmd_train.c: `dsv4cp train --steps K`: K steps of plain SGD on one layer (or a range of layers,
 * one shared state per step: a V4.1 source group) with a fixed synthetic objective, printing the
 * loss per step; run with CP = 1 and CP = N to see the same losses (the design documents'
 * loss-equivalence test).
 *   objective = sum_L [0.5 sum_rows ||out_L - y_L||^2 / (T d) + indexer_loss_L],   y_L seeded random
 *   w <- w - lr * (rank-summed gradient)
 * The squared-error sum is reduced exactly (128-bit fixed point: integer sums are associative) so
 * that, given bitwise equal outputs, every rank count prints the same bits; the backward's weight
 * gradients are exact sums over global panels (the same bits for every N), so every step's weights,
 * and so every later loss, are the same bits too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_io.h"
#include "dsv4cp_mpi.h"
#include "job.h"

#define TARGET_STREAM "train.target"
#define DEFAULT_STEPS 5
#define DEFAULT_LR 0.05

/* Fixed point of the loss terms: each term is rounded once to a multiple of 2^-FRAC_BITS (the same
 * way on every rank), so the total does not depend on which rank adds which term. */
#define FRAC_BITS 70
typedef __int128 fixed_sum;

/* Sum over ranks of the local terms, exactly (every rank gets the same bits). */
static double exact_allsum(cli_ctx *c, const double *terms, int64_t n) {
  fixed_sum mine = 0, *all = malloc(sizeof(fixed_sum) * (size_t)c->size);
  for (int64_t i = 0; i < n; i++) mine += (fixed_sum)ldexp(terms[i], FRAC_BITS);
  MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, c->comm);
  fixed_sum tot = 0;
  for (int r = 0; r < c->size; r++) tot += all[r];
  free(all);
  return ldexp((double)tot, -FRAC_BITS);
}

/* FNV-1a over every tensor's bytes, in the set's order. */
static uint64_t weights_hash(const dsv4_weights *w) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < dsv4_weights_count(w); i++) {
    dsv4_tensor t = DSV4_TENSOR_INIT;
    dsv4_weights_get(w, i, &t);
    const unsigned char *b = (const unsigned char *)t.data;
    for (size_t e = 0; e < sizeof(float) * (size_t)t.numel; e++) h = (h ^ b[e]) * 1099511628211ull;
  }
  return h;
}

/* The SGD loop over the range's layers (forwards in order, backwards in reverse); returns after
 * recording any error in c. */
static void train(cli_ctx *c, job *j, int64_t steps, double lr) {
  const int64_t d = j->cfg.dim, n = j->n;
  const int nl = j->n_lay;
  dsv4_layer **l = calloc((size_t)nl, sizeof *l);
  dsv4_weights **g = calloc((size_t)nl, sizeof *g);
  dsv4_comm *comm = NULL;
  dsv4_shared *sh = NULL;
  float *out = malloc(sizeof(float) * (size_t)(nl * n * d + 1)), *y = malloc(sizeof(float) * (size_t)(nl * n * d + 1));
  float *dout = malloc(sizeof(float) * (size_t)(nl * n * d + 1)), *dx = malloc(sizeof(float) * (size_t)(n * d + 1));
  double *terms = malloc(sizeof(double) * (size_t)(nl * n + 1));
  if (!l || !g || !out || !y || !dout || !dx || !terms) {
    cli_error(c, "out of memory");
    goto done;
  }
  for (int k = 0; k < nl; k++) { /* the one-layer stream for the first layer, one per layer after */
    char name[48];
    snprintf(name, sizeof name, k ? TARGET_STREAM ".%d" : TARGET_STREAM, j->layer + k);
    const uint64_t ys = dsv4_random_stream(name);
    for (int64_t i = 0; i < n; i++) dsv4_random_fill(y + (k * n + i) * d, d, j->seed, ys, j->rows[i] * d, 1.0f);
    if (job_make_layer(c, j, k, 1, &l[k], &comm)) goto done;
    if (cli_lib(c, dsv4_weights_create(&g[k], &j->cfg, j->layer + k))) goto done;
  }
  if (cli_lib(c, dsv4_shared_create(&sh))) goto done;
  const double norm = 1.0 / ((double)j->T * d);
  for (int64_t step = 1; step <= steps; step++) {
    char what[64];
    snprintf(what, sizeof what, "step %lld of %lld", (long long)step, (long long)steps);
    progress_at(c->progress, what, (double)(step - 1) / (double)steps);
    double iloss = 0;
    dsv4_shared_reset(sh);
    for (int k = 0; k < nl; k++) {
      float il = 0;
      float *o = out + k * n * d, *yk = y + k * n * d, *dk = dout + k * n * d;
      const dsv4_layer_fwd_args fa = {DSV4_HEAD(dsv4_layer_fwd_args), .out = o, .indexer_loss = &il, .x = j->lx[k],
                                      .n = n, .pk = &j->pk, .train = 1, .shared = sh};
      if (cli_lib(c, dsv4_layer_forward(l[k], &fa))) goto done;
      iloss += il;
      for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int64_t e = 0; e < d; e++) {
          const double r = (double)o[i * d + e] - yk[i * d + e];
          s += r * r;
          dk[i * d + e] = (float)(r * norm);
        }
        terms[k * n + i] = 0.5 * s * norm;
      }
    }
    const double mse = exact_allsum(c, terms, nl * n);
    cli_say(c, "step %lld  loss %.9e  (squared error %.9e + indexer %.9e)\n", (long long)step,
            mse + iloss, mse, iloss);
    for (int k = nl - 1; k >= 0; k--) {
      dsv4_weights_zero(g[k]);
      const dsv4_layer_bwd_args ba = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = dx, .grads = g[k], .dout = dout + k * n * d,
                                      .d_loss = 1.0f};
      if (cli_lib(c, dsv4_layer_backward(l[k], &ba))) goto done;
    }
    for (int k = 0; k < nl; k++) { /* the gradients are the rank-summed ones, the same bits on every rank */
      for (int i = 0; i < dsv4_weights_count(g[k]); i++) {
        dsv4_tensor tw = DSV4_TENSOR_INIT, tg = DSV4_TENSOR_INIT;
        dsv4_weights_get(j->lw[k], i, &tw);
        dsv4_weights_get(g[k], i, &tg);
        for (int64_t e = 0; e < tw.numel; e++) tw.data[e] -= (float)(lr * tg.data[e]);
      }
    }
  }
  for (int k = 0; k < nl; k++) /* the trained weights' fingerprint: equal across CP degrees and splits */
    cli_say(c, "layer %d weights fnv1a64 %016llx\n", j->layer + k, (unsigned long long)weights_hash(j->lw[k]));
done:
  for (int k = 0; l && k < nl; k++) dsv4_layer_free(l[k]);
  for (int k = 0; g && k < nl; k++) dsv4_weights_free(g[k]);
  free(l), free(g);
  dsv4_shared_free(sh);
  dsv4_comm_free(comm);
  free(out);
  free(y);
  free(dout);
  free(dx);
  free(terms);
}

int cmd_train(cli_ctx *c, int argc, char **argv) {
  static const char *USAGE =
      "usage: [mpirun -np N] dsv4cp train (--config config.json | --preset NAME) (--layer L | --layers A-B)\n"
      "                                   --steps K [options]\n"
      "\n"
      "K steps of plain SGD on one layer (or layers A..B, a V4.1 source group, summed) with the objective\n"
      "0.5 ||out - y||^2 / (T d) + indexer_loss (y seeded random); prints the loss per step and, at the end,\n"
      "a hash of each layer's trained weights. Every CP degree, split and thread count prints the same\n"
      "losses and hashes, bit for bit. On a terminal, a progress line on stderr.";
  job_opts o = {0};
  const char *threads = NULL, *steps_s = NULL, *lr_s = NULL;
  cli_opt opts[24];
  int k = job_common_opts(&o, opts, JOB_CMD_TRAIN);
  opts[k++] = (cli_opt){"steps", "K", "SGD steps (default 5)", &steps_s, NULL};
  opts[k++] = (cli_opt){"lr", "RATE", "learning rate (default 0.05)", &lr_s, NULL};
  opts[k++] = (cli_opt){"threads", "N", "OpenMP threads per rank (default: cores / ranks on the node)", &threads, NULL};
  opts[k] = (cli_opt){0};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  int64_t steps = DEFAULT_STEPS;
  double lr = DEFAULT_LR;
  if (p == 0 && steps_s) cli_int(c, "steps", steps_s, 1, 1000000, &steps);
  if (p == 0 && lr_s) {
    char *end = NULL;
    lr = strtod(lr_s, &end);
    if (!*lr_s || *end || !(lr > 0) || !isfinite(lr)) cli_error(c, "--lr: '%s' is not a positive number", lr_s);
  }
  if (!c->err[0]) cli_set_threads(c, threads);
  if (cli_sync(c)) return 1;
  job j;
  job_load(c, &j, &o);
  progress prog;
  progress_start(&prog, c->rank, 0, "dsv4cp train");
  c->progress = &prog;
  if (!cli_sync(c)) {
    if (j.suffixed)
      cli_say(c, "train: layers %d-%d, T = %lld, CP = %d, lr %g\n", j.layer, j.layer + j.n_lay - 1, (long long)j.T,
              c->size, lr);
    else
      cli_say(c, "train: layer %d (compress ratio %d), T = %lld, CP = %d, lr %g\n", j.layer, j.ratio,
              (long long)j.T, c->size, lr);
    train(c, &j, steps, lr);
  }
  int failed = cli_sync(c);
  progress_stop(&prog);
  c->progress = NULL;
  job_free(&j);
  return failed;
}
