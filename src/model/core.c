/* core.c: the core attention object (core.h): creation on a one-rank communicator, the public
 * one-call forward and backward over the chunked protocol, and what dsv4_cp_patch changes. */
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "util/abi.h"
#include "util/err.h"
#include "util/gemm.h"
#include "util/hash.h"
#include "util/par.h"

/* Hash of every config value the agreement compares (field by field: padding bytes are not data). */
static uint64_t hash_config(const dsv4_config *f, int layer, int ratio) {
  const int ints[] = {f->dim, f->n_heads, f->head_dim, f->rope_dim, f->q_lora_rank, f->o_groups, f->o_lora_rank,
                      f->window, f->index_n_heads, f->index_head_dim, f->index_topk, layer, ratio,
                      (int)f->index_loss_mode};
  const double dbl[] = {f->rope_theta, f->compress_rope_theta, f->rope_factor, f->rope_orig_max_pos,
                        f->beta_fast, f->beta_slow, f->eps, f->index_loss_coeff};
  uint64_t h = dsv4_fnv1a(DSV4_FNV_OFFSET, ints, sizeof ints);
  h = dsv4_fnv1a(h, dbl, sizeof dbl);
  const int v41[] = {f->v41, f->n_kv_sources, f->n_index_sources, f->candidate_source, f->candidate_topk_blocks,
                     f->candidate_block_size};
  h = dsv4_fnv1a(h, v41, sizeof v41);
  h = dsv4_fnv1a(h, f->kv_sources, sizeof(int) * (size_t)(f->n_kv_sources > 0 ? f->n_kv_sources : 0));
  return dsv4_fnv1a(h, f->index_sources, sizeof(int) * (size_t)(f->n_index_sources > 0 ? f->n_index_sources : 0));
}

dsv4_status dsv4_core_create(dsv4_core **out, const dsv4_config *cfg, int layer, const dsv4_weights *w) {
  dsv4_status rc = DSV4_OK;
  dsv4_core *c = NULL;
  DSV4_CHECK(out && cfg && w, DSV4_ERR_ARG, "core: NULL argument");
  *out = NULL;
  DSV4_ALLOC(c, 1);
  DSV4_TRY(dsv4_config_in(&c->cfg, cfg));
  cfg = &c->cfg;
  DSV4_TRY(dsv4_config_validate(cfg));
  DSV4_CHECK(dsv4_config_ratio(cfg, layer) >= 0, DSV4_ERR_ARG, "layer %d out of range (config has %d)", layer,
             cfg->n_layers);
  DSV4_CHECK(dsv4_weights_layer(w) == layer, DSV4_ERR_ARG, "core: weights are for layer %d, not layer %d",
             dsv4_weights_layer(w), layer);
  c->info = (dsv4_layer_info)DSV4_LAYER_INFO_INIT;
  DSV4_TRY(dsv4_config_layer(cfg, layer, &c->info)); /* refuses V4.1's draft stages */
  c->layer = layer;
  c->ratio = dsv4_config_ratio(cfg, layer);
  c->w = w;
  c->impl = DSV4_IMPL_FAST;
  c->off = (dsv4_offload){.peer = -1};
  c->cfg_hash = hash_config(cfg, layer, c->ratio);
  c->group_hash = hash_config(cfg, -1, 0);
  DSV4_TRY(dsv4_comm_create_self(&c->self));
  c->xfer.comm = c->self;
  c->xfer.overlap = 1;
  *out = c;
  return DSV4_OK;
fail:
  dsv4_core_free(c);
  return rc;
}

void dsv4_core_free(dsv4_core *c) {
  if (!c) return;
  dsv4_xfer_free(&c->xfer);
  if (c->have_plan) dsv4_plan_free(&c->plan);
  dsv4_offload_free(&c->off);
  dsv4_arena_free(&c->saved);
  dsv4_arena_free(&c->scratch);
  dsv4_shared_free(c->own_shared);
  dsv4_comm_free(c->self);
  free(c);
}

void dsv4_core_set_impl(dsv4_core *c, dsv4_impl impl) {
  c->impl = impl;
  dsv4_core_forget(c);
}

dsv4_status dsv4_core_set_threads(dsv4_core *c, int threads) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(c, DSV4_ERR_ARG, "core: NULL");
  DSV4_CHECK(threads >= 0, DSV4_ERR_ARG, "threads must be >= 0 (0: the caller's OpenMP default), got %d", threads);
  c->threads = threads;
