/* rope.h: rotary position embedding on the last R dims of a vector, interleaved pairs, with the
 * layer's frequencies (SPEC 3: theta and YaRN for r > 0 layers, plain rope_theta for r == 0).
 * Angles are computed in double and stored as float cos/sin in a table of the positions a rank
 * uses (a window [lo, lo + cap), not every position from 0: a rank deep inside a 4M-token document
 * needs L + 2r rows of it, not 4M). An entry depends only on its position, so any window gives the
 * same bits. */
#ifndef DSV4_ROPE_H
#define DSV4_ROPE_H

#include <stdint.h>
#include "dsv4cp_ops.h"

typedef struct {
  int R;            /* rotated dims (qk_rope_head_dim) */
  double *freq;     /* [R/2] */
  int64_t lo, cap;  /* the table holds positions [lo, lo + cap) */
  float *cs;        /* [cap, R/2, 2]: cos, sin of pos * freq[i] */
} dsv4_rope;

dsv4_status dsv4_rope_init(dsv4_rope *r, const dsv4_config *cfg, int ratio);
void dsv4_rope_free(dsv4_rope *r);
/* Makes positions [lo, hi) available (keeping those it had when the two ranges touch); not
 * thread-safe (call before parallel regions). */
dsv4_status dsv4_rope_reserve(dsv4_rope *r, int64_t lo, int64_t hi);
/* Rotates v[dim-R .. dim) by +pos (inverse = 0) or -pos (inverse = 1), in place. */
void dsv4_rope_apply(const dsv4_rope *r, float *v, int dim, int64_t pos, int inverse);

#endif
