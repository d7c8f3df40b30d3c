/* test_layer.c: the layer and core API on the tiny preset: fast against naive (forward and
 * backward, packed with padding and batched), layer-level central finite differences, call-order
 * errors, and a core patched with another one-rank communicator (which must equal the unpatched
 * core bitwise: same stages, no messages). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Packed inputs with padding. r = 0 and 4: documents [0,32) (30 real), [32,48), [48,64) (9 real);
 * r = 128 (documents must be multiples of 128): [0,256) (200 real), [256,384). Batched: 2 x 32 or 3 x 128. */
static const int32_t CU_S[4] = {0, 32, 48, 64}, REAL_S[3] = {30, 16, 9};
static const int32_t CU_L[3] = {0, 256, 384}, REAL_L[2] = {200, 128};
static const int32_t CU_BS[3] = {0, 32, 64}, CU_BL[4] = {0, 128, 256, 384};

typedef struct {
  dsv4_config cfg;
  dsv4_weights *w, *g;
  dsv4_layer *l;
  float *x, *dout, *out, *dx;
  int32_t *topk;
  float loss;
  dsv4_packing pk;
  int64_t T;
} fixture;

/* The tiny preset's layer, with its attention window set to window (0: the preset's). */
static int setup_window(fixture *f, int layer, int batched, int window) {
  memset(f, 0, sizeof *f);
  f->cfg = (dsv4_config)DSV4_CONFIG_INIT;
  if (!tu_ok(dsv4_config_preset(&f->cfg, "tiny"), "tiny preset")) return 0;
  if (window) f->cfg.window = window;
  const int64_t d = f->cfg.dim;
  const int large = f->cfg.compress_ratios[layer] == 128;
  f->T = large ? 384 : 64;
  f->x = malloc(sizeof(float) * f->T * d);
  f->dout = malloc(sizeof(float) * f->T * d);
  f->out = malloc(sizeof(float) * f->T * d);
  f->dx = malloc(sizeof(float) * f->T * d);
  f->topk = malloc(sizeof(int32_t) * f->T * f->cfg.index_topk);
  if (!tu_check(f->x && f->dout && f->out && f->dx && f->topk, "fixture buffers allocated")) return 0;
  tu_fill(f->x, f->T * d, 11, 1.0f);
  tu_fill(f->dout, f->T * d, 12, 1.0f);
  if (batched)
    f->pk = TU_PACKING(large ? CU_BL : CU_BS, NULL, large ? 3 : 2, f->T, 1);
  else
    f->pk = large ? TU_PACKING(CU_L, REAL_L, 2, f->T, 0) : TU_PACKING(CU_S, REAL_S, 3, f->T, 0);
  return tu_ok(dsv4_weights_create(&f->w, &f->cfg, layer), "weights") && tu_ok(dsv4_weights_init_random(f->w, 5), "init") &&
         tu_ok(dsv4_weights_create(&f->g, &f->cfg, layer), "grads") &&
         tu_ok(dsv4_layer_create(&f->l, &f->cfg, layer, f->w), "layer");
}

static int setup(fixture *f, int layer, int batched) { return setup_window(f, layer, batched, 0); }

static void teardown(fixture *f) {
  dsv4_layer_free(f->l);
  dsv4_weights_free(f->w);
  dsv4_weights_free(f->g);
  free(f->x), free(f->dout), free(f->out), free(f->dx), free(f->topk);
}

/* forward + backward; grads zeroed first */
static int run(fixture *f) {
  dsv4_weights_zero(f->g);
  return tu_ok(tu_forward(f->l, f->out, f->topk, &f->loss, f->x, f->T, &f->pk, 1), "forward") &&
         tu_ok(tu_backward(f->l, f->dx, f->g, f->dout, 1.0f), "backward");
}

