/* mpitest_cp_sweep.c: randomized packings through two-stage CP, run under `mpirun -np 8`
 * (tests/test_cp.py). Each iteration draws, from one seed every rank shares: a layer kind (r = 0,
 * 4 or 128), documents of any length (mostly 1 .. 3r tokens, some longer, some with padding), or a
 * batch of B sequences of any length S; a window, a top-k width, a KL mode; a rank count N in 1..8
 * and a split. The first N ranks then run the layer twice: alone (CP = 1, the whole stream) and
 * together (CP = N, each its own shard), forward and backward, and compare their shard of the
 * CP = 1 result: out, top-k ids, the KL loss, dx and the rank-summed weight gradients bitwise
 * where the BLAS probe allows (dsv4_blas_probe_invariance; else dx to 1e-5 and the gradients to
 * 1e-4 relative to max(1, max |value|), SPEC 6). Every other packing runs its CP = N layer with
 * recomputation (dsv4_layer_set_recompute), which must not change a bit. The weight gradients' path
 * cycles with the iteration (rows to the blocks' owners or exact sums between ranks; a recomputed
 * backward's kept rows or whole-weight sums: DSV4_WGRAD_ROWS, DSV4_WGRAD_KEEP), and every CP rank's
 * measured messages (dsv4_cp_get_stats) must equal the planner's (dsv4_cp_plan_traffic_opts), kind
 * by kind. Ranks >= N sit the iteration out.
 * Rank 0 prints one PASS/FAIL line per packing.
 *
 * usage: mpitest_cp_sweep [iterations (default 240)] [seed (default 1)] */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_mpi.h"
#include "testutil.h"
#include "util/rng.h"

#define MAX_RANKS 8
#define MAX_DOCS 64
#define TOL_DX 1e-5
#define TOL_GRAD 1e-4

/* A small deterministic generator (splitmix64 over a counter), the same on every rank. */
typedef struct {
  uint64_t s;
} prng;
static uint64_t next(prng *g) { return dsv4_mix64(g->s++); }
static int64_t uniform(prng *g, int64_t lo, int64_t hi) { return lo + (int64_t)(next(g) % (uint64_t)(hi - lo + 1)); }

typedef struct {
  int ratio, layer, N, window, topk, dense, batched, recompute;
  dsv4_split split;
  int n_docs;
  int32_t cu[MAX_DOCS + 1], real[MAX_DOCS];
  int64_t T;
  char desc[512];
} packing;

/* Document lengths: mostly 1 .. 3r (windows and partial tails of every size), sometimes longer. */
static int64_t doc_len(prng *g, int r) {
  const int64_t unit = r ? r : 8;
  return uniform(g, 0, 7) == 0 ? uniform(g, 3 * unit, 6 * unit) : uniform(g, 1, 3 * unit);
}

static void draw(prng *g, packing *p) {
  static const int ratios[4] = {0, 4, 4, 128}, layers[3] = {0, 1, 2}; /* tiny preset: 0, 4, 128 */
  memset(p, 0, sizeof *p);
  const int k = (int)uniform(g, 0, 3);
  p->ratio = ratios[k];
  p->layer = layers[p->ratio == 0 ? 0 : p->ratio == 4 ? 1 : 2];
  p->N = (int)uniform(g, 1, MAX_RANKS);
  p->split = uniform(g, 0, 1) ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS;
  p->window = (int)uniform(g, 1, 24);
  p->topk = (int)uniform(g, 1, 12);
  p->dense = uniform(g, 0, 3) == 0;
  p->recompute = (int)uniform(g, 0, 1);
  const int64_t pieces = p->split == DSV4_SPLIT_ZIGZAG ? 2 * p->N : p->N;
  int len = 0;
  if (uniform(g, 0, 6) == 0) { /* a batch of B sequences of S tokens, S any multiple of the pieces */
    p->batched = 1;
    p->n_docs = (int)uniform(g, 1, 3);
    const int64_t S = pieces * uniform(g, 1, (p->ratio == 128 ? 320 : 40) / pieces + 1);
    for (int i = 0; i < p->n_docs; i++) p->cu[i + 1] = (int32_t)((i + 1) * S);
    len = snprintf(p->desc, sizeof p->desc, "batch %d x %lld", p->n_docs, (long long)S);
  } else {
    const int max_docs = p->ratio == 128 ? 4 : 12;
    const int n = (int)uniform(g, 1, max_docs);
    for (int i = 0; i < n; i++) p->cu[i + 1] = p->cu[i] + (int32_t)doc_len(g, p->ratio);
    p->n_docs = n;
    const int64_t rem = p->cu[n] % pieces; /* one more document makes T divisible */
    if (rem) {
      p->cu[n + 1] = p->cu[n] + (int32_t)(pieces - rem);
      p->n_docs = n + 1;
    }
    len = snprintf(p->desc, sizeof p->desc, "docs");
  }
  p->T = p->cu[p->n_docs];
  for (int i = 0; i < p->n_docs; i++) {
    const int32_t padded = p->cu[i + 1] - p->cu[i];
    p->real[i] = !p->batched && padded > 1 && uniform(g, 0, 3) == 0 ? (int32_t)uniform(g, 1, padded - 1) : padded;
    if (p->batched || len >= (int)sizeof p->desc - 24) continue;
    if (p->real[i] < padded)
      len += snprintf(p->desc + len, sizeof p->desc - (size_t)len, " %d:%d", padded, p->real[i]);
    else
      len += snprintf(p->desc + len, sizeof p->desc - (size_t)len, " %d", padded);
  }
}

