/* xrows.h: per-thread exact accumulators of gradient rows (util/xacc.h), for an operator whose
 * threads add terms into shared rows (key gradients summed over queries, norm-weight gradients
 * summed over tokens). Each thread adds into its own copy; the copies are merged with integer
 * adds, so the result does not depend on how many threads there were or which took which query.
 *
 *     dsv4_xrows x;
 *     DSV4_TRY(dsv4_xrows_alloc(&x, r0, rows, w, nt, "my kernel"));
 *     #pragma omp parallel num_threads(nt)
 *     { ... bad |= dsv4_xrows_add(&x, row, terms, n_rows); ... }   (then x.bad |= bad, atomically)
 *     DSV4_TRY(dsv4_xrows_finish(&x, out, "my kernel"));   (out[row - r0] += exact sum; frees)
 */
#ifndef DSV4_XROWS_H
#define DSV4_XROWS_H

#include <stdint.h>

#include "dsv4cp.h"
#include "util/par.h"
#include "util/workspace.h"
#include "util/xacc.h"

typedef struct {
  int64_t *base;     /* nt copies of rows x 2 w int64 (one copy when locked) */
  int64_t r0, rows;  /* the rows [r0, r0 + rows) this accumulator covers */
  int64_t w;         /* row width (floats) */
  int nt;            /* threads that may add (each into its own copy unless locked) */
  int bad;           /* some term was non-finite or too large (set by the threads) */
  int view;          /* the copies belong to the caller (dsv4_xrows_view): finish and free leave them */
  uint8_t *lock;     /* [rows] or NULL: one copy that the nt threads share, a row's adds made under its
                        lock (the sums are integers: the same bits in any order) */
} dsv4_xrows;

/* Caller-owned copies (nt copies of rows x 2 w int64, zeroed by the caller), e.g. sums that outlive
 * one operator call (the layer backward's key gradients over all its chunks). */
static inline dsv4_xrows dsv4_xrows_view(int64_t *base, int64_t rows, int64_t w, int nt) {
  return (dsv4_xrows){.base = base, .r0 = 0, .rows = rows, .w = w, .nt = nt, .view = 1};
}

/* One caller-owned copy (rows x 2 w int64) that nt threads add into under per-row locks (lock:
 * [rows] bytes, zeroed by the caller; no add holds one between calls). Sums of every compressed row
 * of the sequence are O(S): a copy per thread would multiply them by the threads. */
static inline dsv4_xrows dsv4_xrows_view_locked(int64_t *base, uint8_t *lock, int64_t rows, int64_t w,
                                                int nt) {
  return (dsv4_xrows){.base = base, .r0 = 0, .rows = rows, .w = w, .nt = nt, .view = 1, .lock = lock};
}

/* A row's lock (spin: a row's adds take microseconds). */
static inline int dsv4_xrows_trylock(uint8_t *l) { return !__atomic_test_and_set(l, __ATOMIC_ACQUIRE); }
static inline void dsv4_xrows_unlock(uint8_t *l) { __atomic_clear(l, __ATOMIC_RELEASE); }
static inline void dsv4_xrows_lock(uint8_t *l) {
  while (!dsv4_xrows_trylock(l))
    while (__atomic_load_n(l, __ATOMIC_RELAXED)) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
}

/* Merges every copy into copy 0 (exact; parallel over rows). Copy 0 then holds the sums. */
void dsv4_xrows_merge(dsv4_xrows *x);

/* Zeroed copies (calloc: pages are touched first by the thread that adds into them). */
dsv4_status dsv4_xrows_alloc(dsv4_xrows *x, int64_t r0, int64_t rows, int64_t w, int nt, const char *what);
/* One zeroed copy with row locks for nt threads (dsv4_xrows_view_locked's, owned). */
dsv4_status dsv4_xrows_alloc_locked(dsv4_xrows *x, int64_t r0, int64_t rows, int64_t w, int nt,
                                    const char *what);

