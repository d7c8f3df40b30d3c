/* fileio.h: small file helpers shared by the config reader, the safetensors reader, the checkpoint
 * index and the CLI. Every path is checked to be a regular file before it is read, so a directory,
 * FIFO or device gets a true message instead of a confusing size or a hang. */
#ifndef DSV4_FILEIO_H
#define DSV4_FILEIO_H

#include <stdint.h>
#include <sys/types.h>

#include "dsv4cp.h"

/* Opens path read-only (close-on-exec) and checks that it is a regular file ("is a directory",
 * "is not a regular file (FIFO)", ...). Never blocks on a FIFO. *size = file size in bytes. */
dsv4_status dsv4_open_regular(const char *path, int *fd, uint64_t *size);
/* 1 when path names a directory (following links), 0 otherwise (including when it does not exist). */
int dsv4_is_directory(const char *path);
/* Reads a whole text file (NUL-terminated, caller frees). Errors name the path. */
dsv4_status dsv4_read_text_file(const char *path, char **out);
/* The same from an open regular file (not closed here); path only names it in messages. */
dsv4_status dsv4_read_text_fd(int fd, const char *path, char **out);
/* "a directory", "a FIFO", "a character device", ... for messages about a non-regular file. */
const char *dsv4_file_kind(mode_t m);

#endif
