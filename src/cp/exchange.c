/* exchange.c: the CP implementation of the core's exchange: every message of both stages, forward
 * and backward, with byte and time accounting per message kind.
 *
 * Byte counts per rank (what --stats prints and docs/cp.md plans):
 *   point-to-point (halos): the bytes of each message sent / received;
 *   all-gather and reduce-scatter of B bytes per rank: (N - 1) B sent and received (the ring
 *   algorithm's volume, whichever algorithm MPI picks);
 *   loss reduce: an all-gather of one 24-byte record per rank. */
#include <string.h>
#include <time.h>

#include "cp_state.h"
#include "util/err.h"

/* Message tags (one per kind and compressor, so concurrent exchanges never match each other). */
enum { TAG_WIN = 100, TAG_WIN_BWD = 101, TAG_CMP_HALF = 110, TAG_CMP_FULL = 112, TAG_CMP_HALF_BWD = 120,
       TAG_CMP_FULL_BWD = 122 };

double cp_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

void cp_account(dsv4_cp_stats *s, dsv4_msg_kind k, uint64_t sent, uint64_t recv, uint64_t msgs, double secs) {
  s->bytes_sent[k] += sent;
  s->bytes_recv[k] += recv;
  s->messages[k] += msgs;
  s->seconds[k] += secs;
}

static dsv4_status reserve(cp_state *st, size_t floats) {
  dsv4_status rc = DSV4_OK;
  if (floats <= st->buf_cap) return DSV4_OK;
  free(st->sendbuf);
  free(st->recvbuf);
  st->sendbuf = malloc(sizeof(float) * floats);
  st->recvbuf = malloc(sizeof(float) * floats);
  st->buf_cap = floats;
  DSV4_CHECK(st->sendbuf && st->recvbuf, DSV4_ERR_NOMEM, "cp: out of memory for halo buffers");
fail:
  if (rc != DSV4_OK) st->buf_cap = 0;
  return rc;
}

/* Moves halo rows along a plan. Each row carries `width` floats of every array in bufs[0..nb),
 * starting at column col0 (row stride ld). Forward: owners' rows -> halo rows (copied).
 * Backward (reverse = 1): halo rows -> owners' rows (added), the transpose of the forward. */
static dsv4_status move_rows(cp_state *st, const cp_plan *p, float *const *bufs, int nb, int64_t ld,
                             int64_t col0, int64_t width, int tag, int reverse, dsv4_msg_kind kind) {
  dsv4_status rc = DSV4_OK;
  dsv4_comm_req **reqs = NULL;
  const int n_out = reverse ? p->n_recv : p->n_send, n_in = reverse ? p->n_send : p->n_recv;
  const cp_msg *out = reverse ? p->recv : p->send, *in = reverse ? p->send : p->recv;
  const int64_t per_row = width * nb;
  size_t tot_out = 0, tot_in = 0;
  for (int i = 0; i < n_out; i++) tot_out += (size_t)(out[i].n * per_row);
  for (int i = 0; i < n_in; i++) tot_in += (size_t)(in[i].n * per_row);
  DSV4_TRY(reserve(st, (tot_out > tot_in ? tot_out : tot_in) + 1));
  DSV4_ALLOC(reqs, n_out + n_in + 1);
  const double t0 = cp_now();
  size_t off = 0;
  for (int i = 0; i < n_in; i++) {
    DSV4_TRY(dsv4_comm_irecv(st->comm, st->recvbuf + off, sizeof(float) * (size_t)(in[i].n * per_row),
                             in[i].peer, tag, &reqs[i]));
    off += (size_t)(in[i].n * per_row);
  }
  off = 0;
  for (int i = 0; i < n_out; i++) {
    float *b = st->sendbuf + off;
    for (int64_t k = 0; k < out[i].n; k++)
      for (int a = 0; a < nb; a++)
        memcpy(b + (k * nb + a) * width, bufs[a] + out[i].rows[k] * ld + col0, sizeof(float) * (size_t)width);
    DSV4_TRY(dsv4_comm_isend(st->comm, b, sizeof(float) * (size_t)(out[i].n * per_row), out[i].peer, tag,
                             &reqs[n_in + i]));
    off += (size_t)(out[i].n * per_row);
  }
  /* rows this rank holds itself: no message */
  for (int64_t k = 0; k < p->n_self; k++)
    for (int a = 0; a < nb; a++) {
      const float *src = bufs[a] + (reverse ? p->self_dst[k] : p->self_src[k]) * ld + col0;
      float *dst = bufs[a] + (reverse ? p->self_src[k] : p->self_dst[k]) * ld + col0;
      for (int64_t e = 0; e < width; e++) dst[e] = reverse ? dst[e] + src[e] : src[e];
    }
  DSV4_TRY(dsv4_comm_wait(st->comm, reqs, n_out + n_in));
  off = 0;
  for (int i = 0; i < n_in; i++) {
    const float *b = st->recvbuf + off;
    for (int64_t k = 0; k < in[i].n; k++)
      for (int a = 0; a < nb; a++) {
        float *dst = bufs[a] + in[i].rows[k] * ld + col0;
        const float *src = b + (k * nb + a) * width;
        for (int64_t e = 0; e < width; e++) dst[e] = reverse ? dst[e] + src[e] : src[e];
      }
    off += (size_t)(in[i].n * per_row);
  }
  cp_account(&st->stats, kind, sizeof(float) * tot_out, sizeof(float) * tot_in, (uint64_t)n_out,
             cp_now() - t0);
fail:
  free(reqs);
  return rc;
}

