/* testutil.c: see testutil.h. */
#include "testutil.h"

#include <math.h>
#include <stdarg.h>

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
