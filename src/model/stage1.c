/* stage1.c: Stage 1 of two-stage CP, the global compressed kv (and for r = 4 the global indexer
 * keys), forward and backward (core.h):
 *   forward   compressor projections C = wkv x, Z = wgate x of the local rows (global panels, so a
 *             row's bits do not depend on the rank holding it), the compressor halo (projected C/Z
 *             rows of slots that straddle a segment start: 2 c D floats a row instead of d), pooling
 *             of the slots this rank owns into its slot buffer, the all-gather of every rank's slot
 *             buffer, select-and-pad: out[id] = all[gather[id]];
 *   backward  scatter through the gather index (its transpose), reduce-scatter to the owners,
 *             compressor backward, halo row gradients back to the ranks that sent the rows, weight
 *             gradients and dx.
 * Index arithmetic with worked examples: plan/layout.c, plan/plan.c and docs/cp.md. */
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "util/err.h"
#include "util/gemm.h"

/* Message tags of the compressor halo: per direction, part and compressor (so concurrent moves never
 * match each other). */
enum { TAG_CMP_HALF = 110, TAG_CMP_FULL = 112, TAG_CMP_HALF_BWD = 120, TAG_CMP_FULL_BWD = 122 };

typedef struct {
  int dim, cD;
  dsv4_wid wkv, wgate, ape, norm;
} compressor_ids;

static compressor_ids ids_of(const dsv4_stage_env *e, int which) {
  const int dim = which ? e->cfg->index_head_dim : e->cfg->head_dim;
  return (compressor_ids){dim, (e->p->key.ratio == 4 ? 2 : 1) * dim, which ? W_I_WKV : W_C_WKV,
                          which ? W_I_WGATE : W_C_WGATE, which ? W_I_APE : W_C_APE, which ? W_I_NORM : W_C_NORM};
}

/* Y rows of every segment (at its own rows of C/Z_ext) = X rows . W^T in the global panels. */
static dsv4_status proj_segments(const dsv4_stage_env *e, float *Y, int64_t ldy, const float *X, const float *W,
                                 int64_t N) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &e->p->lay;
  const int64_t K = e->cfg->dim;
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    DSV4_TRY(dsv4_proj_rows(Y + (sg->c_row + sg->c_halo) * ldy, ldy, X + sg->lo * K, K, W, sg->len, N, K,
                            e->p->global + sg->lo, e->p->panel, e->impl));
  }
fail:
  return rc;
}

/* Compressor halo rows of C and Z: r == 4 rows of a previous window carry their FIRST half of the
 * channels (the only half a next slot reads), rows of a straddling slot's own window carry all of
 * them. Projected rows, not raw x rows: 2 c D floats per row against d (docs/cp.md). */
static dsv4_status cmp_halo(const dsv4_stage_env *e, float *C, float *Z, int cD, int which, int reverse) {
  dsv4_status rc = DSV4_OK;
  float *bufs[2] = {C, Z};
  const dsv4_msg_kind kind = reverse ? DSV4_MSG_COMPRESSOR_HALO_BWD : DSV4_MSG_COMPRESSOR_HALO;
  DSV4_TRY(dsv4_xfer_halo(e->x, &e->p->halo[DSV4_HALO_CMP_HALF], bufs, 2, cD, 0, cD / 2,
                          (reverse ? TAG_CMP_HALF_BWD : TAG_CMP_HALF) + which, reverse, kind));
  DSV4_TRY(dsv4_xfer_halo(e->x, &e->p->halo[DSV4_HALO_CMP_FULL], bufs, 2, cD, 0, cD,
                          (reverse ? TAG_CMP_FULL_BWD : TAG_CMP_FULL) + which, reverse, kind));
fail:
  return rc;
}

/* The compressor arguments of the owned slots (the plan's slot table). */
static dsv4_compress_args compress_args(const dsv4_stage_env *e, const compressor_ids *id, float *blk,
                                        const float *C, const float *Z) {
  const dsv4_plan *p = e->p;
  return (dsv4_compress_args){
      .out = blk, .out_row = p->slot_blk, .C = C, .Z = Z, .ape = dsv4_w(e->w, id->ape),
      .norm_w = dsv4_w(e->w, id->norm), .cur_row = p->slot_cur, .prev_row = p->slot_prev, .pos = p->slot_pos,
      .rope = &p->rope, .n_slots = p->n_slot, .ratio = p->key.ratio, .D = id->dim, .eps = e->cfg->eps,
      .rows = p->lay.R_c, .rows_out = p->lay.n_blk};
}

