/* par.h: OpenMP helpers that also compile without OpenMP (then everything runs on one thread). */
#ifndef DSV4_PAR_H
#define DSV4_PAR_H

#ifdef _OPENMP
#include <omp.h>
static inline int dsv4_nthreads(void) { return omp_get_max_threads(); }
static inline int dsv4_thread_id(void) { return omp_get_thread_num(); }
#else
static inline int dsv4_nthreads(void) { return 1; }
static inline int dsv4_thread_id(void) { return 0; }
#endif

#endif
