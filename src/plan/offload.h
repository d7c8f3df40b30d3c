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
 * attention (forward and backward) of as many rows as halve the pair's difference of estimated work
 * to the light rank, a share from the end of each of the heavy rank's row chunks (pairs within
 * DSV4_OFFLOAD_MIN_GAP move nothing). The light rank runs the same
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

/* Rows per round trip: the serving rank holds q, o, d o and d q of this many rows at a time (two sets). */
#define DSV4_OFFLOAD_BATCH 8

/* The estimate's weight of an attention FLOP against a projection FLOP: the per-query products
 * (64 heads against 128 - 640 keys) run at 72 - 93% of sgemm where the projections run at ~95%,
 * and the gathers and softmax add to them (docs/perf.md). */
#define DSV4_OFFLOAD_KEY_COST 1.25

/* A pair moves rows only when its heavier rank's estimated work exceeds the lighter's by this
 * factor: a move adds points where the heavy rank waits for the light one, and a few percent is
 * what a core's speed moves by on a shared host (V4-Flash CSA at 1024 tokens, zigzag: 1.009, no
 * move; at 4096: 1.071). */
#define DSV4_OFFLOAD_MIN_GAP 1.02

/* Rows of one of the heavy rank's row chunks (plan.h) whose attention moves: the end of the chunk,
 * rows of one segment. The heavy rank sends them in its call of that chunk; the light rank
 * computes them at the end of its own chunk of the same index (its last if it has fewer), so in
 * every chunk of the backward the light rank's extra work runs while the heavy rank computes the
 * rest of its chunk. */
typedef struct {
  int64_t f, m;             /* the heavy rank's local rows [f, f + m) */
  int64_t g0;               /* global index of row f */
  int64_t kv_g0, kv_rows;   /* the raw kv rows their windows read: global [kv_g0, kv_g0 + kv_rows) */
  int64_t light_end;        /* the light rank computes them after its rows before light_end (a chunk end) */
} dsv4_offload_part;

typedef struct {
  int peer;                 /* -1: nothing moves to or from this rank */
  int heavy;                /* 1: peer computes the attention of some of this rank's rows; 0: this rank
                               computes peer's */
  int n_part;
  dsv4_offload_part *part;  /* in row order (owned: dsv4_offload_free) */
  int64_t m;                /* rows moved in all */
  double work[2];           /* the pair's estimated work (FLOPs, attention weighted), heavy then light,
                               before the move; work_moved: what moves */
  double work_moved;
} dsv4_offload;

void dsv4_offload_free(dsv4_offload *o);
/* Frees all[0 .. n) and the array (all may be NULL). */
void dsv4_offload_free_all(dsv4_offload *all, int n);

/* Every rank's part, out[0 .. size) (each freed with dsv4_offload_free, also on failure): nothing
 * moves unless size > 1 and the layer attends through top-k (tc->sparse), nor between ranks within
 * DSV4_OFFLOAD_MIN_GAP, nor with DSV4_OFFLOAD=0 in the environment (the same bits either way). */
dsv4_status dsv4_offload_plan(const dsv4_token_cost *tc, const dsv4_docs *docs, const dsv4_packing *pk,
                              dsv4_split split, int size, dsv4_offload *out);

/* The window of row j (0 <= j < p->m) of a part as rows of its kv range; length 0: padding. */
void dsv4_offload_window(const dsv4_docs *docs, int W, const dsv4_offload_part *p, int64_t j, int32_t *start,
                         int32_t *len);

/* This rank's messages of the move (what model/offload.c sends, counted as exchange.h counts them)
 * added into *s: DSV4_MSG_ATTN_OFFLOAD and DSV4_MSG_ATTN_OFFLOAD_BWD. teacher: the layer sends the
 * KL teacher rows back (it selects, with the sparse KL loss). */
void dsv4_offload_traffic(const dsv4_offload *o, int H, int D, int topk, int teacher, dsv4_cp_stats *s);

/* 1 when a layer of this cost under `size` ranks may move rows (the plan then decides which). */
int dsv4_offload_enabled(const dsv4_token_cost *tc, int size);

/* The most a rank holds while rows move, whatever its role (plan/memory.c: the memory planner does
 * not build the pairing, which costs O(T) per call): the serving rank's batch buffers and a part's
 * ids, windows, kv rows, lse, teacher rows and window sums, a part being at most a chunk
 * (DSV4_CHUNK_ROWS rows of a rank of n_local). threads: the exact sums' copies. */
size_t dsv4_offload_bytes_max(const dsv4_token_cost *tc, int64_t n_local, int H, int D, int teacher, int threads);

#endif
