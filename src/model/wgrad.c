/* wgrad.c: exact weight-gradient sums over global panels (wgrad.h). */
#include "wgrad.h"
#include "wgrad_int.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/gemm.h"
#include "util/par.h"
#include "util/xacc.h"
#include "util/xrows.h"

/* C blocks: at most BLOCK_COLS columns and about BLOCK_ELEMS elements: a block's exact sums (4 MiB)
 * stay in the last-level cache while every panel is added into them, and its products are large
 * enough to keep BLAS packing small (docs/perf.md: 256 KiB blocks paid more in packing than they
 * saved). (The message sizes: wgrad_int.h, which the planner shares.) */
#define BLOCK_COLS 512
#define BLOCK_ELEMS (1 << 18)
/* Message tags of the partial-panel rows (two per run: its A rows, its B rows). */
#define WGRAD_TAG 21000
#define WGRAD_TAGS 8000
/* The kind the rows' messages are counted under. */
#define ROWS DSV4_MSG_WGRAD_ROWS

typedef struct {
  int64_t panel;
  float *A, *B; /* [ext, M], [ext, N] in global row order */
  int64_t have;
} wpanel;

/* Runs of the pieces: consecutive rows of one global panel. */
static dsv4_status runs_of(const dsv4_wshape *s, const dsv4_wpiece *pc, int n_pc, wrun **out, int64_t *n_out) {
  dsv4_status rc = DSV4_OK;
  int64_t total = 0, k = 0;
  for (int p = 0; p < n_pc; p++) total += pc[p].n;
  DSV4_ALLOC(*out, total + 1);
  for (int p = 0; p < n_pc; p++) {
    const dsv4_wpiece *q = &pc[p];
    for (int64_t i = 0; i < q->n; i++) {
      const int64_t g = q->glob[i];
      DSV4_CHECK(g >= 0 && g < s->T, DSV4_ERR_STATE, "internal: weight-gradient row %lld outside [0, %lld)",
                 (long long)g, (long long)s->T);
      if (i == 0 || g != q->glob[i - 1] + 1 || g % s->P == 0)
        (*out)[k++] = (wrun){q->A + i * q->lda, q->B + i * q->ldb, q->lda, q->ldb, q->keep ? q->keep + i : NULL, g, 0};
      (*out)[k - 1].len++;
    }
  }
  *n_out = k;
  return DSV4_OK;
fail:
  free(*out);
  *out = NULL;
  return rc;
}

static int run_full(const dsv4_wshape *s, const wrun *r) { return r->len == extent(s, r->g0 / s->P); }

int dsv4_wg_run_masked(const wrun *r) {
  for (int64_t i = 0; r->keep && i < r->len; i++)
    if (!r->keep[i]) return 1;
  return 0;
}

void dsv4_wg_pack_cols(const wrun *runs, int64_t n_runs, int side_a, int64_t c0, int64_t w, float *dst) {
  for (int64_t j = 0; j < n_runs; j++) {
    const wrun *r = &runs[j];
    for (int64_t i = 0; i < r->len; i++, dst += w) {
      const float *src = side_a ? r->A + i * r->lda + c0 : r->B + i * r->ldb + c0;
      if (side_a && r->keep && !r->keep[i]) memset(dst, 0, sizeof(float) * (size_t)w);
      else memcpy(dst, src, sizeof(float) * (size_t)w);
    }
  }
}

/* Whether run r's rows already lie as pack_run would write them: A and B rows back to back and no
 * padding row (a product sink's kept rows, for one). */
static int run_dense(const dsv4_wshape *s, const wrun *r) {
  return r->lda == s->M && r->ldb == s->N && !dsv4_wg_run_masked(r);
}

/* Rows of run r into dense rows: A [len, M] (padding rows zero), B [len, N]. */
static void pack_run(const dsv4_wshape *s, const wrun *r, float *A, float *B) {
  dsv4_wg_pack_cols(r, 1, 1, 0, s->M, A);
  dsv4_wg_pack_cols(r, 1, 0, 0, s->N, B);
}

/* Every rank's list of `mine` runs (pairs g0, len) to every rank: all[2 (r cmax + k)] is rank r's
 * k-th run, cnt[r] its count. One all-gather of a record of DSV4_WG_RUNS_INLINE runs (count first) usually
 * says it all; a second one, of the longest list, when some rank has more. Collective. */
dsv4_status dsv4_wg_gather_lists(dsv4_xfer *x, const int64_t *pairs, int64_t mine, int64_t **all_out,
                                 int64_t **cnt_out, int64_t *cmax_out, int64_t *total_out) {
  dsv4_status rc = DSV4_OK;
  const int N = dsv4_wg_size(x);
  int64_t *cnt = NULL, *meta = NULL, *all = NULL;
  DSV4_ALLOC(cnt, N);
  int64_t cmax = mine > DSV4_WG_RUNS_INLINE ? mine : DSV4_WG_RUNS_INLINE, total = 0;
  DSV4_ALLOC(meta, 1 + 2 * cmax);
  meta[0] = mine;
  memcpy(meta + 1, pairs, sizeof(int64_t) * (size_t)(2 * mine));
  const int64_t rec = 1 + 2 * DSV4_WG_RUNS_INLINE;
  DSV4_ALLOC(all, rec * N);
  if (N > 1) {
    DSV4_TRY(dsv4_xfer_allgather(x, DSV4_MSG_WGRAD_ROWS, meta, all, sizeof(int64_t) * (size_t)rec));
  } else {
    memcpy(all, meta, sizeof(int64_t) * (size_t)rec);
  }
  cmax = 0;
  for (int r = 0; r < N; r++) cnt[r] = all[r * rec], cmax = cnt[r] > cmax ? cnt[r] : cmax, total += cnt[r];
  if (cmax > DSV4_WG_RUNS_INLINE) { /* the long lists (the same decision on every rank) */
    free(all);
    all = NULL;
    DSV4_ALLOC(all, 2 * cmax * N);
    if (N > 1) {
      DSV4_TRY(dsv4_xfer_allgather(x, DSV4_MSG_WGRAD_ROWS, meta + 1, all, sizeof(int64_t) * (size_t)(2 * cmax)));
    } else {
      memcpy(all, meta + 1, sizeof(int64_t) * (size_t)(2 * cmax));
    }
  } else { /* compact the records to the same layout: rank r's runs at all[2 (r cmax + k)] */
    cmax = DSV4_WG_RUNS_INLINE;
    for (int r = 0; r < N; r++) memmove(all + 2 * r * cmax, all + r * rec + 1, sizeof(int64_t) * (size_t)(2 * cmax));
  }
  *all_out = all, *cnt_out = cnt, *cmax_out = cmax, *total_out = total;
  all = cnt = NULL;
fail:
  free(meta);
  free(all);
  free(cnt);
  return rc;
}

/* Partial runs (of every rank) to the owners of their panels (the rank holding the panel's first
 * row); this rank's owned panels assembled in global row order. Collective. */
