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
#include "util/xacc.h"
#include "ops/rmsnorm.h"
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

/* V4.1's r = 1 compressor has no gate: Z is not projected (the slot is its row). */
static int gated(const dsv4_stage_env *e) { return !e->cfg->v41 || e->p->key.ratio > 1; }

/* The row of C/Z_ext that holds local row i, for every i: a segment's own rows follow its halo. The
 * segments tile the local rows in order (dsv4_layout_build: seg.lo is the rows before it). NULL: out
 * of memory. */
static int64_t *c_rows(const dsv4_layout *lay) {
  int64_t *row = malloc(sizeof(int64_t) * (size_t)(lay->n + 1));
  for (int s = 0; row && s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    for (int64_t i = 0; i < sg->len; i++) row[sg->lo + i] = sg->c_row + sg->c_halo + i;
  }
  return row;
}

/* Y rows of every segment (at its own rows of C/Z_ext) = X rows . W^T in the global panels, all
 * segments in one call so that their partial panels (a zigzag chunk's ends) share BLAS calls. */
static dsv4_status proj_segments(const dsv4_stage_env *e, float *Y, int64_t ldy, const float *X, const float *W,
                                 int64_t N) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &e->p->lay;
  const int64_t K = e->cfg->dim;
  int64_t *yrow = c_rows(lay);
  DSV4_CHECK(yrow, DSV4_ERR_NOMEM, "out of memory for %lld row indices", (long long)lay->n);
  DSV4_TRY(dsv4_proj_rows_map(Y, ldy, yrow, X, K, W, lay->n, N, K, e->p->global, e->p->panel, e->impl));
fail:
  free(yrow);
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
      .out = blk, .out_row = p->slot_blk, .C = C, .Z = gated(e) ? Z : NULL,
      .ape = e->cfg->v41 ? NULL : dsv4_w(e->w, id->ape),
      .norm_w = dsv4_w(e->w, id->norm), .cur_row = p->slot_cur, .prev_row = p->slot_prev, .pos = p->slot_pos,
      .rope = &p->rope, .n_slots = p->n_slot, .ratio = p->key.ratio, .D = id->dim, .eps = e->cfg->eps,
      .rows = p->lay.R_c, .rows_out = p->lay.n_blk};
}

dsv4_status dsv4_stage1_start(const dsv4_stage_env *e, int which, const float *x, float *C, float *Z, float *blk,
                              float *latent, float *all) {
  dsv4_status rc = DSV4_OK;
  const compressor_ids id = ids_of(e, which);
  const dsv4_layout *lay = &e->p->lay;
  DSV4_TRY(proj_segments(e, C, id.cD, x, dsv4_w(e->w, id.wkv), id.cD));
  if (gated(e)) DSV4_TRY(proj_segments(e, Z, id.cD, x, dsv4_w(e->w, id.wgate), id.cD));
  DSV4_TRY(cmp_halo(e, C, Z, id.cD, which, 0));
  memset(blk, 0, sizeof(float) * (size_t)(lay->n_blk * id.dim)); /* unused capacity rows stay 0 */
  dsv4_compress_args ca = compress_args(e, &id, blk, C, Z);
  ca.latent = latent;
  DSV4_TRY(dsv4_kernels_get(e->impl)->compress(&ca));
  if (all) DSV4_TRY(dsv4_xfer_gather_start(e->x, which, blk, all, sizeof(float) * (size_t)(lay->n_blk * id.dim)));
fail:
  return rc;
}

/* V4.1 indexer keys of the owned slots from their latent (pre-RoPE, [n_blk, D] at slot_blk):
 * kpre = indexer.wk latent in global panels over compressed ids (so a key's bits do not depend on
 * the rank that owns it), blk = RoPE_{j r}(RMSNorm_{k_norm}(kpre)); then the keys' all-gather. */