/* Scalar objective sum(out * dout) + loss in double (for finite differences). */
static double objective(fixture *f) {
  if (tu_forward(f->l, f->out, f->topk, &f->loss, f->x, f->T, &f->pk, 0) != DSV4_OK) return NAN;
  double s = f->loss;
  for (int64_t i = 0; i < f->T * f->cfg.dim; i++) s += (double)f->out[i] * f->dout[i];
  return s;
}

/* fast and naive paths: forward to 1e-4, gradients to 1e-3 of each tensor's max (fp32 BLAS sums
 * against double-accumulated loops over a few hundred terms) */
static void fast_vs_naive(int layer, int batched) {
  fixture a, b;
  if (!setup(&a, layer, batched) || !setup(&b, layer, batched)) return;
  dsv4_layer_set_impl(b.l, DSV4_IMPL_NAIVE);
  if (run(&a) && run(&b)) {
    const char *kind = batched ? "batched" : "packed";
    tu_close("layer fast vs naive: out", a.out, b.out, a.T * a.cfg.dim, 1e-4, 1e-6);
    tu_close("layer fast vs naive: dx", a.dx, b.dx, a.T * a.cfg.dim, 1e-3, 1e-6);
    for (int i = 0; i < dsv4_weights_count(a.g); i++) {
      dsv4_tensor ta = DSV4_TENSOR_INIT, tb = DSV4_TENSOR_INIT;
      tu_ok(dsv4_weights_get(a.g, i, &ta), "weights_get");
      tu_ok(dsv4_weights_get(b.g, i, &tb), "weights_get");
      char name[128];
      snprintf(name, sizeof name, "layer %d %s fast vs naive: grad %s", layer, kind, ta.name);
      tu_close(name, ta.data, tb.data, ta.numel, 1e-3, 1e-12);
    }
    if (a.cfg.compress_ratios[layer] == 4)
      tu_check(!memcmp(a.topk, b.topk, sizeof(int32_t) * a.T * a.cfg.index_topk),
               "layer %d %s fast vs naive: top-k identical", layer, kind);
    int pad_zero = 1;
    for (int t = 0; t < a.T && !batched; t++) {
      int doc = 0;
      while (t >= a.pk.cu_seqlens[doc + 1]) doc++;
      if (t - a.pk.cu_seqlens[doc] >= a.pk.seqlens_real[doc])
        for (int e = 0; e < a.cfg.dim; e++) pad_zero &= a.out[t * a.cfg.dim + e] == 0 && a.dx[t * a.cfg.dim + e] == 0;
    }
    tu_check(pad_zero, "layer %d %s: padding rows have exactly zero out and dx", layer, kind);
  }
  teardown(&a);
  teardown(&b);
}

/* Central differences of the objective against the naive backward, on a few elements. h = 5e-3
 * keeps fp32 rounding of the ~1e2-sized sum (~1e-5) small against the slope; tolerance 2%.
 * Elements whose perturbation changes the top-k (a discontinuity) are avoided by choice of tensor:
 * for r = 4 only tensors the indexer does not read. */
static void finite_differences(int layer, const char *tensor, int n_probe) {
  fixture f;
  if (!setup(&f, layer, 0)) return;
  dsv4_layer_set_impl(f.l, DSV4_IMPL_NAIVE);
  if (run(&f)) {
    float *p = strcmp(tensor, "x") ? dsv4_weights_find(f.w, tensor) : f.x;
    const float *g = strcmp(tensor, "x") ? dsv4_weights_find(f.g, tensor) : f.dx;
    int64_t n = strcmp(tensor, "x") ? 0 : f.T * f.cfg.dim;
    for (int i = 0; n == 0 && i < dsv4_weights_count(f.w); i++) {
      dsv4_tensor t = DSV4_TENSOR_INIT;
      tu_ok(dsv4_weights_get(f.w, i, &t), "weights_get");
      if (t.data == p) n = t.numel;
    }
    double gmax = 0;
    for (int64_t i = 0; i < n; i++) gmax = fabs(g[i]) > gmax ? fabs(g[i]) : gmax;
    int ok = 1;
    double worst = 0;
    for (int k = 0; k < n_probe; k++) {
      const int64_t i = (int64_t)((k * 2654435761u) % (uint64_t)n);
      const float keep = p[i], h = 5e-3f;
      p[i] = keep + h;
      const double up = objective(&f);
      p[i] = keep - h;
      const double dn = objective(&f);
      p[i] = keep;
      const double fd = (up - dn) / (2.0 * h), err = fabs(fd - g[i]) / fmax(fabs(g[i]), 0.05 * gmax);
      worst = err > worst ? err : worst;
      ok &= err < 2e-2;
    }
    tu_check(ok, "layer %d finite differences of %s (%d elements): worst relative error %.2g", layer, tensor, n_probe,
             worst);
  }
  teardown(&f);
}

