/* arenas.c: the carve functions of arenas.h: the one description of what a layer call holds. */
#include "arenas.h"

#include "cp/exchange.h"
#include "ops/kernels.h"
#include "util/par.h"
#include "util/workspace.h"

dsv4_status dsv4_arena_reserve(dsv4_arena *a, size_t bytes, const char *what) {
  dsv4_status rc = DSV4_OK;
  a->used = bytes;
  if (bytes <= a->cap && a->base) return DSV4_OK;
  free(a->base);
  a->cap = 0;
  a->base = aligned_alloc(DSV4_WS_ALIGN, (bytes + DSV4_WS_ALIGN) / DSV4_WS_ALIGN * DSV4_WS_ALIGN);
  DSV4_CHECK(a->base, DSV4_ERR_NOMEM, "out of memory: %zu bytes for the %s", bytes, what);
  a->cap = bytes;
fail:
  return rc;
}

void dsv4_arena_free(dsv4_arena *a) {
  free(a->base);
  a->base = NULL;
  a->cap = a->used = 0;
}

void dsv4_dims_of(dsv4_dims *dm, const dsv4_config *cfg, const dsv4_layer_info *info, const dsv4_plan *p,
                  int recompute, dsv4_impl impl) {
  const dsv4_layout *l = &p->lay;
  const int r = p->key.ratio, v41 = cfg->v41 != 0;
  *dm = (dsv4_dims){.ratio = r, .recompute = recompute != 0, .fast = impl == DSV4_IMPL_FAST,
                    .sparse_kl = cfg->index_loss_mode == DSV4_KL_SPARSE,
                    .compresses = v41 ? info->role == DSV4_ROLE_FULL : r > 0, .gate = !v41 || r > 1,
                    .v4_keys = !v41 && r == 4, .v41_keys = v41 && info->role == DSV4_ROLE_FULL, .own_cmp = !v41,
                    .selects = info->selects, .sparse = v41 ? r > 0 : r == 4, .head_norm = !v41, .n = p->n,
                    .m = p->n < DSV4_CHUNK_ROWS ? p->n : DSV4_CHUNK_ROWS, .R_kv = l->R_kv, .R_c = l->R_c,
                    .ext_kv = l->ext_kv, .n_blk = l->n_blk, .n_blk_all = l->n_blk_all,
                    .gather_identity = p->gather_identity,
                    .n_cmp = r > 0 ? p->docs.n_cmp : 0, .H = cfg->n_heads, .D = cfg->head_dim, .d = cfg->dim,
                    .dq = cfg->q_lora_rank, .GRo = cfg->o_groups * cfg->o_lora_rank,
                    .HGD = cfg->n_heads / cfg->o_groups * cfg->head_dim, .Hi = cfg->index_n_heads,
                    .Di = cfg->index_head_dim, .k = cfg->index_topk};
  dm->max_keys = p->max_win + (dm->sparse ? cfg->index_topk : p->max_cmp);
  dm->nt = dm->fast ? dsv4_nthreads() : 1;
}

#define F(n) (sizeof(float) * (size_t)(n))

size_t dsv4_carve_core_saved(char *base, const dsv4_dims *m, dsv4_core_saved *s) {
  dsv4_carver c = {base, 0};
  const int64_t cD = (m->ratio == 4 ? 2 : 1) * (int64_t)m->D;
  *s = (dsv4_core_saved){0};
  s->lse = dsv4_carve(&c, F(m->n * m->H));
  if (m->ext_kv) s->kv_ext = dsv4_carve(&c, F(m->R_kv * m->D));
  if (m->compresses) {
    s->C = dsv4_carve(&c, F(m->R_c * cD));
    if (m->gate) s->Z = dsv4_carve(&c, F(m->R_c * cD));
  }
  if (m->compresses && m->own_cmp) s->cmp = dsv4_carve(&c, F(m->n_cmp * m->D));
  if (m->v41_keys) {
    s->lat = dsv4_carve(&c, F(m->n_blk * m->D));
    s->kpre = dsv4_carve(&c, F(m->n_blk * m->Di));
  }
  if (m->v4_keys) {
    s->CI = dsv4_carve(&c, F(m->R_c * 2 * m->Di));
    s->ZI = dsv4_carve(&c, F(m->R_c * 2 * m->Di));
    s->KI = dsv4_carve(&c, F(m->n_cmp * m->Di));
  }
  if (m->selects) {
    if (m->own_cmp) s->topk = dsv4_carve(&c, sizeof(int32_t) * (size_t)(m->n * m->k));
    s->scores = dsv4_carve(&c, F(m->n * m->k));
    if (m->sparse_kl) s->teacher = dsv4_carve(&c, F(m->n * m->k));
    s->kl_rows = dsv4_carve(&c, sizeof(double) * (size_t)m->n);
    if (!m->recompute) { /* kept whole for the backward; recomputation makes them chunk by chunk */
      s->qI = dsv4_carve(&c, F(m->n * m->Hi * m->Di));
      s->wI = dsv4_carve(&c, F(m->n * m->Hi));
    }
  }
  return c.used;
}

