/* safetensors.h: reader and writer of the safetensors format (internal to libdsv4cp).
 *
 * Format: 8-byte little-endian header length N, then N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
 * then the data area; offsets are relative to the start of the data area.
 * The reader validates everything against the file size BEFORE any tensor read: header length,
 * JSON syntax, each dtype, shape (non-negative, product fits), offsets (begin <= end <= data size,
 * end - begin == numel * dtype size for every dtype of the safetensors spec), and that tensors do
 * not overlap. Tensors of any dtype may be present (released checkpoints mix I8 experts, FP8 and
 * BF16): only reading a tensor whose dtype this library cannot convert is an error. Errors name
 * the file and the tensor. Tensors are read by byte range (pread), never the whole file.
 */
#ifndef DSV4_SAFETENSORS_H
#define DSV4_SAFETENSORS_H

#include <stdint.h>
#include "dsv4cp.h"

#define DSV4_ST_MAX_DIMS 8

/* Dtypes the library reads (or writes); every other dtype of a file is DSV4_DT_OTHER (its name kept
 * in dsv4_st_info.dtype_name): present, skipped, refused only when read. */
typedef enum {
  DSV4_DT_F32 = 0, DSV4_DT_BF16, DSV4_DT_F16, DSV4_DT_I32, DSV4_DT_F64, DSV4_DT_I64,
  DSV4_DT_F8_E4M3,  /* FP8 weights of released checkpoints (read raw, decoded by dsv4_e4m3_to_f32) */
  DSV4_DT_F8_E8M0,  /* power-of-two scales (read raw, decoded by dsv4_e8m0_to_f32) */
  DSV4_DT_OTHER
} dsv4_dtype;

#define DSV4_ST_DTYPE_NAME 24      /* longest dtype name kept (longer ones are cut) */

typedef struct {
  char *name;
  dsv4_dtype dtype;
  char dtype_name[DSV4_ST_DTYPE_NAME]; /* the dtype as the file writes it ("I8", "F8_E4M3", ...) */
  int ndim;
  int64_t shape[DSV4_ST_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end;       /* byte offsets in the data area */
} dsv4_st_info;

typedef struct dsv4_st_file dsv4_st_file;

const char *dsv4_dtype_name(dsv4_dtype dt);
int dsv4_dtype_size(dsv4_dtype dt);

/* Opens and fully validates a file. */
dsv4_status dsv4_st_open(dsv4_st_file **out, const char *path);
/* The same on a descriptor already open for reading (the file takes it: closed by dsv4_st_close,
 * or here on failure); path names the file in messages. */
dsv4_status dsv4_st_open_fd(dsv4_st_file **out, int fd, const char *path);
void dsv4_st_close(dsv4_st_file *f);
int dsv4_st_count(const dsv4_st_file *f);
const dsv4_st_info *dsv4_st_at(const dsv4_st_file *f, int i);
/* NULL when absent (no error recorded). */
const dsv4_st_info *dsv4_st_find(const dsv4_st_file *f, const char *name);
const char *dsv4_st_path(const dsv4_st_file *f);
/* Reads a tensor converting F32/BF16/F16/F64 to fp32 (dst has numel floats). Other dtypes are
 * rejected (FP8 is dequantised by src/io/checkpoint.c, which needs the scale tensor too). */
dsv4_status dsv4_st_read_f32(dsv4_st_file *f, const dsv4_st_info *t, float *dst);
/* Reads elements [e0, e0 + count) of a float tensor into fp32 (a rank's own rows of an input). */
dsv4_status dsv4_st_read_f32_range(dsv4_st_file *f, const dsv4_st_info *t, int64_t e0, int64_t count, float *dst);
/* Reads an I32 (or I64 whose values fit in int32) tensor. Float dtypes are rejected. */
dsv4_status dsv4_st_read_i32(dsv4_st_file *f, const dsv4_st_info *t, int32_t *dst);
/* Reads n raw bytes of tensor t starting at byte `offset` of its data (any dtype). */
dsv4_status dsv4_st_read_bytes(dsv4_st_file *f, const dsv4_st_info *t, uint64_t offset, void *dst, size_t n);
/* "[4, 8]" into buf (cut to cap). */
const char *dsv4_st_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim);

/* Writer: collects borrowed pointers, then writes the file in one pass (data must stay valid
 * until dsv4_st_writer_save returns). Tensors are written in the order added. */
typedef struct dsv4_st_writer dsv4_st_writer;
dsv4_status dsv4_st_writer_create(dsv4_st_writer **out);
void dsv4_st_writer_free(dsv4_st_writer *w);
/* dtype F32 (data is float*) or I32 (int32_t*) or BF16/F16 (data is float*, converted with
 * round-to-nearest-even on save). The name is copied. Duplicate names are an error. */
dsv4_status dsv4_st_writer_add(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                               const int64_t *shape, const void *data);
/* A tensor (F32 or I32) whose data is produced while the file is written, so that it is never
 * held whole: save calls fill(ctx, row0, n, dst) for consecutive row ranges of at most
 * rows_per_call rows (a row is the last dimension), dst holding n rows. */
typedef dsv4_status (*dsv4_st_fill_fn)(void *ctx, int64_t row0, int64_t n, void *dst);
dsv4_status dsv4_st_writer_add_rows(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                                    const int64_t *shape, int64_t rows_per_call, dsv4_st_fill_fn fill, void *ctx);
/* Writes the file and puts it at path only when complete (src/io/outfile.h): path must be absent
 * or a regular file (a directory, device, FIFO or symbolic link is refused, before anything is
 * written); a failure leaves the old file and no temporary. The contents go to an unnamed
 * O_TMPFILE file, or where the filesystem lacks it to "<path>.tmp<pid>.<k>", whose path is then in
 * the pending-file registry while the save runs. */
dsv4_status dsv4_st_writer_save(dsv4_st_writer *w, const char *path);

/* For a program's SIGINT/SIGTERM handler (the library installs none): unlinks the named temporary
 * file of every dsv4_st_writer_save in progress (an unnamed one needs nothing: the kernel frees
 * it). Async-signal-safe: it reads a fixed registry published with lock-free atomics and calls
 * only unlink(2). Implemented in src/io/outfile.c. */
void dsv4_st_remove_pending(void);

/* fp conversions (exposed for tests) */
float dsv4_bf16_to_f32(uint16_t h);
float dsv4_f16_to_f32(uint16_t h);
uint16_t dsv4_f32_to_bf16(float f);
uint16_t dsv4_f32_to_f16(float f);
/* FP8 E4M3 ("fn": no infinities) by bits: sign b>>7, e = (b>>3)&15, m = b&7; e == 0: m * 2^-9,
 * else (8+m) * 2^(e-10); e == 15 && m == 7 is NaN. Largest finite 448. */
float dsv4_e4m3_to_f32(uint8_t b);
/* E8M0 (ue8m0) scale by bits: 2^(b-127); b = 0 is 2^-127 (an fp32 subnormal); b = 255 is NaN. */
float dsv4_e8m0_to_f32(uint8_t b);

#endif
