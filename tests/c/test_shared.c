/* test_shared.c: the calling contract of DeepSeek V4.1 layers that share state in one forward pass
 * (dsv4_shared, docs/spec.md section 10), on the tiny41 preset (1: kv source r = 2, 2: reuse,
 * 3: reindex, 4: reuse; 5: kv source r = 1 and candidate source, 7: reindex with candidates):
 * every misuse is an error naming the layers (a consumer without its source, out of order, after a
 * reset, with another packing, a source run twice in a pass, a failed source), the right order works
 * and gives the same bits as a second pass on a reset state, a kv source needs no shared state, and
 * V4 layers ignore one. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define T_TOK 48
#define N_LAY 10

static dsv4_config cfg;
static dsv4_weights *W[N_LAY], *G[N_LAY];
static dsv4_layer *Lay[N_LAY];
static float *x, *dout, *out[N_LAY], *dx;
static int32_t *topk;
static const int32_t CU[3] = {0, 29, T_TOK};

/* Layer L's forward over n rows of a stream of T tokens (T_TOK: two documents, else one). */
static dsv4_status fwd_n(int L, dsv4_shared *sh, int64_t T, int64_t n, int train) {
  const int32_t cu[2] = {0, (int32_t)T};
  const dsv4_packing pk = T == T_TOK ? TU_PACKING(CU, NULL, 2, T_TOK, 0) : TU_PACKING(cu, NULL, 1, T, 0);
  float loss = 0;
  const dsv4_layer_fwd_args a = {DSV4_HEAD(dsv4_layer_fwd_args), .out = out[L], .topk_ids = topk,
                                 .indexer_loss = &loss, .x = x, .n = n, .pk = &pk, .train = train, .shared = sh};
  return dsv4_layer_forward(Lay[L], &a);
}

static dsv4_status fwd(int L, dsv4_shared *sh, int64_t T, int train) { return fwd_n(L, sh, T, T, train); }

static dsv4_status bwd(int L) {
  const dsv4_layer_bwd_args a = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = dx, .grads = G[L], .dout = dout, .d_loss = 1};
  return dsv4_layer_backward(Lay[L], &a);
}

/* The status is an error whose message holds every needle. */
static void expect(dsv4_status st, const char *what, const char *n1, const char *n2) {
  const char *e = dsv4_last_error();
  tu_check(st != DSV4_OK && (!n1 || strstr(e, n1)) && (!n2 || strstr(e, n2)), "shared: %s (%s)", what,
           st == DSV4_OK ? "no error" : e);
}

static void test_misuse(void) {
  dsv4_shared *sh = NULL;
  tu_ok(dsv4_shared_create(&sh), "dsv4_shared_create");
  expect(fwd(2, NULL, T_TOK, 1), "a reuse layer without a shared state names its kv source", "layer 2", "layer 1");
  expect(fwd(2, sh, T_TOK, 1), "a reuse layer before its kv source ran", "layer 1", "has not run");
  tu_ok(fwd(1, sh, T_TOK, 1), "kv source 1 forward");
  expect(fwd(2, sh, 24, 1), "a consumer with another packing", "layer 2", "differs");
  tu_ok(fwd(2, sh, T_TOK, 1), "reuse 2 forward");
  tu_ok(fwd(3, sh, T_TOK, 1), "reindex 3 forward");
  expect(fwd(7, sh, T_TOK, 1), "a reindex layer whose candidate source did not run", "layer 5", NULL);
  expect(bwd(1), "a kv source's backward before its readers'", "layer 1", "before layer 2");
  tu_ok(bwd(3), "reindex 3 backward");
  expect(bwd(1), "... and before the remaining one", "layer 2", NULL);
  tu_ok(bwd(2), "reuse 2 backward");
  expect(bwd(2), "a consumer's backward twice", "layer 2", NULL);
  tu_ok(bwd(1), "kv source 1 backward after its readers");
  /* a reset between forward and backward */
  dsv4_shared_reset(sh);
  tu_ok(fwd(1, sh, T_TOK, 1), "kv source 1 forward (second pass)");
  tu_ok(fwd(2, sh, T_TOK, 1), "reuse 2 forward (second pass)");
  dsv4_shared_reset(sh);
  expect(bwd(2), "a backward after the pass's shared state was reset", "layer 2", "reset");
  /* a failed source forward leaves nothing for its readers */
  dsv4_shared_reset(sh);
  expect(fwd_n(1, sh, T_TOK, 47, 1), "kv source forward with a bad row count fails", "47", NULL);
  expect(fwd(2, sh, T_TOK, 1), "... and its reader finds no source", "layer 1", "has not run");
  /* an inference forward of the source cannot serve a training reader */
  dsv4_shared_reset(sh);
  tu_ok(fwd(1, sh, T_TOK, 0), "kv source 1 inference forward");
  expect(fwd(2, sh, T_TOK, 1), "a training reader of an inference source", "layer 1", "without train");
  tu_ok(fwd(2, sh, T_TOK, 0), "an inference reader of an inference source");
  expect(fwd(1, sh, T_TOK, 1), "a kv source twice in one pass", "layer 1", "already ran");
  dsv4_shared_free(sh);
}