size_t dsv4_carve_core_fwd(char *base, const dsv4_dims *m, dsv4_core_fwd_scratch *s) {
  dsv4_carver c = {base, 0};
  *s = (dsv4_core_fwd_scratch){0};
  if (m->compresses) {
    s->blk[0] = dsv4_carve(&c, F(m->n_blk * m->D));
    s->all[0] = dsv4_carve(&c, F(m->n_blk_all * m->D));
  }
  if (m->v4_keys || m->v41_keys) {
    s->blk[1] = dsv4_carve(&c, F(m->n_blk * m->Di));
    s->all[1] = dsv4_carve(&c, F(m->n_blk_all * m->Di));
  }
  if (m->fast) s->win_state = dsv4_carve(&c, F(2 * m->n * m->H));
  if (m->selects && m->recompute) {
    s->qI = dsv4_carve(&c, F(m->m * m->Hi * m->Di));
    s->wI = dsv4_carve(&c, F(m->m * m->Hi));
  }
  return c.used;
}

size_t dsv4_carve_core_bwd(char *base, const dsv4_dims *m, dsv4_core_bwd_scratch *s) {
  dsv4_carver c = {base, 0};
  const int keys = m->v4_keys || m->v41_keys;
  const int64_t cD = (m->ratio == 4 ? 2 : 1) * (int64_t)m->D, dim = keys && m->Di > m->D ? m->Di : m->D;
  const int64_t cdim = m->v4_keys && 2 * m->Di > cD ? 2 * m->Di : cD;
  *s = (dsv4_core_bwd_scratch){0};
  const size_t X = 2 * sizeof(int64_t) * (size_t)m->D; /* one exact row */
  s->x_ext = dsv4_carve(&c, X * (size_t)(m->nt * m->R_kv));
  /* the float sums only on the naive path (the fast one adds into x_ext / x_cmp directly): d_cmp
   * is 512 B per token of the whole sequence under CSA, 2 GiB per rank at 4M tokens */
  if (!m->fast) s->d_ext = dsv4_carve(&c, F(m->R_kv * m->D));
  if (m->ratio > 0) {
    s->x_cmp = dsv4_carve(&c, X * (size_t)m->n_cmp);
    s->x_lock = dsv4_carve(&c, (size_t)m->n_cmp);
    if (!m->fast) s->d_cmp = dsv4_carve(&c, F(m->n_cmp * m->D));
  }
  if (m->compresses) {
    const size_t Xk = 2 * sizeof(int64_t) * (size_t)dim; /* an exact row of the kv or the keys */
    if (!m->gather_identity) { /* the ring's room for the kv rows and the keys (cp/exchange.h) */
      const int N = m->n_blk > 0 ? (int)(m->n_blk_all / m->n_blk) : 1;
      const int64_t kv = dsv4_xfer_ring_room(m->n_blk, m->D, N), ki = dsv4_xfer_ring_room(m->n_blk, m->Di, N);
      s->x_ring = dsv4_carve(&c, sizeof(int64_t) * (size_t)(keys && ki > kv ? ki : kv));
    }
    s->x_blk = dsv4_carve(&c, Xk * (size_t)m->n_blk);
    s->d_blk = dsv4_carve(&c, F(m->n_blk * dim));
    s->dC = dsv4_carve(&c, F(m->R_c * cdim));
    if (m->gate) s->dZ = dsv4_carve(&c, F(m->R_c * cdim));
  }
  if (m->v4_keys) s->d_KI = dsv4_carve(&c, F(m->n_cmp * m->Di));
  if (m->selects) {
    s->d_qI = dsv4_carve(&c, F(m->m * m->Hi * m->Di));
    s->d_wI = dsv4_carve(&c, F(m->m * m->Hi));
  }
  if (m->recompute) {
    s->rc_lse = dsv4_carve(&c, F(m->m * m->H));
    /* the recomputed forward keeps the chunk's logits so the backward skips q.K^T (2 H D flops per
     * key and query), while they take no more than the chunk's rebuilt q and o: a HCA rank's keys
     * grow with the sequence (max_cmp = S / 128; 64 GB per chunk at 63M tokens), and recomputation
     * is asked for to save memory; beyond that the backward recomputes them as the default does */
    if (m->fast && m->max_keys <= 2 * (int64_t)m->D) {
      s->rc_stride = (int64_t)m->H * m->max_keys;
      s->rc_scores = dsv4_carve(&c, F(m->m * s->rc_stride));
    }
    if (m->selects) {
      s->qI = dsv4_carve(&c, F(m->m * m->Hi * m->Di));
      s->wI = dsv4_carve(&c, F(m->m * m->Hi));
    }
  }
  return c.used;
}

