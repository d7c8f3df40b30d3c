/* fileio.c: opening files that must be regular files, and whole-file reading, with errors that
 * name the path (see fileio.h). */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"

/* Text files we read (config.json, model.safetensors.index.json: ~6 MB for V4-Flash's 69k tensors)
 * are small; anything past this is not one of them. */
#define MAX_TEXT_FILE_BYTES (64L << 20)

/* What a non-regular file is, for the message. */
const char *dsv4_file_kind(mode_t m) {
  if (S_ISLNK(m)) return "a symbolic link";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

dsv4_status dsv4_open_regular(const char *path, int *fd, uint64_t *size) {
  dsv4_status rc = DSV4_OK;
  struct stat st;
  *fd = -1;
  DSV4_CHECK(path && *path, DSV4_ERR_ARG, "file path must not be empty");
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer */
  *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DSV4_CHECK(*fd >= 0, DSV4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  DSV4_CHECK(fstat(*fd, &st) == 0, DSV4_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  DSV4_CHECK(S_ISREG(st.st_mode), DSV4_ERR_IO, "%s is %s, not a regular file", path, dsv4_file_kind(st.st_mode));
  int flags = fcntl(*fd, F_GETFL);
  DSV4_CHECK(flags >= 0 && fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) == 0, DSV4_ERR_IO, "%s: fcntl: %s", path,
             strerror(errno));
  *size = (uint64_t)st.st_size;
fail:
  if (rc != DSV4_OK && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

int dsv4_is_directory(const char *path) {
  struct stat st;
  return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

dsv4_status dsv4_read_text_file(const char *path, char **out) {
  dsv4_status rc = DSV4_OK;
  int fd = -1;
  uint64_t n = 0;
  *out = NULL;
  DSV4_TRY(dsv4_open_regular(path, &fd, &n));
  rc = dsv4_read_text_fd(fd, path, out);
fail:
  if (fd >= 0) close(fd);
  return rc;
}

dsv4_status dsv4_read_text_fd(int fd, const char *path, char **out) {
  dsv4_status rc = DSV4_OK;
  char *buf = NULL;
  uint64_t n = 0, got = 0;
  struct stat st;
  *out = NULL;
  DSV4_CHECK(fstat(fd, &st) == 0, DSV4_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  DSV4_CHECK(S_ISREG(st.st_mode), DSV4_ERR_IO, "%s is %s, not a regular file", path, dsv4_file_kind(st.st_mode));
  n = (uint64_t)st.st_size;
  DSV4_CHECK(n <= (uint64_t)MAX_TEXT_FILE_BYTES, DSV4_ERR_FORMAT,
             "%s: %llu bytes is too large for a JSON text file (at most %ld)", path, (unsigned long long)n,
             MAX_TEXT_FILE_BYTES);
  DSV4_ALLOC(buf, n + 1);
  while (got < n) {
    ssize_t r = pread(fd, buf + got, (size_t)(n - got), (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    DSV4_CHECK(r >= 0, DSV4_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    DSV4_CHECK(r > 0, DSV4_ERR_IO, "%s: short read (file changed while reading?)", path);
    got += (uint64_t)r;
  }
  buf[n] = 0;
  *out = buf;
  buf = NULL;
fail:
  free(buf);
  return rc;
}
