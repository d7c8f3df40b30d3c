/* offload.h: carrying the attention rows plan/offload.h moves, forward and backward.
 *
 * The heavy rank (its last m rows move) and the light rank (it computes them) meet in their last
 * row call of the forward and of the backward (the moved rows lie in the heavy rank's last chunk, so
 * its last call holds them whatever the chunking; core_fwd.c, core_bwd.c):
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
  int nb;               /* batches */
  int *do_req;          /* backward: batch b's d o send (index into req) */
  uint8_t *dq_posted;   /* backward: batch b's d q receive is posted (after its d o left: d q may alias d o) */
  float *dq;            /* backward: d q of the first moved row */
  int64_t *sums;        /* backward: the window rows' exact sums from the light rank */
  int64_t status[2];    /* the light rank's status: forward, backward */
  dsv4_status err;      /* a failure inside the progress hook */
} dsv4_offload_run;

/* Forward, heavy rank, after the call's top-k: the moved rows' inputs sent, their outputs' receives
 * posted (q: the call's q; o: the call's o; i0: the call's first row). */
dsv4_status dsv4_offload_fwd_post(dsv4_core *c, int64_t i0, const float *q, float *o);
/* Forward, heavy rank: completes the call's messages. */
dsv4_status dsv4_offload_fwd_wait(dsv4_core *c);
/* Forward, light rank: computes the peer's moved rows and sends them back. */
dsv4_status dsv4_offload_fwd_serve(dsv4_core *c);

/* Backward, heavy rank, first in its last call: the moved rows' inputs sent (q, o, d o: the call's). */
dsv4_status dsv4_offload_bwd_post(dsv4_core *c, int64_t i0, const float *q, const float *o, const float *d_o,
                                  float *dq);
/* Backward, heavy rank: completes the call's messages; the window sums merged into x_ext. */
dsv4_status dsv4_offload_bwd_wait(dsv4_core *c);
/* Backward, light rank: the peer's moved rows' backward, key gradients into its own sums. */
dsv4_status dsv4_offload_bwd_serve(dsv4_core *c);

/* The hook the heavy rank's attention calls between queries (ctx: the core). */
void dsv4_offload_progress(void *ctx);
/* Completes whatever is still in flight (the error path). */
void dsv4_offload_drain(dsv4_core *c);

#endif
