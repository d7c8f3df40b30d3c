/* traffic.c: what one layer forward + backward under CP costs each rank in messages, computed on
 * the host from every rank's layout and the halo arithmetic (plan/halo.c), i.e. the formulas of
 * docs/cp.md evaluated for the actual packing: bytes and messages per message kind, exactly what
 * the exchange (cp/exchange.c) counts; the weight gradients' messages as model/wgrad_plan.c counts
 * them. The benchmark and the CP sweep test check measured == planned. */
#include <string.h>

#include "cp/exchange.h"
#include "model/wgrad.h"
#include "offload.h"
#include "plan.h"
#include "util/abi.h"
#include "util/err.h"

/* Everything planned; the layouts of all ranks are built once. */
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
  DSV4_TRY(dsv4_layouts_all(&p->docs, pk, cp ? cp->split : DSV4_SPLIT_CONTIGUOUS, size, cfg->window, &p->lays));
fail:
  return rc;
}

/* One halo kind's rows (row_bytes each) into the forward kind and, mirrored, the backward kind. */
/* row_bytes forward, bwd_bytes backward per row (the window halo's backward carries exact sums) */
static dsv4_status add_halo(const plan_ctx *p, dsv4_halo_kind kind, uint64_t row_bytes, uint64_t bwd_bytes, int copies,
                            dsv4_msg_kind fwd, dsv4_msg_kind bwd, dsv4_cp_stats *out) {
  dsv4_status rc = DSV4_OK;
  const int N = p->size;
  uint64_t *v = NULL;
  DSV4_ALLOC(v, 4 * (size_t)N);
  uint64_t *sent = v, *recv = v + N, *ms = v + 2 * N, *mr = v + 3 * N;
  DSV4_TRY(dsv4_halo_counts(p->lays, N, kind, sent, recv, ms, mr));
  for (int q = 0; q < N; q++) {
    dsv4_cp_stats *s = &out[q];
    s->bytes_sent[fwd] += (uint64_t)copies * sent[q] * row_bytes, s->bytes_recv[fwd] += (uint64_t)copies * recv[q] * row_bytes;
    s->bytes_sent[bwd] += (uint64_t)copies * recv[q] * bwd_bytes, s->bytes_recv[bwd] += (uint64_t)copies * sent[q] * bwd_bytes;
    s->messages[fwd] += (uint64_t)copies * ms[q], s->messages[bwd] += (uint64_t)copies * mr[q];
  }
fail:
  free(v);
  return rc;
}

