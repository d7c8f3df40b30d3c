/* patch.c: dsv4_cp_patch and what it installs: the CP token map, forward and backward of a core
 * (the two-stage algorithm of model/core_*.c over the CP exchange), the agreement check that runs
 * before any data moves, the gradient all-reduce and the message counters. */
#include <string.h>

#include "cp_state.h"
#include "model/weights.h"
#include "shard.h"
#include "util/err.h"

/* ---- agreement: one small collective before anything else ------------------------------------ */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Hash of every config value (field by field: struct padding bytes are not data). */
static uint64_t hash_config(const dsv4_core *c) {
  const dsv4_config *f = &c->cfg;
  const int ints[] = {f->dim, f->n_heads, f->head_dim, f->rope_dim, f->q_lora_rank, f->o_groups,
                      f->o_lora_rank, f->window, f->index_n_heads, f->index_head_dim, f->index_topk,
                      c->layer, c->ratio, (int)f->index_loss_mode};
  const double dbl[] = {f->rope_theta, f->compress_rope_theta, f->rope_factor, f->rope_orig_max_pos,
                        f->beta_fast, f->beta_slow, f->eps, f->index_loss_coeff};
  uint64_t h = fnv(1469598103934665603ull, ints, sizeof ints);
  return fnv(h, dbl, sizeof dbl);
}

/* Hash of the packing meta as given (bounded reads: a nonsense n_docs is hashed as a number and
 * rejected later by validation, identically on every rank). */
static uint64_t hash_packing(const dsv4_packing *pk) {
  const int64_t head[] = {pk->T, pk->cu_seqlens ? pk->n_docs : -1, pk->batched, pk->seqlens_real != NULL};
  uint64_t h = fnv(1469598103934665603ull, head, sizeof head);
  if (pk->cu_seqlens && pk->n_docs >= 1 && pk->n_docs <= pk->T) {
    h = fnv(h, pk->cu_seqlens, sizeof(int32_t) * (size_t)(pk->n_docs + 1));
    if (pk->seqlens_real) h = fnv(h, pk->seqlens_real, sizeof(int32_t) * (size_t)pk->n_docs);
  }
  return h;
}

dsv4_status cp_agree(void *s, const dsv4_core *c, const dsv4_packing *pk, int64_t n_local) {
  dsv4_status rc = DSV4_OK;
  cp_state *st = s;
  DSV4_CHECK(pk, DSV4_ERR_ARG, "packing meta is NULL");
  /* as (max of v, max of -v) pairs: one MAX all-reduce gives every value's max and min */
  const int64_t v[4] = {(int64_t)(hash_config(c) >> 1), (int64_t)(hash_packing(pk) >> 1), n_local,
                        (int64_t)st->cfg.split};
  int64_t mm[8];
  for (int i = 0; i < 4; i++) {
    mm[2 * i] = v[i];
    mm[2 * i + 1] = -v[i];
  }
  const double t0 = cp_now();
  DSV4_TRY(dsv4_comm_allreduce(st->comm, mm, 8, DSV4_RED_I64, DSV4_RED_MAX));
  const uint64_t vol = 2 * sizeof mm * (uint64_t)(st->comm->size - 1) / (uint64_t)st->comm->size;
  cp_account(&st->stats, DSV4_MSG_META_CHECK, vol, vol, 1, cp_now() - t0);
  DSV4_CHECK(mm[0] == -mm[1], DSV4_ERR_COMM, "CP ranks disagree on the configuration or the layer");
  DSV4_CHECK(mm[2] == -mm[3], DSV4_ERR_COMM,
             "CP ranks disagree on the packing meta (T, cu_seqlens, seqlens_real or batching)");
  DSV4_CHECK(mm[4] == -mm[5], DSV4_ERR_COMM,
             "CP ranks hold different numbers of local rows (between %lld and %lld; every rank must hold T/N)",
             (long long)-mm[5], (long long)mm[4]);
  DSV4_CHECK(mm[6] == -mm[7], DSV4_ERR_COMM, "CP ranks disagree on the split (contiguous / zigzag)");
fail:
  return rc;
}

