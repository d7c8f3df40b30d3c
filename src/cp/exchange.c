/* exchange.c: the messages of two-stage CP over a plan (exchange.h), with their accounting. */
#include "exchange.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/err.h"
#include "util/gemm.h"
#include "util/hash.h"
#include "util/xacc.h"

double dsv4_xfer_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* Adds one message kind's bytes and wait time to the counters (nothing on one rank). */
static void account(dsv4_xfer *x, dsv4_msg_kind k, uint64_t sent, uint64_t recv, uint64_t msgs, double secs) {
  if (x->comm->size == 1) return;
  x->stats.bytes_sent[k] += sent;
  x->stats.bytes_recv[k] += recv;
  x->stats.messages[k] += msgs;
  x->stats.seconds[k] += secs;
}

void dsv4_xfer_free(dsv4_xfer *x) {
  if (x->comm) dsv4_xfer_drain(x);
  free(x->sendbuf);
  free(x->recvbuf);
  x->sendbuf = x->recvbuf = NULL;
  x->buf_cap = 0;
}

/* ---- agreement: one small collective before anything else ------------------------------------ */

/* Hash of the packing meta as given (bounded reads: a nonsense n_docs is hashed as a number and
 * rejected later by validation, identically on every rank). A hash suffices here: it only decides
 * whether the ranks' inputs differ (a collision lets a disagreement through to the validation of
 * each rank's own plan; it never makes a plan reuse another packing's layout). */
static uint64_t hash_packing(const dsv4_packing *pk) {
  const int64_t head[] = {pk->T, pk->cu_seqlens ? pk->n_docs : -1, pk->batched, pk->seqlens_real != NULL};
  uint64_t h = dsv4_fnv1a(DSV4_FNV_OFFSET, head, sizeof head);
  if (pk->cu_seqlens && pk->n_docs >= 1 && pk->n_docs <= pk->T) {
    h = dsv4_fnv1a(h, pk->cu_seqlens, sizeof(int32_t) * (size_t)(pk->n_docs + 1));
    if (pk->seqlens_real) h = dsv4_fnv1a(h, pk->seqlens_real, sizeof(int32_t) * (size_t)pk->n_docs);
  }
  return h;
}

/* Names two ranks whose BLAS fingerprints differ: rank 0 and the lowest rank that differs from it,
 * with OpenBLAS's kernel family on each, into which. Every rank calls it (each saw the same
 * disagreement in the agreement's all-reduce); fixed-size messages, nothing allocated, so no rank
 * can leave the others waiting. */
static void blas_disagreement(dsv4_comm *c, int64_t mine, char *which, size_t cap) {
  struct {
    int64_t fp;
    char name[40];
  } first = {mine, {0}}, other;
  snprintf(first.name, sizeof first.name, "%s", dsv4_blas_kernels());
  other = first; /* this rank's, until rank q's arrives */
  int64_t q = c->size;
  if (dsv4_comm_bcast(c, &first, sizeof first, 0) == DSV4_OK) {
    q = mine != first.fp ? c->rank : c->size;
    if (dsv4_comm_allreduce(c, &q, 1, DSV4_RED_I64, DSV4_RED_MIN) != DSV4_OK ||
        (q < c->size && dsv4_comm_bcast(c, &other, sizeof other, (int)q) != DSV4_OK))
      q = c->size;
  }
  if (q >= c->size) snprintf(which, cap, "this rank: OpenBLAS '%s'", other.name);
  else if (strcmp(first.name, other.name))
    snprintf(which, cap, "OpenBLAS '%s' on rank 0, '%s' on rank %lld", first.name, other.name, (long long)q);
  else
    snprintf(which, cap, "OpenBLAS '%s' on rank 0 and on rank %lld, but different builds", first.name, (long long)q);
}

