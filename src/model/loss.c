/* loss.c: the indexer KL loss stage (core.h; docs/spec.md section 3 "Indexer KL loss"): each local
 * query's term (teacher: the attention's own logits, student: the indexer's scores of the selected
 * ids), summed in 128-bit fixed point (util/exactsum.h, associative) and reduced with the valid
 * counts over the CP group, so every rank returns the one-rank loss bits; and the KL backward,
 * whose only outputs are the indexer's gradients (its inputs are detached). */
#include <math.h>

#include "core.h"
#include "ops/kl_loss.h"
#include "ops/placement.h"
#include "util/err.h"

static dsv4_kl_args kl_args(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in) {
  const dsv4_plan *p = e->p;
  const dsv4_config *c = e->cfg;
  const int k = c->index_topk;
  return (dsv4_kl_args){.q = in->q, .cmp_kv = in->cmp, .topk_ids = in->topk + i0 * k, .q_idx = in->qI,
                        .k_idx = in->KI, .weights = in->wI, .vis_begin = p->cmp_begin + i0,
                        .vis_count = p->cmp_count + i0, .S1 = n, .C = p->docs.n_cmp, .H = c->n_heads,
                        .D = c->head_dim, .Hi = c->index_n_heads, .Di = c->index_head_dim, .topk = k,
                        .dense = c->index_loss_mode == DSV4_KL_DENSE,
                        .scale = (float)(1.0 / sqrt((double)c->head_dim)),
                        .teacher = in->teacher ? in->teacher + i0 * k : NULL, .scores = in->scores + i0 * k};
}

dsv4_status dsv4_loss_rows(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in, int64_t *valid) {
  dsv4_status rc = DSV4_OK;
  double sum = 0;
  int64_t n_valid = 0;
  dsv4_kl_args ka = kl_args(e, i0, n, in);
  ka.loss_sum = &sum;
  ka.n_valid = &n_valid;
  ka.loss_rows = in->kl_rows + i0;
  dsv4_placement places[6];
  dsv4_kl_places(places);
  DSV4_TRY(dsv4_indexer_kl_loss_dist(&ka, e->x->comm->size, places, e->impl));
  *valid += n_valid;
fail:
  return rc;
}

dsv4_status dsv4_loss_reduce(const dsv4_stage_env *e, const double *kl_rows, int64_t kl_valid, int64_t *n_valid,
                             float *loss) {
  dsv4_status rc = DSV4_OK;
  dsv4_exactsum total = 0;
  int64_t count = kl_valid;
  for (int64_t i = 0; i < e->p->n; i++) total += dsv4_exactsum_term(kl_rows[i]);
  DSV4_TRY(dsv4_xfer_loss(e->x, &total, &count));
  *n_valid = count;
  if (loss) *loss = count ? (float)(e->cfg->index_loss_coeff * dsv4_exactsum_value(total) / (double)count) : 0.0f;
fail:
  return rc;
}

dsv4_status dsv4_loss_bwd_rows(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in,
                               float grad_scale, float *d_qI, float *d_w, float *d_KI, dsv4_xrows *x_KI) {
  dsv4_status rc = DSV4_OK;
  double sum = 0;
  int64_t cnt = 0;
  dsv4_kl_args ka = kl_args(e, i0, n, in);
  ka.loss_sum = &sum;
  ka.n_valid = &cnt;
  ka.d_q_idx = d_qI;
  ka.d_weights = d_w;
  ka.d_k_idx = d_KI;
  ka.grad_scale = grad_scale;
  dsv4_placement places[6];
  dsv4_kl_places(places);
  if (e->impl == DSV4_IMPL_NAIVE || !x_KI)
    return dsv4_indexer_kl_loss_dist(&ka, e->x->comm->size, places, e->impl);
  dsv4_placement out[4];
  DSV4_TRY(dsv4_indexer_kl_loss_infer(e->x->comm->size, places, out));
  DSV4_TRY(dsv4_indexer_kl_loss_into(&ka, x_KI));
fail:
  return rc;
}
