/* window.c: the window halo of Stage 2 (core.h). Each segment's query at document-local position t
 * sees the min(t, W-1) raw kv rows before it; the rows before the segment's first token (clamped
 * to the document start) come from the ranks that hold them, point to point, and may span several
 * ranks when W - 1 exceeds the shard (plan/halo.c has the worked example). The backward sends the
 * gradients of those rows back to their owners, who add them to their own rows' gradients. */
#include <string.h>

#include "core.h"
#include "util/err.h"
#include "util/xacc.h"

enum { TAG_WIN = 100, TAG_WIN_BWD = 101 };

dsv4_status dsv4_window_halo(const dsv4_stage_env *e, const float *kv, float *kv_ext) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &e->p->lay;
  const int D = e->cfg->head_dim;
  float *buf = kv_ext;
  if (lay->ext_kv)
    for (int s = 0; s < lay->n_seg; s++) {
      const dsv4_seg *sg = &lay->seg[s];
      memcpy(kv_ext + (sg->kv_row + sg->win_halo) * D, kv + sg->lo * D, sizeof(float) * (size_t)(sg->len * D));
    }
  else
    buf = (float *)kv; /* no halo rows anywhere on this rank: the plan's rows are kv's (it only sends) */
  DSV4_TRY(dsv4_xfer_halo(e->x, &e->p->halo[DSV4_HALO_WINDOW], &buf, 1, D, 0, D, TAG_WIN, 0, DSV4_MSG_WINDOW_HALO));
fail:
  return rc;
}

dsv4_status dsv4_window_halo_bwd(const dsv4_stage_env *e, int64_t *x_ext, float *dkv) {
  dsv4_status rc = DSV4_OK;
  const dsv4_layout *lay = &e->p->lay;
  const int D = e->cfg->head_dim;
  DSV4_TRY(dsv4_xfer_halo_exact_bwd(e->x, &e->p->halo[DSV4_HALO_WINDOW], x_ext, D, TAG_WIN_BWD,
                                    DSV4_MSG_WINDOW_HALO_BWD));
  for (int s = 0; s < lay->n_seg; s++) {
    const dsv4_seg *sg = &lay->seg[s];
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < sg->len; i++) {
      const int64_t *a = x_ext + (sg->kv_row + sg->win_halo + i) * 2 * D;
      dsv4_xacc_store(dkv + (sg->lo + i) * D, a, a + D, D, 0);
    }
  }
fail:
  return rc;
}