dsv4_status dsv4_xfer_agree(dsv4_xfer *x, uint64_t cfg_hash, const dsv4_packing *pk, int64_t n_local,
                            dsv4_split split) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(pk, DSV4_ERR_ARG, "packing meta is NULL");
  if (x->comm->size == 1) return DSV4_OK;
  /* as (max of v, max of -v) pairs: one MAX all-reduce gives every value's max and min */
  const int64_t v[DSV4_AGREE_VALUES / 2] = {(int64_t)(cfg_hash >> 1), (int64_t)(hash_packing(pk) >> 1), n_local,
                                            (int64_t)split, (int64_t)(dsv4_blas_fingerprint() >> 1)};
  int64_t mm[DSV4_AGREE_VALUES];
  for (int i = 0; i < DSV4_AGREE_VALUES / 2; i++) {
    mm[2 * i] = v[i];
    mm[2 * i + 1] = -v[i];
  }
  const double t0 = dsv4_xfer_now();
  DSV4_TRY(dsv4_comm_allreduce(x->comm, mm, DSV4_AGREE_VALUES, DSV4_RED_I64, DSV4_RED_MAX));
  const uint64_t vol = dsv4_xfer_allreduce_volume(sizeof mm, x->comm->size);
  account(x, DSV4_MSG_META_CHECK, vol, vol, 1, dsv4_xfer_now() - t0);
  DSV4_CHECK(mm[0] == -mm[1], DSV4_ERR_COMM, "CP ranks disagree on the configuration, the layer or the kernel path (fast / naive)");
  DSV4_CHECK(mm[2] == -mm[3], DSV4_ERR_COMM,
             "CP ranks disagree on the packing meta (T, cu_seqlens, seqlens_real or batching)");
  DSV4_CHECK(mm[4] == -mm[5], DSV4_ERR_COMM,
             "CP ranks hold different numbers of local rows (between %lld and %lld; every rank must hold T/N)",
             (long long)-mm[5], (long long)mm[4]);
  DSV4_CHECK(mm[6] == -mm[7], DSV4_ERR_COMM, "CP ranks disagree on the split (contiguous / zigzag)");
  /* last: the inputs agree, only the arithmetic would differ (silently: results within tolerance
   * of CP = 1 but not its bits, top-k ids included) */
  if (mm[8] != -mm[9]) {
    char which[160];
    blas_disagreement(x->comm, (int64_t)(dsv4_blas_fingerprint() >> 1), which, sizeof which);
    DSV4_FAIL(DSV4_ERR_COMM,
              "CP ranks run BLAS kernels that round differently (%s), so CP = N could not give CP = 1's "
              "bits; set OPENBLAS_CORETYPE to the same kernel family on every rank",
              which);
  }
fail:
  return rc;
}

/* ---- halos -------------------------------------------------------------------------------------- */

static dsv4_status reserve(dsv4_xfer *x, size_t bytes) {
  dsv4_status rc = DSV4_OK;
  const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
  if (floats <= x->buf_cap) return DSV4_OK;
  free(x->sendbuf);
  free(x->recvbuf);
  x->sendbuf = malloc(sizeof(float) * floats);
  x->recvbuf = malloc(sizeof(float) * floats);
  dsv4_mem_advise(x->sendbuf, sizeof(float) * floats);
  dsv4_mem_advise(x->recvbuf, sizeof(float) * floats);
  x->buf_cap = floats;
  DSV4_CHECK(x->sendbuf && x->recvbuf, DSV4_ERR_NOMEM, "cp: out of memory for halo buffers");
fail:
  if (rc != DSV4_OK) x->buf_cap = 0;
  return rc;
}

/* How a received (or own) row of `width` elements lands on its destination: a copy (forward), a
 * float add or an exact merge (backward, util/xacc.h rows of width / 2 hi and lo words). */
typedef enum { LAND_COPY, LAND_ADD_F32, LAND_MERGE_EXACT } land_op;

static void land(land_op op, void *dst, const void *src, int64_t width, size_t esz) {
  if (op == LAND_COPY) {
    memcpy(dst, src, esz * (size_t)width);
  } else if (op == LAND_ADD_F32) {
    float *d = dst;
    const float *s = src;
    for (int64_t e = 0; e < width; e++) d[e] += s[e];
  } else {
    int64_t *d = dst;
    const int64_t *s = src;
    dsv4_xacc_merge(d, d + width / 2, s, s + width / 2, width / 2);
  }
}

/* Rows of nb buffers (elements of esz bytes, leading dimension ld, columns [col0, col0 + width))
 * along a halo plan; reverse: back to the owners, landing with `op`. */