static void call_order(void) {
  fixture f;
  if (!setup(&f, 1, 0)) return;
  tu_check(tu_backward(f.l, f.dx, f.g, f.dout, 1.0f) == DSV4_ERR_STATE, "layer backward before forward: %s",
           dsv4_last_error());
  tu_ok(tu_forward(f.l, f.out, f.topk, &f.loss, f.x, f.T, &f.pk, 0), "inference forward");
  tu_check(tu_backward(f.l, f.dx, f.g, f.dout, 1.0f) == DSV4_ERR_STATE,
           "layer backward after an inference forward (train = 0) refused");
  tu_check(tu_forward(f.l, f.out, f.topk, &f.loss, f.x, f.T - 4, &f.pk, 0) == DSV4_ERR_ARG &&
               strstr(dsv4_last_error(), "rows"),
           "layer forward with x rows != T on one rank: %s", dsv4_last_error());
  teardown(&f);
}

/* A core patched with another one-rank communicator runs the same stages over the same plan:
 * results must be bitwise equal to the unpatched core. */
static void cp_self(int layer) {
  fixture a, b;
  dsv4_comm *comm = NULL;
  if (!setup(&a, layer, 0) || !setup(&b, layer, 0) || !tu_ok(dsv4_comm_create_self(&comm), "comm")) return;
  dsv4_cp_config cfg = {DSV4_HEAD(dsv4_cp_config), .split = DSV4_SPLIT_CONTIGUOUS, .overlap = 1};
  if (tu_ok(dsv4_cp_patch(dsv4_layer_core(b.l), comm, &cfg), "patch") && run(&a) && run(&b)) {
    int same = !memcmp(a.out, b.out, sizeof(float) * a.T * a.cfg.dim) &&
               !memcmp(a.dx, b.dx, sizeof(float) * a.T * a.cfg.dim) && a.loss == b.loss;
    for (int i = 0; i < dsv4_weights_count(a.g); i++) {
      dsv4_tensor ta = DSV4_TENSOR_INIT, tb = DSV4_TENSOR_INIT;
      tu_ok(dsv4_weights_get(a.g, i, &ta), "weights_get");
      tu_ok(dsv4_weights_get(b.g, i, &tb), "weights_get");
      same &= !memcmp(ta.data, tb.data, sizeof(float) * (size_t)ta.numel);
    }
    tu_check(same, "layer %d: CP path on one rank equals the unpatched core bitwise (out, dx, loss, grads)", layer);
    dsv4_cp_stats st = DSV4_CP_STATS_INIT;
    dsv4_cp_stats zero = DSV4_CP_STATS_INIT;
    st = zero;
    tu_check(dsv4_cp_get_stats(dsv4_layer_core(b.l), &st) == DSV4_OK && !memcmp(&st, &zero, sizeof st) &&
                 dsv4_cp_get_stats(dsv4_layer_core(a.l), &st) == DSV4_OK && !memcmp(&st, &zero, sizeof st),
             "cp stats: one rank sends nothing, patched or not");
  }
  teardown(&a);
  teardown(&b);
  dsv4_comm_free(comm);
}

