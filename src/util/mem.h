/* mem.h: the library's large buffers on transparent huge pages.
 *
 * Why: a layer call allocates and frees hundreds of megabytes of transient buffers (weight-gradient
 * rows and blocks, panel scratch, exact sums); every 4 KiB page of them is faulted in again on first
 * touch. On a virtual machine a fault costs several microseconds: measured on a 2-core AMD EPYC
 * guest, a CP = 2 zigzag V4-Flash step at 1024 tokens took 72,000 faults per rank and lost a fifth
 * of its time to them (docs/perf.md). Where the kernel's transparent huge pages are on request only
 * (`madvise` mode, the default of Debian and Ubuntu) a buffer asks for them, so one fault maps
 * 2 MiB; in `always` mode the request changes nothing, in `never` mode it is ignored. Addresses,
 * contents and results do not change: this is only how pages are backed.
 *
 * DSV4_NO_HUGEPAGES=1 in the environment turns the request off (for timing against it). */
#ifndef DSV4_MEM_H
#define DSV4_MEM_H

#include <stddef.h>

/* Buffers smaller than this are left alone (no whole 2 MiB page would lie inside most of them). */
#define DSV4_HUGE_MIN ((size_t)4 << 20)

/* Asks for huge pages on the whole 2 MiB pages inside [p, p + bytes) when bytes >= DSV4_HUGE_MIN. */
void dsv4_mem_advise(void *p, size_t bytes);

/* calloc and aligned_alloc (free() releases them), with the request above. */
void *dsv4_calloc(size_t n, size_t size);
void *dsv4_aligned_alloc(size_t align, size_t bytes);

#endif
