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

static char fuzz_dir_path[256], fuzz_file_path[512];

/* Removes the scratch file and directory at exit. */
static void fuzz_cleanup(void) {
  if (fuzz_file_path[0]) unlink(fuzz_file_path);
  if (fuzz_dir_path[0]) rmdir(fuzz_dir_path);
}

/* A private scratch directory for this process (created once, under $TMPDIR or /tmp). */
static inline const char *fuzz_dir(void) {
  if (!fuzz_dir_path[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/dsv4fuzz.XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(fuzz_dir_path)) abort();
    atexit(fuzz_cleanup);
  }
  return fuzz_dir_path;
}

/* Writes data to fuzz_dir()/name (replacing it; one name per harness) and returns the path. */
static inline const char *fuzz_file(const char *name, const uint8_t *data, size_t size) {
  char *path = fuzz_file_path;
  snprintf(path, sizeof fuzz_file_path, "%s/%s", fuzz_dir(), name);
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