/* Rows of a seeded [T, d] tensor: element (g, e) depends only on (seed, stream, g, e). */
static void fill_rows(float *dst, const int64_t *rows, int64_t n, int64_t d, uint64_t seed, uint64_t stream) {
  for (int64_t i = 0; i < n; i++) dsv4_random_fill(dst + i * d, d, seed, stream, rows[i] * d, 1.0f);
}

typedef struct {
  dsv4_weights *grads;
  float *out, *dx, loss;
  int32_t *topk;
  int64_t n, *rows;
  char plan[160]; /* CP runs: the first message kind whose measured count differs from the plan */
} result;

static void result_free(result *r) {
  dsv4_weights_free(r->grads);
  free(r->out), free(r->dx), free(r->topk), free(r->rows);
  memset(r, 0, sizeof *r);
}

/* One forward + backward of this rank's rows (all of them when comm is NULL). */
static dsv4_status run(const dsv4_config *cfg, const packing *p, const dsv4_weights *w, dsv4_comm *comm,
                       int rank, uint64_t seed, result *r) {
  dsv4_status st = DSV4_OK;
  dsv4_layer *l = NULL;
  float *x = NULL, *dout = NULL;
  const dsv4_packing pk = TU_PACKING(p->cu, p->real, p->n_docs, p->T, p->batched);
  const dsv4_cp_config cp = {DSV4_HEAD(dsv4_cp_config), .split = p->split, .overlap = 1};
  const int64_t d = cfg->dim, k = cfg->index_topk;
  memset(r, 0, sizeof *r);
  const int size = comm ? p->N : 1;
  if ((st = dsv4_cp_shard_rows(&pk, &cp, comm ? rank : 0, size, NULL, &r->n)) != DSV4_OK) goto done;
  r->rows = malloc(sizeof(int64_t) * (size_t)r->n);
  x = malloc(sizeof(float) * (size_t)(r->n * d));
  dout = malloc(sizeof(float) * (size_t)(r->n * d));
  r->out = malloc(sizeof(float) * (size_t)(r->n * d));
  r->dx = malloc(sizeof(float) * (size_t)(r->n * d));
  r->topk = malloc(sizeof(int32_t) * (size_t)(r->n * k));
  if (!r->rows || !x || !dout || !r->out || !r->dx || !r->topk) {
    st = DSV4_ERR_NOMEM;
    goto done;
  }
  if ((st = dsv4_cp_shard_rows(&pk, &cp, comm ? rank : 0, size, r->rows, &r->n)) != DSV4_OK) goto done;
  fill_rows(x, r->rows, r->n, d, seed, 1);
  fill_rows(dout, r->rows, r->n, d, seed, 2);
  if ((st = dsv4_layer_create(&l, cfg, p->layer, w)) != DSV4_OK) goto done;
  if (comm && p->recompute && (st = dsv4_layer_set_recompute(l, 1)) != DSV4_OK) goto done;
  if (comm && (st = dsv4_cp_patch(dsv4_layer_core(l), comm, &cp)) != DSV4_OK) goto done;
  if ((st = dsv4_weights_create(&r->grads, cfg, p->layer)) != DSV4_OK) goto done;
  if ((st = tu_forward(l, r->out, r->topk, &r->loss, x, r->n, &pk, 1)) != DSV4_OK) goto done;
  if ((st = tu_backward(l, r->dx, r->grads, dout, 1.0f)) != DSV4_OK) goto done;
  if (comm) {
    dsv4_cp_stats got = DSV4_CP_STATS_INIT, want = DSV4_CP_STATS_INIT;
    const dsv4_plan_opts po = {DSV4_HEAD(dsv4_plan_opts), .recompute = p->recompute};
    if ((st = dsv4_cp_get_stats(dsv4_layer_core(l), &got)) != DSV4_OK ||
        (st = dsv4_cp_plan_traffic_opts(cfg, p->layer, &pk, &cp, &po, rank, size, &want)) != DSV4_OK)
      goto done;
    for (int m = 0; m < DSV4_MSG_KINDS && !r->plan[0]; m++)
      if (got.bytes_sent[m] != want.bytes_sent[m] || got.bytes_recv[m] != want.bytes_recv[m] ||
          got.messages[m] != want.messages[m])
        snprintf(r->plan, sizeof r->plan, "%s: measured %llu / %llu B in %llu messages, planned %llu / %llu in %llu",
                 dsv4_msg_kind_name((dsv4_msg_kind)m), (unsigned long long)got.bytes_sent[m],
                 (unsigned long long)got.bytes_recv[m], (unsigned long long)got.messages[m],
                 (unsigned long long)want.bytes_sent[m], (unsigned long long)want.bytes_recv[m],
                 (unsigned long long)want.messages[m]);
  }
done:
  dsv4_layer_free(l);
  free(x), free(dout);
  return st;
}

