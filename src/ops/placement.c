/* placement.c: the distributed layouts of the three operators (SPEC 5 table): placement names, the
 * infer rule of each operator, and the operators called behind their rules. The rules encode why
 * two-stage CP is correct:
 *   - queries (and everything per query) are SHARD(seq): each rank computes its own tokens;
 *   - compressed keys (cmp_kv, k_idx) are REPLICATE: Stage 1 gave every rank the global sequence,
 *     which is what makes the top-k global and the attention exact;
 *   - raw kv is WINDOW(halo): the local rows plus the W-1 rows before them. It must never be an
 *     ordinary REPLICATE or SHARD (an all-gathered kv would cost O(T) per rank; a plain shard would
 *     lose the window's left edge);
 *   - head sharding is rejected everywhere: the indexer sums over heads and the KL teacher averages
 *     over heads, so a head shard would need another reduction these operators do not do;
 *   - gradients of REPLICATE inputs and the loss are PARTIAL(sum): the CP core reduce-scatters or
 *     all-reduces them. */
#include <stdio.h>

#include "placement.h"
#include "ops/kernels.h"
#include "ops/sparse_attn.h"
#include "util/err.h"

static const dsv4_placement SHARD = {DSV4_PLACE_SHARD_SEQ, 0},
                            PARTIAL = {DSV4_PLACE_PARTIAL_SUM, 0};

const char *dsv4_placement_name(dsv4_placement p) {
  static _Thread_local char buf[32];
  switch (p.kind) {
    case DSV4_PLACE_REPLICATE: return "REPLICATE";
    case DSV4_PLACE_SHARD_SEQ: return "SHARD(seq)";
    case DSV4_PLACE_SHARD_HEAD: return "SHARD(head)";
    case DSV4_PLACE_PARTIAL_SUM: return "PARTIAL(sum)";
    case DSV4_PLACE_WINDOW: snprintf(buf, sizeof buf, "WINDOW(%lld)", (long long)p.halo); return buf;
  }
  return "unknown";
}

/* A per-query tensor: SHARD(seq); with one rank also REPLICATE (the same thing). */
static dsv4_status want_seq(const char *op, const char *arg, dsv4_placement p, int nranks) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(p.kind != DSV4_PLACE_SHARD_HEAD, DSV4_ERR_LAYOUT,
             "%s: %s is SHARD(head): head and head-dim sharding are not supported", op, arg);
  DSV4_CHECK(p.kind == DSV4_PLACE_SHARD_SEQ || (nranks == 1 && p.kind == DSV4_PLACE_REPLICATE), DSV4_ERR_LAYOUT,
             "%s: %s must be SHARD(seq) (got %s)", op, arg, dsv4_placement_name(p));
fail:
  return rc;
}

/* The global compressed keys: REPLICATE (the Stage-1 all-gather gave every rank all of them). */
static dsv4_status want_replicate(const char *op, const char *arg, dsv4_placement p, int nranks) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(p.kind != DSV4_PLACE_SHARD_HEAD, DSV4_ERR_LAYOUT,
             "%s: %s is SHARD(head): head and head-dim sharding are not supported", op, arg);
  DSV4_CHECK(p.kind == DSV4_PLACE_REPLICATE || (nranks == 1 && p.kind == DSV4_PLACE_SHARD_SEQ), DSV4_ERR_LAYOUT,
             "%s: %s must be REPLICATE, the global compressed sequence (got %s)", op, arg, dsv4_placement_name(p));
fail:
  return rc;
}

dsv4_status dsv4_lightning_indexer_infer(int nranks, const dsv4_placement in[3], dsv4_placement out[2]) {
  dsv4_status rc = DSV4_OK;
  static const char *op = "lightning_indexer";
  DSV4_CHECK(nranks >= 1 && in && out, DSV4_ERR_ARG, "%s infer: bad arguments", op);
  DSV4_TRY(want_seq(op, "q_idx", in[0], nranks));
  DSV4_TRY(want_replicate(op, "k_idx", in[1], nranks));
  DSV4_TRY(want_seq(op, "weights", in[2], nranks));
  out[0] = out[1] = SHARD;
fail:
  return rc;
}