dsv4_status dsv4_stage1_keys(const dsv4_stage_env *e, const float *latent, float *kpre, float *blk, float *all) {
  dsv4_status rc = DSV4_OK;
  const dsv4_plan *p = e->p;
  const dsv4_layout *lay = &p->lay;
  const int D = e->cfg->head_dim, Di = e->cfg->index_head_dim;
  const int64_t panel = dsv4_panel_rows(p->docs.n_cmp);
  const float *knorm = dsv4_w(e->w, W_I_KNORM);
  memset(blk, 0, sizeof(float) * (size_t)(lay->n_blk * Di));
  int64_t s0 = 0; /* the segment's first slot in the slot table (global id order = segment order) */
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    DSV4_TRY(dsv4_proj_rows(kpre + sg->blk0 * Di, Di, latent + sg->blk0 * D, D, dsv4_w(e->w, W_I_WK), sg->n_own, Di,
                            D, p->slot_gid + s0, panel, e->impl));
    s0 += sg->n_own;
  }
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < p->n_slot; s++) {
    const int64_t row = p->slot_blk[s];
    dsv4_rmsnorm_row(blk + row * Di, kpre + row * Di, knorm, Di, e->cfg->eps);
    dsv4_rope_apply(&p->rope, blk + row * Di, Di, p->slot_pos[s], 0);
  }
  DSV4_TRY(dsv4_xfer_gather_start(e->x, 1, blk, all, sizeof(float) * (size_t)(lay->n_blk * Di)));
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

/* This rank's exact sums of d out [n_cmp, 2 dim] to the owners of the entries (the transpose of
 * select-and-pad: each block is selected once), an int64 reduce-scatter into x_blk, rounded once by
 * the owner into d_blk. When the all-gathered rows are the global ids (plan.h gather_identity)
 * x_out is sent as it lies; otherwise a ring reads each all-gathered row's sums from x_out through
 * the plan's blk_id, x_ring its room (the rows are never copied into the all-gathered order: that
 * copy was 16 bytes per element of the whole compressed sequence). */
static dsv4_status to_owners_exact(const dsv4_stage_env *e, int dim, const int64_t *x_out, int64_t *x_ring,
                                   int64_t *x_blk, float *d_blk) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &e->p->lay;
  const int64_t w2 = 2 * (int64_t)dim;
  static const int64_t none[1]; /* no compressed entries: nothing to send, still collective */
  if (e->p->gather_identity)
    DSV4_TRY(dsv4_xfer_reduce_scatter_exact(e->x, x_out ? x_out : none, x_blk, lay->n_blk, dim));
  else
    DSV4_TRY(dsv4_xfer_reduce_scatter_exact_rows(e->x, x_out, e->p->blk_id, x_blk, lay->n_blk, dim, x_ring));
  for (int64_t b = 0; b < lay->n_blk; b++) dsv4_xacc_store(d_blk + b * dim, x_blk + b * w2, x_blk + b * w2 + dim, dim, 0);
fail:
  return rc;
}

dsv4_status dsv4_stage1_backward(const dsv4_stage_env *e, int which, const dsv4_stage1_grad *g, const float *x,
                                 const float *C, const float *Z, float *d_blk, float *dC, float *dZ,
                                 dsv4_weights *grads, float *dx) {
  dsv4_status rc = DSV4_OK;
  const compressor_ids id = ids_of(e, which);
  const dsv4_layout *lay = &e->p->lay;
  const dsv4_kernels *K = dsv4_kernels_get(e->impl);
  const int cD = id.cD, d = e->cfg->dim, gate = gated(e);
  dsv4_wpiece *pc = NULL;
  int64_t *xrow = NULL;
  DSV4_TRY(to_owners_exact(e, id.dim, g->x_out, g->x_ring, g->x_blk, d_blk));
  memset(dC, 0, sizeof(float) * (size_t)(lay->R_c * cD));
  if (gate) memset(dZ, 0, sizeof(float) * (size_t)(lay->R_c * cD));
  const dsv4_compress_bwd_args cb = {.dC = dC, .dZ = gate ? dZ : NULL,
                                     .d_ape = e->cfg->v41 ? NULL : dsv4_w(grads, id.ape),
                                     .d_norm_w = dsv4_w(grads, id.norm), .d_out = d_blk,
                                     .fwd = compress_args(e, &id, NULL, C, Z)};
  DSV4_TRY(K->compress_bwd(&cb));
  DSV4_TRY(cmp_halo(e, dC, dZ, cD, which, 1));
  /* dW += dC_own^T x_own over global panels (model/wgrad.h); dx_own += dC_own . W per segment */
  DSV4_ALLOC(pc, 2 * lay->n_seg + 1);
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    const int64_t row = sg->c_row + sg->c_halo;
    const int64_t *glob = e->p->global + sg->lo;
    pc[s] = (dsv4_wpiece){.n = sg->len, .A = dC + row * cD, .lda = cD, .B = x + sg->lo * d, .ldb = d, .glob = glob};
    pc[lay->n_seg + s] = pc[s];
    if (gate) pc[lay->n_seg + s].A = dZ + row * cD;
  }
  const dsv4_wshape ws = {cD, d, e->p->panel, e->p->key.T};
  DSV4_TRY(dsv4_wgrad_exact(e->x, &ws, pc, lay->n_seg, dsv4_w(grads, id.wkv), e->impl, "compressor wkv"));
  if (gate)
    DSV4_TRY(dsv4_wgrad_exact(e->x, &ws, pc + lay->n_seg, lay->n_seg, dsv4_w(grads, id.wgate), e->impl,
                              "compressor wgate"));
  if (dx) { /* every segment in one call (each row from its place after the segment's halo): the
             * partial panels of a zigzag rank's two chunks share a call, as in the forward */
    const int64_t *glob = e->p->global, P = e->p->panel;
    xrow = c_rows(lay);
    DSV4_CHECK(xrow, DSV4_ERR_NOMEM, "out of memory for %lld row indices", (long long)lay->n);
    DSV4_TRY(dsv4_rows_nn_map(dx, d, dC, cD, xrow, dsv4_w(e->w, id.wkv), d, lay->n, d, cD, glob, P, 1, e->impl));
    if (gate)
      DSV4_TRY(dsv4_rows_nn_map(dx, d, dZ, cD, xrow, dsv4_w(e->w, id.wgate), d, lay->n, d, cD, glob, P, 1, e->impl));
  }
