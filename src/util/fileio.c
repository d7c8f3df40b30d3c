/* fileio.c: whole-file reading with errors that name the path. */
#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

/* Text files we read (config.json) are small; anything past this is not a config. */
#define MAX_TEXT_FILE_BYTES (64L << 20)

dsv4_status dsv4_read_text_file(const char *path, char **out) {
  dsv4_status rc = DSV4_OK;
  FILE *f = NULL;
  char *buf = NULL;
  *out = NULL;
  f = fopen(path, "rb");
  DSV4_CHECK(f, DSV4_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
  DSV4_CHECK(fseek(f, 0, SEEK_END) == 0, DSV4_ERR_IO, "%s: cannot seek (%s)", path, strerror(errno));
  long n = ftell(f);
  DSV4_CHECK(n >= 0, DSV4_ERR_IO, "%s: cannot read (is it a directory?)", path);
  DSV4_CHECK(n <= MAX_TEXT_FILE_BYTES, DSV4_ERR_FORMAT, "%s: too large for a text file (%ld bytes)",
             path, n);
  rewind(f);
  DSV4_ALLOC(buf, n + 1);
  DSV4_CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n, DSV4_ERR_IO, "%s: short read", path);
  buf[n] = 0;
  *out = buf;
  buf = NULL;
fail:
  if (f) fclose(f);
  free(buf);
  return rc;
}
