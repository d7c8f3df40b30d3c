/* checkpoint.c: single-file and sharded safetensors checkpoints, and exact FP8 dequantisation
 * (see checkpoint.h).
 *
 * Cost of loading one layer from a many-shard checkpoint: the index JSON is parsed once (V4-Flash:
 * 69,187 names, ~6 MB, tens of ms); only the shards holding the layer's tensors are opened (each
 * opening reads and validates one header, ~100 KB); then exactly the layer's bytes are read with
 * pread, in chunks of about 1 MB. So the time is proportional to the layer's bytes, whatever the
 * size of the shards.
 */
#define _FILE_OFFSET_BITS 64
#include "io/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/ckpt_dir.h"
#include "util/err.h"
#include "util/fileio.h"

#define READ_CHUNK_BYTES (4u << 20) /* raw FP8 bytes decoded per read */
#define SCALE_SUFFIX "scale"
#define SCALE_INV_SUFFIX "_scale_inv"
#define WEIGHT_SUFFIX "weight"

/* One weight_map entry: tensor name -> shard index. */
typedef struct {
  char *name;
  int shard;
} map_entry;

typedef struct {
  char *rel;          /* as the index names it */
  char *path;         /* directory of the index + rel */
  dsv4_st_file *f;    /* NULL until a tensor of it is needed */
} shard;

struct dsv4_ckpt {
  char *path;         /* the index file, or the single file */
  dsv4_ckpt_dir dir;  /* the directory every shard is opened beneath (fd -1 for a single file) */
  int sharded;
  int n_map, n_shards;
  map_entry *map;     /* [n_map] sorted by name */
  shard *shards;      /* [n_shards] sorted by rel */
};

/* ----------------------------------------------------------------------------------------- */
/* opening                                                                                    */

static int cmp_entry(const void *a, const void *b) {
  return strcmp(((const map_entry *)a)->name, ((const map_entry *)b)->name);
}
static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* "dir/name" (dir may be empty: then name). */
static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s%s%s", dir, *dir ? "/" : "", name);
  return p;
}

/* A shard path from the index must stay inside the index's directory: relative, no ".." part. */
static int safe_relative(const char *rel) {
  if (!*rel || rel[0] == '/') return 0;
  for (const char *p = rel; *p;) {
    size_t n = strcspn(p, "/");
    if (n == 2 && p[0] == '.' && p[1] == '.') return 0;
    p += n;
    while (*p == '/') p++;
  }
  return 1;
}

/* Parses the index: weight_map is required; every value a safe relative path; names unique. */
static dsv4_status parse_index(dsv4_ckpt *c, const char *text, const char *dir) {
  dsv4_status rc = DSV4_OK;
  cJSON *root = cJSON_Parse(text);
  const char **rels = NULL, **sorted = NULL; /* point into root */
  DSV4_CHECK(root, DSV4_ERR_FORMAT, "%s: not valid JSON", c->path);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  DSV4_CHECK(cJSON_IsObject(wm), DSV4_ERR_FORMAT, "%s: no \"weight_map\" object (not a safetensors index file?)",
             c->path);
  const int n = cJSON_GetArraySize(wm);
  DSV4_CHECK(n > 0, DSV4_ERR_FORMAT, "%s: \"weight_map\" is empty", c->path);
  DSV4_ALLOC(c->map, n);
  DSV4_ALLOC(rels, n);
  DSV4_ALLOC(sorted, n);
  const cJSON *e;
  cJSON_ArrayForEach(e, wm) {
    DSV4_CHECK(cJSON_IsString(e), DSV4_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name", c->path,
               e->string);
    DSV4_CHECK(safe_relative(e->valuestring), DSV4_ERR_FORMAT, "%s: weight_map entry '%s' names shard '%s' outside "
               "the index's directory (absolute, empty or with a '..' part)", c->path, e->string, e->valuestring);
    c->map[c->n_map].name = strdup(e->string);
    DSV4_CHECK(c->map[c->n_map].name, DSV4_ERR_NOMEM, "%s: out of memory", c->path);
    rels[c->n_map] = sorted[c->n_map] = e->valuestring;
    c->n_map++;
  }
  /* the distinct shard names, sorted; then each entry's shard by binary search */
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
  int distinct = 0;
  for (int i = 0; i < n; i++)
    if (i == 0 || strcmp(sorted[i], sorted[distinct - 1])) sorted[distinct++] = sorted[i];
  DSV4_ALLOC(c->shards, distinct);
  for (; c->n_shards < distinct; c->n_shards++) {
    shard *s = &c->shards[c->n_shards];
    s->rel = strdup(sorted[c->n_shards]);
    s->path = join(dir, sorted[c->n_shards]);
    DSV4_CHECK(s->rel && s->path, DSV4_ERR_NOMEM, "%s: out of memory", c->path);
  }
  for (int i = 0; i < n; i++) {
    const char **hit = bsearch(&rels[i], sorted, (size_t)distinct, sizeof *sorted, cmp_str);
    c->map[i].shard = (int)(hit - sorted);
  }
  qsort(c->map, (size_t)c->n_map, sizeof *c->map, cmp_entry);
  for (int i = 1; i < c->n_map; i++)
    DSV4_CHECK(strcmp(c->map[i - 1].name, c->map[i].name), DSV4_ERR_FORMAT,
               "%s: tensor '%s' appears twice in weight_map", c->path, c->map[i].name);
fail:
  free(rels);
  free(sorted);
  cJSON_Delete(root);
  return rc;
}

