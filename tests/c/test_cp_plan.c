/* test_cp_plan.c: the index arithmetic of two-stage CP on worked examples (the same ones as
 * docs/cp.md): shard segments, halo sizes, the gather index, the halo plans; and the operators'
 * layout rules. All on the host, no ranks needed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/placement.h"
#include "plan/offload.h"
#include "plan/plan.h"
#include "plan/shard.h"
#include "testutil.h"
#include "util/gemm.h"

static int same_i32(const int32_t *a, const int32_t *b, int n) { return n == 0 || !memcmp(a, b, sizeof(int32_t) * (size_t)n); }

static void shards(void) {
  int32_t cu2[3] = {0, 8, 16};
  struct {
    const char *what;
    dsv4_packing pk;
    dsv4_split split;
    int rank;
    int n;
    int64_t g0[2], len[2];
  } ex[] = {
      {"contiguous T=16 N=2 rank 1", TU_PACKING(NULL, NULL, 0, 16, 0), DSV4_SPLIT_CONTIGUOUS, 1, 1, {8}, {8}},
      {"zigzag T=16 N=2 rank 0 holds chunks 0 and 3", TU_PACKING(NULL, NULL, 0, 16, 0), DSV4_SPLIT_ZIGZAG, 0, 2, {0, 12}, {4, 4}},
      {"zigzag T=16 N=2 rank 1 holds chunks 1 and 2", TU_PACKING(NULL, NULL, 0, 16, 0), DSV4_SPLIT_ZIGZAG, 1, 2, {4, 8}, {4, 4}},
      {"batched B=2 S=8 N=2 rank 1: S/N of every sequence", TU_PACKING(cu2, NULL, 2, 16, 1), DSV4_SPLIT_CONTIGUOUS, 1, 2, {4, 12}, {4, 4}},
      {"contiguous T=6 N=2 rank 1: any length, no alignment", TU_PACKING(NULL, NULL, 0, 6, 0), DSV4_SPLIT_CONTIGUOUS, 1, 1, {3}, {3}},
  };
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    dsv4_range *s = NULL;
    int n = 0;
    dsv4_status st = dsv4_shard_segments(&ex[i].pk, ex[i].split, ex[i].rank, 2, &s, &n);
    int ok = st == DSV4_OK && n == ex[i].n;
    for (int k = 0; ok && k < n; k++) ok = s[k].g0 == ex[i].g0[k] && s[k].len == ex[i].len[k];
    tu_check(ok, "shard: %s", ex[i].what);
    free(s);
  }
  dsv4_packing pk = TU_PACKING(NULL, NULL, 0, 18, 0);
  dsv4_range *s = NULL;
  int n = 0;
  dsv4_status st = dsv4_shard_segments(&pk, DSV4_SPLIT_CONTIGUOUS, 0, 4, &s, &n);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "multiple of 4") && strstr(dsv4_last_error(), "pad to 20"),
           "shard: T = 18 over 4 ranks is refused, naming the multiple (%s)", dsv4_last_error());
  pk.T = 12;
  st = dsv4_shard_segments(&pk, DSV4_SPLIT_ZIGZAG, 0, 4, &s, &n);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "multiple of 8") && strstr(dsv4_last_error(), "zigzag"),
           "shard: zigzag T = 12 over 4 ranks needs a multiple of 8 (%s)", dsv4_last_error());
  int32_t cub[3] = {0, 64, 128};
  dsv4_packing bad = TU_PACKING(cub, NULL, 2, 100, 1);
  st = dsv4_shard_segments(&bad, DSV4_SPLIT_CONTIGUOUS, 0, 2, &s, &n);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "T = 100"), "shard: a batch whose cu_seqlens disagree with T (%s)",
           dsv4_last_error());
  pk.T = 24; /* L = 6 with r = 4 or 128: accepted now, windows may straddle ranks */
  st = dsv4_shard_segments(&pk, DSV4_SPLIT_CONTIGUOUS, 3, 4, &s, &n);
  tu_check(st == DSV4_OK && n == 1 && s[0].g0 == 18 && s[0].len == 6, "shard: T = 24 over 4 ranks, L = 6");
  free(s);
}

/* Every rank's layout of a packing (caller frees with free_all); NULL when the packing is refused. */
static dsv4_layout *layouts(const int32_t *cu, const int32_t *real, int n_docs, int T, int r, int N, int W,
                            dsv4_split split, dsv4_docs *docs) {
  dsv4_packing pk = TU_PACKING(cu, real, n_docs, T, 0);
  if (!tu_ok(dsv4_docs_build(docs, &pk, r), "packing accepted")) return NULL;
  dsv4_layout *lays = NULL;
  int ok = dsv4_layouts_all(docs, &pk, split, N, W, &lays) == DSV4_OK;
  if (ok && r > 0) { /* rank 0's copy of the gather index (every rank derives the same) */
    ok = (lays[0].gather = calloc((size_t)docs->n_cmp + 1, sizeof(int32_t))) != NULL;
    for (int q = 0; ok && q < N; q++) dsv4_layout_set_gather(&lays[q], q, lays[0].gather);
  }
  if (!tu_check(ok, "layouts of %d ranks built", N)) {
    for (int q = 0; lays && q < N; q++) dsv4_layout_free(&lays[q]);
    free(lays);
    dsv4_docs_free(docs);
    return NULL;
  }
  return lays;
}

static void free_all(dsv4_layout *lays, int N, dsv4_docs *docs) {
  for (int q = 0; q < N; q++) dsv4_layout_free(&lays[q]);
  free(lays);
  dsv4_docs_free(docs);
}

/* Checks every rank's window halo, compressor halo (all rows / every-channel rows) and owned slots. */
static void expect_halos(const char *what, const dsv4_layout *l, int N, const int64_t *win, const int64_t *ch,
                         const int64_t *cf, const int64_t *own) {
  for (int q = 0; q < N; q++) {
    const dsv4_seg *g = &l[q].seg[0];
    tu_check(l[q].n_seg == 1 && g->win_halo == win[q] && g->c_halo == ch[q] && g->c_full == cf[q] && g->n_own == own[q],
             "%s rank %d: window halo %lld (want %lld), compressor halo %lld / every-channel %lld (want %lld / %lld), "
             "owns %lld slots (want %lld)", what, q, (long long)g->win_halo, (long long)win[q], (long long)g->c_halo,
             (long long)g->c_full, (long long)ch[q], (long long)cf[q], (long long)g->n_own, (long long)own[q]);
  }
}

