/* safetensors.c: reader and writer of the safetensors format (see safetensors.h).
 *
 * Reader: dsv4_st_open reads the 8-byte header length and the JSON header (parsed with cJSON),
 * validates every entry against the file size, then keeps the file descriptor; tensors are read
 * with pread at 64-bit offsets (so concurrent reads of one file do not share a seek position).
 * Writer: builds the header with cJSON (keys in insertion order, integers written verbatim),
 * pads it with spaces so that the data area starts at a multiple of 8 bytes, and writes header
 * and data through src/io/outfile.c: an unnamed file in the target's directory that takes the
 * target's place only when complete.
 */
#define _FILE_OFFSET_BITS 64
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/outfile.h"
#include "util/err.h"
#include "util/fileio.h"

/* safetensors data is little-endian; tensors are read and written with memcpy, no byte swapping. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors.c assumes a little-endian host");
_Static_assert(sizeof(off_t) == 8, "safetensors.c needs 64-bit file offsets");

#define MAX_HEADER_BYTES 100000000u   /* same limit as the official implementation */
#define CHUNK_BYTES (1u << 20)        /* staging buffer for dtype conversions */
#define MAX_EXACT_INT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact in a double */

/* Every dtype of the safetensors spec with its size in bits (F4 and F6 pack several per byte).
 * The first DSV4_DT_OTHER entries are in dsv4_dtype order. */
static const struct { const char *name; int bits; } dtypes[] = {
    [DSV4_DT_F32] = {"F32", 32},       [DSV4_DT_BF16] = {"BF16", 16},    [DSV4_DT_F16] = {"F16", 16},
    [DSV4_DT_I32] = {"I32", 32},       [DSV4_DT_F64] = {"F64", 64},      [DSV4_DT_I64] = {"I64", 64},
    [DSV4_DT_F8_E4M3] = {"F8_E4M3", 8}, [DSV4_DT_F8_E8M0] = {"F8_E8M0", 8},
    {"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"F8_E5M2", 8}, {"U16", 16}, {"I16", 16}, {"U32", 32}, {"U64", 64},
    {"C64", 64}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"F4", 4}};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

struct dsv4_st_file {
  char *path;
  int fd;
  uint64_t data_start;      /* 8 + header length: file offset of the data area */
  int n;
  dsv4_st_info *info;       /* [n] tensors in header order */
  const dsv4_st_info **by_name; /* [n] sorted by name, for dsv4_st_find */
};

typedef struct {
  dsv4_st_info t;           /* begin/end are the offsets the tensor gets in the file */
  const void *data;         /* borrowed; NULL for a tensor whose rows come from fill */
  dsv4_st_fill_fn fill;     /* dsv4_st_writer_add_rows */
  void *fill_ctx;
  int64_t rows_per_call;
} writer_entry;

struct dsv4_st_writer {
  int n, cap;
  writer_entry *e;
};

/* ----------------------------------------------------------------------------------------- */
/* dtypes and fp conversions                                                                  */

/* Name and element size in bytes of a dtype ("?" / 0 for DSV4_DT_OTHER and out of range). */
static int dtype_ok(dsv4_dtype dt) { return (int)dt >= 0 && dt < DSV4_DT_OTHER; }
const char *dsv4_dtype_name(dsv4_dtype dt) { return dtype_ok(dt) ? dtypes[dt].name : "?"; }
int dsv4_dtype_size(dsv4_dtype dt) { return dtype_ok(dt) ? dtypes[dt].bits / 8 : 0; }

static float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bits_from_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* bf16 is the top half of an fp32: exact. */
float dsv4_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* Exact: subnormals are normalized, inf and nan (with payload) kept. */
float dsv4_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (man << 13);
  else if (man == 0) bits = sign;
  else {
    exp = 113; /* value = man * 2^-24 = (man / 1024) * 2^-14 */
    while (!(man & 0x400)) { man <<= 1; exp--; }
    bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
  }
  return f32_from_bits(bits);
}

