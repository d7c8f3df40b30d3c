/* flops.c: the FLOP count of one layer call, counting only the work the algorithm must do
 * (docs/perf.md): multiply-adds count 2, padding tokens nothing, recomputation nothing (the
 * teacher logits of the KL loss are the attention's compressed logits, its student scores the
 * indexer's; the backward's recomputed scores are not counted). Per real token at document-local
 * position t, with nw = min(t, W-1) + 1 window keys, nv = (t+1)//r visible slots and nc compressed
 * keys (r = 128: nv; r = 4: min(index_topk, nv)):
 *   forward   projections  2 (d dq + dq H D + d D + H D Ro + G Ro d)
 *             compressors  2 * 2 d c D                                  (r > 0; c = 2 for r = 4)
 *             indexer      2 (dq Hi Di + d Hi + 2 d 2 Di) + 2 Hi Di nv  (r = 4)
 *             attention    4 H D (nw + nc)
 *   backward  projections and compressors x 2 (input and weight gradients); indexer projections
 *             x 1 (its inputs are detached: weight gradients only) + KL 4 Hi Di nc; attention
 *             8 H D (nw + nc) (dP, dQ, dK and dV products).
 * V4.1 (docs/spec.md section 10): the compressor (2 d D, and 2 d D more for the r = 2 gate) and
 * the indexer keys (2 D Di per compressed entry, weight gradient only in the backward) belong to
 * the kv source; indexer projections 2 (dq Hi Di + d Hi) and scoring to index sources; every
 * compressed layer attends to nc = min(index_topk, nv) entries.
 * Per rank (dsv4_cp_plan_flops): a token's terms go to the rank that holds it, a compressed entry's
 * key projection to the rank that holds its last token, so the ranks' counts add up to the layer's. */
#include <stdlib.h>

#include "model/flops.h"
#include "plan/shard.h"
#include "util/abi.h"
#include "util/err.h"

/* The real tokens of document [a, b) that the sorted segments hold (segs == NULL: all of them), as
 * runs [lo, hi) in increasing order, one per call: *cur is the first segment that may still hold
 * one, *g the next token to look at. 0 when there are no more. Walking the runs instead of asking
 * every global token keeps a rank's count proportional to its own rows (dsv4cp plan asks for every
 * rank: 1024 ranks at 4M tokens took 8 s). */
static int next_run(const dsv4_range *segs, int n_seg, int *cur, int64_t *g, int64_t b, int64_t *lo,
                    int64_t *hi) {
  if (*g >= b) return 0;
  if (!segs) {
    *lo = *g, *hi = b, *g = b;
    return 1;
  }
  while (*cur < n_seg && segs[*cur].g0 + segs[*cur].len <= *g) ++*cur;
  if (*cur == n_seg || segs[*cur].g0 >= b) return 0;
  const int64_t end = segs[*cur].g0 + segs[*cur].len;
  *lo = segs[*cur].g0 > *g ? segs[*cur].g0 : *g, *hi = end < b ? end : b, *g = *hi;
  return 1;
}

dsv4_status dsv4_token_cost_of(const dsv4_config *cfg, int layer, dsv4_token_cost *c) {
  dsv4_status rc = DSV4_OK;
  const int r = dsv4_config_ratio(cfg, layer);
  DSV4_CHECK(r >= 0, DSV4_ERR_ARG, "flops: layer %d out of range", layer);
  const double d = cfg->dim, dq = cfg->q_lora_rank, H = cfg->n_heads, D = cfg->head_dim;
  const double G = cfg->o_groups, Ro = cfg->o_lora_rank, Hi = cfg->index_n_heads, Di = cfg->index_head_dim;
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  DSV4_TRY(dsv4_config_layer(cfg, layer, &in));
  const int v41 = cfg->v41 != 0;
  const double cc = r == 4 ? 2 : 1;
  const double proj = 2 * (d * dq + dq * H * D + d * D + H * D * Ro + G * Ro * d);
  const double comp_v41 = in.role == DSV4_ROLE_FULL ? 2 * d * D * (r == 2 ? 2 : 1) : 0; /* wkv, wgate (r = 2) */
  const double comp = v41 ? comp_v41 : r > 0 ? 2 * 2 * d * cc * D : 0;
  *c = (dsv4_token_cost){.r = r, .W = cfg->window, .topk = cfg->index_topk, .sparse = v41 ? r > 0 : r == 4,
                         .selects = in.selects, .proj = proj + comp,
                         .idx_proj = in.selects ? 2 * (dq * Hi * Di + d * Hi + (v41 ? 0 : 2 * d * 2 * Di)) : 0,
                         .key_proj = v41 && in.role == DSV4_ROLE_FULL ? 2 * D * Di : 0, .key = 4 * H * D,
                         .vis = in.selects ? 2 * Hi * Di : 0, .sel = in.selects ? 4 * Hi * Di : 0};
fail:
  return rc;
}