/* Compressor halo rows of C and Z: r == 4 rows of a previous window carry their FIRST half of the
 * channels (the only half a next slot reads), rows of a straddling slot's own window carry all
 * of them. Projected rows, not raw x rows: 2 cD floats per row against d (docs/cp.md). */
static dsv4_status cmp_halo_move(cp_state *st, float *C, float *Z, int cD, int which, int reverse) {
  dsv4_status rc = DSV4_OK;
  float *bufs[2] = {C, Z};
  const dsv4_msg_kind kind = reverse ? DSV4_MSG_COMPRESSOR_HALO_BWD : DSV4_MSG_COMPRESSOR_HALO;
  DSV4_TRY(move_rows(st, &st->cmp_half, bufs, 2, cD, 0, cD / 2, (reverse ? TAG_CMP_HALF_BWD : TAG_CMP_HALF) + which,
                     reverse, kind));
  DSV4_TRY(move_rows(st, &st->cmp_full, bufs, 2, cD, 0, cD, (reverse ? TAG_CMP_FULL_BWD : TAG_CMP_FULL) + which,
                     reverse, kind));
fail:
  return rc;
}

static dsv4_status x_cmp_halo(void *s, const dsv4_layout *lay, float *C, float *Z, int cD, int which) {
  (void)lay;
  return cmp_halo_move(s, C, Z, cD, which, 0);
}

static dsv4_status x_cmp_halo_bwd(void *s, const dsv4_layout *lay, float *dC, float *dZ, int cD, int which) {
  (void)lay;
  return cmp_halo_move(s, dC, dZ, cD, which, 1);
}

static dsv4_status x_win_halo(void *s, const dsv4_layout *lay, float *kv_ext, int D) {
  (void)lay;
  return move_rows(s, &((cp_state *)s)->win, &kv_ext, 1, D, 0, D, TAG_WIN, 0, DSV4_MSG_WINDOW_HALO);
}

static dsv4_status x_win_halo_bwd(void *s, const dsv4_layout *lay, float *d_kv_ext, int D) {
  (void)lay;
  return move_rows(s, &((cp_state *)s)->win, &d_kv_ext, 1, D, 0, D, TAG_WIN_BWD, 1, DSV4_MSG_WINDOW_HALO_BWD);
}

