/* test_ops_fwd.c: forward checks of the operators in src/ops (the backward ones are in
 * test_ops_grad.c): fast vs naive reference on many shapes and edge cases (rmsnorm, rope,
 * compressor r = 1, 2, 4 and 128, lightning indexer with V4.1's candidate blocks, sparse attention,
 * KL loss), the top-k contract
 * (ties to the smaller id, (score desc, id asc), -1 / -INFINITY padding), position invariance of
 * the fast kernels (a query's bits do not depend on the other queries of the call: what makes
 * CP = N bitwise equal to CP = 1), the two-phase sparse attention, and argument validation.
 *
 * Tolerances (fast fp32 vs naive double) are bounds of the form (number of fp32 terms summed) x
 * 2^-24 x (magnitude of the terms), stated at each check; a few fp32 roundings per term are covered
 * by a small constant factor.
 *
 * Usage: test_ops_fwd [FILTER | --list]: the checks of the TESTS table (bottom) whose
 * "operator/property" contains FILTER, e.g. `test_ops_fwd compressor` or `test_ops_fwd invariance`. */
#include "ops_fixtures.h"
#include "ops/kl_loss.h"
#include "ops/rmsnorm.h"
#include "ops/sparse_attn.h"
#include "ops/topk.h"
#include "util/gemm.h"

/* ============================================================================================
 * RMSNorm and RoPE
 * ========================================================================================== */
/* RMSNorm vs the formula in double. The sum of squares is double in both; then 1/rms, v*s and *w
 * are three fp32 roundings, so 4u relative to max|y| bounds the difference. */
static void test_rmsnorm(void) {
  static const int NS[] = {1, 7, 64, 513};
  for (size_t c = 0; c < sizeof NS / sizeof NS[0]; c++)
    for (int with_w = 0; with_w < 2; with_w++) {
      const int n = NS[c];
      const double eps = 1e-6;
      float *v = FALLOC(n), *w = FALLOC(n), *y = FALLOC(n), *ref = FALLOC(n);
      tu_fill(v, n, 100 + c, 3.0f);
      tu_fill(w, n, 200 + c, 1.0f);
      double ss = 0;
      for (int i = 0; i < n; i++) ss += (double)v[i] * v[i];
      const double inv = 1.0 / sqrt(ss / n + eps);
      for (int i = 0; i < n; i++) ref[i] = (float)(v[i] * inv * (with_w ? w[i] : 1.0));
      const float s = dsv4_rmsnorm_row(y, v, with_w ? w : NULL, n, eps);
      char name[128];
      snprintf(name, sizeof name, "rmsnorm vs formula: n=%d %s", n, with_w ? "weight" : "no weight");
      tu_close(name, y, ref, n, 4 * U32, 0.0);
      tu_check(s == dsv4_rms_inv(v, n, eps), "rmsnorm: returned scale == dsv4_rms_inv, n=%d", n);
      dsv4_rmsnorm_row(v, v, with_w ? w : NULL, n, eps); /* in place */
      tu_check(!memcmp(v, y, sizeof(float) * n), "rmsnorm: in place (y == v) same bits, n=%d", n);
      free(v); free(w); free(y); free(ref);
    }
}

/* SPEC 3 frequencies, written out again independently of rope.c. */
static double spec_freq(const dsv4_config *c, int ratio, int i) {
  const int R = c->rope_dim;
  const double theta = ratio > 0 ? c->compress_rope_theta : c->rope_theta;
  const double f = pow(theta, -2.0 * i / R), L0 = c->rope_orig_max_pos;
  if (ratio == 0 || L0 <= 0) return f;
  const double cf = R * log(L0 / (c->beta_fast * 2 * M_PI)) / (2 * log(theta));
  const double cs = R * log(L0 / (c->beta_slow * 2 * M_PI)) / (2 * log(theta));
  const double lo = fmax(floor(cf), 0), hi = fmin(ceil(cs), R - 1);
  const double ramp = fmin(fmax((i - lo) / (hi == lo ? 0.001 : hi - lo), 0), 1);
  return f / c->rope_factor * ramp + f * (1 - ramp);
}

/* RoPE: frequencies vs SPEC (both double: 1e-12), rotation vs double rotation at positions past
 * the table's first growth. Float cos/sin (u/2 each), two products and a sum: <= 4.5u max|v|,
 * checked at 8u. Untouched leading dims, position 0 and rotate-then-inverse are exact or 8u. */
static void test_rope(void) {
  static const int RATIOS[] = {0, 4, 128}, RS[] = {2, 16, 64}, POS[] = {0, 1, 37, 1000, 4095};
  dsv4_config cfg = DSV4_CONFIG_INIT;
  dsv4_config_preset(&cfg, "tiny");
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++) {
      const int ratio = RATIOS[a], R = RS[b], dim = R + 6;
      dsv4_rope rope;
      cfg.rope_dim = R;
      rope_make(&rope, R, ratio, 4096);
      double fe = 0;
      for (int i = 0; i < R / 2; i++) fe = fmax(fe, fabs(rope.freq[i] / spec_freq(&cfg, ratio, i) - 1));
      tu_check(fe <= 1e-12, "rope frequencies vs SPEC: r=%d R=%d (max rel err %.3g)", ratio, R, fe);
      float *v = FALLOC(dim), *x = FALLOC(dim), *ref = FALLOC(dim);
      for (size_t k = 0; k < sizeof POS / sizeof POS[0]; k++) {
        const int pos = POS[k];
        tu_fill(v, dim, 300 + k, 1.0f);
        memcpy(x, v, sizeof(float) * dim);
        memcpy(ref, v, sizeof(float) * dim);
        for (int i = 0; i < R / 2; i++) {
          const double ang = pos * spec_freq(&cfg, ratio, i), va = v[dim - R + 2 * i], vb = v[dim - R + 2 * i + 1];
          ref[dim - R + 2 * i] = (float)(va * cos(ang) - vb * sin(ang));
          ref[dim - R + 2 * i + 1] = (float)(va * sin(ang) + vb * cos(ang));
        }
        dsv4_rope_apply(&rope, x, dim, pos, 0);
        char name[96];
        snprintf(name, sizeof name, "rope vs double rotation: r=%d R=%d pos=%d", ratio, R, pos);
        tu_close(name, x, ref, dim, 8 * U32, 1.0);
        int ok = !memcmp(x, v, sizeof(float) * (dim - R)) && (pos || !memcmp(x, v, sizeof(float) * dim));
        tu_check(ok, "rope: leading %d dims untouched%s, r=%d R=%d pos=%d", dim - R,
                 pos ? "" : " and position 0 exact", ratio, R, pos);
        dsv4_rope_apply(&rope, x, dim, pos, 1);
        snprintf(name, sizeof name, "rope: inverse undoes rotation: r=%d R=%d pos=%d", ratio, R, pos);
        tu_close(name, x, v, dim, 8 * U32, 1.0);
      }
      free(v); free(x); free(ref);
      dsv4_rope_free(&rope);
    }
}

/* ============================================================================================
 * Compressor
 * ========================================================================================== */
/* Fast vs naive. Pooling sums n_rows (8 or 4 for r = 4, 128) fp32 terms with expf (fast) against
 * double (naive): |error| <= ~2 n_rows u max|C|; RMSNorm divides by rms(pooled), multiplying the
 * relative error by max|C| / rms(pooled) (computed); RoPE adds 8u. Unmapped out rows keep their
 * contents; prev_row NULL and all -1 are the same; out_row only moves rows (same bits). */
