/* test_safetensors.c: standalone tests of src/io/safetensors.c (round trips, fp conversions,
 * FP8 decoding by bits, I64 reads, files mixing dtypes the library never reads, paths that are not
 * regular files, escaped messages, and malformed files that must fail with the right status and a
 * message naming the file and tensor). Prints "PASS/FAIL safetensors: <check>" per check and a summary line; exits
 * non-zero if any check failed. Temporary files go to a fresh directory under $TMPDIR or /tmp. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "util/err.h"

static int n_pass, n_fail;
static char dir[512];

/* Records one check. */
static void check(int ok, const char *what) {
  printf("%s safetensors: %s\n", ok ? "PASS" : "FAIL", what);
  if (ok) n_pass++; else n_fail++;
  if (!ok) printf("    last error: %s [%s]\n", dsv4_last_error(), dsv4_last_error_location());
}

/* Path of a test file inside the temporary directory (static buffer rotation of 4). */
static const char *tpath(const char *name) {
  static char buf[4][640];
  static int k;
  char *p = buf[k++ & 3];
  snprintf(p, sizeof buf[0], "%s/%s", dir, name);
  return p;
}

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Writes raw bytes to path. */
static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp) { perror(path); exit(2); }
  if (n) fwrite(p, 1, n, fp);
  fclose(fp);
}

/* Writes a safetensors file from a header string and `data_len` bytes of data (or zeros). */
static void write_st(const char *path, uint64_t hlen_field, const char *json, const void *data,
                     size_t data_len) {
  size_t jl = strlen(json);
  unsigned char *b = calloc(8 + jl + data_len + 1, 1);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen_field >> (8 * i));
  memcpy(b + 8, json, jl);
  if (data) memcpy(b + 8 + jl, data, data_len);
  write_bytes(path, b, 8 + jl + data_len);
  free(b);
}

/* Opens a file expected to fail with status st; the message must name the file, and the tensor
 * (or any other substring) `sub` when not NULL. */
static void expect_fail(const char *what, const char *path, dsv4_status st, const char *sub) {
  dsv4_st_file *f = (dsv4_st_file *)1;
  dsv4_clear_error();
  dsv4_status rc = dsv4_st_open(&f, path);
  const char *msg = dsv4_last_error();
  int ok = rc == st && f == NULL && strstr(msg, path) && (!sub || strstr(msg, sub)) && !strchr(msg, '\n');
  char line[256];
  snprintf(line, sizeof line, "bad file: %s -> %s", what, dsv4_status_string(st));
  check(ok, line);
  if (!ok || getenv("ST_VERBOSE")) printf("    got %s: %s\n", dsv4_status_string(rc), msg);
  if (rc == DSV4_OK) dsv4_st_close(f);
}

