/* attn_check.c: argument validation of the three operators (shared by fast and reference). A bad
 * row index would otherwise read out of bounds, so every index is checked before any work. */
#include "attn_common.h"
#include "compressor.h"
#include "util/err.h"

dsv4_status dsv4_attn_check(const dsv4_attn_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a && a->out && a->lse && a->q && a->ori_kv && a->win_start && a->win_len && a->sink,
             DSV4_ERR_ARG, "sparse_attn: a required pointer is NULL");
  DSV4_CHECK(a->S1 >= 0 && a->R >= 0 && a->H > 0 && a->D > 0, DSV4_ERR_ARG,
             "sparse_attn: bad sizes S1=%lld R=%lld H=%d D=%d", (long long)a->S1, (long long)a->R, a->H,
             a->D);
  DSV4_CHECK(!a->cmp_kv || a->cmp_ids || (a->cmp_begin && a->cmp_count), DSV4_ERR_ARG,
             "sparse_attn: cmp_kv given without cmp_ids or cmp_begin/cmp_count");
  DSV4_CHECK(!a->cmp_ids || a->n_cmp_ids >= 0, DSV4_ERR_ARG, "sparse_attn: n_cmp_ids < 0");
  for (int64_t p = 0; p < a->S1; p++) {
    const int64_t s = a->win_start[p], n = a->win_len[p];
    DSV4_CHECK(n >= 0 && s >= 0 && s + n <= a->R, DSV4_ERR_ARG,
               "sparse_attn: window of query %lld [%lld, %lld) outside ori_kv rows [0, %lld)",
               (long long)p, (long long)s, (long long)(s + n), (long long)a->R);
    if (a->scores_out) { /* room for the window's and the compressed keys' logits of every query */
      const int64_t keys = n + (a->cmp_kv ? (a->cmp_ids ? a->n_cmp_ids : a->cmp_count[p]) : 0);
      DSV4_CHECK(a->score_stride >= (int64_t)a->H * keys, DSV4_ERR_ARG,
                 "sparse_attn: score_stride %lld below %lld logits of query %lld", (long long)a->score_stride,
                 (long long)a->H * keys, (long long)p);
    }
    if (!a->cmp_kv) continue;
    if (a->cmp_ids) {
      for (int j = 0; j < a->n_cmp_ids; j++) {
        int32_t id = a->cmp_ids[p * a->n_cmp_ids + j];
        DSV4_CHECK(id >= -1 && id < a->C, DSV4_ERR_ARG,
                   "sparse_attn: cmp_ids[%lld, %d] = %d outside [-1, %lld)", (long long)p, j, id,
                   (long long)a->C);
      }
    } else {
      const int64_t b = a->cmp_begin[p], c = a->cmp_count[p];
      DSV4_CHECK(c >= 0 && (c == 0 || (b >= 0 && b + c <= a->C)), DSV4_ERR_ARG,
                 "sparse_attn: compressed range of query %lld [%lld, %lld) outside [0, %lld)",
                 (long long)p, (long long)b, (long long)(b + c), (long long)a->C);
    }
  }
fail:
  return rc;
}

dsv4_status dsv4_attn_bwd_check(const dsv4_attn_bwd_args *b) { return dsv4_attn_bwd_check_sums(b, 0, 0); }

dsv4_status dsv4_attn_bwd_check_sums(const dsv4_attn_bwd_args *b, int sums_ori, int sums_cmp) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(b, DSV4_ERR_ARG, "sparse_attn backward: NULL arguments");
  dsv4_attn_args chk = b->fwd; /* the forward's checks, with the forward's outputs as given here */
  chk.out = (float *)b->out;
  chk.lse = (float *)b->lse;
  if (b->scores) chk.scores_out = (float *)b->scores; /* the same layout checks */
  DSV4_TRY(dsv4_attn_check(&chk));
  DSV4_CHECK(b->dq && (sums_ori || b->d_ori_kv) && b->d_sink && b->dout, DSV4_ERR_ARG,
             "sparse_attn backward: a required pointer is NULL");
  DSV4_CHECK(!b->fwd.cmp_kv || sums_cmp || b->d_cmp_kv, DSV4_ERR_ARG,
             "sparse_attn backward: d_cmp_kv is NULL");
