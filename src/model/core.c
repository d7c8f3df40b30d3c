/* core.c: the core attention object: creation, the swappable function pointers, and the one-rank
 * exchange (no halos, the all-gather is a copy) that the unpatched core runs the two-stage
 * algorithm with. */
#include <string.h>

#include "core_internal.h"
#include "model/weights.h"
#include "util/err.h"
#include "util/gemm.h"

/* Forgets the saved state of the last training forward (buffers stay in the core's slots). */
void dsv4_core_saved_free(dsv4_core_saved *sv) {
  dsv4_docs_free(&sv->docs);
  dsv4_layout_free(&sv->lay);
  memset(sv, 0, sizeof *sv);
}

/* ---- one-rank exchange -------------------------------------------------------------------- */

/* One segment covering the whole stream, no halos; it owns every slot, in global id order, so the
 * gather index is the identity. */
static dsv4_status local_layout(void *st, const dsv4_docs *docs, int64_t n, int W, dsv4_layout *lay) {
  dsv4_status rc = DSV4_OK;
  (void)st;
  memset(lay, 0, sizeof *lay);
  DSV4_CHECK(n == docs->T, DSV4_ERR_ARG,
             "x has %lld rows but the packed meta describes %lld tokens (one rank)", (long long)n,
             (long long)docs->T);
  const dsv4_range all = {0, n};
  DSV4_TRY(dsv4_layout_build(lay, docs, &all, 1, W, 0));
  if (docs->ratio > 0) {
    DSV4_ALLOC(lay->gather, docs->n_cmp + 1);
    dsv4_layout_set_gather(lay, 0, lay->gather);
  }
  return DSV4_OK;
fail:
  dsv4_layout_free(lay);
  return rc;
}

static dsv4_status local_cmp_halo(void *st, const dsv4_layout *lay, float *C, float *Z, int cD, int w) {
  (void)st, (void)lay, (void)C, (void)Z, (void)cD, (void)w;
  return DSV4_OK;
}

static dsv4_status local_gather_start(void *st, const dsv4_layout *lay, const float *local, float *all,
                                      int D, int which) {
  (void)st, (void)which;
  memcpy(all, local, sizeof(float) * (size_t)(lay->n_blk * D));
  return DSV4_OK;
}

static dsv4_status local_gather_wait(void *st, int which) {
  (void)st, (void)which;
  return DSV4_OK;
}

static void local_drain(void *st) { (void)st; }

static dsv4_status local_agree(void *st, const dsv4_core *c, const dsv4_packing *pk, int64_t n) {
  (void)st, (void)c, (void)pk, (void)n;
  return DSV4_OK;
}

static dsv4_status local_win_halo(void *st, const dsv4_layout *lay, float *kv_ext, int D) {
  (void)st, (void)lay, (void)kv_ext, (void)D;
  return DSV4_OK;
}

static dsv4_status local_reduce_loss(void *st, dsv4_exactsum *sum, int64_t *count) {
  (void)st, (void)sum, (void)count;
  return DSV4_OK;
}

static dsv4_status local_blocks_rs(void *st, const dsv4_layout *lay, const float *d_all, float *d_local,
                                   int D, int which) {
  (void)st, (void)which;
  memcpy(d_local, d_all, sizeof(float) * (size_t)(lay->n_blk * D));
  return DSV4_OK;
}

static const dsv4_exchange LOCAL_EXCHANGE = {
    .st = NULL,
    .nranks = 1,
    .agree = local_agree,
    .layout = local_layout,
    .cmp_halo = local_cmp_halo,
    .gather_start = local_gather_start,
    .gather_wait = local_gather_wait,
    .drain = local_drain,
    .win_halo = local_win_halo,
    .reduce_loss = local_reduce_loss,
    .win_halo_bwd = local_win_halo,
    .blocks_reduce_scatter = local_blocks_rs,
    .cmp_halo_bwd = local_cmp_halo,
};

static dsv4_status local_token_map(dsv4_core *c, const dsv4_packing *pk, int64_t n, dsv4_token_map *map) {
  dsv4_status rc = DSV4_OK;
  dsv4_docs docs = {0};
  dsv4_layout lay = {0};
  DSV4_TRY(dsv4_docs_build(&docs, pk, c->ratio));
  DSV4_TRY(local_layout(NULL, &docs, n, c->cfg.window, &lay));
  DSV4_TRY(dsv4_core_fill_tokmap(c, &docs, &lay, map));
fail:
  dsv4_layout_free(&lay);
  dsv4_docs_free(&docs);
  return rc;
}

