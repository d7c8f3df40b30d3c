/* shard.h: which global rows a rank holds: the segments of the split (SPEC 5). */
#ifndef DSV4_SHARD_H
#define DSV4_SHARD_H

#include <stdint.h>
#include "dsv4cp.h"
#include "plan/docs.h"

/* The segments of rank `rank` of `size`, in the order their rows are stored locally. The only
 * requirement is that the unit (stream, or each sequence of a batch) divides into size slices
 * (2 size chunks for zigzag); segments need not align with documents or compression windows.
 * *segs is allocated (caller frees). Errors depend only on global values, so every rank reports
 * the same. */
dsv4_status dsv4_shard_segments(const dsv4_packing *pk, dsv4_split split, int rank, int size, dsv4_range **segs,
                                int *n_seg);

#endif