/* Round to nearest even; NaN stays a (quiet) NaN of the same sign; overflow gives inf. */
uint16_t dsv4_f32_to_bf16(float f) {
  uint32_t u = bits_from_f32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Round to nearest even, including into the subnormal range; NaN kept; >= 65520 gives inf. */
uint16_t dsv4_f32_to_f16(float f) {
  uint32_t u = bits_from_f32(f), ax = u & 0x7fffffffu, q, rem, half;
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
  if (ax >= 0x477ff000u) return sign | 0x7c00; /* 65520 = 65504 + half an ulp, ties to inf */
  if (ax >= 0x38800000u) {                      /* normal: rebias the exponent, round 13 bits */
    uint32_t r = ax - (112u << 23);
    q = r >> 13, rem = r & 0x1fff, half = 0x1000;
  } else {                                      /* subnormal result: units of 2^-24 */
    uint32_t shift = 126 - (ax >> 23), man = (ax & 0x7fffff) | 0x800000;
    if (shift > 24) return sign;                /* below 2^-25: rounds to zero */
    q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
  }
  if (rem > half || (rem == half && (q & 1))) q++;
  return sign | (uint16_t)q;
}

/* E4M3 from its bits, building the fp32 bit pattern (exact: 4 significant bits, exponents well
 * inside fp32's range). Subnormal m * 2^-9 is normalised: with p the top set bit of m, the value is
 * (1 + (m - 2^p) / 2^p) * 2^(p-9). */
float dsv4_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = (uint32_t)(b >> 7) << 31, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return f32_from_bits(sign | 0x7fc00000u);
  if (e != 0) return f32_from_bits(sign | ((e + 120) << 23) | (m << 20)); /* (8+m) 2^(e-10) = (1+m/8) 2^(e-7) */
  if (m == 0) return f32_from_bits(sign);
  const uint32_t p = m >= 4 ? 2 : m >= 2 ? 1 : 0;
  return f32_from_bits(sign | ((p + 118) << 23) | ((m - (1u << p)) << (23 - p)));
}

/* E8M0 from its bits: exponent field b (b >= 1); b = 0 is the subnormal 2^-127 = 0x00400000. */
float dsv4_e8m0_to_f32(uint8_t b) {
  if (b == 255) return f32_from_bits(0x7fc00000u);
  return f32_from_bits(b ? (uint32_t)b << 23 : 0x00400000u);
}

/* ----------------------------------------------------------------------------------------- */
/* reader                                                                                     */

/* Reads n bytes at file offset off; what names the part being read in error messages. */
static dsv4_status read_at(const dsv4_st_file *f, void *buf, size_t n, uint64_t off, const char *what) {
  dsv4_status rc = DSV4_OK;
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(f->fd, p, n, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    DSV4_CHECK(r >= 0, DSV4_ERR_IO, "%s: %s: read failed at byte %" PRIu64 ": %s", f->path, what,
               off, strerror(errno));
    DSV4_CHECK(r > 0, DSV4_ERR_FORMAT, "%s: %s: unexpected end of file at byte %" PRIu64
               " (file truncated or changed since it was opened)", f->path, what, off);
    p += r, n -= (size_t)r, off += (uint64_t)r;
  }
fail:
  return rc;
}

/* 1 if j is a JSON number holding a non-negative integer exactly (<= 2^53). */
static int json_uint(const cJSON *j, uint64_t *v) {
  if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= MAX_EXACT_INT)) return 0;
  *v = (uint64_t)j->valuedouble;
  return (double)*v == j->valuedouble;
}

