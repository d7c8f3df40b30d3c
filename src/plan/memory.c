/* memory.c: what one rank holds for one layer forward + backward (dsv4_cp_plan_memory), from the
 * same carve functions the call itself uses (model/arenas.h) on the rank's own plan: the saved
 * bytes planned are the bytes a training forward carves, by construction. */
#include <string.h>

#include "model/arenas.h"
#include "model/wgrad.h"
#include "model/weights.h"
#include "offload.h"
#include "plan.h"
#include "shard.h"
#include "util/abi.h"
#include "util/err.h"

static dsv4_status plan_memory(const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_cp_config *cp,
                               const dsv4_plan_opts *opts, int rank, int size, dsv4_memory_plan *out) {
  dsv4_status rc = DSV4_OK;
  dsv4_plan p = {0};
  dsv4_plan_key key = {0};
  int have = 0;
  DSV4_CHECK(cfg && pk && out && size >= 1 && rank >= 0 && rank < size, DSV4_ERR_ARG, "plan: bad arguments");
  memset(out, 0, sizeof *out);
  const int r = dsv4_config_ratio(cfg, layer), recompute = opts && opts->recompute;
  DSV4_CHECK(r >= 0, DSV4_ERR_ARG, "plan: layer %d out of range", layer);
  const dsv4_split split = cp ? cp->split : DSV4_SPLIT_CONTIGUOUS;
  int64_t n = 0, nw = 0;
  DSV4_TRY(dsv4_cp_shard_rows(pk, cp, rank, size, NULL, &n));
  DSV4_TRY(dsv4_plan_key_set(&key, pk, n, r, cfg->window, split, rank, size));
  DSV4_TRY(dsv4_plan_build(&p, cfg, &key, DSV4_PLAN_LOCAL)); /* this rank's shapes only */
  have = 1;
  dsv4_layer_info info = DSV4_LAYER_INFO_INIT;
  DSV4_TRY(dsv4_config_layer(cfg, layer, &info));
  dsv4_dims dm;
  dsv4_dims_of(&dm, cfg, &info, &p, recompute, DSV4_IMPL_FAST);
  dm.nt = opts && opts->threads > 1 ? opts->threads : 1; /* the exact sums' copies (arenas.h) */
  dsv4_core_saved cs;
  dsv4_layer_saved ls;
  DSV4_TRY(dsv4_weights_numel(cfg, layer, &nw));
  const uint64_t d = (uint64_t)cfg->dim, k = (uint64_t)cfg->index_topk;
  out->weights = out->grads = sizeof(float) * (uint64_t)nw;
  out->saved = dsv4_carve_layer_saved(NULL, &dm, &ls) + dsv4_carve_core_saved(NULL, &dm, &cs);
  /* the global compressed kv and keys every rank holds whole: in the core's arena (V4), or the kv
   * source's entry of the shared state (V4.1: counted at the source, with the backward's sums, which
   * live from the group's first backward to the source's) */
  const uint64_t cmp_bytes = sizeof(float) * (uint64_t)dm.n_cmp *
                             (uint64_t)(dm.v4_keys || dm.v41_keys ? cfg->head_dim + cfg->index_head_dim : cfg->head_dim);
  out->replicated = dm.compresses ? cmp_bytes : 0;
  /* the entry and the backward's sums (exact: 16 bytes per element of the kv rows and keys, plus the
   * keys' float residue) */
  if (dm.v41_keys) out->shared = cmp_bytes + sizeof(float) * (uint64_t)dm.n_cmp * (4 * cfg->head_dim + 5 * cfg->index_head_dim);
  if (!dm.own_cmp && dm.selects) /* this rank's top-k (and candidate blocks) */
    out->shared += sizeof(int32_t) * (uint64_t)n *
                   (uint64_t)(cfg->index_topk + (info.candidate_source ? cfg->candidate_topk_blocks : 0));
  /* the scratch arenas, the plan (token map, query tables, slot tables, gather index, RoPE table),
   * and the kernels' own per-call workspace */
  out->transient = dsv4_layer_scratch_bytes(&dm) + dsv4_core_scratch_bytes(&dm) + p.bytes +
                   (r > 0 ? sizeof(int32_t) * (uint64_t)dm.n_cmp : 0) +
                   dsv4_kernel_scratch_bytes(&dm, opts ? opts->threads : 1) +
                   dsv4_wgrad_bytes(cfg, dm.selects, recompute, opts ? opts->threads : 1, n, key.T, size,
                                    p.partial, p.partial_max);
  /* V4's indexer keys' gradient: its exact sums over the backward's chunks (core_bwd.c begin_sinks;
   * a V4.1 source's are its shared entry's, above), 16 bytes per element of every compressed row */
  if (dm.v4_keys) out->transient += 2 * sizeof(int64_t) * (uint64_t)dm.n_cmp * (uint64_t)cfg->index_head_dim;
  /* attention rows moved to or from another rank (the fast path's): their buffers at the most */
  dsv4_token_cost tc;
  DSV4_TRY(dsv4_token_cost_of(cfg, layer, &tc));
  if (dsv4_offload_enabled(&tc, size))
    out->transient += dsv4_offload_bytes_max(&tc, n, cfg->n_heads, cfg->head_dim, dm.selects && dm.sparse_kl,
                                             opts ? opts->threads : 1);
  out->io = (uint64_t)n * (4 * d * sizeof(float) + (dm.selects ? k * sizeof(int32_t) : 0));
  out->total = out->weights + out->grads + out->saved + out->transient + out->io + out->shared;
fail:
  if (have) dsv4_plan_free(&p);
  dsv4_plan_key_free(&key);
  return rc;
}

dsv4_status dsv4_cp_plan_memory(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                const dsv4_cp_config *cp, const dsv4_plan_opts *opts, int rank, int size,
                                dsv4_memory_plan *out) {
  static const dsv4_cp_config cp_defaults = DSV4_CP_CONFIG_INIT;
  static const dsv4_plan_opts opt_defaults = DSV4_PLAN_OPTS_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_config c;
  dsv4_packing p;
  dsv4_cp_config k = cp_defaults;
  dsv4_plan_opts o = opt_defaults;
  dsv4_memory_plan m;
  DSV4_CHECK(cfg && pk && out, DSV4_ERR_ARG, "plan: NULL argument");
  DSV4_TRY(dsv4_config_in(&c, cfg));
  DSV4_TRY(DSV4_STRUCT_IN(&p, pk, dsv4_packing, NULL));
  if (cp) DSV4_TRY(DSV4_STRUCT_IN(&k, cp, dsv4_cp_config, &cp_defaults));
  if (opts) DSV4_TRY(DSV4_STRUCT_IN(&o, opts, dsv4_plan_opts, &opt_defaults));
  DSV4_TRY(DSV4_STRUCT_CHECK(out, dsv4_memory_plan));
  DSV4_TRY(plan_memory(&c, layer, &p, &k, &o, rank, size, &m));
  DSV4_TRY(DSV4_STRUCT_OUT(out, &m, dsv4_memory_plan));
fail:
  return rc;
}