dsv4_status dsv4_stage1_start(const dsv4_stage_env *e, int which, const float *x, float *C, float *Z, float *blk,
                              float *all) {
  dsv4_status rc = DSV4_OK;
  const compressor_ids id = ids_of(e, which);
  const dsv4_layout *lay = &e->p->lay;
  DSV4_TRY(proj_segments(e, C, id.cD, x, dsv4_w(e->w, id.wkv), id.cD));
  DSV4_TRY(proj_segments(e, Z, id.cD, x, dsv4_w(e->w, id.wgate), id.cD));
  DSV4_TRY(cmp_halo(e, C, Z, id.cD, which, 0));
  memset(blk, 0, sizeof(float) * (size_t)(lay->n_blk * id.dim)); /* unused capacity rows stay 0 */
  const dsv4_compress_args ca = compress_args(e, &id, blk, C, Z);
  DSV4_TRY(dsv4_kernels_get(e->impl)->compress(&ca));
  DSV4_TRY(dsv4_xfer_gather_start(e->x, which, blk, all, sizeof(float) * (size_t)(lay->n_blk * id.dim)));
fail:
  return rc;
}

dsv4_status dsv4_stage1_finish(const dsv4_stage_env *e, int which, const float *all, float *out) {
  dsv4_status rc = DSV4_OK;
  const int dim = ids_of(e, which).dim;
  const int32_t *gather = e->p->lay.gather;
  DSV4_TRY(dsv4_xfer_gather_wait(e->x, which));
  for (int64_t id = 0; id < e->p->docs.n_cmp; id++)
    memcpy(out + id * dim, all + (int64_t)gather[id] * dim, sizeof(float) * dim);
fail:
  return rc;
}

dsv4_status dsv4_stage1_backward(const dsv4_stage_env *e, int which, const float *d_out, const float *x,
                                 const float *C, const float *Z, float *d_all, float *d_blk, float *dC, float *dZ,
                                 dsv4_weights *grads, float *dx) {
  dsv4_status rc = DSV4_OK;
  const compressor_ids id = ids_of(e, which);
  const dsv4_layout *lay = &e->p->lay;
  const dsv4_kernels *K = dsv4_kernels_get(e->impl);
  const int dim = id.dim, cD = id.cD, d = e->cfg->dim;
  /* d_all[gather[id]] = d_out[id]: the transpose of select-and-pad (each block is selected once) */
  memset(d_all, 0, sizeof(float) * (size_t)(lay->n_blk_all * dim));
  for (int64_t s = 0; s < e->p->docs.n_cmp; s++) {
    float *dst = d_all + (int64_t)lay->gather[s] * dim;
    const float *src = d_out + s * dim;
    for (int k = 0; k < dim; k++) dst[k] += src[k];
  }
  DSV4_TRY(dsv4_xfer_reduce_scatter(e->x, d_all, d_blk, (size_t)(lay->n_blk * dim)));
  memset(dC, 0, sizeof(float) * (size_t)(lay->R_c * cD));
  memset(dZ, 0, sizeof(float) * (size_t)(lay->R_c * cD));
  const dsv4_compress_bwd_args cb = {.dC = dC, .dZ = dZ, .d_ape = dsv4_w(grads, id.ape),
                                     .d_norm_w = dsv4_w(grads, id.norm), .d_out = d_blk,
                                     .fwd = compress_args(e, &id, NULL, C, Z)};
  DSV4_TRY(K->compress_bwd(&cb));
  DSV4_TRY(cmp_halo(e, dC, dZ, cD, which, 1));
  /* dW += dC_own^T x_own per segment; dx_own += dC_own . W */
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    const int64_t row = sg->c_row + sg->c_halo;
    const float *xs = x + sg->lo * d;
    K->gemm_tn(cD, d, sg->len, 1.0f, dC + row * cD, cD, xs, d, 1.0f, dsv4_w(grads, id.wkv), d);
    K->gemm_tn(cD, d, sg->len, 1.0f, dZ + row * cD, cD, xs, d, 1.0f, dsv4_w(grads, id.wgate), d);
    if (dx) {
      K->gemm_nn(sg->len, d, cD, 1.0f, dC + row * cD, cD, dsv4_w(e->w, id.wkv), d, 1.0f, dx + sg->lo * d, d);
      K->gemm_nn(sg->len, d, cD, 1.0f, dZ + row * cD, cD, dsv4_w(e->w, id.wgate), d, 1.0f, dx + sg->lo * d, d);
    }
  }
fail:
  return rc;
}
