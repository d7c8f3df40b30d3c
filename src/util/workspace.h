/* workspace.h: scratch memory of the parallel kernels.
 *
 * A kernel describes what ONE thread needs with a carve function: called on a NULL base it only
 * counts bytes (the size query); called on a real base it hands out named, 64-byte aligned
 * pointers. The kernel allocates one block of nthreads copies BEFORE its parallel region and each
 * thread carves its own copy. Nothing is allocated inside a parallel region: an out-of-memory is
 * one clean error before any work starts, and threads never contend on the allocator.
 *
 *     static size_t carve(char *base, int n, my_scratch *s) {
 *       dsv4_carver c = {base, 0};
 *       s->S = dsv4_carve(&c, sizeof(float) * n);
 *       s->rows = dsv4_carve(&c, sizeof(int32_t) * n);
 *       return c.used;
 *     }
 *     DSV4_TRY(dsv4_ws_alloc(&ws, carve(NULL, n, &s), nt, "my kernel"));
 *     #pragma omp parallel num_threads(nt)
 *     { my_scratch s; carve(dsv4_ws_thread(&ws), n, &s); ... }
 *     dsv4_ws_free(&ws);
 */
#ifndef DSV4_WORKSPACE_H
#define DSV4_WORKSPACE_H

#include <stddef.h>
#include <stdlib.h>

#include "par.h"
#include "util/err.h"

#define DSV4_WS_ALIGN 64

typedef struct {
  char *base;     /* NULL: counting only */
  size_t used;    /* bytes handed out so far */
} dsv4_carver;

/* The next `bytes` of the carver (NULL while counting). */
static inline void *dsv4_carve(dsv4_carver *c, size_t bytes) {
  void *p = c->base ? c->base + c->used : NULL;
  c->used += (bytes + DSV4_WS_ALIGN - 1) / DSV4_WS_ALIGN * DSV4_WS_ALIGN;
  return p;
}

typedef struct {
  char *base;
  size_t per_thread;  /* bytes of one thread's copy (a multiple of DSV4_WS_ALIGN) */
  int nthreads;
} dsv4_workspace;

/* One block of nthreads copies of per_thread bytes; `what` names the kernel in the error. */
static inline dsv4_status dsv4_ws_alloc(dsv4_workspace *w, size_t per_thread, int nthreads, const char *what) {
  dsv4_status rc = DSV4_OK;
  w->per_thread = (per_thread + DSV4_WS_ALIGN - 1) / DSV4_WS_ALIGN * DSV4_WS_ALIGN;
  w->nthreads = nthreads;
  w->base = dsv4_aligned_alloc(DSV4_WS_ALIGN, w->per_thread * (size_t)nthreads + DSV4_WS_ALIGN);
  DSV4_CHECK(w->base, DSV4_ERR_NOMEM, "%s: out of memory for %zu bytes of scratch", what,
             w->per_thread * (size_t)nthreads);
fail:
  return rc;
}

/* The calling thread's copy (inside the parallel region). */
static inline char *dsv4_ws_thread(const dsv4_workspace *w) {
  return w->base + w->per_thread * (size_t)dsv4_thread_id();
}

static inline void dsv4_ws_free(dsv4_workspace *w) {
  free(w->base);
  w->base = NULL;
}

#endif