/* Round trip of all four writable dtypes, several shapes, find/count and the read dtype rules. */
static void test_roundtrip(void) {
  const char *p = tpath("rt.safetensors");
  float f32[6] = {1.5f, -2.25f, 0.0f, 3.0e-30f, 1e30f, -0.0f};
  int32_t i32[5] = {0, -1, 7, INT32_MIN, INT32_MAX};
  float bf[12] = {1.0f, -2.5f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, INFINITY,
                  -INFINITY, NAN, 3.4e38f, 0x1p-133f, -0.0f, 0x1p-134f};
  float bf_want[12] = {1.0f, -2.5f, 1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, INFINITY, -INFINITY, NAN,
                       INFINITY, 0x1p-133f, -0.0f, 0.0f};
  float hf[16] = {1.0f, 65504.0f, 65520.0f, 65519.99f, 0x1p-24f, 0x1p-25f, 0.75f * 0x1p-24f, 1.5f * 0x1p-24f,
                  2.5f * 0x1p-24f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1023.5f * 0x1p-24f, -INFINITY, NAN,
                  -0.0f, 1e-8f};
  float hf_want[16] = {1.0f, 65504.0f, INFINITY, 65504.0f, 0x1p-24f, 0.0f, 0x1p-24f, 0x1p-23f,
                       0x1p-23f, 1.0f, 1.0f + 0x1p-9f, 0x1p-14f, -INFINITY, NAN, -0.0f, 0.0f};
  float scalar = 42.0f;
  int64_t s23[2] = {2, 3}, s5[1] = {5}, s12[1] = {12}, s44[2] = {4, 4}, s03[2] = {0, 3}, s40[3] = {4, 0, 2};
  dsv4_st_writer *w = NULL;
  int ok = dsv4_st_writer_create(&w) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "w.f32", DSV4_DT_F32, 2, s23, f32) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "ids", DSV4_DT_I32, 1, s5, i32) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "w.bf16", DSV4_DT_BF16, 1, s12, bf) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "w.f16", DSV4_DT_F16, 2, s44, hf) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "scalar", DSV4_DT_F32, 0, NULL, &scalar) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "empty", DSV4_DT_F32, 2, s03, NULL) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "empty16", DSV4_DT_BF16, 3, s40, NULL) == DSV4_OK;
  ok = ok && dsv4_st_writer_save(w, p) == DSV4_OK;
  dsv4_st_writer_free(w);
  check(ok, "writer save");

  dsv4_st_file *f = NULL;
  ok = dsv4_st_open(&f, p) == DSV4_OK;
  check(ok, "open written file");
  if (!ok) return;
  check(dsv4_st_count(f) == 7 && !strcmp(dsv4_st_at(f, 0)->name, "w.f32") &&
        !strcmp(dsv4_st_at(f, 6)->name, "empty16") && dsv4_st_at(f, 7) == NULL && dsv4_st_at(f, -1) == NULL &&
        !strcmp(dsv4_st_path(f), p), "count / at / path (header order kept)");
  const dsv4_st_info *t = dsv4_st_find(f, "w.f16");
  check(t && t->dtype == DSV4_DT_F16 && t->ndim == 2 && t->shape[0] == 4 && t->numel == 16 &&
        dsv4_st_find(f, "nope") == NULL && dsv4_st_find(f, "w.f1") == NULL, "find present / absent");
  /* data area starts at a multiple of 8 and offsets are contiguous in insertion order */
  uint64_t off = 0;
  int contiguous = 1;
  for (int i = 0; i < dsv4_st_count(f); i++) {
    contiguous &= dsv4_st_at(f, i)->begin == off;
    off = dsv4_st_at(f, i)->end;
  }
  FILE *fp = fopen(p, "rb");
  unsigned char h8[8] = {0};
  size_t got = fp ? fread(h8, 1, 8, fp) : 0;
  if (fp) fclose(fp);
  check(got == 8 && h8[0] % 8 == 0 && contiguous, "header padded to 8 bytes, offsets contiguous");

  float o[16];
  int32_t oi[5];
  t = dsv4_st_find(f, "w.f32");
  ok = t && dsv4_st_read_f32(f, t, o) == DSV4_OK;
  for (int i = 0; ok && i < 6; i++) ok = fbits(o[i]) == fbits(f32[i]);
  check(ok, "roundtrip f32 (bit exact, -0.0 kept)");
  t = dsv4_st_find(f, "ids");
  ok = t && dsv4_st_read_i32(f, t, oi) == DSV4_OK && !memcmp(oi, i32, sizeof i32);
  check(ok, "roundtrip i32");
  t = dsv4_st_find(f, "w.bf16");
  ok = t && dsv4_st_read_f32(f, t, o) == DSV4_OK;
  for (int i = 0; ok && i < 12; i++)
    ok = isnan(bf_want[i]) ? isnan(o[i]) : fbits(o[i]) == fbits(bf_want[i]);
  check(ok, "roundtrip bf16 (ties to even, inf, nan, overflow, subnormal, -0)");
  t = dsv4_st_find(f, "w.f16");
  ok = t && dsv4_st_read_f32(f, t, o) == DSV4_OK;
  for (int i = 0; ok && i < 16; i++) {
    ok = isnan(hf_want[i]) ? isnan(o[i]) : fbits(o[i]) == fbits(hf_want[i]);
    if (!ok) printf("    f16 element %d: got %a want %a\n", i, o[i], hf_want[i]);
  }
  check(ok, "roundtrip f16 (ties to even, max, overflow, subnormals, inf, nan, -0)");
  t = dsv4_st_find(f, "scalar");
  o[0] = 0;
  check(t && t->ndim == 0 && t->numel == 1 && t->end - t->begin == 4 &&
        dsv4_st_read_f32(f, t, o) == DSV4_OK &&
        o[0] == 42.0f, "scalar shape []");
  t = dsv4_st_find(f, "empty");
  const dsv4_st_info *t2 = dsv4_st_find(f, "empty16");
  check(t && t->numel == 0 && t->begin == t->end && dsv4_st_read_f32(f, t, NULL) == DSV4_OK && t2 &&
        t2->ndim == 3 && t2->numel == 0 && dsv4_st_read_f32(f, t2, o) == DSV4_OK, "zero-size tensors");
  dsv4_clear_error();
  t = dsv4_st_find(f, "ids");
  ok = dsv4_st_read_f32(f, t, o) == DSV4_ERR_TENSOR && strstr(dsv4_last_error(), "'ids'");
  t = dsv4_st_find(f, "w.f32");
  ok = ok && dsv4_st_read_i32(f, t, oi) == DSV4_ERR_TENSOR && strstr(dsv4_last_error(), "'w.f32'");
  check(ok, "read_f32 rejects I32, read_i32 rejects F32 (DSV4_ERR_TENSOR)");
  dsv4_st_info foreign = *dsv4_st_find(f, "w.f32");
  check(dsv4_st_read_f32(f, &foreign, o) == DSV4_ERR_ARG && dsv4_st_read_f32(f, NULL, o) == DSV4_ERR_ARG &&
        dsv4_st_read_f32(f, dsv4_st_find(f, "w.f32"), NULL) == DSV4_ERR_ARG &&
        dsv4_st_open(NULL, p) == DSV4_ERR_ARG,
        "read/open argument errors (foreign info, NULL) -> DSV4_ERR_ARG");
  dsv4_st_close(f);
  unlink(p);
}

