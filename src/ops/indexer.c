/* indexer.c: fast lightning indexer. Per query, the scores of its visible compressed keys come
 * from one BLAS product per chunk of keys, [Hi, Di] x [Di, chunk], then a ReLU-weighted sum over
 * heads (heads in ascending order), then quickselect for the top-k.
 * Napkin math (V4-Flash): 2 Hi Di = 16 kFLOP per (query, key); chunks of KEY_CHUNK keys keep the
 * [Hi, chunk] score block (256 KiB) in L2. Chunks start at the query's first visible key, so a
 * query's products have the same shapes on any rank (bitwise CP equivalence). */
#include "attn_common.h"
#include "topk.h"
#include "util/err.h"
#include "util/gemm.h"
#include "util/par.h"
#include "util/workspace.h"

#define KEY_CHUNK 1024

/* Per-thread scratch: one chunk's [Hi, KEY_CHUNK] head scores, and a query's scores of every
 * visible key with their ids for the top-k (and of every block for the candidates). */
typedef struct {
  float *S, *score;
  dsv4_scored *v, *bv;
} idx_scratch;

static size_t idx_carve(char *base, int Hi, int64_t nmax, int block, idx_scratch *s) {
  dsv4_carver c = {base, 0};
  s->S = dsv4_carve(&c, sizeof(float) * (size_t)Hi * KEY_CHUNK);
  s->score = dsv4_carve(&c, sizeof(float) * (size_t)nmax);
  s->v = dsv4_carve(&c, sizeof(dsv4_scored) * (size_t)nmax);
  s->bv = dsv4_carve(&c, sizeof(dsv4_scored) * (size_t)(block > 0 ? nmax / block + 2 : 1));
  return c.used;
}

/* The shared selection of both implementations (attn_common.h): candidate blocks of a query from
 * its scores of the n visible rows, then the top-k (only inside cand_in's blocks when given). */
void dsv4_indexer_select(const dsv4_indexer_args *a, int64_t p, const float *score, int64_t n, dsv4_scored *v,
                         dsv4_scored *bv) {
  const int32_t base = a->vis_begin[p];
  if (a->cand_out) { /* block score = max over the block; the newest visible block pinned (+inf) */
    const int64_t nb = (n + a->block - 1) / a->block;
    for (int64_t b = 0; b < nb; b++) {
      float m = -INFINITY;
      for (int64_t j = b * a->block; j < n && j < (b + 1) * a->block; j++) m = score[j] > m ? score[j] : m;
      bv[b] = (dsv4_scored){b == nb - 1 ? INFINITY : m, (int32_t)b};
    }
    dsv4_topk_write(bv, nb, a->n_cand, a->cand_out + p * a->n_cand, NULL);
  }
  int64_t m = 0;
  if (a->cand_in) { /* only rows of the kept blocks (-1 entries: none) */
    const int32_t *cb = a->cand_in + p * a->n_cand;
    for (int c = 0; c < a->n_cand; c++) {
      if (cb[c] < 0) continue;
      for (int64_t j = (int64_t)cb[c] * a->block; j < n && j < ((int64_t)cb[c] + 1) * a->block; j++)
        v[m++] = (dsv4_scored){score[j], base + (int32_t)j};
    }
  } else {
    for (int64_t j = 0; j < n; j++) v[m++] = (dsv4_scored){score[j], base + (int32_t)j};
  }
  dsv4_topk_write(v, m, a->topk, a->topk_ids + p * a->topk, a->topk_scores ? a->topk_scores + p * a->topk : NULL);
}

dsv4_status dsv4_lightning_indexer(const dsv4_indexer_args *a) {
  dsv4_status rc = DSV4_OK;
  dsv4_workspace ws = {0};
  DSV4_TRY(dsv4_indexer_check(a));
  const int Hi = a->Hi, Di = a->Di;
  int64_t nmax = 1;
  for (int64_t p = 0; p < a->S1; p++) nmax = a->vis_count[p] > nmax ? a->vis_count[p] : nmax;
  const int nt = dsv4_team(a->threads);
  idx_scratch sc;
  DSV4_TRY(dsv4_ws_alloc(&ws, idx_carve(NULL, Hi, nmax, a->block, &sc), nt, "lightning_indexer"));
#pragma omp parallel num_threads(nt) private(sc)
  {
    dsv4_blas_serial();
    idx_carve(dsv4_ws_thread(&ws), Hi, nmax, a->block, &sc);
    float *S = sc.S, *score = sc.score;
#pragma omp for schedule(dynamic, 16)
    for (int64_t p = 0; p < a->S1; p++) {
      const int64_t n = a->vis_count[p];
      const float *q = a->q_idx + p * Hi * Di, *w = a->weights + p * Hi;
      for (int64_t c0 = 0; c0 < n; c0 += KEY_CHUNK) {
        const int64_t nc = n - c0 < KEY_CHUNK ? n - c0 : KEY_CHUNK;
        dsv4_gemm_nt(Hi, nc, Di, 1.0f, q, Di, a->k_idx + (a->vis_begin[p] + c0) * Di, Di, 0.0f, S, nc);
        float *sc_ = score + c0;
        for (int64_t j = 0; j < nc; j++) sc_[j] = 0;
        for (int h = 0; h < Hi; h++) {
          const float *s = S + (int64_t)h * nc, wh = w[h];
          for (int64_t j = 0; j < nc; j++) sc_[j] += wh * (s[j] > 0 ? s[j] : 0);
        }
      }
      dsv4_indexer_select(a, p, score, n, sc.v, sc.bv);
    }
  }
fail:
  dsv4_ws_free(&ws);
  return rc;
}