/* Formats a shape as "[4, 8]". */
const char *dsv4_st_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < ndim && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, d ? ", " : "", shape[d]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* Fills t from one header entry e and checks it against the data area size. */
static dsv4_status parse_entry(const char *path, const cJSON *e, dsv4_st_info *t, uint64_t data_size) {
  dsv4_status rc = DSV4_OK;
  const char *nm = e->string;
  char sbuf[256];
  DSV4_CHECK(cJSON_IsObject(e), DSV4_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, nm);
  const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  DSV4_CHECK(cJSON_IsString(jd), DSV4_ERR_FORMAT, "%s: tensor '%s': missing or non-string \"dtype\"",
             path, nm);
  /* any dtype is accepted here (a needed tensor's dtype is checked when it is read); the spec's
   * dtypes get the full size check, an unknown name only the bounds and overlap checks */
  int dt = -1;
  for (int i = 0; i < N_DTYPES && dt < 0; i++)
    if (!strcmp(jd->valuestring, dtypes[i].name)) dt = i;
  const int bits = dt >= 0 ? dtypes[dt].bits : 0;
  t->dtype = dt >= 0 && dt < DSV4_DT_OTHER ? (dsv4_dtype)dt : DSV4_DT_OTHER;
  snprintf(t->dtype_name, sizeof t->dtype_name, "%s", jd->valuestring);

  DSV4_CHECK(cJSON_IsArray(js), DSV4_ERR_FORMAT, "%s: tensor '%s': missing or non-array \"shape\"", path, nm);
  t->ndim = cJSON_GetArraySize(js);
  DSV4_CHECK(t->ndim <= DSV4_ST_MAX_DIMS, DSV4_ERR_FORMAT, "%s: tensor '%s': shape has %d dims (at most %d)",
             path, nm, t->ndim, DSV4_ST_MAX_DIMS);
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    uint64_t v;
    DSV4_CHECK(json_uint(cJSON_GetArrayItem(js, d), &v), DSV4_ERR_FORMAT,
               "%s: tensor '%s': shape[%d] is not a non-negative integer", path, nm, d);
    t->shape[d] = (int64_t)v;
    DSV4_CHECK(!__builtin_mul_overflow(t->numel, t->shape[d], &t->numel), DSV4_ERR_FORMAT,
               "%s: tensor '%s': shape %s has too many elements", path, nm,
               dsv4_st_shape_str(sbuf, sizeof sbuf, t->shape, d + 1));
  }
  dsv4_st_shape_str(sbuf, sizeof sbuf, t->shape, t->ndim);
  int64_t nbits;
  DSV4_CHECK(!__builtin_mul_overflow(t->numel, (int64_t)bits, &nbits), DSV4_ERR_FORMAT,
             "%s: tensor '%s': shape %s is too large", path, nm, sbuf);
  DSV4_CHECK(nbits % 8 == 0, DSV4_ERR_FORMAT, "%s: tensor '%s': %s of shape %s does not fill whole bytes", path,
             nm, t->dtype_name, sbuf);
  const int64_t nbytes = nbits / 8;

  DSV4_CHECK(cJSON_IsArray(jo) && cJSON_GetArraySize(jo) == 2 && json_uint(jo->child, &t->begin) &&
             json_uint(jo->child->next, &t->end), DSV4_ERR_FORMAT,
             "%s: tensor '%s': missing \"data_offsets\" or not two non-negative integers", path, nm);
  DSV4_CHECK(t->begin <= t->end, DSV4_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
             "] begin after end", path, nm, t->begin, t->end);
  DSV4_CHECK(t->end <= data_size, DSV4_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
             "] past the end of the data area (%" PRIu64 " bytes; file truncated?)", path, nm, t->begin,
             t->end, data_size);
  DSV4_CHECK(dt < 0 || t->end - t->begin == (uint64_t)nbytes, DSV4_ERR_FORMAT, "%s: tensor '%s': data_offsets [%"
             PRIu64 ", %" PRIu64 "] do not match dtype %s and shape %s (%" PRId64 " bytes)",
             path, nm, t->begin, t->end, t->dtype_name, sbuf, nbytes);
fail:
  return rc;
}

/* Orders tensor pointers by name (for dsv4_st_find and the duplicate check). */
static int cmp_name(const void *a, const void *b) {
  return strcmp((*(const dsv4_st_info *const *)a)->name, (*(const dsv4_st_info *const *)b)->name);
}

