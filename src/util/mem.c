/* mem.c: huge-page requests for large buffers (mem.h). */
#include "mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((uintptr_t)2 << 20)

static int advise_on(void) {
  /* read once: a benign race at worst sets it twice to the same value */
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("DSV4_NO_HUGEPAGES");
    on = !(e && *e && *e != '0');
  }
  return on;
}

void dsv4_mem_advise(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (!p || bytes < DSV4_HUGE_MIN || !advise_on()) return;
  const uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  const uintptr_t b = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
  /* a refusal (a kernel without THP) only means small pages, as without the request */
  if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

void *dsv4_calloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (p && size && n <= SIZE_MAX / size) dsv4_mem_advise(p, n * size);
  return p;
}

void *dsv4_aligned_alloc(size_t align, size_t bytes) {
  void *p = aligned_alloc(align, bytes);
  dsv4_mem_advise(p, bytes);
  return p;
}
