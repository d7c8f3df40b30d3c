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
 * visible key with their ids for the top-k. */
typedef struct {
  float *S, *score;
  dsv4_scored *v;
} idx_scratch;

static size_t idx_carve(char *base, int Hi, int64_t nmax, idx_scratch *s) {
  dsv4_carver c = {base, 0};
  s->S = dsv4_carve(&c, sizeof(float) * (size_t)Hi * KEY_CHUNK);
  s->score = dsv4_carve(&c, sizeof(float) * (size_t)nmax);
  s->v = dsv4_carve(&c, sizeof(dsv4_scored) * (size_t)nmax);
  return c.used;
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
  DSV4_TRY(dsv4_ws_alloc(&ws, idx_carve(NULL, Hi, nmax, &sc), nt, "lightning_indexer"));
#pragma omp parallel num_threads(nt) private(sc)
  {
    dsv4_blas_serial();
    idx_carve(dsv4_ws_thread(&ws), Hi, nmax, &sc);
    float *S = sc.S, *score = sc.score;
    dsv4_scored *v = sc.v;
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
      for (int64_t j = 0; j < n; j++) v[j] = (dsv4_scored){score[j], (int32_t)(a->vis_begin[p] + j)};
      dsv4_topk_write(v, n, a->topk, a->topk_ids + p * a->topk,
                      a->topk_scores ? a->topk_scores + p * a->topk : NULL);
    }
  }
fail:
  dsv4_ws_free(&ws);
  return rc;
}
