/* mpitest_cp_agree.c: run under mpirun (tests/test_cp.py). Ranks that disagree on their inputs
 * (packing meta, local row count, configuration) must ALL get DSV4_ERR_COMM from the patched
 * layer with a message saying what differs, and nobody may hang; afterwards a consistent call
 * works. And the MPI transport's own int64 reduce-scatter (a ring of pairwise exchanges, in
 * messages of at most DSV4_COMM_RING_INT64) gives MPI_Reduce_scatter_block's sums, wrapping ones
 * included, over several messages; and the chunked one the weight gradients' sums take
 * (dsv4_xfer_reduce_scatter_i64_each). And the weight gradients' exact sums between ranks
 * (dsv4_wgrad_exact) on shapes of several blocks and superblocks: one rank's bits. Rank 0 prints
 * one PASS/FAIL line per case for the whole group. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "cp/comm.h"
#include "cp/exchange.h"
#include "dsv4cp_mpi.h"
#include "model/wgrad.h"
#include "testutil.h"
#include "util/par.h"
#include "util/rng.h"

#define T_TOKENS 32

typedef struct {
  dsv4_config cfg;
  dsv4_weights *w;
  dsv4_layer *l;
  dsv4_comm *comm;
} setup;

static int make(setup *s, int window, MPI_Comm world) {
  memset(s, 0, sizeof *s);
  s->cfg = (dsv4_config)DSV4_CONFIG_INIT;
  if (dsv4_config_preset(&s->cfg, "tiny") != DSV4_OK) return 0;
  s->cfg.window = window;
  return dsv4_weights_create(&s->w, &s->cfg, 1) == DSV4_OK && dsv4_weights_init_random(s->w, 7) == DSV4_OK &&
         dsv4_layer_create(&s->l, &s->cfg, 1, s->w) == DSV4_OK && dsv4_comm_create_mpi(&s->comm, world) == DSV4_OK &&
         dsv4_cp_patch(dsv4_layer_core(s->l), s->comm, NULL) == DSV4_OK;
}

static void destroy(setup *s) {
  dsv4_layer_free(s->l);
  dsv4_weights_free(s->w);
  dsv4_comm_free(s->comm);
}

/* One forward with this rank's (possibly different) inputs; returns the status. */
static dsv4_status forward(setup *s, const int32_t *cu, int n_docs, int64_t n_local, char *msg) {
  float *x = calloc((size_t)(n_local * s->cfg.dim), sizeof(float));
  float *out = calloc((size_t)(n_local * s->cfg.dim), sizeof(float));
  int32_t *topk = calloc((size_t)(n_local * s->cfg.index_topk), sizeof(int32_t));
  float loss = 0;
  tu_fill(x, n_local * s->cfg.dim, 3, 1.0f);
  dsv4_packing pk = {DSV4_HEAD(dsv4_packing), .cu_seqlens = cu, .n_docs = n_docs, .T = T_TOKENS};
  dsv4_status st = tu_forward(s->l, out, topk, &loss, x, n_local, &pk, 0);
  snprintf(msg, 256, "%s", st == DSV4_OK ? "ok" : dsv4_last_error());
  free(x), free(out), free(topk);
  return st;
}

/* Rank 0 reports whether every rank got `want` and its message contains `needle`. */
static void verdict(const char *name, dsv4_status st, const char *msg, dsv4_status want, const char *needle,
                    int rank, int size) {
  int mine = st == want && (!needle || strstr(msg, needle)), all = 0;
  MPI_Reduce(&mine, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) tu_check(all == size, "%s: %d of %d ranks got the expected result (rank 0: %s)", name, all, size, msg);
}