/* Recomputation must not change a bit: the same forward and backward with and without it, on a
 * stream of several backward chunks (DSV4_CHUNK_ROWS rows each), documents of any length;
 * and it must keep less. Then the same through the CP path on one rank. window: the attention
 * window (0: the preset's 16); at 64 a compressed layer's keys per query pass 2 head_dim (64), so
 * the recomputed forward does not keep its logits and the backward recomputes them (arenas.c). */
static void recompute_bitwise(int layer, int cp, int window) {
  static const int32_t cu[5] = {0, 700, 1503, 2499, 2500}, real[4] = {700, 777, 996, 1};
  const int64_t T = 2500;
  fixture f[2];
  memset(f, 0, sizeof f);
  dsv4_comm *comm = NULL;
  size_t saved[2] = {0, 0};
  int ok = 1;
  for (int k = 0; k < 2 && ok; k++) {
    ok = setup_window(&f[k], layer, 0, window);
    if (!ok) break;
    const int64_t d = f[k].cfg.dim;
    free(f[k].x), free(f[k].dout), free(f[k].out), free(f[k].dx), free(f[k].topk);
    f[k].T = T;
    f[k].x = malloc(sizeof(float) * T * d), f[k].dout = malloc(sizeof(float) * T * d);
    f[k].out = malloc(sizeof(float) * T * d), f[k].dx = malloc(sizeof(float) * T * d);
    f[k].topk = malloc(sizeof(int32_t) * T * f[k].cfg.index_topk);
    ok = tu_check(f[k].x && f[k].dout && f[k].out && f[k].dx && f[k].topk, "recompute fixture allocated");
    if (!ok) break;
    tu_fill(f[k].x, T * d, 21, 1.0f);
    tu_fill(f[k].dout, T * d, 22, 1.0f);
    f[k].pk = TU_PACKING(cu, real, 4, T, 0);
    if (k == 1) ok = tu_ok(dsv4_layer_set_recompute(f[k].l, 1), "recompute on");
    if (ok && cp && !comm) ok = tu_ok(dsv4_comm_create_self(&comm), "comm");
    const dsv4_cp_config cfg = {DSV4_HEAD(dsv4_cp_config), .split = DSV4_SPLIT_CONTIGUOUS, .overlap = 1};
    if (ok && cp) ok = tu_ok(dsv4_cp_patch(dsv4_layer_core(f[k].l), comm, &cfg), "patch");
    dsv4_weights_zero(f[k].g);
    ok = ok && tu_ok(tu_forward(f[k].l, f[k].out, f[k].topk, &f[k].loss, f[k].x, T, &f[k].pk, 1), "forward");
    saved[k] = dsv4_layer_saved_bytes(f[k].l);
    ok = ok && tu_ok(tu_backward(f[k].l, f[k].dx, f[k].g, f[k].dout, 1.0f), "backward");
  }
  if (ok) {
    const int64_t d = f[0].cfg.dim;
    int same = !memcmp(f[0].out, f[1].out, sizeof(float) * T * d) && !memcmp(f[0].dx, f[1].dx, sizeof(float) * T * d) &&
               !memcmp(&f[0].loss, &f[1].loss, sizeof(float));
    if (f[0].cfg.compress_ratios[layer] == 4)
      same &= !memcmp(f[0].topk, f[1].topk, sizeof(int32_t) * T * f[0].cfg.index_topk);
    for (int i = 0; i < dsv4_weights_count(f[0].g); i++) {
      dsv4_tensor ta = DSV4_TENSOR_INIT, tb = DSV4_TENSOR_INIT;
      if (dsv4_weights_get(f[0].g, i, &ta) != DSV4_OK || dsv4_weights_get(f[1].g, i, &tb) != DSV4_OK) same = 0;
      else same &= !memcmp(ta.data, tb.data, sizeof(float) * (size_t)ta.numel);
    }
    tu_check(same,
             "layer %d%s%s: recomputation gives bitwise the same out, top-k, loss, dx and every gradient",
             layer, cp ? " (CP path, one rank)" : "", window ? " (window 64: logits not kept)" : "");
    /* what it does not keep: q, o and each head's norm; the indexer's queries and weights (r = 4) */
    const dsv4_config *cf = &f[0].cfg;
    /* arena pieces are 64-byte aligned (model/arenas.h) */
#define PIECE(floats) (((size_t)(floats) * sizeof(float) + 63) / 64 * 64)
    size_t cut = 2 * PIECE(T * cf->n_heads * cf->head_dim) + PIECE(T * cf->n_heads);
    if (cf->compress_ratios[layer] == 4)
      cut += PIECE(T * cf->index_n_heads * cf->index_head_dim) + PIECE(T * cf->index_n_heads);
#undef PIECE
    tu_check(saved[1] > 0 && saved[0] - saved[1] == cut,
             "layer %d%s: recomputation keeps %zu bytes instead of %zu (q, o, norms, indexer queries: %zu less)", layer,
             cp ? " (CP path)" : "", saved[1], saved[0], cut);
  }
  teardown(&f[0]);
  teardown(&f[1]);
  dsv4_comm_free(comm);
}