fail:
  free(xrow);
  free(pc);
  return rc;
}

/* The keys' backward from the exact sums of every reader's d KI [n_cmp, 2 Di]: to the owners (an
 * int64 reduce-scatter, rounded once there), RoPE^T, k_norm's backward (its gradient as exact
 * terms), d indexer.wk over global panels of compressed ids. The latent gets nothing (the indexer
 * path is detached). */
dsv4_status dsv4_stage1_keys_bwd(const dsv4_stage_env *e, const int64_t *x_KI, const float *latent,
                                 float *kpre, int64_t *x_ring, int64_t *x_blk, float *d_blk, dsv4_wsinks *ks,
                                 dsv4_weights *grads) {
  dsv4_status rc = DSV4_OK;
  const dsv4_plan *p = e->p;
  const dsv4_layout *lay = &p->lay;
  const int D = e->cfg->head_dim, Di = e->cfg->index_head_dim;
  const float *knorm = dsv4_w(e->w, W_I_KNORM);
  float *d_knorm = dsv4_w(grads, W_I_KNORM), *t = NULL;
  dsv4_wpiece *pc = NULL;
  DSV4_TRY(to_owners_exact(e, Di, x_KI, x_ring, x_blk, d_blk));
  DSV4_ALLOC(t, Di);
  for (int64_t s = 0; s < p->n_slot; s++) { /* serial: k_norm's terms in slot order */
    const int64_t row = p->slot_blk[s];
    float *g = d_blk + row * Di;
    dsv4_rope_apply(&p->rope, g, Di, p->slot_pos[s], 1);
    memset(t, 0, sizeof(float) * (size_t)Di);
    dsv4_rmsnorm_bwd_row(g, t, g, kpre + row * Di, knorm, dsv4_rms_inv(kpre + row * Di, Di, e->cfg->eps), Di);
    DSV4_TRY(dsv4_wsinks_terms(ks, d_knorm, t, Di));
  }
  DSV4_ALLOC(pc, lay->n_seg + 1);
  int64_t s0 = 0;
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
    pc[s] = (dsv4_wpiece){.n = sg->n_own, .A = d_blk + sg->blk0 * Di, .lda = Di, .B = latent + sg->blk0 * D, .ldb = D,
                          .glob = p->slot_gid + s0};
    s0 += sg->n_own;
  }
  const dsv4_wshape ws = {Di, D, dsv4_panel_rows(p->docs.n_cmp), p->docs.n_cmp};
  DSV4_TRY(dsv4_wgrad_exact(e->x, &ws, pc, lay->n_seg, dsv4_w(grads, W_I_WK), e->impl, "indexer wk"));
fail:
  free(t);
  free(pc);
  return rc;
}
