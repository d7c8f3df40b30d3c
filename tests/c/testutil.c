/* testutil.c: see testutil.h. */
#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "util/rng.h"

static int n_pass, n_fail;

int tu_check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok) n_pass++; else n_fail++;
  fflush(stdout);
  return ok;
}

void tu_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  n_fail++;
  fflush(stdout);
}

int tu_finish(void) {
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}

int tu_run(int argc, char **argv, const tu_test *tests, int n) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  if (filter && !strcmp(filter, "--list")) {
    for (int i = 0; i < n; i++) printf("%s/%s\n", tests[i].op, tests[i].property);
    return 0;
  }
  int ran = 0;
  for (int i = 0; i < n; i++) {
    char name[128];
    snprintf(name, sizeof name, "%s/%s", tests[i].op, tests[i].property);
    if (filter && !strstr(name, filter)) continue;
    tests[i].run();
    ran++;
  }
  if (filter && !ran) tu_fail("no test matches '%s' (--list shows them)", filter);
  return tu_finish();
}

void tu_fill(float *x, int64_t n, uint64_t seed, float scale) {
  dsv4_random_fill(x, n, seed, 0x7e57, 0, scale);
}

double tu_max_abs_diff(const float *a, const float *b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > m || isnan(d)) m = d; /* a NaN sticks: nothing compares greater than it */
  }
  return m;
}

double tu_max_abs(const float *a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fabs(a[i]) > m ? fabs(a[i]) : m;
  return m;
}

int tu_close(const char *name, const float *a, const float *b, int64_t n, double tol, double floor) {
  double err = tu_max_abs_diff(a, b, n), ref = tu_max_abs(b, n);
  double lim = tol * (ref > floor ? ref : floor);
  return tu_check(err <= lim, "%s: max_err %.3g (limit %.3g, max|ref| %.3g)", name, err, lim, ref);
}

int tu_ok(dsv4_status st, const char *what) {
  if (st == DSV4_OK) return tu_check(1, "%s", what);
  tu_fail("%s: %s (%s)", what, dsv4_status_string(st), dsv4_last_error());
  return 0;
}

dsv4_status tu_forward(dsv4_layer *l, float *out, int32_t *topk, float *loss, const float *x, int64_t n,
                       const dsv4_packing *pk, int train) {
  const dsv4_layer_fwd_args a = {DSV4_HEAD(dsv4_layer_fwd_args), .out = out, .topk_ids = topk, .indexer_loss = loss,
                                 .x = x, .n = n, .pk = pk, .train = train};
  return dsv4_layer_forward(l, &a);
}

dsv4_status tu_backward(dsv4_layer *l, float *dx, dsv4_weights *g, const float *dout, float d_loss) {
  const dsv4_layer_bwd_args a = {DSV4_HEAD(dsv4_layer_bwd_args), .dx = dx, .grads = g, .dout = dout, .d_loss = d_loss};
  return dsv4_layer_backward(l, &a);
}

dsv4_tensor tu_tensor(const dsv4_weights *w, int i) {
  dsv4_tensor t = DSV4_TENSOR_INIT;
  if (dsv4_weights_get(w, i, &t) != DSV4_OK) {
    tu_fail("dsv4_weights_get(%d): %s", i, dsv4_last_error());
    t = (dsv4_tensor)DSV4_TENSOR_INIT;
  }
  return t;
}