static dsv4_status gather_partials(dsv4_xfer *x, const dsv4_wshape *s, const wrun *runs, int64_t n_runs,
                                   wpanel **out, int64_t *n_out) {
  dsv4_status rc = DSV4_OK;
  const int N = dsv4_wg_size(x), me = x ? x->comm->rank : 0;
  const int64_t n_panels = (s->T + s->P - 1) / s->P;
  int64_t *cnt = NULL, *meta = NULL, *all = NULL, *owner = NULL, *slot = NULL;
  float *sendbuf = NULL;
  dsv4_comm_req **reqs = NULL;
  wpanel *pan = NULL;
  int64_t n_pan = 0, n_req = 0;
  int64_t mine = 0, cmax = 0, total = 0;
  for (int64_t j = 0; j < n_runs; j++) mine += !run_full(s, &runs[j]);
  DSV4_ALLOC(meta, 2 * mine + 1);
  for (int64_t j = 0, k = 0; j < n_runs; j++)
    if (!run_full(s, &runs[j])) meta[2 * k] = runs[j].g0, meta[2 * k + 1] = runs[j].len, k++;
  *out = NULL;
  *n_out = 0;
  DSV4_TRY(dsv4_wg_gather_lists(x, meta, mine, &all, &cnt, &cmax, &total));
  if (total == 0) goto fail; /* rc OK: nothing straddles */
  /* the owner of a panel: the rank with its lowest row among the partial runs */
  DSV4_ALLOC(owner, n_panels);
  DSV4_ALLOC(slot, n_panels);
  int64_t *low = slot; /* first used as the lowest row seen */
  for (int64_t p = 0; p < n_panels; p++) owner[p] = -1, low[p] = INT64_MAX;
  for (int r = 0; r < N; r++)
    for (int64_t k = 0; k < cnt[r]; k++) {
      const int64_t g0 = all[2 * (r * cmax + k)], p = g0 / s->P;
      if (g0 < low[p]) low[p] = g0, owner[p] = r;
    }
  for (int64_t p = 0; p < n_panels; p++) slot[p] = -1;
  for (int r = 0; r < N; r++)
    for (int64_t k = 0; k < cnt[r]; k++) {
      const int64_t p = all[2 * (r * cmax + k)] / s->P;
      if (owner[p] == me && slot[p] < 0) slot[p] = n_pan++;
    }
  DSV4_ALLOC(pan, n_pan + 1);
  for (int64_t p = 0; p < n_panels; p++)
    if (slot[p] >= 0) {
      wpanel *w = &pan[slot[p]];
      const int64_t ext = extent(s, p);
      w->panel = p;
      DSV4_ALLOC(w->A, ext * s->M);
      DSV4_ALLOC(w->B, ext * s->N);
    }
  DSV4_ALLOC(reqs, 2 * total + 1);
  int64_t send_rows = 0;
  for (int64_t j = 0; j < n_runs; j++)
    if (!run_full(s, &runs[j]) && owner[runs[j].g0 / s->P] != me && !run_dense(s, &runs[j]))
      send_rows += runs[j].len;
  DSV4_ALLOC(sendbuf, send_rows * (s->M + s->N));
  /* receives first, then sends; tags: the run's index in the gathered list */
  int64_t base = 0;
  for (int r = 0; r < N; r++) {
    for (int64_t k = 0; k < cnt[r]; k++) {
      const int64_t g0 = all[2 * (r * cmax + k)], len = all[2 * (r * cmax + k) + 1], p = g0 / s->P;
      const int tag = WGRAD_TAG + (int)((2 * (base + k)) % WGRAD_TAGS);
      if (owner[p] != me) continue;
      wpanel *w = &pan[slot[p]];
      w->have += len;
      if (r == me) continue;
      const int64_t at = g0 - p * s->P;
      DSV4_TRY(dsv4_xfer_irecv(x, ROWS, w->A + at * s->M, sizeof(float) * (size_t)(len * s->M), r, tag, &reqs[n_req++]));
      DSV4_TRY(dsv4_xfer_irecv(x, ROWS, w->B + at * s->N, sizeof(float) * (size_t)(len * s->N), r, tag + 1,
                               &reqs[n_req++]));
    }
    base += cnt[r];
  }
  int64_t my_base = 0;
  for (int r = 0; r < me; r++) my_base += cnt[r];
  float *sb = sendbuf;
  for (int64_t j = 0, k = 0; j < n_runs; j++) {
    const wrun *ru = &runs[j];
    if (run_full(s, ru)) continue;
    const int64_t p = ru->g0 / s->P;
    const int tag = WGRAD_TAG + (int)((2 * (my_base + k++)) % WGRAD_TAGS);
    if (owner[p] == me) {
      const int64_t at = ru->g0 - p * s->P;
      pack_run(s, ru, pan[slot[p]].A + at * s->M, pan[slot[p]].B + at * s->N);
      continue;
    }
    const float *a = ru->A, *b = ru->B;
    if (!run_dense(s, ru)) { /* packed; dense rows (a sink's kept rows) go as they lie */
      float *pa = sb, *pb = sb + ru->len * s->M;
      pack_run(s, ru, pa, pb);
      sb = pb + ru->len * s->N;
      a = pa, b = pb;
    }
    DSV4_TRY(dsv4_xfer_isend(x, ROWS, a, sizeof(float) * (size_t)(ru->len * s->M), (int)owner[p], tag, &reqs[n_req++]));
    DSV4_TRY(dsv4_xfer_isend(x, ROWS, b, sizeof(float) * (size_t)(ru->len * s->N), (int)owner[p], tag + 1,
                             &reqs[n_req++]));
  }
  if (n_req) DSV4_TRY(dsv4_xfer_wait(x, ROWS, reqs, (int)n_req));
  n_req = 0;
  for (int64_t q = 0; q < n_pan; q++)
    DSV4_CHECK(pan[q].have == extent(s, pan[q].panel), DSV4_ERR_STATE,
               "internal: weight-gradient panel %lld has %lld of its %lld rows", (long long)pan[q].panel,
               (long long)pan[q].have, (long long)extent(s, pan[q].panel));
  *out = pan;
  *n_out = n_pan;
  pan = NULL;
fail:
  if (n_req && x) dsv4_comm_wait(x->comm, reqs, (int)n_req);
  for (int64_t q = 0; pan && q < n_pan; q++) free(pan[q].A), free(pan[q].B);
  free(pan);
  free(cnt);
  free(meta);
  free(all);
  free(owner);
  free(slot);
  free(sendbuf);
  free(reqs);
  return rc;
}

static void panels_free(wpanel *pan, int64_t n) {
  for (int64_t q = 0; pan && q < n; q++) free(pan[q].A), free(pan[q].B);
  free(pan);
}

blocking dsv4_wg_blocks(const dsv4_wshape *s) {
  blocking b;
  b.nb = s->N < BLOCK_COLS ? s->N : BLOCK_COLS;
  b.mb = BLOCK_ELEMS / b.nb;
  if (b.mb > s->M) b.mb = s->M;
  if (b.mb < 1) b.mb = 1;
  b.bm = (s->M + b.mb - 1) / b.mb;
  b.bn = (s->N + b.nb - 1) / b.nb;
  return b;
}

/* View v's product restricted to rows [m0, m0 + mb) and columns [n0, n0 + nb): fp32 into t [mb, nb].
 * Columns in blocks of sw (the last one narrower): every block gets the bits of a call of its own,
 * in one call for all of them where this BLAS allows (dsv4_blocks_merge: the rows' operand is then
 * packed once, not once per block), else one call per block. Rows in blocks of sm alike
 * (dsv4_rowblocks_merge; blocks in one direction only: sm < mb needs nb <= sw). za: room for
 * len x mb floats (the masked A). */
static void panel_product(const wview *v, int64_t m0, int64_t mb, int64_t sm, int64_t n0, int64_t nb, int64_t sw,
                          float *t, float *za, dsv4_impl impl) {
  const float *a = v->A + (m0 - v->a0);
  int64_t la = v->lda;
  if (v->keep) { /* padding rows: their A counts as zero */
    for (int64_t i = 0; i < v->len; i++) {
      if (v->keep[i]) memcpy(za + i * mb, a + i * v->lda, sizeof(float) * (size_t)mb);
      else memset(za + i * mb, 0, sizeof(float) * (size_t)mb);
    }
    a = za;
    la = mb;
  }
  const float *b = v->B + (n0 - v->b0);
  const int64_t last = nb - (nb - 1) / sw * sw; /* the narrowest block */
  const int64_t mlast = mb - (mb - 1) / sm * sm; /* the lowest row block */
  if (impl == DSV4_IMPL_NAIVE) dsv4_gemm_tn_ref(mb, nb, v->len, 1.0f, a, la, b, v->ldb, 0.0f, t, nb);
  else if (mb > sm && !dsv4_rowblocks_merge(mlast, nb, v->len))
    for (int64_t r = 0; r < mb; r += sm)
      dsv4_gemm_tn(mb - r < sm ? mb - r : sm, nb, v->len, 1.0f, a + r, la, b, v->ldb, 0.0f, t + r * nb, nb);
  else if (nb <= sw || dsv4_blocks_merge(mb, last, v->len))
    dsv4_gemm_tn(mb, nb, v->len, 1.0f, a, la, b, v->ldb, 0.0f, t, nb);
  else
    for (int64_t c = 0; c < nb; c += sw)
      dsv4_gemm_tn(mb, nb - c < sw ? nb - c : sw, v->len, 1.0f, a, la, b + c, v->ldb, 0.0f, t + c, nb);
}

int dsv4_wg_group(void) {
  const char *g = getenv("DSV4_WGRAD_GROUP");
  const int k = g ? atoi(g) : 0;
  return k >= 1 && k <= DSV4_WG_GROUP ? k : DSV4_WG_GROUP;
}

int dsv4_wg_strip_sum(const wview *v, int64_t nv, int64_t m0, int64_t mb, int64_t sm, int64_t n0, int64_t nb,
                      int64_t sw, int64_t G, float *t, int64_t *acc, int64_t wacc, int64_t astride, int fresh,
                      float *out, int64_t ldo, int beta, dsv4_impl impl) {
  const int64_t mn = mb * nb;
  float *za = t + G * mn; /* past the group's products */
  const float *tr[DSV4_WG_GROUP];
  int bad = 0;
  if (out && nv <= G) { /* one group: no sums in memory */
    for (int64_t q = 0; q < nv; q++) panel_product(&v[q], m0, mb, sm, n0, nb, sw, t + q * mn, za, impl);
    for (int64_t r = 0; r < mb; r++) {
      for (int64_t q = 0; q < nv; q++) tr[q] = t + q * mn + r * nb;
      bad |= dsv4_xacc_sumk(out + r * ldo, tr, (int)nv, nb, beta);
    }
    return bad;
  }
  for (int64_t g0 = 0; g0 < nv || (fresh && g0 == 0); g0 += G) {
    const int64_t k = nv - g0 < G ? nv - g0 : G;
    for (int64_t q = 0; q < k; q++) panel_product(&v[g0 + q], m0, mb, sm, n0, nb, sw, t + q * mn, za, impl);
    for (int64_t r = 0; r < mb; r++)
      for (int64_t c = 0, i = 0; c < nb; c += sw, i++) {
        int64_t *h = acc + i * astride + r * 2 * wacc;
        for (int64_t q = 0; q < k; q++) tr[q] = t + q * mn + r * nb + c;
        bad |= dsv4_xacc_addk_(h, h + wacc, tr, (int)k, nb - c < sw ? nb - c : sw, fresh && g0 == 0);
      }
    if (k == 0) break;
  }
  for (int64_t r = 0; out && r < mb; r++) /* the adds leave lo normalised */
    for (int64_t c = 0, i = 0; c < nb; c += sw, i++) {
      const int64_t *h = acc + i * astride + r * 2 * wacc;
      dsv4_xacc_store(out + r * ldo + c, h, h + wacc, nb - c < sw ? nb - c : sw, beta);
    }
  return bad;
}

int dsv4_wg_block_sum(const wview *v, int64_t nv, int64_t m0, int64_t mb, int64_t n0, int64_t nb, float *t,
                      int64_t *acc, int64_t wacc, int fresh, float *out, int64_t ldo, int beta, dsv4_impl impl) {
  return dsv4_wg_strip_sum(v, nv, m0, mb, mb, n0, nb, nb, dsv4_wg_group(), t, acc, wacc, 0, fresh, out, ldo, beta,
                           impl);
}