static dsv4_status halo_move(dsv4_xfer *x, const dsv4_halo_plan *p, void *const *bufs, int nb, int64_t ld,
                             int64_t col0, int64_t width, size_t esz, land_op op, int tag, int reverse,
                             dsv4_msg_kind kind) {
  dsv4_status rc = DSV4_OK;
  dsv4_comm_req **reqs = NULL;
  const int n_out = reverse ? p->n_recv : p->n_send, n_in = reverse ? p->n_send : p->n_recv;
  const dsv4_halo_msg *out = reverse ? p->recv : p->send, *in = reverse ? p->send : p->recv;
  const size_t row = esz * (size_t)width, per_row = row * (size_t)nb;
  size_t tot_out = 0, tot_in = 0;
  for (int i = 0; i < n_out; i++) tot_out += (size_t)out[i].n * per_row;
  for (int i = 0; i < n_in; i++) tot_in += (size_t)in[i].n * per_row;
  DSV4_TRY(reserve(x, (tot_out > tot_in ? tot_out : tot_in) + sizeof(float)));
  DSV4_ALLOC(reqs, n_out + n_in + 1);
  char *sendbuf = (char *)x->sendbuf, *recvbuf = (char *)x->recvbuf;
#define ROW(a, r) ((char *)bufs[a] + ((size_t)((r) * ld + col0)) * esz)
  const double t0 = dsv4_xfer_now();
  size_t off = 0;
  for (int i = 0; i < n_in; i++) {
    DSV4_TRY(dsv4_comm_irecv(x->comm, recvbuf + off, (size_t)in[i].n * per_row, in[i].peer, tag, &reqs[i]));
    off += (size_t)in[i].n * per_row;
  }
  off = 0;
  for (int i = 0; i < n_out; i++) {
    char *b = sendbuf + off;
    for (int64_t k = 0; k < out[i].n; k++)
      for (int a = 0; a < nb; a++) memcpy(b + ((size_t)k * nb + a) * row, ROW(a, out[i].rows[k]), row);
    DSV4_TRY(dsv4_comm_isend(x->comm, b, (size_t)out[i].n * per_row, out[i].peer, tag, &reqs[n_in + i]));
    off += (size_t)out[i].n * per_row;
  }
  /* rows this rank holds itself: no message */
  for (int64_t k = 0; k < p->n_self; k++)
    for (int a = 0; a < nb; a++)
      land(op, ROW(a, reverse ? p->self_src[k] : p->self_dst[k]), ROW(a, reverse ? p->self_dst[k] : p->self_src[k]),
           width, esz);
  DSV4_TRY(dsv4_comm_wait(x->comm, reqs, n_out + n_in));
  off = 0;
  for (int i = 0; i < n_in; i++) {
    const char *b = recvbuf + off;
    for (int64_t k = 0; k < in[i].n; k++)
      for (int a = 0; a < nb; a++) land(op, ROW(a, in[i].rows[k]), b + ((size_t)k * nb + a) * row, width, esz);
    off += (size_t)in[i].n * per_row;
  }
#undef ROW
  account(x, kind, tot_out, tot_in, (uint64_t)n_out, dsv4_xfer_now() - t0);
fail:
  if (rc != DSV4_OK && reqs) dsv4_comm_wait(x->comm, reqs, n_out + n_in);
  free(reqs);
  return rc;
}

dsv4_status dsv4_xfer_halo(dsv4_xfer *x, const dsv4_halo_plan *p, float *const *bufs, int nb, int64_t ld,
                           int64_t col0, int64_t width, int tag, int reverse, dsv4_msg_kind kind) {
  return halo_move(x, p, (void *const *)bufs, nb, ld, col0, width, sizeof(float), reverse ? LAND_ADD_F32 : LAND_COPY,
                   tag, reverse, kind);
}

dsv4_status dsv4_xfer_halo_exact_bwd(dsv4_xfer *x, const dsv4_halo_plan *p, int64_t *acc, int64_t w, int tag,
                                     dsv4_msg_kind kind) {
  void *const bufs[1] = {acc};
  return halo_move(x, p, bufs, 1, 2 * w, 0, 2 * w, sizeof(int64_t), LAND_MERGE_EXACT, tag, 1, kind);
}

/* ---- Stage 1: all-gather, and its backward -------------------------------------------------- */

dsv4_status dsv4_xfer_gather_start(dsv4_xfer *x, int slot, const void *local, void *all, size_t bytes) {
  dsv4_status rc = DSV4_OK;
  x->gather_bytes[slot] = bytes;
  x->gather_t0[slot] = dsv4_xfer_now();
  DSV4_TRY(dsv4_comm_iallgather(x->comm, local, all, bytes, &x->gather_req[slot]));
  if (!x->overlap) DSV4_TRY(dsv4_comm_wait(x->comm, &x->gather_req[slot], 1));
fail:
  return rc;
}