/* ---- layout and plans of the current forward -------------------------------------------------- */

/* Key of everything a layout depends on: the validated packing, the ratio, W, the local rows. */
static uint64_t layout_key(const dsv4_docs *d, int64_t n_local, int W, dsv4_split split) {
  const int64_t head[] = {d->T, d->n_docs, d->ratio, d->batched, n_local, W, (int64_t)split};
  uint64_t h = fnv(1469598103934665603ull, head, sizeof head);
  h = fnv(h, d->cu, sizeof(int64_t) * (size_t)(d->n_docs + 1));
  return fnv(h, d->real, sizeof(int64_t) * (size_t)d->n_docs);
}

/* This rank's layout (every rank's is computed, for the plans); with_plans also builds the halo
 * plans that the exchange of the coming forward and backward uses. Both are cached per shape (the
 * gather index and plans are the same every training step). */
static dsv4_status build_layout(cp_state *st, const dsv4_docs *docs, int64_t n_local, int W,
                                dsv4_layout *lay, int with_plans) {
  dsv4_status rc = DSV4_OK;
  const uint64_t key = layout_key(docs, n_local, W, st->cfg.split);
  if (st->cache_valid && st->cache_key == key && (st->cache_plans || !with_plans))
    return dsv4_layout_copy(lay, &st->cache, st->cache_n_cmp);
  const int N = st->comm->size, me = st->comm->rank;
  dsv4_layout *lays = NULL;
  dsv4_packing pk = {.n_docs = docs->n_docs, .T = docs->T, .batched = docs->batched};
  int32_t *cu = NULL;
  if (with_plans) {
    cp_plan_free(&st->win);
    cp_plan_free(&st->cmp_half);
    cp_plan_free(&st->cmp_full);
  }
  /* the shard rule reads cu_seqlens for batched input */
  DSV4_ALLOC(cu, docs->n_docs + 1);
  for (int i = 0; i <= docs->n_docs; i++) cu[i] = (int32_t)docs->cu[i];
  pk.cu_seqlens = cu;
  DSV4_ALLOC(lays, N);
  for (int q = 0; q < N; q++) DSV4_TRY(cp_layout(docs, &pk, st->cfg.split, q, N, W, q == me, &lays[q]));
  DSV4_CHECK(lays[me].n == n_local, DSV4_ERR_ARG,
             "x has %lld local rows but rank %d of %d holds %lld rows (T = %lld)", (long long)n_local, me,
             N, (long long)lays[me].n, (long long)docs->T);
  if (with_plans) {
    DSV4_TRY(cp_plan_halo(lays, N, me, CP_HALO_WINDOW, &st->win));
    if (docs->ratio > 0) {
      DSV4_TRY(cp_plan_halo(lays, N, me, CP_HALO_CMP_HALF, &st->cmp_half));
      DSV4_TRY(cp_plan_halo(lays, N, me, CP_HALO_CMP_FULL, &st->cmp_full));
    }
  }
  *lay = lays[me];
  memset(&lays[me], 0, sizeof lays[me]);
  dsv4_layout_free(&st->cache);
  st->cache_valid = 0;
  DSV4_TRY(dsv4_layout_copy(&st->cache, lay, docs->n_cmp));
  st->cache_key = key;
  st->cache_n_cmp = docs->n_cmp;
  st->cache_plans = with_plans;
  st->cache_valid = 1;
fail:
  if (lays)
    for (int q = 0; q < N; q++) dsv4_layout_free(&lays[q]);
  free(lays);
  free(cu);
  return rc;
}

dsv4_status cp_make_layout(void *s, const dsv4_docs *docs, int64_t n_local, int W, dsv4_layout *lay) {
  return build_layout(s, docs, n_local, W, lay, 1);
}

/* ---- the installed functions ------------------------------------------------------------------ */