static dsv4_status x_gather_start(void *s, const dsv4_layout *lay, const float *local, float *all, int D,
                                  int which) {
  cp_state *st = s;
  st->gather_bytes[which] = sizeof(float) * (size_t)(lay->n_blk * D);
  st->gather_t0[which] = cp_now();
  return dsv4_comm_iallgather(st->comm, local, all, st->gather_bytes[which], &st->gather_req[which]);
}

static dsv4_status x_gather_wait(void *s, int which) {
  cp_state *st = s;
  const double t0 = cp_now();
  dsv4_status rc = dsv4_comm_wait(st->comm, &st->gather_req[which], 1);
  const double t1 = cp_now();
  /* hidden: the part of the all-gather's lifetime spent computing instead of waiting */
  const uint64_t vol = (uint64_t)st->gather_bytes[which] * (uint64_t)(st->comm->size - 1);
  cp_account(&st->stats, DSV4_MSG_SLOT_ALLGATHER, vol, vol, 1, t1 - t0);
  st->stats.hidden_seconds += t0 - st->gather_t0[which];
  st->stats.overlap_window_seconds += t1 - st->gather_t0[which];
  return rc;
}

static void x_progress(void *s) {
  cp_state *st = s;
  dsv4_comm_test(st->comm, st->gather_req, 2);
}

static void x_drain(void *s) {
  cp_state *st = s;
  dsv4_comm_wait(st->comm, st->gather_req, 2);
}

static dsv4_status x_blocks_rs(void *s, const dsv4_layout *lay, const float *d_all, float *d_local, int D,
                               int which) {
  cp_state *st = s;
  (void)which;
  const double t0 = cp_now();
  dsv4_status rc = dsv4_comm_reduce_scatter(st->comm, d_all, d_local, (size_t)(lay->n_blk * D));
  const uint64_t vol = sizeof(float) * (uint64_t)(lay->n_blk * D) * (uint64_t)(st->comm->size - 1);
  cp_account(&st->stats, DSV4_MSG_SLOT_REDUCE_SCATTER, vol, vol, 1, cp_now() - t0);
  return rc;
}

/* The loss partials are 128-bit fixed point (util/exactsum.h); each rank's record is gathered and
 * summed in rank order, so every rank gets the same bits, equal to the one-rank sum. */
static dsv4_status x_reduce_loss(void *s, dsv4_exactsum *sum, int64_t *count) {
  dsv4_status rc = DSV4_OK;
  cp_state *st = s;
  cp_loss_rec mine = {*sum, *count}, *all = NULL;
  dsv4_comm_req *req = NULL;
  const int N = st->comm->size;
  DSV4_ALLOC(all, N);
  const double t0 = cp_now();
  DSV4_TRY(dsv4_comm_iallgather(st->comm, &mine, all, sizeof mine, &req));
  DSV4_TRY(dsv4_comm_wait(st->comm, &req, 1));
  cp_account(&st->stats, DSV4_MSG_LOSS_REDUCE, sizeof mine * (uint64_t)(N - 1), sizeof mine * (uint64_t)(N - 1),
             1, cp_now() - t0);
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

dsv4_status cp_agree(void *s, const dsv4_core *c, const dsv4_packing *pk, int64_t n_local);
dsv4_status cp_make_layout(void *s, const dsv4_docs *docs, int64_t n_local, int W, dsv4_layout *lay);

const dsv4_exchange *cp_exchange(cp_state *st, dsv4_exchange *x) {
  *x = (dsv4_exchange){.st = st,
                       .nranks = st->comm->size,
                       .agree = cp_agree,
                       .layout = cp_make_layout,
                       .cmp_halo = x_cmp_halo,
                       .gather_start = x_gather_start,
                       .gather_wait = x_gather_wait,
                       .progress = x_progress,
                       .drain = x_drain,
                       .win_halo = x_win_halo,
                       .reduce_loss = x_reduce_loss,
                       .win_halo_bwd = x_win_halo_bwd,
                       .blocks_reduce_scatter = x_blocks_rs,
                       .cmp_halo_bwd = x_cmp_halo_bwd};
  return x;
}