/* The products a block adds: every full run and every assembled panel. */
static dsv4_status views_of(const dsv4_wshape *s, const wrun *runs, int64_t n_runs, const wpanel *pan,
                            int64_t n_pan, wview **out, int64_t *n_out) {
  dsv4_status rc = DSV4_OK;
  int64_t n = 0;
  DSV4_ALLOC(*out, n_runs + n_pan + 1);
  for (int64_t j = 0; j < n_runs; j++) {
    const wrun *r = &runs[j];
    if (run_full(s, r))
      (*out)[n++] = (wview){r->A, r->B, r->lda, r->ldb, 0, 0, r->len, dsv4_wg_run_masked(r) ? r->keep : NULL};
  }
  for (int64_t q = 0; q < n_pan; q++)
    (*out)[n++] = (wview){pan[q].A, pan[q].B, s->M, s->N, 0, 0, extent(s, pan[q].panel), NULL};
  *n_out = n;
fail:
  return rc;
}

/* The streamed products' sums and fp32 blocks, kept by the calling thread from one product to the
 * next of a backward (fresh blocks were faulted in and cleared by the kernel for every product),
 * released at the end of the backward (dsv4_wsinks_finish / drop). */
/* The calling thread's active sinks (dsv4_wsinks_begin .. finish / drop). */
static _Thread_local dsv4_wsinks *active_sinks;

static _Thread_local struct {
  int64_t *acc;
  float *tb;
  int64_t n_acc, n_tb;
} kept;

static dsv4_status scratch(int64_t n_acc, int64_t n_tb, int64_t **acc, float **tb) {
  dsv4_status rc = DSV4_OK;
  if (n_acc > kept.n_acc) {
    free(kept.acc);
    kept.n_acc = 0;
    DSV4_ALLOC(kept.acc, n_acc);
    kept.n_acc = n_acc;
  }
  if (n_tb > kept.n_tb) {
    free(kept.tb);
    kept.n_tb = 0;
    DSV4_ALLOC(kept.tb, n_tb);
    kept.n_tb = n_tb;
  }
  *acc = kept.acc;
  *tb = kept.tb;
fail:
  return rc;
}

static void scratch_release(void) {
  free(kept.acc);
  free(kept.tb);
  memset(&kept, 0, sizeof kept);
}

static dsv4_status allreduce_i64(dsv4_xfer *x, int64_t *v, size_t n) {
  if (dsv4_wg_size(x) < 2 || n == 0) return DSV4_OK;
  return dsv4_xfer_allreduce_i64(x, DSV4_MSG_WGRAD_SUMS, v, n);
}

/* A superblock under CP (wgrad_exact): its blocks, its sums (then this rank's slice of their total),
 * the bad-term flag of this rank's products. */
typedef struct {
  int64_t b0, nbk;
  wsuper sp;
  int bad;
  int64_t *sums, *mine;
} wsuper_run;

/* Rows of sums reduce-scattered at a time (sums_chunk): about 512 KiB of int64, which stay in
 * the L2 cache from their arrival to their rounding (docs/perf.md: a third less time than
 * reduce-scattering a superblock's whole slice and rounding it afterwards). */
#define RS_CHUNK_INT64 65536
static size_t sums_chunk(int64_t w2, int64_t rows) {
  int64_t c = RS_CHUNK_INT64 / w2;
  c = c < rows ? c : rows;
  return (size_t)((c > 0 ? c : 1) * w2);
}

/* A superblock's rows of this rank's slice as their totals arrive (dsv4_xfer_reduce_scatter_i64_each):
 * each rounded once into the rank's floats. */
typedef struct {
  const dsv4_wshape *s;
  const blocking *bl;
  const wsuper_run *r;
  float *fmine;
  int64_t first, rows; /* the slice's first row in the superblock; the superblock's rows */
} super_round;

static void super_round_rows(void *ctx, size_t off, int64_t *part, size_t c) {
  const super_round *q = ctx;
  const int64_t nb = q->bl->nb, w2 = 2 * nb, i0 = (int64_t)off / w2;
  for (int64_t t = 0; t < (int64_t)c / w2; t++) {
    const int64_t i = i0 + t, g = q->first + i;
    if (g >= q->rows) break; /* the last slice's padding */
    const wblock k = dsv4_wg_block(q->s, q->bl, q->r->b0 + g / q->bl->mb);
    if (g % q->bl->mb >= k.mb) continue;
    int64_t *h = part + t * w2;
    dsv4_xacc_normalize(h, h + nb, k.nb);
    dsv4_xacc_store(q->fmine + i * nb, h, h + nb, k.nb, 0);
  }
}

/* Reduce-scatters r's sums, rounds this rank's rows of their total as they arrive, all-gathers every
 * rank's floats (fall: N fslice floats, then this rank's slice) and adds them to C. Collective. */
static dsv4_status super_reduce(dsv4_xfer *x, const dsv4_wshape *s, const blocking *bl, const wsuper_run *r,
                                float *fall, float *C, int nt, int64_t *any_bad) {
  dsv4_status rc = DSV4_OK;
  const int N = x->comm->size, me = x->comm->rank;
  const int64_t rows = r->nbk * bl->mb, w2 = 2 * bl->nb, R = r->sp.rows, fs = r->sp.fslice;
  float *fmine = fall + (int64_t)N * fs;
  (void)nt; /* in a pragma only (builds without OpenMP) */
  memset(r->sums + rows * w2, 0, sizeof(int64_t) * (size_t)((N * R - rows) * w2)); /* the slices' padding */
  super_round q = {s, bl, r, fmine, me * R, rows};
  /* r->mine (a slice's room) holds the chunk in flight */
  DSV4_TRY(dsv4_xfer_reduce_scatter_i64_each(x, DSV4_MSG_WGRAD_SUMS, r->sums, (size_t)(R * w2), r->mine,
                                             sums_chunk(w2, R), super_round_rows, &q));
  fmine[fs - 1] = (float)(r->bad != 0); /* every rank's flag travels with its floats */
  DSV4_TRY(dsv4_xfer_allgather(x, DSV4_MSG_WGRAD_ALLGATHER, fmine, fall, sizeof(float) * (size_t)fs));
  for (int q = 0; q < N; q++) *any_bad |= fall[(int64_t)q * fs + fs - 1] != 0.0f;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t j = 0; j < r->nbk; j++) {
    const wblock k = dsv4_wg_block(s, bl, r->b0 + j);
    for (int64_t q = 0; q < k.mb; q++) {
      const int64_t g = j * bl->mb + q;
      const float *v = fall + (g / R) * fs + (g % R) * bl->nb;
      for (int64_t e = 0; e < k.nb; e++) C[(k.m0 + q) * s->N + k.n0 + e] += v[e];
    }
  }
fail:
  return rc;
}

/* Blocks of a superblock one thread sums at once (a strip: one call per panel for all of them, which
 * packs the panel's rows of A once instead of once per block): only as many as let the nv products
 * go into the sums in one group (a group of fewer panels reads and writes the sums more often, and
 * a strip's larger products leave the L2 cache: both cost more than the packing saved, docs/perf.md),
 * and as many as keep every thread busy, at most the superblock. */
int64_t dsv4_wg_strip_cap(int nt, int64_t nv) {
  int64_t c = (DSV4_WG_SUPER_BLOCKS + nt - 1) / (nt > 1 ? nt : 1);
  const int64_t fit = nv > 0 ? DSV4_WG_ROOM / nv : DSV4_WG_ROOM;
  const char *e = getenv("DSV4_WGRAD_STRIP");
  if (e && atoi(e) > 0) c = atoi(e) < c ? atoi(e) : c;
  c = c < fit ? c : fit;
  return c > 0 ? c : 1;
}
/* Panels per group of a strip of c blocks: its products fill the room, a block's group at most. */
int64_t dsv4_wg_strip_group(int64_t c) {
  const int64_t g = DSV4_WG_ROOM / c, u = dsv4_wg_group();
  return g < u ? (g > 0 ? g : 1) : u;
}
/* The strips of the superblock's blocks [b0, b0 + nbk): runs of consecutive blocks of one block row,
 * at most cap long; strip q is blocks b0 + st[q] .. b0 + st[q + 1] - 1. Returns their count. */
static int strips_of(const blocking *bl, int64_t b0, int64_t nbk, int64_t cap, int64_t *st) {
  int n = 0;
  st[0] = 0;
  for (int64_t j = 1; j <= nbk; j++)
    if (j == nbk || (b0 + j) % bl->bn == 0 || j - st[n] == cap) st[++n] = j;
  return n;
}

