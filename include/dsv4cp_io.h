/* dsv4cp_io.h: what a program around the layer needs besides the layer, as the dsv4cp program
 * itself uses it: safetensors files read by element ranges (a rank reads only its own rows) and
 * written with tensors produced while the file is written (a rank 0 that gathers rows never holds
 * them whole), checkpoints (where each of a layer's tensors is stored, then loading them), seeded
 * random values (element i depends only on the seed, the stream and i, so each rank fills exactly
 * its own rows of what one rank fills whole), and printable copies of untrusted strings. */
#ifndef DSV4CP_IO_H
#define DSV4CP_IO_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4cp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {}}
 * then the data. Opening validates everything against the file size before any read (header,
 * dtypes, shapes, offsets, no overlap); tensors of any dtype may be present, only reading one the
 * library cannot convert is an error. Data is read by byte range, never the whole file. Errors name
 * the file and the tensor.
 * ------------------------------------------------------------------------------------------- */
#define DSV4_ST_MAX_DIMS 8
#define DSV4_ST_DTYPE_NAME 24      /* longest dtype name kept (longer ones are cut) */

/* Dtypes the library reads or writes; any other dtype of a file is DSV4_DT_OTHER (its name kept in
 * dsv4_st_info.dtype_name). */
typedef enum {
  DSV4_DT_F32 = 0, DSV4_DT_BF16, DSV4_DT_F16, DSV4_DT_I32, DSV4_DT_F64, DSV4_DT_I64,
  DSV4_DT_F8_E4M3,  /* FP8 weights of released checkpoints */
  DSV4_DT_F8_E8M0,  /* their power-of-two block scales */
  DSV4_DT_OTHER
} dsv4_dtype;

