/* test_mem.c: large buffers ask for transparent huge pages (src/util/mem.h) and stay ordinary
 * zeroed memory for the code that uses them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "testutil.h"
#include "util/mem.h"

#define MIB ((size_t)1 << 20)

/* The VmFlags line of the mapping of /proc/self/smaps that holds address a ("" if none). */
static void vm_flags(uintptr_t a, char *out, int cap) {
  out[0] = 0;
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return;
  char line[256];
  int inside = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3) { /* a mapping's header line */
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && !strncmp(line, "VmFlags:", 8)) {
      line[strcspn(line, "\n")] = 0;
      snprintf(out, (size_t)cap, "%.200s", line + 8);
      break;
    }
  }
  fclose(f);
}

/* calloc's contract holds: zeroed, writable, freed with free(); both entry points. */
static void zeroed_and_usable(void) {
  const size_t n = 12 * MIB / sizeof(float);
  float *a = dsv4_calloc(n, sizeof(float));
  float *b = dsv4_aligned_alloc(64, 12 * MIB);
  tu_check(a && b, "mem: 12 MiB buffers allocated");
  if (a && b) {
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += a[i] != 0.0f;
    tu_check(nonzero == 0, "mem: dsv4_calloc's buffer is zeroed (%zu non-zero)", nonzero);
    tu_check((uintptr_t)b % 64 == 0, "mem: dsv4_aligned_alloc honours the alignment");
    for (size_t i = 0; i < n; i++) a[i] = (float)i, b[i % (12 * MIB / sizeof(float))] = 1.0f;
    tu_check(a[n - 1] == (float)(n - 1), "mem: the whole buffer is writable");
  }
  free(a), free(b);
  void *z = dsv4_calloc(0, 8);
  free(z); /* calloc(0) may give NULL or a pointer: either is freed without harm */
}

/* A large buffer's whole 2 MiB pages carry the huge-page advice (VmFlags "hg") on a kernel that has
 * transparent huge pages, and none with DSV4_NO_HUGEPAGES=1 (tests/run_all.sh runs both). */
static void advised(void) {
#ifdef MADV_HUGEPAGE
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) {
    printf("note: this kernel has no transparent huge pages; advice not checked\n");
    return;
  }
  fclose(f);
  const char *e = getenv("DSV4_NO_HUGEPAGES");
  const int off = e && *e && *e != '0';
  char *p = dsv4_calloc(16 * MIB, 1);
  tu_check(p != NULL, "mem: 16 MiB allocated");
  if (!p) return;
  const uintptr_t mid = ((uintptr_t)p + 4 * MIB) & ~(uintptr_t)(2 * MIB - 1);
  char flags[512];
  vm_flags(mid, flags, sizeof flags);
  if (off)
    tu_check(strstr(flags, " hg") == NULL, "mem: DSV4_NO_HUGEPAGES=1: no advice (VmFlags:%s)", flags);
  else
    tu_check(strstr(flags, " hg") != NULL, "mem: a 16 MiB buffer's interior is advised for huge pages (VmFlags:%s)",
             flags);
  free(p);
#else
  printf("note: no MADV_HUGEPAGE on this system; advice not checked\n");
#endif
}

static const tu_test TESTS[] = {
    {"mem", "contract", zeroed_and_usable},
    {"mem", "huge-page advice", advised},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