static dsv4_status local_forward(dsv4_core *c, const dsv4_core_fwd_args *a) {
  return dsv4_core_run_forward(c, a, &LOCAL_EXCHANGE);
}

static dsv4_status local_backward(dsv4_core *c, const dsv4_core_bwd_args *a) {
  return dsv4_core_run_backward(c, a, &LOCAL_EXCHANGE);
}

/* ---- the object ------------------------------------------------------------------------------ */

dsv4_status dsv4_core_fill_tokmap(dsv4_core *c, const dsv4_docs *docs, const dsv4_layout *lay,
                                  dsv4_token_map *map) {
  dsv4_status rc = DSV4_OK;
  int64_t *glob = NULL;
  DSV4_ALLOC(glob, lay->n + 1);
  for (int s = 0; s < lay->n_seg; s++)
    for (int64_t i = 0; i < lay->seg[s].len; i++) glob[lay->seg[s].lo + i] = lay->seg[s].g0 + i;
  DSV4_TRY(dsv4_tokmap_fill(&c->tok, docs, glob, lay->n));
  if (map) *map = c->tok.map;
fail:
  free(glob);
  return rc;
}

dsv4_status dsv4_core_create(dsv4_core **out, const dsv4_config *cfg, int layer, const dsv4_weights *w) {
  dsv4_status rc = DSV4_OK;
  dsv4_core *c = NULL;
  DSV4_CHECK(out && cfg && w, DSV4_ERR_ARG, "core: NULL argument");
  *out = NULL;
  DSV4_TRY(dsv4_config_validate(cfg));
  DSV4_CHECK(dsv4_config_ratio(cfg, layer) >= 0, DSV4_ERR_ARG, "layer %d out of range (config has %d)",
             layer, cfg->n_layers);
  DSV4_CHECK(dsv4_weights_layer(w) == layer, DSV4_ERR_ARG,
             "core: weights are for layer %d, not layer %d", dsv4_weights_layer(w), layer);
  DSV4_ALLOC(c, 1);
  c->cfg = *cfg;
  c->layer = layer;
  c->ratio = dsv4_config_ratio(cfg, layer);
  c->w = w;
  c->impl = DSV4_IMPL_FAST;
  c->ops = (dsv4_core_ops){local_token_map, local_forward, local_backward};
  DSV4_TRY(dsv4_rope_init(&c->rope, cfg, c->ratio));
  *out = c;
  return DSV4_OK;
fail:
  dsv4_core_free(c);
  return rc;
}

void dsv4_core_free(dsv4_core *c) {
  if (!c) return;
  if (c->free_state) c->free_state(c->impl_state);
  dsv4_core_saved_free(&c->sv);
  for (int i = 0; i < CS_COUNT; i++) dsv4_slot_free(&c->slot[i]);
  dsv4_tokmap_free(&c->tok);
  dsv4_rope_free(&c->rope);
  free(c);
}

void dsv4_core_set_impl(dsv4_core *c, dsv4_impl impl) { c->impl = impl; }

dsv4_status dsv4_core_token_map(dsv4_core *c, const dsv4_packing *pk, int64_t n, dsv4_token_map *map) {
  return c->ops.token_map(c, pk, n, map);
}

dsv4_status dsv4_core_forward(dsv4_core *c, const dsv4_core_fwd_args *a) { return c->ops.forward(c, a); }

dsv4_status dsv4_core_backward(dsv4_core *c, const dsv4_core_bwd_args *a) { return c->ops.backward(c, a); }

dsv4_core_ops dsv4_core_get_ops(const dsv4_core *c) { return c->ops; }

void dsv4_core_set_ops(dsv4_core *c, const dsv4_core_ops *ops, void *impl_state, void (*free_state)(void *)) {
  if (c->free_state) c->free_state(c->impl_state);
  c->ops = *ops;
  c->impl_state = impl_state;
  c->free_state = free_state;
}

void *dsv4_core_impl_state(const dsv4_core *c) { return c->impl_state; }