/* Picks the entry a directory stands for: the index, model.safetensors, or its only .safetensors
 * (*chosen: the entry's name). An entry counts even when it is a symbolic link: it is then opened
 * beneath the directory like any shard, and refused if it leads out, never skipped. */
static dsv4_status pick_in_directory(const dsv4_ckpt_dir *d, char **chosen) {
  dsv4_status rc = DSV4_OK;
  DIR *dl = NULL;
  int count = 0, lfd = -1;
  *chosen = NULL;
  const char *fixed = dsv4_ckpt_dir_has(d, DSV4_CKPT_INDEX_NAME)    ? DSV4_CKPT_INDEX_NAME
                      : dsv4_ckpt_dir_has(d, DSV4_CKPT_SINGLE_NAME) ? DSV4_CKPT_SINGLE_NAME
                                                                    : NULL;
  if (fixed) {
    *chosen = strdup(fixed);
    DSV4_CHECK(*chosen, DSV4_ERR_NOMEM, "%s: out of memory", d->name);
    return DSV4_OK;
  }
  lfd = openat(d->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  dl = lfd >= 0 ? fdopendir(lfd) : NULL;
  DSV4_CHECK(dl, DSV4_ERR_IO, "%s: cannot list the directory: %s", d->name, strerror(errno));
  lfd = -1; /* the DIR owns it */
  for (struct dirent *e; (e = readdir(dl));) {
    size_t n = strlen(e->d_name), k = strlen(".safetensors");
    if (n > k && !strcmp(e->d_name + n - k, ".safetensors") && count++ == 0) {
      *chosen = strdup(e->d_name);
      DSV4_CHECK(*chosen, DSV4_ERR_NOMEM, "%s: out of memory", d->name);
    }
  }
  DSV4_CHECK(count > 0, DSV4_ERR_IO, "%s: no %s, no %s and no other .safetensors file in this directory", d->name,
             DSV4_CKPT_INDEX_NAME, DSV4_CKPT_SINGLE_NAME);
  DSV4_CHECK(count == 1, DSV4_ERR_IO, "%s: %d .safetensors files but no %s saying which tensor is in which", d->name,
             count, DSV4_CKPT_INDEX_NAME);
fail:
  if (dl) closedir(dl);
  if (lfd >= 0) close(lfd);
  if (rc != DSV4_OK) {
    free(*chosen);
    *chosen = NULL;
  }
  return rc;
}

/* Opens the directory's entry name (the file it stands for) beneath it. */
static dsv4_status open_chosen(const dsv4_ckpt_dir *d, const char *name, int *fd) {
  dsv4_status rc = DSV4_OK;
  uint64_t size;
  rc = dsv4_ckpt_dir_open_file(d, name, fd, &size);
  if (rc != DSV4_OK) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", dsv4_last_error());
    DSV4_FAIL(rc, "%s: '%s' cannot be read: %s", d->name, name, msg);
  }
fail:
  return rc;
}