/* Orders by begin, then end (for the overlap check). */
static int cmp_offset(const void *a, const void *b) {
  const dsv4_st_info *x = *(const dsv4_st_info *const *)a, *y = *(const dsv4_st_info *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

dsv4_status dsv4_st_open(dsv4_st_file **out, const char *path) {
  dsv4_status rc = DSV4_OK;
  int fd = -1;
  uint64_t size;
  DSV4_CHECK(out && path, DSV4_ERR_ARG, "dsv4_st_open: out and path must not be NULL");
  *out = NULL;
  DSV4_TRY(dsv4_open_regular(path, &fd, &size));
  return dsv4_st_open_fd(out, fd, path);
fail:
  return rc;
}

/* Reads the header of n bytes at offset 8 into a fresh buffer, in chunks, refusing a NUL byte (no
 * JSON text holds one) as soon as a chunk shows it: a sparse file declaring a huge header reads as
 * zeros, so it costs one chunk, not the declared length. */
static dsv4_status read_header(const dsv4_st_file *f, uint64_t n, char **out) {
  dsv4_status rc = DSV4_OK;
  char *buf = NULL;
  size_t cap = 0;
  for (uint64_t got = 0; got < n;) {
    const size_t k = n - got < CHUNK_BYTES ? (size_t)(n - got) : CHUNK_BYTES;
    if (got + k + 1 > cap) { /* doubling: a header is copied O(1) times on average */
      size_t want = cap ? 2 * cap : CHUNK_BYTES + 1;
      if (want > n + 1) want = (size_t)n + 1;
      char *bigger = realloc(buf, want);
      DSV4_CHECK(bigger, DSV4_ERR_NOMEM, "%s: out of memory for a %" PRIu64 "-byte header", f->path, n);
      buf = bigger, cap = want;
    }
    DSV4_TRY(read_at(f, buf + got, k, 8 + got, "header"));
    DSV4_CHECK(!memchr(buf + got, 0, k), DSV4_ERR_FORMAT, "%s: not a safetensors file: its header holds a NUL byte",
               f->path);
    DSV4_CHECK(got > 0 || buf[0] == '{', DSV4_ERR_FORMAT, "%s: not a safetensors file: its header is not an "
               "object (JSON that starts with '{')", f->path);
    got += k;
  }
  if (!buf) DSV4_ALLOC(buf, 1);
  buf[n] = 0;
  *out = buf;
  buf = NULL;
fail:
  free(buf);
  return rc;
}

/* Reads and validates the header length, the JSON and every entry; then checks names and overlaps.
 * Nothing read from the file is quoted before the header has parsed as JSON: for a file that is
 * not a safetensors file at all (a checkpoint entry pointing at /etc/passwd, say), the message
 * says so without showing any of its bytes, not even as the "header length" number. */
dsv4_status dsv4_st_open_fd(dsv4_st_file **out, int fd, const char *path) {
  dsv4_status rc = DSV4_OK;
  dsv4_st_file *f = NULL;
  char *hdr = NULL;
  cJSON *root = NULL;
  const dsv4_st_info **by_off = NULL;
  struct stat st;
  DSV4_CHECK(out && path && fd >= 0, DSV4_ERR_ARG, "dsv4_st_open_fd: out, path and a descriptor are required");
  *out = NULL;
  DSV4_ALLOC(f, 1);
  f->fd = fd;
  fd = -1;
  f->path = strdup(path);
  DSV4_CHECK(f->path, DSV4_ERR_NOMEM, "%s: out of memory", path);
  DSV4_CHECK(fstat(f->fd, &st) == 0, DSV4_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
  DSV4_CHECK(S_ISREG(st.st_mode), DSV4_ERR_IO, "%s is %s, not a regular file", path, dsv4_file_kind(st.st_mode));
  const uint64_t fsize = (uint64_t)st.st_size;
  uint64_t hlen = 0;
  DSV4_CHECK(fsize >= 8, DSV4_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, too short for a safetensors "
             "header", path, fsize);
  unsigned char len8[8];
  DSV4_TRY(read_at(f, len8, 8, 0, "header length"));
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  DSV4_CHECK(hlen <= MAX_HEADER_BYTES, DSV4_ERR_FORMAT, "%s: not a safetensors file: header length implausible "
             "(exceeds the %u-byte limit)", path, MAX_HEADER_BYTES);
  DSV4_CHECK(hlen <= fsize - 8, DSV4_ERR_FORMAT, "%s: not a safetensors file: header length implausible (exceeds "
             "the file size, %" PRIu64 " bytes)", path, fsize);
  f->data_start = 8 + hlen;
  DSV4_TRY(read_header(f, hlen, &hdr));
  const char *end = NULL;
  root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
  DSV4_CHECK(root, DSV4_ERR_FORMAT, "%s: not a safetensors file: its header is not valid JSON (error near byte %td)",
             path, end ? end - hdr : 0);
  for (; end < hdr + hlen; end++)
    DSV4_CHECK(*end && strchr(" \t\r\n", *end), DSV4_ERR_FORMAT,
               "%s: unexpected bytes after the JSON header at byte %td", path, end - hdr);
  DSV4_CHECK(cJSON_IsObject(root), DSV4_ERR_FORMAT, "%s: header JSON is not an object", path);

  const cJSON *e;
  cJSON_ArrayForEach(e, root) {
    if (strcmp(e->string, "__metadata__")) f->n++;
    else DSV4_CHECK(cJSON_IsObject(e) || cJSON_IsNull(e), DSV4_ERR_FORMAT,
                    "%s: __metadata__ is not a JSON object", path);
  }
  DSV4_ALLOC(f->info, f->n);
  DSV4_ALLOC(f->by_name, f->n);
  DSV4_ALLOC(by_off, f->n);
  int i = 0;
  cJSON_ArrayForEach(e, root) {
    if (!strcmp(e->string, "__metadata__")) continue;
    dsv4_st_info *t = &f->info[i];
    DSV4_TRY(parse_entry(path, e, t, fsize - f->data_start));
    t->name = strdup(e->string);
    DSV4_CHECK(t->name, DSV4_ERR_NOMEM, "%s: out of memory", path);
    f->by_name[i] = by_off[i] = t;
    i++;
  }
  qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
  for (i = 1; i < f->n; i++)
    DSV4_CHECK(strcmp(f->by_name[i - 1]->name, f->by_name[i]->name), DSV4_ERR_FORMAT,
               "%s: tensor '%s' appears twice in the header", path, f->by_name[i]->name);
  qsort(by_off, (size_t)f->n, sizeof *by_off, cmp_offset);
  const dsv4_st_info *prev = NULL; /* last non-empty tensor: empty ones cannot overlap anything */
  for (i = 0; i < f->n; i++) {
    const dsv4_st_info *t = by_off[i];
    if (t->begin == t->end) continue;
    DSV4_CHECK(!prev || t->begin >= prev->end, DSV4_ERR_FORMAT, "%s: tensors '%s' [%" PRIu64 ", %" PRIu64
               "] and '%s' [%" PRIu64 ", %" PRIu64 "] overlap", path, prev->name, prev->begin,
               prev->end, t->name, t->begin, t->end);
    prev = t;
  }
  *out = f;
fail:
  cJSON_Delete(root);
  free(hdr);
  free(by_off);
  if (fd >= 0) close(fd);
  if (rc != DSV4_OK) dsv4_st_close(f);
  return rc;
}

/* Closes the descriptor and frees everything (NULL is fine). */
void dsv4_st_close(dsv4_st_file *f) {
  if (!f) return;
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; f->info && i < f->n; i++) free(f->info[i].name);
  free(f->info);
  free(f->by_name);
  free(f->path);
  free(f);
}

/* Accessors: tensors in header order; NULL / 0 on bad arguments. */
int dsv4_st_count(const dsv4_st_file *f) { return f ? f->n : 0; }
const dsv4_st_info *dsv4_st_at(const dsv4_st_file *f, int i) {
  return f && i >= 0 && i < f->n ? &f->info[i] : NULL;
}
const char *dsv4_st_path(const dsv4_st_file *f) { return f ? f->path : NULL; }

/* Binary search in the name index; NULL when absent. */
const dsv4_st_info *dsv4_st_find(const dsv4_st_file *f, const char *name) {
  if (!f || !name) return NULL;
  dsv4_st_info key = {.name = (char *)name};
  const dsv4_st_info *kp = &key, **hit = bsearch(&kp, f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name);
  return hit ? *hit : NULL;
}

/* Reads t into dst as fp32 (as_int 0) or int32 (as_int 1), converting in chunks where needed. */
/* Elements [e0, e0 + count) of a tensor, converted (as_int: to int32, else to fp32). */
static dsv4_status read_elems(dsv4_st_file *f, const dsv4_st_info *t, int64_t e0, int64_t count, void *dst,
                              int as_int) {
  dsv4_status rc = DSV4_OK;
  unsigned char *buf = NULL;
  char what[300];
  DSV4_CHECK(f && t, DSV4_ERR_ARG, "safetensors read: file and tensor must not be NULL");
  DSV4_CHECK((uintptr_t)t >= (uintptr_t)f->info && (uintptr_t)t < (uintptr_t)(f->info + f->n),
             DSV4_ERR_ARG, "%s: tensor info does not belong to this file", f->path);
  DSV4_CHECK(dst || count == 0, DSV4_ERR_ARG, "%s: tensor '%s': dst is NULL", f->path, t->name);
  DSV4_CHECK(e0 >= 0 && count >= 0 && e0 <= t->numel && count <= t->numel - e0, DSV4_ERR_ARG,
             "%s: tensor '%s': elements [%" PRId64 ", +%" PRId64 ") are outside its %" PRId64, f->path, t->name, e0,
             count, t->numel);
  const int is_int = t->dtype == DSV4_DT_I32 || t->dtype == DSV4_DT_I64;
  const int is_float = t->dtype == DSV4_DT_F32 || t->dtype == DSV4_DT_BF16 || t->dtype == DSV4_DT_F16 ||
                       t->dtype == DSV4_DT_F64;
  DSV4_CHECK(as_int ? is_int : is_float, DSV4_ERR_TENSOR, "%s: tensor '%s' has dtype %s, expected %s", f->path,
             t->name, t->dtype_name, as_int ? "I32 or I64" : "a float dtype (F32, BF16, F16, F64)");
  const int es = dsv4_dtype_size(t->dtype);
  snprintf(what, sizeof what, "tensor '%s'", t->name);
  const uint64_t base = f->data_start + t->begin + (uint64_t)(e0 * es);
  if (es == 4) return read_at(f, dst, (size_t)(count * es), base, what);
  int64_t per = CHUNK_BYTES / (unsigned)es;
  DSV4_ALLOC(buf, CHUNK_BYTES);
  for (int64_t i0 = 0; i0 < count; i0 += per) {
    int64_t n = count - i0 < per ? count - i0 : per;
    DSV4_TRY(read_at(f, buf, (size_t)(n * es), base + (uint64_t)(i0 * es), what));
    float *of = (float *)dst + i0;
    int32_t *oi = (int32_t *)dst + i0;
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      double d;
      int64_t v;
      switch (t->dtype) {
        case DSV4_DT_BF16: memcpy(&h, buf + 2 * i, 2), of[i] = dsv4_bf16_to_f32(h); break;
        case DSV4_DT_F16: memcpy(&h, buf + 2 * i, 2), of[i] = dsv4_f16_to_f32(h); break;
        case DSV4_DT_F64: memcpy(&d, buf + 8 * i, 8), of[i] = (float)d; break; /* nearest; inf if too big */
        default: /* I64 */
          memcpy(&v, buf + 8 * i, 8);
          DSV4_CHECK(v >= INT32_MIN && v <= INT32_MAX, DSV4_ERR_TENSOR, "%s: tensor '%s': I64 element %"
                     PRId64 " = %" PRId64 " does not fit in int32", f->path, t->name, e0 + i0 + i, v);
          oi[i] = (int32_t)v;
      }
    }
  }
fail:
  free(buf);
  return rc;
}

/* F32 / BF16 / F16 / F64 -> fp32. */
dsv4_status dsv4_st_read_f32(dsv4_st_file *f, const dsv4_st_info *t, float *dst) {
  return read_elems(f, t, 0, t ? t->numel : 0, dst, 0);
}

/* Elements [e0, e0 + count) -> fp32: a rank's own rows of an input, never the whole tensor. */
dsv4_status dsv4_st_read_f32_range(dsv4_st_file *f, const dsv4_st_info *t, int64_t e0, int64_t count, float *dst) {
  return read_elems(f, t, e0, count, dst, 0);
}

/* I32, or I64 whose values all fit. */
dsv4_status dsv4_st_read_i32(dsv4_st_file *f, const dsv4_st_info *t, int32_t *dst) {
  return read_elems(f, t, 0, t ? t->numel : 0, dst, 1);
}

/* Raw bytes [offset, offset + n) of a tensor's data. */
dsv4_status dsv4_st_read_bytes(dsv4_st_file *f, const dsv4_st_info *t, uint64_t offset, void *dst, size_t n) {
  dsv4_status rc = DSV4_OK;
  char what[300];
  DSV4_CHECK(f && t && (dst || n == 0), DSV4_ERR_ARG, "safetensors read: file, tensor and dst must not be NULL");
  DSV4_CHECK((uintptr_t)t >= (uintptr_t)f->info && (uintptr_t)t < (uintptr_t)(f->info + f->n),
             DSV4_ERR_ARG, "%s: tensor info does not belong to this file", f->path);
  DSV4_CHECK(offset <= t->end - t->begin && n <= t->end - t->begin - offset, DSV4_ERR_ARG,
             "%s: tensor '%s': bytes [%" PRIu64 ", +%zu) are outside its %" PRIu64 " bytes", f->path, t->name,
             offset, n, t->end - t->begin);
  snprintf(what, sizeof what, "tensor '%s'", t->name);
  rc = read_at(f, dst, n, f->data_start + t->begin + offset, what);
fail:
  return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* writer                                                                                     */

/* An empty writer. */
dsv4_status dsv4_st_writer_create(dsv4_st_writer **out) {
  dsv4_status rc = DSV4_OK;
  dsv4_st_writer *w = NULL;
  DSV4_CHECK(out, DSV4_ERR_ARG, "dsv4_st_writer_create: out must not be NULL");
  DSV4_ALLOC(w, 1);
  *out = w;
fail:
  return rc;
}

/* Frees the writer and its name copies (the data is borrowed). */
void dsv4_st_writer_free(dsv4_st_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->n; i++) free(w->e[i].t.name);
  free(w->e);
  free(w);
}

/* Validates and records one tensor; its offsets follow the previous tensor's. */
dsv4_status dsv4_st_writer_add(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                               const int64_t *shape, const void *data) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(w && name && *name && strcmp(name, "__metadata__"), DSV4_ERR_ARG,
             "dsv4_st_writer_add: writer and a non-empty name other than '__metadata__' are required");
  DSV4_CHECK(dtype == DSV4_DT_F32 || dtype == DSV4_DT_I32 || dtype == DSV4_DT_BF16 || dtype == DSV4_DT_F16,
             DSV4_ERR_ARG, "dsv4_st_writer_add: tensor '%s': dtype %s cannot be written (F32, I32, BF16, "
             "F16 can)", name, dsv4_dtype_name(dtype));
  DSV4_CHECK(ndim >= 0 && ndim <= DSV4_ST_MAX_DIMS && (shape || ndim == 0), DSV4_ERR_ARG,
             "dsv4_st_writer_add: tensor '%s': ndim %d not in [0, %d] or shape NULL", name, ndim,
             DSV4_ST_MAX_DIMS);
  int64_t numel = 1, nbytes;
  for (int d = 0; d < ndim; d++)
    DSV4_CHECK(shape[d] >= 0 && !__builtin_mul_overflow(numel, shape[d], &numel), DSV4_ERR_ARG,
               "dsv4_st_writer_add: tensor '%s': shape[%d] = %" PRId64 " is negative or too large",
               name, d, shape[d]);
  DSV4_CHECK(!__builtin_mul_overflow(numel, (int64_t)dsv4_dtype_size(dtype), &nbytes), DSV4_ERR_ARG,
             "dsv4_st_writer_add: tensor '%s': too large", name);
  DSV4_CHECK(data || numel == 0, DSV4_ERR_ARG, "dsv4_st_writer_add: tensor '%s': data is NULL", name);
  for (int i = 0; i < w->n; i++)
    DSV4_CHECK(strcmp(w->e[i].t.name, name), DSV4_ERR_ARG, "dsv4_st_writer_add: tensor '%s' added twice",
               name);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    writer_entry *e = realloc(w->e, (size_t)cap * sizeof *e);
    DSV4_CHECK(e, DSV4_ERR_NOMEM, "dsv4_st_writer_add: out of memory");
    w->e = e, w->cap = cap;
  }
  writer_entry *e = &w->e[w->n];
  memset(e, 0, sizeof *e);
  e->t.name = strdup(name);
  DSV4_CHECK(e->t.name, DSV4_ERR_NOMEM, "dsv4_st_writer_add: out of memory");
  e->t.dtype = dtype, e->t.ndim = ndim, e->t.numel = numel, e->data = data;
  snprintf(e->t.dtype_name, sizeof e->t.dtype_name, "%s", dsv4_dtype_name(dtype));
  if (ndim) memcpy(e->t.shape, shape, (size_t)ndim * sizeof *shape);
  e->t.begin = w->n ? w->e[w->n - 1].t.end : 0;
  e->t.end = e->t.begin + (uint64_t)nbytes;
  w->n++;