static void test_compressor(void) {
  char d[128], name[256];
  for (int c = 0; c < N_CMP_ALL; c++) {
    const cmp_spec sp0 = cmp_case(c);
    cmp_prob P;
    cmp_make(&P, &sp0);
    cmp_desc(&P, d, sizeof d);
    const int64_t n_out = P.rows_out * P.sp.D;
    const int n_rows = P.sp.ratio == 4 ? (P.prev_row ? 8 : 4) : P.sp.ratio;
    float *fast = FALLOC(n_out), *ref = FALLOC(n_out);
    for (int64_t i = 0; i < n_out; i++) P.out[i] = 7.0f; /* sentinel for rows no slot writes */
    tu_ok(dsv4_compress(&P.a), "dsv4_compress");
    memcpy(fast, P.out, sizeof(float) * n_out);
    for (int64_t i = 0; i < n_out; i++) P.out[i] = 7.0f;
    tu_ok(dsv4_compress_ref(&P.a), "dsv4_compress_ref");
    memcpy(ref, P.out, sizeof(float) * n_out);
    const double tol = 4 * n_rows * U32 * cmp_amplification(&P) + 8 * U32;
    snprintf(name, sizeof name, "compressor fast vs naive: %s", d);
    tu_close(name, fast, ref, n_out, tol, 1.0);
    if (P.out_row) {
      int untouched = 1;
      for (int64_t i = 0; i < n_out; i += 2 * P.sp.D)
        for (int e = 0; e < P.sp.D; e++) untouched &= fast[i + e] == 7.0f && ref[i + e] == 7.0f;
      tu_check(untouched, "compressor: rows outside out_row untouched (fast, naive): %s", d);
      cmp_spec sp = sp0;
      sp.out_map = 0;
      cmp_prob U;
      cmp_make(&U, &sp);
      tu_ok(dsv4_compress(&U.a), "dsv4_compress");
      int same = 1;
      for (int64_t s = 0; s < P.sp.n_slots; s++)
        same &= !memcmp(U.out + s * P.sp.D, fast + (int64_t)P.out_row[s] * P.sp.D, sizeof(float) * P.sp.D);
      tu_check(same, "compressor: out_row map moves slot rows, same bits: %s", d);
      cmp_free(&U);
    }
    if (P.sp.ratio == 4 && P.sp.prev != PREV_ROWS) {
      cmp_spec sp = sp0;
      sp.prev = sp.prev == PREV_NULL ? PREV_ALL_NONE : PREV_NULL;
      cmp_prob U;
      cmp_make(&U, &sp);
      for (int64_t i = 0; i < n_out; i++) U.out[i] = 7.0f;
      tu_ok(dsv4_compress(&U.a), "dsv4_compress");
      snprintf(name, sizeof name, "compressor: prev_row NULL == all -1 (same bits): %s", d);
      check_bits(U.out, fast, sizeof(float) * n_out, name);
      cmp_free(&U);
    }
    free(fast); free(ref);
    cmp_free(&P);
  }
}

/* ============================================================================================
 * Lightning indexer and the top-k contract
 * ========================================================================================== */
/* I[p, row] in double, and the same sum of absolute values (its rounding-error scale). */
static double index_score(const idx_prob *P, int64_t p, int64_t row, double *absval) {
  const int Hi = P->sp.Hi, Di = P->sp.Di;
  double s = 0, sa = 0;
  for (int h = 0; h < Hi; h++) {
    double d = 0, da = 0;
    for (int e = 0; e < Di; e++) {
      const double t = (double)P->q_idx[(p * Hi + h) * Di + e] * P->k_idx[row * Di + e];
      d += t;
      da += fabs(t);
    }
    s += P->weights[p * Hi + h] * (d > 0 ? d : 0);
    sa += fabs(P->weights[p * Hi + h]) * da;
  }
  if (absval) *absval = sa;
  return s;
}

/* The top-k contract on one implementation, judged by its own scores: the full list (topk >= every
 * visible count) holds each visible row once, ordered by (score desc, row asc), then -1 / -INFINITY;
 * the top-k list is its prefix, same bits, padded the same way. Returns the number of bad queries. */
static int topk_contract_errors(const idx_prob *P, const int32_t *ids, const float *sc,
                                const int32_t *idf, const float *scf, int full) {
  const int k = P->sp.topk;
  int bad = 0;
  char *seen = xalloc((size_t)P->sp.C + 1, 1);
  for (int64_t p = 0; p < P->sp.S1; p++) {
    const int n = P->vis_count[p], b = P->vis_begin[p];
    int ok = 1;
    memset(seen, 0, (size_t)P->sp.C + 1);
    for (int j = 0; j < full; j++) {
      const int32_t id = idf[p * full + j];
      const float s = scf[p * full + j];
      if (j >= n) { ok &= id == -1 && isinf(s) && s < 0; continue; }
      ok &= id >= b && id < b + n && !seen[id];
      if (id >= b && id < b + n) seen[id] = 1;
      if (j > 0) ok &= scf[p * full + j - 1] > s || (scf[p * full + j - 1] == s && idf[p * full + j - 1] < id);
    }
    for (int j = 0; j < k; j++)
      ok &= j < n ? ids[p * k + j] == idf[p * full + j] && !memcmp(&sc[p * k + j], &scf[p * full + j], 4)
                  : ids[p * k + j] == -1 && isinf(sc[p * k + j]) && sc[p * k + j] < 0;
    if (!ok && bad++ == 0) printf("    first bad query: %lld (visible %d from %d)\n", (long long)p, n, b);
  }
  free(seen);
  return bad;
}

/* Runs one implementation with the case's topk and with topk = full; checks the contract. */
static void run_topk(idx_prob *P, dsv4_status (*fn)(const dsv4_indexer_args *), int full,
                     int32_t *ids, float *sc, int32_t *idf, float *scf, const char *impl, const char *d) {
  const int64_t n = P->sp.S1 * P->sp.topk;
  for (int64_t i = 0; i < n; i++) { P->ids[i] = 12345; P->scores[i] = 7.0f; } /* overwritten */
  tu_ok(fn(&P->a), impl);
  memcpy(ids, P->ids, sizeof(int32_t) * n);
  memcpy(sc, P->scores, sizeof(float) * n);
  dsv4_indexer_args a = P->a;
  a.topk = full;
  a.topk_ids = idf;
  a.topk_scores = scf;
  tu_ok(fn(&a), impl);
  int bad = topk_contract_errors(P, ids, sc, idf, scf, full);
  tu_check(!bad, "indexer %s top-k contract (order score desc/id asc, ties to smaller id, -1/-inf "
           "padding, prefix of full list): %s (%d bad queries)", impl, d, bad);
  a = P->a; /* topk_scores may be NULL: same ids */
  a.topk_scores = NULL;
  tu_ok(fn(&a), impl);
  tu_check(!memcmp(P->ids, ids, sizeof(int32_t) * n), "indexer %s: topk_scores NULL gives the same ids: %s", impl, d);
}

/* Fast vs naive. Scores: the fast path sums Di fp32 products (BLAS), then Hi weighted ReLU terms;
 * the naive one is double rounded once: |diff| <= (Di + Hi + 2) u sum_h |w| sum_e |q k| per query,
 * checked at twice that. Sorted score lists differ by at most that (order statistics are
 * 1-Lipschitz); ids may differ only where the naive scores of the two choices are that close.
 * Exact cases: same bits, and the naive scores equal the exact value. */