/* Exhaustive fp16/bf16 checks: every finite half survives f16 -> f32 -> f16, and the same for bf16. */
static void test_conversions(void) {
  int ok = 1;
  for (uint32_t h = 0; h < 65536; h++) {
    float x = dsv4_f16_to_f32((uint16_t)h);
    int nan = ((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff);
    ok &= nan ? isnan(x) && (dsv4_f32_to_f16(x) & 0x7fff) > 0x7c00 : dsv4_f32_to_f16(x) == h;
  }
  check(ok && dsv4_f16_to_f32(1) == 0x1p-24f && dsv4_f16_to_f32(0x3ff) == 1023 * 0x1p-24f &&
        dsv4_f16_to_f32(0x7bff) == 65504.0f && dsv4_f16_to_f32(0xfc00) == -INFINITY,
        "f16 -> f32 -> f16 identity on all 65536 patterns");
  ok = 1;
  for (uint32_t h = 0; h < 65536; h++) {
    float x = dsv4_bf16_to_f32((uint16_t)h);
    ok &= isnan(x) ? isnan(dsv4_bf16_to_f32(dsv4_f32_to_bf16(x))) : dsv4_f32_to_bf16(x) == h;
  }
  /* a NaN whose payload is only in the low 16 bits must stay NaN */
  check(ok && isnan(dsv4_bf16_to_f32(dsv4_f32_to_bf16(bitsf(0x7f800001u)))) &&
        isnan(dsv4_f16_to_f32(dsv4_f32_to_f16(bitsf(0xff800001u)))), "bf16 identity, low-payload NaN kept");
#ifdef __FLT16_MAX__
  /* compare with the compiler's own round-to-nearest-even conversion on many float patterns */
  ok = 1;
  uint32_t s = 12345;
  for (int i = 0; i < 2000000; i++) {
    s = s * 1664525u + 1013904223u;
    uint32_t u = (i & 1) ? s : (s & 0x807fffffu) | ((uint32_t)(100 + (s >> 8) % 50) << 23);
    float x = bitsf(u);
    _Float16 y = (_Float16)x;
    uint16_t want;
    memcpy(&want, &y, 2);
    ok &= isnan(x) ? (dsv4_f32_to_f16(x) & 0x7fff) > 0x7c00 : dsv4_f32_to_f16(x) == want;
  }
  check(ok, "f32 -> f16 agrees with _Float16 on 2M patterns");
#endif
}

/* I64 and F64 tensors written by hand. */
static void test_i64_f64(void) {
  const char *p = tpath("i64.safetensors");
  int64_t d[6] = {5, -7, INT32_MAX, INT32_MIN, 3, (int64_t)INT32_MAX + 1};
  double g[2] = {0.1, -1e300};
  unsigned char data[64];
  memcpy(data, d, 48);
  memcpy(data + 48, g, 16);
  const char *json = "{\"ok\":{\"dtype\":\"I64\",\"shape\":[2,2],\"data_offsets\":[0,32]},"
                     "\"big\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[32,48]},"
                     "\"dbl\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[48,64]},"
                     "\"__metadata__\":null}";
  write_st(p, strlen(json), json, data, 64);
  dsv4_st_file *f = NULL;
  int32_t o[4];
  float fo[2];
  int ok = dsv4_st_open(&f, p) == DSV4_OK && dsv4_st_count(f) == 3;
  ok = ok && dsv4_st_read_i32(f, dsv4_st_find(f, "ok"), o) == DSV4_OK && o[0] == 5 && o[1] == -7 &&
       o[2] == INT32_MAX && o[3] == INT32_MIN;
  check(ok, "read I64 that fits in int32 (and \"__metadata__\": null accepted)");
  dsv4_clear_error();
  ok = f && dsv4_st_read_i32(f, dsv4_st_find(f, "big"), o) == DSV4_ERR_TENSOR &&
       strstr(dsv4_last_error(), "'big'") && strstr(dsv4_last_error(), p);
  check(ok, "read I64 that does not fit -> DSV4_ERR_TENSOR naming the tensor");
  ok = f && dsv4_st_read_f32(f, dsv4_st_find(f, "dbl"), fo) == DSV4_OK && fo[0] == 0.1f && fo[1] == -INFINITY;
  check(ok, "read F64 as f32 (rounded, overflow to -inf)");
  dsv4_st_close(f);
  unlink(p);
}

#define T1(dt, shape, offs) "{\"x\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" offs "}}"

/* Malformed files: each must fail at open with the right status, naming file and tensor. */
static void test_bad_files(void) {
  const char *p = tpath("bad.safetensors");
  unsigned char z[256] = {0};
  expect_fail("nonexistent path", tpath("does_not_exist.safetensors"), DSV4_ERR_IO, "cannot open");
  write_bytes(p, "", 0);
  expect_fail("empty file", p, DSV4_ERR_FORMAT, NULL);
  write_bytes(p, "\x05\0\0\0\0", 5);
  expect_fail("5-byte file", p, DSV4_ERR_FORMAT, NULL);
  write_st(p, 100, "{}", NULL, 0);
  expect_fail("header length larger than file", p, DSV4_ERR_FORMAT, "exceeds the file size");
  write_st(p, 1ull << 62, "{}", NULL, 0);
  expect_fail("header length 2^62", p, DSV4_ERR_FORMAT, "limit");
  write_st(p, 0, "", NULL, 0);
  expect_fail("header length 0", p, DSV4_ERR_FORMAT, "JSON");
  const char *garbage = "{\"x\": [1, 2,,, nope";
  write_st(p, strlen(garbage), garbage, NULL, 0);
  expect_fail("garbage JSON", p, DSV4_ERR_FORMAT, "not valid JSON");
  write_st(p, 8, "{}  xyz ", NULL, 0);
  expect_fail("bytes after the JSON", p, DSV4_ERR_FORMAT, "after the JSON");
  write_st(p, 5, "[1,2]", NULL, 0);
  expect_fail("JSON array instead of object", p, DSV4_ERR_FORMAT, "not an object");
  struct { const char *what, *json; size_t data; dsv4_status st; const char *sub; } cases[] = {
      {"dtype not a string", "{\"x\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DSV4_ERR_FORMAT,
       "'x'"},
      {"I8 size mismatch", T1("I8", "[4]", "[0,8]"), 8, DSV4_ERR_FORMAT, "do not match dtype I8"},
      {"F4 of an odd count (half a byte)", T1("F4", "[3]", "[0,2]"), 2, DSV4_ERR_FORMAT, "whole bytes"},
      {"unknown dtype past the end", T1("Q7", "[1]", "[0,9]"), 8, DSV4_ERR_FORMAT, "'x'"},
      {"negative shape", T1("F32", "[-1]", "[0,4]"), 4, DSV4_ERR_FORMAT, "'x'"},
      {"fractional shape", T1("F32", "[1.5]", "[0,4]"), 4, DSV4_ERR_FORMAT, "'x'"},
      {"shape not an array", T1("F32", "4", "[0,16]"), 16, DSV4_ERR_FORMAT, "'x'"},
      {"9 dims", T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, DSV4_ERR_FORMAT, "'x'"},
      {"shape product overflows", T1("F32", "[4294967296,4294967296]", "[0,4]"), 4, DSV4_ERR_FORMAT, "'x'"},
      {"shape/offset mismatch", T1("F32", "[4,8]", "[0,100]"), 128, DSV4_ERR_FORMAT,
       "data_offsets [0, 100] do not match dtype F32 and shape [4, 8] (128 bytes)"},
      {"offsets past the end (truncated data)", T1("F32", "[4]", "[0,16]"), 8, DSV4_ERR_FORMAT, "'x'"},
      {"begin > end", T1("F32", "[0]", "[8,4]"), 8, DSV4_ERR_FORMAT, "'x'"},
      {"negative offset", T1("F32", "[1]", "[-4,0]"), 8, DSV4_ERR_FORMAT, "'x'"},
      {"three offsets", T1("F32", "[1]", "[0,4,8]"), 8, DSV4_ERR_FORMAT, "'x'"},
      {"missing data_offsets", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, DSV4_ERR_FORMAT, "'x'"},
      {"missing dtype", "{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, DSV4_ERR_FORMAT, "'x'"},
      {"entry not an object", "{\"x\":[1,2]}", 4, DSV4_ERR_FORMAT, "'x'"},
      {"__metadata__ not an object", "{\"__metadata__\":3}", 0, DSV4_ERR_FORMAT, "__metadata__"},
      {"overlapping tensors",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, DSV4_ERR_FORMAT, "'b'"},
      {"duplicate name",
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, DSV4_ERR_FORMAT, "'a'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_st(p, strlen(cases[i].json), cases[i].json, z, cases[i].data);
    expect_fail(cases[i].what, p, cases[i].st, cases[i].sub);
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (!strcmp(cases[i].what, "overlapping tensors"))
      write_st(p, strlen(cases[i].json), cases[i].json, z, cases[i].data);
  expect_fail("overlap message names both tensors", p, DSV4_ERR_FORMAT,
              "'a' [0, 16] and 'b' [8, 24] overlap");
  unlink(p);
}

/* Released checkpoints mix dtypes the library never reads (I8 experts, FP8, ...): the file opens,
 * sizes are checked per dtype (F4 packs two per byte), and only reading such a tensor fails. */
static void test_other_dtypes(void) {
  const char *p = tpath("mixed.safetensors");
  const char *json = "{\"i8\":{\"dtype\":\"I8\",\"shape\":[2,3],\"data_offsets\":[0,6]},"
                     "\"f8\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[6,8]},"
                     "\"s\":{\"dtype\":\"F8_E8M0\",\"shape\":[1],\"data_offsets\":[8,9]},"
                     "\"f4\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[9,11]},"
                     "\"u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[11,12]},"
                     "\"q7\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[12,15]},"
                     "\"low\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[15,16]},"
                     "\"ok\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}";
  unsigned char data[20] = {1, 2, 3, 4, 5, 6, 0x38, 0xb8, 127};
  float one = 1.5f, o[8];
  memcpy(data + 16, &one, 4);
  write_st(p, strlen(json), json, data, 20);
  dsv4_st_file *f = NULL;
  int ok = dsv4_st_open(&f, p) == DSV4_OK && dsv4_st_count(f) == 8;
  check(ok, "file mixing I8, F8_E4M3, F8_E8M0, F4, U8 and unknown dtypes opens");
  if (!ok) return;
  const dsv4_st_info *t = dsv4_st_find(f, "f8"), *q = dsv4_st_find(f, "q7");
  check(t->dtype == DSV4_DT_F8_E4M3 && !strcmp(t->dtype_name, "F8_E4M3") && dsv4_st_find(f, "s")->dtype ==
        DSV4_DT_F8_E8M0 && dsv4_st_find(f, "i8")->dtype == DSV4_DT_OTHER && q->dtype == DSV4_DT_OTHER &&
        !strcmp(q->dtype_name, "Q7"), "dtypes recognised, other names kept");
  check(dsv4_st_read_f32(f, dsv4_st_find(f, "ok"), o) == DSV4_OK && o[0] == 1.5f, "an F32 tensor next to them reads");
  const char *names[] = {"i8", "f8", "s", "f4", "u8", "q7", "low"};
  const char *dts[] = {"I8", "F8_E4M3", "F8_E8M0", "F4", "U8", "Q7", "f32"};
  ok = 1;
  for (int i = 0; i < 7; i++) {
    dsv4_clear_error();
    char want[64];
    snprintf(want, sizeof want, "has dtype %s", dts[i]);
    ok &= dsv4_st_read_f32(f, dsv4_st_find(f, names[i]), o) == DSV4_ERR_TENSOR &&
          strstr(dsv4_last_error(), want) && strstr(dsv4_last_error(), names[i]);
  }
  check(ok, "reading any of them as floats -> DSV4_ERR_TENSOR naming tensor and dtype");
  unsigned char raw[3] = {0};
  check(dsv4_st_read_bytes(f, t, 0, raw, 2) == DSV4_OK && raw[0] == 0x38 && raw[1] == 0xb8 &&
        dsv4_st_read_bytes(f, q, 1, raw, 2) == DSV4_OK && raw[0] == 0 &&
        dsv4_st_read_bytes(f, t, 1, raw, 2) == DSV4_ERR_ARG, "read_bytes: raw ranges, out of range refused");
  dsv4_st_close(f);
  unlink(p);
}

/* FP8 by bits: all 256 E4M3 codes against ldexp of the formula, E8M0 at 0, 1, 127, 254, 255. */
static void test_fp8(void) {
  int ok = 1;
  for (int b = 0; b < 256; b++) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const float got = dsv4_e4m3_to_f32((uint8_t)b);
    if (e == 15 && m == 7) {
      ok &= isnan(got) != 0;
      continue;
    }
    const double want = (s ? -1.0 : 1.0) * (e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10));
    ok &= (double)got == want && !!signbit(got) == (s != 0);
    if ((double)got != want) printf("    e4m3 0x%02x: got %a want %a\n", b, got, want);
  }
  check(ok && dsv4_e4m3_to_f32(0x7e) == 448.0f && dsv4_e4m3_to_f32(0xfe) == -448.0f &&
        dsv4_e4m3_to_f32(0x01) == 0x1p-9f && dsv4_e4m3_to_f32(0x07) == 7 * 0x1p-9f &&
        dsv4_e4m3_to_f32(0x08) == 0x1p-6f && dsv4_e4m3_to_f32(0x38) == 1.0f,
        "E4M3 all 256 codes by bits (subnormals, 448, -0, NaN at 0x7f/0xff)");
  check(fbits(dsv4_e8m0_to_f32(0)) == 0x00400000u && dsv4_e8m0_to_f32(0) == 0x1p-127f &&
        dsv4_e8m0_to_f32(1) == 0x1p-126f && dsv4_e8m0_to_f32(127) == 1.0f && dsv4_e8m0_to_f32(120) == 0x1p-7f &&
        dsv4_e8m0_to_f32(254) == 0x1p127f && isnan(dsv4_e8m0_to_f32(255)),
        "E8M0 bytes 0 (2^-127 subnormal), 1, 120 (2^-7, not 120.0), 127, 254, 255 (NaN)");
}

/* Paths that are not regular files: one true message, no hang on a FIFO. */
static void test_not_regular(void) {
  const char *fifo = tpath("fifo.safetensors");
  expect_fail("a directory says so", dir, DSV4_ERR_IO, "is a directory");
  int ok = mkfifo(fifo, 0600) == 0;
  if (ok) expect_fail("a FIFO says so (and does not block)", fifo, DSV4_ERR_IO, "is a FIFO");
  else check(0, "mkfifo");
  unlink(fifo);
  expect_fail("a character device says so", "/dev/null", DSV4_ERR_IO, "character device");
}

/* Error messages quote names from the file: control bytes and bytes >= 0x7f come out as \xNN, so
 * the message is one printable line. */
static void test_escaped_messages(void) {
  const char *p = tpath("esc.safetensors");
  const char *json = "{\"a\\nb\\u001b[31m\":{\"dtype\":\"I\\n8\u00e9\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  unsigned char z[4] = {0};
  float o[1];
  write_st(p, strlen(json), json, z, 4);
  dsv4_st_file *f = NULL;
  int ok = dsv4_st_open(&f, p) == DSV4_OK;
  ok = ok && dsv4_st_read_f32(f, dsv4_st_at(f, 0), o) == DSV4_ERR_TENSOR;
  const char *m = dsv4_last_error();
  int printable = 1;
  for (const char *c = m; *c; c++) printable &= *c >= 0x20 && *c < 0x7f;
  ok = ok && printable && strstr(m, "'a\\x0ab\\x1b[31m'") && strstr(m, "I\\x0a8\\xc3\\xa9");
  check(ok, "tensor name and dtype with newline, ESC and UTF-8 are escaped as \\xNN in the message");
  if (!ok) printf("    message: %s\n", m);
  dsv4_st_close(f);
  unlink(p);
}

/* A valid file truncated on disk, before open and after open. */
static void test_truncated(void) {
  const char *p = tpath("trunc.safetensors");
  float a[64], b[64], o[64];
  for (int i = 0; i < 64; i++) a[i] = (float)i, b[i] = -(float)i;
  int64_t s[1] = {64};
  dsv4_st_writer *w = NULL;
  dsv4_st_writer_create(&w);
  dsv4_st_writer_add(w, "first", DSV4_DT_F32, 1, s, a);
  dsv4_st_writer_add(w, "last", DSV4_DT_F32, 1, s, b);
  int ok = dsv4_st_writer_save(w, p) == DSV4_OK;
  dsv4_st_writer_free(w);
  struct stat st;
  ok = ok && stat(p, &st) == 0 && truncate(p, st.st_size - 4) == 0;
  check(ok, "write and truncate a valid file");
  expect_fail("writer file truncated after the header", p, DSV4_ERR_FORMAT, "'last'");
  /* rewrite, open, then truncate under the open handle: the read must fail, not crash */
  w = NULL;
  dsv4_st_writer_create(&w);
  dsv4_st_writer_add(w, "first", DSV4_DT_F32, 1, s, a);
  dsv4_st_writer_add(w, "last", DSV4_DT_BF16, 1, s, b);
  ok = dsv4_st_writer_save(w, p) == DSV4_OK;
  dsv4_st_writer_free(w);
  dsv4_st_file *f = NULL;
  ok = ok && dsv4_st_open(&f, p) == DSV4_OK && stat(p, &st) == 0 && truncate(p, st.st_size - 100) == 0;
  dsv4_clear_error();
  ok = ok && dsv4_st_read_f32(f, dsv4_st_find(f, "first"), o) == DSV4_OK && !memcmp(o, a, sizeof a);
  ok = ok && dsv4_st_read_f32(f, dsv4_st_find(f, "last"), o) == DSV4_ERR_FORMAT &&
       strstr(dsv4_last_error(), "'last'") && strstr(dsv4_last_error(), p);
  check(ok, "file truncated after open: read -> DSV4_ERR_FORMAT naming file and tensor");
  dsv4_st_close(f);
  unlink(p);
}

/* Writer argument errors, unwritable targets, and a failed write leaving no file behind. */
static void test_writer_errors(void) {
  float a[4] = {1, 2, 3, 4};
  int64_t s[1] = {4}, neg[2] = {2, -2};
  dsv4_st_writer *w = NULL;
  dsv4_st_writer_create(&w);
  int ok = dsv4_st_writer_add(w, "a", DSV4_DT_F32, 1, s, a) == DSV4_OK;
  ok = ok && dsv4_st_writer_add(w, "a", DSV4_DT_F32, 1, s, a) == DSV4_ERR_ARG &&
       strstr(dsv4_last_error(), "'a'");
  ok = ok && dsv4_st_writer_add(w, "n", DSV4_DT_F32, 2, neg, a) == DSV4_ERR_ARG &&
       strstr(dsv4_last_error(), "'n'");
  ok = ok && dsv4_st_writer_add(w, "d", DSV4_DT_F64, 1, s, a) == DSV4_ERR_ARG;
  ok = ok && dsv4_st_writer_add(w, "d", DSV4_DT_F32, 9, s, a) == DSV4_ERR_ARG;
  ok = ok && dsv4_st_writer_add(w, "d", DSV4_DT_F32, 1, s, NULL) == DSV4_ERR_ARG;
  ok = ok && dsv4_st_writer_add(w, "__metadata__", DSV4_DT_F32, 1, s, a) == DSV4_ERR_ARG;
  ok = ok && dsv4_st_writer_add(w, "", DSV4_DT_F32, 1, s, a) == DSV4_ERR_ARG;
  ok = ok && dsv4_st_writer_add(NULL, "x", DSV4_DT_F32, 1, s, a) == DSV4_ERR_ARG;
  check(ok, "writer_add rejects duplicate, negative dim, F64, ndim 9, NULL data, reserved/empty name");
  const char *bad = "/nonexistent/dir/x.safetensors";
  ok = dsv4_st_writer_save(w, bad) == DSV4_ERR_IO && strstr(dsv4_last_error(), bad) && access(bad, F_OK) != 0;
  check(ok, "writer to unwritable directory -> DSV4_ERR_IO naming the path");

  /* a write that fails half way (file size limit -> EFBIG) keeps the old target and no temp file */
  const char *p = tpath("keep.safetensors");
  ok = dsv4_st_writer_save(w, p) == DSV4_OK;
  struct stat st0, st1;
  ok = ok && stat(p, &st0) == 0;
  static float big[1 << 18];
  int64_t sb[1] = {1 << 18};
  ok = ok && dsv4_st_writer_add(w, "big", DSV4_DT_F32, 1, sb, big) == DSV4_OK;
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 65536;
  signal(SIGXFSZ, SIG_IGN);
  setrlimit(RLIMIT_FSIZE, &lim);
  dsv4_status rc = dsv4_st_writer_save(w, p);
  setrlimit(RLIMIT_FSIZE, &old);
  char tmpl[700];
  snprintf(tmpl, sizeof tmpl, "%s.tmp%ld.", p, (long)getpid());
  int leftovers = 0;
  for (unsigned k = 0; k < 10; k++) {
    char q[720];
    snprintf(q, sizeof q, "%s%u", tmpl, k);
    leftovers += access(q, F_OK) == 0;
  }
  ok = ok && rc == DSV4_ERR_IO && strstr(dsv4_last_error(), p) && stat(p, &st1) == 0 &&
       st1.st_size == st0.st_size && !leftovers;
  check(ok, "failed write (EFBIG) -> DSV4_ERR_IO, old file intact, temp file removed");
  dsv4_st_file *f = NULL;
  ok = dsv4_st_open(&f, p) == DSV4_OK && dsv4_st_count(f) == 1;
  check(ok, "old file still valid after failed save");
  dsv4_st_close(f);
  unlink(p);
  dsv4_st_writer_free(w);
}

int main(void) {
  const char *td = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test_safetensors.XXXXXX", td && *td ? td : "/tmp");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
  test_conversions();
  test_roundtrip();
  test_i64_f64();
  test_fp8();
  test_bad_files();
  test_other_dtypes();
  test_not_regular();
  test_escaped_messages();
  test_truncated();
  test_writer_errors();
  check(rmdir(dir) == 0, "no files left in the temporary directory");
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