dsv4_status dsv4_wgrad_exact(dsv4_xfer *x, const dsv4_wshape *shape, const dsv4_wpiece *pc, int n_pc, float *C,
                             dsv4_impl impl, const char *what) {
  dsv4_status rc = DSV4_OK;
  const dsv4_wshape *s = shape;
  wrun *runs = NULL;
  wpanel *pan = NULL;
  wview *views = NULL;
  int64_t n_runs = 0, n_pan = 0, n_views = 0, *acc = NULL;
  float *tb = NULL;
  int bad = 0;
  if (s->M <= 0 || s->N <= 0) return DSV4_OK;
  DSV4_TRY(runs_of(s, pc, n_pc, &runs, &n_runs));
  if (dsv4_wg_rows_cheaper(s, dsv4_wg_size(x))) { /* short streams: rows cross, not sums (wgrad_rows.c) */
    DSV4_TRY(dsv4_wg_by_rows(x, s, runs, n_runs, C, impl, &bad));
    DSV4_CHECK(!bad, DSV4_ERR_ARG, "%s: a weight-gradient term is not finite or not below 2^24 (the exact sums' range)",
               what);
    goto fail;
  }
  DSV4_TRY(gather_partials(x, s, runs, n_runs, &pan, &n_pan));
  DSV4_TRY(views_of(s, runs, n_runs, pan, n_pan, &views, &n_views));
  const blocking bl = dsv4_wg_blocks(s);
  const int nt = dsv4_nthreads();
  const int64_t nblocks = bl.bm * bl.bn, per = bl.mb * 2 * bl.nb;
  const int64_t tper = dsv4_wg_tfloats(&bl, s->P), cap = dsv4_wg_strip_cap(nt, n_views);
  /* One rank: each strip's value added to C as it is summed (sums in memory, one strip per thread,
   * only past one group of panels). N ranks: superblocks of DSV4_WG_SUPER_BLOCKS blocks whose exact
   * sums are reduce-scattered in N equal slices of rows, each rank rounding its slice, whose floats
   * are then all-gathered: 16 + 4 bytes per element and rank instead of an all-reduce's 2 x 16, and
   * a superblock's memory whatever N (wgrad_int.h, dsv4_wg_super). Either way a thread sums a strip
   * of a superblock's blocks at once (strips_of), each panel's product in one call. */
  const int one = dsv4_wg_size(x) < 2, N = one ? 1 : x->comm->size;
  const int64_t sbk = DSV4_WG_SUPER_BLOCKS, w2 = 2 * bl.nb;
  const wsuper sup = dsv4_wg_super(&bl, sbk, N);
  const int64_t n_acc = one ? (n_views > dsv4_wg_strip_group(cap) ? per * cap * nt : 0) : (N + 1) * sup.rows * w2;
  DSV4_TRY(scratch(n_acc, tper * nt + (one ? 0 : (int64_t)(N + 1) * sup.fslice), &acc, &tb));
  float *fall = one ? NULL : tb + tper * nt;
  int64_t any_bad = 0;
  for (int64_t b0 = 0; b0 < nblocks; b0 += sbk) {
    const int64_t nbk = nblocks - b0 < sbk ? nblocks - b0 : sbk;
    int64_t st[DSV4_WG_SUPER_BLOCKS + 1];
    const int ns = strips_of(&bl, b0, nbk, cap, st);
    bad = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) reduction(| : bad)
    for (int q = 0; q < ns; q++) {
      const int id = dsv4_thread_id();
      const int64_t j0 = st[q], c = st[q + 1] - j0;
      const wblock k = dsv4_wg_block(s, &bl, b0 + j0), kl = dsv4_wg_block(s, &bl, b0 + j0 + c - 1);
      /* N ranks: block j's rows at row j mb of the superblock, hi then lo at bl.nb (an edge block's
       * unused entries zero: they travel too); one rank: the thread's strip of blocks, alike */
      int64_t *a = one ? (acc ? acc + id * per * cap : NULL) : acc + j0 * per;
      for (int64_t j = 0; !one && j < c; j++)
        if (k.mb < bl.mb || (j == c - 1 && kl.nb < bl.nb)) memset(a + j * per, 0, sizeof(int64_t) * (size_t)per);
      dsv4_blas_serial();
      bad |= dsv4_wg_strip_sum(views, n_views, k.m0, k.mb, k.mb, k.n0, kl.n0 + kl.nb - k.n0, bl.nb,
                               dsv4_wg_strip_group(c), tb + id * tper, a, bl.nb, per, 1,
                               one ? C + k.m0 * s->N + k.n0 : NULL, s->N, 1, impl);
    }
    if (one) {
      any_bad |= bad;
      continue;
    }
    wsuper_run r = {.b0 = b0, .nbk = nbk, .sp = dsv4_wg_super(&bl, nbk, N), .bad = bad, .sums = acc};
    r.mine = acc + N * r.sp.rows * w2;
    DSV4_TRY(super_reduce(x, s, &bl, &r, fall, C, nt, &any_bad));
  }
  DSV4_CHECK(!any_bad, DSV4_ERR_ARG,
             "%s: a weight-gradient term is not finite or not below 2^24 (the exact sums' range)", what);
fail:
  if (!active_sinks) scratch_release(); /* a call outside a backward keeps nothing */
  free(runs);
  free(views);
  panels_free(pan, n_pan);
  return rc;
}

/* Bytes of the whole-weight product sinks a recomputed backward would need (double sums: 4 per
 * element beside a fresh backward's zero tensor, which holds their high halves, none for the rows
 * whose low halves the zero wo_b, wq_a and wkv gradients hold (layer.c lends them, then registers
 * the wo_a groups and wq_b, each taking the whole rows that still fit); not counted: 8 beside a
 * tensor that accumulates, and blocks that leave them for xacc sums, which the caller and the data
 * decide), and of the rows that would replace them (dq and the rotated output, n x H D each; the
 * indexer queries' d qI, d w); and per row a sink copies until its panel's rows meet (rows of
 * partial panel runs, stash): the row of both factors of every product that goes into a sink. */
static void keep_costs(const dsv4_config *cf, int selects, int64_t n, uint64_t *sink_bytes,
                       uint64_t *row_bytes, uint64_t *stash_row_bytes) {
  const uint64_t H = (uint64_t)cf->n_heads, D = (uint64_t)cf->head_dim, dq = (uint64_t)cf->q_lora_rank;
  const uint64_t G = (uint64_t)cf->o_groups, Ro = (uint64_t)cf->o_lora_rank, d = (uint64_t)cf->dim;
  const uint64_t Hi = (uint64_t)cf->index_n_heads, Di = (uint64_t)cf->index_head_dim;
  uint64_t pool[3] = {d * G * Ro, dq * d, D * d}; /* the lent wo_b, wq_a, wkv gradients (layer.c) */
  uint64_t el = 0, row = 2 * H * D, stash = G * (Ro + (H / G) * D) + H * D + dq;
  for (uint64_t g = 0; g <= G; g++) { /* the wo_a groups, then wq_b: whole rows, first fit */
    const uint64_t w = g < G ? (H / G) * D : dq;
    uint64_t rows = g < G ? Ro : H * D;
    for (int j = 0; j < 3; j++) {
      const uint64_t fit = pool[j] / w < rows ? pool[j] / w : rows;
      pool[j] -= fit * w, rows -= fit;
    }
    el += rows * w;
  }
  if (selects) el += Hi * Di * dq + Hi * d, row += Hi * Di + Hi, stash += Hi * Di + dq + Hi + d;
  *sink_bytes = el * sizeof(uint32_t);
  *row_bytes = (uint64_t)(n > 0 ? n : 0) * row * sizeof(float);
  *stash_row_bytes = stash * sizeof(float);
}

int dsv4_wgrad_keep_rows(const dsv4_config *cf, int selects, int64_t n, int64_t partial_max) {
  /* DSV4_WGRAD_KEEP=rows / sums: a test's choice (its tiny shapes always keep rows; both give the
   * same bits, which is what it checks) */
  const char *force = getenv("DSV4_WGRAD_KEEP");
  if (force && !strcmp(force, "rows")) return 1;
  if (force && !strcmp(force, "sums")) return 0;
  uint64_t sinks, rows, stash;
  keep_costs(cf, selects, n, &sinks, &rows, &stash);
  /* the sinks' side as on the rank that keeps the most rows of partial panels: every rank must
   * choose the same, and the peak is that rank's */
  return rows <= sinks + (uint64_t)(partial_max > 0 ? partial_max : 0) * stash;
}

uint64_t dsv4_wgrad_bytes(const dsv4_config *cf, int selects, int recompute, int threads, int64_t n,
                          int64_t T, int ranks, int64_t partial, int64_t partial_max) {
  const uint64_t per_thread = sizeof(float) * (uint64_t)BLOCK_ELEMS * (DSV4_WG_ROOM + 512u / BLOCK_COLS);
  const int64_t d = cf->dim, P = dsv4_panel_rows(T), panels = (T + P - 1) / P;
  const uint64_t sums = (uint64_t)BLOCK_ELEMS * 2 * sizeof(int64_t); /* one block's */
  const uint64_t nthr = (uint64_t)(threads > 1 ? threads : 1);
  /* under CP a superblock's sums and floats (dsv4_wgrad_exact), of the largest block */
  const blocking big = {BLOCK_ELEMS / BLOCK_COLS, BLOCK_COLS, 1, 1};
  const wsuper sp = dsv4_wg_super(&big, DSV4_WG_SUPER_BLOCKS, ranks);
  const uint64_t super = (uint64_t)(ranks + 1) * ((uint64_t)sp.rows * 2 * BLOCK_COLS * sizeof(int64_t) +
                                                  (uint64_t)sp.fslice * sizeof(float));
  /* (and the transport's ring buffer for int64 reduce-scatters, cp/comm.h) */
  const uint64_t ring = 2 * DSV4_COMM_RING_INT64 * sizeof(int64_t);
  const uint64_t streamed = ranks > 1 ? super + ring : panels > DSV4_WG_GROUP ? sums * nthr : 0;
  uint64_t sinks = 0, rows = 0, stash = 0;
  keep_costs(cf, selects, n, &sinks, &rows, &stash);
  const int keep = dsv4_wgrad_keep_rows(cf, selects, n, partial_max);
  /* the products that move rows instead of sums (one at a time): the largest one's buffers */
  const int64_t H = cf->n_heads, D = cf->head_dim, G = cf->o_groups, Ro = cf->o_lora_rank, dq = cf->q_lora_rank;
  /* with sinks, one product's chunk at a time at finish (dsum_store): the largest */
  const int64_t Hi = cf->index_n_heads, HiDi = Hi * cf->index_head_dim;
  const int64_t sink_shapes[4][2] = {{Ro, (H / G) * D}, {H * D, dq}, {HiDi, dq}, {Hi, d}};
  uint64_t chunk = 0;
  for (int i = 0; i < (selects ? 4 : 2); i++) {
    const int64_t w = sink_shapes[i][1];
    const wdsum ds = dsv4_wg_dsum(sink_shapes[i][0], w, ranks > 1 ? ranks : 1);
    const uint64_t b = (uint64_t)((ranks > 1 ? ranks : 1) + 1) * (uint64_t)(ds.slice * w) * (2 * sizeof(int64_t) + sizeof(float));
    chunk = b > chunk ? b : chunk;
  }
  /* one rank, at most two chunks (panels): the last rounds at once, the first writes no low word
   * (dsv4_wsinks_last_rows), so the sinks' own words stay unmapped */
  const int untouched = ranks <= 1 && panels <= 2;
  const uint64_t kept =
      recompute
          ? (keep ? rows : (untouched ? 0 : sinks + chunk) + (uint64_t)(partial > 0 ? partial : 0) * stash)
          : 0;
  const dsv4_wshape shapes[] = {{d, G * Ro, P, T}, {D, d, P, T}, {dq, d, P, T}, {Ro, (H / G) * D, P, T},
                                {H * D, dq, P, T}, {(int64_t)cf->index_n_heads * cf->index_head_dim, dq, P, T},
                                {cf->index_n_heads, d, P, T}};
  uint64_t moved = 0;
  for (int i = 0; i < (selects ? 7 : 5); i++) {
    const uint64_t b = dsv4_wg_rows_bytes(&shapes[i], ranks, n, threads);
    if (b > moved) moved = b;
  }
  return kept + (streamed > moved ? streamed : moved) + per_thread * nthr;
}

