/* ckpt_dir.c: the checkpoint directory's files, opened without leaving it (see ckpt_dir.h for the
 * rule and why it is a walk of our own rather than openat2).
 *
 * The walk keeps a stack of directory descriptors: level 0 is the top (the checkpoint directory,
 * or for a Hugging Face snapshot its repository, with the snapshot at level 2), each component
 * pushes the descriptor of the directory it names, and '..' pops one level instead of looking up
 * "..", so a directory moved away during the walk cannot take it elsewhere. A symbolic link
 * replaces itself by its target in the path still to walk. Worked example, the Hugging Face
 * layout, rel = "model-00001.safetensors":
 *   stack [repo, snapshots, rev]; "model-00001.safetensors" is a link to "../../blobs/3f2a";
 *   todo = "../../blobs/3f2a": pop, pop -> [repo]; push "blobs" -> [repo, blobs]; "3f2a" is a
 *   regular file at [repo, blobs]: a blob of this repository, allowed.
 * With `link -> /` and rel = "link/etc/passwd" in a plain directory: stack [dir]; "link" is a
 * link whose target is absolute: refused, naming 'link'; nothing outside was looked up.
 */
#include "io/ckpt_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/fileio.h"

#define MAX_LINKS 40        /* links followed in one lookup: the kernel's own limit (MAXSYMLINKS) */
#define MAX_DEPTH 128       /* directory levels below the top that one lookup may descend */
#define HF_REPO_PREFIX "models--"
#define HF_SNAPSHOTS "snapshots"
#define HF_BLOBS "blobs"

static int same_id(dsv4_file_id a, const struct stat *st) { return a.dev == st->st_dev && a.ino == st->st_ino; }
static dsv4_file_id id_of(const struct stat *st) { return (dsv4_file_id){st->st_dev, st->st_ino}; }

