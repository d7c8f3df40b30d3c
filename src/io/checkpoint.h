/* checkpoint.h: a checkpoint as the weight loader sees it (internal to libdsv4cp).
 *
 * A checkpoint is one safetensors file, or the shards named by a model.safetensors.index.json
 * ({"weight_map": {tensor name: shard file}}, shard paths relative to the index's directory), or a
 * directory holding either. Tensors are looked up by their full name. A shard is opened (its header
 * read and validated) only when one of its tensors is needed, and only once; tensor data is read by
 * byte range, never a whole shard.
 *
 * FP8 weights (DeepSeek's released V4 files): an F8_E4M3 tensor `<p>weight` [rows, cols] comes with a
 * scale sibling `<p>scale` (or `<p>weight_scale_inv`), F8_E8M0 (or F32/BF16/F16 holding powers of
 * two in E8M0's range 2^-127..2^127: anything else is an error), shape
 * [ceil(rows/b0), ceil(cols/b1)] for the block size b0 x b1 (quantization_config.weight_block_size);
 * the last block row/column may be partial. It reads as W[n][k] = e4m3(Wq[n][k]) * S[n/b0][k/b1],
 * decoded by bits, exact in fp32.
 */
#ifndef DSV4_CHECKPOINT_H
#define DSV4_CHECKPOINT_H

#include "io/safetensors.h"

#define DSV4_CKPT_INDEX_NAME "model.safetensors.index.json"
#define DSV4_CKPT_SINGLE_NAME "model.safetensors"

typedef struct dsv4_ckpt dsv4_ckpt;

/* Where one weight is stored: the tensor, and for F8_E4M3 its scale and block size. */
typedef struct {
  dsv4_st_file *file;
  const dsv4_st_info *t;
  const char *shard;          /* shard file as the index names it (or the single file's path) */
  dsv4_st_file *scale_file;   /* NULL unless t is F8_E4M3 */
  const dsv4_st_info *scale;
  const char *scale_shard;
  int block[2];               /* rows x cols of weight per scale entry */
} dsv4_ckpt_tensor;

/* Opens a .safetensors file, an index .json file, or a directory holding model.safetensors.index.json,
 * model.safetensors, or exactly one .safetensors file. The index is parsed and every shard path
 * checked (relative, no ".." component) here; no shard is opened yet. Every file the checkpoint
 * names (shards, and the file a directory stands for) is opened beneath its directory, following
 * only links that stay inside, or a Hugging Face snapshot's links to its repository's blobs
 * (src/io/ckpt_dir.h); a path the caller names is opened as named. */
dsv4_status dsv4_ckpt_open(dsv4_ckpt **out, const char *path);
void dsv4_ckpt_close(dsv4_ckpt *c);
/* The index file or the single file actually used. */
const char *dsv4_ckpt_path(const dsv4_ckpt *c);
/* Number of distinct shard files the index names (1 for a single file) and how many are open. */
int dsv4_ckpt_shards(const dsv4_ckpt *c, int *opened);
/* 1 when the checkpoint names the tensor (weight_map, or the single file's header). */
int dsv4_ckpt_has(const dsv4_ckpt *c, const char *name);
/* Finds a tensor, opening its shard if needed. Errors (one line each, naming file and tensor): not
 * in the checkpoint, shard missing or unreadable, listed in the index but absent from its shard. */
dsv4_status dsv4_ckpt_get(dsv4_ckpt *c, const char *name, dsv4_st_file **f, const dsv4_st_info **t,
                          const char **shard);
/* dsv4_ckpt_get, then for an F8_E4M3 tensor its scale (block = b0 x b1): exactly one of the two
 * sibling names, a scale dtype, and the shape [ceil(rows/b0), ceil(cols/b1)] are required. */
dsv4_status dsv4_ckpt_locate(dsv4_ckpt *c, const char *name, const int block[2], dsv4_ckpt_tensor *out);
/* Reads a located tensor into dst (numel floats): F32/BF16/F16/F64 converted, F8_E4M3 dequantised.
 * A NaN code, a NaN scale or a non-finite product is an error naming the tensor and the element. */
dsv4_status dsv4_ckpt_read_f32(const dsv4_ckpt_tensor *t, float *dst);
/* Bytes read from the files for a located tensor (weight plus scale). */
uint64_t dsv4_ckpt_bytes(const dsv4_ckpt_tensor *t);

#endif
