/* outfile.h: output files that replace what is at their path only when complete, and the check of
 * an output path before any work (the check is public, dsv4cp_io.h; the safetensors writer uses the rest).
 *
 * What may be at an output path: nothing (the file is created) or a regular file (replaced).
 * Anything else is refused, before any work and again just before the file is put in place:
 *   * a directory, FIFO, socket or device: replacing it by rename would destroy it (as root,
 *     `--output /dev/null` replaced /dev/null with a regular file);
 *   * a symbolic link: it is neither replaced (the user's link would silently become a file) nor
 *     written through (the output would land wherever the link points, a classic way to make a
 *     privileged job overwrite a file of the attacker's choosing in a shared directory). Give the
 *     target's own path instead.
 * The contents are written to an unnamed file in the target's directory (O_TMPFILE) that gets a
 * name only when complete: linked straight to the path when nothing is there, else linked to a
 * temporary name and renamed over the old file, so the old file stays intact until the new one is
 * complete, and a signal, `kill -9` or mpirun's SIGTERM-then-SIGKILL during the write leaves no
 * file (the kernel frees an unnamed file with its last descriptor). Only the two system calls
 * between that link and the rename hold a name; it is in the pending-file registry for the
 * SIGINT/SIGTERM handler (dsv4_st_remove_pending). Where the filesystem lacks O_TMPFILE (or /proc,
 * needed to link it), the file is written under the temporary name "<path>.tmp<pid>.<k>" from the
 * start, registered the same way: then a signal the CLI handles removes it, and `kill -9` can
 * leave it behind.
 */
#ifndef DSV4_OUTFILE_H
#define DSV4_OUTFILE_H

#include "dsv4cp_io.h"

/* dsv4_output_check (dsv4cp_io.h): its directory exists, is a directory and is writable, and the
 * path itself is absent or a regular file (a directory, device, FIFO, socket or symbolic link is
 * refused). One line naming the path (and the directory) otherwise. */

typedef struct {
  int fd;            /* write the contents here */
  int dir_fd;        /* the target's directory */
  int unnamed;       /* 1: an O_TMPFILE file (no name until commit); 0: a named temporary */
  int created;       /* a named temporary exists on disk (removed by discard) */
  int slot;          /* its pending-registry slot, or -1 */
  char *path;        /* the target as given */
  char *base;        /* its last component */
  char *tmp;         /* "<path>.tmp<pid>.<k>" and its last component */
  char *tmp_base;
} dsv4_outfile;

/* Checks path (as dsv4_output_check) and opens the file to write. */
dsv4_status dsv4_outfile_begin(dsv4_outfile *o, const char *path);
/* fsync, re-check the path, put the file in place (o is then discarded). */
dsv4_status dsv4_outfile_commit(dsv4_outfile *o);
/* Drops an unfinished file (nothing is left at or next to the path) and frees o; idempotent. */
void dsv4_outfile_discard(dsv4_outfile *o);

#endif