/* Rows [row, row + n) += t [n, w] (contiguous) on the calling thread's copy; nonzero: a bad term. */
static inline int dsv4_xrows_add(dsv4_xrows *x, int64_t row, const float *t, int64_t n) {
  const int64_t w = x->w;
  const size_t copy = x->lock ? 0 : (size_t)dsv4_thread_id();
  int64_t *acc = x->base + (copy * (size_t)x->rows + (size_t)(row - x->r0)) * 2 * (size_t)w;
  const int locking = x->lock && x->nt > 1;
  int bad = 0;
  for (int64_t i = 0; i < n; i++, acc += 2 * w, t += w) {
    if (locking) dsv4_xrows_lock(x->lock + row - x->r0 + i);
    bad |= dsv4_xacc_add(acc, acc + w, t, w);
    if (locking) dsv4_xrows_unlock(x->lock + row - x->r0 + i);
  }
  return bad;
}

/* Lists of rows and their terms added as one group (dsv4_xrows_add_group), with the scratch that
 * finds the rows they share: at most DSV4_XROWS_LISTS lists, cap terms in all, over an accumulator
 * of `rows` rows. */
#define DSV4_XROWS_LISTS 8
typedef struct {
  int32_t *slot;       /* [rows]: a row's place among the group's distinct rows, or -1 between groups */
  int32_t *uniq, *cnt; /* [cap]: the distinct rows in the order first seen, their term counts */
  int32_t *defer;      /* [cap]: distinct rows another thread held at the first try (locked sums) */
  int64_t *start;      /* [cap]: where a distinct row's terms begin in terms */
  const float **terms; /* [cap]: the group's terms, ordered by distinct row */
  const int32_t *list_rows[DSV4_XROWS_LISTS];
  const float *list_t[DSV4_XROWS_LISTS];
  int list_n[DSV4_XROWS_LISTS];
  int nl; /* lists pushed since the last add */
} dsv4_xrows_group;

/* Carves a group's scratch (on a NULL base: counts its bytes); dsv4_xrows_group_clear before use. */
void dsv4_xrows_group_carve(dsv4_carver *c, int64_t rows, int64_t cap, dsv4_xrows_group *g);
void dsv4_xrows_group_clear(dsv4_xrows_group *g, int64_t rows);

/* One more list: rows[j] += t + j w for j < n (the arrays must live until the add). */
static inline void dsv4_xrows_group_push(dsv4_xrows_group *g, const int32_t *rows, int n, const float *t) {
  g->list_rows[g->nl] = rows, g->list_t[g->nl] = t, g->list_n[g->nl++] = n;
}

/* Adds the pushed lists on the calling thread's copy and empties the group. A row that several lists
 * name takes all its terms in one pass over its sums (dsv4_xacc_addk), so each distinct row's sums
 * are read and written once per group, not once per list (key gradients of neighbouring queries,
 * which select mostly the same rows). Exact integer adds: the same sums as dsv4_xrows_add list by
 * list. Locked sums: a row another thread holds is left for a second pass, so that threads adding
 * neighbouring groups (mostly the same rows) seldom wait. Nonzero: a bad term. */
int dsv4_xrows_add_group(dsv4_xrows *x, dsv4_xrows_group *g);

/* While a backward's gradient sinks are active (model/wgrad.h), rows bound for a registered
 * gradient tensor are merged into its exact sums instead (returns 1; 0: not registered). */
int dsv4_xrows_redirect(const float *out, const int64_t *x, int64_t rows, int64_t w);

/* Merges the copies, adds each row's exact sum into out (row r of the accumulator to
 * out + (r - r0) * w), frees; an error naming `what` if a term was bad. */
dsv4_status dsv4_xrows_finish(dsv4_xrows *x, float *out, const char *what);

void dsv4_xrows_free(dsv4_xrows *x);

#endif
