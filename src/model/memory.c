/* memory.c: the bytes a training forward keeps for the backward, from shapes alone. One formula
 * serves the measurement (dsv4_layer_saved_bytes) and the plan (dsv4_cp_plan_memory), so the two
 * cannot drift apart. What is kept, per local row (n rows):
 *   layer: a, qr [dq]; q, o [H D]; c, kv [D]; u [G Ro]; inverse rms of a, c and each head [2 + H];
 *          global index, position, real flag
 *   core:  lse [H]; window start and length; kv_ext [R_kv, D] (CP); compressor projections
 *          C, Z [R_c, c D] (r > 0) and the global compressed kv [n_cmp, D], slot tables, visible
 *          ranges; r == 4: indexer C, Z [R_c, 2 Di], keys [n_cmp, Di], queries [n, Hi Di],
 *          weights [n, Hi], top-k ids and scores [n, k], and the KL teacher [n, k] (sparse mode). */
#include "model/core_internal.h"

size_t dsv4_saved_bytes_formula(const dsv4_config *c, int ratio, int64_t n_, int64_t R_kv, int ext_kv,
                                int64_t R_c, int64_t n_slot, int64_t n_cmp) {
  const size_t n = (size_t)n_, H = (size_t)c->n_heads, D = (size_t)c->head_dim, dq = (size_t)c->q_lora_rank;
  const size_t Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim, k = (size_t)c->index_topk;
  const size_t Rc = (size_t)R_c, cmp = (size_t)n_cmp, cD = (ratio == 4 ? 2 : 1) * D;
  size_t floats = 2 * n * dq + 2 * n * H * D + 2 * n * D + n * (size_t)(c->o_groups * c->o_lora_rank) + n * (2 + H);
  size_t ints = 2 * n, bytes = n * (sizeof(int64_t) + sizeof(int32_t) + 1);
  floats += n * H + (ext_kv ? (size_t)R_kv * D : 0);
  if (ratio > 0) {
    floats += 2 * Rc * cD + cmp * D;
    ints += 4 * (size_t)n_slot + 2 * n;
  }
  if (ratio == 4) {
    floats += 2 * Rc * 2 * Di + cmp * Di + n * Hi * Di + n * Hi + n * k * (c->index_loss_mode == DSV4_KL_SPARSE ? 2 : 1);
    ints += n * k;
  }
  return bytes + sizeof(float) * floats + sizeof(int32_t) * ints;
}