/* The directory part of an index path ("" when it has none; "/x.json" -> "/"). */
static char *dir_of(const char *path) {
  char *dir = strdup(path);
  char *slash = dir ? strrchr(dir, '/') : NULL;
  if (slash) *(slash == dir ? slash + 1 : slash) = 0;
  else if (dir) dir[0] = 0;
  return dir;
}

dsv4_status dsv4_ckpt_open(dsv4_ckpt **out, const char *path) {
  dsv4_status rc = DSV4_OK;
  dsv4_ckpt *c = NULL;
  char *text = NULL, *dir = NULL, *chosen = NULL;
  int fd = -1; /* the file a directory stands for, opened beneath it */
  DSV4_CHECK(out && path && *path, DSV4_ERR_ARG, "checkpoint: out and a non-empty path are required");
  *out = NULL;
  DSV4_ALLOC(c, 1);
  c->dir.fd = c->dir.repo_fd = c->dir.snaps_fd = -1;
  if (dsv4_is_directory(path)) {
    DSV4_TRY(dsv4_ckpt_dir_open(&c->dir, path));
    DSV4_TRY(pick_in_directory(&c->dir, &chosen));
    c->path = join(path, chosen);
    DSV4_CHECK(c->path, DSV4_ERR_NOMEM, "%s: out of memory", path);
    DSV4_TRY(open_chosen(&c->dir, chosen, &fd));
  } else {
    c->path = strdup(path); /* a file the caller named: opened as named */
  }
  DSV4_CHECK(c->path, DSV4_ERR_NOMEM, "%s: out of memory", path);
  const size_t n = strlen(c->path);
  c->sharded = n >= 5 && !strcmp(c->path + n - 5, ".json");
  if (c->sharded) {
    DSV4_TRY(fd >= 0 ? dsv4_read_text_fd(fd, c->path, &text) : dsv4_read_text_file(c->path, &text));
    dir = dir_of(c->path);
    DSV4_CHECK(dir, DSV4_ERR_NOMEM, "%s: out of memory", path);
    if (c->dir.fd < 0) DSV4_TRY(dsv4_ckpt_dir_open(&c->dir, *dir ? dir : "."));
    DSV4_TRY(parse_index(c, text, dir));
  } else {
    DSV4_ALLOC(c->shards, 1);
    c->n_shards = 1;
    c->shards[0].rel = strdup(c->path);
    c->shards[0].path = strdup(c->path);
    DSV4_CHECK(c->shards[0].rel && c->shards[0].path, DSV4_ERR_NOMEM, "%s: out of memory", path);
    if (fd >= 0) {
      rc = dsv4_st_open_fd(&c->shards[0].f, fd, c->path);
      fd = -1; /* taken, even on failure */
      DSV4_TRY(rc);
    } else {
      DSV4_TRY(dsv4_st_open(&c->shards[0].f, c->path));
    }
  }
  *out = c;
fail:
  if (fd >= 0) close(fd);
  free(text);
  free(dir);
  free(chosen);
  if (rc != DSV4_OK) dsv4_ckpt_close(c);
  return rc;
}

void dsv4_ckpt_close(dsv4_ckpt *c) {
  if (!c) return;
  for (int i = 0; i < c->n_map; i++) free(c->map[i].name);
  for (int i = 0; i < c->n_shards; i++) {
    dsv4_st_close(c->shards[i].f);
    free(c->shards[i].rel);
    free(c->shards[i].path);
  }
  free(c->map);
  free(c->shards);
  free(c->path);
  dsv4_ckpt_dir_close(&c->dir);
  free(c);
}

const char *dsv4_ckpt_path(const dsv4_ckpt *c) { return c ? c->path : NULL; }

int dsv4_ckpt_shards(const dsv4_ckpt *c, int *opened) {
  int k = 0;
  for (int i = 0; c && i < c->n_shards; i++) k += c->shards[i].f != NULL;
  if (opened) *opened = k;
  return c ? c->n_shards : 0;
}

/* The weight_map entry of name, or NULL. */
static const map_entry *lookup(const dsv4_ckpt *c, const char *name) {
  map_entry key = {.name = (char *)name};
  return c->n_map ? bsearch(&key, c->map, (size_t)c->n_map, sizeof key, cmp_entry) : NULL;
}

