/* outfile.c: output files put in place only when complete, the output-path check, and the
 * pending-file registry for signal handlers (see outfile.h for the rules and why).
 *
 * Every operation on the target goes through a descriptor of its directory (openat, linkat,
 * renameat), so the directory checked is the directory written, even if its path is renamed.
 */
#define _GNU_SOURCE /* O_TMPFILE */
#include "io/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "util/err.h"
#include "util/fileio.h"

/* Temporary files of saves in progress, for dsv4_st_remove_pending (a signal handler). A slot is
 * claimed with a compare-and-swap, filled, then published; the handler touches only published
 * slots. Like the last-error buffer, this is process state the library cannot avoid: a handler
 * has no other way to find the file. */
#define PENDING_SLOTS 8
#define PENDING_PATH 4096
enum { SLOT_FREE = 0, SLOT_FILLING, SLOT_READY };
static struct {
  atomic_int state;
  char path[PENDING_PATH];
} pending[PENDING_SLOTS];
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the pending-file registry needs lock-free atomics (signal safety)");

#define PROC_FD_PATH 40 /* "/proc/self/fd/<int>" */

/* Publishes tmp in a free registry slot; -1 when none is free or the path is too long (the save
 * then works the same, only a signal cannot remove its temporary). */
static int pending_add(const char *tmp) {
  if (strlen(tmp) >= PENDING_PATH) return -1;
  for (int i = 0; i < PENDING_SLOTS; i++) {
    int expect = SLOT_FREE;
    if (atomic_compare_exchange_strong(&pending[i].state, &expect, SLOT_FILLING)) {
      strcpy(pending[i].path, tmp);
      atomic_store(&pending[i].state, SLOT_READY);
      return i;
    }
  }
  return -1;
}

static void pending_drop(int *slot) {
  if (*slot >= 0) atomic_store(&pending[*slot].state, SLOT_FREE);
  *slot = -1;
}

void dsv4_st_remove_pending(void) {
  for (int i = 0; i < PENDING_SLOTS; i++)
    if (atomic_load(&pending[i].state) == SLOT_READY) unlink(pending[i].path);
}

/* ----------------------------------------------------------------------------------------- */
/* the path                                                                                   */

/* Splits path into its directory ("." when none, "/" for "/x") and last component (fresh strings). */
static dsv4_status split(const char *path, char **dir, char **base) {
  dsv4_status rc = DSV4_OK;
  const char *slash = strrchr(path, '/');
  *base = strdup(slash ? slash + 1 : path);
  *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  DSV4_CHECK(*dir && *base, DSV4_ERR_NOMEM, "output '%s': out of memory", path);
  DSV4_CHECK(**base && strcmp(*base, ".") && strcmp(*base, ".."), DSV4_ERR_IO,
             "output '%s' names a directory, not a file", path);
fail:
  return rc;
}