dsv4_status dsv4_xfer_gather_wait(dsv4_xfer *x, int slot) {
  const double t0 = dsv4_xfer_now();
  dsv4_status rc = dsv4_comm_wait(x->comm, &x->gather_req[slot], 1);
  const double t1 = dsv4_xfer_now();
  const uint64_t vol = (uint64_t)x->gather_bytes[slot] * (uint64_t)(x->comm->size - 1);
  if (x->overlap) {
    /* hidden: the part of the all-gather's lifetime spent computing instead of waiting */
    account(x, DSV4_MSG_SLOT_ALLGATHER, vol, vol, 1, t1 - t0);
    if (x->comm->size > 1) {
      x->stats.hidden_seconds += t0 - x->gather_t0[slot];
      x->stats.overlap_window_seconds += t1 - x->gather_t0[slot];
    }
  } else { /* blocking: the whole call was waiting */
    account(x, DSV4_MSG_SLOT_ALLGATHER, vol, vol, 1, t0 - x->gather_t0[slot]);
  }
  return rc;
}

void dsv4_xfer_progress(dsv4_xfer *x) { dsv4_comm_test(x->comm, x->gather_req, DSV4_GATHERS); }

void dsv4_xfer_drain(dsv4_xfer *x) { dsv4_comm_wait(x->comm, x->gather_req, DSV4_GATHERS); }

/* Exact rows (util/xacc.h): integer sums, the same whatever the number of ranks or the order MPI
 * adds them in; the low words then carry into the high ones again. */
dsv4_status dsv4_xfer_reduce_scatter_exact(dsv4_xfer *x, const int64_t *all, int64_t *mine, int64_t rows, int64_t w) {
  dsv4_status rc = DSV4_OK;
  const size_t n = (size_t)(rows * 2 * w);
  const double t0 = dsv4_xfer_now();
  DSV4_TRY(dsv4_comm_reduce_scatter(x->comm, all, mine, n, DSV4_RED_I64));
  const uint64_t vol = sizeof(int64_t) * (uint64_t)n * (uint64_t)(x->comm->size - 1);
  account(x, DSV4_MSG_SLOT_REDUCE_SCATTER, vol, vol, 1, dsv4_xfer_now() - t0);
  for (int64_t r = 0; r < rows; r++) dsv4_xacc_normalize(mine + r * 2 * w, mine + r * 2 * w + w, w);
fail:
  return rc;
}

/* Adds rows [r0, r0 + c) of slice q of the virtual array (src[row_of[q rows + r]], or nothing) into
 * dst [c x w2], or, with set, writes them (zeros where there is no row). */
static void slice_rows(const int64_t *src, const int32_t *row_of, int64_t q, int64_t rows, int64_t r0,
                       int64_t c, int64_t w2, int64_t *dst, int set) {
  for (int64_t r = 0; r < c; r++) {
    const int32_t id = row_of[q * rows + r0 + r];
    int64_t *d = dst + r * w2;
    if (id < 0 || !src) {
      if (set) memset(d, 0, sizeof(int64_t) * (size_t)w2);
    } else if (set) {
      memcpy(d, src + (int64_t)id * w2, sizeof(int64_t) * (size_t)w2);
    } else {
      const int64_t *s = src + (int64_t)id * w2;
      for (int64_t e = 0; e < w2; e++)
        d[e] = (int64_t)((uint64_t)d[e] + (uint64_t)s[e]); /* wraps as MPI_SUM */
    }
  }
}

/* Tag of the mapped ring's messages. */
#define RS_ROWS_TAG 29501