static dsv4_status traffic_all(const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_cp_config *cp,
                               int recompute, int size, dsv4_cp_stats *out) {
  dsv4_status rc = DSV4_OK;
  plan_ctx p = {0};
  dsv4_offload *off = NULL;
  DSV4_CHECK(cfg && pk && out && size >= 1, DSV4_ERR_ARG, "plan: bad arguments");
  memset(out, 0, sizeof(dsv4_cp_stats) * (size_t)size);
  if (size == 1) return DSV4_OK; /* one rank sends nothing */
  DSV4_TRY(plan_make(&p, cfg, layer, pk, cp, size));
  const int r = p.docs.ratio;
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  DSV4_TRY(dsv4_config_layer(cfg, layer, &in));
  /* V4.1: only a kv source runs Stage 1 (its group's other layers read it: no message of theirs);
   * its compressor has c = 1, a gate (Z) only for r = 2, and it gathers the indexer keys too */
  const int compresses = cfg->v41 ? in.role == DSV4_ROLE_FULL : r > 0, keys = r == 4 || (cfg->v41 && compresses);
  const uint64_t N1 = (uint64_t)(size - 1), f = sizeof(float), D = (uint64_t)cfg->head_dim;
  const uint64_t Di = (uint64_t)cfg->index_head_dim, c = r == 4 ? 2 : 1, zc = cfg->v41 && r == 1 ? 1 : 2;
  /* the window rows' gradients travel as exact sums (util/xacc.h: two int64 per element) */
  DSV4_TRY(add_halo(&p, DSV4_HALO_WINDOW, D * f, 2 * D * sizeof(int64_t), 1, DSV4_MSG_WINDOW_HALO,
                    DSV4_MSG_WINDOW_HALO_BWD, out));
  if (compresses) { /* per compressor (dim D, and Di for r == 4): C and Z rows, half or all of c * dim */
    DSV4_TRY(add_halo(&p, DSV4_HALO_CMP_HALF, zc * (c * D / 2) * f, zc * (c * D / 2) * f, 1, DSV4_MSG_COMPRESSOR_HALO,
                      DSV4_MSG_COMPRESSOR_HALO_BWD, out));
    DSV4_TRY(add_halo(&p, DSV4_HALO_CMP_FULL, zc * c * D * f, zc * c * D * f, 1, DSV4_MSG_COMPRESSOR_HALO,
                      DSV4_MSG_COMPRESSOR_HALO_BWD, out));
    if (r == 4) {
      DSV4_TRY(add_halo(&p, DSV4_HALO_CMP_HALF, 2 * Di * f, 2 * Di * f, 1, DSV4_MSG_COMPRESSOR_HALO,
                        DSV4_MSG_COMPRESSOR_HALO_BWD, out));
      DSV4_TRY(add_halo(&p, DSV4_HALO_CMP_FULL, 2 * 2 * Di * f, 2 * 2 * Di * f, 1, DSV4_MSG_COMPRESSOR_HALO,
                        DSV4_MSG_COMPRESSOR_HALO_BWD, out));
    }
  }
  /* the agreement check, once per forward: an all-reduce of DSV4_AGREE_VALUES int64 values counted
   * as the ring volume 2 (N-1)/N */
  const uint64_t meta = 2 * DSV4_AGREE_VALUES * sizeof(int64_t) * N1 / (uint64_t)size;
  for (int q = 0; q < size; q++) {
    dsv4_cp_stats *s = &out[q];
    s->bytes_sent[DSV4_MSG_META_CHECK] = s->bytes_recv[DSV4_MSG_META_CHECK] = meta;
    s->messages[DSV4_MSG_META_CHECK] = 1;
    if (compresses) { /* all-gather of the slot buffers; the backward's reduce-scatter mirrors it */
      const uint64_t blk = (uint64_t)p.lays[q].n_blk, dims = D + (keys ? Di : 0);
      const uint64_t ag = N1 * blk * dims * f;
      s->bytes_sent[DSV4_MSG_SLOT_ALLGATHER] = s->bytes_recv[DSV4_MSG_SLOT_ALLGATHER] = ag;
      /* the kv rows' and the keys' gradients as exact sums (two int64 per element) */
      const uint64_t rs = N1 * blk * (D + (keys ? Di : 0)) * 2 * sizeof(int64_t);
      s->bytes_sent[DSV4_MSG_SLOT_REDUCE_SCATTER] = s->bytes_recv[DSV4_MSG_SLOT_REDUCE_SCATTER] = rs;
      s->messages[DSV4_MSG_SLOT_ALLGATHER] = s->messages[DSV4_MSG_SLOT_REDUCE_SCATTER] = keys ? 2 : 1;
    }
    if (in.selects) { /* one (exact sum, count) record per rank, all-gathered */
      s->bytes_sent[DSV4_MSG_LOSS_REDUCE] = s->bytes_recv[DSV4_MSG_LOSS_REDUCE] = N1 * sizeof(dsv4_loss_rec);
      s->messages[DSV4_MSG_LOSS_REDUCE] = 1;
    }
  }
  /* the backward's weight gradients, summed over the ranks */
  int64_t partial = 0, partial_max = 0; /* the rows the recomputed backward's sinks keep (plan.h) */
  const dsv4_split split = cp ? cp->split : DSV4_SPLIT_CONTIGUOUS;
  if (recompute) DSV4_TRY(dsv4_partial_rows_all(pk, split, size, 0, &partial, &partial_max));
  DSV4_TRY(dsv4_wgrad_traffic(cfg, &in, &p.docs, p.lays, size, recompute, partial_max, out));
  /* attention rows moved between ranks (the fast path's) */
  DSV4_ALLOC(off, size);
  dsv4_token_cost tc;
  DSV4_TRY(dsv4_token_cost_of(cfg, layer, &tc));
  DSV4_TRY(dsv4_offload_plan(&tc, &p.docs, pk, cp ? cp->split : DSV4_SPLIT_CONTIGUOUS, size, off));
  const int teacher = in.selects && cfg->index_loss_mode == DSV4_KL_SPARSE;
  for (int q = 0; q < size; q++) dsv4_offload_traffic(&off[q], cfg->n_heads, cfg->head_dim, cfg->index_topk, teacher, &out[q]);
fail:
  dsv4_offload_free_all(off, size);
  plan_free(&p);
  return rc;
}