static dsv4_status flops(const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_range *segs, int n_seg,
                         dsv4_flops *f) {
  dsv4_status rc = DSV4_OK;
  dsv4_docs docs = {0};
  dsv4_token_cost tc;
  DSV4_CHECK(cfg && pk && f, DSV4_ERR_ARG, "flops: NULL argument");
  DSV4_TRY(dsv4_token_cost_of(cfg, layer, &tc));
  DSV4_TRY(dsv4_docs_build(&docs, pk, tc.r));
  double keys = 0, vis = 0, sel = 0, tokens = 0, entries = 0;
  int cur = 0;
  for (int i = 0; i < docs.n_docs; i++) { /* documents in stream order: global tokens increase */
    int64_t g = docs.cu[i], lo, hi;
    while (next_run(segs, n_seg, &cur, &g, docs.cu[i] + docs.real[i], &lo, &hi))
      for (int64_t t = lo - docs.cu[i]; t < hi - docs.cu[i]; t++) {
        if (tc.r > 0 && (t + 1) % tc.r == 0) entries += 1; /* an entry ends at t */
        const dsv4_token_keys k = dsv4_token_keys_at(&tc, t);
        keys += (double)(k.nw + k.nc);
        vis += (double)k.nv;
        sel += (double)k.nc;
        tokens += 1;
      }
  }
  *f = (dsv4_flops){0};
  f->tokens = tokens;
  const double key_proj = tc.key_proj * entries;
  f->projections_fwd = tokens * (tc.proj + tc.idx_proj) + key_proj;
  f->attention_fwd = tc.key * keys;
  f->indexer_fwd = tc.vis * vis;
  f->fwd = f->projections_fwd + f->attention_fwd + f->indexer_fwd;
  f->projections_bwd = tokens * (2 * tc.proj + tc.idx_proj) + key_proj;
  f->attention_bwd = 2 * tc.key * keys;
  f->indexer_bwd = tc.sel * sel;
  f->bwd = f->projections_bwd + f->attention_bwd + f->indexer_bwd;
fail:
  dsv4_docs_free(&docs);
  return rc;
}

dsv4_status dsv4_layer_flops(const dsv4_config *cfg, int layer, const dsv4_packing *pk, dsv4_flops *out) {
  dsv4_status rc = DSV4_OK;
  dsv4_config c;
  dsv4_packing p;
  dsv4_flops f;
  DSV4_TRY(dsv4_config_in(&c, cfg));
  DSV4_TRY(DSV4_STRUCT_IN(&p, pk, dsv4_packing, NULL));
  DSV4_TRY(DSV4_STRUCT_CHECK(out, dsv4_flops));
  DSV4_TRY(flops(&c, layer, &p, NULL, 0, &f));
  DSV4_TRY(DSV4_STRUCT_OUT(out, &f, dsv4_flops));
fail:
  return rc;
}

dsv4_status dsv4_cp_plan_flops(const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_cp_config *cp,
                               int rank, int size, dsv4_flops *out) {
  static const dsv4_cp_config cp_defaults = DSV4_CP_CONFIG_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_config c;
  dsv4_packing p;
  dsv4_cp_config k = cp_defaults;
  dsv4_flops f;
  dsv4_range *segs = NULL;
  int n_seg = 0;
  DSV4_CHECK(cfg && pk && out, DSV4_ERR_ARG, "plan: NULL argument"); /* rank and size: shard_segments */
  DSV4_TRY(dsv4_config_in(&c, cfg));
  DSV4_TRY(DSV4_STRUCT_IN(&p, pk, dsv4_packing, NULL));
  if (cp) DSV4_TRY(DSV4_STRUCT_IN(&k, cp, dsv4_cp_config, &cp_defaults));
  DSV4_TRY(DSV4_STRUCT_CHECK(out, dsv4_flops));
  DSV4_TRY(dsv4_shard_segments(&p, k.split, rank, size, &segs, &n_seg));
  DSV4_TRY(flops(&c, layer, &p, segs, n_seg, &f));
  DSV4_TRY(DSV4_STRUCT_OUT(out, &f, dsv4_flops));
fail:
  free(segs);
  return rc;
}