static void test_indexer(void) {
  char d[128];
  for (int c = 0; c < N_IDX_ALL; c++) {
    const idx_spec sp = idx_case(c);
    idx_prob P;
    idx_make(&P, &sp);
    const idx_spec *s = &P.sp;
    const int k = s->topk;
    int full = 1;
    for (int64_t p = 0; p < s->S1; p++) full = P.vis_count[p] > full ? P.vis_count[p] : full;
    snprintf(d, sizeof d, "S1=%lld C=%lld Hi=%d Di=%d topk=%d%s", (long long)s->S1, (long long)s->C,
             s->Hi, s->Di, k, s->exact ? " exact" : "");
    const int64_t n = s->S1 * k, nf = s->S1 * full;
    int32_t *idF = IALLOC(n), *idN = IALLOC(n), *fF = IALLOC(nf), *fN = IALLOC(nf);
    float *scF = FALLOC(n), *scN = FALLOC(n), *sfF = FALLOC(nf), *sfN = FALLOC(nf);
    run_topk(&P, dsv4_lightning_indexer, full, idF, scF, fF, sfF, "fast", d);
    run_topk(&P, dsv4_lightning_indexer_ref, full, idN, scN, fN, sfN, "naive", d);
    int bad_sc = 0, bad_id = 0, bad_exact = 0;
    for (int64_t p = 0; p < s->S1; p++) {
      double amax = 0, a;
      for (int j = 0; j < P.vis_count[p]; j++) {
        index_score(&P, p, P.vis_begin[p] + j, &a);
        amax = fmax(amax, a);
      }
      const double tol = 2 * (s->Di + s->Hi + 2) * U32 * amax;
      for (int j = 0; j < k && j < P.vis_count[p]; j++) {
        const int64_t i = p * k + j;
        bad_sc += s->exact ? memcmp(&scF[i], &scN[i], 4) != 0 : !(fabs(scF[i] - scN[i]) <= tol);
        if (idF[i] == idN[i]) continue;
        if (s->exact) { bad_id++; continue; }
        double sf = index_score(&P, p, idF[i], NULL); /* naive-precision score of fast's choice */
        bad_id += !(fabs(sf - scN[i]) <= 2 * tol);
      }
      for (int j = 0; s->exact && j < P.vis_count[p]; j++)
        bad_exact += (double)sfN[p * full + j] != index_score(&P, p, fN[p * full + j], NULL);
    }
    tu_check(!bad_sc, "indexer fast vs naive scores%s: %s (%d off)", s->exact ? " (same bits)" : "", d, bad_sc);
    tu_check(!bad_id, "indexer fast vs naive top-k ids (differ only at near-ties): %s (%d off)", d, bad_id);
    if (s->exact) tu_check(!bad_exact, "indexer naive scores exact: %s (%d off)", d, bad_exact);
    free(idF); free(idN); free(fF); free(fN); free(scF); free(scN); free(sfF); free(sfN);
    idx_free(&P);
  }
}

/* V4.1's two-level selection (docs/spec.md section 10 steps 5-6), judged against a brute force
 * over the exact scores (exact mode: every score is exact, so fast, naive and the brute force
 * agree bit for bit and ties are common): the candidate blocks (block score = max over the block,
 * the newest visible block pinned first, then score desc / block asc, -1 padded) and, given
 * candidates, the top-k of only the rows inside them (fewer than topk when the blocks bind;
 * padded -1). */
static int cand_before(double sa, int a, double sb, int b) { return sa > sb || (sa == sb && a < b); }

static void test_indexer_candidates(void) {
  static const struct { int block, n_cand; } BC[] = {{1, 1}, {2, 2}, {3, 2}, {4, 1}, {8, 5}, {2, 40}};
  char d[160];
  int64_t total_bound = 0;
  for (int c = 0; c < N_IDX_ALL; c++) {
    idx_spec sp = idx_case(c);
    sp.exact = 1;
    sp.C = imin64(sp.C, 200);
    idx_prob P;
    idx_make(&P, &sp);
    const int64_t S1 = sp.S1;
    const int k = sp.topk;
    for (int v = 0; v < (int)(sizeof BC / sizeof BC[0]); v++) {
      const int bs = BC[v].block, nc = BC[v].n_cand;
      snprintf(d, sizeof d, "S1=%lld C=%lld Hi=%d topk=%d block=%d n_cand=%d", (long long)S1, (long long)sp.C, sp.Hi,
               k, bs, nc);
      int32_t *cand[2] = {IALLOC(S1 * nc), IALLOC(S1 * nc)}, *ids[2] = {IALLOC(S1 * k), IALLOC(S1 * k)};
      for (int impl = 0; impl < 2; impl++) {
        dsv4_status (*fn)(const dsv4_indexer_args *) = impl ? dsv4_lightning_indexer_ref : dsv4_lightning_indexer;
        dsv4_indexer_args a = P.a;
        a.block = bs, a.n_cand = nc, a.cand_out = cand[impl];
        tu_ok(fn(&a), "indexer with cand_out");
        a.cand_out = NULL;
        a.cand_in = cand[impl];
        a.topk_ids = ids[impl];
        tu_ok(fn(&a), "indexer with cand_in");
      }
      tu_check(!memcmp(cand[0], cand[1], sizeof(int32_t) * S1 * nc) && !memcmp(ids[0], ids[1], sizeof(int32_t) * S1 * k),
               "indexer candidates fast == naive (same bits, exact scores): %s", d);
      int bad_c = 0, bad_s = 0, bound = 0;
      for (int64_t p = 0; p < S1; p++) {
        const int n = P.vis_count[p], b0 = P.vis_begin[p], nb = (n + bs - 1) / bs;
        double bsc[256];
        int order[256], m = 0;
        for (int b = 0; b < nb && b < 256; b++) { /* block scores, newest pinned */
          double mx = -INFINITY;
          for (int j = b * bs; j < n && j < (b + 1) * bs; j++) mx = fmax(mx, index_score(&P, p, b0 + j, NULL));
          bsc[b] = b == nb - 1 ? INFINITY : mx;
          int i = m++;
          while (i > 0 && cand_before(bsc[b], b, bsc[order[i - 1]], order[i - 1])) { order[i] = order[i - 1]; i--; }
          order[i] = b;
        }
        for (int j = 0; j < nc; j++) bad_c += cand[0][p * nc + j] != (j < nb ? order[j] : -1);
        /* top-k inside the kept blocks */
        double esc[256];
        int eid[256], ne = 0;
        for (int j = 0; j < n && ne < 256; j++) {
          int in = 0;
          for (int t = 0; t < nc && t < nb; t++) in |= order[t] == j / bs;
          if (!in) continue;
          const double sj = index_score(&P, p, b0 + j, NULL);
          int i = ne++;
          while (i > 0 && cand_before(sj, b0 + j, esc[i - 1], eid[i - 1])) { esc[i] = esc[i - 1]; eid[i] = eid[i - 1]; i--; }
          esc[i] = sj, eid[i] = b0 + j;
        }
        for (int j = 0; j < k; j++) bad_s += ids[0][p * k + j] != (j < ne ? eid[j] : -1);
        bound += ne < k && ne < n;
      }
      tu_check(!bad_c, "indexer candidate blocks (max per block, newest pinned, ties to the smaller block): %s (%d off)",
               d, bad_c);
      tu_check(!bad_s, "indexer top-k inside the candidate blocks (fewer than topk when they bind, -1 padded): %s (%d off)",
               d, bad_s);
      total_bound += bound;
      free(cand[0]); free(cand[1]); free(ids[0]); free(ids[1]);
    }
    idx_free(&P);
  }
  tu_check(total_bound > 0, "indexer candidates: the sweep has queries whose blocks bind (%lld)", (long long)total_bound);
}

/* Ties by construction: identical key rows (bitwise identical scores in both paths, since a
 * score column depends only on its key row) must come out in ascending id order. */
static void test_indexer_identical_keys(void) {
  idx_spec sp = {4, 12, 2, 8, 5, 0, 0, 77};
  idx_prob P;
  idx_make(&P, &sp);
  for (int64_t j = 1; j < sp.C; j++) memcpy(P.k_idx + j * sp.Di, P.k_idx, sizeof(float) * sp.Di);
  for (int impl = 0; impl < 2; impl++) {
    tu_ok((impl ? dsv4_lightning_indexer_ref : dsv4_lightning_indexer)(&P.a), "indexer");
    int ok = 1;
    for (int64_t p = 0; p < sp.S1; p++)
      for (int j = 0; j < sp.topk; j++)
        ok &= P.ids[p * sp.topk + j] == (j < P.vis_count[p] ? P.vis_begin[p] + j : -1);
    tu_check(ok, "indexer %s: identical keys -> the smallest ids, ascending", impl ? "naive" : "fast");
  }
  idx_free(&P);
}

/* ============================================================================================
 * Sparse attention
 * ========================================================================================== */
/* Runs impl into fresh copies of out / lse (buffers pre-filled with `fill`: both are overwritten). */
static void attn_run(attn_prob *P, dsv4_status (*fn)(const dsv4_attn_args *), float fill, float *out,
                     float *lse) {
  const int64_t no = P->sp.S1 * P->sp.H * P->sp.D, nl = P->sp.S1 * P->sp.H;
  for (int64_t i = 0; i < no; i++) P->out[i] = fill;
  for (int64_t i = 0; i < nl; i++) P->lse[i] = fill;
  tu_ok(fn(&P->a), "sparse_attn");
  memcpy(out, P->out, sizeof(float) * no);
  memcpy(lse, P->lse, sizeof(float) * nl);
}

