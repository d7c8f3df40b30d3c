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

/* The buffers the layer and core hold besides the saved activations (every temporary keeps its
 * largest size in its slot, util/slot.h, so after one training call they all stay resident), plus
 * the largest per-call kernel scratch. Mirrors the DSV4_SLOT sizes of layer.c, core_fwd.c and
 * core_bwd.c; `threads` sizes the per-thread scratch of the attention and KL backward. */
size_t dsv4_transient_bytes_formula(const dsv4_config *c, int ratio, const dsv4_layout *lay, int64_t n_cmp,
                                    int64_t rope_positions, int recompute, int threads) {
  const size_t n = (size_t)lay->n, H = (size_t)c->n_heads, D = (size_t)c->head_dim, dq = (size_t)c->q_lora_rank;
  const size_t d = (size_t)c->dim, Hi = (size_t)c->index_n_heads, Di = (size_t)c->index_head_dim;
  const size_t GRo = (size_t)c->o_groups * (size_t)c->o_lora_rank, HGD = H / (size_t)c->o_groups * D;
  const size_t m = n < DSV4_CHUNK_ROWS ? n : DSV4_CHUNK_ROWS;     /* backward chunk (and recomputing forward) */
  const size_t mf = recompute ? m : n;                            /* forward chunk */
  const size_t Rkv = (size_t)lay->R_kv, Rc = (size_t)lay->R_c, cmp = (size_t)n_cmp;
  const size_t blk = (size_t)lay->n_blk, all = (size_t)lay->n_blk_all, cD = (ratio == 4 ? 2 : 1) * D;
  const size_t nt = threads > 1 ? (size_t)threads : 1;
#define MAX2(a, b) ((a) > (b) ? (a) : (b))
  /* layer: og | g; du; d op; d qr; dkv; recomputation: q, o and head norms of a chunk */
  size_t f = MAX2(mf * HGD, m * d) + m * GRo + m * H * D + m * dq + n * D;
  if (recompute) f += 2 * m * H * D + m * H;
  /* core: backward accumulators d kv_ext, d cmp, d KI; window state | d qI; recomputed lse | d w */
  f += Rkv * D + (ratio > 0 ? cmp * D : 0) + (ratio == 4 ? cmp * Di : 0);
  f += MAX2(2 * n * H, ratio == 4 ? m * Hi * Di : 0) + MAX2(recompute ? m * H : 0, ratio == 4 ? m * Hi : 0);
  if (ratio > 0) /* slot buffers and their gradients | dC, dZ of the compressor backward */
    f += MAX2(blk * D, all * D) + MAX2(all * D, blk * D) + 2 * MAX2(ratio == 4 ? all * Di : 0, Rc * cD);
  if (ratio == 4) f += 2 * n + (recompute ? m * Hi * Di + m * Hi : 0); /* KL rows (doubles); chunk qI, wI */
  /* per-call kernel scratch: the attention backward's private key gradients of threads 1.. */
  f += (nt - 1) * (Rkv * D + cmp * D + H);
  /* token map (global index, document, position, real), RoPE table of the positions used */
  size_t bytes = n * (sizeof(int64_t) + 2 * sizeof(int32_t) + 1);
  size_t rope_rows = 256;
  while (rope_rows < (size_t)rope_positions) rope_rows *= 2;
  bytes += rope_rows * (size_t)c->rope_dim * sizeof(float);
  if (ratio > 0) bytes += cmp * sizeof(int32_t); /* gather index */
#undef MAX2
  return bytes + sizeof(float) * f;
}
