/* plan_traffic.c: what one layer call under CP costs each rank, computed on the host from the
 * layouts and halo plans (plan.c), i.e. from the formulas of docs/cp.md evaluated for the actual
 * packing: bytes and messages per message kind, exactly what the exchange counts, and the memory a
 * rank holds. The benchmark checks measured == planned. */
#include <string.h>

#include "model/weights.h"
#include "plan.h"
#include "util/err.h"

/* Everything planned per rank; layouts of all ranks are built once. */
typedef struct {
  dsv4_docs docs;
  dsv4_layout *lays;
  int size;
} plan_ctx;

static void plan_free(plan_ctx *p) {
  if (p->lays)
    for (int q = 0; q < p->size; q++) dsv4_layout_free(&p->lays[q]);
  free(p->lays);
  dsv4_docs_free(&p->docs);
}

static dsv4_status plan_make(plan_ctx *p, const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                             const dsv4_cp_config *cp, int size) {
  dsv4_status rc = DSV4_OK;
  memset(p, 0, sizeof *p);
  p->size = size;
  const int r = dsv4_config_ratio(cfg, layer);
  DSV4_CHECK(r >= 0, DSV4_ERR_ARG, "plan: layer %d out of range", layer);
  DSV4_TRY(dsv4_docs_build(&p->docs, pk, r));
  DSV4_ALLOC(p->lays, size);
  for (int q = 0; q < size; q++)
    DSV4_TRY(cp_layout(&p->docs, pk, cp ? cp->split : DSV4_SPLIT_CONTIGUOUS, q, size, cfg->window, 0, &p->lays[q]));
fail:
  return rc;
}

/* Adds a plan's rows (row_bytes each) to the forward kind and, mirrored, to the backward kind. */
static void add_plan(dsv4_cp_stats *s, const cp_plan *p, uint64_t row_bytes, dsv4_msg_kind fwd, dsv4_msg_kind bwd) {
  uint64_t out = 0, in = 0;
  for (int i = 0; i < p->n_send; i++) out += (uint64_t)p->send[i].n * row_bytes;
  for (int i = 0; i < p->n_recv; i++) in += (uint64_t)p->recv[i].n * row_bytes;
  s->bytes_sent[fwd] += out, s->bytes_recv[fwd] += in, s->messages[fwd] += (uint64_t)p->n_send;
  s->bytes_sent[bwd] += in, s->bytes_recv[bwd] += out, s->messages[bwd] += (uint64_t)p->n_recv;
}

dsv4_status dsv4_cp_plan_traffic(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                 const dsv4_cp_config *cp, int rank, int size, dsv4_cp_stats *out) {
  dsv4_status rc = DSV4_OK;
  plan_ctx p = {0};
  cp_plan win = {0}, half = {0}, full = {0};
  DSV4_CHECK(cfg && pk && out && size >= 1 && rank >= 0 && rank < size, DSV4_ERR_ARG, "plan: bad arguments");
  memset(out, 0, sizeof *out);
  if (size == 1) return DSV4_OK; /* one rank sends nothing */
  DSV4_TRY(plan_make(&p, cfg, layer, pk, cp, size));
  const int r = p.docs.ratio;
  const uint64_t N1 = (uint64_t)(size - 1), f = sizeof(float), D = (uint64_t)cfg->head_dim;
  const uint64_t Di = (uint64_t)cfg->index_head_dim;
  /* meta check: once in the layer's token map, once in the core forward; an all-reduce of 8
   * int64 values counted as the ring volume 2 (N-1)/N */
  const uint64_t meta = 2 * 64 * N1 / (uint64_t)size;
  out->bytes_sent[DSV4_MSG_META_CHECK] = out->bytes_recv[DSV4_MSG_META_CHECK] = 2 * meta;
  out->messages[DSV4_MSG_META_CHECK] = 2;
  DSV4_TRY(cp_plan_halo(p.lays, size, rank, CP_HALO_WINDOW, &win));
  add_plan(out, &win, D * f, DSV4_MSG_WINDOW_HALO, DSV4_MSG_WINDOW_HALO_BWD);
  if (r > 0) { /* per compressor (dim D, and Di for r == 4): C and Z rows, half or all of c * dim */
    const uint64_t c = r == 4 ? 2 : 1;
    DSV4_TRY(cp_plan_halo(p.lays, size, rank, CP_HALO_CMP_HALF, &half));
    DSV4_TRY(cp_plan_halo(p.lays, size, rank, CP_HALO_CMP_FULL, &full));
    add_plan(out, &half, 2 * (c * D / 2) * f, DSV4_MSG_COMPRESSOR_HALO, DSV4_MSG_COMPRESSOR_HALO_BWD);
    add_plan(out, &full, 2 * c * D * f, DSV4_MSG_COMPRESSOR_HALO, DSV4_MSG_COMPRESSOR_HALO_BWD);
    if (r == 4) {
      add_plan(out, &half, 2 * Di * f, DSV4_MSG_COMPRESSOR_HALO, DSV4_MSG_COMPRESSOR_HALO_BWD);
      add_plan(out, &full, 2 * 2 * Di * f, DSV4_MSG_COMPRESSOR_HALO, DSV4_MSG_COMPRESSOR_HALO_BWD);
    }
  }
  if (r > 0) {
    const uint64_t blk = (uint64_t)p.lays[rank].n_blk, dims = D + (r == 4 ? Di : 0);
    const uint64_t ag = N1 * blk * dims * f;
    out->bytes_sent[DSV4_MSG_SLOT_ALLGATHER] = out->bytes_recv[DSV4_MSG_SLOT_ALLGATHER] = ag;
    out->bytes_sent[DSV4_MSG_SLOT_REDUCE_SCATTER] = out->bytes_recv[DSV4_MSG_SLOT_REDUCE_SCATTER] = ag;
    out->messages[DSV4_MSG_SLOT_ALLGATHER] = out->messages[DSV4_MSG_SLOT_REDUCE_SCATTER] = r == 4 ? 2 : 1;
  }
  if (r == 4) { /* one (exact sum, count) record per rank, all-gathered */
    out->bytes_sent[DSV4_MSG_LOSS_REDUCE] = out->bytes_recv[DSV4_MSG_LOSS_REDUCE] = N1 * sizeof(cp_loss_rec);
    out->messages[DSV4_MSG_LOSS_REDUCE] = 1;
  }
fail:
  cp_plan_free(&win);
  cp_plan_free(&half);
  cp_plan_free(&full);
  plan_free(&p);
  return rc;
}

dsv4_status dsv4_cp_plan_memory(const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_cp_config *cp,
                                int rank, int size, size_t *weights_bytes, size_t *saved_bytes) {
  dsv4_status rc = DSV4_OK;
  plan_ctx p = {0};
  DSV4_CHECK(cfg && pk && weights_bytes && saved_bytes && size >= 1 && rank >= 0 && rank < size, DSV4_ERR_ARG,
             "plan: bad arguments");
  DSV4_TRY(plan_make(&p, cfg, layer, pk, cp, size));
  int64_t nw = 0;
  DSV4_TRY(dsv4_weights_numel(cfg, layer, &nw));
  *weights_bytes = sizeof(float) * (size_t)nw;
  const dsv4_layout *l = &p.lays[rank];
  const int r = p.docs.ratio;
  *saved_bytes = dsv4_saved_bytes_formula(cfg, r, l->n, l->R_kv, size > 1, r > 0 ? l->R_c : 0, l->n_own,
                                          p.docs.n_cmp);
fail:
  plan_free(&p);
  return rc;
}