/* Padding queries (win_len 0): out and lse exactly 0. */
static int padding_zero(const attn_prob *P, const float *out, const float *lse) {
  const int HD = P->sp.H * P->sp.D;
  int ok = 1;
  for (int64_t p = 0; p < P->sp.S1; p++) {
    if (P->win_len[p]) continue;
    for (int i = 0; i < HD; i++) ok &= out[p * HD + i] == 0.0f;
    for (int h = 0; h < P->sp.H; h++) ok &= lse[p * P->sp.H + h] == 0.0f;
  }
  return ok;
}

/* Fast vs naive, padding, overwritten outputs, two phases, ranges == ids. Tolerance: scores are
 * D-term fp32 dot products of |q| <= 2, |k| <= 1 (times D^-0.5), softmax and output are fp32 sums
 * over n_keys = W + compressed keys; 8 (D + n_keys) u relative to max(max|ref|, 1) covers those
 * plus the few roundings per term (exp, scale, normalise). lse likewise. */
static void test_sparse_attn(void) {
  char d[160], name[256];
  for (int c = 0; c < N_ATTN_ALL; c++) {
    const attn_spec sp = attn_case(c);
    attn_prob P;
    attn_make(&P, &sp);
    attn_desc(&P, d, sizeof d);
    const attn_spec *s = &P.sp;
    const int64_t no = s->S1 * s->H * s->D, nl = s->S1 * s->H;
    const int64_t n_keys = s->W + (s->mode == CMP_IDS ? s->n_ids : s->mode == CMP_RANGE ? s->C : 0);
    const double tol = 8 * (s->D + n_keys) * U32;
    float *oF = FALLOC(no), *lF = FALLOC(nl), *oN = FALLOC(no), *lN = FALLOC(nl);
    float *o2 = FALLOC(no), *l2 = FALLOC(nl);
    attn_run(&P, dsv4_sparse_attn, 0.0f, oF, lF);
    attn_run(&P, dsv4_sparse_attn_ref, 0.0f, oN, lN);
    snprintf(name, sizeof name, "sparse_attn fast vs naive out: %s", d);
    tu_close(name, oF, oN, no, tol, 1.0);
    snprintf(name, sizeof name, "sparse_attn fast vs naive lse: %s", d);
    tu_close(name, lF, lN, nl, tol, 1.0);
    if (s->pad_every)
      tu_check(padding_zero(&P, oF, lF) && padding_zero(&P, oN, lN),
               "sparse_attn padding queries: out == 0 and lse == 0 exactly (fast, naive): %s", d);
    attn_run(&P, dsv4_sparse_attn, 1e3f, o2, l2);
    tu_check(!memcmp(o2, oF, sizeof(float) * no) && !memcmp(l2, lF, sizeof(float) * nl),
             "sparse_attn fast: out/lse overwritten (garbage before, same bits): %s", d);
    /* the two phases of the CP core equal the one-call operator, bit for bit */
    float *ml = FALLOC(2 * nl);
    tu_ok(dsv4_sparse_attn_window(&P.a, ml, ml + nl), "sparse_attn_window");
    tu_ok(dsv4_sparse_attn_finish(&P.a, ml, ml + nl), "sparse_attn_finish");
    tu_check(!memcmp(P.out, oF, sizeof(float) * no) && !memcmp(P.lse, lF, sizeof(float) * nl),
             "sparse_attn window + finish == one call (same bits): %s", d);
    free(ml);
    if (s->mode == CMP_RANGE) { /* HCA ranges vs the same keys as explicit ids */
      attn_prob Q;
      attn_ranges_as_ids(&P, &Q);
      attn_run(&Q, dsv4_sparse_attn, 0.0f, o2, l2);
      snprintf(name, sizeof name, "sparse_attn fast: ranges == same keys as ids (same bits): %s", d);
      check_invariant(name, o2, oF, no);
      attn_run(&Q, dsv4_sparse_attn_ref, 0.0f, o2, l2);
      tu_check(!memcmp(o2, oN, sizeof(float) * no) && !memcmp(l2, lN, sizeof(float) * nl),
               "sparse_attn naive: ranges == same keys as ids (same bits): %s", d);
      attn_free(&Q);
    }
    free(oF); free(lF); free(oN); free(lN); free(o2); free(l2);
    attn_free(&P);
  }
}

/* ============================================================================================
 * KL loss (forward; gradients in test_ops_grad.c)
 * ========================================================================================== */
/* Fast vs naive loss (gradient pointers NULL: the forward-only path). The loss is a sum of
 * t (log t - log s) with O(1) logs; each fp32 log-probability carries about (terms) u absolute error
 * with terms = D + Di dot products, H + Hi head sums and n set entries: 8 (D + Di + H + Hi + n) u per
 * row (rows are compared with a floor of 1, sums relative to the number of valid rows). */
static void test_kl_forward(void) {
  char d[160], name[256];
  for (int c = 0; c < N_KL_ALL; c++)
    for (int dense = 0; dense < 2; dense++) {
      const kl_case kcv = kl_case_at(c), *kc = &kcv;
      kl_prob K;
      kl_make(&K, &kc->ix, kc->H, kc->D, dense, 1.0f);
      K.a.d_q_idx = NULL; K.a.d_weights = NULL; K.a.d_k_idx = NULL;
      const idx_spec *s = &K.ix.sp;
      snprintf(d, sizeof d, "S1=%lld C=%lld H=%d D=%d Hi=%d Di=%d topk=%d %s", (long long)s->S1,
               (long long)s->C, K.H, K.D, s->Hi, s->Di, s->topk, dense ? "dense" : "sparse");
      int64_t expect_valid = 0, nmax = 1;
      for (int64_t p = 0; p < s->S1; p++) {
        int n = 0;
        for (int j = 0; j < s->topk; j++) n += K.sel[p * s->topk + j] >= 0;
        n = dense ? K.ix.vis_count[p] : n;
        expect_valid += n > 0;
        nmax = imax64(nmax, n);
      }
      double *rows = (double *)xalloc((size_t)s->S1, sizeof(double)), loss_f;
      for (int64_t p = 0; p < s->S1; p++) K.loss_rows[p] = 99.0; /* overwritten */
      tu_ok(dsv4_indexer_kl_loss(&K.a), "indexer_kl_loss");
      memcpy(rows, K.loss_rows, sizeof(double) * s->S1);
      loss_f = K.loss;
      const int64_t nv_f = K.n_valid;
      K.a.loss_rows = NULL; /* may be NULL: same sum */
      tu_ok(dsv4_indexer_kl_loss(&K.a), "indexer_kl_loss");
      tu_check(K.loss == loss_f, "kl_loss fast: loss_rows NULL gives the same loss_sum bits: %s", d);
      K.a.loss_rows = K.loss_rows;
      tu_ok(dsv4_indexer_kl_loss_ref(&K.a), "indexer_kl_loss_ref");
      const double tol = 8 * (K.D + s->Di + K.H + s->Hi + nmax) * U32;
      snprintf(name, sizeof name, "kl_loss fast vs naive loss_rows: %s", d);
      close_d(name, rows, K.loss_rows, s->S1, tol, 1.0);
      double nvd = (double)(expect_valid ? expect_valid : 1);
      snprintf(name, sizeof name, "kl_loss fast vs naive loss_sum: %s", d);
      close_d(name, &loss_f, &K.loss, 1, tol * nvd, 1.0);
      double sum = 0;
      for (int64_t p = 0; p < s->S1; p++) sum += rows[p];
      tu_check(nv_f == expect_valid && K.n_valid == expect_valid && sum == loss_f,
               "kl_loss n_valid (fast %lld, naive %lld, expected %lld), loss_sum == sum of loss_rows "
               "in order: %s", (long long)nv_f, (long long)K.n_valid, (long long)expect_valid, d);
      free(rows);
      kl_free(&K);
    }
}

/* ============================================================================================
 * Position invariance of the fast kernels: results for a query (slot) computed in a call holding
 * only a subset of the queries, in fresh buffers with shifted rows, have the same bits.
 * ========================================================================================== */