dsv4_status dsv4_xfer_reduce_scatter_exact_rows(dsv4_xfer *x, const int64_t *src, const int32_t *row_of,
                                                int64_t *mine, int64_t rows, int64_t w, int64_t *tmp) {
  dsv4_status rc = DSV4_OK;
  const int N = x->comm->size, me = x->comm->rank;
  const int next = (me + 1) % N, prev = (me + N - 1) % N;
  const int64_t w2 = 2 * w, ring = dsv4_xfer_ring_rows(w), cap = rows < ring ? rows : ring;
  const double t0 = dsv4_xfer_now();
  dsv4_comm_req *rq[2] = {NULL, NULL};
  for (int64_t r0 = 0; r0 < rows; r0 += ring) {
    const int64_t c = rows - r0 < ring ? rows - r0 : ring;
    const size_t bytes = sizeof(int64_t) * (size_t)(c * w2);
    if (N == 1) {
      slice_rows(src, row_of, 0, rows, r0, c, w2, mine + r0 * w2, 1);
      continue;
    }
    /* step j: send the running sum of slice me - 1 - j, receive that of slice me - 2 - j into the
     * other buffer (the last step into mine) and add this rank's rows of it there; after N - 1
     * steps the received slice is this rank's own, whole */
    int64_t *buf[2] = {tmp, tmp + cap * w2}, *out = buf[0];
    slice_rows(src, row_of, (me + N - 1) % N, rows, r0, c, w2, out, 1);
    for (int j = 0; j < N - 1; j++) {
      int64_t *dst = j == N - 2 ? mine + r0 * w2 : buf[(j + 1) & 1];
      DSV4_TRY(dsv4_comm_irecv(x->comm, dst, bytes, prev, RS_ROWS_TAG, &rq[0]));
      DSV4_TRY(dsv4_comm_isend(x->comm, out, bytes, next, RS_ROWS_TAG, &rq[1]));
      DSV4_TRY(dsv4_comm_wait(x->comm, rq, 2));
      slice_rows(src, row_of, (me + 2 * N - 2 - j) % N, rows, r0, c, w2, dst, 0);
      out = dst;
    }
  }
  const uint64_t vol = sizeof(int64_t) * (uint64_t)(rows * w2) * (uint64_t)(N - 1);
  account(x, DSV4_MSG_SLOT_REDUCE_SCATTER, vol, vol, 1, dsv4_xfer_now() - t0);
  for (int64_t r = 0; r < rows; r++) dsv4_xacc_normalize(mine + r * w2, mine + r * w2 + w, w);
fail:
  return rc;
}

/* The loss partials are 128-bit fixed point (util/exactsum.h); each rank's record is gathered and
 * summed in rank order, so every rank gets the same bits, equal to the one-rank sum. */
dsv4_status dsv4_xfer_loss(dsv4_xfer *x, dsv4_exactsum *sum, int64_t *count) {
  dsv4_status rc = DSV4_OK;
  dsv4_loss_rec mine = {*sum, *count}, *all = NULL;
  dsv4_comm_req *req = NULL;
  const int N = x->comm->size;
  DSV4_ALLOC(all, N);
  const double t0 = dsv4_xfer_now();
  DSV4_TRY(dsv4_comm_iallgather(x->comm, &mine, all, sizeof mine, &req));
  DSV4_TRY(dsv4_comm_wait(x->comm, &req, 1));
  account(x, DSV4_MSG_LOSS_REDUCE, sizeof mine * (uint64_t)(N - 1), sizeof mine * (uint64_t)(N - 1), 1,
          dsv4_xfer_now() - t0);
  *sum = 0;
  *count = 0;
  for (int r = 0; r < N; r++) {
    *sum += all[r].sum;
    *count += all[r].count;
  }
fail:
  free(all);
  return rc;
}

/* ---- counted verbs (the weight gradients' messages) ---------------------------------------------- */

dsv4_status dsv4_xfer_isend(dsv4_xfer *x, dsv4_msg_kind k, const void *buf, size_t bytes, int peer, int tag,
                            dsv4_comm_req **req) {
  dsv4_status rc = dsv4_comm_isend(x->comm, buf, bytes, peer, tag, req);
  if (rc == DSV4_OK) account(x, k, bytes, 0, 1, 0);
  return rc;
}

dsv4_status dsv4_xfer_irecv(dsv4_xfer *x, dsv4_msg_kind k, void *buf, size_t bytes, int peer, int tag,
                            dsv4_comm_req **req) {
  dsv4_status rc = dsv4_comm_irecv(x->comm, buf, bytes, peer, tag, req);
  if (rc == DSV4_OK) account(x, k, 0, bytes, 0, 0);
  return rc;
}

dsv4_status dsv4_xfer_wait(dsv4_xfer *x, dsv4_msg_kind k, dsv4_comm_req **reqs, int n) {
  const double t0 = dsv4_xfer_now();
  const dsv4_status rc = dsv4_comm_wait(x->comm, reqs, n);
  account(x, k, 0, 0, 0, dsv4_xfer_now() - t0);
  return rc;
}

dsv4_status dsv4_xfer_allgather(dsv4_xfer *x, dsv4_msg_kind k, const void *send, void *recv, size_t bytes) {
  dsv4_status rc = DSV4_OK;
  dsv4_comm_req *rq = NULL;
  const double t0 = dsv4_xfer_now();
  DSV4_TRY(dsv4_xfer_iallgather(x, k, send, recv, bytes, &rq));
  DSV4_TRY(dsv4_comm_wait(x->comm, &rq, 1));
  account(x, k, 0, 0, 0, dsv4_xfer_now() - t0);
fail:
  return rc;
}