int dsv4_ckpt_has(const dsv4_ckpt *c, const char *name) {
  if (!c || !name) return 0;
  return c->sharded ? lookup(c, name) != NULL : dsv4_st_find(c->shards[0].f, name) != NULL;
}

dsv4_status dsv4_ckpt_get(dsv4_ckpt *c, const char *name, dsv4_st_file **f, const dsv4_st_info **t,
                          const char **shard_name) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(c && name && f && t, DSV4_ERR_ARG, "checkpoint: NULL argument");
  shard *s = &c->shards[0];
  if (c->sharded) {
    const map_entry *m = lookup(c, name);
    DSV4_CHECK(m, DSV4_ERR_TENSOR, "%s: missing tensor '%s' (not in weight_map)", c->path, name);
    s = &c->shards[m->shard];
    if (!s->f) { /* beneath the index's directory, whatever links the checkpoint holds */
      int fd = -1;
      uint64_t size;
      rc = dsv4_ckpt_dir_open_file(&c->dir, s->rel, &fd, &size);
      if (rc == DSV4_OK) rc = dsv4_st_open_fd(&s->f, fd, s->path);
      if (rc != DSV4_OK) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", dsv4_last_error());
        DSV4_FAIL(rc, "%s: shard '%s' of tensor '%s' cannot be read: %s", c->path, s->rel, name, msg);
      }
    }
  }
  *t = dsv4_st_find(s->f, name);
  if (c->sharded)
    DSV4_CHECK(*t, DSV4_ERR_TENSOR, "%s: tensor '%s' is listed in %s but is not in this shard", s->path, name,
               c->path);
  else
    DSV4_CHECK(*t, DSV4_ERR_TENSOR, "%s: missing tensor '%s'", c->path, name);
  *f = s->f;
  if (shard_name) *shard_name = s->rel;
fail:
  return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* FP8                                                                                        */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

dsv4_status dsv4_ckpt_locate(dsv4_ckpt *c, const char *name, const int block[2], dsv4_ckpt_tensor *out) {
  dsv4_status rc = DSV4_OK;
  char sname[2][512], got[64], want[64];
  memset(out, 0, sizeof *out);
  DSV4_TRY(dsv4_ckpt_get(c, name, &out->file, &out->t, &out->shard));
  if (out->t->dtype != DSV4_DT_F8_E4M3) return DSV4_OK;
  const dsv4_st_info *t = out->t;
  const size_t n = strlen(name), k = strlen(WEIGHT_SUFFIX);
  const int is_weight = n >= k && !strcmp(name + n - k, WEIGHT_SUFFIX);
  DSV4_CHECK(is_weight && t->ndim == 2, DSV4_ERR_TENSOR, "%s: tensor '%s' is F8_E4M3 but is not a 2-d '...weight' "
             "matrix with a block scale", dsv4_st_path(out->file), name);
  DSV4_CHECK(n + sizeof SCALE_INV_SUFFIX < sizeof sname[0], DSV4_ERR_TENSOR, "tensor name '%.80s...' is too long",
             name);
  snprintf(sname[0], sizeof sname[0], "%.*s%s", (int)(n - k), name, SCALE_SUFFIX);
  snprintf(sname[1], sizeof sname[1], "%s%s", name, SCALE_INV_SUFFIX);
  const int has0 = dsv4_ckpt_has(c, sname[0]), has1 = dsv4_ckpt_has(c, sname[1]);
  DSV4_CHECK(has0 || has1, DSV4_ERR_TENSOR, "%s: tensor '%s' is F8_E4M3 but has no scale ('%s' or '%s')",
             dsv4_ckpt_path(c), name, sname[0], sname[1]);
  DSV4_CHECK(!(has0 && has1), DSV4_ERR_TENSOR, "%s: tensor '%s' has two scales, '%s' and '%s'", dsv4_ckpt_path(c),
             name, sname[0], sname[1]);
  const char *sn = sname[has0 ? 0 : 1];
  DSV4_TRY(dsv4_ckpt_get(c, sn, &out->scale_file, &out->scale, &out->scale_shard));
  const dsv4_st_info *s = out->scale;
  DSV4_CHECK(s->dtype == DSV4_DT_F8_E8M0 || s->dtype == DSV4_DT_F32 || s->dtype == DSV4_DT_BF16 ||
             s->dtype == DSV4_DT_F16, DSV4_ERR_TENSOR,
             "%s: scale '%s' has dtype %s, expected F8_E8M0, F32, BF16 or F16", dsv4_st_path(out->scale_file), sn,
             s->dtype_name);
  DSV4_CHECK(block && block[0] > 0 && block[1] > 0, DSV4_ERR_ARG, "checkpoint: FP8 block size must be positive");
  out->block[0] = block[0];
  out->block[1] = block[1];
  const int64_t want_shape[2] = {ceil_div(t->shape[0], block[0]), ceil_div(t->shape[1], block[1])};
  if (s->ndim != 2 || s->shape[0] != want_shape[0] || s->shape[1] != want_shape[1]) {
    dsv4_st_shape_str(got, sizeof got, s->shape, s->ndim);
    dsv4_st_shape_str(want, sizeof want, want_shape, 2);
    DSV4_FAIL(DSV4_ERR_TENSOR, "%s: scale '%s' has shape %s, expected %s for weight [%" PRId64 ", %" PRId64 "] in "
              "%d x %d blocks (quantization_config.weight_block_size)", dsv4_st_path(out->scale_file), sn, got, want,
              t->shape[0], t->shape[1], block[0], block[1]);
  }
fail:
  return rc;
}