/* The whole stack in order, twice on one state (reset between), and the kv sources alone without a
 * state: the same bits. */
static void test_order_and_reuse(void) {
  dsv4_shared *sh = NULL;
  const size_t bytes = sizeof(float) * T_TOK * cfg.dim;
  float *first[N_LAY] = {0}, *g1 = malloc(bytes);
  tu_ok(dsv4_shared_create(&sh), "dsv4_shared_create");
  int ok = 1;
  for (int pass = 0; pass < 2; pass++) {
    dsv4_shared_reset(sh);
    for (int L = 0; L < N_LAY; L++) ok &= fwd(L, sh, T_TOK, 1) == DSV4_OK;
    for (int L = N_LAY - 1; L >= 0; L--) {
      dsv4_weights_zero(G[L]);
      ok &= bwd(L) == DSV4_OK;
      if (L == 1 && pass == 0) memcpy(g1, dx, bytes);
      if (L == 1 && pass == 1) ok &= !memcmp(g1, dx, bytes);
    }
    for (int L = 0; L < N_LAY; L++) {
      if (pass == 0) first[L] = memcpy(malloc(bytes), out[L], bytes);
      else ok &= !memcmp(first[L], out[L], bytes);
    }
  }
  tu_check(ok, "shared: every layer in order, backward in reverse; a second pass on the reset state gives the same "
           "bits (%s)", ok ? "" : dsv4_last_error());
  tu_check(dsv4_shared_bytes(sh) > 0, "shared: the state keeps its buffers across passes (%zu bytes)",
           dsv4_shared_bytes(sh));
  int alone = 1;
  for (int L = 1; L <= 5; L += 4) { /* a kv source needs no other layer */
    alone &= fwd(L, NULL, T_TOK, 0) == DSV4_OK && !memcmp(out[L], first[L], bytes);
  }
  tu_check(alone, "shared: a kv source without a shared state gives its in-pass bits");
  for (int L = 0; L < N_LAY; L++) free(first[L]);
  free(g1);
  dsv4_shared_free(sh);
}

/* A reader whose backward will not run (its outputs do not reach the loss) is skipped: the kv
 * source's backward then runs and gives the bits of a pass where that reader's backward ran with a
 * zero output gradient and loss weight 0. */
static void test_skip(void) {
  dsv4_shared *sh = NULL;
  const size_t bytes = sizeof(float) * T_TOK * cfg.dim;
  float *dx_zero = malloc(bytes), *zero = calloc(T_TOK * cfg.dim, sizeof(float));
  tu_ok(dsv4_shared_create(&sh), "dsv4_shared_create");
  int ok = 1;
  for (int pass = 0; pass < 2; pass++) {
    dsv4_shared_reset(sh);
    for (int L = 1; L <= 3; L++) ok &= fwd(L, sh, T_TOK, 1) == DSV4_OK;
    ok &= bwd(3) == DSV4_OK;
    if (pass == 0) {
      const dsv4_layer_bwd_args a = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = dx, .grads = G[2], .dout = zero,
                                     .d_loss = 0};
      ok &= dsv4_layer_backward(Lay[2], &a) == DSV4_OK;
    } else {
      expect(dsv4_shared_skip_backward(sh, 1), "the kv source itself cannot be skipped", "layer 1", "kv source");
      expect(dsv4_shared_skip_backward(sh, 3), "a reader whose backward ran cannot be skipped", "layer 3",
             "already");
      tu_ok(dsv4_shared_skip_backward(sh, 2), "skip reuse layer 2's backward");
    }
    dsv4_weights_zero(G[1]);
    ok &= bwd(1) == DSV4_OK;
    if (pass == 0) memcpy(dx_zero, dx, bytes);
    else ok &= !memcmp(dx_zero, dx, bytes);
    if (pass == 1) expect(dsv4_shared_skip_backward(sh, 2), "a skip after the source's backward", "layer 2", NULL);
  }
  tu_check(ok, "shared: a skipped reader adds nothing: the kv source's dx equals the zero-gradient reader's (%s)",
           ok ? "" : dsv4_last_error());
  expect(dsv4_shared_skip_backward(sh, 0), "a window-only layer read no kv source", "layer 0", "read no kv source");
  free(dx_zero);
  free(zero);
  dsv4_shared_free(sh);
}