static void halos(void) {
  dsv4_docs docs;
  /* docs [0,12) all real and [12,32) with 18 real; W = 8, r = 4, N = 4 (L = 8). Slot ends 3 7 11 | 15 19
   * 23 27. Ranks 1-3 start on a slot's own window and need its previous window (4 first-half rows). */
  const int32_t cu[3] = {0, 12, 32}, real[2] = {12, 18};
  dsv4_layout *l = layouts(cu, real, 2, 32, 4, 4, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  if (l) {
    const int64_t win[4] = {0, 7, 4, 7}, ch[4] = {0, 4, 4, 4}, cf[4] = {0}, own[4] = {2, 2, 2, 1};
    expect_halos("aligned r=4 N=4", l, 4, win, ch, cf, own);
    free_all(l, 4, &docs);
  }
  /* a shard that starts in padding: doc 0 is [0,24) with 14 real; rank 1 starts at 16 */
  const int32_t cu2[3] = {0, 24, 32}, real2[2] = {14, 8};
  if ((l = layouts(cu2, real2, 2, 32, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    const int64_t win[2] = {0, 0}, ch[2] = {0, 0}, cf[2] = {0, 0}, own[2] = {3, 2};
    expect_halos("shard starting in padding", l, 2, win, ch, cf, own);
    free_all(l, 2, &docs);
  }
  /* r = 4, one document of 16, N = 8 (L = 2 < r), W = 4 (model/layout.c): slots end on ranks 1, 3, 5,
   * 7; rank 3's slot 1 reads [0, 8): a halo of 6 rows over three ranks, 2 of them every-channel */
  const int32_t cu3[2] = {0, 16};
  if ((l = layouts(cu3, NULL, 1, 16, 4, 8, 4, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    const int64_t win[8] = {0, 2, 3, 3, 3, 3, 3, 3}, ch[8] = {0, 2, 0, 6, 0, 6, 0, 6}, cf[8] = {0, 2, 0, 2, 0, 2, 0, 2},
                  own[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    expect_halos("r=4 shards of 2 rows", l, 8, win, ch, cf, own);
    tu_check(l[0].n_blk == 1 && l[0].n_blk_all == 8, "r=4 shards of 2 rows: slot buffer of ceil(2/4) = 1 row per rank");
    free_all(l, 8, &docs);
  }
  /* r = 128 with 65-row shards: one document of 260, N = 4; slot 0 [0,128) ends on rank 1 (halo: all
   * 65 rows of rank 0), slot 1 [128, 256) ends on rank 3 (halo [128, 195): 2 rows of rank 1, 65 of rank 2) */
  const int32_t cu4[2] = {0, 260};
  if ((l = layouts(cu4, NULL, 1, 260, 128, 4, 8, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    const int64_t win[4] = {0, 7, 7, 7}, ch[4] = {0, 65, 0, 67}, cf[4] = {0, 65, 0, 67}, own[4] = {0, 1, 0, 1};
    expect_halos("r=128 shards of 65 rows", l, 4, win, ch, cf, own);
    free_all(l, 4, &docs);
  }
}

/* V4.1's r = 2 (docs/cp.md "V4.1"): one document of 10, N = 2 (L = 5). Entries [0,2) [2,4) [4,6) [6,8)
 * [8,10) end at 1 3 5 7 9; entry 2 straddles the boundary at 5 and is pooled by rank 1 from one C/Z
 * row of rank 0 (row 4, every channel). Slot buffers of ceil(5/2) = 3 rows: gather [0 1 3 4 5].
 * Zigzag N = 2 (T = 10 is not a multiple of 4: refused; shown with T = 12, one document of 11
 * real): rank 0 holds segments [0,3) and [9,12), rank 1 [3,6) and [6,9); entries end 1 3 5 7 9:
 * rank 0 owns 0 and 4 (its [9,12) segment pools [8,10) with row 8 of rank 1), rank 1 owns 1 (with
 * row 2 of rank 0) and 2 in its first segment, 3 in its second. Slot buffers of 2 + 2 rows per rank:
 * entry 0 -> row 0, entry 4 -> row 2, entries 1, 2 -> rows 4, 5, entry 3 -> row 6. */
static void v41_r2(void) {
  dsv4_docs docs;
  const int32_t cu[2] = {0, 10};
  dsv4_layout *l = layouts(cu, NULL, 1, 10, 2, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  if (l) {
    const int64_t win[2] = {0, 5}, ch[2] = {0, 1}, cf[2] = {0, 1}, own[2] = {2, 3};
    expect_halos("V4.1 r=2 N=2, an entry straddling the boundary", l, 2, win, ch, cf, own);
    const int32_t want[5] = {0, 1, 3, 4, 5};
    tu_check(docs.n_cmp == 5 && l[0].n_blk == 3 && same_i32(l[0].gather, want, 5),
             "V4.1 r=2 N=2: slot buffers of 3 rows, gather [0 1 3 4 5]");
    free_all(l, 2, &docs);
  }
  const int32_t cu2[2] = {0, 12}, real2[1] = {11};
  if ((l = layouts(cu2, real2, 1, 12, 2, 2, 8, DSV4_SPLIT_ZIGZAG, &docs))) {
    tu_check(l[0].n_seg == 2 && l[0].seg[0].n_own == 1 && l[0].seg[1].n_own == 1 && l[0].seg[1].c_halo == 1 &&
             l[1].n_seg == 2 && l[1].seg[0].n_own == 2 && l[1].seg[0].c_halo == 1 && l[1].seg[1].n_own == 1 &&
             l[1].seg[1].c_halo == 0,
             "V4.1 r=2 zigzag N=2: rank 0 owns entries 0 and 4 (one halo row for 4), rank 1 entries 1, 2 (one "
             "halo row for 1) and 3");
    const int32_t want[5] = {0, 4, 5, 6, 2};
    tu_check(docs.n_cmp == 5 && same_i32(l[0].gather, want, 5), "V4.1 r=2 zigzag N=2: gather [0 4 5 6 2] (got [%d %d %d %d %d])",
             l[0].gather[0], l[0].gather[1], l[0].gather[2], l[0].gather[3], l[0].gather[4]);
    free_all(l, 2, &docs);
  }
  /* r = 1: every token is its own entry; no compressor halo ever */
  const int32_t cu3[2] = {0, 8};
  if ((l = layouts(cu3, NULL, 1, 8, 1, 4, 8, DSV4_SPLIT_ZIGZAG, &docs))) {
    int none = 1;
    for (int q = 0; q < 4; q++)
      for (int s = 0; s < l[q].n_seg; s++) none &= l[q].seg[s].c_halo == 0 && l[q].seg[s].n_own == l[q].seg[s].len;
    tu_check(none && docs.n_cmp == 8, "V4.1 r=1 zigzag N=4 (1-row chunks): each rank owns its rows' entries, no halo");
    free_all(l, 4, &docs);
  }
}

static void gather_index(void) {
  dsv4_docs docs;
  /* docs [0,12) and [12,32) (18 real), r = 4: 3 + 4 slots, ends 3 7 11 | 15 19 23 27 */
  const int32_t cu[3] = {0, 12, 32}, real[2] = {12, 18};
  dsv4_layout *l = layouts(cu, real, 2, 32, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  if (l) {
    const int32_t want[7] = {0, 1, 2, 3, 4, 5, 6};
    tu_check(docs.n_cmp == 7 && l[0].n_blk == 4 && same_i32(l[0].gather, want, 7),
             "gather index, contiguous N=2: slots in rank order are rows 0..6");
    free_all(l, 2, &docs);
  }
  /* zigzag: rank 0 holds [0,8) (ids 0, 1 -> rows 0, 1) and [24,32) (id 6 -> row 2); rank 1 holds
   * [8,16) (ids 2, 3 -> rows 4, 5) and [16,24) (ids 4, 5 -> rows 6, 7) */
  if ((l = layouts(cu, real, 2, 32, 4, 2, 8, DSV4_SPLIT_ZIGZAG, &docs))) {
    const int32_t wantz[7] = {0, 1, 4, 5, 6, 7, 2};
    tu_check(same_i32(l[0].gather, wantz, 7), "gather index, zigzag N=2: [0 1 4 5 6 7 2] (got [%d %d %d %d %d %d %d])",
             l[0].gather[0], l[0].gather[1], l[0].gather[2], l[0].gather[3], l[0].gather[4], l[0].gather[5],
             l[0].gather[6]);
    free_all(l, 2, &docs);
  }
  /* unpadded: docs [0,6) and [6,18) with 11 real, r = 4, N = 3 (L = 6, slot buffer of 2 rows per rank):
   * ends 3 | 9 13 -> owners ranks 0, 1, 2 -> rows 0, 2, 4 */
  const int32_t cu5[3] = {0, 6, 18}, real5[2] = {6, 11};
  if ((l = layouts(cu5, real5, 2, 18, 4, 3, 8, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    const int32_t want5[3] = {0, 2, 4};
    tu_check(docs.n_cmp == 3 && l[0].n_blk == 2 && same_i32(l[0].gather, want5, 3),
             "gather index, unpadded documents N=3: [0 2 4] (got [%d %d %d])", l[0].gather[0], l[0].gather[1],
             l[0].gather[2]);
    free_all(l, 3, &docs);
  }
  /* r = 128, 65-row shards (halos above): slots on ranks 1 and 3, one buffer row each -> [1 3] */
  const int32_t cu4[2] = {0, 260};
  if ((l = layouts(cu4, NULL, 1, 260, 128, 4, 8, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    const int32_t want4[2] = {1, 3};
    tu_check(docs.n_cmp == 2 && same_i32(l[0].gather, want4, 2), "gather index, r=128 65-row shards: [1 3]");
    free_all(l, 4, &docs);
  }
}

static int msg_is(const dsv4_halo_msg *m, int peer, const int32_t *rows, int n) {
  return m->peer == peer && m->n == n && same_i32(m->rows, rows, n);
}

/* Plans of one kind for ranks me[0..n) (caller frees). */
static int plans_of(const dsv4_layout *l, int N, dsv4_halo_kind kind, dsv4_halo_plan *p, const int *me, int n) {
  int ok = 1;
  for (int i = 0; i < n; i++) ok &= tu_ok(dsv4_halo_plan_build(l, N, me[i], kind, &p[i]), "halo plan built");
  return ok;
}

static void plans(void) {
  dsv4_docs docs;
  /* one document of 16, W = 8 (halo 7 > L = 4), r = 0, N = 4 */
  const int32_t cu[2] = {0, 16};
  dsv4_layout *l = layouts(cu, NULL, 1, 16, 0, 4, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  dsv4_halo_plan p[3] = {{0}};
  const int r02[2] = {0, 2};
  if (l && plans_of(l, 4, DSV4_HALO_WINDOW, p, r02, 2)) {
    const int32_t s01[4] = {0, 1, 2, 3}, s02[3] = {1, 2, 3}, r20[3] = {0, 1, 2}, r21[4] = {3, 4, 5, 6};
    tu_check(p[0].n_send == 2 && p[0].n_recv == 0 && msg_is(&p[0].send[0], 1, s01, 4) && msg_is(&p[0].send[1], 2, s02, 3),
             "window plan rank 0: rows 0-3 to rank 1, rows 1-3 to rank 2 (W - 1 = 7 > L = 4)");
    tu_check(p[1].n_recv == 2 && msg_is(&p[1].recv[0], 0, r20, 3) && msg_is(&p[1].recv[1], 1, r21, 4),
             "window plan rank 2: 3 halo rows from rank 0, 4 from rank 1");
  }
  for (int i = 0; i < 3; i++) dsv4_halo_plan_free(&p[i]);
  if (l) free_all(l, 4, &docs);
  /* r = 4, one document of 16, N = 2: rank 1's first slot (j = 2, window [8,12)) reads the previous
   * window [4,8): rank 0 sends its own rows 4-7 (first-half channels), rank 1 receives them into its
   * halo rows 0-3; nothing needs every channel */
  const int r01[2] = {0, 1};
  if ((l = layouts(cu, NULL, 1, 16, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    dsv4_halo_plan f[2] = {{0}};
    if (plans_of(l, 2, DSV4_HALO_CMP_HALF, p, r01, 2) && plans_of(l, 2, DSV4_HALO_CMP_FULL, f, r01, 2)) {
      const int32_t src[4] = {4, 5, 6, 7}, dst[4] = {0, 1, 2, 3};
      tu_check(p[0].n_send == 1 && msg_is(&p[0].send[0], 1, src, 4) && p[1].n_recv == 1 && msg_is(&p[1].recv[0], 0, dst, 4),
               "compressor plan: rank 0 sends rows 4-7 (first half), rank 1 receives them into halo rows 0-3");
      tu_check(f[0].n_send == 0 && f[1].n_recv == 0, "compressor plan: no every-channel rows when slots align");
    }
    for (int i = 0; i < 2; i++) dsv4_halo_plan_free(&p[i]), dsv4_halo_plan_free(&f[i]);
    free_all(l, 2, &docs);
  }
  /* unpadded: docs [0,6) and [6,18) (11 real), r = 4, N = 3: rank 2 [12,18) owns slot (doc 1, j = 1)
   * with window [10,14) and previous window [6,10): rank 1 sends tokens 6-9 (its rows 0-3, first
   * half) and 10, 11 (rows 4, 5, every channel) */
  const int32_t cu5[3] = {0, 6, 18}, real5[2] = {6, 11};
  const int r12[2] = {1, 2};
  if ((l = layouts(cu5, real5, 2, 18, 4, 3, 8, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    dsv4_halo_plan f[2] = {{0}};
    if (plans_of(l, 3, DSV4_HALO_CMP_HALF, p, r12, 2) && plans_of(l, 3, DSV4_HALO_CMP_FULL, f, r12, 2)) {
      const int32_t h_src[4] = {0, 1, 2, 3}, h_dst[4] = {0, 1, 2, 3}, f_src[2] = {4, 5}, f_dst[2] = {4, 5};
      tu_check(p[0].n_send == 1 && msg_is(&p[0].send[0], 2, h_src, 4) && msg_is(&p[1].recv[0], 1, h_dst, 4) &&
                   f[0].n_send == 1 && msg_is(&f[0].send[0], 2, f_src, 2) && msg_is(&f[1].recv[0], 1, f_dst, 2),
               "compressor plan, window straddling a rank: 4 first-half rows and 2 every-channel rows from rank 1");
    }
    for (int i = 0; i < 2; i++) dsv4_halo_plan_free(&p[i]), dsv4_halo_plan_free(&f[i]);
    free_all(l, 3, &docs);
  }
  /* r = 4, one document of 16, N = 8, L = 2 (model/layout.c): rank 3's slot 1 reads [0, 8): first
   * halves of tokens 0, 1 from rank 0 and 2, 3 from rank 1 (rank 1's own rows start after its own
   * 2-row halo: rows 2, 3), every channel of 4, 5 from rank 2 */
  const int r3[1] = {3};
  if ((l = layouts(cu, NULL, 1, 16, 4, 8, 4, DSV4_SPLIT_CONTIGUOUS, &docs))) {
    dsv4_halo_plan f[1] = {{0}};
    if (plans_of(l, 8, DSV4_HALO_CMP_HALF, p, r3, 1) && plans_of(l, 8, DSV4_HALO_CMP_FULL, f, r3, 1)) {
      const int32_t d0[2] = {0, 1}, d1[2] = {2, 3}, d2[2] = {4, 5};
      tu_check(p[0].n_recv == 2 && msg_is(&p[0].recv[0], 0, d0, 2) && msg_is(&p[0].recv[1], 1, d1, 2) &&
                   f[0].n_recv == 1 && msg_is(&f[0].recv[0], 2, d2, 2),
               "compressor plan, a window over three ranks: halves from ranks 0 and 1, every channel from rank 2");
    }
    dsv4_halo_plan_free(&p[0]);
    dsv4_halo_plan_free(&f[0]);
    free_all(l, 8, &docs);
  }
  /* zigzag N=2 over one document of 16 (W = 8): rank 1 holds [4,8) and [8,12): the second chunk's
   * halo [1,8) is partly its own rows (no message) */
  const int r1[1] = {1};
  if ((l = layouts(cu, NULL, 1, 16, 0, 2, 8, DSV4_SPLIT_ZIGZAG, &docs))) {
    if (plans_of(l, 2, DSV4_HALO_WINDOW, p, r1, 1))
      tu_check(p[0].n_self == 4 && p[0].n_recv == 1 && p[0].recv[0].peer == 0 && p[0].recv[0].n == 3 + 4,
               "zigzag plan rank 1: 4 halo rows from itself, 7 from rank 0 (got self %lld, recv %lld)",
               (long long)p[0].n_self, p[0].n_recv ? (long long)p[0].recv[0].n : -1LL);
    dsv4_halo_plan_free(&p[0]);
    free_all(l, 2, &docs);
  }
}

/* The slot count of any token range is a difference of slots_before (plan/docs.h example). */
static void slot_ids(void) {
  const int32_t cu[3] = {0, 10, 17}, real[2] = {10, 6};
  dsv4_packing pk = TU_PACKING(cu, real, 2, 17, 0);
  dsv4_docs d;
  if (!tu_ok(dsv4_docs_build(&d, &pk, 4), "packing of 10 + 7 (6 real) tokens accepted")) return;
  const int64_t g[6] = {0, 4, 8, 13, 14, 17}, want[6] = {0, 1, 2, 2, 3, 3};
  int ok = d.n_cmp == 3;
  for (int i = 0; i < 6; i++) ok &= dsv4_docs_slots_before(&d, g[i]) == want[i];
  int doc;
  int64_t j;
  dsv4_docs_slot(&d, 2, &doc, &j);
  tu_check(ok && doc == 1 && j == 0, "slot ids: ends 3, 7 | 13; slots_before(0 4 8 13 14 17) = 0 1 2 2 3 3");
  dsv4_docs_free(&d);
}

static void layout_rules(void) {
  const dsv4_placement S = {DSV4_PLACE_SHARD_SEQ, 0}, R = {DSV4_PLACE_REPLICATE, 0}, H = {DSV4_PLACE_SHARD_HEAD, 0},
                       Wn = {DSV4_PLACE_WINDOW, 7};
  dsv4_placement out[4], bwd[4];
  dsv4_placement ok_attn[5] = {S, Wn, R, S, R};
  tu_check(dsv4_sparse_attn_infer(4, ok_attn, out, bwd) == DSV4_OK && out[0].kind == DSV4_PLACE_SHARD_SEQ &&
               bwd[1].kind == DSV4_PLACE_WINDOW && bwd[2].kind == DSV4_PLACE_PARTIAL_SUM,
           "layout: sparse_attn q SHARD, ori_kv WINDOW, cmp REPLICATE -> out SHARD, d cmp_kv PARTIAL");
  dsv4_placement repl_kv[5] = {S, R, R, S, R};
  tu_check(dsv4_sparse_attn_infer(4, repl_kv, out, NULL) == DSV4_ERR_LAYOUT && strstr(dsv4_last_error(), "ori_kv"),
           "layout: ori_kv plain REPLICATE rejected under CP (%s)", dsv4_last_error());
  dsv4_placement shard_kv[5] = {S, S, R, S, R};
  tu_check(dsv4_sparse_attn_infer(4, shard_kv, out, NULL) == DSV4_ERR_LAYOUT, "layout: ori_kv plain SHARD rejected");
  tu_check(dsv4_sparse_attn_infer(1, repl_kv, out, NULL) == DSV4_OK, "layout: one rank accepts local placements");
  dsv4_placement head_q[5] = {H, Wn, R, S, R};
  tu_check(dsv4_sparse_attn_infer(4, head_q, out, NULL) == DSV4_ERR_LAYOUT && strstr(dsv4_last_error(), "head"),
           "layout: head sharding rejected (%s)", dsv4_last_error());
  dsv4_placement idx_bad[3] = {S, S, S};
  tu_check(dsv4_lightning_indexer_infer(2, idx_bad, out) == DSV4_ERR_LAYOUT && strstr(dsv4_last_error(), "k_idx"),
           "layout: lightning_indexer k_idx not REPLICATE rejected (%s)", dsv4_last_error());
  dsv4_placement kl_in[6] = {S, R, S, S, R, S};
  tu_check(dsv4_indexer_kl_loss_infer(2, kl_in, out) == DSV4_OK && out[0].kind == DSV4_PLACE_PARTIAL_SUM &&
               out[3].kind == DSV4_PLACE_PARTIAL_SUM && out[1].kind == DSV4_PLACE_SHARD_SEQ,
           "layout: indexer_kl_loss -> loss PARTIAL, d q_idx SHARD, d k_idx PARTIAL");
  /* a WINDOW placement must match the rows it describes */
  float q[2 * 4] = {0}, kv[5 * 4] = {0}, o[8], lse[2], sink[1] = {0};
  int32_t ws[2] = {3, 4}, wl[2] = {1, 1};
  dsv4_attn_args a = {.out = o, .lse = lse, .q = q, .ori_kv = kv, .win_start = ws, .win_len = wl, .sink = sink,
                      .S1 = 2, .R = 5, .H = 1, .D = 4, .scale = 0.5f};
  dsv4_placement w2[5] = {S, {DSV4_PLACE_WINDOW, 2}, R, S, R};
  tu_check(dsv4_sparse_attn_dist(&a, 2, w2, DSV4_IMPL_FAST) == DSV4_ERR_LAYOUT && strstr(dsv4_last_error(), "rows"),
           "layout: WINDOW(2) with 5 rows for 2 queries rejected (%s)", dsv4_last_error());
  dsv4_placement w3[5] = {S, {DSV4_PLACE_WINDOW, 3}, R, S, R};
  tu_ok(dsv4_sparse_attn_dist(&a, 2, w3, DSV4_IMPL_FAST), "layout: WINDOW(3) with 5 rows for 2 queries runs");
}

/* A plan is reused only when its whole key is equal: every field and every array element. Keys that
 * a 64-bit hash could confuse (here: one cu_seqlens entry moved, seqlens_real present or not with the
 * same values) must compare unequal; then the plan built from the key holds that packing's own
 * token map. */
static void plan_keys(void) {
  static const int32_t cu_a[4] = {0, 10, 20, 32}, cu_b[4] = {0, 11, 20, 32}, real[3] = {10, 10, 12};
  dsv4_plan_key a, b, c, d;
  const dsv4_packing pa = TU_PACKING(cu_a, NULL, 3, 32, 0), pb = TU_PACKING(cu_b, NULL, 3, 32, 0);
  const dsv4_packing pc = TU_PACKING(cu_a, real, 3, 32, 0);
  int ok = tu_ok(dsv4_plan_key_set(&a, &pa, 16, 4, 8, DSV4_SPLIT_CONTIGUOUS, 1, 2), "key a") &&
           tu_ok(dsv4_plan_key_set(&b, &pb, 16, 4, 8, DSV4_SPLIT_CONTIGUOUS, 1, 2), "key b") &&
           tu_ok(dsv4_plan_key_set(&c, &pc, 16, 4, 8, DSV4_SPLIT_CONTIGUOUS, 1, 2), "key c") &&
           tu_ok(dsv4_plan_key_set(&d, &pa, 16, 4, 8, DSV4_SPLIT_CONTIGUOUS, 1, 2), "key d");
  if (ok) {
    tu_check(dsv4_plan_key_equal(&a, &d), "plan key: the same packing compares equal");
    tu_check(!dsv4_plan_key_equal(&a, &b), "plan key: one moved document boundary compares unequal");
    tu_check(!dsv4_plan_key_equal(&a, &c), "plan key: seqlens_real given (all real) compares unequal");
    dsv4_plan_key k0;
    tu_ok(dsv4_plan_key_set(&k0, &pa, 16, 4, 8, DSV4_SPLIT_CONTIGUOUS, 0, 2), "key rank 0");
    tu_check(!dsv4_plan_key_equal(&a, &k0), "plan key: another rank compares unequal");
    dsv4_plan_key_free(&k0);
    dsv4_config cfg = DSV4_CONFIG_INIT;
    dsv4_plan p = {0};
    if (tu_ok(dsv4_config_preset(&cfg, "tiny"), "tiny") && tu_ok(dsv4_plan_build(&p, &cfg, &b, DSV4_PLAN_FULL), "plan b")) {
      /* rank 1 of 2 holds [16, 32): with cu_b, token 16 is position 5 of document 1 ([11, 20)) */
      tu_check(p.global[0] == 16 && p.doc[0] == 1 && p.pos[0] == 5 && p.doc[4] == 2 && p.pos[4] == 0,
               "plan of packing b: its own token map (token 16 at document 1 position %d)", p.pos[0]);
      dsv4_plan_free(&p);
    }
  }
  dsv4_plan_key_free(&a);
  dsv4_plan_key_free(&b);
  dsv4_plan_key_free(&c);
  dsv4_plan_key_free(&d);
}

/* A zigzag rank's RoPE table holds its two chunks' positions (plus the 2r rows before each whose
 * slots it pools), not the whole sequence between them; the plan checks that every row's and slot's
 * position is in it. */
static void zigzag_rope(void) {
  const int64_t T = 8192, N = 4;
  int32_t cu[2] = {0, (int32_t)T};
  const dsv4_packing pk = TU_PACKING(cu, NULL, 1, T, 0);
  dsv4_config cfg = DSV4_CONFIG_INIT;
  for (int q = 0; q < N; q++) {
    dsv4_plan_key k;
    dsv4_plan p = {0};
    if (!tu_ok(dsv4_config_preset(&cfg, "tiny"), "tiny") ||
        !tu_ok(dsv4_plan_key_set(&k, &pk, T / N, 4, 8, DSV4_SPLIT_ZIGZAG, q, (int)N), "key") ||
        !tu_ok(dsv4_plan_build(&p, &cfg, &k, DSV4_PLAN_FULL), "zigzag plan"))
      return;
    const int64_t c = T / (2 * N);
    const int n = q == N - 1 ? 1 : 2; /* the middle rank's chunks touch */
    tu_check(p.rope.rg.n == n && p.rope.rg.lo[0] == (q ? q * c - 8 : 0) &&
                 p.rope.rg.hi[n - 1] == (2 * N - q) * c && p.rope.cap <= 2 * c + 16,
             "zigzag rank %d of %lld: RoPE table of %lld positions in %d ranges (the chunks: %lld)", q,
             (long long)N, (long long)p.rope.cap, p.rope.rg.n, (long long)(2 * c));
    dsv4_plan_free(&p);
  }
}

/* The planned weight-gradient messages of V4-Flash layers (what the CP sweep then checks against
 * measurement): none on one rank; collectives count the same bytes both ways; the point-to-point
 * rows sent by all ranks are the rows they receive; the exact sums cost 16 (N - 1) / N bytes per
 * weight element at most a few percent over (4 x the fp32 gradients' bytes), at N = 2 as at N = 64
 * (superblocks cut in N slices: one block per rank made an 8-block product send 64 blocks there);
 * recomputation's whole-weight sums (4096 tokens, CP = 2) cross as reduce-scatter + all-gather too,
 * the same bytes within 1% (an all-reduce would double the sums of wo_a and wq_b). */
static void wgrad_traffic(void) {
  dsv4_config cfg = DSV4_CONFIG_INIT;
  if (!tu_ok(dsv4_config_preset(&cfg, "flash"), "flash preset")) return;
  const int layers[3] = {0, 2, 3}, Ns[3] = {1, 2, 64};
  const int64_t Ts[3] = {4096, 4096, 65536};
  for (int li = 0; li < 3; li++)
    for (int ni = 0; ni < 3; ni++) {
      const int N = Ns[ni], L = layers[li];
      int32_t cu[2] = {0, (int32_t)Ts[ni]};
      const dsv4_packing pk = TU_PACKING(cu, NULL, 1, Ts[ni], 0);
      const dsv4_cp_config cp = DSV4_CP_CONFIG_INIT;
      dsv4_cp_stats *st = calloc((size_t)N, sizeof *st);
      dsv4_memory_plan mem = DSV4_MEMORY_PLAN_INIT;
      for (int q = 0; q < N; q++) st[q] = (dsv4_cp_stats)DSV4_CP_STATS_INIT;
      if (!tu_ok(dsv4_cp_plan_traffic_all(&cfg, L, &pk, &cp, N, st), "traffic plan") ||
          !tu_ok(dsv4_cp_plan_memory(&cfg, L, &pk, &cp, NULL, 0, N, &mem), "memory plan")) {
        free(st);
        continue;
      }
      const double elems = (double)mem.grads / sizeof(float);
      uint64_t rows_sent = 0, rows_recv = 0;
      int sym = 1;
      for (int q = 0; q < N; q++) {
        sym &= st[q].bytes_sent[DSV4_MSG_WGRAD_SUMS] == st[q].bytes_recv[DSV4_MSG_WGRAD_SUMS] &&
               st[q].bytes_sent[DSV4_MSG_WGRAD_ALLGATHER] == st[q].bytes_recv[DSV4_MSG_WGRAD_ALLGATHER];
        rows_sent += st[q].bytes_sent[DSV4_MSG_WGRAD_ROWS], rows_recv += st[q].bytes_recv[DSV4_MSG_WGRAD_ROWS];
      }
      const double sums = (double)st[N - 1].bytes_sent[DSV4_MSG_WGRAD_SUMS], floats =
          (double)st[N - 1].bytes_sent[DSV4_MSG_WGRAD_ALLGATHER], ideal = elems * 16.0 * (N - 1) / N;
      if (N == 1) {
        int none = 1;
        for (int k = DSV4_MSG_WGRAD_ROWS; k <= DSV4_MSG_WGRAD_ALLGATHER; k++)
          none &= !st[0].bytes_sent[k] && !st[0].bytes_recv[k] && !st[0].messages[k];
        tu_check(none, "wgrad plan: layer %d, one rank sends nothing", L);
      } else {
        tu_check(sym && rows_sent == rows_recv, "wgrad plan: layer %d N=%d: collectives symmetric, rows sent %llu = "
                 "received %llu", L, N, (unsigned long long)rows_sent, (unsigned long long)rows_recv);
        /* (the vector gradients' all-reduce adds a little to the sums and nothing to the floats) */
        tu_check(sums >= 0.99 * ideal && sums <= 1.03 * ideal && floats >= 0.97 * ideal / 4 &&
                     floats <= 1.03 * ideal / 4,
                 "wgrad plan: layer %d N=%d T=%lld: sums %.1f MiB, floats %.1f MiB per rank for %.1f M elements "
                 "(16 and 4 (N - 1) / N bytes each: %.1f, %.1f MiB)", L, N, (long long)Ts[ni], sums / 1048576,
                 floats / 1048576, elems / 1e6, ideal / 1048576, ideal / 4 / 1048576);
      }
      free(st);
    }
  /* recomputation, CSA at 4096 tokens over 2 ranks (2048 rows: whole-weight sums) */
  int32_t cu[2] = {0, 4096};
  const dsv4_packing pk = TU_PACKING(cu, NULL, 1, 4096, 0);
  const dsv4_plan_opts rc_on = {DSV4_HEAD(dsv4_plan_opts), .recompute = 1};
  dsv4_cp_stats a = DSV4_CP_STATS_INIT, b = DSV4_CP_STATS_INIT;
  if (tu_ok(dsv4_cp_plan_traffic_opts(&cfg, 2, &pk, NULL, NULL, 0, 2, &a), "default plan") &&
      tu_ok(dsv4_cp_plan_traffic_opts(&cfg, 2, &pk, NULL, &rc_on, 0, 2, &b), "recompute plan")) {
    int same = 1;
    for (int k = 0; k < DSV4_MSG_WGRAD_ROWS; k++) same &= a.bytes_sent[k] == b.bytes_sent[k];
    const double s0 = (double)a.bytes_sent[DSV4_MSG_WGRAD_SUMS], s1 = (double)b.bytes_sent[DSV4_MSG_WGRAD_SUMS];
    const double f0 = (double)a.bytes_sent[DSV4_MSG_WGRAD_ALLGATHER], f1 = (double)b.bytes_sent[DSV4_MSG_WGRAD_ALLGATHER];
    tu_check(same && fabs(s1 - s0) < 0.01 * s0 && fabs(f1 - f0) < 0.01 * f0 &&
                 b.messages[DSV4_MSG_WGRAD_SUMS] != a.messages[DSV4_MSG_WGRAD_SUMS],
             "wgrad plan: --recompute's sinks (other messages) cost the weight gradients' bytes (sums %.1f -> %.1f "
             "MiB, floats %.1f -> %.1f MiB)", a.bytes_sent[DSV4_MSG_WGRAD_SUMS] / 1048576.0,
             b.bytes_sent[DSV4_MSG_WGRAD_SUMS] / 1048576.0, a.bytes_sent[DSV4_MSG_WGRAD_ALLGATHER] / 1048576.0,
             b.bytes_sent[DSV4_MSG_WGRAD_ALLGATHER] / 1048576.0);
  }
}

/* A dsv4_cp_stats of 0.2.x's size (8 message kinds) is written with its own layout. */
static void stats_abi(void) {
  typedef struct {
    DSV4_STRUCT_HEAD;
    uint64_t bytes_sent[8], bytes_recv[8], messages[8];
    double seconds[8];
    double hidden_seconds, overlap_window_seconds;
  } stats_0_2;
  dsv4_config cfg = DSV4_CONFIG_INIT;
  int32_t cu[2] = {0, 1024};
  const dsv4_packing pk = TU_PACKING(cu, NULL, 1, 1024, 0);
  dsv4_cp_stats now = DSV4_CP_STATS_INIT;
  stats_0_2 old = {DSV4_HEAD(stats_0_2)};
  old.hidden_seconds = old.overlap_window_seconds = -1;
  if (!tu_ok(dsv4_config_preset(&cfg, "flash"), "flash") ||
      !tu_ok(dsv4_cp_plan_traffic(&cfg, 2, &pk, NULL, 1, 2, &now), "plan, this version's struct") ||
      !tu_ok(dsv4_cp_plan_traffic(&cfg, 2, &pk, NULL, 1, 2, (dsv4_cp_stats *)(void *)&old), "plan, 0.2.x's struct"))
    return;
  int same = DSV4_MSG_KINDS_0_2 == 8 && old.struct_size == sizeof old;
  for (int k = 0; k < 8; k++)
    same &= old.bytes_sent[k] == now.bytes_sent[k] && old.bytes_recv[k] == now.bytes_recv[k] &&
            old.messages[k] == now.messages[k] && old.seconds[k] == 0;
  tu_check(same && old.hidden_seconds == 0 && old.overlap_window_seconds == 0 && now.bytes_recv[3] > 0,
           "stats ABI: a 0.2.x struct (%zu bytes) gets its 8 kinds at their places and its trailing fields", sizeof old);
  typedef struct {
    DSV4_STRUCT_HEAD;
    uint64_t bytes_sent[11], bytes_recv[11], messages[11];
    double seconds[11];
    double hidden_seconds, overlap_window_seconds;
  } stats_0_3;
  stats_0_3 mid = {DSV4_HEAD(stats_0_3)};
  mid.hidden_seconds = mid.overlap_window_seconds = -1;
  if (!tu_ok(dsv4_cp_plan_traffic(&cfg, 2, &pk, NULL, 1, 2, (dsv4_cp_stats *)(void *)&mid), "plan, 0.3.x's struct"))
    return;
  same = DSV4_MSG_KINDS_0_3 == 11 && mid.struct_size == sizeof mid;
  for (int k = 0; k < 11; k++)
    same &= mid.bytes_sent[k] == now.bytes_sent[k] && mid.bytes_recv[k] == now.bytes_recv[k] &&
            mid.messages[k] == now.messages[k] && mid.seconds[k] == 0;
  tu_check(same && mid.hidden_seconds == 0 && mid.overlap_window_seconds == 0 &&
               now.bytes_sent[DSV4_MSG_WGRAD_SUMS] > 0 && now.bytes_sent[DSV4_MSG_ATTN_OFFLOAD] > 0,
           "stats ABI: a 0.3.x struct (%zu bytes) gets its 11 kinds at their places and its trailing fields (this "
           "version's adds the attention offload's)", sizeof mid);
}

/* dsv4_cp_plan_flops: a window count by hand for the rows each split gives a rank; every rank's
 * counts adding up to dsv4_layer_flops's for random packings, kinds (V4.1 roles too), N and splits;
 * CSA's zigzag imbalance once top-k saturates; bad ranks refused. */
static void plan_flops(void) {
  dsv4_config tiny = DSV4_CONFIG_INIT, t41 = DSV4_CONFIG_INIT;
  if (!tu_ok(dsv4_config_preset(&tiny, "tiny"), "tiny") || !tu_ok(dsv4_config_preset(&t41, "tiny41"), "tiny41")) return;
  const double HD4 = 4.0 * tiny.n_heads * tiny.head_dim;
  const int W = tiny.window;
  const dsv4_packing one = TU_PACKING(NULL, NULL, 0, 64, 0);
  for (int zig = 0; zig < 2; zig++) {
    const dsv4_cp_config cp = {DSV4_HEAD(dsv4_cp_config), .split = zig ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS};
    for (int rank = 0; rank < 2; rank++) {
      double keys = 0; /* SWA: window keys of the positions the split gives this rank */
      for (int t = 0; t < 64; t++) {
        const int chunk = zig ? t / 16 : t / 32, mine = zig ? (chunk == rank || chunk == 3 - rank) : chunk == rank;
        if (mine) keys += (t < W - 1 ? t : W - 1) + 1;
      }
      dsv4_flops f = DSV4_FLOPS_INIT;
      const int ok = tu_ok(dsv4_cp_plan_flops(&tiny, 0, &one, &cp, rank, 2, &f), "plan flops");
      tu_check(ok && f.attention_fwd == HD4 * keys && f.tokens == 32,
               "plan flops: SWA T = 64 N = 2 %s rank %d: %g window keys, 32 tokens (got %g, %g)",
               zig ? "zigzag" : "contiguous", rank, keys, f.attention_fwd / HD4, f.tokens);
    }
  }
  uint32_t seed = 12345;
  int sums_ok = 1, cases = 0;
  for (int it = 0; it < 40; it++) {
    int32_t cu[40], real[40];
    const int64_t T = 768;
    int n = 0;
    const int batched = it % 5 == 4;
    cu[0] = 0;
    while (cu[n] < T && n < 38) { /* documents of 1 - 300 tokens, some with padding */
      seed = seed * 1103515245u + 12345u;
      int64_t len = batched ? 192 : 1 + (seed >> 8) % 300;
      if (cu[n] + len > T) len = T - cu[n];
      cu[n + 1] = (int32_t)(cu[n] + len);
      real[n] = (int32_t)(len - (batched ? 0 : (int64_t)((seed >> 20) % 3) % len));
      n++;
    }
    if (cu[n] != T) continue;
    const dsv4_packing pk = TU_PACKING(cu, real, n, T, batched);
    const dsv4_config *cfg = it % 2 ? &t41 : &tiny;
    const int layer = it % 2 ? (int)((unsigned)it / 2 % (unsigned)t41.n_layers) : it / 2 % 3;
    dsv4_flops whole = DSV4_FLOPS_INIT;
    if (dsv4_layer_flops(cfg, layer, &pk, &whole) != DSV4_OK) {
      sums_ok = 0;
      continue;
    }
    static const int Ns[] = {1, 2, 3, 4, 8};
    for (int ni = 0; ni < 5; ni++)
      for (int zig = 0; zig < 2; zig++) {
        const int N = Ns[ni];
        const dsv4_cp_config cp = {DSV4_HEAD(dsv4_cp_config), .split = zig ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS};
        double sum[8] = {0};
        for (int q = 0; q < N; q++) {
          dsv4_flops f = DSV4_FLOPS_INIT;
          if (dsv4_cp_plan_flops(cfg, layer, &pk, &cp, q, N, &f) != DSV4_OK) {
            sums_ok = 0;
            continue;
          }
          const double v[8] = {f.fwd, f.bwd, f.projections_fwd, f.attention_fwd, f.indexer_fwd, f.projections_bwd,
                               f.indexer_bwd, f.tokens};
          for (int k = 0; k < 8; k++) sum[k] += v[k];
        }
        const double w[8] = {whole.fwd, whole.bwd, whole.projections_fwd, whole.attention_fwd, whole.indexer_fwd,
                             whole.projections_bwd, whole.indexer_bwd, whole.tokens};
        for (int k = 0; k < 8; k++) sums_ok &= fabs(sum[k] - w[k]) <= 1e-12 * fabs(w[k]);
        cases++;
      }
  }
  tu_check(sums_ok && cases >= 300, "plan flops: every part of every rank's count adds up to the layer's (%d cases: "
           "random packings, batches, every kind and V4.1 role, N = 1 - 8, both splits)", cases);
  /* V4-Flash CSA at 8192 tokens: rank 0 holds positions 0 - 2047 (top-k saturates at 2048) and
   * 6144 - 8191, rank 1 the middle: 128 + 512 keys per query against 128 + 384 on average */
  dsv4_config flash = DSV4_CONFIG_INIT;
  const dsv4_packing lng = TU_PACKING(NULL, NULL, 0, 8192, 0);
  const dsv4_cp_config zz = {DSV4_HEAD(dsv4_cp_config), .split = DSV4_SPLIT_ZIGZAG};
  dsv4_flops r0 = DSV4_FLOPS_INIT, r1 = DSV4_FLOPS_INIT;
  const int ok = tu_ok(dsv4_config_preset(&flash, "flash"), "flash") &&
                 tu_ok(dsv4_cp_plan_flops(&flash, 2, &lng, &zz, 0, 2, &r0), "csa 0") &&
                 tu_ok(dsv4_cp_plan_flops(&flash, 2, &lng, &zz, 1, 2, &r1), "csa 1");
  const double ar = ok ? r1.attention_fwd / r0.attention_fwd : 0, ir = ok ? r1.indexer_fwd / r0.indexer_fwd : 0;
  tu_check(ar > 1.2 && ar < 1.3 && fabs(ir - 1) < 0.01,
           "plan flops: V4-Flash CSA 8192 zigzag: the middle chunks attend to more keys (%.4f, about 640 / 512 - "
           "window ramp), the causal indexer scoring stays balanced (%.4f)", ar, ir);
  dsv4_flops f = DSV4_FLOPS_INIT;
  dsv4_status st = dsv4_cp_plan_flops(&tiny, 0, &one, NULL, 2, 2, &f);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "rank 2 of 2"), "plan flops: a rank outside the job is "
           "refused (%s)", dsv4_last_error());
  const dsv4_packing odd = TU_PACKING(NULL, NULL, 0, 18, 0);
  st = dsv4_cp_plan_flops(&tiny, 0, &odd, NULL, 0, 4, &f);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "multiple of 4"),
           "plan flops: a length the split cannot divide is refused (%s)", dsv4_last_error());
}

/* dsv4_cp_plan_offload: V4-Flash CSA under both splits moves the heavy rank's last rows to the
 * light one, evening the pair's estimated work; SWA, HCA, one rank and DSV4_OFFLOAD=0 move
 * nothing; for random packings every pair is symmetric, each rank in at most one, and the move
 * narrows the pair's gap. */
static void plan_offload(void) {
  dsv4_config flash = DSV4_CONFIG_INIT, tiny = DSV4_CONFIG_INIT, t41 = DSV4_CONFIG_INIT;
  if (!tu_ok(dsv4_config_preset(&flash, "flash"), "flash") || !tu_ok(dsv4_config_preset(&tiny, "tiny"), "tiny") ||
      !tu_ok(dsv4_config_preset(&t41, "tiny41"), "tiny41"))
    return;
  dsv4_cp_offload o[8];
  const dsv4_packing one = TU_PACKING(NULL, NULL, 0, 4096, 0);
  for (int zig = 0; zig < 2; zig++) {
    const dsv4_cp_config cp = {DSV4_HEAD(dsv4_cp_config), .split = zig ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS};
    for (int q = 0; q < 2; q++) o[q] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
    const int ok = tu_ok(dsv4_cp_plan_offload(&flash, 2, &one, &cp, 2, o), "offload plan");
    const double after = ok ? (o[1].work_heavy - o[1].work_moved) / (o[1].work_light + o[1].work_moved) : 0;
    tu_check(ok && o[1].heavy && o[1].peer == 0 && o[0].peer == 1 && !o[0].heavy && o[0].rows == o[1].rows &&
                 o[1].rows > 100 && o[1].rows <= 512 && o[1].work_heavy > 1.05 * o[1].work_light && fabs(after - 1) < 0.01,
             "offload: V4-Flash CSA 4096 %s: rank 1 moves %lld rows to rank 0, the pair's work %.3f -> %.4f",
             zig ? "zigzag" : "contiguous", (long long)o[1].rows, ok ? o[1].work_heavy / o[1].work_light : 0, after);
  }
  const int none_layers[2] = {0, 3};
  for (int i = 0; i < 2; i++) {
    o[0] = o[1] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
    const int ok = tu_ok(dsv4_cp_plan_offload(&flash, none_layers[i], &one, NULL, 2, o), "offload plan");
    tu_check(ok && o[0].peer < 0 && o[1].peer < 0 && !o[0].rows && !o[1].rows,
             "offload: V4-Flash layer %d (%s) moves nothing", none_layers[i], i ? "HCA" : "SWA");
  }
  o[0] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
  tu_check(tu_ok(dsv4_cp_plan_offload(&flash, 2, &one, NULL, 1, o), "offload plan") && o[0].peer < 0,
           "offload: one rank moves nothing");
  const dsv4_packing short_ = TU_PACKING(NULL, NULL, 0, 1024, 0);
  const dsv4_cp_config zz = {DSV4_HEAD(dsv4_cp_config), .split = DSV4_SPLIT_ZIGZAG};
  o[0] = o[1] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
  tu_check(tu_ok(dsv4_cp_plan_offload(&flash, 2, &short_, &zz, 2, o), "offload plan") && o[0].peer < 0 &&
               o[1].peer < 0,
           "offload: V4-Flash CSA 1024 zigzag (the ranks' estimated work within %.0f%%) moves nothing",
           100 * (DSV4_OFFLOAD_MIN_GAP - 1));
  setenv("DSV4_OFFLOAD", "0", 1);
  o[0] = o[1] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
  const int ok0 = tu_ok(dsv4_cp_plan_offload(&flash, 2, &one, NULL, 2, o), "offload plan");
  unsetenv("DSV4_OFFLOAD");
  tu_check(ok0 && o[0].peer < 0 && o[1].peer < 0, "offload: DSV4_OFFLOAD=0 moves nothing");
  uint32_t seed = 777;
  int good = 1, cases = 0, moved = 0;
  for (int it = 0; it < 60; it++) {
    int32_t cu[40], real[40];
    const int64_t T = 960;
    int n = 0;
    cu[0] = 0;
    while (cu[n] < T && n < 38) {
      seed = seed * 1103515245u + 12345u;
      int64_t len = 1 + (seed >> 8) % 400;
      if (cu[n] + len > T) len = T - cu[n];
      cu[n + 1] = (int32_t)(cu[n] + len);
      real[n] = (int32_t)(len - (int64_t)((seed >> 20) % 3) % len);
      n++;
    }
    if (cu[n] != T) continue;
    const dsv4_packing pk = TU_PACKING(cu, real, n, T, 0);
    const dsv4_config *cfg = it % 2 ? &t41 : &tiny;
    const int layer = it % 2 ? 1 + (int)((unsigned)it / 2 % 3) : 1;
    static const int Ns[] = {2, 3, 4, 8};
    for (int ni = 0; ni < 4; ni++)
      for (int zig = 0; zig < 2; zig++) {
        const int N = Ns[ni];
        const dsv4_cp_config cp = {DSV4_HEAD(dsv4_cp_config), .split = zig ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS};
        for (int q = 0; q < N; q++) o[q] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
        if (dsv4_cp_plan_offload(cfg, layer, &pk, &cp, N, o) != DSV4_OK) {
          good = 0;
          continue;
        }
        cases++;
        for (int q = 0; q < N; q++) {
          const dsv4_cp_offload *a = &o[q];
          if (a->peer < 0) {
            good &= a->rows == 0;
            continue;
          }
          const dsv4_cp_offload *b = &o[a->peer];
          good &= a->peer != q && b->peer == q && a->heavy != b->heavy && a->rows == b->rows && a->rows > 0 &&
                  a->rows <= T / N && a->work_heavy >= a->work_light;
          const double gap = a->work_heavy - a->work_light, now = fabs(gap - 2 * a->work_moved);
          good &= now < gap;
          moved += a->heavy;
        }
      }
  }
  tu_check(good && cases >= 400 && moved > cases / 2,
           "offload: %d random packings x N x split: pairs symmetric, one per rank, the gap narrowed (%d pairs)", cases,
           moved);
}

/* The most rows of partial panel runs a product sink keeps at once, the slow way: the chunk rule
 * row by row (dsv4_chunk_end_of), each chunk's rows cut into runs at a global gap or a panel's first
 * row, each partial run's rows appended to a stash, and the stash's last run (cut the same way)
 * taken out when it then covers its panel (model/wgrad.c). */
static int64_t partial_slow(const dsv4_range *segs, int ns, int64_t T, int64_t P) {
  int64_t n = 0, k = 0, peak = 0, ks = 0;
  for (int s = 0; s < ns; s++) n += segs[s].len;
  int64_t *g = malloc(sizeof(int64_t) * (size_t)(n + 1)), *kept = malloc(sizeof(int64_t) * (size_t)(n + 1));
  for (int s = 0; s < ns; s++)
    for (int64_t i = 0; i < segs[s].len; i++) g[k++] = segs[s].g0 + i;
  for (int64_t i0 = 0; i0 < n;) {
    const int64_t i1 = dsv4_chunk_end_of(g, n, P, i0);
    for (int64_t a = i0; a < i1;) {
      int64_t b = a + 1;
      while (b < i1 && g[b] == g[b - 1] + 1 && g[b] % P != 0) b++;
      const int64_t first = g[a] / P * P, ext = T - first < P ? T - first : P;
      if (b - a != ext) {
        for (int64_t i = a; i < b; i++) kept[ks++] = g[i];
        peak = ks > peak ? ks : peak;
        int64_t t = ks - 1; /* the stash's last run: [t, ks) */
        while (t > 0 && kept[t] == kept[t - 1] + 1 && kept[t] % P != 0) t--;
        const int64_t f = kept[t] / P * P, e = T - f < P ? T - f : P;
        if (ks - t == e) ks = t;
      }
      a = b;
    }
    i0 = i1;
  }
  free(g);
  free(kept);
  return peak;
}

/* dsv4_partial_rows (from the segments) against the row-by-row count: every rank of contiguous and
 * zigzag splits, one stream or a batch, lengths on and off the panels; and random segment lists in
 * increasing order (short pieces that share chunks, gaps, next rows) at small panels. */
static void partial_rows(void) {
  int good = 1, cases = 0;
  int64_t most_seen = 0;
  static const int64_t Ts[] = {24, 96, 512, 1000, 1024, 1536, 3072, 4096, 6144, 12288, 12000, 2048 + 96};
  static const int Ns[] = {1, 2, 3, 4, 8};
  for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
    for (int ni = 0; ni < 5; ni++)
      for (int zig = 0; zig < 2; zig++)
        for (int batch = 1; batch <= 3; batch += 2) {
          const int64_t T = Ts[ti] * batch;
          int32_t cu[4] = {0, (int32_t)Ts[ti], (int32_t)(2 * Ts[ti]), (int32_t)T};
          const dsv4_packing pk = TU_PACKING(batch > 1 ? cu : NULL, NULL, batch > 1 ? 3 : 0, T, batch > 1);
          const dsv4_split split = zig ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS;
          const int N = Ns[ni];
          int64_t most = 0, mine = -1, most_all = -1;
          for (int q = 0; q < N; q++) {
            dsv4_range *segs = NULL;
            int ns = 0;
            if (dsv4_shard_segments(&pk, split, q, N, &segs, &ns) != DSV4_OK) break; /* not divisible */
            const int64_t P = dsv4_panel_rows(T), want = partial_slow(segs, ns, T, P);
            const int64_t got = dsv4_partial_rows(segs, ns, T, P);
            if (got != want && good)
              tu_fail("partial rows: T = %lld N = %d %s batch %d rank %d: %lld, row by row %lld",
                      (long long)T, N, zig ? "zigzag" : "contiguous", batch, q, (long long)got,
                      (long long)want);
            good &= got == want;
            most = want > most ? want : most;
            if (q == N - 1) {
              good &= dsv4_partial_rows_all(&pk, split, N, q, &mine, &most_all) == DSV4_OK && mine == want &&
                      most_all == most;
              cases++;
            }
            free(segs);
          }
          most_seen = most > most_seen ? most : most_seen;
        }
  uint32_t seed = 4242;
  int random_cases = 0;
  for (int it = 0; it < 3000; it++) {
    dsv4_range segs[12];
    seed = seed * 1103515245u + 12345u;
    const int64_t P = (int64_t)8 << (seed >> 9) % 4;
    const int ns = 1 + (int)((seed >> 22) % 12);
    for (int s = 0; s < ns; s++) {
      seed = seed * 1103515245u + 12345u;
      const int64_t len = 1 + (seed >> 8) % (s % 3 == 0 ? 9 * P : 5);
      /* in increasing global order, as every split stores them: a gap, or the next rows (runs merge) */
      const int64_t end = s > 0 ? segs[s - 1].g0 + segs[s - 1].len : 0;
      const int64_t g0 = end + ((seed >> 28) % 2 ? 0 : (int64_t)((seed >> 16) % (2 * P)));
      segs[s] = (dsv4_range){g0, len};
    }
    const int64_t T = segs[ns - 1].g0 + segs[ns - 1].len + (int64_t)((seed >> 4) % 3) * (P / 2);
    const int64_t want = partial_slow(segs, ns, T, P), got = dsv4_partial_rows(segs, ns, T, P);
    if (got != want && good)
      tu_fail("partial rows: random case %d (P = %lld, T = %lld, %d segments): %lld, row by row %lld", it,
              (long long)P, (long long)T, ns, (long long)got, (long long)want);
    good &= got == want;
    random_cases++;
  }
  /* the worked example of partial.c: contiguous 1536 over two ranks, 256 and 768 rows at once */
  const dsv4_packing ex = TU_PACKING(NULL, NULL, 0, 1536, 0);
  int64_t m0 = -1, m1 = -1, most = -1;
  const int ex_ok = dsv4_partial_rows_all(&ex, DSV4_SPLIT_CONTIGUOUS, 2, 0, &m0, &most) == DSV4_OK &&
                    dsv4_partial_rows_all(&ex, DSV4_SPLIT_CONTIGUOUS, 2, 1, &m1, &most) == DSV4_OK;
  tu_check(ex_ok && m0 == 256 && m1 == 768 && most == 768,
           "partial rows: contiguous T = 1536 over 2 ranks: 256 and 768 rows (got %lld, %lld, most %lld)",
           (long long)m0, (long long)m1, (long long)most);
  tu_check(
      good && cases > 150 && random_cases == 3000 && most_seen > 0,
      "partial rows: from the segments == row by row over %d splits (every rank) and %d random segment lists",
      cases, random_cases);
}

static const tu_test TESTS[] = {
    {"plan", "offload", plan_offload},
    {"plan", "flops", plan_flops},
    {"plan", "wgrad-traffic", wgrad_traffic},
    {"plan", "stats-abi", stats_abi},
    {"plan", "keys", plan_keys},
    {"plan", "zigzag rope", zigzag_rope},
    {"plan", "shards", shards},
    {"plan", "halos", halos},
    {"plan", "gather-index", gather_index},
    {"plan", "v41-r2-straddle", v41_r2},
    {"plan", "plans", plans},
    {"plan", "slot-ids", slot_ids},
    {"plan", "layout-rules", layout_rules},
    {"plan", "partial-rows", partial_rows},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
