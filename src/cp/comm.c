/* comm.c: the public communicator functions and the one-rank transport (no messages: a gather is
 * a copy, a reduction leaves the buffer as it is). */
#include "comm.h"

#include <string.h>

#include "util/err.h"

static dsv4_status self_p2p(void *impl, const void *b, size_t n, int peer, int tag, dsv4_comm_req **r) {
  (void)impl, (void)b, (void)n, (void)tag, (void)r;
  return dsv4__err(DSV4_ERR_COMM, __FILE__, __LINE__, "one-rank communicator: no peer %d", peer);
}

static dsv4_status self_recv(void *impl, void *b, size_t n, int peer, int tag, dsv4_comm_req **r) {
  return self_p2p(impl, b, n, peer, tag, r);
}

static dsv4_status self_iallgather(void *impl, const void *s, void *r, size_t n, dsv4_comm_req **q) {
  (void)impl;
  memmove(r, s, n);
  *q = NULL;
  return DSV4_OK;
}

static dsv4_status self_test(void *impl, dsv4_comm_req **r, int n) {
  (void)impl, (void)r, (void)n;
  return DSV4_OK;
}

static dsv4_status self_wait(void *impl, dsv4_comm_req **r, int n) {
  (void)impl, (void)r, (void)n;
  return DSV4_OK;
}

static dsv4_status self_reduce_scatter(void *impl, const void *s, void *r, size_t n, dsv4_red_type t) {
  (void)impl;
  memmove(r, s, n * (t == DSV4_RED_F32 ? sizeof(float) : sizeof(int64_t)));
  return DSV4_OK;
}

static dsv4_status self_allreduce(void *impl, void *b, size_t n, dsv4_red_type t, dsv4_red_op op) {
  (void)impl, (void)b, (void)n, (void)t, (void)op;
  return DSV4_OK;
}

static dsv4_status self_bcast(void *impl, void *b, size_t n, int root) {
  (void)impl, (void)b, (void)n, (void)root;
  return DSV4_OK;
}

static void self_destroy(void *impl) { (void)impl; }

static const dsv4_comm_ops SELF_OPS = {self_p2p, self_recv, self_iallgather, self_test, self_wait,
                                       self_reduce_scatter, self_allreduce, self_bcast, self_destroy};

dsv4_status dsv4_comm_create_self(dsv4_comm **out) {
  dsv4_status rc = DSV4_OK;
  dsv4_comm *c = NULL;
  DSV4_CHECK(out, DSV4_ERR_ARG, "comm: NULL out");
  DSV4_ALLOC(c, 1);
  c->rank = 0;
  c->size = 1;
  c->ops = &SELF_OPS;
  *out = c;
fail:
  return rc;
}

void dsv4_comm_free(dsv4_comm *c) {
  if (!c) return;
  c->ops->destroy(c->impl);
  free(c);
}

int dsv4_comm_rank(const dsv4_comm *c) { return c->rank; }
int dsv4_comm_size(const dsv4_comm *c) { return c->size; }
