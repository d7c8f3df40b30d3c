/* exchange.h: every message of two-stage CP, driven by a plan (plan/plan.h), with byte and time
 * accounting per message kind. The stages (model/stage_*.c) call these verbs; the transport below
 * them is a dsv4_comm (cp/comm.h): the one-rank communicator moves nothing (its halo plans hold
 * only rows a rank has itself, its all-gather is a copy), so one rank runs the same code as N.
 *
 * Byte counts per rank (what --stats prints and docs/cp.md plans):
 *   point-to-point (halos): the bytes of each message sent / received;
 *   all-gather and reduce-scatter of B bytes per rank: (N - 1) B sent and received (the ring
 *   algorithm's volume, whichever algorithm MPI picks);
 *   agreement: an all-reduce of DSV4_AGREE_VALUES int64, counted as 2 (N - 1) / N of its bytes;
 *   loss reduce: an all-gather of one dsv4_loss_rec per rank.
 * Nothing is counted on a one-rank communicator. */
#ifndef DSV4_EXCHANGE_H
#define DSV4_EXCHANGE_H

#include "cp/comm.h"
#include "plan/plan.h"
#include "util/exactsum.h"

/* Values of the agreement all-reduce: each of 5 quantities as (max, -min). */
#define DSV4_AGREE_VALUES 10

/* The KL loss partial each rank all-gathers: exact sum and valid count (32 bytes with the
 * alignment of the 128-bit sum). */
typedef struct {
  dsv4_exactsum sum;
  int64_t count;
} dsv4_loss_rec;

/* Slots of pending all-gathers: the main compressor's and the indexer's. */
enum { DSV4_GATHER_MAIN = 0, DSV4_GATHER_INDEX = 1, DSV4_GATHERS = 2 };

/* The transport state of one object (core): its communicator, the overlap choice, the counters,
 * pending all-gathers and the halo packing buffers (kept across calls). */
typedef struct {
  dsv4_comm *comm;
  int overlap;                  /* 1: all-gathers run while the window phase computes; 0: blocking */
  dsv4_cp_stats stats;
  dsv4_comm_req *gather_req[DSV4_GATHERS];
  size_t gather_bytes[DSV4_GATHERS];
  double gather_t0[DSV4_GATHERS];
  float *sendbuf, *recvbuf;
  size_t buf_cap;
} dsv4_xfer;

void dsv4_xfer_free(dsv4_xfer *x);
/* The caller's dsv4_cp_stats (its struct_size) = src; one of 0.2.x's size keeps that layout (the
 * kinds it knew). */
dsv4_status dsv4_cp_stats_out(dsv4_cp_stats *dst, const dsv4_cp_stats *src);
double dsv4_xfer_now(void);

/* Collective, first of every forward: all ranks agree on the configuration (cfg_hash), the packing
 * meta, the local row count, the split and the BLAS's rounding (dsv4_blas_fingerprint), so that an
 * input that differs between ranks fails on every rank with the same message instead of hanging
 * one, and ranks whose products round differently fail instead of losing CP = 1's bits silently. */
dsv4_status dsv4_xfer_agree(dsv4_xfer *x, uint64_t cfg_hash, const dsv4_packing *pk, int64_t n_local,
                            dsv4_split split);

/* Moves halo rows along plan h. Each row carries `width` floats of every array in bufs[0..nb),
 * starting at column col0 (row stride ld). Forward: owners' rows -> halo rows (copied). Backward
 * (reverse = 1): halo rows -> owners' rows (added), the transpose of the forward. Collective over
 * the ranks the plan names (every rank calls it with the same tag). */
dsv4_status dsv4_xfer_halo(dsv4_xfer *x, const dsv4_halo_plan *h, float *const *bufs, int nb, int64_t ld,
                           int64_t col0, int64_t width, int tag, int reverse, dsv4_msg_kind kind);
/* The backward over exact rows (util/xacc.h: acc is rows of 2 w int64): halo rows go to their
 * owners and are merged there with integer adds, so an owner's sums do not depend on which rank
 * computed which terms. */
dsv4_status dsv4_xfer_halo_exact_bwd(dsv4_xfer *x, const dsv4_halo_plan *h, int64_t *acc, int64_t w, int tag,
                                     dsv4_msg_kind kind);

/* Stage 1's all-gather of `bytes` per rank from local into all ([N] x bytes): start, then wait.
 * With overlap 0 the start completes it (blocking) and the wait only accounts. Collective. */
dsv4_status dsv4_xfer_gather_start(dsv4_xfer *x, int slot, const void *local, void *all, size_t bytes);
dsv4_status dsv4_xfer_gather_wait(dsv4_xfer *x, int slot);
/* Lets started all-gathers progress (from the calling thread, between queries). */
void dsv4_xfer_progress(dsv4_xfer *x);
/* Completes any started all-gather (the error path, before buffers go). */
void dsv4_xfer_drain(dsv4_xfer *x);

/* The backward of the all-gather, over exact rows (util/xacc.h: rows x 2 w int64 per rank):
 * mine = the sum over ranks of all[rank * rows ..]; the sums do not depend on N. Collective. */