/* max |a - b| / max(1, max |b|); NaN-safe (a NaN difference gives +inf). */
static double rel_diff(const float *a, const float *b, int64_t n) {
  double m = 0, ref = 1;
  for (int64_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - b[i]);
    if (!(e <= m)) m = isnan(e) ? INFINITY : e;
    if (fabs(b[i]) > ref) ref = fabs(b[i]);
  }
  return m / ref;
}

/* This rank's verdict on its shard: "" when everything holds, else the first difference. bitwise:
 * dx and the gradients too must be the same bytes (else within SPEC 6's tolerance). */
static void compare(const dsv4_config *cfg, const packing *p, const result *one, const result *cp, int bitwise,
                    char *why, size_t cap) {
  const int64_t d = cfg->dim, k = cfg->index_topk;
  why[0] = 0;
  double worst_dx = 0;
  for (int64_t i = 0; i < cp->n && !why[0]; i++) {
    const int64_t g = cp->rows[i];
    if (memcmp(cp->out + i * d, one->out + g * d, sizeof(float) * (size_t)d))
      snprintf(why, cap, "out row %lld not bitwise equal", (long long)g);
    else if (p->ratio == 4 && memcmp(cp->topk + i * k, one->topk + g * k, sizeof(int32_t) * (size_t)k))
      snprintf(why, cap, "topk row %lld differs", (long long)g);
    else if (bitwise && memcmp(cp->dx + i * d, one->dx + g * d, sizeof(float) * (size_t)d))
      snprintf(why, cap, "dx row %lld not bitwise equal", (long long)g);
    const double e = rel_diff(cp->dx + i * d, one->dx + g * d, d);
    worst_dx = e > worst_dx || isnan(e) ? e : worst_dx;
  }
  if (!why[0] && p->ratio == 4 && memcmp(&cp->loss, &one->loss, sizeof(float)))
    snprintf(why, cap, "indexer loss %.9g vs %.9g", cp->loss, one->loss);
  if (!why[0] && !(worst_dx <= TOL_DX)) snprintf(why, cap, "dx rel %.3g > %g", worst_dx, TOL_DX);
  for (int t = 0; t < dsv4_weights_count(cp->grads) && !why[0]; t++) {
    dsv4_tensor a = DSV4_TENSOR_INIT, b = DSV4_TENSOR_INIT;
    if (dsv4_weights_get(cp->grads, t, &a) != DSV4_OK || dsv4_weights_get(one->grads, t, &b) != DSV4_OK) {
      snprintf(why, cap, "gradient %d missing", t);
      break;
    }
    const double e = rel_diff(a.data, b.data, a.numel);
    if (bitwise && memcmp(a.data, b.data, sizeof(float) * (size_t)a.numel))
      snprintf(why, cap, "grad %s not bitwise equal (rel %.3g)", a.name, e);
    else if (!(e <= TOL_GRAD))
      snprintf(why, cap, "grad %s rel %.3g > %g", a.name, e, TOL_GRAD);
  }
  if (!why[0] && cp->plan[0]) snprintf(why, cap, "messages: %s", cp->plan);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iters = argc > 1 ? atoi(argv[1]) : 240;
  const uint64_t seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 1;
  prng g = {dsv4_mix64(seed)};
  const int bitwise = dsv4_blas_probe_invariance();
  static const char *const rows_path[3] = {NULL, "always", "never"}, *const keep_path[2] = {NULL, "sums"};
  int n_bitwise = 0;
  for (int it = 0; it < iters; it++) {
    packing p;
    draw(&g, &p);
    if (p.N > size) p.N = size;
    const int64_t pieces = p.split == DSV4_SPLIT_ZIGZAG ? 2 * p.N : p.N;
    const int64_t unit = p.batched ? p.cu[1] : p.T;
    if (unit % pieces) p.split = DSV4_SPLIT_CONTIGUOUS; /* N was clamped to the world size */
    dsv4_config cfg = DSV4_CONFIG_INIT;
    dsv4_weights *w = NULL;
    char why[256] = "";
    int ok = dsv4_config_preset(&cfg, "tiny") == DSV4_OK;
    cfg.window = p.window;
    cfg.index_topk = p.topk;
    cfg.index_loss_mode = p.dense ? DSV4_KL_DENSE : DSV4_KL_SPARSE;
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < p.N ? 0 : MPI_UNDEFINED, rank, &sub);
    if (rank < p.N) {
      dsv4_comm *comm = NULL;
      result one = {0}, cp = {0};
      const uint64_t data_seed = 1000 + (uint64_t)it;
      ok = ok && dsv4_weights_create(&w, &cfg, p.layer) == DSV4_OK && dsv4_weights_init_random(w, data_seed) == DSV4_OK;
      ok = ok && dsv4_comm_create_mpi(&comm, sub) == DSV4_OK;
      /* the weight gradients' path of this iteration (the same on every rank; bits do not change) */
      if (rows_path[it % 3]) setenv("DSV4_WGRAD_ROWS", rows_path[it % 3], 1);
      if (keep_path[(it / 3) % 2]) setenv("DSV4_WGRAD_KEEP", keep_path[(it / 3) % 2], 1);
      /* the CP run first: every rank of the group must reach its collectives */
      dsv4_status st = ok ? run(&cfg, &p, w, comm, rank, data_seed, &cp) : DSV4_ERR_STATE;
      unsetenv("DSV4_WGRAD_ROWS");
      unsetenv("DSV4_WGRAD_KEEP");
      if (st != DSV4_OK) snprintf(why, sizeof why, "CP run: %s", dsv4_last_error());
      if (!why[0] && (st = run(&cfg, &p, w, NULL, 0, data_seed, &one)) != DSV4_OK)
        snprintf(why, sizeof why, "CP = 1 run: %s", dsv4_last_error());
      if (!why[0]) compare(&cfg, &p, &one, &cp, bitwise, why, sizeof why);
      result_free(&one);
      result_free(&cp);
      dsv4_comm_free(comm);
      dsv4_weights_free(w);
      /* rank 0 reports the first failing rank's reason */
      int bad = why[0] ? rank : p.N, first = p.N;
      MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MIN, sub);
      if (first < p.N) MPI_Bcast(why, sizeof why, MPI_CHAR, first, sub);
      if (rank == 0) {
        n_bitwise += first == p.N;
        tu_check(first == p.N, "sweep %d: r=%d N=%d %s T=%lld W=%d k=%d%s%s%s%s%s%s %s%s%s", it, p.ratio, p.N,
                 p.split == DSV4_SPLIT_ZIGZAG ? "zigzag" : "contiguous", (long long)p.T, p.window, p.topk,
                 p.dense ? " dense" : "", p.recompute ? " recompute" : "", rows_path[it % 3] ? " rows=" : "",
                 rows_path[it % 3] ? rows_path[it % 3] : "", keep_path[(it / 3) % 2] && p.recompute ? " keep=" : "",
                 keep_path[(it / 3) % 2] && p.recompute ? keep_path[(it / 3) % 2] : "", p.desc,
                 first < p.N ? ": " : "", first < p.N ? why : "");
      }
      MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank == 0)
    printf("note: %d of %d random packings equal to CP = 1 (%s), messages as planned\n", n_bitwise, iters,
           bitwise ? "bitwise, gradients too" : "forward bitwise; the BLAS probe fails: gradients within SPEC 6");
  MPI_Finalize();
  return rank == 0 ? tu_finish() : 0;
}
