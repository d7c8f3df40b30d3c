/* halo.c: the halo plans of two-stage CP (plan.h): for the window halo and the two compressor
 * halos, which rows every rank sends to and receives from which peer, derived from every rank's
 * layout so that sender and receiver agree on the rows and their order without a message. */
#include <string.h>

#include "plan.h"
#include "util/err.h"

void dsv4_halo_plan_free(dsv4_halo_plan *p) {
  for (int i = 0; i < p->n_send; i++) free(p->send[i].rows);
  for (int i = 0; i < p->n_recv; i++) free(p->recv[i].rows);
  free(p->send);
  free(p->recv);
  free(p->self_src);
  free(p->self_dst);
  memset(p, 0, sizeof *p);
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

/* Every rank's segments, sorted by first row (*all allocated; caller frees). */
static dsv4_status owner_list(const dsv4_layout *lays, int size, owner_seg **all, int *n_all) {
  dsv4_status rc = DSV4_OK;
  int n = 0;
  for (int q = 0; q < size; q++) n += lays[q].n_seg;
  DSV4_ALLOC(*all, n);
  n = 0;
  for (int q = 0; q < size; q++)
    for (int s = 0; s < lays[q].n_seg; s++) (*all)[n++] = (owner_seg){lays[q].seg[s].g0, lays[q].seg[s].len, q, s};
  qsort(*all, (size_t)n, sizeof **all, cmp_owner);
  *n_all = n;
fail:
  return rc;
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
static dsv4_status add_row(dsv4_halo_msg **msgs, int *n, int peer, int32_t row) {
  dsv4_status rc = DSV4_OK;
  int i = 0;
  while (i < *n && (*msgs)[i].peer != peer) i++;
  if (i == *n) {
    dsv4_halo_msg *m = realloc(*msgs, sizeof(dsv4_halo_msg) * (size_t)(*n + 1));
    DSV4_CHECK(m, DSV4_ERR_NOMEM, "cp plan: out of memory");
    *msgs = m;
    m[i] = (dsv4_halo_msg){.peer = peer};
    (*n)++;
  }
  dsv4_halo_msg *m = &(*msgs)[i];
  int32_t *rows = realloc(m->rows, sizeof(int32_t) * (size_t)(m->n + 1));
  DSV4_CHECK(rows, DSV4_ERR_NOMEM, "cp plan: out of memory");
  m->rows = rows;
  m->rows[m->n++] = row;
fail:
  return rc;
}

/* Halo rows [a, b) of a segment, as offsets before its first token g0 (a >= b >= 0: the rows are
 * global [g0 - a, g0 - b)), and the first halo row of the segment in its extended buffer. */
static void halo_span(const dsv4_seg *d, dsv4_halo_kind kind, int64_t *a, int64_t *b, int64_t *buf_first) {
  switch (kind) {
    case DSV4_HALO_WINDOW: *a = d->win_halo, *b = 0, *buf_first = d->kv_row; return;
    case DSV4_HALO_CMP_HALF: *a = d->c_halo, *b = d->c_full, *buf_first = d->c_row; return;
    case DSV4_HALO_CMP_FULL: *a = d->c_full, *b = 0, *buf_first = d->c_row + d->c_halo - d->c_full; return;
    case DSV4_HALO_KINDS: break;
  }
}

/* Row of global token g in the extended buffer of the segment that owns it (its own rows). */
static int32_t own_row(const dsv4_seg *src, dsv4_halo_kind kind, int64_t g) {
  return (int32_t)(kind == DSV4_HALO_WINDOW ? src->kv_row + src->win_halo + (g - src->g0)
                                          : src->c_row + src->c_halo + (g - src->g0));
}

/* Shared builder: for every rank q and segment s, the halo rows of `kind` it needs; each comes
 * from the segment that owns it. Destination rows are the halo rows in q's buffer; source rows
 * are the owner's own rows. Enumerating every rank in the same order gives sender and receiver
 * the same row order.
 * Worked example (docs/cp.md): one document of 16, W = 8, N = 4 (L = 4): rank 2's window halo is
 * [1, 8), rows 1..3 from rank 0 and 4..7 from rank 1; rank 0 sends rows 1..3 to rank 2 (and rows
 * 0..3 to rank 1), in that order on both sides. */
static dsv4_status build_plan(const dsv4_layout *lays, int size, int me, dsv4_halo_kind kind, dsv4_halo_plan *p) {
  dsv4_status rc = DSV4_OK;
  owner_seg *all = NULL;
  int n_all = 0;
  memset(p, 0, sizeof *p);
  DSV4_TRY(owner_list(lays, size, &all, &n_all));
  for (int q = 0; q < size; q++) {
    for (int s = 0; s < lays[q].n_seg; s++) {
      const dsv4_seg *d = &lays[q].seg[s];
      int64_t a = 0, b = 0, first = 0;
      halo_span(d, kind, &a, &b, &first);
      for (int64_t g = d->g0 - a; g < d->g0 - b; g++) {
        const owner_seg *o = owner_of(all, n_all, g);
        DSV4_CHECK(o, DSV4_ERR_STATE, "cp plan: no rank holds halo row %lld", (long long)g);
        const int32_t src_row = own_row(&lays[o->rank].seg[o->seg], kind, g);
        const int32_t dst_row = (int32_t)(first + (g - (d->g0 - a)));
        if (q == me && o->rank == me) {
          int32_t *x = realloc(p->self_src, sizeof(int32_t) * (size_t)(p->n_self + 1));
          DSV4_CHECK(x, DSV4_ERR_NOMEM, "cp plan: out of memory");
          p->self_src = x;
          int32_t *y = realloc(p->self_dst, sizeof(int32_t) * (size_t)(p->n_self + 1));
          DSV4_CHECK(y, DSV4_ERR_NOMEM, "cp plan: out of memory");
          p->self_dst = y;
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
  if (rc != DSV4_OK) dsv4_halo_plan_free(p);
  return rc;
}

dsv4_status dsv4_halo_plan_build(const dsv4_layout *lays, int size, int me, dsv4_halo_kind kind, dsv4_halo_plan *p) {
  return build_plan(lays, size, me, kind, p);
}

/* The counting form of build_plan for every rank at once (the planner at thousands of ranks):
 * rows each rank sends and receives for one halo kind, and the messages (distinct peers) of each
 * direction. Halo rows are walked owner segment by owner segment, so the cost is the number of
 * (halo, owner) pieces, not rows. */
dsv4_status dsv4_halo_counts(const dsv4_layout *lays, int size, dsv4_halo_kind kind, uint64_t *rows_sent,
                                uint64_t *rows_recv, uint64_t *msgs_sent, uint64_t *msgs_recv) {
  dsv4_status rc = DSV4_OK;
  owner_seg *all = NULL;
  int *peers = NULL, n_all = 0;
  DSV4_TRY(owner_list(lays, size, &all, &n_all));
  DSV4_ALLOC(peers, size);
  for (int q = 0; q < size; q++) {
    int n_peers = 0;
    for (int s = 0; s < lays[q].n_seg; s++) {
      const dsv4_seg *d = &lays[q].seg[s];
      int64_t a = 0, b = 0, first = 0;
      halo_span(d, kind, &a, &b, &first);
      for (int64_t g = d->g0 - a; g < d->g0 - b;) {
        const owner_seg *o = owner_of(all, n_all, g);
        DSV4_CHECK(o, DSV4_ERR_STATE, "cp plan: no rank holds halo row %lld", (long long)g);
        const int64_t end = o->g0 + o->len < d->g0 - b ? o->g0 + o->len : d->g0 - b;
        if (o->rank != q) {
          rows_sent[o->rank] += (uint64_t)(end - g);
          rows_recv[q] += (uint64_t)(end - g);
          int seen = 0;
          for (int i = 0; i < n_peers && !seen; i++) seen = peers[i] == o->rank;
          if (!seen) peers[n_peers++] = o->rank;
        }
        g = end;
      }
    }
    for (int i = 0; i < n_peers; i++) msgs_sent[peers[i]]++;
    msgs_recv[q] += (uint64_t)n_peers;
  }
fail:
  free(all);
  free(peers);
  return rc;
}
