/* gemmprof.c: time every cblas_sgemm call of a dsv4cp run by call site (bench/gemm_profile.sh links
 * it into a copy of the CLI with -Wl,--wrap=cblas_sgemm; the library is built with frame pointers
 * so that the site two frames up, the caller of the util/gemm.c wrapper, can be found).
 *
 * Calls are grouped by (site, transposes, M, N, K rounded up to powers of two). A call of the
 * reference shape (M = N = K = $DSV4_GEMMPROF_REF, what `dsv4cp bench` times before each run and
 * once more after all of them) that follows other calls starts a new epoch, so the table written at
 * exit ($DSV4_GEMMPROF, one line per group: offset of the site in its object, transposes, shape
 * class, seconds, flops, calls, and 1 for the reference calls) covers the last timed run and the
 * reference calls just before it; under mpirun each rank writes its own file (the path with ".rank"
 * appended). Not a test: a tool for docs/perf.md. */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void __real_cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N,
                        blasint K, float alpha, const float *A, blasint lda, const float *B, blasint ldb, float beta,
                        float *C, blasint ldc);

#define GROUPS 4096

typedef struct {
  const void *site;
  int ta, tb, m, n, k, ref;
  double seconds, flops;
  long calls;
} group;

static group tab[GROUPS], done[GROUPS]; /* this epoch's groups; the last finished epoch's */
static int n_tab, n_done, ref_size = -1, in_run, run_calls;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int pow2(int x) {
  int c = 1;
  while (c < x) c *= 2;
  return x > 0 ? c : 0;
}

static void dump(void) {
  const char *path = getenv("DSV4_GEMMPROF"), *rank = getenv("OMPI_COMM_WORLD_RANK");
  char name[4096];
  snprintf(name, sizeof name, "%s%s%s", path ? path : "gemmprof.txt", rank ? "." : "", rank ? rank : "");
  FILE *f = fopen(name, "w");
  if (!f) return;
  /* a run's epoch: this one, unless it holds only reference calls (the sgemm timed after the runs) */
  const group *t = run_calls ? tab : done;
  const int n = run_calls ? n_tab : n_done;
  for (int i = 0; i < n; i++) {
    const group *g = &t[i];
    Dl_info di;
    const void *at = g->site;
    if (g->site && dladdr(g->site, &di) && di.dli_fbase) at = (const void *)((const char *)g->site - (const char *)di.dli_fbase);
    fprintf(f, "%p %s%s %d %d %d %.6f %.6e %ld %d\n", at, g->ta == CblasTrans ? "T" : "N", g->tb == CblasTrans ? "T" : "N",
            g->m, g->n, g->k, g->seconds, g->flops, g->calls, g->ref);
  }
  fclose(f);
}

void __wrap_cblas_sgemm(enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N,
                        blasint K, float alpha, const float *A, blasint lda, const float *B, blasint ldb, float beta,
                        float *C, blasint ldc) {
#pragma omp critical(gemmprof_init)
  if (ref_size < 0) {
    const char *r = getenv("DSV4_GEMMPROF_REF");
    ref_size = r ? atoi(r) : 2048;
    atexit(dump);
  }
  /* frame 0 is this function, its caller a util/gemm.c wrapper; the wrapper's caller is the site */
  void **fp = __builtin_frame_address(0);
  const void *site = fp && fp[0] ? ((void **)fp[0])[1] : NULL;
  const double t0 = now();
  __real_cblas_sgemm(o, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const double dt = now() - t0;
  const int ref = M == ref_size && N == ref_size && K == ref_size;
#pragma omp critical(gemmprof_table)
  {
    if (ref && in_run) { /* a run ended: keep it, start a new epoch */
      memcpy(done, tab, sizeof(group) * (size_t)n_tab);
      n_done = n_tab, n_tab = 0, run_calls = 0;
    }
    in_run = !ref;
    run_calls += !ref;
    int i = 0;
    const int m = pow2(M), n = pow2(N), k = pow2(K);
    while (i < n_tab && !(tab[i].site == site && tab[i].ta == (int)ta && tab[i].tb == (int)tb && tab[i].m == m &&
                          tab[i].n == n && tab[i].k == k && tab[i].ref == ref))
      i++;
    if (i == n_tab && n_tab < GROUPS) tab[n_tab++] = (group){site, (int)ta, (int)tb, m, n, k, ref, 0, 0, 0};
    if (i < n_tab) tab[i].seconds += dt, tab[i].flops += 2.0 * M * N * K, tab[i].calls++;
  }
}