dsv4_status dsv4_xfer_reduce_scatter_exact(dsv4_xfer *x, const int64_t *all, int64_t *mine, int64_t rows, int64_t w);
/* The same sums where the rows lie in another order: row g of the [N rows] array above is
 * src[row_of[g]] (zeros where row_of[g] < 0, or src is NULL), and that array is never built (N rows
 * of 16 w bytes on every rank: 8 GiB of a CSA rank's compressed kv gradient at 4M tokens). A ring
 * of pairwise exchanges of at most dsv4_xfer_ring_rows(w) rows (N - 1 steps per chunk) through tmp,
 * [min(rows, ring rows) x 2 w] int64 once for N = 2 and twice for N > 2; the same integers as the
 * built array's reduce-scatter, so the same bits. Counted as it (one message, the same volume).
 * Collective. */
dsv4_status dsv4_xfer_reduce_scatter_exact_rows(dsv4_xfer *x, const int64_t *src, const int32_t *row_of,
                                                int64_t *mine, int64_t rows, int64_t w, int64_t *tmp);
/* Rows of 2 w int64 in one message of that ring (the transport's int64 message size, cp/comm.h),
 * and the int64 its tmp needs for slices of `rows` rows over `size` ranks. */
static inline int64_t dsv4_xfer_ring_rows(int64_t w) {
  const int64_t r = (int64_t)DSV4_COMM_RING_INT64 / (2 * w);
  return r > 0 ? r : 1;
}
static inline int64_t dsv4_xfer_ring_room(int64_t rows, int64_t w, int size) {
  const int64_t ring = dsv4_xfer_ring_rows(w), bufs = size > 2 ? 2 : size - 1;
  return bufs * (rows < ring ? rows : ring) * 2 * w;
}

/* The KL loss partials (exact) and valid counts summed over ranks, in place; every rank gets the
 * same bits, equal to the one-rank sum. Collective. */
dsv4_status dsv4_xfer_loss(dsv4_xfer *x, dsv4_exactsum *sum, int64_t *count);

/* ---- counted verbs: the backward's weight-gradient messages (model/wgrad.c) -----------------------
 * The transport's verbs with the accounting above under kind k: a point-to-point send counts its
 * bytes as sent and one message, a receive its bytes as received; dsv4_xfer_wait the time waited;
 * an all-gather or reduce-scatter of B bytes per rank (N - 1) B each way and one message; an
 * all-reduce of B bytes 2 (N - 1) B / N each way and one message (the ring's volume, as the
 * agreement). x may be NULL (one rank: nothing to send). plan/traffic.c counts the same. */
dsv4_status dsv4_xfer_isend(dsv4_xfer *x, dsv4_msg_kind k, const void *buf, size_t bytes, int peer, int tag,
                            dsv4_comm_req **req);
dsv4_status dsv4_xfer_irecv(dsv4_xfer *x, dsv4_msg_kind k, void *buf, size_t bytes, int peer, int tag,
                            dsv4_comm_req **req);
dsv4_status dsv4_xfer_wait(dsv4_xfer *x, dsv4_msg_kind k, dsv4_comm_req **reqs, int n);
/* recv [N x bytes] = every rank's send; blocking. */
dsv4_status dsv4_xfer_allgather(dsv4_xfer *x, dsv4_msg_kind k, const void *send, void *recv, size_t bytes);
/* The same, started: complete it with dsv4_xfer_wait (which counts the time waited). */
dsv4_status dsv4_xfer_iallgather(dsv4_xfer *x, dsv4_msg_kind k, const void *send, void *recv, size_t bytes,
                                 dsv4_comm_req **req);
/* recv [n] = the sum over ranks of send [rank * n ..], int64 (exact). */
dsv4_status dsv4_xfer_reduce_scatter_i64(dsv4_xfer *x, dsv4_msg_kind k, const int64_t *send, int64_t *recv, size_t n);
/* The same sums, this rank's slice handed to fin chunk by chunk while it is still in cache:
 * fin(ctx, off, part, c) gets elements [off, off + c) of the slice's total in part (which it may
 * change). A ring of pairwise exchanges of at most `chunk` elements (N - 1 steps per chunk), the
 * running sums written over the sums' own slices (sums [N x n] is overwritten); in: `chunk` int64
 * of room. No slice-sized result is written and read back, which is most of the memory traffic of
 * reduce-scattering the weight gradients' sums. Counted as dsv4_xfer_reduce_scatter_i64 (one
 * message, the same volume). Collective. */
typedef void (*dsv4_i64_part_fn)(void *ctx, size_t off, int64_t *part, size_t c);
dsv4_status dsv4_xfer_reduce_scatter_i64_each(dsv4_xfer *x, dsv4_msg_kind k, int64_t *sums, size_t n, int64_t *in,
                                              size_t chunk, dsv4_i64_part_fn fin, void *ctx);
/* buf [n] = its sum over ranks, int64 (exact). */
dsv4_status dsv4_xfer_allreduce_i64(dsv4_xfer *x, dsv4_msg_kind k, int64_t *buf, size_t n);
/* The accounted volume of an all-reduce of `bytes` over `size` ranks, each way (the planner's too). */
static inline uint64_t dsv4_xfer_allreduce_volume(uint64_t bytes, int size) {
  return size > 1 ? 2 * bytes * (uint64_t)(size - 1) / (uint64_t)size : 0;
}

#endif