fail:
  return rc;
}

dsv4_status dsv4_st_writer_add_rows(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                                    const int64_t *shape, int64_t rows_per_call, dsv4_st_fill_fn fill, void *ctx) {
  dsv4_status rc = DSV4_OK;
  static const char placeholder = 0;
  DSV4_CHECK(fill && rows_per_call > 0 && ndim >= 1 && (dtype == DSV4_DT_F32 || dtype == DSV4_DT_I32), DSV4_ERR_ARG,
             "dsv4_st_writer_add_rows: tensor '%s': F32 or I32 rows, a fill function and rows_per_call > 0 needed",
             name ? name : "?");
  DSV4_TRY(dsv4_st_writer_add(w, name, dtype, ndim, shape, &placeholder));
  writer_entry *e = &w->e[w->n - 1];
  e->data = NULL;
  e->fill = fill;
  e->fill_ctx = ctx;
  e->rows_per_call = rows_per_call;
fail:
  return rc;
}

/* Appends v to a JSON array as a verbatim integer (cJSON would print large doubles as 1e+15). */
static int add_uint(cJSON *arr, uint64_t v) {
  char s[24];
  snprintf(s, sizeof s, "%" PRIu64, v);
  cJSON *r = cJSON_CreateRaw(s);
  if (r && cJSON_AddItemToArray(arr, r)) return 1;
  cJSON_Delete(r);
  return 0;
}

