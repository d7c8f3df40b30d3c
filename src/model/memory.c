/* memory.c: the bytes a training forward keeps for the backward, from shapes alone. One formula
 * serves the measurement (dsv4_layer_saved_bytes) and the plan (dsv4_cp_plan_memory), so the two
 * cannot drift apart. What is kept, per local row (n rows):
 *   layer: a, qr [dq]; c, kv [D]; u [G Ro]; inverse rms of a and c [2]; global index, position,
 *          real flag; without recomputation also q, o [H D] and each head's inverse rms [H]
 *   core:  lse [H]; window start and length; kv_ext [R_kv, D] (CP); compressor projections
 *          C, Z [R_c, c D] (r > 0) and the global compressed kv [n_cmp, D], slot tables, visible
 *          ranges; r == 4: indexer C, Z [R_c, 2 Di], keys [n_cmp, Di], top-k ids and scores
 *          [n, k], the KL teacher [n, k] (sparse mode); without recomputation also the indexer
 *          queries [n, Hi Di] and weights [n, Hi].
 * With recomputation q, o (2 H D floats a row: 256 KiB at V4-Flash sizes, most of the total) and
 * the indexer queries are rebuilt chunk by chunk in the backward (layer.c, core_bwd.c). */
#include "model/core_internal.h"

size_t dsv4_saved_bytes_formula(const dsv4_config *c, int ratio, int64_t n_, int64_t R_kv, int ext_kv,
                                int64_t R_c, int64_t n_slot, int64_t n_cmp, int recompute) {
  const size_t n = (size_t)n_, H = (size_t)c->n_heads, D = (size_t)c->head_dim, dq = (size_t)c->q_lora_rank;
  const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim, k = (size_t)c->index_topk;
  const size_t Rc = (size_t)R_c, cmp = (size_t)n_cmp, cD = (ratio == 4 ? 2 : 1) * D;
  size_t floats = 2 * n * dq + 2 * n * D + n * (size_t)(c->o_groups * c->o_lora_rank) + 2 * n;
  size_t ints = 2 * n, bytes = n * (sizeof(int64_t) + sizeof(int32_t) + 1);
  if (!recompute) floats += 2 * n * H * D + n * H;
  floats += n * H + (ext_kv ? (size_t)R_kv * D : 0);
  if (ratio > 0) {
    floats += 2 * Rc * cD + cmp * D;
    ints += 4 * (size_t)n_slot + 2 * n;
  }
  if (ratio == 4) {
    floats += 2 * Rc * 2 * Di + cmp * Di + n * k * (c->index_loss_mode == DSV4_KL_SPARSE ? 2 : 1);
    if (!recompute) floats += n * Hi * Di + n * Hi;
    ints += n * k;
  }
  return bytes + sizeof(float) * floats + sizeof(int32_t) * ints;
}
