/* bigmem.h: large zeroed buffers that a backward fills once, in huge pages where the kernel gives them.
 *
 * A buffer of hundreds of MB allocated per backward (a recomputed backward's double sums: 540 MB
 * for V4-Flash SWA) is faulted in 4 KiB page by page, each page cleared by the kernel on its first
 * write: measured at 6% of a recomputed SWA backward at 2048 tokens on this project's machines.
 * Anonymous mappings asked for transparent huge pages (MADV_HUGEPAGE; the kernels seen here are
 * set to "madvise") fault in 2 MiB at a time. The contents start zeroed, like calloc's. */
#ifndef DSV4_BIGMEM_H
#define DSV4_BIGMEM_H

#include <stddef.h>
#include <sys/mman.h>

/* NULL when out of memory. Free with dsv4_big_free(p, the same bytes). */
static inline void *dsv4_big_zalloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
  (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: without it the pages are ordinary ones */
#endif
  return p;
}

static inline void dsv4_big_free(void *p, size_t bytes) {
  if (p) munmap(p, bytes ? bytes : 1);
}

#endif
