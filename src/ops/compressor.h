/* compressor.h: the KV compressor of SPEC 3 step 3 (pooling, RMSNorm, RoPE at j*r), on projections
 * C = wkv x and Z = wgate x computed by the caller (so CP can add halo rows in front).
 *
 * Slot s pools rows cur_row[s] .. cur_row[s]+r-1 (for r == 4 the second half of the channels) and,
 * for r == 4 when prev_row[s] >= 0, rows prev_row[s] .. +3 (first half of the channels):
 *   pooled[e] = sum_rows softmax_rows(Z[row][ch] + ape[t][ch]) * C[row][ch]
 *   out[s] = RoPE_{pos[s]}(RMSNorm_{norm_w}(pooled))
 * The same operator serves the main compressor (D) and the indexer compressor (Di). */
#ifndef DSV4_COMPRESSOR_H
#define DSV4_COMPRESSOR_H

#include <stdint.h>
#include "dsv4cp_ops.h"
#include "rope.h"

typedef struct {
  float *out;               /* [rows_out, D]: slot s is written to row out_row[s] */
  const int32_t *out_row;   /* [n_slots] may be NULL: slot s goes to row s */
  const float *C;           /* [rows, c*D] values  (c = 2 for r == 4, else 1) */
  const float *Z;           /* [rows, c*D] gate logits */
  const float *ape;         /* [r, c*D] */
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
} dsv4_compress_args;

typedef struct {
  float *dC;                /* [rows, c*D] accumulated */
  float *dZ;                /* [rows, c*D] accumulated */
  float *d_ape;             /* [r, c*D] accumulated */
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