/* The caller's structs as full library structs (util/abi.h); out: the caller's array, whose stride is
 * its first element's struct_size. */
dsv4_status dsv4_cp_plan_traffic_all_opts(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                          const dsv4_cp_config *cp, const dsv4_plan_opts *opts, int size,
                                          dsv4_cp_stats *out) {
  static const dsv4_cp_config cp_defaults = DSV4_CP_CONFIG_INIT;
  static const dsv4_plan_opts opt_defaults = DSV4_PLAN_OPTS_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_config c;
  dsv4_packing p;
  dsv4_cp_config k = cp_defaults;
  dsv4_plan_opts o = opt_defaults;
  dsv4_cp_stats *all = NULL;
  DSV4_CHECK(cfg && pk && out && size >= 1, DSV4_ERR_ARG, "plan: bad arguments");
  DSV4_TRY(dsv4_config_in(&c, cfg));
  DSV4_TRY(DSV4_STRUCT_IN(&p, pk, dsv4_packing, NULL));
  if (cp) DSV4_TRY(DSV4_STRUCT_IN(&k, cp, dsv4_cp_config, &cp_defaults));
  if (opts) DSV4_TRY(DSV4_STRUCT_IN(&o, opts, dsv4_plan_opts, &opt_defaults));
  DSV4_TRY(DSV4_STRUCT_CHECK(out, dsv4_cp_stats));
  const size_t stride = out->struct_size;
  DSV4_ALLOC(all, size);
  DSV4_TRY(traffic_all(&c, layer, &p, &k, o.recompute != 0, size, all));
  for (int q = 0; q < size; q++) {
    dsv4_cp_stats *dst = (dsv4_cp_stats *)((char *)out + stride * (size_t)q);
    dst->struct_size = (uint32_t)stride;
    dst->struct_version = DSV4_STRUCT_VERSION;
    DSV4_TRY(dsv4_cp_stats_out(dst, &all[q]));
  }
fail:
  free(all);
  return rc;
}

dsv4_status dsv4_cp_plan_traffic_all(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                     const dsv4_cp_config *cp, int size, dsv4_cp_stats *out) {
  return dsv4_cp_plan_traffic_all_opts(cfg, layer, pk, cp, NULL, size, out);
}

dsv4_status dsv4_cp_plan_traffic_opts(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                      const dsv4_cp_config *cp, const dsv4_plan_opts *opts, int rank, int size,
                                      dsv4_cp_stats *out) {
  dsv4_status rc = DSV4_OK;
  dsv4_cp_stats *all = NULL;
  DSV4_CHECK(cfg && pk && out && size >= 1 && rank >= 0 && rank < size, DSV4_ERR_ARG, "plan: bad arguments");
  DSV4_TRY(DSV4_STRUCT_CHECK(out, dsv4_cp_stats));
  DSV4_ALLOC(all, size);
  for (int q = 0; q < size; q++) all[q] = (dsv4_cp_stats)DSV4_CP_STATS_INIT;
  DSV4_TRY(dsv4_cp_plan_traffic_all_opts(cfg, layer, pk, cp, opts, size, all));
  DSV4_TRY(dsv4_cp_stats_out(out, &all[rank]));
fail:
  free(all);
  return rc;
}

dsv4_status dsv4_cp_plan_traffic(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                 const dsv4_cp_config *cp, int rank, int size, dsv4_cp_stats *out) {
  return dsv4_cp_plan_traffic_opts(cfg, layer, pk, cp, NULL, rank, size, out);
}
