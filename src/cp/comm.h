/* comm.h: the transport interface behind dsv4_comm. The CP code speaks only these verbs, so a
 * transport is one small table (MPI now; NCCL later). Non-blocking calls return a request that
 * comm_wait completes. Blocking collectives must be called by every rank in the same order. */
#ifndef DSV4_COMM_H
#define DSV4_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "dsv4cp.h"

typedef struct dsv4_comm_req dsv4_comm_req;

typedef enum { DSV4_RED_SUM = 0, DSV4_RED_MAX, DSV4_RED_MIN } dsv4_red_op;
typedef enum { DSV4_RED_F32 = 0, DSV4_RED_F64, DSV4_RED_I64 } dsv4_red_type;

typedef struct {
  dsv4_status (*isend)(void *impl, const void *buf, size_t bytes, int peer, int tag, dsv4_comm_req **req);
  dsv4_status (*irecv)(void *impl, void *buf, size_t bytes, int peer, int tag, dsv4_comm_req **req);
  /* recv[r * bytes ..] = rank r's send, for every rank r. */
  dsv4_status (*iallgather)(void *impl, const void *send, void *recv, size_t bytes, dsv4_comm_req **req);
  /* Lets pending requests progress without blocking; completed ones are freed and set to NULL. */
  dsv4_status (*test)(void *impl, dsv4_comm_req **reqs, int n);
  /* Completes and frees n requests (NULL entries are skipped). */
  dsv4_status (*wait)(void *impl, dsv4_comm_req **reqs, int n);
  /* recv[0..n) = sum over ranks of send[rank * n ..]. */
  dsv4_status (*reduce_scatter)(void *impl, const void *send, void *recv, size_t n, dsv4_red_type t);
  dsv4_status (*allreduce)(void *impl, void *buf, size_t n, dsv4_red_type t, dsv4_red_op op);
  dsv4_status (*bcast)(void *impl, void *buf, size_t bytes, int root);
  void (*destroy)(void *impl);
} dsv4_comm_ops;

struct dsv4_comm {
  int rank, size;
  const dsv4_comm_ops *ops;
  void *impl;
};

/* Thin wrappers (so call sites read as verbs). */
static inline dsv4_status dsv4_comm_isend(dsv4_comm *c, const void *b, size_t n, int peer, int tag,
                                          dsv4_comm_req **r) {
  return c->ops->isend(c->impl, b, n, peer, tag, r);
}
static inline dsv4_status dsv4_comm_irecv(dsv4_comm *c, void *b, size_t n, int peer, int tag,
                                          dsv4_comm_req **r) {
  return c->ops->irecv(c->impl, b, n, peer, tag, r);
}
static inline dsv4_status dsv4_comm_iallgather(dsv4_comm *c, const void *s, void *r, size_t n,
                                               dsv4_comm_req **q) {
  return c->ops->iallgather(c->impl, s, r, n, q);
}
static inline dsv4_status dsv4_comm_test(dsv4_comm *c, dsv4_comm_req **r, int n) {
  return c->ops->test(c->impl, r, n);
}
static inline dsv4_status dsv4_comm_wait(dsv4_comm *c, dsv4_comm_req **r, int n) {
  return c->ops->wait(c->impl, r, n);
}
/* The most int64 one message of the MPI transport's int64 reduce-scatter carries; it keeps two such
 * buffers between calls (comm_mpi.c, a ring of pairwise exchanges; the planner counts them). */
#define DSV4_COMM_RING_INT64 ((size_t)1 << 20)

/* n elements per rank, of type t (F32 or I64: integer sums are exact, whatever the order) */
static inline dsv4_status dsv4_comm_reduce_scatter(dsv4_comm *c, const void *s, void *r, size_t n, dsv4_red_type t) {
  return c->ops->reduce_scatter(c->impl, s, r, n, t);
}
static inline dsv4_status dsv4_comm_allreduce(dsv4_comm *c, void *b, size_t n, dsv4_red_type t,
                                              dsv4_red_op op) {
  return c->ops->allreduce(c->impl, b, n, t, op);
}
static inline dsv4_status dsv4_comm_bcast(dsv4_comm *c, void *b, size_t n, int root) {
  return c->ops->bcast(c->impl, b, n, root);
}

#endif
