/* safetensors.h: reader and writer of the safetensors format (the API is public: dsv4cp_io.h).
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
#include "dsv4cp_io.h"

/* The public part (dtypes, dsv4_st_info, reader, writer) is in dsv4cp_io.h; these are internal. */
int dsv4_dtype_size(dsv4_dtype dt);
/* Reads n raw bytes of tensor t starting at byte `offset` of its data (any dtype). */
dsv4_status dsv4_st_read_bytes(dsv4_st_file *f, const dsv4_st_info *t, uint64_t offset, void *dst, size_t n);
/* dsv4_st_open on a descriptor already open for reading (the file takes it: closed by dsv4_st_close,
 * or here on failure); path names the file in messages. */
dsv4_status dsv4_st_open_fd(dsv4_st_file **out, int fd, const char *path);
/* The writer's save (dsv4cp_io.h) goes through src/io/outfile.h: an unnamed O_TMPFILE file, or where
 * the filesystem lacks it "<path>.tmp<pid>.<k>", whose path is then in the pending-file registry
 * (dsv4_st_remove_pending, src/io/outfile.c) while the save runs. */

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
