/* offload.h: attention rows one rank computes for another, so that the ranks' work is even where the
 * split cannot make it so.
 *
 * Under CSA (V4 r = 4, every V4.1 compressed layer) a query attends to its window and to
 * min(index_topk, visible slots) selected compressed entries: the early queries of every document
 * attend to fewer keys than the late ones, so no equal-length split gives every rank the same
 * attention work (zigzag's middle chunks weigh more, the contiguous split's last rank most). Every
 * rank holds the whole compressed kv (Stage 1's all-gather) and the weights, so any rank can
 * compute any query's attention given its q, its top-k ids and the raw kv rows of its window: the
 * planner pairs the heaviest rank with the lightest, the next with the next, and moves the
 * attention (forward and backward) of the end of the heavy rank's last segment to the light rank,
 * as many rows as halve the pair's difference of estimated work. The light rank runs the same
 * kernels on the same values in the same order, so every result is the bits the heavy rank would
 * have computed (model/offload.c carries the rows).
 *
 * The plan depends only on global values (packing, split, N, the layer's shapes), so every rank
 * computes every rank's part without a message, and the planner (plan/traffic.c, plan/memory.c)
 * counts the same messages and buffers. */
#ifndef DSV4_OFFLOAD_H
#define DSV4_OFFLOAD_H

#include "dsv4cp.h"
#include "model/flops.h"
#include "plan/docs.h"

/* Rows per round trip: the serving rank holds q, o, d o and d q of this many rows at a time. */
#define DSV4_OFFLOAD_BATCH 8

/* The estimate's weight of an attention FLOP against a projection FLOP: the per-query products
 * (64 heads against 128 - 640 keys) run at 72 - 93% of sgemm where the projections run at ~95%,
 * and the gathers and softmax add to them (docs/perf.md). */
#define DSV4_OFFLOAD_KEY_COST 1.25

typedef struct {
  int peer;                 /* -1: nothing moves to or from this rank */
  int heavy;                /* 1: peer computes the attention of this rank's last m rows; 0: this
                               rank computes peer's */
  int64_t m;                /* rows moved: the end of the heavy rank's last segment (consecutive
                               global rows), inside its last row chunk (plan.h) */
  int64_t g0;               /* global index of the first moved row */
  int64_t kv_g0, kv_rows;   /* the raw kv rows their windows read: global [kv_g0, kv_g0 + kv_rows) */
  double work[2];           /* the pair's estimated work (FLOPs, attention weighted), heavy then light,
                               before the move; work_moved: what moves */
  double work_moved;
} dsv4_offload;

/* Every rank's part, out[0 .. size): nothing moves unless size > 1 and the layer attends through
 * top-k (tc->sparse); nor with DSV4_OFFLOAD=0 in the environment (the same bits either way). */
dsv4_status dsv4_offload_plan(const dsv4_token_cost *tc, const dsv4_docs *docs, const dsv4_packing *pk,
                              dsv4_split split, int size, dsv4_offload *out);

/* The window of moved row j (0 <= j < o->m) as rows of the moved kv range; length 0: padding. */
void dsv4_offload_window(const dsv4_docs *docs, int W, const dsv4_offload *o, int64_t j, int32_t *start,
                         int32_t *len);

/* This rank's messages of the move (what model/offload.c sends, counted as exchange.h counts them)
 * added into *s: DSV4_MSG_ATTN_OFFLOAD and DSV4_MSG_ATTN_OFFLOAD_BWD. teacher: the layer sends the
 * KL teacher rows back (it selects, with the sparse KL loss). */
void dsv4_offload_traffic(const dsv4_offload *o, int H, int D, int topk, int teacher, dsv4_cp_stats *s);

/* Bytes each side holds while rows move (plan/memory.c and the call's own buffers agree): the
 * serving rank's batch buffers, the moved rows' kv, top-k ids, lse, teacher and window sums; the
 * heavy rank's window sums as they come back. threads: the exact sums' copies. */
size_t dsv4_offload_bytes(const dsv4_offload *o, int H, int D, int topk, int teacher, int threads);

#endif