static void test_invariance_attn(void) {
  char d[160], name[256];
  for (int c = 0; c < N_ATTN_ALL; c++) {
    const attn_spec sp = attn_case(c);
    if (sp.S1 < 2) continue;
    attn_prob P;
    attn_make(&P, &sp);
    attn_desc(&P, d, sizeof d);
    tu_ok(dsv4_sparse_attn(&P.a), "sparse_attn");
    const int64_t ks[2] = {1, P.sp.S1 / 2}, HD = P.sp.H * P.sp.D;
    for (int t = 0; t < 2; t++) {
      attn_prob Q;
      attn_subset(&P, ks[t], &Q);
      tu_ok(dsv4_sparse_attn(&Q.a), "sparse_attn");
      snprintf(name, sizeof name, "sparse_attn fast position invariance (drop first %lld) out: %s",
               (long long)ks[t], d);
      check_invariant(name, Q.out, P.out + ks[t] * HD, Q.sp.S1 * HD);
      snprintf(name, sizeof name, "sparse_attn fast position invariance (drop first %lld) lse: %s",
               (long long)ks[t], d);
      check_invariant(name, Q.lse, P.lse + ks[t] * P.sp.H, Q.sp.S1 * P.sp.H);
      attn_free(&Q);
    }
    attn_free(&P);
  }
}

static void test_invariance_indexer(void) {
  char name[256];
  for (int c = 0; c < N_IDX_ALL; c++) {
    const idx_spec sp = idx_case(c);
    if (sp.S1 < 2) continue;
    idx_prob P, Q;
    idx_make(&P, &sp);
    tu_ok(dsv4_lightning_indexer(&P.a), "indexer");
    const int64_t k = P.sp.S1 / 3 + 1, topk = P.sp.topk;
    int64_t c0;
    idx_subset(&P, k, &Q, &c0);
    tu_ok(dsv4_lightning_indexer(&Q.a), "indexer");
    int ids_ok = 1;
    for (int64_t i = 0; i < Q.sp.S1 * topk; i++)
      ids_ok &= (Q.ids[i] < 0 ? -1 : Q.ids[i] + c0) == P.ids[k * topk + i];
    snprintf(name, sizeof name, "indexer fast position invariance scores: S1=%lld C=%lld Hi=%d Di=%d "
             "(drop first %lld, rows shifted by %lld)", (long long)P.sp.S1, (long long)P.sp.C,
             P.sp.Hi, P.sp.Di, (long long)k, (long long)c0);
    check_invariant(name, Q.scores, P.scores + k * topk, Q.sp.S1 * topk);
    tu_check(ids_ok, "indexer fast position invariance ids: S1=%lld C=%lld", (long long)P.sp.S1,
             (long long)P.sp.C);
    idx_free(&P); idx_free(&Q);
  }
}

static void test_invariance_kl(void) {
  char name[256];
  for (int c = 0; c < N_KL_ALL; c++)
    for (int dense = 0; dense < 2; dense++) {
      const kl_case kcv = kl_case_at(c), *kc = &kcv;
      if (kc->ix.S1 < 2) continue;
      kl_prob K, Q;
      kl_make(&K, &kc->ix, kc->H, kc->D, dense, 0.75f);
      tu_ok(dsv4_indexer_kl_loss(&K.a), "kl_loss");
      const int64_t k = K.ix.sp.S1 / 2, Hi = K.ix.sp.Hi, Di = K.ix.sp.Di;
      kl_subset(&K, k, &Q);
      tu_ok(dsv4_indexer_kl_loss(&Q.a), "kl_loss");
      const int64_t n = Q.ix.sp.S1;
      float *lr_q = FALLOC(n), *lr_k = FALLOC(n);
      int rows_same = !memcmp(Q.loss_rows, K.loss_rows + k, sizeof(double) * n);
      snprintf(name, sizeof name, "kl_loss fast position invariance loss_rows: S1=%lld C=%lld %s "
               "(drop first %lld)", (long long)K.ix.sp.S1, (long long)K.ix.sp.C,
               dense ? "dense" : "sparse", (long long)k);
      if (g_bitwise) {
        tu_check(rows_same, "%s", name);
      } else {
        for (int64_t i = 0; i < n; i++) { lr_q[i] = (float)Q.loss_rows[i]; lr_k[i] = (float)K.loss_rows[k + i]; }
        tu_close(name, lr_q, lr_k, n, 1e-5, 1.0);
      }
      snprintf(name, sizeof name, "kl_loss fast position invariance d_q_idx: S1=%lld %s",
               (long long)K.ix.sp.S1, dense ? "dense" : "sparse");
      check_invariant(name, Q.d_q_idx, K.d_q_idx + k * Hi * Di, n * Hi * Di);
      snprintf(name, sizeof name, "kl_loss fast position invariance d_weights: S1=%lld %s",
               (long long)K.ix.sp.S1, dense ? "dense" : "sparse");
      check_invariant(name, Q.d_weights, K.d_weights + k * Hi, n * Hi);
      free(lr_q); free(lr_k);
      kl_free(&K); kl_free(&Q);
    }
}

/* Slots [k, n) of P in fresh buffers from the first row they read (rows shifted, no out_row map). */
static void cmp_subset(const cmp_prob *P, int64_t k, cmp_prob *Q) {
  const int64_t r0 = P->prev_row && P->prev_row[k] >= 0 ? P->prev_row[k] : P->cur_row[k];
  const int r = P->sp.ratio;
  memset(Q, 0, sizeof *Q);
  Q->sp = P->sp;
  Q->sp.n_slots -= k;
  Q->sp.out_map = 0;
  Q->cD = P->cD;
  Q->rows = P->rows - r0;
  Q->rows_out = Q->sp.n_slots;
  Q->C = DUP(P->C + r0 * P->cD, (P->rows - r0) * P->cD);
  Q->Z = P->Z ? DUP(P->Z + r0 * P->cD, (P->rows - r0) * P->cD) : NULL;
  Q->ape = P->ape ? DUP(P->ape, (int64_t)r * P->cD) : NULL;
  Q->norm_w = DUP(P->norm_w, P->sp.D);
  Q->out = FALLOC(Q->sp.n_slots * P->sp.D);
  Q->cur_row = DUP(P->cur_row + k, Q->sp.n_slots);
  Q->pos = DUP(P->pos + k, Q->sp.n_slots);
  if (P->prev_row) Q->prev_row = DUP(P->prev_row + k, Q->sp.n_slots);
  for (int64_t s = 0; s < Q->sp.n_slots; s++) {
    Q->cur_row[s] -= (int32_t)r0;
    if (Q->prev_row && Q->prev_row[s] >= 0) Q->prev_row[s] -= (int32_t)r0;
  }
  rope_make(&Q->rope, P->sp.rope_dim, r, P->sp.n_slots * r + 1);
  cmp_bind(Q);
}

static void test_invariance_compressor(void) {
  char d[128], name[256];
  for (int c = 0; c < N_CMP_ALL; c++) {
    const cmp_spec sp = cmp_case(c);
    if (sp.n_slots < 2) continue;
    cmp_prob P, Q;
    cmp_make(&P, &sp);
    cmp_desc(&P, d, sizeof d);
    tu_ok(dsv4_compress(&P.a), "compress");
    const int64_t k = P.sp.n_slots / 2, D = P.sp.D;
    cmp_subset(&P, k, &Q);
    tu_ok(dsv4_compress(&Q.a), "compress");
    int same = 1;
    for (int64_t s = k; s < P.sp.n_slots; s++)
      same &= !memcmp(Q.out + (s - k) * D, P.out + dsv4_compress_out_row(&P.a, s) * D, sizeof(float) * D);
    snprintf(name, sizeof name, "compressor fast position invariance (drop first %lld slots, rows "
             "shifted): %s", (long long)k, d);
    tu_check(same, "%s", name);
    cmp_free(&P); cmp_free(&Q);
  }
}

/* The fast forward kernels give the same bits with one thread as with the default count (ranks may
 * run different thread counts). */