/* ---- sinks ----------------------------------------------------------------------------------- */

void dsv4_wsinks_begin(dsv4_wsinks *s, dsv4_impl impl, const char *what) {
  memset(s, 0, sizeof *s);
  s->last_rows = -1;
  s->impl = impl;
  s->what = what;
  s->active = 1;
  active_sinks = s;
}

dsv4_wsink *dsv4_wsinks_of(dsv4_wsinks *s, const float *out) {
  for (int i = 0; s && i < s->count; i++)
    if (s->s[i].out == out) return &s->s[i];
  return NULL;
}

dsv4_status dsv4_wsinks_add(dsv4_wsinks *s, float *out, int64_t n, int64_t w, int64_t *external, int local) {
  dsv4_status rc = DSV4_OK;
  if (!out || n <= 0 || dsv4_wsinks_of(s, out)) return DSV4_OK;
  DSV4_CHECK(s->count < DSV4_WSINKS_MAX, DSV4_ERR_STATE, "internal: too many gradient sinks");
  DSV4_CHECK(w > 0 && n % w == 0, DSV4_ERR_STATE, "internal: sink of %lld elements in rows of %lld", (long long)n,
             (long long)w);
  dsv4_wsink *k = &s->s[s->count];
  memset(k, 0, sizeof *k);
  k->out = out, k->n = n, k->w = w, k->local = local;
  if (external) {
    k->acc = external;
    k->external = 1;
  } else {
    DSV4_ALLOC(k->acc, 2 * n);
  }
  if (!local) {
    DSV4_ALLOC(k->g0, n);
    memcpy(k->g0, out, sizeof(float) * (size_t)n);
  }
  memset(out, 0, sizeof(float) * (size_t)n); /* what a reference path adds here is settled at finish */
  s->count++;
fail:
  if (rc != DSV4_OK && s->count < DSV4_WSINKS_MAX) {
    if (!s->s[s->count].external) free(s->s[s->count].acc);
    free(s->s[s->count].g0);
    memset(&s->s[s->count], 0, sizeof s->s[s->count]);
  }
  return rc;
}

/* Whether every bit of x [n] is zero (-0.0 is not: a tensor lent to the sums must be zeros). */
static int zero_bits(const float *x, int64_t n) {
  const dsv4_u32a *c = (const dsv4_u32a *)x;
  uint32_t any = 0;
  for (int64_t e = 0; e < n; e++) any |= c[e];
  return !any;
}

/* The row after piece j of sink k's low words. */
static inline int64_t lo_end(const dsv4_wsink *k, int j) {
  return j + 1 < k->n_lo ? k->lo[j + 1].row : k->shape.M;
}

dsv4_status dsv4_wsinks_add_product(dsv4_wsinks *s, float *C, const dsv4_wshape *shape) {
  dsv4_status rc = DSV4_OK;
  if (!C || shape->M <= 0 || shape->N <= 0 || dsv4_wsinks_of(s, C)) return DSV4_OK;
  DSV4_CHECK(s->count < DSV4_WSINKS_MAX, DSV4_ERR_STATE, "internal: too many gradient sinks");
  const blocking bl = dsv4_wg_blocks(shape);
  dsv4_wsink *k = &s->s[s->count];
  memset(k, 0, sizeof *k);
  k->out = C, k->n = shape->M * shape->N, k->w = shape->N, k->shape = *shape, k->n_blocks = bl.bm * bl.bn;
  k->rows_left = -1;
  /* the low halves: whole rows from the lent tensors while rows fit (zeros, as a fresh allocation's
   * pages), the rest allocated */
  const int64_t w = shape->N, rows = shape->M;
  int64_t row = 0;
  for (int j = 0; j < s->n_pool && row < rows; j++) {
    int64_t fit = (s->pool[j].n - s->pool[j].used) / w;
    if (fit > rows - row) fit = rows - row;
    if (fit <= 0) continue;
    k->lo[k->n_lo++] = (dsv4_wlo){s->pool[j].p + s->pool[j].used, row, j};
    s->pool[j].used += fit * w;
    row += fit;
  }
  if (row < rows) {
    /* zero pages until a block's first add writes them (dsum_block); plain calloc: no huge pages,
     * whose first write would make 2 MiB of not yet used sums resident at once */
    uint32_t *lo = calloc((size_t)((rows - row) * w), sizeof *lo);
    DSV4_CHECK(lo, DSV4_ERR_NOMEM, "out of memory for %lld low words of weight sums", (long long)((rows - row) * w));
    k->lo[k->n_lo++] = (dsv4_wlo){lo, row, -1};
  }
  DSV4_ALLOC(k->promo, k->n_blocks);
  DSV4_ALLOC(k->dused, k->n_blocks);
  /* a fresh backward's tensor is zeros: its floats hold the doubles' high halves until finish */
  if (!zero_bits(C, k->n)) DSV4_ALLOC(k->dhi, k->n);
  else k->dhi = (dsv4_u32a *)C, k->rows_left = s->last_rows; /* (its last add may then write it) */
  s->count++;
fail:
  if (rc != DSV4_OK && s->count < DSV4_WSINKS_MAX) {
    const dsv4_wsink *f = &s->s[s->count];
    for (int j = 0; j < f->n_lo; j++) { /* lent rows back to their tensors (this sink took their tops) */
      if (f->lo[j].pool >= 0) s->pool[f->lo[j].pool].used -= (lo_end(f, j) - f->lo[j].row) * f->w;
      else free((void *)f->lo[j].p);
    }
    free(s->s[s->count].promo);
    free(s->s[s->count].dused);
    memset(&s->s[s->count], 0, sizeof s->s[s->count]);
  }
  return rc;
}

void dsv4_wsinks_last_rows(dsv4_wsinks *s, int64_t rows) { s->last_rows = rows > 0 ? rows : -1; }

int dsv4_wsinks_lend(dsv4_wsinks *s, float *spare, int64_t n) {
  if (!spare || n <= 0 || s->n_pool == DSV4_WSINKS_POOLS || !zero_bits(spare, n)) return 0;
  s->pool[s->n_pool++] = (dsv4_wpool){(dsv4_u32a *)spare, n, 0};
  return 1;
}

/* ---- double sums ------------------------------------------------------------------------------
 * A recomputed backward meets a product's panels chunk by chunk, so each weight element's exact sum
 * must live from the first chunk to the last. util/xacc.h's sums take 16 bytes per element (1.3 GB
 * for V4-Flash's wo_a and wq_b, more than the activations recomputation saves); here a sum is one
 * double while it stays exact, stored as two 32-bit halves so that the high ones can live in the
 * gradient tensor itself while it is zero (a fresh backward's: 4 bytes per element more, not 8).
 * Each panel's fp32 product is put on xacc's grid (2^-66: what dsv4_xacc_add1 adds) and added with
 * TwoSum's error term as the test. Terms whose exponents lie
 * further apart than a double's 53 bits make an add inexact; the block is then moved to xacc sums
 * (exact up to then, so nothing is lost) for the rest of the backward. At finish the doubles become
 * xacc sums (exactly), cross ranks and are rounded as on every other path: the same bits. */

/* Whether product sink k's high halves live in its tensor (it was zero at registration). */
static inline int dhi_in_out(const dsv4_wsink *k) { return (const void *)k->dhi == (const void *)k->out; }

/* Double e of product sink k, read and written, stored as two 32-bit words: its sign, exponent and
 * top 23 fraction bits as a float's (x truncated to a float: the double's exponent less 896, the
 * two biases' difference), and its other 29 fraction bits. A sum of one product's floats has a low
 * word of 0, so a sink that gets one chunk before its last (dsv4_wsinks_last_rows) never writes its
 * low words. x is zero or a sum of terms on the 2^-66 grid below 2^47: its exponent fits. Integer
 * steps only (they vectorise). */
#define DEXP_SHIFT ((uint64_t)896 << 52)
/* The piece of sink k's low words that holds row r. */
static inline int lo_piece(const dsv4_wsink *k, int64_t r) {
  int j = 0;
  while (j + 1 < k->n_lo && k->lo[j + 1].row <= r) j++;
  return j;
}
/* Low word at, and the words after it in its row. */
static inline dsv4_u32a *lo_at(const dsv4_wsink *k, int64_t at) {
  const int j = lo_piece(k, at / k->w);
  return k->lo[j].p + (at - k->lo[j].row * k->w);
}
/* Rows [r0, r0 + nr) of sink k's low words that lie in lent tensors: zero again, for the lent
 * tensors' own products (their allocated words are left as they are: unmapped pages stay so). */
