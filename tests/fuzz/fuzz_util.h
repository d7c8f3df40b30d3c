/* fuzz_util.h: what the fuzz harnesses share: the libFuzzer entry point's declaration and writing
 * the fuzz input to a file the library can open by path (the readers under test take paths). */
#ifndef DSV4_FUZZ_UTIL_H
#define DSV4_FUZZ_UTIL_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A private scratch directory for this process (created once, under $TMPDIR or /tmp). */
static inline const char *fuzz_dir(void) {
  static char dir[256];
  if (!dir[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/dsv4fuzz.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(dir)) abort();
  }
  return dir;
}

/* Writes data to fuzz_dir()/name (replacing it) and returns the path (static buffer). */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) abort();
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, data + done, size - done);
    if (w <= 0) abort();
    done += (size_t)w;
  }
  close(fd);
  return path;
}

#endif