static void test_thread_invariance(void) {
#ifdef _OPENMP
  const int nt = omp_get_max_threads();
  char d[160], name[256];
  for (int c = 2; c < N_ATTN_ALL; c += 2) {
    const attn_spec sp = attn_case(c);
    attn_prob P;
    attn_make(&P, &sp);
    attn_desc(&P, d, sizeof d);
    const int64_t no = P.sp.S1 * P.sp.H * P.sp.D;
    tu_ok(dsv4_sparse_attn(&P.a), "sparse_attn");
    float *o1 = DUP(P.out, no);
    omp_set_num_threads(1);
    tu_ok(dsv4_sparse_attn(&P.a), "sparse_attn");
    omp_set_num_threads(nt);
    snprintf(name, sizeof name, "sparse_attn fast: 1 thread == %d threads (same bits): %s", nt, d);
    check_bits(P.out, o1, sizeof(float) * no, name);
    free(o1);
    attn_free(&P);
  }
  for (int c = 1; c < N_KL_ALL; c += 2) {
    const kl_case kc = kl_case_at(c);
    kl_prob K;
    kl_make(&K, &kc.ix, kc.H, kc.D, 0, 1.0f);
    const int64_t n = K.ix.sp.S1 * K.ix.sp.topk;
    tu_ok(dsv4_lightning_indexer(&K.ix.a), "indexer");
    tu_ok(dsv4_indexer_kl_loss(&K.a), "kl_loss");
    int32_t *ids = DUP(K.ix.ids, n);
    float *sc = DUP(K.ix.scores, n);
    const double loss = K.loss;
    omp_set_num_threads(1);
    tu_ok(dsv4_lightning_indexer(&K.ix.a), "indexer");
    tu_ok(dsv4_indexer_kl_loss(&K.a), "kl_loss");
    omp_set_num_threads(nt);
    tu_check(!memcmp(ids, K.ix.ids, sizeof(int32_t) * n) && !memcmp(sc, K.ix.scores, sizeof(float) * n) &&
                 loss == K.loss, "indexer and kl_loss fast: 1 thread == %d threads (same bits): S1=%lld C=%lld",
             nt, (long long)K.ix.sp.S1, (long long)K.ix.sp.C);
    free(ids); free(sc);
    kl_free(&K);
  }
#endif
}

/* ============================================================================================
 * Argument validation: bad rows fail with DSV4_ERR_ARG naming the argument, before any output is
 * written.
 * ========================================================================================== */
typedef dsv4_status (*attn_fn)(const dsv4_attn_args *);

/* dsv4_sparse_attn_window / _finish as attn_fn (the finish phase gets dummy m / l). */
static dsv4_status attn_window_only(const dsv4_attn_args *a) {
  float *ml = FALLOC(2 * a->S1 * a->H + 1);
  dsv4_status st = dsv4_sparse_attn_window(a, ml, ml + a->S1 * a->H);
  free(ml);
  return st;
}
static dsv4_status attn_finish_only(const dsv4_attn_args *a) {
  float *ml = FALLOC(2 * a->S1 * a->H + 1);
  dsv4_status st = dsv4_sparse_attn_finish(a, ml, ml + a->S1 * a->H);
  free(ml);
  return st;
}
static dsv4_status attn_bwd_fast(const dsv4_attn_args *a) {
  const int64_t nq = a->S1 * a->H * a->D;
  float *dq = FALLOC(nq), *dout = FALLOC(nq), *dkv = FALLOC(a->R * a->D), *dcmp = FALLOC(a->C * a->D);
  float *ds = FALLOC(a->H);
  dsv4_attn_bwd_args b = {dq, dkv, dcmp, ds, dout, a->out, a->lse, NULL, *a};
  dsv4_status st = dsv4_sparse_attn_bwd(&b);
  free(dq); free(dout); free(dkv); free(dcmp); free(ds);
  return st;
}

