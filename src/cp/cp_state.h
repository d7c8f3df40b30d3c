/* cp_state.h: the state a patched core carries: its communicator, the CP config, the plans of the
 * current forward, pending all-gathers, and the message accounting. */
#ifndef DSV4_CP_STATE_H
#define DSV4_CP_STATE_H

#include "comm.h"
#include "plan.h"

typedef struct {
  dsv4_comm *comm;
  dsv4_cp_config cfg;
  dsv4_cp_stats stats;
  cp_plan win;                  /* window halo plan of the current forward */
  cp_plan cmp_half, cmp_full;   /* compressor halo plans (first-half-channel rows, every-channel rows) */
  dsv4_comm_req *gather_req[2]; /* pending all-gather (main, indexer) */
  size_t gather_bytes[2];
  double gather_t0[2];          /* when it was started */
  float *sendbuf, *recvbuf;     /* halo packing buffers */
  size_t buf_cap;
  /* the layout and plans of the last shape, reused while the shape repeats (training steps) */
  uint64_t cache_key;
  int cache_valid, cache_plans;
  dsv4_layout cache;
  int64_t cache_n_cmp;
} cp_state;

/* The exchange of a patched core (cp/exchange.c). */
const dsv4_exchange *cp_exchange(cp_state *st, dsv4_exchange *storage);

/* Adds one message's bytes and wait time to the counters. */
void cp_account(dsv4_cp_stats *s, dsv4_msg_kind k, uint64_t sent, uint64_t recv, uint64_t msgs, double secs);
double cp_now(void);

#endif