/* One tensor of an open file (owned by the file; fields may be appended in later versions). */
typedef struct {
  char *name;
  dsv4_dtype dtype;
  char dtype_name[DSV4_ST_DTYPE_NAME]; /* as the file writes it ("I8", "F8_E4M3", ...) */
  int ndim;
  int64_t shape[DSV4_ST_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end;       /* byte offsets in the data area */
} dsv4_st_info;

typedef struct dsv4_st_file dsv4_st_file;

DSV4_API const char *dsv4_dtype_name(dsv4_dtype dt);
DSV4_API dsv4_status dsv4_st_open(dsv4_st_file **out, const char *path);
DSV4_API void dsv4_st_close(dsv4_st_file *f);
DSV4_API int dsv4_st_count(const dsv4_st_file *f);
DSV4_API const dsv4_st_info *dsv4_st_at(const dsv4_st_file *f, int i);
/* NULL when absent (no error recorded). */
DSV4_API const dsv4_st_info *dsv4_st_find(const dsv4_st_file *f, const char *name);
DSV4_API const char *dsv4_st_path(const dsv4_st_file *f);
/* A float tensor (F32, BF16, F16, F64) into fp32: all of it (dst: numel floats), or elements
 * [e0, e0 + count) of it in row-major order (a rank's own rows). */
DSV4_API dsv4_status dsv4_st_read_f32(dsv4_st_file *f, const dsv4_st_info *t, float *dst);
DSV4_API dsv4_status dsv4_st_read_f32_range(dsv4_st_file *f, const dsv4_st_info *t, int64_t e0, int64_t count,
                                            float *dst);
/* An I32 tensor (or I64 whose values fit in int32); float dtypes are refused. */
DSV4_API dsv4_status dsv4_st_read_i32(dsv4_st_file *f, const dsv4_st_info *t, int32_t *dst);
/* "[4, 8]" into buf (cut to cap); returns buf. */
DSV4_API const char *dsv4_st_shape_str(char *buf, size_t cap, const int64_t *shape, int ndim);

/* Writer: collects tensors, then writes the file in one pass. Tensors are written in the order added. */
typedef struct dsv4_st_writer dsv4_st_writer;
DSV4_API dsv4_status dsv4_st_writer_create(dsv4_st_writer **out);
DSV4_API void dsv4_st_writer_free(dsv4_st_writer *w);
/* A tensor from memory borrowed until save returns: dtype F32 or I32 (data is float* / int32_t*), or
 * BF16 / F16 (data is float*, rounded to nearest even on save). The name is copied; duplicate names
 * are an error. */
DSV4_API dsv4_status dsv4_st_writer_add(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                                        const int64_t *shape, const void *data);
/* A tensor (F32 or I32) produced while the file is written, so that it is never held whole: save
 * calls fill(ctx, row0, n, dst) for consecutive row ranges of at most rows_per_call rows (a row is
 * the last dimension), dst holding n rows. */
typedef dsv4_status (*dsv4_st_fill_fn)(void *ctx, int64_t row0, int64_t n, void *dst);
DSV4_API dsv4_status dsv4_st_writer_add_rows(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                                             const int64_t *shape, int64_t rows_per_call, dsv4_st_fill_fn fill,
                                             void *ctx);
/* Writes the file through an unnamed temporary and puts it at path only when complete: a failure,
 * a signal or kill -9 leaves the old file as it was and no temporary (docs/checkpoints.md). The
 * path must pass dsv4_output_check, checked again here. */
DSV4_API dsv4_status dsv4_st_writer_save(dsv4_st_writer *w, const char *path);
/* The rule for an output path: absent or a regular file (a device, FIFO, socket, directory or
 * symbolic link is refused: never replaced, never written through) in an existing writable
 * directory. A program checks it before any long work so that a bad path fails first. */
DSV4_API dsv4_status dsv4_output_check(const char *path);
/* For a program's SIGINT / SIGTERM handler (the library installs none): removes the temporary file
 * of every save in progress where the unnamed temporary was not available. Async-signal-safe. */
DSV4_API void dsv4_st_remove_pending(void);

/* ---------------------------------------------------------------------------------------------
 * Checkpoints: a .safetensors file, a model.safetensors.index.json (shards relative to it), or a
 * directory holding one (docs/checkpoints.md). dsv4_weights_load (dsv4cp.h) does open + locate +
 * read in one call; these steps let a program report where every tensor is and time the reads.
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_checkpoint dsv4_checkpoint;

/* Where one tensor of a layer is stored. */
typedef struct {
  DSV4_STRUCT_HEAD;
  const char *name;          /* the name found ("layers.2.attn.wq_a.weight", "mtp.0.attn...", ...) */
  const char *dtype;         /* as stored ("F8_E4M3", "BF16", ...) */
  int ndim;
  int64_t shape[2];
  const char *shard;         /* the file it is in, as the index names it */
  uint64_t bytes;            /* bytes a load reads for it (with its scale) */
  const char *scale_name;    /* FP8: its block scale ("...scale" or "...weight_scale_inv"), else NULL */
  const char *scale_dtype;
  int64_t scale_shape[2];
  const char *scale_shard;
  int block[2];              /* FP8: rows x cols of weight per scale entry */
} dsv4_weight_source;
#define DSV4_WEIGHT_SOURCE_INIT {DSV4_HEAD(dsv4_weight_source)}

/* Opens the checkpoint: the index is parsed and every shard name checked; no shard is opened yet. */
DSV4_API dsv4_status dsv4_checkpoint_open(dsv4_checkpoint **out, const char *path);
DSV4_API void dsv4_checkpoint_close(dsv4_checkpoint *c);
/* The index file or the single file used. */
DSV4_API const char *dsv4_checkpoint_path(const dsv4_checkpoint *c);
/* Shard files the index names (1 for a single file); *opened: how many have been opened so far. */
DSV4_API int dsv4_checkpoint_shards(const dsv4_checkpoint *c, int *opened);
/* Finds every tensor of w's layer (names, dtypes, shapes, FP8 scales checked; no data read):
 * src[i] (dsv4_weights_count(w) entries, each with struct_size set) describes tensor i. Sets the
 * name prefix w reports (dsv4_weights_prefix). Strings stay valid until the checkpoint is closed. */
DSV4_API dsv4_status dsv4_checkpoint_locate(dsv4_checkpoint *c, dsv4_weights *w, dsv4_weight_source *src);
/* Reads the located tensors into w (FP8 dequantised exactly; every value must be finite). */
DSV4_API dsv4_status dsv4_checkpoint_read(dsv4_checkpoint *c, dsv4_weights *w);

/* ---------------------------------------------------------------------------------------------
 * Seeded random values and printable strings
 * ------------------------------------------------------------------------------------------- */
/* The stream of a name (FNV-1a of its bytes): each named tensor draws from its own stream. */
DSV4_API uint64_t dsv4_random_stream(const char *name);
/* dst[j] = scale * u(seed, stream, offset + j) for j < n, u uniform in [-1, 1) with 24 random bits:
 * the values dsv4_weights_init_random and `dsv4cp run` without --input use. */
DSV4_API void dsv4_random_fill(float *dst, int64_t n, uint64_t seed, uint64_t stream, int64_t offset, float scale);
/* Copies src into dst (capacity cap, always NUL-terminated) with every byte < 0x20 or >= 0x7f written
 * as \xNN, so that a name read from a file prints as one line; returns dst. */
DSV4_API char *dsv4_escape(char *dst, size_t cap, const char *src);

#ifdef __cplusplus
}
#endif
#endif