/* The header: 8-byte length, JSON in insertion order, spaces up to a multiple of 8 (NULL if no memory). */
static unsigned char *build_header(const dsv4_st_writer *w, size_t *len) {
  cJSON *root = cJSON_CreateObject(), *meta = root ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
  int ok = meta && cJSON_AddStringToObject(meta, "format", "pt");
  for (int i = 0; ok && i < w->n; i++) {
    const dsv4_st_info *t = &w->e[i].t;
    cJSON *o = cJSON_AddObjectToObject(root, t->name), *s = NULL, *d = NULL;
    ok = o && cJSON_AddStringToObject(o, "dtype", dsv4_dtype_name(t->dtype)) &&
         (s = cJSON_AddArrayToObject(o, "shape")) && (d = cJSON_AddArrayToObject(o, "data_offsets"));
    for (int k = 0; ok && k < t->ndim; k++) ok = add_uint(s, (uint64_t)t->shape[k]);
    ok = ok && add_uint(d, t->begin) && add_uint(d, t->end);
  }
  char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
  size_t jl = json ? strlen(json) : 0, hl = (jl + 7) / 8 * 8;
  unsigned char *buf = json ? malloc(8 + hl) : NULL;
  if (buf) {
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, ' ', hl - jl);
    *len = 8 + hl;
  }
  free(json);
  cJSON_Delete(root);
  return buf;
}