fail:
  return rc;
}

/* Visible ranges [vis_begin, vis_begin + vis_count) must lie in [0, C). */
static dsv4_status check_vis(const char *op, const int32_t *vb, const int32_t *vc, int64_t S1, int64_t C) {
  dsv4_status rc = DSV4_OK;
  for (int64_t p = 0; p < S1; p++) {
    const int64_t b = vb[p], c = vc[p];
    DSV4_CHECK(c >= 0 && (c == 0 || (b >= 0 && b + c <= C)), DSV4_ERR_ARG,
               "%s: visible range of query %lld [%lld, %lld) outside k_idx rows [0, %lld)", op,
               (long long)p, (long long)b, (long long)(b + c), (long long)C);
  }
fail:
  return rc;
}

dsv4_status dsv4_indexer_check(const dsv4_indexer_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a && a->topk_ids && a->q_idx && a->weights && a->vis_begin && a->vis_count, DSV4_ERR_ARG,
             "lightning_indexer: a required pointer is NULL");
  DSV4_CHECK(a->k_idx || a->C == 0, DSV4_ERR_ARG, "lightning_indexer: k_idx is NULL");
  DSV4_CHECK(a->S1 >= 0 && a->C >= 0 && a->Hi > 0 && a->Di > 0 && a->topk > 0, DSV4_ERR_ARG,
             "lightning_indexer: bad sizes S1=%lld C=%lld Hi=%d Di=%d topk=%d", (long long)a->S1,
             (long long)a->C, a->Hi, a->Di, a->topk);
  DSV4_TRY(check_vis("lightning_indexer", a->vis_begin, a->vis_count, a->S1, a->C));
  DSV4_CHECK(!(a->cand_out || a->cand_in) || (a->block > 0 && a->n_cand > 0), DSV4_ERR_ARG,
             "lightning_indexer: candidates need block > 0 and n_cand > 0 (got %d, %d)", a->block, a->n_cand);
fail:
  return rc;
}

dsv4_status dsv4_kl_check(const dsv4_kl_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a && a->loss_sum && a->n_valid && a->q && a->q_idx && a->weights, DSV4_ERR_ARG,
             "indexer_kl_loss: a required pointer is NULL");
  DSV4_CHECK((a->cmp_kv && a->k_idx) || a->C == 0, DSV4_ERR_ARG,
             "indexer_kl_loss: cmp_kv / k_idx is NULL");
  DSV4_CHECK(a->S1 >= 0 && a->C >= 0 && a->H > 0 && a->D > 0 && a->Hi > 0 && a->Di > 0,
             DSV4_ERR_ARG, "indexer_kl_loss: bad sizes");
  if (a->dense) {
    DSV4_CHECK(a->vis_begin && a->vis_count, DSV4_ERR_ARG,
               "indexer_kl_loss: dense mode needs vis_begin / vis_count");
    DSV4_TRY(check_vis("indexer_kl_loss", a->vis_begin, a->vis_count, a->S1, a->C));
  } else {
    DSV4_CHECK(a->topk_ids && a->topk > 0, DSV4_ERR_ARG, "indexer_kl_loss: sparse mode needs topk_ids");
    for (int64_t i = 0; i < a->S1 * a->topk; i++)
      DSV4_CHECK(a->topk_ids[i] >= -1 && a->topk_ids[i] < a->C, DSV4_ERR_ARG,
                 "indexer_kl_loss: topk_ids[%lld, %lld] = %d outside [-1, %lld)",
                 (long long)(i / a->topk), (long long)(i % a->topk), a->topk_ids[i], (long long)a->C);
  }
fail:
  return rc;
}
