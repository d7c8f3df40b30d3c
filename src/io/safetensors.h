/* safetensors.h: reader and writer of the safetensors format (internal to libdsv4cp).
 *
 * Format: 8-byte little-endian header length N, then N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
 * then the data area; offsets are relative to the start of the data area.
 * The reader validates everything against the file size BEFORE any tensor read: header length,
 * JSON syntax, each dtype, shape (non-negative, product fits), offsets (begin <= end <= data size,
 * end - begin == numel * dtype size), and that tensors do not overlap. Errors name the file and
 * the tensor.
 */
#ifndef DSV4_SAFETENSORS_H
#define DSV4_SAFETENSORS_H

#include <stdint.h>
#include "dsv4cp.h"

#define DSV4_ST_MAX_DIMS 8

typedef enum { DSV4_DT_F32 = 0, DSV4_DT_BF16, DSV4_DT_F16, DSV4_DT_I32, DSV4_DT_F64, DSV4_DT_I64 } dsv4_dtype;

typedef struct {
  char *name;
  dsv4_dtype dtype;
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
void dsv4_st_close(dsv4_st_file *f);
int dsv4_st_count(const dsv4_st_file *f);
const dsv4_st_info *dsv4_st_at(const dsv4_st_file *f, int i);
/* NULL when absent (no error recorded). */
const dsv4_st_info *dsv4_st_find(const dsv4_st_file *f, const char *name);
const char *dsv4_st_path(const dsv4_st_file *f);
/* Reads a tensor converting F32/BF16/F16/F64 to fp32 (dst has numel floats). I32/I64 are rejected. */
dsv4_status dsv4_st_read_f32(dsv4_st_file *f, const dsv4_st_info *t, float *dst);
/* Reads an I32 (or I64 whose values fit in int32) tensor. Float dtypes are rejected. */
dsv4_status dsv4_st_read_i32(dsv4_st_file *f, const dsv4_st_info *t, int32_t *dst);

/* Writer: collects borrowed pointers, then writes the file in one pass (data must stay valid
 * until dsv4_st_writer_save returns). Tensors are written in the order added. */
typedef struct dsv4_st_writer dsv4_st_writer;
dsv4_status dsv4_st_writer_create(dsv4_st_writer **out);
void dsv4_st_writer_free(dsv4_st_writer *w);
/* dtype F32 (data is float*) or I32 (int32_t*) or BF16/F16 (data is float*, converted with
 * round-to-nearest-even on save). The name is copied. Duplicate names are an error. */
dsv4_status dsv4_st_writer_add(dsv4_st_writer *w, const char *name, dsv4_dtype dtype, int ndim,
                               const int64_t *shape, const void *data);
dsv4_status dsv4_st_writer_save(dsv4_st_writer *w, const char *path);

/* fp conversions (exposed for tests) */
float dsv4_bf16_to_f32(uint16_t h);
float dsv4_f16_to_f32(uint16_t h);
uint16_t dsv4_f32_to_bf16(float f);
uint16_t dsv4_f32_to_f16(float f);

#endif
