/* ckpt_dir.h: opening the files of a checkpoint directory without ever leaving it (internal to
 * libdsv4cp; used by src/io/checkpoint.c).
 *
 * A checkpoint is untrusted input: its index names the shard files, and any entry of its directory
 * may be a symbolic link. Checking shard names as strings is not enough (`link -> /` plus the
 * entry `link/etc/passwd` is a clean relative name), so every file of a checkpoint directory is
 * opened here, and the rule is enforced on what is actually opened:
 *   * each path component is looked up relative to the descriptor of its parent directory with
 *     O_NOFOLLOW; a symbolic link is read (readlinkat) and interpreted by this code, never by the
 *     kernel, so no lookup ever starts outside a directory descriptor we hold (no race between a
 *     check and the open: there is no second lookup by name);
 *   * a link is followed while it stays beneath the checkpoint directory (a relative target whose
 *     '..' never climbs above it); an absolute target or a climb above it is refused;
 *   * Hugging Face cache: when the directory is `<repo>/snapshots/<rev>` of a repository named
 *     `models--*`, its files are links `../../blobs/<sha>`; a file may then also be a blob of that
 *     same repository (`<repo>/blobs/<name>`, a regular file), and nothing else outside the
 *     snapshot;
 *   * only a regular file is opened: a FIFO or a device is refused by its directory entry before
 *     any open, so it can neither block nor have an open's side effects.
 * Why not openat2(RESOLVE_BENEATH): it cannot express the one allowed way out of a snapshot (to
 * its repository's blobs), needs Linux >= 5.6 (and a seccomp filter may refuse it), and would
 * still need this walk as the fallback; one walk that works on every kernel is one code path.
 */
#ifndef DSV4_CKPT_DIR_H
#define DSV4_CKPT_DIR_H

#include <stdint.h>
#include <sys/types.h>

#include "dsv4cp.h"

typedef struct {
  dev_t dev;
  ino_t ino;
} dsv4_file_id;

typedef struct {
  int fd;                 /* the checkpoint directory (opened following links: the caller named it) */
  int repo_fd, snaps_fd;  /* -1, or <repo> and <repo>/snapshots when fd is a Hugging Face snapshot */
  dsv4_file_id snaps, rev, blobs; /* identities of <repo>/snapshots, the snapshot, <repo>/blobs */
  char *name;             /* the directory as the caller named it, for messages */
} dsv4_ckpt_dir;

/* Opens the directory path (following links) and recognises a Hugging Face snapshot. */
dsv4_status dsv4_ckpt_dir_open(dsv4_ckpt_dir *d, const char *path);
/* Closes the descriptors (a zeroed or failed d is fine). */
void dsv4_ckpt_dir_close(dsv4_ckpt_dir *d);
/* 1 when the directory itself has an entry called name (a symbolic link counts, not followed). */
int dsv4_ckpt_dir_has(const dsv4_ckpt_dir *d, const char *name);
/* 1 when d was recognised as <repo>/snapshots/<rev> of a Hugging Face cache. */
int dsv4_ckpt_dir_is_hf_snapshot(const dsv4_ckpt_dir *d);
/* Opens rel (relative, inside d) read-only: *fd a regular file (close-on-exec, blocking), *size its
 * size. The message does not repeat rel (callers name it with its context); it names the directory
 * and the link that leads out: DSV4_ERR_FORMAT for a path that leaves the directory, DSV4_ERR_IO
 * for one that does not exist, is not a regular file, or cannot be opened. */
dsv4_status dsv4_ckpt_dir_open_file(const dsv4_ckpt_dir *d, const char *rel, int *fd, uint64_t *size);

#endif