/* What is at base in dir_fd must be nothing or a regular file (see outfile.h for why). */
static dsv4_status check_entry(int dir_fd, const char *base, const char *path) {
  dsv4_status rc = DSV4_OK;
  struct stat st;
  if (fstatat(dir_fd, base, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    DSV4_CHECK(errno == ENOENT, DSV4_ERR_IO, "output '%s': cannot stat: %s", path, strerror(errno));
    return DSV4_OK;
  }
  DSV4_CHECK(!S_ISLNK(st.st_mode), DSV4_ERR_IO, "output '%s' is a symbolic link: refused (an output is never written "
             "through a link nor replaces one; give the target's own path)", path);
  DSV4_CHECK(S_ISREG(st.st_mode), DSV4_ERR_IO, "output '%s' is %s, not a regular file: refused (writing the output "
             "would replace it)", path, dsv4_file_kind(st.st_mode));
fail:
  return rc;
}

/* Opens the directory of path (*dir_fd) and checks it and the entry; fills *base. */
static dsv4_status open_checked(const char *path, int *dir_fd, char **base) {
  dsv4_status rc = DSV4_OK;
  char *dir = NULL;
  *dir_fd = -1;
  *base = NULL;
  DSV4_CHECK(path && *path, DSV4_ERR_ARG, "output path must not be empty");
  DSV4_TRY(split(path, &dir, base));
  *dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DSV4_CHECK(*dir_fd >= 0, DSV4_ERR_IO, "output '%s': its directory '%s' %s", path, dir,
             errno == ENOENT ? "does not exist" : errno == ENOTDIR ? "is not a directory" : strerror(errno));
  DSV4_CHECK(faccessat(*dir_fd, ".", W_OK | X_OK, AT_EACCESS) == 0, DSV4_ERR_IO,
             "output '%s': its directory '%s' is not writable: %s", path, dir, strerror(errno));
  DSV4_TRY(check_entry(*dir_fd, *base, path));
fail:
  free(dir);
  return rc;
}

dsv4_status dsv4_output_check(const char *path) {
  int dir_fd;
  char *base;
  dsv4_status rc = open_checked(path, &dir_fd, &base);
  if (dir_fd >= 0) close(dir_fd);
  free(base);
  return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* writing                                                                                    */

/* "<path>.tmp<pid>.<k>" and its last component, k counting saves in this process. */
static dsv4_status name_temporary(dsv4_outfile *o) {
  static atomic_uint counter;
  dsv4_status rc = DSV4_OK;
  const unsigned k = atomic_fetch_add(&counter, 1);
  const size_t n = strlen(o->path) + 48;
  o->tmp = malloc(n);
  o->tmp_base = malloc(n);
  DSV4_CHECK(o->tmp && o->tmp_base, DSV4_ERR_NOMEM, "output '%s': out of memory", o->path);
  snprintf(o->tmp, n, "%s.tmp%ld.%u", o->path, (long)getpid(), k);
  snprintf(o->tmp_base, n, "%s.tmp%ld.%u", o->base, (long)getpid(), k);
fail:
  return rc;
}

/* An unnamed file in the directory that /proc can link later, or -1 (filesystem without O_TMPFILE,
 * old kernel, no /proc): the caller falls back to a named temporary. */
static int open_unnamed(int dir_fd) {
  const int fd = openat(dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  char proc[PROC_FD_PATH], target[16];
  if (fd < 0) return -1;
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  if (readlink(proc, target, sizeof target) > 0) return fd;
  close(fd);
  return -1;
}

dsv4_status dsv4_outfile_begin(dsv4_outfile *o, const char *path) {
  dsv4_status rc = DSV4_OK;
  memset(o, 0, sizeof *o);
  o->fd = -1;
  o->slot = -1;
  DSV4_TRY(open_checked(path, &o->dir_fd, &o->base));
  o->path = strdup(path);
  DSV4_CHECK(o->path, DSV4_ERR_NOMEM, "output '%s': out of memory", path);
  DSV4_TRY(name_temporary(o));
  o->fd = open_unnamed(o->dir_fd);
  o->unnamed = o->fd >= 0;
  if (o->unnamed) return DSV4_OK;
  o->slot = pending_add(o->tmp); /* before the file exists: a signal in between finds nothing to remove */
  o->fd = openat(o->dir_fd, o->tmp_base, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  DSV4_CHECK(o->fd >= 0, DSV4_ERR_IO, "%s: cannot create temporary file '%s': %s", path, o->tmp, strerror(errno));
  o->created = 1;
fail:
  if (rc != DSV4_OK) dsv4_outfile_discard(o);
  return rc;
}

/* Gives the unnamed file o->fd the name `name` in the directory (fails with EEXIST if taken). */
static int link_unnamed(const dsv4_outfile *o, const char *name) {
  char proc[PROC_FD_PATH];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", o->fd);
  return linkat(AT_FDCWD, proc, o->dir_fd, name, AT_SYMLINK_FOLLOW);
}

dsv4_status dsv4_outfile_commit(dsv4_outfile *o) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(o && o->fd >= 0, DSV4_ERR_ARG, "output: commit without an open file");
  DSV4_CHECK(fsync(o->fd) == 0, DSV4_ERR_IO, "%s: fsync failed: %s", o->path, strerror(errno));
  /* the same rule as at the start: the path may have changed during a long run */
  DSV4_TRY(check_entry(o->dir_fd, o->base, o->path));
  if (o->unnamed) {
    if (link_unnamed(o, o->base) == 0) goto placed; /* nothing was there: complete in one step */
    DSV4_CHECK(errno == EEXIST, DSV4_ERR_IO, "%s: cannot link the finished file: %s", o->path, strerror(errno));
    o->slot = pending_add(o->tmp);
    DSV4_CHECK(link_unnamed(o, o->tmp_base) == 0, DSV4_ERR_IO, "%s: cannot link the finished file as '%s': %s",
               o->path, o->tmp, strerror(errno));
    o->created = 1;
  } else {
    const int cr = close(o->fd);
    o->fd = -1;
    DSV4_CHECK(cr == 0, DSV4_ERR_IO, "%s: close failed: %s", o->path, strerror(errno));
  }
  DSV4_CHECK(renameat(o->dir_fd, o->tmp_base, o->dir_fd, o->base) == 0, DSV4_ERR_IO, "%s: cannot rename '%s' over "
             "it: %s", o->path, o->tmp, strerror(errno));
  o->created = 0;
placed:
  fsync(o->dir_fd); /* the new name durable too; some filesystems refuse a directory fsync: harmless */
  if (o->fd >= 0) {
    const int cr = close(o->fd);
    o->fd = -1;
    DSV4_CHECK(cr == 0, DSV4_ERR_IO, "%s: close failed: %s", o->path, strerror(errno));
  }
fail:
  dsv4_outfile_discard(o);
  return rc;
}

void dsv4_outfile_discard(dsv4_outfile *o) {
  if (!o) return;
  if (o->fd >= 0) close(o->fd);
  if (o->created) unlinkat(o->dir_fd, o->tmp_base, 0);
  pending_drop(&o->slot);
  if (o->dir_fd >= 0) close(o->dir_fd);
  free(o->path);
  free(o->base);
  free(o->tmp);
  free(o->tmp_base);
  memset(o, 0, sizeof *o);
  o->fd = o->dir_fd = o->slot = -1;
}