fail:
  return rc;
}

void dsv4_core_set_recompute(dsv4_core *c, int on) {
  c->recompute = on != 0;
  dsv4_core_forget(c);
}

void dsv4_core_forget(dsv4_core *c) { memset(&c->run, 0, sizeof c->run); }

size_t dsv4_core_saved_bytes(const dsv4_core *c) { return c->run.valid ? c->saved.used : 0; }

static dsv4_status core_forward(dsv4_core *c, const dsv4_core_fwd_args *a) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(a->q && a->o && a->kv && a->pk, DSV4_ERR_ARG, "core forward: q, o, kv and pk are required");
  DSV4_CHECK(a->n >= 0, DSV4_ERR_ARG, "core forward: n < 0");
  DSV4_TRY(dsv4_core_prepare(c, a->pk, a->n, NULL));
  const dsv4_core_begin_args b = {.q = a->q, .kv = a->kv, .x = a->x, .qr = a->qr, .o = a->o,
                                  .topk_ids = a->topk_ids, .train = a->train, .shared = a->shared};
  DSV4_TRY(dsv4_core_fwd_begin(c, &b));
  DSV4_TRY(dsv4_core_fwd_rows(c, 0, a->n, a->q, a->o));
  DSV4_TRY(dsv4_core_fwd_end(c, a->indexer_loss, a->train));
fail:
  return rc;
}

static dsv4_status core_backward(dsv4_core *c, const dsv4_core_bwd_args *a) {
  dsv4_status rc = DSV4_OK;
  int begun = 0;
  const dsv4_core_run *st = &c->run;
  const int64_t HD = (int64_t)c->cfg.n_heads * c->cfg.head_dim;
  DSV4_CHECK(st->valid, DSV4_ERR_STATE, "core backward called without a training forward (train = 1)");
  DSV4_CHECK(a->dq && a->dkv && a->grads && a->d_o, DSV4_ERR_ARG,
             "core backward: dq, dkv, grads and d_o are required");
  DSV4_CHECK(c->ratio == 0 || a->dx, DSV4_ERR_ARG, "core backward: dx is required for a compressed layer");
  DSV4_CHECK(st->q && st->o, DSV4_ERR_STATE,
             "core backward: the forward kept no q and o (recomputation is driven by dsv4_layer_backward)");
  DSV4_TRY(dsv4_core_bwd_begin(c, a->grads, a->d_loss));
  begun = 1;
  for (int64_t k = 0; k < c->plan.n_chunk; k++) {
    const int64_t i0 = c->plan.chunk[k], m = c->plan.chunk[k + 1] - i0;
    DSV4_TRY(dsv4_core_bwd_rows(c, i0, m, st->q + i0 * HD, st->o + i0 * HD, a->d_o + i0 * HD, a->dq + i0 * HD));
  }
  DSV4_TRY(dsv4_core_bwd_end(c, a->dkv, a->dx));
  begun = 0;
  DSV4_TRY(dsv4_core_bwd_finish(c));
fail:
  if (begun) dsv4_core_bwd_abort(c);
  return rc;
}

dsv4_status dsv4_core_forward(dsv4_core *c, const dsv4_core_fwd_args *args) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_fwd_args a;
  dsv4_packing pk;
  DSV4_CHECK(c, DSV4_ERR_ARG, "core forward: NULL core");
  DSV4_TRY(DSV4_STRUCT_IN(&a, args, dsv4_core_fwd_args, NULL));
  DSV4_TRY(DSV4_STRUCT_IN(&pk, a.pk, dsv4_packing, NULL));
  a.pk = &pk;
  const int old = dsv4_threads_enter(c->threads);
  rc = core_forward(c, &a);
  dsv4_panel_scratch_release();
  dsv4_threads_leave(old);
fail:
  return rc;
}

dsv4_status dsv4_core_backward(dsv4_core *c, const dsv4_core_bwd_args *args) {
  static const dsv4_core_bwd_args defaults = DSV4_CORE_BWD_ARGS_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_core_bwd_args a;
  DSV4_CHECK(c, DSV4_ERR_ARG, "core backward: NULL core");
  DSV4_TRY(DSV4_STRUCT_IN(&a, args, dsv4_core_bwd_args, &defaults));
  const int old = dsv4_threads_enter(c->threads);
  rc = core_backward(c, &a);
  dsv4_panel_scratch_release();
  dsv4_threads_leave(old);
fail:
  return rc;
}
