/* offload.h: carrying the attention rows plan/offload.h moves, forward and backward.
 *
 * The heavy rank (the end of each of its row chunks moves: a part) and the light rank (it computes
 * them) meet in the calls that hold them (core_fwd.c, core_bwd.c): the heavy rank's call of the
 * part's chunk, the light rank's call that ends its chunk of the same index (the backward's calls
 * are the chunks; the default forward is one call, so all parts go at once there):
 *   forward   heavy: after its top-k, sends the moved rows' top-k ids, their windows' raw kv rows and
 *             q (in batches), computes its other rows, then waits for o, lse and the KL teacher;
 *             light: after its own rows, computes the moved rows batch by batch with the forward's
 *             two phases (window, then compressed keys and sink) on its own copy of the global
 *             compressed kv, and sends them back;
 *   backward  heavy: sends ids, kv rows, lse, and q, d o, o per batch, computes its other rows and
 *             its KL backward, then waits for d q and for the window rows' key gradients (exact
 *             sums, merged into its own); light: adds the moved rows' compressed-key and sink
 *             gradients into its own exact sums (the reduce-scatter and the weight gradients' sums
 *             are exact, so who added a term does not matter) and sends d q and the window sums.
 * Every product is the one the heavy rank would have run, with the same shapes on the same values,
 * so every output is the same bits for any N. Messages: DSV4_MSG_ATTN_OFFLOAD (forward) and
 * DSV4_MSG_ATTN_OFFLOAD_BWD, counted by plan/traffic.c as sent here. While the heavy rank computes
 * its own rows it lets the messages progress between queries (the light rank waits on them).
 * A failure on the light rank still answers every message (the heavy rank then fails naming it). */
#ifndef DSV4_MODEL_OFFLOAD_H
#define DSV4_MODEL_OFFLOAD_H

#include "cp/comm.h"
#include "dsv4cp.h"
#include "util/xrows.h"

typedef struct dsv4_core dsv4_core;

/* The heavy rank's messages in flight during one call. */
typedef struct {
  dsv4_core *c;
  dsv4_comm_req **req;  /* every pending request of the call */
  int n_req;
  int n_part;           /* parts in the call */
  int nb;               /* their batches */
  int bwd;              /* a backward call (d q receives follow the d o sends) */
  int *do_req;          /* batch b's d o send (index into req) */
  uint8_t *dq_posted;   /* batch b's d q receive is posted (after its d o left: d q may alias d o) */
  float **dq_at;        /* where batch b's d q goes, and its rows */
  int64_t *dq_rows;
  int *kv_part;         /* backward: the call's i-th part (index into the plan's parts) */
  int64_t **sums;       /* backward: its window rows' exact sums from the light rank */
  int64_t *status;      /* the light rank's status of each part */
  dsv4_status err;      /* a failure inside the progress hook */
} dsv4_offload_run;

/* The rows of the call [i0, i0 + n) whose attention this rank computes: lo[i], hi[i] for the
 * returned count (at most the plan's parts + 1; the whole call unless this rank is heavy). */
int dsv4_offload_own(const dsv4_core *c, int64_t i0, int64_t n, int64_t *lo, int64_t *hi);

/* Forward, heavy rank, after the call's top-k: the inputs of the moved rows in the call sent, the
 * receives of their outputs posted (q, o: the call's). Then wait: completes the call's messages. */
dsv4_status dsv4_offload_fwd_post(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o);
dsv4_status dsv4_offload_fwd_wait(dsv4_core *c);
/* Forward, light rank, after its call [i0, i0 + n): computes the parts due there and sends them back. */
dsv4_status dsv4_offload_fwd_serve(dsv4_core *c, int64_t i0, int64_t n);

/* Backward, heavy rank, first in the call: the moved rows' inputs sent (q, o, d o, dq: the call's). */
dsv4_status dsv4_offload_bwd_post(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *o,
                                  const float *d_o, float *dq);
/* Backward, heavy rank: completes the call's messages; the window sums merged into x_ext. */
dsv4_status dsv4_offload_bwd_wait(dsv4_core *c);
/* Backward, light rank, after its call [i0, i0 + n): the parts due there, key gradients into its
 * own sums. */
dsv4_status dsv4_offload_bwd_serve(dsv4_core *c, int64_t i0, int64_t n);

/* The hook the heavy rank's attention calls between queries (ctx: the core). */
void dsv4_offload_progress(void *ctx);
/* Completes whatever is still in flight (the error path). */
void dsv4_offload_drain(dsv4_core *c);

#endif
