/* job_run.c: running a job's layer: the layer object (patched for CP over every rank when asked),
 * the timed forward and backward, the rank-summed gradients, and the results left on each rank or
 * gathered whole on rank 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_mpi.h"
#include "job.h"

void job_result_free(job_result *r, int n) {
  for (int i = 0; i < n; i++) {
    free(r[i].out);
    free(r[i].dx);
    free(r[i].topk);
    dsv4_weights_free(r[i].grads);
    memset(&r[i], 0, sizeof r[i]);
  }
}

void job_tensor_name(const job *j, const char *base, int layer, char *buf, size_t n) {
  if (j->suffixed) snprintf(buf, n, "%s.%d", base, layer);
  else snprintf(buf, n, "%s", base);
}

int job_make_layer(cli_ctx *c, job *j, int i, int cp, dsv4_layer **l, dsv4_comm **comm) {
  *l = NULL;
  if (cli_lib(c, dsv4_layer_create(l, &j->cfg, j->layer + i, j->lw[i]))) return 1;
  if (j->recompute && cli_lib(c, dsv4_layer_set_recompute(*l, 1))) return 1;
  if (j->threads && cli_lib(c, dsv4_layer_set_threads(*l, j->threads))) return 1;
  if (!cp || c->size == 1) return 0;
  if (!*comm && cli_lib(c, dsv4_comm_create_mpi(comm, c->comm))) return 1;
  return cli_lib(c, dsv4_cp_patch(dsv4_layer_core(*l), *comm, &j->cp));
}

void job_diff(const float *a, const float *b, int64_t n, double *max_diff, double *max_ref) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - b[i]);
    if (e > d || isnan(e)) d = e; /* a NaN sticks: nothing compares greater than it */
    m = fabs(b[i]) > m ? fabs(b[i]) : m;
  }
  *max_diff = d;
  *max_ref = m;
}

/* 1 when layer L computes a top-k (and an indexer loss). */
static int selects(const job *j, int L) {
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  return dsv4_config_layer(&j->cfg, L, &in) == DSV4_OK && in.selects;
}

/* The whole result of one layer on rank 0 (check, demo): every rank's rows gathered. */
static void gather_whole(cli_ctx *c, const job *j, job_result *r) {
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk;
  const int full = c->rank == 0;
  float *fo = full ? malloc(sizeof(float) * (size_t)(j->T * d + 1)) : NULL;
  int32_t *ft = full && r->topk ? malloc(sizeof(int32_t) * (size_t)(j->T * k + 1)) : NULL;
  float *fd = full && r->dx ? malloc(sizeof(float) * (size_t)(j->T * d + 1)) : NULL;
  if (full && (!fo || (r->topk && !ft) || (r->dx && !fd))) { /* the others send next: stop the job */
    cli_error(c, "out of memory for the gathered results on rank 0 (%lld rows)", (long long)j->T);
    cli_abort(c);
  }
  job_gather_rows(c, j, r->out, sizeof(float) * (size_t)d, fo);
  if (r->topk) job_gather_rows(c, j, r->topk, sizeof(int32_t) * (size_t)k, ft);
  if (r->dx) job_gather_rows(c, j, r->dx, sizeof(float) * (size_t)d, fd);
  free(r->out), free(r->topk), free(r->dx);
  r->out = fo, r->topk = ft, r->dx = fd;
}

static void add_stats(dsv4_cp_stats *sum, const dsv4_cp_stats *s) {
  for (int k = 0; k < DSV4_MSG_KINDS; k++) {
    sum->bytes_sent[k] += s->bytes_sent[k];
    sum->bytes_recv[k] += s->bytes_recv[k];
    sum->messages[k] += s->messages[k];
    sum->seconds[k] += s->seconds[k];
  }
}