uint64_t dsv4_ckpt_bytes(const dsv4_ckpt_tensor *t) {
  return (t->t ? t->t->end - t->t->begin : 0) + (t->scale ? t->scale->end - t->scale->begin : 0);
}

/* 1 when f is a value E8M0 can hold: a power of two in [2^-127, 2^127], i.e. the exponent field
 * 1..254 with no mantissa bits, or 2^-127 itself (E8M0 byte 0: the subnormal 0x00400000). Then
 * every E4M3 value times f is exact in fp32; a smaller power of two could round it away. */
#define E8M0_MIN_BITS 0x00400000u
static int e8m0_value(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t e = u >> 23, m = u & 0x7fffffu; /* e includes the sign bit: a negative f fails */
  return (e >= 1 && e <= 254 && m == 0) || u == E8M0_MIN_BITS;
}

/* The scale tensor as floats (E8M0 decoded by bits). V4's block scales are powers of two (ue8m0),
 * which is what makes every dequantised weight exact: a NaN or infinite scale is an error, and so
 * is an F32 / BF16 / F16 scale that is not a power of two E8M0 could hold (a file quantised another
 * way, e.g. V3's amax / 448 scales, or a corrupted one), naming the scale and the element. */
static dsv4_status read_scales(const dsv4_ckpt_tensor *t, float *dst) {
  dsv4_status rc = DSV4_OK;
  const dsv4_st_info *s = t->scale;
  uint8_t *raw = NULL;
  if (s->dtype == DSV4_DT_F8_E8M0) {
    DSV4_ALLOC(raw, s->numel);
    DSV4_TRY(dsv4_st_read_bytes(t->scale_file, s, 0, raw, (size_t)s->numel));
    for (int64_t i = 0; i < s->numel; i++) dst[i] = dsv4_e8m0_to_f32(raw[i]);
  } else {
    DSV4_TRY(dsv4_st_read_f32(t->scale_file, s, dst));
  }
  for (int64_t i = 0; i < s->numel; i++) {
    DSV4_CHECK(isfinite(dst[i]), DSV4_ERR_TENSOR, "%s: scale '%s' [%" PRId64 ", %" PRId64 "] is %s%s",
               dsv4_st_path(t->scale_file), s->name, i / s->shape[1], i % s->shape[1],
               isnan(dst[i]) ? "NaN" : "infinite", raw ? " (E8M0 byte 0xff)" : "");
    DSV4_CHECK(e8m0_value(dst[i]), DSV4_ERR_TENSOR, "%s: scale '%s' (%s) [%" PRId64 ", %" PRId64 "] is %.9g, not a "
               "positive power of two in [2^-127, 2^127] (V4 block scales are ue8m0)", dsv4_st_path(t->scale_file),
               s->name, s->dtype_name, i / s->shape[1], i % s->shape[1], (double)dst[i]);
  }
fail:
  free(raw);
  return rc;
}