size_t dsv4_carve_layer_saved(char *base, const dsv4_dims *m, dsv4_layer_saved *s) {
  dsv4_carver c = {base, 0};
  *s = (dsv4_layer_saved){0};
  s->a = dsv4_carve(&c, F(m->n * m->dq));
  s->qr = dsv4_carve(&c, F(m->n * m->dq));
  s->c = dsv4_carve(&c, F(m->n * m->D));
  s->kv = dsv4_carve(&c, F(m->n * m->D));
  s->u = dsv4_carve(&c, F(m->n * m->GRo));
  s->sa = dsv4_carve(&c, F(m->n));
  s->sc = dsv4_carve(&c, F(m->n));
  if (!m->recompute) {
    s->q = dsv4_carve(&c, F(m->n * m->H * m->D));
    s->o = dsv4_carve(&c, F(m->n * m->H * m->D));
    if (m->head_norm) s->sb = dsv4_carve(&c, F(m->n * m->H));
  }
  return c.used;
}

size_t dsv4_carve_layer_fwd(char *base, const dsv4_dims *m, dsv4_layer_fwd_scratch *s) {
  dsv4_carver c = {base, 0};
  const int64_t mf = m->recompute ? m->m : m->n; /* the forward's chunk */
  *s = (dsv4_layer_fwd_scratch){0};
  s->og = dsv4_carve(&c, F(mf * m->HGD));
  if (m->recompute) {
    s->q = dsv4_carve(&c, F(m->m * m->H * m->D));
    s->o = dsv4_carve(&c, F(m->m * m->H * m->D));
    if (m->head_norm) s->sb = dsv4_carve(&c, F(m->m * m->H));
  }
  return c.used;
}

size_t dsv4_carve_layer_bwd(char *base, const dsv4_dims *m, dsv4_layer_bwd_scratch *s) {
  dsv4_carver c = {base, 0};
  *s = (dsv4_layer_bwd_scratch){0};
  s->g = dsv4_carve(&c, F(m->m * m->d));
  s->du = dsv4_carve(&c, F(m->m * m->GRo));
  s->dop = dsv4_carve(&c, F(m->m * m->H * m->D));
  s->dqr = dsv4_carve(&c, F(m->m * m->dq));
  s->dkv = dsv4_carve(&c, F(m->n * m->D));
  if (m->recompute) {
    s->q = dsv4_carve(&c, F(m->m * m->H * m->D));
    s->o = dsv4_carve(&c, F(m->m * m->H * m->D));
    if (m->head_norm) s->sb = dsv4_carve(&c, F(m->m * m->H));
  }
  return c.used;
}

size_t dsv4_core_scratch_bytes(const dsv4_dims *dm) {
  dsv4_core_fwd_scratch f;
  dsv4_core_bwd_scratch b;
  const size_t x = dsv4_carve_core_fwd(NULL, dm, &f), y = dsv4_carve_core_bwd(NULL, dm, &b);
  return x > y ? x : y;
}

size_t dsv4_layer_scratch_bytes(const dsv4_dims *dm) {
  dsv4_layer_fwd_scratch f;
  dsv4_layer_bwd_scratch b;
  const size_t x = dsv4_carve_layer_fwd(NULL, dm, &f), y = dsv4_carve_layer_bwd(NULL, dm, &b);
  return x > y ? x : y;
}

size_t dsv4_kernel_scratch_bytes(const dsv4_dims *m, int threads) {
  const size_t nt = threads > 1 ? (size_t)threads : 1, x = 2 * sizeof(int64_t);
  /* the attention backward: its sink sums (its window and compressed sums are the core's x_ext,
   * x_cmp) and its workspace; a query's compressed keys are the top-k or at most all its keys */
  const int64_t ncmax = m->sparse ? m->k : m->ratio > 0 ? m->max_keys : 0;
  const size_t attn = x * (size_t)m->H + dsv4_sparse_attn_bwd_thread_bytes(m->H, m->D, m->max_keys + 1, ncmax,
                                                                           m->n_cmp, m->sparse);
  /* the KL backward: its workspace (its k_idx gradient goes into the layer's own sums: core_bwd.c) */
  const size_t kl = m->selects ? dsv4_kl_thread_bytes(m->H, m->D, m->Hi, m->Di, m->sparse_kl ? m->k : m->n_cmp,
                                                      m->n_cmp, 1)
                               : 0;
  return nt * (attn > kl ? attn : kl);
}