/* The transport's int64 reduce-scatter against MPI's, over 2 full messages and a part of one. */
static void ring_sums(int rank, int size) {
  const size_t n = 2 * DSV4_COMM_RING_INT64 + 1001;
  int64_t *send = malloc(sizeof(int64_t) * n * (size_t)size), *got = malloc(sizeof(int64_t) * n);
  int64_t *want = malloc(sizeof(int64_t) * n);
  dsv4_comm *c = NULL;
  int ok = send && got && want && dsv4_comm_create_mpi(&c, MPI_COMM_WORLD) == DSV4_OK;
  for (size_t i = 0; ok && i < n * (size_t)size; i++) /* large values: some sums wrap, as MPI_SUM's do */
    send[i] = (int64_t)(dsv4_mix64((uint64_t)(rank * 7919) + i) >> (i % 3 ? 20 : 1));
  ok = ok && dsv4_comm_reduce_scatter(c, send, got, n, DSV4_RED_I64) == DSV4_OK &&
       MPI_Reduce_scatter_block(send, want, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS &&
       !memcmp(got, want, sizeof(int64_t) * n);
  int all = 0;
  MPI_Reduce(&ok, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0)
    tu_check(all == size, "transport: the ring's int64 reduce-scatter of %zu per rank equals MPI's on %d of %d ranks", n,
             all, size);
  dsv4_comm_free(c);
  free(send), free(got), free(want);
}

/* The chunked reduce-scatter (dsv4_xfer_reduce_scatter_i64_each: the weight gradients' sums) against
 * MPI's: every chunk of this rank's slice handed over once, in order, with MPI_Reduce_scatter_block's
 * sums (wrapping ones included); chunks that divide the slice and one that does not; counted as one
 * message of the whole volume. */
typedef struct {
  int64_t *got;
  size_t next;
  int in_order;
} parts;

static void take_part(void *ctx, size_t off, int64_t *part, size_t c) {
  parts *p = ctx;
  p->in_order &= off == p->next;
  memcpy(p->got + off, part, sizeof(int64_t) * c);
  p->next = off + c;
}

static void chunked_sums(int rank, int size) {
  const size_t n = 3 * 4096 + 77, chunks[] = {4096, 1000, n, 2 * n};
  int64_t *send = malloc(sizeof(int64_t) * n * (size_t)size), *sums = malloc(sizeof(int64_t) * n * (size_t)size);
  int64_t *want = malloc(sizeof(int64_t) * n), *in = malloc(sizeof(int64_t) * 2 * n);
  parts p = {malloc(sizeof(int64_t) * n), 0, 1};
  dsv4_xfer x = {0};
  int ok = send && sums && want && in && p.got && dsv4_comm_create_mpi(&x.comm, MPI_COMM_WORLD) == DSV4_OK;
  for (size_t i = 0; ok && i < n * (size_t)size; i++)
    send[i] = (int64_t)(dsv4_mix64((uint64_t)(rank * 104729) + i) >> (i % 5 ? 12 : 1));
  ok = ok && MPI_Reduce_scatter_block(send, want, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
  for (int k = 0; ok && k < 4; k++) {
    memcpy(sums, send, sizeof(int64_t) * n * (size_t)size);
    memset(p.got, 0, sizeof(int64_t) * n);
    p.next = 0, p.in_order = 1;
    const uint64_t before = x.stats.messages[DSV4_MSG_WGRAD_SUMS], sent = x.stats.bytes_sent[DSV4_MSG_WGRAD_SUMS];
    ok = dsv4_xfer_reduce_scatter_i64_each(&x, DSV4_MSG_WGRAD_SUMS, sums, n, in, chunks[k], take_part, &p) == DSV4_OK &&
         p.in_order && p.next == n && !memcmp(p.got, want, sizeof(int64_t) * n) &&
         x.stats.messages[DSV4_MSG_WGRAD_SUMS] == before + 1 &&
         x.stats.bytes_sent[DSV4_MSG_WGRAD_SUMS] == sent + sizeof(int64_t) * n * (uint64_t)(size - 1);
  }
  int all = 0;
  MPI_Reduce(&ok, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0)
    tu_check(all == size, "exchange: the chunked int64 reduce-scatter of %zu per rank (chunks of 4096, 1000, all) "
             "equals MPI's on %d of %d ranks", n, all, size);
  dsv4_comm_free(x.comm);
  free(send), free(sums), free(want), free(in), free(p.got);
}

/* The exact reduce-scatter of rows through a row map (dsv4_xfer_reduce_scatter_exact_rows: the
 * compressed kv gradient's sums under zigzag and batches) against the plain one on the array the
 * map describes, built: the same words on every rank, counted alike. Rows of 2 x 8192 (64 rows per
 * message: slices of 150 rows in three messages, the last one partial) and of 2 x 64 (one message);
 * about a fifth of the rows empty; a NULL source (no entries) gives zeros. tmp is exactly the room
 * exchange.h asks for, so a sanitized run catches a write past it. */
static void mapped_sums(int rank, int size) {
  static const int64_t widths[] = {8192, 64};
  const int64_t R = 150, G = R * size;
  dsv4_xfer x = {0};
  int ok = dsv4_comm_create_mpi(&x.comm, MPI_COMM_WORLD) == DSV4_OK;
  for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
    const int64_t w = widths[k], w2 = 2 * w, ring = dsv4_xfer_ring_rows(w),
                  room = dsv4_xfer_ring_room(R, w, size);
    int32_t *row_of = malloc(sizeof(int32_t) * (size_t)G);
    int64_t *src = malloc(sizeof(int64_t) * (size_t)(G * w2)),
            *all = calloc((size_t)(G * w2), sizeof(int64_t));
    int64_t *want = malloc(sizeof(int64_t) * (size_t)(R * w2)),
            *got = malloc(sizeof(int64_t) * (size_t)(R * w2));
    int64_t *tmp = room ? malloc(sizeof(int64_t) * (size_t)room) : NULL;
    int good = ok && row_of && src && all && want && got && (tmp || !room);
    int64_t ids = 0;
    for (int64_t g = 0; good && g < G; g++) /* the same map on every rank; ids in another order */
      row_of[g] = dsv4_mix64((uint64_t)g * 31 + k) % 5 == 0 ? -1 : (int32_t)ids++;
    for (int64_t g = 0; good && g < G / 2; g++) { /* reverse the ids' order */
      const int32_t t = row_of[g];
      row_of[g] = row_of[G - 1 - g], row_of[G - 1 - g] = t;
    }
    for (int64_t i = 0; good && i < ids * w2; i++) /* normalised rows: lo in [0, 2^56) */
      src[i] = (i % w2) < w ? (int64_t)(dsv4_mix64((uint64_t)rank * 7 + i) >> 40) - (1 << 23)
                            : (int64_t)(dsv4_mix64((uint64_t)rank * 13 + i) >> 8);
    for (int64_t g = 0; good && g < G; g++)
      if (row_of[g] >= 0) memcpy(all + g * w2, src + (int64_t)row_of[g] * w2, sizeof(int64_t) * (size_t)w2);
    const uint64_t *msgs = x.stats.messages + DSV4_MSG_SLOT_REDUCE_SCATTER;
    const uint64_t *sent = x.stats.bytes_sent + DSV4_MSG_SLOT_REDUCE_SCATTER, m0 = *msgs, s0 = *sent;
    /* every rank makes every call (a rank whose check failed must not leave the others waiting);
     * only a failed set-up skips them, as it fails everywhere alike */
    const int set = good;
    good = set && dsv4_xfer_reduce_scatter_exact(&x, all, want, R, w) == DSV4_OK;
    const uint64_t m1 = *msgs, s1 = *sent;
    good = (set && dsv4_xfer_reduce_scatter_exact_rows(&x, src, row_of, got, R, w, tmp) == DSV4_OK) && good &&
           !memcmp(got, want, sizeof(int64_t) * (size_t)(R * w2)) && *msgs - m1 == 1 && m1 - m0 == 1 &&
           *sent - s1 == s1 - s0 && s1 > s0;
    if (set) memset(got, 1, sizeof(int64_t) * (size_t)(R * w2));
    good = (set && dsv4_xfer_reduce_scatter_exact_rows(&x, NULL, row_of, got, R, w, tmp) == DSV4_OK) && good;
    for (int64_t i = 0; good && i < R * w2; i++) good = got[i] == 0;
    int all_ok = 0;
    MPI_Reduce(&good, &all_ok, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
      tu_check(all_ok == size,
               "exchange: the exact reduce-scatter through a row map (rows of 2 x %lld, %lld per "
               "message) equals the built array's on %d of %d ranks",
               (long long)w, (long long)ring, all_ok, size);
    free(row_of), free(src), free(all), free(want), free(got), free(tmp);
  }
  dsv4_comm_free(x.comm);
}

/* dsv4_wgrad_exact's sums path (DSV4_WGRAD_ROWS=never) over the ranks' shards of a 2600-row stream
 * (5 panels of 512 and one of 40; the shards cut panels) against one rank's whole stream, bitwise,
 * on every rank. Shapes of several blocks, which the layer tests' tiny weights never have: 6 blocks
 * (superblocks of 4 and 2; the last one's strip lies across the ranks' slices at two ranks); 9 in
 * block rows of 3 (strips across the slices) with a last block row of 476 rows; 4 with a last block
 * column of 388 and a last block row of 188. Groups of 8 panels (a strip's sums in one pass) and
 * of 2 (DSV4_WGRAD_GROUP=2: the sums in memory between groups). */
static void wgrad_sums_paths(int rank, int size) {
  static const int64_t shape[][2] = {{1536, 1024}, {1500, 1536}, {700, 900}};
  static const char *const mode[][2] = {{NULL, NULL}, {"DSV4_WGRAD_GROUP", "2"}};
  const int64_t T = 2600, P = 512, lo = T * rank / size, hi = T * (rank + 1) / size;
  int64_t *glob = malloc(sizeof(int64_t) * T);
  for (int64_t i = 0; glob && i < T; i++) glob[i] = i;
  dsv4_xfer x = {0};
  int ok = glob && dsv4_comm_create_mpi(&x.comm, MPI_COMM_WORLD) == DSV4_OK;
  setenv("DSV4_WGRAD_ROWS", "never", 1); /* the sums path (these streams would send rows) */
  const int old = dsv4_threads_enter(2);
  for (size_t c = 0; c < sizeof shape / sizeof shape[0]; c++) {
    const int64_t M = shape[c][0], N = shape[c][1];
    float *A = malloc(sizeof(float) * T * M), *B = malloc(sizeof(float) * T * N);
    float *one = calloc((size_t)(M * N), sizeof(float)), *cp = malloc(sizeof(float) * (size_t)(M * N));
    int same = A && B && one && cp;
    if (same) {
      tu_fill(A, T * M, 11 + c, 1.0f);
      tu_fill(B, T * N, 12 + c, 1.0f);
    }
    const dsv4_wshape sh = {M, N, P, T};
    const dsv4_wpiece whole = {.n = T, .A = A, .B = B, .lda = M, .ldb = N, .glob = glob};
    const dsv4_wpiece mine = {.n = hi - lo, .A = A + lo * M, .B = B + lo * N, .lda = M, .ldb = N, .glob = glob + lo};
    same = same && dsv4_wgrad_exact(NULL, &sh, &whole, 1, one, DSV4_IMPL_FAST, "test") == DSV4_OK;
    for (size_t m = 0; m < sizeof mode / sizeof mode[0]; m++) {
      if (mode[m][0]) setenv(mode[m][0], mode[m][1], 1);
      int got = 0;
      if (cp) memset(cp, 0, sizeof(float) * (size_t)(M * N));
      const dsv4_status st = ok && cp ? dsv4_wgrad_exact(&x, &sh, &mine, 1, cp, DSV4_IMPL_FAST, "test") : DSV4_ERR_NOMEM;
      got = same && st == DSV4_OK && !memcmp(one, cp, sizeof(float) * (size_t)(M * N));
      if (mode[m][0]) unsetenv(mode[m][0]);
      int all = 0;
      MPI_Reduce(&got, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0)
        tu_check(all == size, "wgrad sums between ranks: %lld x %lld, %s: one rank's bits on %d of %d ranks",
                 (long long)M, (long long)N, mode[m][0] ? "groups of 2" : "groups of 8", all, size);
    }
    free(A), free(B), free(one), free(cp);
  }
  dsv4_threads_leave(old);
  unsetenv("DSV4_WGRAD_ROWS");
  if (!ok && rank == 0) tu_fail("wgrad sums between ranks: set-up");
  dsv4_comm_free(x.comm);
  free(glob);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  setup s;
  char msg[256];
  const int64_t L = T_TOKENS / size;
  int ok = make(&s, 16, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (rank == 0) tu_fail("set-up: %s", dsv4_last_error());
    MPI_Finalize();
    return rank == 0 ? tu_finish() : 1;
  }
  /* T = 32 splits over 2 or 4 ranks; over 3 it does not, which is also a consistent error; the
   * cases below only need the ranks to disagree. */
  const int32_t cu_a[3] = {0, 16, 32}, cu_b[3] = {0, 8, 32};
  dsv4_status st = forward(&s, rank == 0 ? cu_a : cu_b, 2, L, msg);
  verdict("ranks disagree on cu_seqlens", st, msg, DSV4_ERR_COMM, "packing", rank, size);
  st = forward(&s, cu_a, 2, rank == size - 1 ? L + 4 : L, msg);
  verdict("ranks hold different row counts", st, msg, DSV4_ERR_COMM, "local rows", rank, size);
  destroy(&s);
  if (!make(&s, rank == 0 ? 16 : 8, MPI_COMM_WORLD)) { /* rank 0 has another sliding window */
    tu_fail("set-up with another window on rank %d: %s", rank, dsv4_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  st = forward(&s, cu_a, 2, L, msg);
  verdict("ranks disagree on the configuration", st, msg, DSV4_ERR_COMM, "configuration", rank, size);
  destroy(&s);
  if (!make(&s, 16, MPI_COMM_WORLD)) {
    tu_fail("set-up again on rank %d: %s", rank, dsv4_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  st = forward(&s, cu_a, 2, L, msg);
  if (T_TOKENS % size == 0)
    verdict("consistent inputs afterwards succeed", st, msg, DSV4_OK, NULL, rank, size);
  else
    verdict("an indivisible split fails on every rank", st, msg, DSV4_ERR_ARG, "multiple of", rank, size);
  destroy(&s);
  ring_sums(rank, size);
  chunked_sums(rank, size);
  mapped_sums(rank, size);
  wgrad_sums_paths(rank, size);
  MPI_Finalize();
  return rank == 0 ? tu_finish() : 0;
}
