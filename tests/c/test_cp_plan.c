/* test_cp_plan.c: the index arithmetic of two-stage CP on worked examples (the same ones as
 * docs/cp.md): shard segments, halo sizes, the gather index, the halo plans; and the operators'
 * layout rules. All on the host, no ranks needed. */
#include <stdlib.h>
#include <string.h>

#include "ops/placement.h"
#include "cp/plan.h"
#include "cp/shard.h"
#include "testutil.h"

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
      {"contiguous T=16 N=2 rank 1", {NULL, NULL, 0, 16, 0}, DSV4_SPLIT_CONTIGUOUS, 1, 1, {8}, {8}},
      {"zigzag T=16 N=2 rank 0 holds chunks 0 and 3", {NULL, NULL, 0, 16, 0}, DSV4_SPLIT_ZIGZAG, 0, 2, {0, 12}, {4, 4}},
      {"zigzag T=16 N=2 rank 1 holds chunks 1 and 2", {NULL, NULL, 0, 16, 0}, DSV4_SPLIT_ZIGZAG, 1, 2, {4, 8}, {4, 4}},
      {"batched B=2 S=8 N=2 rank 1: S/N of every sequence", {cu2, NULL, 2, 16, 1}, DSV4_SPLIT_CONTIGUOUS, 1, 2, {4, 12}, {4, 4}},
  };
  for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
    dsv4_range *s = NULL;
    int n = 0;
    dsv4_status st = dsv4_shard_segments(&ex[i].pk, ex[i].split, ex[i].rank, 2, 0, &s, &n);
    int ok = st == DSV4_OK && n == ex[i].n;
    for (int k = 0; ok && k < n; k++) ok = s[k].g0 == ex[i].g0[k] && s[k].len == ex[i].len[k];
    tu_check(ok, "shard: %s", ex[i].what);
    free(s);
  }
  dsv4_packing pk = {NULL, NULL, 0, 18, 0};
  dsv4_range *s = NULL;
  int n = 0;
  dsv4_status st = dsv4_shard_segments(&pk, DSV4_SPLIT_CONTIGUOUS, 0, 4, 0, &s, &n);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "not divisible by 4"),
           "shard: T = 18 over 4 ranks is refused (%s)", dsv4_last_error());
  pk.T = 24;
  st = dsv4_shard_segments(&pk, DSV4_SPLIT_CONTIGUOUS, 0, 4, 4, &s, &n);
  tu_check(st == DSV4_ERR_ARG && strstr(dsv4_last_error(), "multiple of the layer's compress ratio 4"),
           "shard: L = 6 with r = 4 is refused (%s)", dsv4_last_error());
}

/* Every rank's layout of a packing (caller frees with free_all). */
static dsv4_layout *layouts(const int32_t *cu, const int32_t *real, int n_docs, int T, int r, int N, int W,
                            dsv4_split split, dsv4_docs *docs) {
  dsv4_packing pk = {cu, real, n_docs, T, 0};
  dsv4_layout *lays = calloc((size_t)N, sizeof *lays);
  if (dsv4_docs_build(docs, &pk, r) != DSV4_OK) return lays;
  for (int q = 0; q < N; q++) cp_layout(docs, &pk, split, q, N, W, 1, &lays[q]);
  return lays;
}

static void free_all(dsv4_layout *lays, int N, dsv4_docs *docs) {
  for (int q = 0; q < N; q++) dsv4_layout_free(&lays[q]);
  free(lays);
  dsv4_docs_free(docs);
}