static dsv4_status cp_token_map(dsv4_core *c, const dsv4_packing *pk, int64_t n, dsv4_token_map *map) {
  dsv4_status rc = DSV4_OK;
  cp_state *st = dsv4_core_impl_state(c);
  dsv4_docs docs = {0};
  dsv4_layout lay = {0};
  DSV4_TRY(cp_agree(st, c, pk, n));
  DSV4_TRY(dsv4_docs_build(&docs, pk, c->ratio));
  DSV4_TRY(build_layout(st, &docs, n, c->cfg.window, &lay, 0));
  DSV4_TRY(dsv4_core_fill_tokmap(c, &docs, &lay, map));
fail:
  dsv4_layout_free(&lay);
  dsv4_docs_free(&docs);
  return rc;
}

static dsv4_status cp_forward(dsv4_core *c, const dsv4_core_fwd_args *a) {
  dsv4_exchange x;
  return dsv4_core_run_forward(c, a, cp_exchange(dsv4_core_impl_state(c), &x));
}

static dsv4_status cp_backward(dsv4_core *c, const dsv4_core_bwd_args *a) {
  dsv4_exchange x;
  return dsv4_core_run_backward(c, a, cp_exchange(dsv4_core_impl_state(c), &x));
}

static void cp_state_free(void *p) {
  cp_state *st = p;
  if (!st) return;
  dsv4_comm_wait(st->comm, st->gather_req, 2);
  cp_plan_free(&st->win);
  cp_plan_free(&st->cmp_half);
  cp_plan_free(&st->cmp_full);
  dsv4_layout_free(&st->cache);
  free(st->sendbuf);
  free(st->recvbuf);
  free(st);
}

static int is_patched(const dsv4_core *c) { return dsv4_core_get_ops(c).forward == cp_forward; }

dsv4_status dsv4_cp_patch(dsv4_core *core, dsv4_comm *comm, const dsv4_cp_config *cfg) {
  dsv4_status rc = DSV4_OK;
  cp_state *st = NULL;
  DSV4_CHECK(core && comm, DSV4_ERR_ARG, "cp_patch: core and comm are required");
  const dsv4_cp_config def = {DSV4_SPLIT_CONTIGUOUS, 1};
  const dsv4_cp_config *cf = cfg ? cfg : &def;
  DSV4_CHECK(cf->split == DSV4_SPLIT_CONTIGUOUS || cf->split == DSV4_SPLIT_ZIGZAG, DSV4_ERR_ARG,
             "cp_patch: unknown split %d", (int)cf->split);
  DSV4_ALLOC(st, 1);
  st->comm = comm;
  st->cfg = *cf;
  const dsv4_core_ops ops = {cp_token_map, cp_forward, cp_backward};
  dsv4_core_set_ops(core, &ops, st, cp_state_free);
fail:
  return rc;
}

dsv4_status dsv4_cp_allreduce_grads(dsv4_comm *comm, dsv4_weights *grads) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(comm && grads, DSV4_ERR_ARG, "cp_allreduce_grads: comm and grads are required");
  int64_t n = 0;
  float *block = dsv4_weights_block(grads, &n);
  DSV4_TRY(dsv4_comm_allreduce(comm, block, (size_t)n, DSV4_RED_F32, DSV4_RED_SUM));
fail:
  return rc;
}

dsv4_status dsv4_cp_get_stats(const dsv4_core *core, dsv4_cp_stats *st) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(core && st, DSV4_ERR_ARG, "cp_get_stats: NULL argument");
  DSV4_CHECK(is_patched(core), DSV4_ERR_STATE, "cp_get_stats: the core is not patched for CP");
  *st = ((const cp_state *)dsv4_core_impl_state(core))->stats;
fail:
  return rc;
}

void dsv4_cp_stats_reset(dsv4_core *core) {
  if (core && is_patched(core)) memset(&((cp_state *)dsv4_core_impl_state(core))->stats, 0, sizeof(dsv4_cp_stats));
}

const char *dsv4_msg_kind_name(dsv4_msg_kind k) {
  static const char *const names[DSV4_MSG_KINDS] = {
      "window_halo", "compressor_halo", "slot_allgather", "loss_reduce", "meta_check",
      "window_halo_bwd", "compressor_halo_bwd", "slot_reduce_scatter"};
  return k >= 0 && k < DSV4_MSG_KINDS ? names[k] : "unknown";
}
