/* plan.c: layouts, gather index and halo plans of two-stage CP (see plan.h). */
#include "plan.h"

#include <string.h>

#include "shard.h"
#include "util/err.h"
#include "util/gemm.h"

void cp_plan_free(cp_plan *p) {
  for (int i = 0; i < p->n_send; i++) free(p->send[i].rows);
  for (int i = 0; i < p->n_recv; i++) free(p->recv[i].rows);
  free(p->send);
  free(p->recv);
  free(p->self_src);
  free(p->self_dst);
  memset(p, 0, sizeof *p);
}

/* Row of global block b (token b * r) in the all-gathered block buffer, for every block. */
static dsv4_status block_rows(const dsv4_docs *docs, const dsv4_packing *pk, dsv4_split split, int size,
                              int64_t n_blk, int32_t *blk_row) {
  dsv4_status rc = DSV4_OK;
  dsv4_range *segs = NULL;
  const int r = docs->ratio;
  for (int p = 0; p < size; p++) {
    int ns = 0;
    DSV4_TRY(dsv4_shard_segments(pk, split, p, size, r, &segs, &ns));
    int64_t blk = 0;
    for (int s = 0; s < ns; s++)
      for (int64_t b = 0; b < segs[s].len / r; b++, blk++)
        blk_row[segs[s].g0 / r + b] = (int32_t)(p * n_blk + blk);
    free(segs);
    segs = NULL;
  }
fail:
  free(segs);
  return rc;
}

dsv4_status cp_layout(const dsv4_docs *docs, const dsv4_packing *pk, dsv4_split split, int rank, int size,
                      int W, int with_gather, dsv4_layout *lay) {
  dsv4_status rc = DSV4_OK;
  dsv4_range *segs = NULL;
  int32_t *blk_row = NULL;
  int ns = 0;
  const int r = docs->ratio, hr = CMP_HALO_ROWS(r);
  memset(lay, 0, sizeof *lay);
  DSV4_TRY(dsv4_shard_segments(pk, split, rank, size, r, &segs, &ns));
  lay->ratio = r;
  lay->n_seg = ns;
  lay->ext_kv = 1;
  lay->panel = dsv4_panel_rows(docs->T);
  DSV4_ALLOC(lay->seg, ns);
  for (int s = 0; s < ns; s++) {
    dsv4_seg *sg = &lay->seg[s];
    sg->g0 = segs[s].g0;
    sg->len = segs[s].len;
    sg->lo = lay->n;
    const int doc = dsv4_docs_find(docs, sg->g0);
    const int64_t t0 = sg->g0 - docs->cu[doc];
    sg->win_halo = t0 < docs->real[doc] ? (t0 < W - 1 ? t0 : W - 1) : 0;
    if (r == 4) {
      const int64_t j = t0 / r, n_c = docs->cu_cmp[doc + 1] - docs->cu_cmp[doc];
      sg->cmp_halo = j > 0 && j < n_c;
    }
    sg->kv_row = lay->R_kv;
    sg->c_row = lay->R_c;
    sg->blk0 = lay->n_blk;
    lay->R_kv += sg->win_halo + sg->len;
    lay->R_c += hr + sg->len;
    lay->n += sg->len;
    if (r > 0) lay->n_blk += sg->len / r;
  }
  lay->n_blk_all = lay->n_blk * size;
  if (with_gather && r > 0) {
    DSV4_ALLOC(blk_row, docs->T / r + 1);
    DSV4_TRY(block_rows(docs, pk, split, size, lay->n_blk, blk_row));
    DSV4_ALLOC(lay->gather, docs->n_cmp + 1);
    for (int i = 0; i < docs->n_docs; i++)
      for (int64_t j = 0; j < docs->cu_cmp[i + 1] - docs->cu_cmp[i]; j++)
        lay->gather[docs->cu_cmp[i] + j] = blk_row[docs->cu[i] / r + j];
  }
fail:
  free(segs);
  free(blk_row);
  if (rc != DSV4_OK) dsv4_layout_free(lay);
  return rc;
}

/* ---- halo plans ------------------------------------------------------------------------------ */

typedef struct {
  int64_t g0, len;
  int rank, seg;
} owner_seg;

static int cmp_owner(const void *a, const void *b) {
  const owner_seg *x = a, *y = b;
  return (x->g0 > y->g0) - (x->g0 < y->g0);
}

/* Segment of all ranks that holds global row g (binary search over the sorted list). */
static const owner_seg *owner_of(const owner_seg *v, int n, int64_t g) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (v[mid].g0 <= g) lo = mid; else hi = mid - 1;
  }
  return (g >= v[lo].g0 && g < v[lo].g0 + v[lo].len) ? &v[lo] : NULL;
}