static void halos(void) {
  /* docs [0,12) all real and [12,32) with 18 real; W = 8, r = 4, N = 4 (L = 8) */
  const int32_t cu[3] = {0, 12, 32}, real[2] = {12, 18};
  dsv4_docs docs;
  dsv4_layout *l = layouts(cu, real, 2, 32, 4, 4, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  const int64_t want_win[4] = {0, 7, 4, 7}; /* min(doc-local t0, W - 1) */
  const int want_cmp[4] = {0, 1, 1, 1};      /* first block is slot j > 0 of a document */
  for (int q = 0; q < 4; q++)
    tu_check(l[q].n_seg == 1 && l[q].seg[0].win_halo == want_win[q] && l[q].seg[0].cmp_halo == want_cmp[q],
             "halo sizes rank %d: window %lld (want %lld), compressor %d (want %d)", q,
             (long long)l[q].seg[0].win_halo, (long long)want_win[q], l[q].seg[0].cmp_halo, want_cmp[q]);
  free_all(l, 4, &docs);
  /* a shard that starts in padding: doc 0 is [0,24) with 14 real; rank 1 starts at 16 */
  const int32_t cu2[3] = {0, 24, 32}, real2[2] = {14, 8};
  l = layouts(cu2, real2, 2, 32, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  tu_check(l[1].seg[0].win_halo == 0 && l[1].seg[0].cmp_halo == 0,
           "halo sizes: a shard starting in padding needs no halo (window %lld, compressor %d)",
           (long long)l[1].seg[0].win_halo, l[1].seg[0].cmp_halo);
  free_all(l, 2, &docs);
}

static void gather_index(void) {
  /* docs [0,12) and [12,32) (18 real), r = 4: 3 + 4 slots; blocks of 4 tokens */
  const int32_t cu[3] = {0, 12, 32}, real[2] = {12, 18};
  dsv4_docs docs;
  dsv4_layout *l = layouts(cu, real, 2, 32, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  const int32_t want[7] = {0, 1, 2, 3, 4, 5, 6};
  tu_check(docs.n_cmp == 7 && l[0].n_blk == 4 && same_i32(l[0].gather, want, 7),
           "gather index, contiguous N=2: slots in rank order are blocks 0..6");
  free_all(l, 2, &docs);
  /* zigzag: rank 0 holds blocks 0,1 and 6,7 (rows 0..3), rank 1 blocks 2,3,4,5 (rows 4..7) */
  l = layouts(cu, real, 2, 32, 4, 2, 8, DSV4_SPLIT_ZIGZAG, &docs);
  const int32_t wantz[7] = {0, 1, 4, 5, 6, 7, 2};
  tu_check(same_i32(l[0].gather, wantz, 7), "gather index, zigzag N=2: [0 1 4 5 6 7 2] (got [%d %d %d %d %d %d %d])",
           l[0].gather[0], l[0].gather[1], l[0].gather[2], l[0].gather[3], l[0].gather[4], l[0].gather[5],
           l[0].gather[6]);
  free_all(l, 2, &docs);
  /* a padding block is dropped: doc [0,16) with 10 real has slots 0, 1 only */
  const int32_t cu3[2] = {0, 16}, real3[1] = {10};
  l = layouts(cu3, real3, 1, 16, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  const int32_t want3[2] = {0, 1};
  tu_check(docs.n_cmp == 2 && same_i32(l[0].gather, want3, 2), "gather index drops blocks in padding");
  free_all(l, 2, &docs);
}

static int msg_is(const cp_msg *m, int peer, const int32_t *rows, int n) {
  return m->peer == peer && m->n == n && same_i32(m->rows, rows, n);
}

static void plans(void) {
  /* one document of 16, W = 8 (halo 7 > L = 4), r = 0, N = 4 */
  const int32_t cu[2] = {0, 16};
  dsv4_docs docs;
  dsv4_layout *l = layouts(cu, NULL, 1, 16, 0, 4, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  cp_plan p0, p2;
  cp_plan_window(l, 4, 0, &p0);
  cp_plan_window(l, 4, 2, &p2);
  const int32_t s01[4] = {0, 1, 2, 3}, s02[3] = {1, 2, 3}, r20[3] = {0, 1, 2}, r21[4] = {3, 4, 5, 6};
  tu_check(p0.n_send == 2 && p0.n_recv == 0 && msg_is(&p0.send[0], 1, s01, 4) && msg_is(&p0.send[1], 2, s02, 3),
           "window plan rank 0: rows 0-3 to rank 1, rows 1-3 to rank 2 (W - 1 = 7 > L = 4)");
  tu_check(p2.n_recv == 2 && msg_is(&p2.recv[0], 0, r20, 3) && msg_is(&p2.recv[1], 1, r21, 4),
           "window plan rank 2: 3 halo rows from rank 0, 4 from rank 1");
  cp_plan_free(&p0);
  cp_plan_free(&p2);
  free_all(l, 4, &docs);
  /* r = 4, one document of 16, N = 2: rank 1's first slot (j = 2) needs rank 0's block [4, 8) */
  l = layouts(cu, NULL, 1, 16, 4, 2, 8, DSV4_SPLIT_CONTIGUOUS, &docs);
  cp_plan c0, c1;
  cp_plan_compressor(l, 2, 0, &c0);
  cp_plan_compressor(l, 2, 1, &c1);
  const int32_t src[4] = {8, 9, 10, 11}, dst[4] = {0, 1, 2, 3};
  tu_check(c0.n_send == 1 && msg_is(&c0.send[0], 1, src, 4) && c1.n_recv == 1 && msg_is(&c1.recv[0], 0, dst, 4),
           "compressor plan: rank 0 sends rows 8-11 of its buffer, rank 1 receives them into its halo rows 0-3");
  cp_plan_free(&c0);
  cp_plan_free(&c1);
  free_all(l, 2, &docs);
  /* zigzag N=2 over one document of 16 (W = 8): rank 1 holds [4,8) and [8,12): the second chunk's
   * halo [1,8) is partly its own rows (no message) */
  l = layouts(cu, NULL, 1, 16, 0, 2, 8, DSV4_SPLIT_ZIGZAG, &docs);
  cp_plan z1;
  cp_plan_window(l, 2, 1, &z1);
  tu_check(z1.n_self == 4 && z1.n_recv == 1 && z1.recv[0].peer == 0 && z1.recv[0].n == 3 + 4,
           "zigzag plan rank 1: 4 halo rows from itself, 7 from rank 0 (got self %lld, recv %lld)",
           (long long)z1.n_self, z1.n_recv ? (long long)z1.recv[0].n : -1LL);
  cp_plan_free(&z1);
  free_all(l, 2, &docs);
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

int main(void) {
  shards();
  halos();
  gather_index();
  plans();
  layout_rules();
  return tu_finish();
}