static void lo_clear_lent(const dsv4_wsink *k, int64_t r0, int64_t nr) {
  for (int j = 0; j < k->n_lo; j++) {
    const int64_t a = k->lo[j].row > r0 ? k->lo[j].row : r0, end = lo_end(k, j);
    const int64_t b = end < r0 + nr ? end : r0 + nr;
    if (k->lo[j].pool >= 0 && b > a)
      memset((void *)(k->lo[j].p + (a - k->lo[j].row) * k->w), 0, sizeof(float) * (size_t)((b - a) * k->w));
  }
}
/* A block's doubles (dsv4_wsink.dused): none written (all zero, not read); written, but every low
 * word still zero (a block that got one product's floats: its low words are neither read nor
 * written, so their pages stay unmapped, and a lent tensor's stay the zeros its owner expects);
 * written with low words. */
enum { DUSED_NONE = 0, DUSED_HI = 1, DUSED_LO = 2 };

/* Doubles [at, at + n) of sink k into o (n <= BLOCK_COLS); with_lo 0: their low words are zero, not
 * read. */
static void drow_get(const dsv4_wsink *k, int64_t at, int64_t n, int with_lo, double *restrict o) {
  static const uint32_t zeros[BLOCK_COLS];
  const dsv4_u32a *restrict hw = k->dhi + at, *restrict lw = with_lo ? lo_at(k, at) : zeros;
  for (int64_t e = 0; e < n; e++) {
    const uint64_t hi = hw[e], mag = hi & 0x7fffffffu;
    const uint64_t b = (hi & 0x80000000u) << 32 | (mag ? (mag << 29) + DEXP_SHIFT : 0) | lw[e];
    memcpy(&o[e], &b, sizeof b);
  }
}

/* o [n] into doubles [at, at + n) of sink k. lo_zero: their low words are known to be zero: a row
 * whose low words all stay zero is not written (its pages stay unmapped). Returns whether the low
 * words were written. */
static int drow_put(dsv4_wsink *k, int64_t at, int64_t n, const double *restrict o, int lo_zero) {
  uint32_t lw[BLOCK_COLS], any = 0;
  dsv4_u32a *restrict hw = k->dhi + at;
  for (int64_t e = 0; e < n; e++) {
    uint64_t b;
    memcpy(&b, &o[e], sizeof b);
    const uint64_t mag = b & 0x7fffffffffffffffu;
    hw[e] = (uint32_t)(b >> 32 & 0x80000000u) | (mag ? (uint32_t)((mag - DEXP_SHIFT) >> 29) : 0);
    lw[e] = (uint32_t)(mag & ((1u << 29) - 1));
    any |= lw[e];
  }
  if (!any && lo_zero) return 0;
  memcpy((void *)lo_at(k, at), lw, sizeof(uint32_t) * (size_t)n);
  return 1;
}

/* Sink k's doubles [at, at + n) += the k terms t[q] [n], into o: 0 when every add was exact (o then
 * holds the sums), 1 when some was not (o is then meaningless). used: what the doubles hold
 * (DUSED_NONE: zeros, not read; DUSED_HI: their low words are zero, not read). *bad: a term not
 * finite or not below 2^24 (taken as 0, as xacc does). */
static int drow_try(const dsv4_wsink *ks, int64_t at, int used, const float *const *t, int k, int64_t n,
                    double *restrict o, int *bad) {
  int inexact = 0, b = 0;
  if (used == DUSED_NONE)
    memset(o, 0, sizeof(double) * (size_t)n);
  else
    drow_get(ks, at, n, used == DUSED_LO, o);
  for (int q = 0; q < k; q++) {
    const float *restrict tq = t[q];
    for (int64_t e = 0; e < n; e++) {
      const double v = (double)tq[e];
      const int ok = fabs(v) < 0x1p24; /* false for NaN */
      b |= !ok;
      const double u0 = ok ? v : 0.0;
      /* below 2^-42 a float has bits under the grid: rounded to it (nearest even), as xacc does */
      const double g = (u0 * 0x1p66 + DSV4_XACC_MAGIC) - DSV4_XACC_MAGIC;
      const double u = fabs(u0) < 0x1p-42 ? g * 0x1p-66 : u0;
      const double x = o[e], sm = x + u, bb = sm - x, err = (x - (sm - bb)) + (u - bb);
      inexact |= err != 0.0;
      o[e] = sm;
    }
  }
  *bad |= b;
  return inexact;
}

/* Exact double sums o [n] (multiples of 2^-66 below 2^47) as normalised xacc hi, lo. */
static void drow_xacc(const double *restrict o, int64_t n, int64_t *restrict hi, int64_t *restrict lo) {
  for (int64_t e = 0; e < n; e++) {
    const double u = o[e] * 0x1p16, a = floor(u);
    hi[e] = (int64_t)a;
    lo[e] = (int64_t)((u - a) * 0x1p50);
  }
}

/* Doubles [at, at + n) of sink k as xacc hi, lo (n <= BLOCK_COLS; with_lo as drow_get). */
static void drow_get_xacc(const dsv4_wsink *k, int64_t at, int64_t n, int with_lo, int64_t *hi, int64_t *lo) {
  double o[BLOCK_COLS];
  drow_get(k, at, n, with_lo, o);
  drow_xacc(o, n, hi, lo);
}

/* Row r of block b (q) of sink k, its sum so far as xacc hi, lo [q->nb]: its xacc rows once moved,
 * zero while the block is unused (its doubles are not read), else its doubles. */
static void block_row_xacc(const dsv4_wsink *k, const wblock *q, int64_t b, int64_t r, int64_t *hi, int64_t *lo) {
  const int64_t *p = k->promo[b];
  if (p) {
    memcpy(hi, p + r * 2 * q->nb, sizeof(int64_t) * (size_t)q->nb);
    memcpy(lo, p + r * 2 * q->nb + q->nb, sizeof(int64_t) * (size_t)q->nb);
  } else if (k->dused[b] == DUSED_NONE) {
    memset(hi, 0, sizeof(int64_t) * (size_t)q->nb);
    memset(lo, 0, sizeof(int64_t) * (size_t)q->nb);
  } else {
    drow_get_xacc(k, (q->m0 + r) * k->w + q->n0, q->nb, k->dused[b] == DUSED_LO, hi, lo);
  }
}

/* Block q (b) of sink k to xacc sums: [mb rows] x [2 nb] (a row's hi, then lo). NULL: out of memory. */
static int64_t *dsum_promote(const dsv4_wsink *k, const wblock *q, int64_t b) {
  int64_t *x = malloc(sizeof(int64_t) * (size_t)(q->mb * 2 * q->nb));
  dsv4_mem_advise(x, sizeof(int64_t) * (size_t)(q->mb * 2 * q->nb));
  for (int64_t r = 0; x && r < q->mb; r++) {
    const int64_t at = (q->m0 + r) * k->w + q->n0;
    int64_t *h = x + r * 2 * q->nb;
    drow_get_xacc(k, at, q->nb, k->dused[b] == DUSED_LO, h, h + q->nb);
  }
  return x;
}

/* The last add of block q of sink k on one rank (dsv4_wsinks_last_rows): per row, the sum so far
 * (its doubles, its xacc rows, or zero) as xacc sums in registers, plus the kk terms tr of the
 * group, rounded once into the tensor, i.e. what finish would store: 0 + the value (out held the
 * row's high halves and was zero at registration). Lent low halves are zeroed for their owner. */
static int dsum_last_block(dsv4_wsink *k, const wblock *q, int64_t b, const float *t, int64_t kk) {
  int64_t h[2 * BLOCK_COLS];
  const float *tr[DSV4_WG_GROUP];
  const int64_t mn = q->mb * q->nb;
  int bad = 0;
  for (int64_t r = 0; r < q->mb; r++) {
    const int64_t at = (q->m0 + r) * k->w + q->n0;
    block_row_xacc(k, q, b, r, h, h + q->nb);
    for (int64_t j = 0; j < kk; j++) tr[j] = t + j * mn + r * q->nb;
    bad |= dsv4_xacc_addk_(h, h + q->nb, tr, (int)kk, q->nb, 0);
    for (int64_t e = 0; e < q->nb; e++) k->out[at + e] = 0.0f + dsv4_xacc_value(h[e], h[q->nb + e]);
    if (k->dused[b] == DUSED_LO && k->lo[lo_piece(k, q->m0 + r)].pool >= 0)
      memset((void *)lo_at(k, at), 0, sizeof(float) * (size_t)q->nb);
  }
  return bad;
}

/* Block b of product sink k += the views' panel products (groups of dsv4_wg_group()), into its
 * doubles or, once that fails, its xacc sums; last (one group at most): the block's last terms,
 * rounded into the tensor at once (dsum_last_block). Returns bit 0: a bad term, bit 1: out of
 * memory. */
