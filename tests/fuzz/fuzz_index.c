/* fuzz_index.c: model.safetensors.index.json on arbitrary bytes: the index parser (weight_map,
 * shard paths kept inside the directory, duplicates), the loader's name lookups on it, and the
 * confinement of shard files (src/io/ckpt_dir.c) against a planted tree of links.
 *
 * The same input is the index of a plain checkpoint directory and of a Hugging Face snapshot:
 *   D/outside.safetensors            holds 'outside_marker': must never be read
 *   D/ckpt/                          the plain checkpoint directory (index written here)
 *     inside.safetensors             holds 'inside_marker'
 *     sub/x.safetensors -> ../inside.safetensors, self -> ., up -> .., root -> /, abs -> D,
 *     out.safetensors -> ../outside.safetensors, loop -> loop
 *   D/hub/models--a--b/              a repository of the Hugging Face cache
 *     blobs/good (holds 'blob_marker'), blobs/evil -> ../../../outside.safetensors
 *     refs/main.safetensors          holds 'refs_marker': in the repository, not a blob: never read
 *     snapshots/r/                   the snapshot (index written here)
 *       s.safetensors -> ../../blobs/good, e.safetensors -> ../../blobs/evil,
 *       r.safetensors -> ../../refs/main.safetensors, up -> ..
 * Oracles: 'outside_marker' and 'refs_marker' are never found; an index sending 'inside_marker'
 * (or 'blob_marker' in the snapshot) to a path that stays inside always finds it. */
#include <cjson/cJSON.h>
#include <sys/stat.h>

#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "model/weights.h"

#define MAX_PLANTED 32

static char planted[MAX_PLANTED][600]; /* every path created, removed in reverse order at exit */
static int n_planted;
static char ckpt_index[600], snap_index[600];

static const char *under(const char *rel) {
  static char p[600];
  snprintf(p, sizeof p, "%s/%s", fuzz_dir(), rel);
  return p;
}

static void remember(const char *path) {
  if (n_planted == MAX_PLANTED) abort();
  snprintf(planted[n_planted++], sizeof planted[0], "%s", path);
}

static void plant_dir(const char *rel) {
  if (mkdir(under(rel), 0700) != 0) abort();
  remember(under(rel));
}

static void plant_link(const char *target, const char *rel) {
  if (symlink(target, under(rel)) != 0) abort();
  remember(under(rel));
}

/* A valid safetensors file holding one F32 tensor called marker. */
static void plant_file(const char *rel, const char *marker) {
  static const float one = 1.0f;
  const int64_t shape[1] = {1};
  dsv4_st_writer *w = NULL;
  if (dsv4_st_writer_create(&w) || dsv4_st_writer_add(w, marker, DSV4_DT_F32, 1, shape, &one) ||
      dsv4_st_writer_save(w, under(rel)))
    abort();
  dsv4_st_writer_free(w);
  remember(under(rel));
}

/* Removes what plant_* made (links themselves, never what they point to). */
static void unplant(void) {
  unlink(ckpt_index);
  unlink(snap_index);
  for (int i = n_planted - 1; i >= 0; i--) {
    struct stat st;
    if (lstat(planted[i], &st) == 0 && S_ISDIR(st.st_mode)) rmdir(planted[i]);
    else unlink(planted[i]);
  }
}

