/* shard.h: which global rows a rank holds: the segments of the split (SPEC 5). */
#ifndef DSV4_SHARD_H
#define DSV4_SHARD_H

#include <stdint.h>
#include "dsv4cp.h"

typedef struct {
  int64_t g0, len;
} dsv4_range;

/* The segments of rank `rank` of `size`, in the order their rows are stored locally. ratio > 0
 * additionally requires every segment to start and end on a multiple of ratio. *segs is
 * allocated (caller frees). Errors depend only on global values, so every rank reports the same. */
dsv4_status dsv4_shard_segments(const dsv4_packing *pk, dsv4_split split, int rank, int size, int ratio,
                                dsv4_range **segs, int *n_seg);

#endif