static int dsum_block(dsv4_wsink *k, const blocking *bl, int64_t b, const wview *v, int64_t nv, float *t,
                      int last, dsv4_impl impl) {
  const wblock q = dsv4_wg_block(&k->shape, bl, b);
  const int64_t mn = q.mb * q.nb, G = dsv4_wg_group();
  float *za = t + DSV4_WG_GROUP * mn;
  const float *tr[DSV4_WG_GROUP];
  double o[BLOCK_COLS];
  int bad = 0;
  /* a block's first add writes its doubles without reading them: a page of fresh sums read first
   * is mapped to the zero page, then copied on the write (two faults instead of one: about 0.35 s
   * against 0.2 s per 537 MB here); and low words still zero are not read (DUSED_HI) */
  if (last) { /* (reads dused: the sum so far) */
    for (int64_t j = 0; j < nv; j++) panel_product(&v[j], q.m0, q.mb, q.mb, q.n0, q.nb, q.nb, t + j * mn, za, impl);
    const int bad_last = dsum_last_block(k, &q, b, t, nv);
    k->dused[b] = DUSED_HI; /* (its lent low words are zero again) */
    return bad_last;
  }
  for (int64_t g0 = 0; g0 < nv; g0 += G) {
    const int64_t kk = nv - g0 < G ? nv - g0 : G;
    const int used = k->dused[b]; /* what the doubles held before this group */
    int lo_written = 0;
    for (int64_t j = 0; j < kk; j++)
      panel_product(&v[g0 + j], q.m0, q.mb, q.mb, q.n0, q.nb, q.nb, t + j * mn, za, impl);
    for (int64_t r = 0; r < q.mb; r++) {
      for (int64_t j = 0; j < kk; j++) tr[j] = t + j * mn + r * q.nb;
      if (!k->promo[b]) {
        const int64_t at = (q.m0 + r) * k->w + q.n0;
        if (!drow_try(k, at, used, tr, (int)kk, q.nb, o, &bad)) {
          /* one product's floats added to zero low words leave them zero: their pages are not
           * written (they stay unmapped zeros until a second product's terms need them) */
          lo_written |= drow_put(k, at, q.nb, o, used != DUSED_LO);
          continue;
        }
        /* rows above r hold this group already, rows from r on do not: the xacc adds go on from r */
        k->dused[b] = used == DUSED_LO || lo_written ? DUSED_LO : DUSED_HI;
        if (!(k->promo[b] = dsum_promote(k, &q, b))) return bad | 2;
      }
      int64_t *h = k->promo[b] + r * 2 * q.nb;
      bad |= dsv4_xacc_addk_(h, h + q.nb, tr, (int)kk, q.nb, 0);
    }
    if (!k->promo[b]) k->dused[b] = used == DUSED_LO || lo_written ? DUSED_LO : DUSED_HI;
  }
  return bad;
}

/* A chunk of this rank's slice of a product sink's rows (dsv4_xfer_reduce_scatter_i64_each), each
 * row rounded once into the rank's floats. */
typedef struct {
  float *fmine;
  int64_t w, first, rows; /* row width; the slice's first row in the chunk of rows; its rows */
} dsum_round;

static void dsum_round_rows(void *ctx, size_t off, int64_t *part, size_t c) {
  const dsum_round *q = ctx;
  const int64_t w2 = 2 * q->w, i0 = (int64_t)off / w2, n = (int64_t)c / w2;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; t++) {
    if (q->first + i0 + t >= q->rows) continue; /* the last slice's padding */
    int64_t *h = part + t * w2;
    dsv4_xacc_normalize(h, h + q->w, q->w);
    dsv4_xacc_store(q->fmine + (i0 + t) * q->w, h, h + q->w, q->w, 0);
  }
}

/* Product sink k's sums, summed over the ranks, rounded once and added to its tensor (its registered
 * value), DSV4_WG_DSUM_MSG elements at a time: each chunk's rows are reduce-scattered in N equal
 * slices (wgrad_int.h dsv4_wg_dsum), each rank rounds its slice and the floats are all-gathered
 * (16 + 4 bytes per element and rank, not an all-reduce's 2 x 16; any cut of the rows gives the
 * same bits: every element is rounded once from the same integer sum). Collective. */
static dsv4_status dsum_store(dsv4_wsink *k, dsv4_xfer *xf) {
  dsv4_status rc = DSV4_OK;
  const blocking bl = dsv4_wg_blocks(&k->shape);
  const int N = dsv4_wg_size(xf), me = N > 1 ? xf->comm->rank : 0;
  const int64_t w = k->w, rows = k->n / w;
  const wdsum ds = dsv4_wg_dsum(rows, w, N);
  int64_t *x = NULL;
  float *f = NULL;
  DSV4_ALLOC(x, (int64_t)(N + 1) * ds.slice * 2 * w);
  DSV4_ALLOC(f, (int64_t)(N + 1) * ds.slice * w);
  int64_t *mine = x + (int64_t)N * ds.slice * 2 * w;
  float *fmine = f + (int64_t)N * ds.slice * w;
  for (int64_t r0 = 0; r0 < rows; r0 += ds.step) {
    const int64_t nr = rows - r0 < ds.step ? rows - r0 : ds.step, R = (nr + N - 1) / N;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * R; r++) {
      const int64_t gr = r0 + r, bi = gr / bl.mb;
      int64_t *h = x + r * 2 * w;
      if (r >= nr) { /* the last slice's padding */
        memset(h, 0, sizeof(int64_t) * (size_t)(2 * w));
        continue;
      }
      for (int64_t j = 0; j < bl.bn; j++) {
        const wblock q = dsv4_wg_block(&k->shape, &bl, bi * bl.bn + j);
        block_row_xacc(k, &q, bi * bl.bn + j, gr - q.m0, h + q.n0, h + w + q.n0);
      }
    }
    /* rows whose tensor held high halves are read: zero again, the value they were registered with
     * (and the lent tensor's floats that held their low halves, for its own product) */
    if (dhi_in_out(k)) memset(k->out + r0 * w, 0, sizeof(float) * (size_t)(nr * w));
    lo_clear_lent(k, r0, nr);
    /* this rank's rows, rounded once as their totals arrive (mine: the chunk in flight; one rank:
     * all rows in one parallel pass) */
    dsum_round q = {fmine, w, me * R, nr};
    DSV4_TRY(dsv4_xfer_reduce_scatter_i64_each(N > 1 ? xf : NULL, DSV4_MSG_WGRAD_SUMS, x, (size_t)(R * 2 * w), mine,
                                               N > 1 ? sums_chunk(2 * w, R) : (size_t)(R * 2 * w), dsum_round_rows,
                                               &q));
    const float *all = fmine;
    if (N > 1) {
      DSV4_TRY(dsv4_xfer_allgather(xf, DSV4_MSG_WGRAD_ALLGATHER, fmine, f, sizeof(float) * (size_t)(R * w)));
      all = f;
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nr; r++) {
      float *o = k->out + (r0 + r) * w;
      const float *v = all + r * w; /* rank r / R's slice, row r % R: consecutive */
      for (int64_t e = 0; e < w; e++) o[e] += v[e];
    }
  }
fail:
  free(x);
  free(f);
  return rc;
}

/* Element e of sink k += t (serial). */
static int add_elem(dsv4_wsink *k, int64_t e, float t) {
  const int64_t r = e / k->w, c = e % k->w;
  int64_t *h = k->acc + r * 2 * k->w + c;
  return dsv4_xacc_add1(h, h + k->w, t);
}

dsv4_status dsv4_wsinks_terms(dsv4_wsinks *s, const float *out, const float *t, int64_t n) {
  dsv4_status rc = DSV4_OK;
  dsv4_wsink *k = dsv4_wsinks_of(s, out);
  DSV4_CHECK(k && !k->n_lo && n <= k->n, DSV4_ERR_STATE, "internal: gradient terms for an unregistered tensor");
  int bad = 0;
  for (int64_t e = 0; e < n; e++) bad |= add_elem(k, e, t[e]);
  s->bad |= bad;
fail:
  return rc;
}

dsv4_status dsv4_wsinks_settle(dsv4_wsinks *s, dsv4_wsink *k) {
  int bad = 0;
  if (k->n_lo) return DSV4_OK; /* a product sink's tensor is not added to before finish */
  for (int64_t e = 0; e < k->n; e++)
    if (k->out[e] != 0.0f) bad |= add_elem(k, e, k->out[e]), k->out[e] = 0.0f;
  s->bad |= bad;
  return DSV4_OK;
}

/* Rows of partial panels kept for finish (copies: the chunk's buffers are reused). */
static dsv4_status stash(dsv4_wsink *k, const wrun *r) {
  dsv4_status rc = DSV4_OK;
  const dsv4_wshape *s = &k->shape;
  if (k->ns + r->len > k->cap) {
    int64_t cap = k->cap ? 2 * k->cap : 2 * s->P;
    while (cap < k->ns + r->len) cap *= 2;
    float *a = realloc(k->sa, sizeof(float) * (size_t)(cap * s->M));
    DSV4_CHECK(a, DSV4_ERR_NOMEM, "out of memory for kept weight-gradient rows");
    k->sa = a;
    float *b = realloc(k->sb, sizeof(float) * (size_t)(cap * s->N));
    DSV4_CHECK(b, DSV4_ERR_NOMEM, "out of memory for kept weight-gradient rows");
    k->sb = b;
    int64_t *g = realloc(k->sg, sizeof(int64_t) * (size_t)cap);
    DSV4_CHECK(g, DSV4_ERR_NOMEM, "out of memory for kept weight-gradient rows");
    k->sg = g;
    k->cap = cap;
    dsv4_mem_advise(k->sa, sizeof(float) * (size_t)(cap * s->M));
    dsv4_mem_advise(k->sb, sizeof(float) * (size_t)(cap * s->N));
  }
  pack_run(s, r, k->sa + k->ns * s->M, k->sb + k->ns * s->N);
  for (int64_t i = 0; i < r->len; i++) k->sg[k->ns + i] = r->g0 + i;
  k->ns += r->len;
fail:
  return rc;
}