static void plant(void) {
  plant_file("outside.safetensors", "outside_marker");
  plant_dir("ckpt");
  plant_file("ckpt/inside.safetensors", "inside_marker");
  plant_dir("ckpt/sub");
  plant_link("../inside.safetensors", "ckpt/sub/x.safetensors");
  plant_link(".", "ckpt/self");
  plant_link("..", "ckpt/up");
  plant_link("/", "ckpt/root");
  plant_link(fuzz_dir(), "ckpt/abs");
  plant_link("../outside.safetensors", "ckpt/out.safetensors");
  plant_link("loop", "ckpt/loop");
  plant_dir("hub");
  plant_dir("hub/models--a--b");
  plant_dir("hub/models--a--b/blobs");
  plant_file("hub/models--a--b/blobs/good", "blob_marker");
  plant_link("../../../outside.safetensors", "hub/models--a--b/blobs/evil");
  plant_dir("hub/models--a--b/refs");
  plant_file("hub/models--a--b/refs/main.safetensors", "refs_marker");
  plant_dir("hub/models--a--b/snapshots");
  plant_dir("hub/models--a--b/snapshots/r");
  plant_link("../../blobs/good", "hub/models--a--b/snapshots/r/s.safetensors");
  plant_link("../../blobs/evil", "hub/models--a--b/snapshots/r/e.safetensors");
  plant_link("../../refs/main.safetensors", "hub/models--a--b/snapshots/r/r.safetensors");
  plant_link("..", "hub/models--a--b/snapshots/r/up");
  snprintf(ckpt_index, sizeof ckpt_index, "%s", under("ckpt/" DSV4_CKPT_INDEX_NAME));
  snprintf(snap_index, sizeof snap_index, "%s", under("hub/models--a--b/snapshots/r/" DSV4_CKPT_INDEX_NAME));
  atexit(unplant); /* registered after fuzz_dir()'s clean-up, so it runs first */
}

static void write_index(const char *path, const uint8_t *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) abort();
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, data + done, size - done);
    if (w <= 0) abort();
    done += (size_t)w;
  }
  close(fd);
}

/* 1 when the input's weight_map sends tensor to exactly shard. */
static int maps_to(const uint8_t *data, size_t size, const char *tensor, const char *shard) {
  cJSON *root = cJSON_ParseWithLength((const char *)data, size);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "weight_map"), tensor);
  const int yes = cJSON_IsString(v) && !strcmp(v->valuestring, shard);
  cJSON_Delete(root);
  return yes;
}

/* Looks tensor up; 1 when found. */
static int found(dsv4_ckpt *c, const char *tensor) {
  dsv4_st_file *f;
  const dsv4_st_info *t;
  return dsv4_ckpt_get(c, tensor, &f, &t, NULL) == DSV4_OK;
}

static void check_index(const char *path, const uint8_t *data, size_t size, int hf) {
  static dsv4_weights *w;
  if (!w) {
    dsv4_config cfg = DSV4_CONFIG_INIT;
    if (dsv4_config_preset(&cfg, "tiny") || dsv4_weights_create(&w, &cfg, 1)) abort();
  }
  dsv4_ckpt *c = NULL;
  if (dsv4_ckpt_open(&c, path) == DSV4_OK) {
    dsv4_ckpt_tensor src[W_COUNT];
    int opened = 0;
    dsv4_ckpt_shards(c, &opened);
    if (dsv4_weights_locate(w, c, src) == DSV4_OK) dsv4_weights_read(w, src);
    dsv4_st_file *f;
    const dsv4_st_info *t;
    dsv4_ckpt_get(c, "layers.1.attn.wq_a.weight", &f, &t, NULL);
    if (found(c, "outside_marker") || found(c, "refs_marker")) abort(); /* a file outside was read */
    static const char *inside[] = {"inside.safetensors", "sub/x.safetensors", "self/inside.safetensors",
                                   "self/sub/x.safetensors"};
    for (int i = 0; !hf && i < 4; i++)
      if (maps_to(data, size, "inside_marker", inside[i]) && !found(c, "inside_marker")) abort();
    if (hf && maps_to(data, size, "blob_marker", "s.safetensors") && !found(c, "blob_marker")) abort();
  }
  dsv4_ckpt_close(c);
  if (strchr(dsv4_last_error(), '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!n_planted) plant();
  write_index(ckpt_index, data, size);
  check_index(ckpt_index, data, size, 0);
  write_index(snap_index, data, size);
  check_index(snap_index, data, size, 1);
  return 0;
}