/* Writes all n bytes; path is the target named in messages. */
static dsv4_status write_all(int fd, const void *p, size_t n, const char *path) {
  dsv4_status rc = DSV4_OK;
  const char *c = p;
  while (n > 0) {
    ssize_t r = write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    DSV4_CHECK(r > 0, DSV4_ERR_IO, "%s: write failed: %s", path, r < 0 ? strerror(errno) : "short write");
    c += r, n -= (size_t)r;
  }
fail:
  return rc;
}

/* Writes a fill-based tensor: rows_per_call rows at a time through one staging buffer. */
static dsv4_status write_rows(int fd, const writer_entry *e, const char *path) {
  dsv4_status rc = DSV4_OK;
  char *buf = NULL;
  const int64_t row_elems = e->t.ndim ? e->t.shape[e->t.ndim - 1] : 1;
  const int64_t rows = row_elems ? e->t.numel / row_elems : 0, row_bytes = row_elems * 4;
  const int64_t per = e->rows_per_call < rows ? e->rows_per_call : (rows ? rows : 1);
  DSV4_ALLOC(buf, (size_t)(per * row_bytes) + 1);
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = rows - r0 < per ? rows - r0 : per;
    DSV4_TRY(e->fill(e->fill_ctx, r0, n, buf));
    DSV4_TRY(write_all(fd, buf, (size_t)(n * row_bytes), path));
  }