/* Opens a directory entry that must be a real directory (not a link to one). */
static int open_subdir(int at, const char *name) {
  return openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* d->fd is <repo>/snapshots/<rev> with <repo> named models--*: fills repo_fd, snaps_fd and the
 * identities, else leaves d a plain directory. The names come from realpath, but every descriptor
 * comes from d->fd itself ("../.." of a descriptor is its real grandparent) and the snapshot found
 * again by name must be the very directory d->fd is: a rename racing with this can only make it
 * a plain directory (the stricter rule). */
static void detect_hf_snapshot(dsv4_ckpt_dir *d, const char *path) {
  char *real = realpath(path, NULL);
  struct stat me, st;
  int repo = -1, snaps = -1;
  char *rev = real ? strrchr(real, '/') : NULL;
  if (!rev || rev == real) goto done;
  *rev++ = 0;                                       /* real = <...>/<repo>/snapshots */
  char *sn = strrchr(real, '/');
  if (!sn || strcmp(sn + 1, HF_SNAPSHOTS)) goto done;
  *sn = 0;                                          /* real = <...>/<repo> */
  const char *rn = strrchr(real, '/');
  if (!rn || strncmp(rn + 1, HF_REPO_PREFIX, strlen(HF_REPO_PREFIX))) goto done;
  if (fstat(d->fd, &me) != 0) goto done;
  if ((repo = openat(d->fd, "../..", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) goto done;
  if ((snaps = open_subdir(repo, HF_SNAPSHOTS)) < 0) goto done;
  if (fstatat(snaps, rev, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) || !same_id(id_of(&me), &st))
    goto done;
  d->rev = id_of(&me);
  if (fstat(snaps, &st) != 0) goto done;
  d->snaps = id_of(&st);
  if (fstatat(repo, HF_BLOBS, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) goto done;
  d->blobs = id_of(&st);
  d->repo_fd = repo, d->snaps_fd = snaps;
  repo = snaps = -1;
done:
  if (repo >= 0) close(repo);
  if (snaps >= 0) close(snaps);
  free(real);
}

dsv4_status dsv4_ckpt_dir_open(dsv4_ckpt_dir *d, const char *path) {
  dsv4_status rc = DSV4_OK;
  memset(d, 0, sizeof *d);
  d->fd = d->repo_fd = d->snaps_fd = -1;
  DSV4_CHECK(path && *path, DSV4_ERR_ARG, "checkpoint directory: path must not be empty");
  d->name = strdup(path);
  DSV4_CHECK(d->name, DSV4_ERR_NOMEM, "%s: out of memory", path);
  d->fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DSV4_CHECK(d->fd >= 0, DSV4_ERR_IO, "%s: cannot open the checkpoint directory: %s", path, strerror(errno));
  detect_hf_snapshot(d, path);
fail:
  if (rc != DSV4_OK) dsv4_ckpt_dir_close(d);
  return rc;
}

void dsv4_ckpt_dir_close(dsv4_ckpt_dir *d) {
  if (!d) return;
  if (d->fd >= 0) close(d->fd);
  if (d->repo_fd >= 0) close(d->repo_fd);
  if (d->snaps_fd >= 0) close(d->snaps_fd);
  free(d->name);
  memset(d, 0, sizeof *d);
  d->fd = d->repo_fd = d->snaps_fd = -1;
}

int dsv4_ckpt_dir_has(const dsv4_ckpt_dir *d, const char *name) {
  struct stat st;
  return d && d->fd >= 0 && fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

int dsv4_ckpt_dir_is_hf_snapshot(const dsv4_ckpt_dir *d) { return d && d->repo_fd >= 0; }

/* ----------------------------------------------------------------------------------------- */
/* the walk                                                                                   */

typedef struct {
  int fd, owned;            /* owned: opened by this walk (closed when popped) */
  struct stat st;
} level;

typedef struct {
  const dsv4_ckpt_dir *d;
  level lv[MAX_DEPTH + 3];  /* + the Hugging Face levels above the snapshot */
  int depth, links;
  char *todo;               /* the path being walked (rel, then rewritten by each link) */
  size_t pos;               /* todo[pos..] is still to walk */
  char *first_link;         /* the first link of rel, as rel names it (for messages) */
} walk;

/* What the walk must stay inside, for messages. */
static const char *inside_what(const dsv4_ckpt_dir *d) {
  return d->repo_fd >= 0 ? "Hugging Face snapshot" : "checkpoint directory";
}

static void pop(walk *w) {
  if (w->lv[w->depth].owned) close(w->lv[w->depth].fd);
  w->depth--;
}

/* Replaces the component ending at end of w->todo, a link whose entry is name in the current level,
 * by the link's target. An absolute target is refused here, before anything is looked up. */
static dsv4_status follow(walk *w, const char *name, size_t end) {
  dsv4_status rc = DSV4_OK;
  char target[PATH_MAX + 1];
  if (!w->first_link) {
    w->first_link = strndup(w->todo, end); /* no link followed yet: todo is still rel */
    DSV4_CHECK(w->first_link, DSV4_ERR_NOMEM, "%s: out of memory", w->d->name);
  }
  DSV4_CHECK(++w->links <= MAX_LINKS, DSV4_ERR_IO, "more than %d symbolic links, starting at '%s' (a loop?)",
             MAX_LINKS, w->first_link);
  const ssize_t n = readlinkat(w->lv[w->depth].fd, name, target, sizeof target);
  DSV4_CHECK(n >= 0, DSV4_ERR_IO, "cannot read the symbolic link '%s': %s", w->first_link, strerror(errno));
  DSV4_CHECK((size_t)n < sizeof target, DSV4_ERR_IO, "the symbolic link '%s' has a target that is too long",
             w->first_link);
  target[n] = 0;
  DSV4_CHECK(target[0] != '/', DSV4_ERR_FORMAT, "it leaves the %s '%s' through the symbolic link '%s' (to an "
             "absolute path); a checkpoint's files must lie inside its directory", inside_what(w->d), w->d->name,
             w->first_link);
  const char *rest = w->todo + end;
  const size_t len = (size_t)n + 1 + strlen(rest) + 1;
  char *next = malloc(len);
  DSV4_CHECK(next, DSV4_ERR_NOMEM, "%s: out of memory", w->d->name);
  snprintf(next, len, "%s/%s", target, rest);
  free(w->todo);
  w->todo = next;
  w->pos = 0;
fail:
  return rc;
}

/* The Hugging Face rule for the file found at the current level: inside the snapshot, or a blob
 * of its repository. A plain directory allows anything the walk reached (it never left it). */
static int allowed_here(const walk *w) {
  const dsv4_ckpt_dir *d = w->d;
  if (d->repo_fd < 0) return 1;
  const int in_snapshot = w->depth >= 2 && same_id(d->snaps, &w->lv[1].st) && same_id(d->rev, &w->lv[2].st);
  const int is_blob = w->depth == 1 && same_id(d->blobs, &w->lv[1].st);
  return in_snapshot || is_blob;
}

/* Opens the regular file name of the current level (its entry st, already checked); the open must
 * find that same file (else it changed in between: refused, never retried by path). */
static dsv4_status open_leaf(walk *w, const char *name, const struct stat *st, int *fd, uint64_t *size) {
  dsv4_status rc = DSV4_OK;
  struct stat got;
  /* O_NONBLOCK: if the entry were swapped for a FIFO after the check, the open must not block */
  *fd = openat(w->lv[w->depth].fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  DSV4_CHECK(*fd >= 0, DSV4_ERR_IO, "cannot open: %s", errno == ELOOP ? "it changed while being opened" :
             strerror(errno));
  DSV4_CHECK(fstat(*fd, &got) == 0 && S_ISREG(got.st_mode) && got.st_dev == st->st_dev && got.st_ino == st->st_ino,
             DSV4_ERR_IO, "it changed while being opened");
  const int flags = fcntl(*fd, F_GETFL);
  DSV4_CHECK(flags >= 0 && fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) == 0, DSV4_ERR_IO, "fcntl: %s", strerror(errno));
  *size = (uint64_t)got.st_size;
fail:
  if (rc != DSV4_OK && *fd >= 0) {
    close(*fd);
    *fd = -1;
  }
  return rc;
}

/* One step: the component [at, end) of w->todo, the last one when last. Sets *done with the file. */
static dsv4_status step(walk *w, size_t at, size_t end, int last, int *fd, uint64_t *size, int *done) {
  dsv4_status rc = DSV4_OK;
  char name[NAME_MAX + 1];
  struct stat st;
  const size_t n = end - at;
  DSV4_CHECK(n <= NAME_MAX, DSV4_ERR_IO, "a path component is longer than %d bytes", NAME_MAX);
  memcpy(name, w->todo + at, n);
  name[n] = 0;
  if (!strcmp(name, ".") || !strcmp(name, "..")) {
    DSV4_CHECK(!last, DSV4_ERR_IO, "it names a directory, not a file");
    if (name[1] != '.') return DSV4_OK;
    /* '..' comes only from a link: rel itself has none (checked by the index parser) */
    DSV4_CHECK(w->depth > 0, DSV4_ERR_FORMAT, "it leaves the %s '%s' through the symbolic link '%s'; a "
               "checkpoint's files must lie inside its directory", inside_what(w->d), w->d->name,
               w->first_link ? w->first_link : name);
    pop(w);
    return DSV4_OK;
  }
  const int at_fd = w->lv[w->depth].fd;
  DSV4_CHECK(fstatat(at_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0, DSV4_ERR_IO, "cannot open: %s", strerror(errno));
  if (S_ISLNK(st.st_mode)) return follow(w, name, end);
  if (!last) {
    DSV4_CHECK(S_ISDIR(st.st_mode), DSV4_ERR_IO, "cannot open: %s", strerror(ENOTDIR));
    DSV4_CHECK(w->depth < MAX_DEPTH, DSV4_ERR_IO, "more than %d directory levels", MAX_DEPTH);
    level *l = &w->lv[w->depth + 1];
    l->fd = open_subdir(at_fd, name);
    DSV4_CHECK(l->fd >= 0, DSV4_ERR_IO, "cannot open: %s", errno == ELOOP ? "it changed while being opened" :
               strerror(errno));
    l->owned = 1;
    w->depth++;
    DSV4_CHECK(fstat(l->fd, &l->st) == 0 && S_ISDIR(l->st.st_mode), DSV4_ERR_IO, "cannot stat a directory: %s",
               strerror(errno));
    return DSV4_OK;
  }
  DSV4_CHECK(S_ISREG(st.st_mode), DSV4_ERR_IO, "it is %s, not a regular file", dsv4_file_kind(st.st_mode));
  DSV4_CHECK(allowed_here(w), DSV4_ERR_FORMAT, "it leaves the Hugging Face snapshot '%s' through the symbolic link "
             "'%s'; out of a snapshot only links to a blob of the same repository (../../blobs/<name>) are followed",
             w->d->name, w->first_link ? w->first_link : name);
  DSV4_TRY(open_leaf(w, name, &st, fd, size));
  *done = 1;
fail:
  return rc;
}

dsv4_status dsv4_ckpt_dir_open_file(const dsv4_ckpt_dir *d, const char *rel, int *fd, uint64_t *size) {
  dsv4_status rc = DSV4_OK;
  walk *w = NULL;
  *fd = -1;
  DSV4_CHECK(d && d->fd >= 0 && rel && *rel && rel[0] != '/', DSV4_ERR_ARG,
             "checkpoint directory: an open directory and a non-empty relative path are required");
  DSV4_ALLOC(w, 1);
  w->d = d;
  if (d->repo_fd >= 0) {
    w->lv[0].fd = d->repo_fd;
    w->lv[1].fd = d->snaps_fd;
    w->lv[2].fd = d->fd;
    w->depth = 2;
  } else {
    w->lv[0].fd = d->fd;
  }
  for (int i = 0; i <= w->depth; i++)
    DSV4_CHECK(fstat(w->lv[i].fd, &w->lv[i].st) == 0, DSV4_ERR_IO, "%s: cannot stat: %s", d->name, strerror(errno));
  w->todo = strdup(rel);
  DSV4_CHECK(w->todo, DSV4_ERR_NOMEM, "%s: out of memory", d->name);
  for (int done = 0; !done;) {
    const size_t at = w->pos + strspn(w->todo + w->pos, "/");
    DSV4_CHECK(w->todo[at], DSV4_ERR_IO, "it names a directory, not a file");
    const size_t end = at + strcspn(w->todo + at, "/");
    const int last = w->todo[end + strspn(w->todo + end, "/")] == 0;
    w->pos = end;           /* follow() rewinds it into the rewritten todo */
    DSV4_TRY(step(w, at, end, last, fd, size, &done));
  }
fail:
  while (w && w->depth > 0) pop(w);
  if (w) {
    free(w->todo);
    free(w->first_link);
  }
  free(w);
  return rc;
}