static void test_validation(void) {
  static const struct { attn_fn fn; const char *name; } FNS[] = {
      {dsv4_sparse_attn, "sparse_attn"}, {dsv4_sparse_attn_ref, "sparse_attn_ref"},
      {attn_window_only, "sparse_attn_window"}, {attn_finish_only, "sparse_attn_finish"},
      {attn_bwd_fast, "sparse_attn_bwd"}};
  char what[160];
  for (size_t f = 0; f < sizeof FNS / sizeof FNS[0]; f++) {
    attn_spec si = {6, 5, 2, 8, 3, 0, CMP_IDS, 3, 0, 0, 0, 0, 5}, sr = si;
    sr.mode = CMP_RANGE;
    attn_prob P, Q;
    attn_make(&P, &si);
    attn_make(&Q, &sr);
    Q.cmp_begin[4] = 2; Q.cmp_count[4] = 2; /* valid ranges the bad values below break */
    Q.cmp_count[2] = 1; Q.cmp_count[5] = 1;
    const int64_t no = P.sp.S1 * P.sp.H * P.sp.D;
    struct { int32_t *slot, val; attn_prob *pr; const char *needle, *desc; } bad[] = {
        {&P.cmp_ids[4], 5, &P, "cmp_ids", "cmp_ids = C"},
        {&P.cmp_ids[7], -2, &P, "cmp_ids", "cmp_ids = -2"},
        {&P.win_start[3], 5, &P, "window", "window past ori_kv"},
        {&P.win_start[2], -1, &P, "window", "negative win_start"},
        {&P.win_len[1], -1, &P, "window", "negative win_len"},
        {&Q.cmp_count[4], 4, &Q, "compressed range", "range past C"},
        {&Q.cmp_count[5], -1, &Q, "compressed range", "negative cmp_count"},
        {&Q.cmp_begin[2], -1, &Q, "compressed range", "negative cmp_begin"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      const int32_t keep = *bad[i].slot;
      *bad[i].slot = bad[i].val;
      for (int64_t j = 0; j < no; j++) bad[i].pr->out[j] = 7.0f;
      snprintf(what, sizeof what, "%s with %s", FNS[f].name, bad[i].desc);
      expect_arg_error(FNS[f].fn(&bad[i].pr->a), bad[i].needle, what);
      int untouched = 1;
      for (int64_t j = 0; j < no; j++) untouched &= bad[i].pr->out[j] == 7.0f;
      tu_check(untouched, "%s: out untouched", what);
      *bad[i].slot = keep;
    }
    attn_free(&P); attn_free(&Q);
  }
  /* indexer and KL: visible ranges and selected ids */
  kl_prob K;
  idx_spec sp = {6, 10, 2, 8, 4, 0, 0, 9};
  kl_make(&K, &sp, 2, 8, 0, 1.0f);
  K.ix.vis_begin[3] = 8; K.ix.vis_count[3] = 3;
  expect_arg_error(dsv4_lightning_indexer(&K.ix.a), "visible range", "lightning_indexer with range past C");
  expect_arg_error(dsv4_lightning_indexer_ref(&K.ix.a), "visible range", "lightning_indexer_ref with range past C");
  K.dense = 1; kl_bind(&K, 1.0f);
  expect_arg_error(dsv4_indexer_kl_loss(&K.a), "visible range", "indexer_kl_loss dense with range past C");
  expect_arg_error(dsv4_indexer_kl_loss_ref(&K.a), "visible range", "indexer_kl_loss_ref dense with range past C");
  K.ix.vis_count[3] = -1;
  expect_arg_error(dsv4_lightning_indexer(&K.ix.a), "visible range", "lightning_indexer with vis_count -1");
  K.ix.vis_count[3] = 0; K.dense = 0; kl_bind(&K, 1.0f);
  K.sel[5] = 10;
  expect_arg_error(dsv4_indexer_kl_loss(&K.a), "topk_ids", "indexer_kl_loss with topk_ids = C");
  K.sel[5] = -3;
  expect_arg_error(dsv4_indexer_kl_loss_ref(&K.a), "topk_ids", "indexer_kl_loss_ref with topk_ids = -3");
  kl_free(&K);
  /* compressor: the ratio */
  cmp_prob P;
  cmp_make(&P, &CMP_CASES[1]);
  P.a.ratio = 3;
  expect_arg_error(dsv4_compress(&P.a), "ratio", "compress with ratio 3");
  expect_arg_error(dsv4_compress_ref(&P.a), "ratio", "compress_ref with ratio 3");
  P.a.ratio = P.sp.ratio;
  /* a window reaching past the last row of C/Z must be refused, not read */
  const int32_t keep = P.cur_row[P.sp.n_slots - 1];
  P.cur_row[P.sp.n_slots - 1] = (int32_t)(P.rows - P.sp.ratio + 1);
  expect_arg_error(dsv4_compress(&P.a), "cur_row", "compress with a window past the last row");
  expect_arg_error(dsv4_compress_ref(&P.a), "cur_row", "compress_ref with a window past the last row");
  P.cur_row[P.sp.n_slots - 1] = keep;
  if (P.out_row) {
    P.out_row[0] = (int32_t)P.rows_out;
    expect_arg_error(dsv4_compress(&P.a), "out_row", "compress with out_row past the output");
  }
  cmp_free(&P);
}

/* The fused path: the attention's teacher output and the indexer's scores given to the KL operator
 * must give what the KL operator computes on its own (the teacher bitwise: same logits product, same
 * routine; scores to fp32 accuracy), and the naive attention's teacher must agree with the fast one. */
static void test_kl_given_teacher(void) {
  char name[256];
  for (int c = 0; c < N_KL_ALL; c++) {
    const kl_case kc = kl_case_at(c);
    kl_prob K;
    kl_make(&K, &kc.ix, kc.H, kc.D, 0, 0.5f);
    const idx_spec *s = &K.ix.sp;
    const int64_t S1 = s->S1, k = s->topk, D = K.D, H = K.H;
    if (S1 == 0 || s->C == 0) {
      kl_free(&K);
      continue;
    }
    float *kv = FALLOC(S1 * D), *out = FALLOC(S1 * H * D), *lse = FALLOC(S1 * H), *sink = FALLOC(H);
    float *tf = FALLOC(S1 * k), *tr = FALLOC(S1 * k), *scores = FALLOC(S1 * k);
    int32_t *ws = IALLOC(S1), *wl = IALLOC(S1);
    tu_fill(kv, S1 * D, 77, 1.0f);
    for (int64_t p = 0; p < S1; p++) ws[p] = (int32_t)p, wl[p] = 1;
    dsv4_attn_args at = {.out = out, .lse = lse, .q = K.q, .ori_kv = kv, .win_start = ws, .win_len = wl,
                         .cmp_kv = K.cmp_kv, .cmp_ids = K.sel, .sink = sink, .S1 = S1, .R = S1, .C = s->C,
                         .H = (int)H, .D = (int)D, .n_cmp_ids = (int)k, .scale = (float)(1.0 / sqrt(D)), .teacher = tf};
    tu_ok(dsv4_sparse_attn(&at), "sparse_attn with teacher");
    at.teacher = tr;
    tu_ok(dsv4_sparse_attn_ref(&at), "sparse_attn_ref with teacher");
    snprintf(name, sizeof name, "attention teacher output fast vs naive: S1=%lld k=%lld H=%lld", (long long)S1,
             (long long)k, (long long)H);
    tu_close(name, tf, tr, S1 * k, 1e-5, 1e-3);
    /* the KL operator computing its teacher, then given the attention's */
    double *rows0 = (double *)xalloc((size_t)S1, sizeof(double));
    float *dq0 = FALLOC(S1 * s->Hi * s->Di);
    tu_ok(dsv4_indexer_kl_loss(&K.a), "kl");
    memcpy(rows0, K.loss_rows, sizeof(double) * S1);
    memcpy(dq0, K.d_q_idx, sizeof(float) * S1 * s->Hi * s->Di);
    K.a.teacher = tf;
    tu_ok(dsv4_indexer_kl_loss(&K.a), "kl with teacher");
    tu_check(!memcmp(rows0, K.loss_rows, sizeof(double) * S1) &&
                 !memcmp(dq0, K.d_q_idx, sizeof(float) * S1 * s->Hi * s->Di),
             "kl_loss fast: the attention's teacher gives the same bits as its own: S1=%lld k=%lld", (long long)S1,
             (long long)k);
    /* scores of the selected ids, in double, given as the student */
    for (int64_t p = 0; p < S1; p++)
      for (int64_t j = 0; j < k; j++) {
        const int32_t id = K.sel[p * k + j];
        double sc = 0;
        for (int h = 0; h < s->Hi && id >= 0; h++) {
          double d = 0;
          for (int e = 0; e < s->Di; e++)
            d += (double)K.ix.q_idx[(p * s->Hi + h) * s->Di + e] * K.ix.k_idx[(int64_t)id * s->Di + e];
          sc += K.ix.weights[p * s->Hi + h] * (d > 0 ? d : 0);
        }
        scores[p * k + j] = id >= 0 ? (float)sc : -INFINITY;
      }
    K.a.scores = scores;
    tu_ok(dsv4_indexer_kl_loss(&K.a), "kl with scores");
    snprintf(name, sizeof name, "kl_loss fast with given scores vs its own: S1=%lld k=%lld", (long long)S1, (long long)k);
    close_d(name, K.loss_rows, rows0, S1, 1e-5, 1.0);
    K.a.teacher = NULL;
    K.a.scores = NULL;
    free(kv), free(out), free(lse), free(sink), free(tf), free(tr), free(scores), free(ws), free(wl), free(rows0), free(dq0);
    kl_free(&K);
  }
}

/* The KL adding its k_idx gradient into the caller's exact sums (a layer backward's one-thread path):
 * the sums, rounded, are the bits the plain call writes to d_k_idx, which the call leaves unwritten;
 * the loss and d q_idx keep their bits; sums of too few rows are an error that names them. */
static void test_kl_into(void) {
  char d[160];
  for (int c = 0; c < N_KL_ALL; c++)
    for (int dense = 0; dense < 2; dense++) {
      const kl_case kc = kl_case_at(c);
      kl_prob K;
      kl_make(&K, &kc.ix, kc.H, kc.D, dense, 0.75f);
      const idx_spec *s = &K.ix.sp;
      const int64_t C = s->C, Di = s->Di, nq = s->S1 * s->Hi * Di;
      if (C == 0) {
        kl_free(&K);
        continue;
      }
      snprintf(d, sizeof d, "S1=%lld C=%lld topk=%d %s", (long long)s->S1, (long long)C, s->topk,
               dense ? "dense" : "sparse");
      tu_ok(dsv4_indexer_kl_loss(&K.a), "kl_loss");
      float *dk0 = DUP(K.d_k_idx, C * Di), *dq0 = DUP(K.d_q_idx, nq), *dk1 = FALLOC(C * Di);
      const double loss0 = K.loss;
      int64_t *base = (int64_t *)xalloc((size_t)(C * 2 * Di), sizeof(int64_t));
      dsv4_xrows x = dsv4_xrows_view(base, C, Di, 1);
      memset(K.d_k_idx, 0xff, sizeof(float) * (size_t)(C * Di)); /* NaN bits: must stay */
      memset(K.d_q_idx, 0, sizeof(float) * (size_t)nq);
      tu_ok(dsv4_indexer_kl_loss_into(&K.a, &x), "kl_loss into sums");
      int untouched = 1;
      for (int64_t e = 0; e < C * Di; e++) untouched &= ((const uint32_t *)K.d_k_idx)[e] == 0xffffffffu;
      tu_ok(dsv4_xrows_finish(&x, dk1, "kl sums"), "kl sums rounded");
      tu_check(untouched && !memcmp(dk0, dk1, sizeof(float) * (size_t)(C * Di)) &&
                   !memcmp(dq0, K.d_q_idx, sizeof(float) * (size_t)nq) && K.loss == loss0,
               "kl_loss into the caller's sums: d_k_idx untouched, the sums round to its bits, d q_idx and "
               "the loss unchanged: %s",
               d);
      dsv4_xrows few = dsv4_xrows_view(base, C - 1, Di, 1);
      expect_arg_error(dsv4_indexer_kl_loss_into(&K.a, &few), "k_idx gradient sums",
                       "kl_loss into C - 1 rows");
      free(dk0), free(dq0), free(dk1), free(base);
      kl_free(&K);
    }
}

/* The difference helpers must not lose a NaN that a later finite difference follows. */
static void test_diff_keeps_nan(void) {
  const float a[3] = {0.0f, NAN, 1.0f}, b[3] = {0.0f, 0.0f, 0.0f};
  tu_check(isnan(tu_max_abs_diff(a, b, 3)), "max_abs_diff: a NaN in the middle is reported");
}

/* The RoPE table holds a window of positions (a rank deep inside a long document needs only its
 * own): a rotation at position p has the same bits whatever window holds p, and a window that
 * grows keeps its old entries. */
static void test_rope_window(void) {
  dsv4_config cfg = DSV4_CONFIG_INIT;
  dsv4_rope a, b;
  if (!tu_ok(dsv4_config_preset(&cfg, "flash"), "flash preset")) return;
  if (!tu_ok(dsv4_rope_init(&a, &cfg, 4), "rope init") || !tu_ok(dsv4_rope_init(&b, &cfg, 4), "rope init")) return;
  const int64_t far = 3000000;
  int ok = dsv4_rope_reserve(&a, 0, far + 64) == DSV4_OK && dsv4_rope_reserve(&b, far - 64, far + 64) == DSV4_OK &&
           b.cap < 1024 && dsv4_rope_reserve(&b, far - 300, far - 10) == DSV4_OK && b.lo <= far - 300;
  float va[64], vb[64];
  for (int64_t pos = far - 300; ok && pos < far + 64; pos += 7) {
    tu_fill(va, 64, (uint64_t)pos, 1.0f);
    memcpy(vb, va, sizeof va);
    dsv4_rope_apply(&a, va, 64, pos, pos & 1);
    dsv4_rope_apply(&b, vb, 64, pos, pos & 1);
    ok = !memcmp(va, vb, sizeof va);
  }
  tu_check(ok, "rope: a window of %lld positions around 3M gives the bits of the whole table", (long long)b.cap);
  tu_check(dsv4_rope_reserve(&b, 10, 5) == DSV4_ERR_ARG, "rope: an inverted position range is refused");
  /* ranges (a zigzag rank's chunks at both ends of a sequence): the same bits as the whole table,
   * and only their positions held */
  dsv4_rope_ranges rg = {0};
  dsv4_rope_ranges_add(&rg, far - 40, far + 64);
  dsv4_rope_ranges_add(&rg, 100, 300);
  dsv4_rope_ranges_add(&rg, 290, 310); /* overlaps the second: one range [100, 310) */
  ok = rg.n == 2 && rg.lo[0] == 100 && rg.hi[0] == 310 && dsv4_rope_reserve_ranges(&b, &rg) == DSV4_OK &&
       b.cap == 210 + 104 && dsv4_rope_has(&b, 309) && !dsv4_rope_has(&b, 310) &&
       !dsv4_rope_has(&b, far - 41);
  for (int64_t pos = 100; ok && pos < far + 64; pos = pos < 310 && pos + 3 >= 310 ? far - 40 : pos + 3) {
    tu_fill(va, 64, (uint64_t)pos, 1.0f);
    memcpy(vb, va, sizeof va);
    dsv4_rope_apply(&a, va, 64, pos, pos & 1);
    dsv4_rope_apply(&b, vb, 64, pos, pos & 1);
    ok = !memcmp(va, vb, sizeof va);
  }
  tu_check(ok, "rope: a table of two ranges (%lld positions, 100 and 3M) gives the bits of the whole table",
           (long long)b.cap);
  /* ranges that touch merge; one range too many merges the two closest */
  dsv4_rope_ranges m = {0};
  for (int j = 0; j < DSV4_ROPE_RANGES; j++) dsv4_rope_ranges_add(&m, 1000 * j, 1000 * j + 10);
  dsv4_rope_ranges_add(&m, 10, 20); /* touches [0, 10) */
  const int eight = m.n == DSV4_ROPE_RANGES && m.hi[0] == 20;
  dsv4_rope_ranges_add(&m, 5500, 5600); /* a ninth: 400 below [6000, 6010), 490 above [5000, 5010) */
  tu_check(eight && m.n == DSV4_ROPE_RANGES && m.hi[5] == 5010 && m.lo[6] == 5500 && m.hi[6] == 6010 &&
               m.lo[7] == 7000 && dsv4_rope_ranges_positions(&m) == 20 + 5 * 10 + 510 + 10,
           "rope ranges: touching ones merge, a ninth merges the two closest (%d ranges)", m.n);
  dsv4_rope_free(&a);
  dsv4_rope_free(&b);
}

/* The operators' forward checks (test_ops_grad.c has the backward ones). */
static void probe(void) {
  g_bitwise = dsv4_blas_probe_invariance();
  if (!g_bitwise) printf("note: this BLAS is not row-position invariant: invariance checked to 1e-5\n");
}

/* dsv4_topk_select against the contract's order by the simplest sort: lists full of exact ties,
 * -0 beside +0 (equal scores: the smaller id first), -INFINITY and ids in random order, from one
 * entry to past the merge sort's buffer (4096: the heap sort then). The order is strict, so the
 * first k entries must be exactly the reference's, and the whole list a permutation of the input. */
static void test_topk_order(void) {
  static const int64_t sizes[][2] = {{1, 1}, {7, 3}, {9, 9}, {100, 17}, {513, 512}, {1024, 512}, {2048, 2048},
                                     {3000, 512}, {4096, 4096}, {5000, 4500}};
  static const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -INFINITY, 3.0f, 1e-30f};
  uint32_t st = 12345u;
  for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
    const int64_t n = sizes[c][0], k = sizes[c][1];
    dsv4_scored *v = malloc(sizeof *v * n), *ref = malloc(sizeof *v * n), *a = malloc(sizeof *v * n);
    for (int64_t i = 0; i < n; i++) { /* distinct ids in scrambled order; scores mostly tied */
      st = st * 1664525u + 1013904223u;
      const float sc = (st >> 29) < 6 ? pool[(st >> 8) % 8] : (float)((st >> 8) % 1000) / 7.0f;
      v[i] = (dsv4_scored){sc, (int32_t)((i * 7919) % n)};
    }
    memcpy(ref, v, sizeof *v * n);
    for (int64_t i = 1; i < n; i++) { /* insertion sort: the reference */
      const dsv4_scored x = ref[i];
      int64_t j = i;
      for (; j > 0 && dsv4_scored_before(x, ref[j - 1]); j--) ref[j] = ref[j - 1];
      ref[j] = x;
    }
    memcpy(a, v, sizeof *v * n);
    dsv4_topk_select(a, n, k);
    tu_check(!memcmp(a, ref, sizeof *v * k), "top-k select: n %lld, k %lld: the first k are the order's first k, same bits",
             (long long)n, (long long)k);
    dsv4_topk_select(a, n, n); /* the whole list sorted: a permutation of the input */
    tu_check(!memcmp(a, ref, sizeof *v * n), "top-k select: n %lld: a permutation of the input", (long long)n);
    free(v), free(ref), free(a);
  }
}

static const tu_test TESTS[] = {
    {"rope", "contract", test_rope_window},
    {"rmsnorm", "fast-vs-naive", test_rmsnorm},
    {"rope", "fast-vs-naive", test_rope},
    {"compressor", "fast-vs-naive", test_compressor},
    {"indexer", "fast-vs-naive", test_indexer},
    {"kl_loss", "contract", test_kl_given_teacher},
    {"kl_loss", "sums", test_kl_into},
    {"util", "contract", test_diff_keeps_nan},
    {"indexer", "contract", test_indexer_identical_keys},
    {"indexer", "candidates", test_indexer_candidates},
    {"topk", "contract", test_topk_order},
    {"sparse_attn", "fast-vs-naive", test_sparse_attn},
    {"kl_loss", "fast-vs-naive", test_kl_forward},
    {"sparse_attn", "position-invariance", test_invariance_attn},
    {"indexer", "position-invariance", test_invariance_indexer},
    {"kl_loss", "position-invariance", test_invariance_kl},
    {"compressor", "position-invariance", test_invariance_compressor},
    {"all", "thread-invariance", test_thread_invariance},
    {"all", "contract", test_validation},
};

int main(int argc, char **argv) {
  probe();
  return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0]));
}
