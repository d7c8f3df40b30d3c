/* job_run.c: running a job's layer: the layer object (patched for CP over every rank when asked),
 * the timed forward and backward, the rank-summed gradients, and the results left on each rank or
 * gathered whole on rank 0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_mpi.h"
#include "job.h"

void job_result_free(job_result *r) {
  free(r->out);
  free(r->dx);
  free(r->topk);
  dsv4_weights_free(r->grads);
  memset(r, 0, sizeof *r);
}

int job_make_layer(cli_ctx *c, job *j, int cp, dsv4_layer **l, dsv4_comm **comm) {
  *l = NULL;
  *comm = NULL;
  if (cli_lib(c, dsv4_layer_create(l, &j->cfg, j->layer, j->w))) return 1;
  if (j->recompute && cli_lib(c, dsv4_layer_set_recompute(*l, 1))) return 1;
  if (j->threads && cli_lib(c, dsv4_layer_set_threads(*l, j->threads))) return 1;
  if (!cp || c->size == 1) return 0;
  if (cli_lib(c, dsv4_comm_create_mpi(comm, c->comm))) return 1;
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

void job_execute(cli_ctx *c, job *j, int cp, job_path path, job_result *r, dsv4_cp_stats *stats) {
  dsv4_layer *l = NULL;
  dsv4_comm *comm = NULL;
  float *out = NULL, *dx = NULL;
  int32_t *topk = NULL;
  dsv4_weights *grads = NULL;
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk, n = j->n;
  const int use_cp = cp && c->size > 1;
  memset(r, 0, sizeof *r);
  if (job_make_layer(c, j, cp, &l, &comm)) goto done;
  dsv4_layer_set_impl(l, path == JOB_NAIVE ? DSV4_IMPL_NAIVE : DSV4_IMPL_FAST);
  if (path == JOB_NAIVE_OPS) dsv4_core_set_impl(dsv4_layer_core(l), DSV4_IMPL_NAIVE);
  out = malloc(sizeof(float) * (size_t)(n * d + 1));
  topk = j->ratio == 4 ? malloc(sizeof(int32_t) * (size_t)(n * k + 1)) : NULL;
  if (!out || (j->ratio == 4 && !topk)) {
    cli_error(c, "out of memory for the output");
    goto done;
  }
  MPI_Barrier(c->comm);
  cli_phase(c, "forward");
  double t0 = MPI_Wtime();
  const dsv4_layer_fwd_args fa = {DSV4_HEAD(dsv4_layer_fwd_args), .out = out, .topk_ids = topk,
                                  .indexer_loss = &r->loss, .x = j->x, .n = n, .pk = &j->pk,
                                  .train = j->dout != NULL};
  if (cli_lib(c, dsv4_layer_forward(l, &fa))) goto done;
  r->fwd_seconds = MPI_Wtime() - t0;
  if (j->dout) {
    dx = malloc(sizeof(float) * (size_t)(n * d + 1));
    if (!dx) {
      cli_error(c, "out of memory for dx");
      goto done;
    }
    if (cli_lib(c, dsv4_weights_create(&grads, &j->cfg, j->layer))) goto done;
    cli_phase(c, "backward");
    t0 = MPI_Wtime();
    const dsv4_layer_bwd_args ba = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = dx, .grads = grads, .dout = j->dout,
                                    .d_loss = 1.0f};
    if (cli_lib(c, dsv4_layer_backward(l, &ba))) goto done;
    if (use_cp && cli_lib(c, dsv4_cp_allreduce_grads(comm, grads))) goto done;
    r->bwd_seconds = MPI_Wtime() - t0;
  }
  double times[2] = {r->fwd_seconds, r->bwd_seconds};
  MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, c->comm);
  r->fwd_seconds = times[0];
  r->bwd_seconds = times[1];
  if (stats && use_cp) {
    *stats = (dsv4_cp_stats)DSV4_CP_STATS_INIT;
    dsv4_cp_get_stats(dsv4_layer_core(l), stats);
  }
  if (!j->keep_local) { /* the whole result on rank 0 (check, demo) */
    const int full = c->rank == 0;
    float *fo = full ? malloc(sizeof(float) * (size_t)(j->T * d + 1)) : NULL;
    int32_t *ft = full && topk ? malloc(sizeof(int32_t) * (size_t)(j->T * k + 1)) : NULL;
    float *fd = full && dx ? malloc(sizeof(float) * (size_t)(j->T * d + 1)) : NULL;
    if (full && (!fo || (topk && !ft) || (dx && !fd))) { /* the others send next: stop the job */
      cli_error(c, "out of memory for the gathered results on rank 0 (%lld rows)", (long long)j->T);
      cli_abort(c);
    }
    job_gather_rows(c, j, out, sizeof(float) * (size_t)d, fo);
    if (topk) job_gather_rows(c, j, topk, sizeof(int32_t) * (size_t)k, ft);
    if (dx) job_gather_rows(c, j, dx, sizeof(float) * (size_t)d, fd);
    free(out), free(topk), free(dx);
    out = fo, topk = ft, dx = fd;
  }
  r->out = out, r->topk = topk, r->dx = dx;
  out = NULL, topk = NULL, dx = NULL;
  r->grads = grads;
  grads = NULL;
done:
  dsv4_weights_free(grads);
  free(out);
  free(dx);
  free(topk);
  dsv4_layer_free(l);
  dsv4_comm_free(comm);
}