/* A V4 layer takes a shared state and ignores it. */
static void test_v4_ignores(void) {
  dsv4_config c4 = DSV4_CONFIG_INIT;
  dsv4_weights *w = NULL;
  dsv4_layer *l = NULL;
  dsv4_shared *sh = NULL;
  tu_ok(dsv4_config_preset(&c4, "tiny"), "tiny preset");
  tu_ok(dsv4_weights_create(&w, &c4, 1), "weights");
  tu_ok(dsv4_weights_init_random(w, 3), "init");
  tu_ok(dsv4_layer_create(&l, &c4, 1, w), "layer");
  tu_ok(dsv4_shared_create(&sh), "shared");
  const int64_t n = 64, d = c4.dim;
  float *xx = malloc(sizeof(float) * n * d), *o1 = malloc(sizeof(float) * n * d), *o2 = malloc(sizeof(float) * n * d);
  int32_t *tk = malloc(sizeof(int32_t) * n * c4.index_topk);
  tu_fill(xx, n * d, 4, 1.0f);
  const int32_t cu[2] = {0, (int32_t)n};
  const dsv4_packing pk = TU_PACKING(cu, NULL, 1, n, 0);
  float loss;
  dsv4_layer_fwd_args a = {DSV4_HEAD(dsv4_layer_fwd_args), .out = o1, .topk_ids = tk, .indexer_loss = &loss, .x = xx,
                           .n = n, .pk = &pk};
  int ok = dsv4_layer_forward(l, &a) == DSV4_OK;
  a.out = o2, a.shared = sh;
  ok &= dsv4_layer_forward(l, &a) == DSV4_OK && dsv4_layer_forward(l, &a) == DSV4_OK;
  tu_check(ok && !memcmp(o1, o2, sizeof(float) * n * d), "shared: a V4 layer ignores the shared state");
  free(xx), free(o1), free(o2), free(tk);
  dsv4_shared_free(sh);
  dsv4_layer_free(l);
  dsv4_weights_free(w);
}

static const tu_test TESTS[] = {
  {"shared", "misuse", test_misuse},
  {"shared", "order-and-reuse", test_order_and_reuse},
  {"shared", "skip", test_skip},
  {"shared", "v4-ignores", test_v4_ignores},
};

int main(int argc, char **argv) {
  cfg = (dsv4_config)DSV4_CONFIG_INIT;
  if (!tu_ok(dsv4_config_preset(&cfg, "tiny41"), "tiny41 preset")) return tu_finish();
  const int64_t d = cfg.dim;
  x = malloc(sizeof(float) * T_TOK * d), dout = malloc(sizeof(float) * T_TOK * d), dx = malloc(sizeof(float) * T_TOK * d);
  topk = malloc(sizeof(int32_t) * T_TOK * cfg.index_topk);
  tu_fill(x, T_TOK * d, 1, 1.0f);
  tu_fill(dout, T_TOK * d, 2, 1.0f);
  for (int L = 0; L < N_LAY; L++) {
    out[L] = malloc(sizeof(float) * T_TOK * d);
    tu_ok(dsv4_weights_create(&W[L], &cfg, L), "weights");
    tu_ok(dsv4_weights_init_random(W[L], 7), "init");
    tu_ok(dsv4_weights_create(&G[L], &cfg, L), "grads");
    tu_ok(dsv4_layer_create(&Lay[L], &cfg, L, W[L]), "layer");
  }
  int rc = tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0]));
  for (int L = 0; L < N_LAY; L++) {
    dsv4_layer_free(Lay[L]);
    dsv4_weights_free(W[L]);
    dsv4_weights_free(G[L]);
    free(out[L]);
  }
  free(x), free(dout), free(dx), free(topk);
  return rc;
}