/* Appends row to the message for peer (messages are created in first-use order). */
static dsv4_status add_row(cp_msg **msgs, int *n, int peer, int32_t row) {
  dsv4_status rc = DSV4_OK;
  int i = 0;
  while (i < *n && (*msgs)[i].peer != peer) i++;
  if (i == *n) {
    cp_msg *m = realloc(*msgs, sizeof(cp_msg) * (size_t)(*n + 1));
    DSV4_CHECK(m, DSV4_ERR_NOMEM, "cp plan: out of memory");
    *msgs = m;
    m[i] = (cp_msg){.peer = peer};
    (*n)++;
  }
  cp_msg *m = &(*msgs)[i];
  int32_t *rows = realloc(m->rows, sizeof(int32_t) * (size_t)(m->n + 1));
  DSV4_CHECK(rows, DSV4_ERR_NOMEM, "cp plan: out of memory");
  m->rows = rows;
  m->rows[m->n++] = row;
fail:
  return rc;
}

/* Shared builder: for every rank q and segment s, the halo rows [g0 - h, g0) it needs (h =
 * win_halo, or 4 when cmp_halo); each comes from the segment that owns it. Destination rows are
 * the halo rows in q's buffer; source rows are the owner's own rows. kind 0: window (kv_ext),
 * 1: compressor (C/Z_ext). Enumerating every rank in the same order gives sender and receiver the
 * same row order. */
static dsv4_status build_plan(const dsv4_layout *lays, int size, int me, int kind, cp_plan *p) {
  dsv4_status rc = DSV4_OK;
  owner_seg *all = NULL;
  int n_all = 0;
  memset(p, 0, sizeof *p);
  for (int q = 0; q < size; q++) n_all += lays[q].n_seg;
  DSV4_ALLOC(all, n_all);
  n_all = 0;
  for (int q = 0; q < size; q++)
    for (int s = 0; s < lays[q].n_seg; s++)
      all[n_all++] = (owner_seg){lays[q].seg[s].g0, lays[q].seg[s].len, q, s};
  qsort(all, (size_t)n_all, sizeof *all, cmp_owner);
  const int hr = CMP_HALO_ROWS(lays[0].ratio);
  for (int q = 0; q < size; q++) {
    for (int s = 0; s < lays[q].n_seg; s++) {
      const dsv4_seg *d = &lays[q].seg[s];
      const int64_t h = kind == 0 ? d->win_halo : (d->cmp_halo ? hr : 0);
      for (int64_t g = d->g0 - h; g < d->g0; g++) {
        const owner_seg *o = owner_of(all, n_all, g);
        DSV4_CHECK(o, DSV4_ERR_STATE, "cp plan: no rank holds halo row %lld", (long long)g);
        const dsv4_seg *src = &lays[o->rank].seg[o->seg];
        const int32_t src_row = (int32_t)(kind == 0 ? src->kv_row + src->win_halo + (g - src->g0)
                                                    : src->c_row + hr + (g - src->g0));
        const int32_t dst_row = (int32_t)((kind == 0 ? d->kv_row : d->c_row) + (g - (d->g0 - h)));
        if (q == me && o->rank == me) {
          int32_t *a = realloc(p->self_src, sizeof(int32_t) * (size_t)(p->n_self + 1));
          DSV4_CHECK(a, DSV4_ERR_NOMEM, "cp plan: out of memory");
          p->self_src = a;
          int32_t *b = realloc(p->self_dst, sizeof(int32_t) * (size_t)(p->n_self + 1));
          DSV4_CHECK(b, DSV4_ERR_NOMEM, "cp plan: out of memory");
          p->self_dst = b;
          p->self_src[p->n_self] = src_row;
          p->self_dst[p->n_self++] = dst_row;
        } else if (q == me) {
          DSV4_TRY(add_row(&p->recv, &p->n_recv, o->rank, dst_row));
        } else if (o->rank == me) {
          DSV4_TRY(add_row(&p->send, &p->n_send, q, src_row));
        }
      }
    }
  }
fail:
  free(all);
  if (rc != DSV4_OK) cp_plan_free(p);
  return rc;
}

dsv4_status cp_plan_window(const dsv4_layout *lays, int size, int me, cp_plan *p) {
  return build_plan(lays, size, me, 0, p);
}

dsv4_status cp_plan_compressor(const dsv4_layout *lays, int size, int me, cp_plan *p) {
  return build_plan(lays, size, me, 1, p);
}
