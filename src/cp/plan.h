/* plan.h: the index arithmetic of two-stage CP, computed on the host from the global meta only
 * (so every rank derives the same plans without talking):
 *   - the layout of every rank: its segments, their halos, the extended-buffer row offsets, slots;
 *   - the gather index: global compressed id -> row of the all-gathered slot buffers;
 *   - the halo plans: which rows each rank sends to and receives from which peer, for the window
 *     halo (raw kv rows) and the compressor halo (projected C/Z rows of slots that straddle the
 *     segment start).
 * Worked examples are in docs/cp.md and tests/c/test_cp_plan.c. */
#ifndef DSV4_PLAN_H
#define DSV4_PLAN_H

#include "model/core_internal.h"

/* Rows one rank exchanges with one peer, in the order both sides pack them. */
typedef struct {
  int peer;
  int64_t n;
  int32_t *rows;  /* send: source rows in this rank's extended buffer; recv: destination rows */
} cp_msg;

typedef struct {
  int n_send, n_recv;
  cp_msg *send, *recv;
  int64_t n_self;             /* halo rows this rank holds itself (zigzag, batched) */
  int32_t *self_src, *self_dst;
} cp_plan;

void cp_plan_free(cp_plan *p);

/* The KL loss partial each rank all-gathers: exact sum and valid count. */
typedef struct {
  dsv4_exactsum sum;
  int64_t count;
} cp_loss_rec;

/* Layout of rank `rank` of `size`: segments from the split, then model/layout.c (halos, offsets,
 * slot ownership); the gather index when with_gather (it needs every rank's slot ownership, all
 * derived here from the global meta). */
dsv4_status cp_layout(const dsv4_docs *docs, const dsv4_packing *pk, dsv4_split split, int rank, int size,
                      int W, int with_gather, dsv4_layout *lay);

/* The three halos: the window's raw kv rows; the compressor rows that carry only the first half of
 * the channels (r = 4: the previous window of a segment's first owned slot); the compressor rows
 * that carry every channel (that slot's own window, and for r = 4 the next slot's previous one). */
typedef enum { CP_HALO_WINDOW = 0, CP_HALO_CMP_HALF, CP_HALO_CMP_FULL } cp_halo;

/* Halo plan of rank `me` for one kind, given every rank's layout (lays[0..size)). */
dsv4_status cp_plan_halo(const dsv4_layout *lays, int size, int me, cp_halo kind, cp_plan *p);

#endif