/* Decodes rows [r0, r0 + nr) from raw codes; returns 1 when some value is NaN or infinite. Rows are
 * independent: OpenMP threads split them. The non-finite test looks only at exponent bits, so the
 * compiler vectorises it as a reduction; the caller finds the element only when it fails. */
static int decode_rows(float *dst, const uint8_t *raw, const float *lut, const float *scale, int64_t r0, int64_t nr,
                       int64_t cols, int64_t b0, int64_t b1, int64_t sc) {
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
  for (int64_t r = r0; r < r0 + nr; r++) {
    const uint8_t *q = raw + (r - r0) * cols;
    const float *srow = scale + (r / b0) * sc;
    float *o = dst + r * cols;
    for (int64_t k0 = 0; k0 < cols; k0 += b1) {
      const float s = srow[k0 / b1];
      const int64_t k1 = k0 + b1 < cols ? k0 + b1 : cols;
      for (int64_t k = k0; k < k1; k++) o[k] = lut[q[k]] * s;
    }
    uint32_t inf_or_nan = 0;
    for (int64_t k = 0; k < cols; k++) {
      uint32_t u;
      memcpy(&u, &o[k], 4);
      inf_or_nan |= (u & 0x7f800000u) == 0x7f800000u;
    }
    bad |= (int)inf_or_nan;
  }
  return bad;
}

/* W[n][k] = e4m3(Wq[n][k]) * S[n / b0][k / b1], read in chunks of whole rows. Each product is one
 * fp32 multiplication of two exactly decoded values, exact because every scale is a power of two
 * in E8M0's range (read_scales refuses any other). Napkin math: per weight 1 byte read, one table lookup,
 * one multiply, 4 bytes written; V4-Flash's CSA layer (~115 MB of FP8) decodes in ~0.1 s per core. */
static dsv4_status dequant(const dsv4_ckpt_tensor *t, float *dst) {
  dsv4_status rc = DSV4_OK;
  const int64_t rows = t->t->shape[0], cols = t->t->shape[1], b0 = t->block[0], b1 = t->block[1];
  float *scale = NULL, lut[256];
  uint8_t *raw = NULL;
  for (int b = 0; b < 256; b++) lut[b] = dsv4_e4m3_to_f32((uint8_t)b);
  DSV4_ALLOC(scale, t->scale->numel);
  DSV4_TRY(read_scales(t, scale));
  const int64_t sc = t->scale->shape[1];
  const int64_t per = cols > 0 && cols < READ_CHUNK_BYTES ? READ_CHUNK_BYTES / cols : 1;
  DSV4_ALLOC(raw, (size_t)(per * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t nr = rows - r0 < per ? rows - r0 : per;
    DSV4_TRY(dsv4_st_read_bytes(t->file, t->t, (uint64_t)(r0 * cols), raw, (size_t)(nr * cols)));
    if (!decode_rows(dst, raw, lut, scale, r0, nr, cols, b0, b1, sc)) continue;
    for (int64_t i = 0; i < nr * cols; i++) {
      const int64_t r = r0 + i / cols, k = i % cols;
      if (isfinite(dst[r * cols + k])) continue;
      DSV4_FAIL(DSV4_ERR_TENSOR, "%s: tensor '%s' [%" PRId64 ", %" PRId64 "] %s", dsv4_st_path(t->file), t->t->name,
                r, k, (raw[i] & 0x7f) == 0x7f ? "holds the E4M3 NaN code" : "dequantises to an infinite value "
                "(E4M3 value times its block scale overflows fp32)");
    }
  }
fail:
  free(scale);
  free(raw);
  return rc;
}

dsv4_status dsv4_ckpt_read_f32(const dsv4_ckpt_tensor *t, float *dst) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(t && t->t && (dst || t->t->numel == 0), DSV4_ERR_ARG, "checkpoint read: NULL argument");
  if (t->t->dtype == DSV4_DT_F8_E4M3) {
    DSV4_CHECK(t->scale && t->block[0] > 0 && t->block[1] > 0, DSV4_ERR_ARG,
               "checkpoint read: F8_E4M3 tensor '%s' was not located with its scale", t->t->name);
    return dequant(t, dst);
  }
  rc = dsv4_st_read_f32(t->file, t->t, dst);
fail:
  return rc;
}