/* A layer reuses its plan only for the same packing: after a forward on one packing, a forward on
 * another with the same T and document count (one boundary moved) must give bitwise what a fresh
 * layer gives on it, forward and backward. */
static void no_stale_plan(int layer) {
  static const int32_t cu2[4] = {0, 33, 48, 64}, real2[3] = {30, 15, 9};
  fixture a, b;
  if (!setup(&a, layer, 0) || !setup(&b, layer, 0)) return;
  if (a.cfg.compress_ratios[layer] != 128) {
    const dsv4_packing moved = TU_PACKING(cu2, real2, 3, a.T, 0);
    int ok = run(&a); /* on the fixture's packing, then on the moved one */
    a.pk = moved;
    b.pk = moved;
    ok = ok && run(&a) && run(&b);
    const int64_t d = a.cfg.dim;
    int same = ok && !memcmp(a.out, b.out, sizeof(float) * a.T * d) && !memcmp(a.dx, b.dx, sizeof(float) * a.T * d);
    for (int i = 0; ok && i < dsv4_weights_count(a.g); i++) {
      const dsv4_tensor ta = tu_tensor(a.g, i), tb = tu_tensor(b.g, i);
      same &= !memcmp(ta.data, tb.data, sizeof(float) * (size_t)ta.numel);
    }
    tu_check(same, "layer %d: a changed packing (one document boundary moved) is planned anew: bitwise a fresh layer's",
             layer);
  }
  teardown(&a);
  teardown(&b);
}

static void stale_plans(void) {
  for (int layer = 0; layer < 3; layer++) no_stale_plan(layer);
}

static void fast_naive(void) {
  for (int layer = 0; layer < 3; layer++) fast_vs_naive(layer, 0), fast_vs_naive(layer, 1);
}

static void self_comm(void) {
  for (int layer = 0; layer < 3; layer++) cp_self(layer);
}

static void recompute(void) {
  for (int layer = 0; layer < 3; layer++) recompute_bitwise(layer, 0, 0), recompute_bitwise(layer, 1, 0);
  for (int layer = 1; layer < 3; layer++) recompute_bitwise(layer, 0, 64);
}

static void fd(void) {
  finite_differences(0, "x", 6);
  finite_differences(0, "attn.wq_a.weight", 6);
  finite_differences(2, "x", 6);
  finite_differences(2, "attn.compressor.ape", 6);
  finite_differences(1, "attn.wo_b.weight", 6);
  finite_differences(1, "attn.compressor.wkv.weight", 6);
  finite_differences(1, "attn.attn_sink", 4);
}

static const tu_test TESTS[] = {
  {"layer", "stale-plan", stale_plans},
  {"layer", "fast-vs-naive", fast_naive},
  {"layer", "self-communicator", self_comm},
  {"layer", "recompute-bitwise", recompute},
  {"layer", "finite-differences", fd},
  {"layer", "call-order", call_order},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