void job_execute(cli_ctx *c, job *j, int cp, job_path path, job_result *r, dsv4_cp_stats *stats) {
  const int nl = j->n_lay;
  dsv4_layer **l = calloc((size_t)nl, sizeof *l);
  dsv4_comm *comm = NULL;
  dsv4_shared *sh = NULL;
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk, n = j->n;
  const int use_cp = cp && c->size > 1, train = j->ldout[0] != NULL;
  memset(r, 0, sizeof *r * (size_t)nl);
  if (!l) {
    cli_error(c, "out of memory");
    return;
  }
  if (cli_lib(c, dsv4_shared_create(&sh))) goto done;
  for (int i = 0; i < nl; i++) {
    if (job_make_layer(c, j, i, cp, &l[i], &comm)) goto done;
    dsv4_layer_set_impl(l[i], path == JOB_NAIVE ? DSV4_IMPL_NAIVE : DSV4_IMPL_FAST);
    if (path == JOB_NAIVE_OPS) dsv4_core_set_impl(dsv4_layer_core(l[i]), DSV4_IMPL_NAIVE);
    r[i].layer = j->layer + i;
    r[i].has_loss = selects(j, r[i].layer);
    r[i].out = malloc(sizeof(float) * (size_t)(n * d + 1));
    r[i].topk = r[i].has_loss ? malloc(sizeof(int32_t) * (size_t)(n * k + 1)) : NULL;
    if (!r[i].out || (r[i].has_loss && !r[i].topk)) {
      cli_error(c, "out of memory for the output");
      goto done;
    }
  }
  MPI_Barrier(c->comm);
  cli_phase(c, "forward");
  double t0 = MPI_Wtime();
  for (int i = 0; i < nl; i++) { /* in model order: a layer's sources run before it */
    const dsv4_layer_fwd_args fa = {DSV4_HEAD(dsv4_layer_fwd_args), .out = r[i].out, .topk_ids = r[i].topk,
                                    .indexer_loss = &r[i].loss, .x = j->lx[i], .n = n, .pk = &j->pk,
                                    .train = train, .shared = sh};
    if (cli_lib(c, dsv4_layer_forward(l[i], &fa))) goto done;
  }
  const double fwd = MPI_Wtime() - t0;
  double bwd = 0;
  if (train) {
    for (int i = 0; i < nl; i++) { /* allocated before the clock starts */
      if (!(r[i].dx = malloc(sizeof(float) * (size_t)(n * d + 1)))) {
        cli_error(c, "out of memory for dx");
        goto done;
      }
      if (cli_lib(c, dsv4_weights_create(&r[i].grads, &j->cfg, r[i].layer))) goto done;
    }
    cli_phase(c, "backward");
    t0 = MPI_Wtime();
    for (int i = nl - 1; i >= 0; i--) { /* in reverse: a source's backward comes after its readers' */
      const dsv4_layer_bwd_args ba = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = r[i].dx, .grads = r[i].grads,
                                      .dout = j->ldout[i], .d_loss = 1.0f};
      if (cli_lib(c, dsv4_layer_backward(l[i], &ba))) goto done;
    }
    /* the gradients come back summed over the ranks (the backward is collective) */
    bwd = MPI_Wtime() - t0;
  }
  double times[2] = {fwd, bwd};
  MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, c->comm);
  r[0].fwd_seconds = times[0];
  r[0].bwd_seconds = times[1];
  if (stats && use_cp) {
    *stats = (dsv4_cp_stats)DSV4_CP_STATS_INIT;
    for (int i = 0; i < nl; i++) {
      dsv4_cp_stats s = DSV4_CP_STATS_INIT;
      dsv4_cp_get_stats(dsv4_layer_core(l[i]), &s);
      add_stats(stats, &s);
    }
  }
  if (!j->keep_local)
    for (int i = 0; i < nl; i++) gather_whole(c, j, &r[i]);
done:
  if (c->err[0]) job_result_free(r, nl);
  for (int i = 0; i < nl; i++) dsv4_layer_free(l[i]);
  free(l);
  dsv4_shared_free(sh);
  dsv4_comm_free(comm);
}