dsv4_status dsv4_sparse_attn_infer(int nranks, const dsv4_placement in[5], dsv4_placement out[2],
                                   dsv4_placement bwd[4]) {
  dsv4_status rc = DSV4_OK;
  static const char *op = "sparse_attn_sharedkv";
  DSV4_CHECK(nranks >= 1 && in, DSV4_ERR_ARG, "%s infer: bad arguments", op);
  DSV4_TRY(want_seq(op, "q", in[0], nranks));
  const dsv4_placement kv = in[1];
  DSV4_CHECK(kv.kind != DSV4_PLACE_SHARD_HEAD, DSV4_ERR_LAYOUT, "%s: ori_kv is SHARD(head): not supported", op);
  DSV4_CHECK(kv.kind == DSV4_PLACE_WINDOW || (nranks == 1 && kv.kind == DSV4_PLACE_REPLICATE), DSV4_ERR_LAYOUT,
             "%s: ori_kv must be WINDOW(halo), the local rows after their window halo; %s raw kv would "
             "%s (got %s)",
             op, kv.kind == DSV4_PLACE_REPLICATE ? "all-gathered" : "sharded",
             kv.kind == DSV4_PLACE_REPLICATE ? "cost O(T) per rank" : "lose each shard's left window",
             dsv4_placement_name(kv));
  DSV4_CHECK(kv.kind != DSV4_PLACE_WINDOW || kv.halo >= 0, DSV4_ERR_LAYOUT, "%s: ori_kv WINDOW halo < 0", op);
  DSV4_TRY(want_replicate(op, "cmp_kv", in[2], nranks));
  DSV4_TRY(want_seq(op, "cmp_ids", in[3], nranks));
  DSV4_CHECK(in[4].kind == DSV4_PLACE_REPLICATE, DSV4_ERR_LAYOUT, "%s: sink must be REPLICATE (got %s)", op,
             dsv4_placement_name(in[4]));
  if (out) out[0] = out[1] = SHARD;
  if (bwd) {
    bwd[0] = SHARD;                                           /* dq */
    bwd[1] = (dsv4_placement){DSV4_PLACE_WINDOW, kv.halo};    /* halo rows go back to their owners */
    bwd[2] = PARTIAL;                                         /* d cmp_kv: reduce-scattered */
    bwd[3] = PARTIAL;                                         /* d sink: summed with the weights */
  }
fail:
  return rc;
}

dsv4_status dsv4_indexer_kl_loss_infer(int nranks, const dsv4_placement in[6], dsv4_placement out[4]) {
  dsv4_status rc = DSV4_OK;
  static const char *op = "indexer_kl_loss";
  DSV4_CHECK(nranks >= 1 && in && out, DSV4_ERR_ARG, "%s infer: bad arguments", op);
  DSV4_TRY(want_seq(op, "q", in[0], nranks));
  DSV4_TRY(want_replicate(op, "cmp_kv", in[1], nranks));
  DSV4_TRY(want_seq(op, "topk_ids", in[2], nranks));
  DSV4_TRY(want_seq(op, "q_idx", in[3], nranks));
  DSV4_TRY(want_replicate(op, "k_idx", in[4], nranks));
  DSV4_TRY(want_seq(op, "weights", in[5], nranks));
  out[0] = PARTIAL; /* loss: local sum, reduced over ranks */
  out[1] = out[2] = SHARD;
  out[3] = PARTIAL; /* d k_idx */
fail:
  return rc;
}

dsv4_status dsv4_attn_layout_check(const dsv4_attn_args *a, int nranks, const dsv4_placement in[5]) {
  dsv4_status rc = DSV4_OK;
  DSV4_TRY(dsv4_sparse_attn_infer(nranks, in, NULL, NULL));
  if (in[1].kind == DSV4_PLACE_WINDOW)
    DSV4_CHECK(a->R == a->S1 + in[1].halo, DSV4_ERR_LAYOUT,
               "sparse_attn_sharedkv: ori_kv is WINDOW(%lld) but has %lld rows for %lld queries", (long long)in[1].halo,
               (long long)a->R, (long long)a->S1);
fail:
  return rc;
}

dsv4_status dsv4_lightning_indexer_dist(const dsv4_indexer_args *a, int nranks, const dsv4_placement in[3],
                                        dsv4_impl impl) {
  dsv4_status rc = DSV4_OK;
  dsv4_placement out[2];
  DSV4_TRY(dsv4_lightning_indexer_infer(nranks, in, out));
  DSV4_TRY(dsv4_kernels_get(impl)->indexer(a));
fail:
  return rc;
}

dsv4_status dsv4_sparse_attn_dist(const dsv4_attn_args *a, int nranks, const dsv4_placement in[5], dsv4_impl impl) {
  dsv4_status rc = DSV4_OK;
  DSV4_TRY(dsv4_attn_layout_check(a, nranks, in));
  DSV4_TRY(dsv4_kernels_get(impl)->attn(a));
fail:
  return rc;
}

dsv4_status dsv4_sparse_attn_bwd_dist(const dsv4_attn_bwd_args *a, int nranks, const dsv4_placement in[5],
                                      dsv4_impl impl) {
  dsv4_status rc = DSV4_OK;
  DSV4_TRY(dsv4_attn_layout_check(&a->fwd, nranks, in));
  DSV4_TRY(dsv4_kernels_get(impl)->attn_bwd(a));
fail:
  return rc;
}

dsv4_status dsv4_indexer_kl_loss_dist(const dsv4_kl_args *a, int nranks, const dsv4_placement in[6],
                                      dsv4_impl impl) {
  dsv4_status rc = DSV4_OK;
  dsv4_placement out[4];
  DSV4_TRY(dsv4_indexer_kl_loss_infer(nranks, in, out));
  DSV4_TRY(dsv4_kernels_get(impl)->kl(a));
fail:
  return rc;
}
