/* par.h: OpenMP helpers that also compile without OpenMP (then everything runs on one thread).
 *
 * Threads are a per-object setting (dsv4_layer_set_threads): a public entry point sets the calling
 * thread's OpenMP thread count (its nthreads ICV, which belongs to that thread's task, not to the
 * process) for the duration of the call and restores it. Inside parallel regions every BLAS call
 * runs on its own thread (dsv4_blas_serial): a product's shape, not the thread count, decides its
 * blocking. */
#ifndef DSV4_PAR_H
#define DSV4_PAR_H

#ifdef _OPENMP
#include <omp.h>
static inline int dsv4_nthreads(void) { return omp_get_max_threads(); }
static inline int dsv4_thread_id(void) { return omp_get_thread_num(); }
/* The calling thread's count, set to `threads` (> 0) for a call; returns what to restore. */
static inline int dsv4_threads_enter(int threads) {
  const int old = omp_get_max_threads();
  if (threads > 0 && threads != old) omp_set_num_threads(threads);
  return old;
}
static inline void dsv4_threads_leave(int old) {
  if (omp_get_max_threads() != old) omp_set_num_threads(old);
}
/* At the top of a parallel region: OpenBLAS (OpenMP build) sizes its team from this thread's count,
 * so BLAS calls in the region stay on the calling thread even in a team of one. */
static inline void dsv4_blas_serial(void) { omp_set_num_threads(1); }
#else
static inline int dsv4_nthreads(void) { return 1; }
static inline int dsv4_thread_id(void) { return 0; }
static inline int dsv4_threads_enter(int threads) { (void)threads; return 1; }
static inline void dsv4_threads_leave(int old) { (void)old; }
static inline void dsv4_blas_serial(void) {}
#endif

/* Threads of an operator call: its `threads` argument, or the calling thread's count when 0. */
static inline int dsv4_team(int threads) { return threads > 0 ? threads : dsv4_nthreads(); }

#endif