/* Runs (full ones, and assembled panels) into the sums of product sink k (dsum_block). */
static int add_all(dsv4_wsink *k, const wrun *runs, int64_t n_runs, const wpanel *pan, int64_t n_pan,
                   int last, dsv4_impl impl, dsv4_status *rc) {
  const dsv4_wshape *s = &k->shape;
  const blocking bl = dsv4_wg_blocks(s);
  const int nt = dsv4_nthreads();
  const int64_t tper = dsv4_wg_tfloats(&bl, s->P);
  wview *views = NULL;
  int64_t n_views = 0;
  int bad = 0;
  *rc = views_of(s, runs, n_runs, pan, n_pan, &views, &n_views);
  if (*rc != DSV4_OK) return 0;
  last = last && n_views <= dsv4_wg_group(); /* one group: the last terms' sums stay in registers */
  /* the per-thread products in the backward's kept scratch: a fresh buffer per call (one per chunk
   * and product) was faulted in and cleared by the kernel each time, ~10 MB per thread */
  float *tb = NULL;
  int64_t *unused = NULL;
  *rc = scratch(0, tper * nt, &unused, &tb);
  if (*rc != DSV4_OK) {
    free(views);
    return 0;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) reduction(| : bad)
  for (int64_t b = 0; b < bl.bm * bl.bn; b++) {
    dsv4_blas_serial();
    bad |= dsum_block(k, &bl, b, views, n_views, tb + dsv4_thread_id() * tper, last, impl);
  }
  k->done = last && !(bad & 2);
  free(views);
  if (bad & 2) *rc = dsv4__err(DSV4_ERR_NOMEM, __FILE__, __LINE__, "out of memory for a weight-gradient block's sums");
  return bad & 1;
}

/* The stash's last run, when the rows just added complete it to a whole panel (its first rows from
 * an earlier chunk of this rank: a contiguous shard that does not start on a panel cuts every panel
 * between two chunks), goes into the sums now and leaves the stash, which so holds the rows whose
 * panels other ranks share and at most one panel in the making, not every row. The same panel
 * product as at finish, into exact sums: the same bits. Rows are only appended, so no other run
 * can have become whole (plan/partial.c counts the stash the same way). */
static dsv4_status flush_whole(dsv4_wsinks *s, dsv4_wsink *k) {
  dsv4_status rc = DSV4_OK;
  const dsv4_wshape *sh = &k->shape;
  int64_t i0 = k->ns - 1;
  while (i0 > 0 && k->sg[i0] == k->sg[i0 - 1] + 1 && k->sg[i0] % sh->P != 0) i0--;
  const wrun r = {k->sa + i0 * sh->M, k->sb + i0 * sh->N, sh->M, sh->N, NULL, k->sg[i0], k->ns - i0};
  if (!run_full(sh, &r)) return DSV4_OK;
  s->bad |= add_all(k, &r, 1, NULL, 0, 0, s->impl, &rc);
  k->ns = i0;
  return rc;
}

dsv4_status dsv4_wsinks_product(dsv4_wsinks *s, float *C, const dsv4_wpiece *pc) {
  dsv4_status rc = DSV4_OK;
  wrun *runs = NULL;
  int64_t n_runs = 0;
  dsv4_wsink *k = dsv4_wsinks_of(s, C);
  DSV4_CHECK(k && k->shape.M > 0 && !k->done, DSV4_ERR_STATE,
             "internal: product into an unregistered or finished gradient");
  DSV4_TRY(runs_of(&k->shape, pc, 1, &runs, &n_runs));
  for (int64_t j = 0; j < n_runs; j++)
    if (!run_full(&k->shape, &runs[j])) {
      DSV4_TRY(stash(k, &runs[j]));
      DSV4_TRY(flush_whole(s, k));
    }
  /* this rank's last rows, nothing kept for finish: rounded into the tensor now */
  const int last = k->rows_left == pc->n && k->ns == 0;
  k->rows_left = k->rows_left >= pc->n ? k->rows_left - pc->n : -1;
  s->bad |= add_all(k, runs, n_runs, NULL, 0, last, s->impl, &rc);
fail:
  free(runs);
  return rc;
}

/* A product sink's kept rows: to their panels' owners, added there. Collective. */
static dsv4_status finish_partials(dsv4_wsinks *s, dsv4_wsink *k, dsv4_xfer *x) {
  dsv4_status rc = DSV4_OK;
  wrun *runs = NULL;
  wpanel *pan = NULL;
  int64_t n_runs = 0, n_pan = 0;
  const dsv4_wpiece pc = {.n = k->ns, .A = k->sa, .B = k->sb, .lda = k->shape.M, .ldb = k->shape.N, .glob = k->sg};
  DSV4_TRY(runs_of(&k->shape, &pc, 1, &runs, &n_runs));
  DSV4_TRY(gather_partials(x, &k->shape, runs, n_runs, &pan, &n_pan));
  /* kept rows of consecutive chunks may fill a panel by themselves: those runs are full here */
  s->bad |= add_all(k, runs, n_runs, pan, n_pan, 0, s->impl, &rc);
fail:
  if (!active_sinks) scratch_release(); /* a call outside a backward keeps nothing */
  free(runs);
  panels_free(pan, n_pan);
  return rc;
}

static void sink_free(dsv4_wsink *k) {
  if (!k->external) free(k->acc);
  for (int64_t b = 0; k->promo && b < k->n_blocks; b++) free(k->promo[b]);
  free(k->promo);
  free(k->dused);
  for (int j = 0; j < k->n_lo; j++)
    if (k->lo[j].pool < 0) free((void *)k->lo[j].p);
  if (!dhi_in_out(k)) free(k->dhi);
  free(k->g0);
  free(k->sa);
  free(k->sb);
  free(k->sg);
  memset(k, 0, sizeof *k);
}

/* Frees the sinks; restore: every tensor back to its registered value (an error path leaves no
 * partial sum behind). */
static void release(dsv4_wsinks *s, int restore) {
  if (active_sinks == s) active_sinks = NULL;
  scratch_release();
  for (int i = 0; i < s->count; i++) {
    if (restore && s->s[i].g0) memcpy(s->s[i].out, s->s[i].g0, sizeof(float) * (size_t)s->s[i].n);
    if (restore && s->s[i].n_lo && dhi_in_out(&s->s[i])) memset(s->s[i].out, 0, sizeof(float) * (size_t)s->s[i].n);
    sink_free(&s->s[i]);
  }
  for (int j = 0; restore && j < s->n_pool; j++)
    memset((void *)s->pool[j].p, 0, sizeof(float) * (size_t)s->pool[j].used);
  memset(s->pool, 0, sizeof s->pool);
  s->n_pool = 0;
  s->count = 0;
  s->active = 0;
}

/* Vector sink k's sums (all-reduced) into its tensor: registered value + sum, rounded once. */
static void store_sink(dsv4_wsink *k) {
  const int64_t rows = k->n / k->w;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    int64_t *h = k->acc + r * 2 * k->w;
    dsv4_xacc_normalize(h, h + k->w, k->w);
    for (int64_t e = 0; e < k->w; e++) k->out[r * k->w + e] = k->g0[r * k->w + e] + dsv4_xacc_value(h[e], h[k->w + e]);
  }
}

dsv4_status dsv4_wsinks_finish(dsv4_wsinks *s, dsv4_xfer *x) {
  dsv4_status rc = DSV4_OK;
  int64_t *vec = NULL, nv = 0;
  if (active_sinks == s) active_sinks = NULL;
  /* product sinks (recomputation): their kept rows first; their sums are stored once every rank's
   * terms are known to be good (below), so that a bad term leaves every tensor as it was */
  for (int i = 0; i < s->count; i++) {
    dsv4_wsink *k = &s->s[i];
    DSV4_TRY(dsv4_wsinks_settle(s, k)); /* local ones' sums outlive this set when external */
    if (k->n_lo && !k->done) DSV4_TRY(finish_partials(s, k, x));
  }
  /* the vector sinks in one message, with the ranks' bad-term flags */
  for (int i = 0; i < s->count; i++)
    if (!s->s[i].local && s->s[i].shape.M == 0) nv += 2 * s->s[i].n;
  DSV4_ALLOC(vec, nv + 1);
  int64_t at = 0;
  for (int i = 0; i < s->count; i++)
    if (!s->s[i].local && s->s[i].shape.M == 0)
      memcpy(vec + at, s->s[i].acc, sizeof(int64_t) * (size_t)(2 * s->s[i].n)), at += 2 * s->s[i].n;
  vec[nv] = s->bad != 0;
  DSV4_TRY(allreduce_i64(x, vec, (size_t)(nv + 1)));
  DSV4_CHECK(!vec[nv], DSV4_ERR_ARG, "%s: a gradient term is not finite or not below 2^24 (the exact sums' range)",
             s->what);
  for (int i = 0; i < s->count; i++)
    if (s->s[i].n_lo && !s->s[i].done) DSV4_TRY(dsum_store(&s->s[i], x));
  at = 0;
  for (int i = 0; i < s->count; i++)
    if (!s->s[i].local && s->s[i].shape.M == 0) {
      memcpy(s->s[i].acc, vec + at, sizeof(int64_t) * (size_t)(2 * s->s[i].n)), at += 2 * s->s[i].n;
      store_sink(&s->s[i]);
    }
fail:
  free(vec);
  release(s, rc != DSV4_OK);
  return rc;
}

void dsv4_wsinks_drop(dsv4_wsinks *s) { release(s, 1); }

/* The hook util/xrows.c calls (declared there). */
int dsv4_xrows_redirect(const float *out, const int64_t *x, int64_t rows, int64_t w) {
  dsv4_wsinks *s = active_sinks;
  for (int i = 0; s && i < s->count; i++) {
    dsv4_wsink *k = &s->s[i];
    if (k->n_lo || !(out >= k->out && out + rows * w <= k->out + k->n)) continue;
    const int64_t off = out - k->out;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t e = 0; e < w; e++) {
        const int64_t q = off + r * w + e, kr = q / k->w, kc = q % k->w;
        int64_t *h = k->acc + kr * 2 * k->w + kc;
        const int64_t *src = x + r * 2 * w + e;
        dsv4_xacc_merge(h, h + k->w, src, src + w, 1);
      }
    return 1;
  }
  return 0;
}
