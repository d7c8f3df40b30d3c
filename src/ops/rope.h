/* rope.h: rotary position embedding on the last R dims of a vector, interleaved pairs, with the
 * layer's frequencies (SPEC 3: theta and YaRN for r > 0 layers, plain rope_theta for r == 0).
 * Angles are computed in double and stored as float cos/sin in a table of the positions a rank
 * uses (a window [lo, lo + cap), or a few ranges, not every position from 0: a rank deep inside a
 * 4M-token document needs L + 2r rows of it, not 4M, and a zigzag rank's two chunks, at both ends
 * of the sequence, two ranges, not the whole sequence between them). An entry depends only on its
 * position, so any table gives the same bits. */
#ifndef DSV4_ROPE_H
#define DSV4_ROPE_H

#include <stdint.h>
#include "dsv4cp_ops.h"

#define DSV4_ROPE_RANGES 8

/* Position ranges [lo[j], hi[j]): sorted, disjoint, not touching; at most DSV4_ROPE_RANGES. */
typedef struct {
  int n;
  int64_t lo[DSV4_ROPE_RANGES], hi[DSV4_ROPE_RANGES];
} dsv4_rope_ranges;

/* Adds [lo, hi) (merged with the ranges it overlaps or touches; when that makes one range too
 * many, the two with the smallest gap between them become one), and the positions s holds. */
void dsv4_rope_ranges_add(dsv4_rope_ranges *s, int64_t lo, int64_t hi);
int64_t dsv4_rope_ranges_positions(const dsv4_rope_ranges *s);

typedef struct {
  int R;               /* rotated dims (qk_rope_head_dim) */
  double *freq;        /* [R/2] */
  int64_t lo, cap;     /* the lowest position held, and the table's rows */
  dsv4_rope_ranges rg; /* the positions held: position p of range j is row off[j] + p - lo[j] */
  int64_t off[DSV4_ROPE_RANGES];
  float *cs; /* [cap, R/2, 2]: cos, sin of pos * freq[i] */
} dsv4_rope;

dsv4_status dsv4_rope_init(dsv4_rope *r, const dsv4_config *cfg, int ratio);
void dsv4_rope_free(dsv4_rope *r);
/* Makes positions [lo, hi) available (keeping those it had when the two ranges touch); not
 * thread-safe (call before parallel regions). */
dsv4_status dsv4_rope_reserve(dsv4_rope *r, int64_t lo, int64_t hi);
/* Makes exactly the positions of s available (what the table held goes); not thread-safe. */
dsv4_status dsv4_rope_reserve_ranges(dsv4_rope *r, const dsv4_rope_ranges *s);
/* 1 when the table holds position pos. */
int dsv4_rope_has(const dsv4_rope *r, int64_t pos);
/* Rotates v[dim-R .. dim) by +pos (inverse = 0) or -pos (inverse = 1), in place. */
void dsv4_rope_apply(const dsv4_rope *r, float *v, int dim, int64_t pos, int inverse);

#endif