fail:
  free(buf);
  return rc;
}

/* Writes the file through dsv4_outfile (src/io/outfile.h): an unnamed file put in place only when
 * complete (mode 0666 & ~umask), the old file intact until then. */
dsv4_status dsv4_st_writer_save(dsv4_st_writer *w, const char *path) {
  dsv4_status rc = DSV4_OK;
  unsigned char *hdr = NULL;
  uint16_t *buf = NULL;
  dsv4_outfile o = {.fd = -1, .dir_fd = -1, .slot = -1};
  size_t hlen = 0;
  DSV4_CHECK(w && path && *path, DSV4_ERR_ARG, "dsv4_st_writer_save: writer and path are required");
  hdr = build_header(w, &hlen);
  DSV4_CHECK(hdr, DSV4_ERR_NOMEM, "%s: out of memory building the header", path);
  DSV4_ALLOC(buf, CHUNK_BYTES / 2);
  DSV4_TRY(dsv4_outfile_begin(&o, path));
  const int fd = o.fd;
  DSV4_TRY(write_all(fd, hdr, hlen, path));
  for (int i = 0; i < w->n; i++) {
    const dsv4_st_info *t = &w->e[i].t;
    if (w->e[i].fill) {
      DSV4_TRY(write_rows(fd, &w->e[i], path));
      continue;
    }
    if (t->dtype == DSV4_DT_F32 || t->dtype == DSV4_DT_I32) {
      DSV4_TRY(write_all(fd, w->e[i].data, t->end - t->begin, path));
      continue;
    }
    const float *src = w->e[i].data;
    for (int64_t i0 = 0, per = CHUNK_BYTES / 2; i0 < t->numel; i0 += per) {
      int64_t n = t->numel - i0 < per ? t->numel - i0 : per;
      for (int64_t k = 0; k < n; k++)
        buf[k] = t->dtype == DSV4_DT_BF16 ? dsv4_f32_to_bf16(src[i0 + k]) : dsv4_f32_to_f16(src[i0 + k]);
      DSV4_TRY(write_all(fd, buf, (size_t)n * 2, path));
    }
  }
  rc = dsv4_outfile_commit(&o);
fail:
  dsv4_outfile_discard(&o);
  free(hdr);
  free(buf);
  return rc;
}
