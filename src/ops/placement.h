/* placement.h: the placements the core attention passes to the three operators (SPEC 5 table), and
 * the layout check the two-phase sparse attention runs before its phases. */
#ifndef DSV4_PLACEMENT_H
#define DSV4_PLACEMENT_H

#include "dsv4cp_ops.h"

/* Infer rule of sparse_attn_sharedkv plus: a WINDOW(h) ori_kv has exactly S1 + h rows. */
dsv4_status dsv4_attn_layout_check(const dsv4_attn_args *a, int nranks, const dsv4_placement in[5]);

/* What the core passes: queries SHARD(seq), raw kv WINDOW(halo rows), compressed keys REPLICATE. */
static inline void dsv4_attn_places(dsv4_placement p[5], int64_t halo) {
  p[0] = (dsv4_placement){DSV4_PLACE_SHARD_SEQ, 0};
  p[1] = (dsv4_placement){DSV4_PLACE_WINDOW, halo};
  p[2] = (dsv4_placement){DSV4_PLACE_REPLICATE, 0};
  p[3] = (dsv4_placement){DSV4_PLACE_SHARD_SEQ, 0};
  p[4] = (dsv4_placement){DSV4_PLACE_REPLICATE, 0};
}
static inline void dsv4_indexer_places(dsv4_placement p[3]) {
  p[0] = p[2] = (dsv4_placement){DSV4_PLACE_SHARD_SEQ, 0};
  p[1] = (dsv4_placement){DSV4_PLACE_REPLICATE, 0};
}
static inline void dsv4_kl_places(dsv4_placement p[6]) {
  for (int i = 0; i < 6; i++) p[i] = (dsv4_placement){DSV4_PLACE_SHARD_SEQ, 0};
  p[1] = p[4] = (dsv4_placement){DSV4_PLACE_REPLICATE, 0};
}

#endif
