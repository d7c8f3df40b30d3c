/* compressor.h: the KV compressor (docs/spec.md section 3 step 3; V4.1: section 10 step 3):
 * pooling, RMSNorm, RoPE at j*r, on projections C = wkv x and Z = wgate x computed by the caller
 * (so CP can add halo rows in front).
 *
 * Slot s pools rows cur_row[s] .. cur_row[s]+r-1 (for r == 4 the second half of the channels) and,
 * for r == 4 when prev_row[s] >= 0, rows prev_row[s] .. +3 (first half of the channels):
 *   pooled[e] = sum_rows softmax_rows(Z[row][ch] + ape[t][ch]) * C[row][ch]
 *   latent[s] = RMSNorm_{norm_w}(pooled);   out[s] = RoPE_{pos[s]}(latent[s])
 * Ratios 4 and 128 (V4, with APE) and 1 and 2 (V4.1: ape NULL, no overlap; r = 1 has no gate,
 * Z NULL: the slot is its row, pooled = C). The same operator serves the main compressor (D) and
 * V4's indexer compressor (Di). */
#ifndef DSV4_COMPRESSOR_H
#define DSV4_COMPRESSOR_H

#include <stdint.h>
#include "dsv4cp_ops.h"
#include "rope.h"

typedef struct {
  float *out;               /* [rows_out, D]: slot s is written to row out_row[s] */
  const int32_t *out_row;   /* [n_slots] may be NULL: slot s goes to row s */
  const float *C;           /* [rows, c*D] values  (c = 2 for r == 4, else 1) */
  const float *Z;           /* [rows, c*D] gate logits; NULL only for r == 1 (one row per slot) */
  const float *ape;         /* [r, c*D]; NULL: no positional bias (V4.1) */
  const float *norm_w;      /* [D] */
  const int32_t *cur_row;   /* [n_slots] first row of the slot's own window */
  const int32_t *prev_row;  /* [n_slots] first row of the previous window, -1 = none (r == 4) */
  const int32_t *pos;       /* [n_slots] RoPE position (document-local j * r) */
  const dsv4_rope *rope;
  int64_t n_slots;
  int ratio, D;
  double eps;
  int64_t rows;             /* rows of C and Z (bounds every cur_row / prev_row window) */
  int64_t rows_out;         /* rows of out (bounds out_row) */
  float *latent;            /* [rows_out, D] out, may be NULL: RMSNorm(pooled) before RoPE, at out_row
                               (V4.1's indexer keys are made from it) */
} dsv4_compress_args;

typedef struct {
  float *dC;                /* [rows, c*D] accumulated */
  float *dZ;                /* [rows, c*D] accumulated (NULL when Z is) */
  float *d_ape;             /* [r, c*D] accumulated (NULL when ape is) */
  float *d_norm_w;          /* [D] accumulated */
  const float *d_out;       /* [rows_out, D], read at out_row[s] like the forward's out */
  dsv4_compress_args fwd;   /* the forward's arguments (out ignored) */
} dsv4_compress_bwd_args;

/* Row of out (and d_out) that slot s uses. */
static inline int64_t dsv4_compress_out_row(const dsv4_compress_args *a, int64_t s) {
  return a->out_row ? a->out_row[s] : s;
}

/* Validates ratio and every row index against rows / rows_out (errors name the argument). */
dsv4_status dsv4_compress_check(const dsv4_compress_args *a);

dsv4_status dsv4_compress(const dsv4_compress_args *a);
dsv4_status dsv4_compress_ref(const dsv4_compress_args *a);
dsv4_status dsv4_compress_bwd(const dsv4_compress_bwd_args *a);
dsv4_status dsv4_compress_bwd_ref(const dsv4_compress_bwd_args *a);

#endif