dsv4_status dsv4_xfer_iallgather(dsv4_xfer *x, dsv4_msg_kind k, const void *send, void *recv, size_t bytes,
                                 dsv4_comm_req **req) {
  const dsv4_status rc = dsv4_comm_iallgather(x->comm, send, recv, bytes, req);
  const uint64_t vol = (uint64_t)bytes * (uint64_t)(x->comm->size - 1);
  if (rc == DSV4_OK) account(x, k, vol, vol, 1, 0);
  return rc;
}

dsv4_status dsv4_xfer_reduce_scatter_i64(dsv4_xfer *x, dsv4_msg_kind k, const int64_t *send, int64_t *recv, size_t n) {
  dsv4_status rc = DSV4_OK;
  const double t0 = dsv4_xfer_now();
  DSV4_TRY(dsv4_comm_reduce_scatter(x->comm, send, recv, n, DSV4_RED_I64));
  const uint64_t vol = sizeof(int64_t) * (uint64_t)n * (uint64_t)(x->comm->size - 1);
  account(x, k, vol, vol, 1, dsv4_xfer_now() - t0);
fail:
  return rc;
}

/* Tag of the chunked ring's messages (each pair's messages of one tag arrive in order). */
#define RS_EACH_TAG 29500

dsv4_status dsv4_xfer_reduce_scatter_i64_each(dsv4_xfer *x, dsv4_msg_kind k, int64_t *sums, size_t n, int64_t *in,
                                              size_t chunk, dsv4_i64_part_fn fin, void *ctx) {
  dsv4_status rc = DSV4_OK;
  const int N = x ? x->comm->size : 1, me = x ? x->comm->rank : 0;
  const int next = (me + 1) % N, prev = (me + N - 1) % N;
  const double t0 = dsv4_xfer_now();
  dsv4_comm_req *rq[2] = {NULL, NULL};
  DSV4_CHECK(chunk > 0, DSV4_ERR_ARG, "reduce-scatter: chunks of 0 elements");
  for (size_t c0 = 0; c0 < n; c0 += chunk) {
    const size_t c = n - c0 < chunk ? n - c0 : chunk;
    if (N == 1) {
      fin(ctx, c0, sums + c0, c);
      continue;
    }
    /* step j: send the running sum of slice me - 1 - j, receive that of slice me - 2 - j and add
     * this rank's part; after N - 1 steps the received slice is this rank's own, whole */
    const int64_t *out = sums + (size_t)((me + N - 1) % N) * n + c0;
    for (int j = 0; j < N - 1; j++) {
      int64_t *own = sums + (size_t)((me + 2 * N - 2 - j) % N) * n + c0, *dst = j == N - 2 ? in : own;
      DSV4_TRY(dsv4_comm_irecv(x->comm, in, sizeof(int64_t) * c, prev, RS_EACH_TAG, &rq[0]));
      DSV4_TRY(dsv4_comm_isend(x->comm, out, sizeof(int64_t) * c, next, RS_EACH_TAG, &rq[1]));
      DSV4_TRY(dsv4_comm_wait(x->comm, rq, 2));
      for (size_t i = 0; i < c; i++) dst[i] = (int64_t)((uint64_t)in[i] + (uint64_t)own[i]); /* wraps as MPI_SUM */
      out = dst;
    }
    fin(ctx, c0, in, c);
  }
  if (N > 1) {
    const uint64_t vol = sizeof(int64_t) * (uint64_t)n * (uint64_t)(N - 1);
    account(x, k, vol, vol, 1, dsv4_xfer_now() - t0);
  }
fail:
  return rc;
}

dsv4_status dsv4_xfer_allreduce_i64(dsv4_xfer *x, dsv4_msg_kind k, int64_t *buf, size_t n) {
  dsv4_status rc = DSV4_OK;
  const double t0 = dsv4_xfer_now();
  DSV4_TRY(dsv4_comm_allreduce(x->comm, buf, n, DSV4_RED_I64, DSV4_RED_SUM));
  const uint64_t vol = dsv4_xfer_allreduce_volume(sizeof(int64_t) * (uint64_t)n, x->comm->size);
  account(x, k, vol, vol, 1, dsv4_xfer_now() - t0);
fail:
  return rc;
}
