/* offload.c: the moved attention rows' messages and the light rank's work on them (offload.h). */
#include "offload.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "ops/sparse_attn.h"
#include "util/err.h"
#include "util/xacc.h"

/* Message tags (each pair's messages of one tag arrive in order: batches and parts share theirs). */
enum {
  TAG_IDS = 140, TAG_KV, TAG_Q, TAG_O, TAG_LSE, TAG_TEACHER, TAG_STATUS,
  TAG_B_IDS = 150, TAG_B_KV, TAG_B_LSE, TAG_B_Q, TAG_B_DO, TAG_B_O, TAG_B_DQ, TAG_B_SUMS, TAG_B_STATUS
};

#define FWD DSV4_MSG_ATTN_OFFLOAD
#define BWD DSV4_MSG_ATTN_OFFLOAD_BWD
#define B_ROWS DSV4_OFFLOAD_BATCH

static int64_t batches(int64_t m) { return (m + B_ROWS - 1) / B_ROWS; }
static int64_t batch_rows(int64_t m, int64_t b) { return m - b * B_ROWS < B_ROWS ? m - b * B_ROWS : B_ROWS; }

/* Row of kv_ext (or kv) holding global raw kv row g, which lies in (or in the window halo of) the
 * segment that holds the heavy rank's local row f. */
static int64_t ext_row(const dsv4_core *c, int64_t f, int64_t g) {
  const dsv4_layout *l = &c->plan.lay;
  int s = 0;
  while (s + 1 < l->n_seg && l->seg[s + 1].lo <= f) s++;
  return l->seg[s].kv_row + l->seg[s].win_halo + (g - l->seg[s].g0);
}

static const float *ori_kv(const dsv4_core *c) { return c->plan.lay.ext_kv ? c->run.sv.kv_ext : c->run.kv; }

/* The parts whose rows lie in the call [i0, i0 + n) (heavy); an error if one straddles it. */
static dsv4_status parts_in(const dsv4_core *c, int64_t i0, int64_t n, int *first, int *count) {
  dsv4_status rc = DSV4_OK;
  *first = 0, *count = 0;
  for (int i = 0; i < c->off.n_part; i++) {
    const dsv4_offload_part *p = &c->off.part[i];
    const int in = p->f >= i0 && p->f + p->m <= i0 + n, out = p->f + p->m <= i0 || p->f >= i0 + n;
    DSV4_CHECK(in || out, DSV4_ERR_STATE, "layer %d: moved attention rows [%lld, %lld) straddle the call's rows",
               c->layer, (long long)p->f, (long long)(p->f + p->m));
    if (in && !*count) *first = i;
    *count += in;
  }
fail:
  return rc;
}

int dsv4_offload_own(const dsv4_core *c, int64_t i0, int64_t n, int64_t *lo, int64_t *hi) {
  int k = 0;
  int64_t at = i0;
  if (dsv4_core_offloads(c) && c->off.heavy)
    for (int i = 0; i < c->off.n_part; i++) {
      const dsv4_offload_part *p = &c->off.part[i];
      if (p->f < i0 || p->f + p->m > i0 + n) continue;
      if (p->f > at) lo[k] = at, hi[k++] = p->f;
      at = p->f + p->m;
    }
  if (at < i0 + n || k == 0) lo[k] = at, hi[k++] = i0 + n;
  return k;
}

static dsv4_status run_reserve(dsv4_offload_run *r, dsv4_core *c, int n_req, int nb, int n_part) {
  dsv4_status rc = DSV4_OK;
  memset(r, 0, sizeof *r);
  r->c = c;
  r->nb = nb;
  DSV4_ALLOC(r->req, n_req);
  DSV4_ALLOC(r->do_req, nb + 1);
  DSV4_ALLOC(r->dq_posted, nb + 1);
  DSV4_ALLOC(r->dq_at, nb + 1);
  DSV4_ALLOC(r->dq_rows, nb + 1);
  DSV4_ALLOC(r->status, n_part + 1);
  DSV4_ALLOC(r->kv_part, n_part + 1);
  DSV4_ALLOC(r->sums, n_part + 1);
fail:
  return rc;
}

static void run_free(dsv4_offload_run *r) {
  if (r->sums)
    for (int i = 0; i < r->n_part; i++) free(r->sums[i]);
  free(r->req), free(r->do_req), free(r->dq_posted), free(r->dq_at), free(r->dq_rows), free(r->status), free(r->sums);
  free(r->kv_part);
  memset(r, 0, sizeof *r);
}

static dsv4_status send(dsv4_core *c, dsv4_msg_kind k, const void *buf, size_t bytes, int tag) {
  dsv4_offload_run *r = &c->run.orun;
  return dsv4_xfer_isend(&c->xfer, k, buf, bytes, c->off.peer, tag, &r->req[r->n_req++]);
}

static dsv4_status recv(dsv4_core *c, dsv4_msg_kind k, void *buf, size_t bytes, int tag) {
  dsv4_offload_run *r = &c->run.orun;
  return dsv4_xfer_irecv(&c->xfer, k, buf, bytes, c->off.peer, tag, &r->req[r->n_req++]);
}

/* The heavy rank's inputs of part p every batch needs: top-k ids and the windows' kv rows. */
static dsv4_status send_common(dsv4_core *c, const dsv4_offload_part *p, dsv4_msg_kind k, int tag_ids, int tag_kv) {
  const int64_t K = c->cfg.index_topk, D = c->cfg.head_dim;
  dsv4_status rc = send(c, k, c->run.topk + p->f * K, sizeof(int32_t) * (size_t)(p->m * K), tag_ids);
  if (rc == DSV4_OK)
    rc = send(c, k, ori_kv(c) + ext_row(c, p->f, p->kv_g0) * D, sizeof(float) * (size_t)(p->kv_rows * D), tag_kv);
  return rc;
}

/* Batches of the call's parts, and room for their requests. */
static dsv4_status reserve_parts(dsv4_core *c, int first, int count, int per_batch) {
  int nb = 0;
  for (int i = first; i < first + count; i++) nb += (int)batches(c->off.part[i].m);
  dsv4_status rc = run_reserve(&c->run.orun, c, per_batch * nb + 6 * count + 2, nb, count);
  c->run.orun.n_part = count;
  return rc;
}

dsv4_status dsv4_offload_fwd_post(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const int64_t H = c->cfg.n_heads, HD = H * c->cfg.head_dim, K = c->cfg.index_topk;
  int first, count;
  DSV4_TRY(parts_in(c, i0, n, &first, &count));
  DSV4_TRY(reserve_parts(c, first, count, 2));
  for (int i = 0; i < count; i++) {
    const dsv4_offload_part *p = &c->off.part[first + i];
    DSV4_TRY(send_common(c, p, FWD, TAG_IDS, TAG_KV));
    for (int64_t b = 0; b < batches(p->m); b++) {
      const int64_t at = (p->f - i0 + b * B_ROWS) * HD;
      const size_t bytes = sizeof(float) * (size_t)(batch_rows(p->m, b) * HD);
      DSV4_TRY(send(c, FWD, q + at, bytes, TAG_Q));
      DSV4_TRY(recv(c, FWD, o + at, bytes, TAG_O));
    }
    DSV4_TRY(recv(c, FWD, st->sv.lse + p->f * H, sizeof(float) * (size_t)(p->m * H), TAG_LSE));
    if (st->sv.teacher)
      DSV4_TRY(recv(c, FWD, st->sv.teacher + p->f * K, sizeof(float) * (size_t)(p->m * K), TAG_TEACHER));
    DSV4_TRY(recv(c, FWD, &st->orun.status[i], sizeof(int64_t), TAG_STATUS));
  }
fail:
  return rc;
}

static dsv4_status finish_wait(dsv4_core *c, dsv4_msg_kind k) {
  dsv4_status rc = DSV4_OK;
  dsv4_offload_run *r = &c->run.orun;
  DSV4_TRY(r->err);
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, k, r->req, r->n_req));
  for (int i = 0; i < r->n_part; i++)
    DSV4_CHECK(r->status[i] == 0, DSV4_ERR_COMM,
               "rank %d failed computing the attention rows rank %d moved to it (layer %d %s): see its message",
               c->off.peer, c->xfer.comm->rank, c->layer, k == FWD ? "forward" : "backward");
fail:
  return rc;
}

dsv4_status dsv4_offload_fwd_wait(dsv4_core *c) {
  dsv4_status rc = finish_wait(c, FWD);
  run_free(&c->run.orun);
  return rc;
}

/* The light rank's copy of what every row of a part needs: ids, windows, kv rows, lse (and the
 * KL teacher rows it computes), and the batch buffers. */
typedef struct {
  const dsv4_offload_part *p;
  int32_t *ids, *ws, *wl;
  float *kv, *lse, *teacher;
  float *buf;
  dsv4_comm_req *rq[8];
} serve_bufs;

static void bufs_free(serve_bufs *s) {
  free(s->ids), free(s->ws), free(s->wl), free(s->kv), free(s->lse), free(s->teacher), free(s->buf);
  memset(s, 0, sizeof *s);
}

static dsv4_status serve_common(dsv4_core *c, const dsv4_offload_part *p, dsv4_msg_kind k, int tag_ids, int tag_kv,
                                serve_bufs *s, int teacher, int64_t batch_floats) {
  dsv4_status rc = DSV4_OK;
  const int64_t K = c->cfg.index_topk, D = c->cfg.head_dim, H = c->cfg.n_heads, m = p->m;
  s->p = p;
  DSV4_ALLOC(s->ids, m * K);
  DSV4_ALLOC(s->ws, m);
  DSV4_ALLOC(s->wl, m);
  DSV4_ALLOC(s->kv, p->kv_rows * D);
  DSV4_ALLOC(s->lse, m * H);
  if (teacher) DSV4_ALLOC(s->teacher, m * K);
  DSV4_ALLOC(s->buf, batch_floats);
  for (int64_t j = 0; j < m; j++) dsv4_offload_window(&c->plan.docs, c->cfg.window, p, j, &s->ws[j], &s->wl[j]);
  DSV4_TRY(dsv4_xfer_irecv(&c->xfer, k, s->ids, sizeof(int32_t) * (size_t)(m * K), c->off.peer, tag_ids, &s->rq[0]));
  DSV4_TRY(dsv4_xfer_irecv(&c->xfer, k, s->kv, sizeof(float) * (size_t)(p->kv_rows * D), c->off.peer, tag_kv,
                           &s->rq[1]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, k, s->rq, 2));
fail:
  return rc;
}

/* The attention arguments of a part's rows [j0, j0 + n) on the light rank. */
static dsv4_attn_args moved_args(dsv4_core *c, const serve_bufs *s, int64_t j0, int64_t n, const float *q, float *o) {
  const dsv4_stage_env e = {&c->cfg, c->w, c->impl, &c->plan, &c->xfer};
  const int64_t H = c->cfg.n_heads, K = c->cfg.index_topk;
  dsv4_attn_args at = dsv4_attend_args(&e, 0, 0, q, o, s->lse + j0 * H, s->kv, c->run.cmp, NULL);
  at.S1 = n, at.R = s->p->kv_rows;
  at.win_start = s->ws + j0, at.win_len = s->wl + j0;
  at.cmp_begin = at.cmp_count = NULL;
  at.cmp_ids = s->ids + j0 * K, at.n_cmp_ids = (int)K;
  at.teacher = s->teacher ? s->teacher + j0 * K : NULL;
  return at;
}

/* Receives a batch's rows of each of nin arrays into in[i] (posted now, waited by the caller). */
static dsv4_status post_batch(dsv4_core *c, dsv4_msg_kind k, int64_t nb, float *const *in, const int *tags, int nin,
                              dsv4_comm_req **rq) {
  dsv4_status rc = DSV4_OK;
  const size_t bytes = sizeof(float) * (size_t)(nb * c->cfg.n_heads * c->cfg.head_dim);
  for (int i = 0; i < nin; i++) DSV4_TRY(dsv4_xfer_irecv(&c->xfer, k, in[i], bytes, c->off.peer, tags[i], &rq[i]));
fail:
  return rc;
}

static dsv4_status fwd_serve_part(dsv4_core *c, const dsv4_offload_part *p) {
  dsv4_status rc = DSV4_OK, work = DSV4_OK;
  const int64_t H = c->cfg.n_heads, HD = H * c->cfg.head_dim, K = c->cfg.index_topk, nbat = batches(p->m);
  const int teacher = c->run.sv.teacher != NULL, peer = c->off.peer;
  serve_bufs s = {0};
  float *m_w = NULL;
  /* two sets of q and o (the next batch arrives and the last one leaves while one is computed) */
  DSV4_TRY(serve_common(c, p, FWD, TAG_IDS, TAG_KV, &s, teacher, 4 * B_ROWS * HD));
  DSV4_ALLOC(m_w, 2 * B_ROWS * H);
  float *q[2] = {s.buf, s.buf + B_ROWS * HD}, *o[2] = {s.buf + 2 * B_ROWS * HD, s.buf + 3 * B_ROWS * HD};
  const int tq = TAG_Q;
  DSV4_TRY(post_batch(c, FWD, batch_rows(p->m, 0), &q[0], &tq, 1, &s.rq[0]));
  for (int64_t b = 0; b < nbat; b++) {
    const int64_t j0 = b * B_ROWS, n = batch_rows(p->m, b), x = b % 2;
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, &s.rq[x], 1));
    if (b + 1 < nbat) DSV4_TRY(post_batch(c, FWD, batch_rows(p->m, b + 1), &q[1 - x], &tq, 1, &s.rq[1 - x]));
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, &s.rq[2 + x], 1)); /* o[x] left two batches ago */
    if (work == DSV4_OK) { /* the forward's two phases, as on the heavy rank (and on one rank) */
      const dsv4_attn_args at = moved_args(c, &s, j0, n, q[x], o[x]);
      work = dsv4_sparse_attn_window(&at, m_w, m_w + B_ROWS * H);
      if (work == DSV4_OK) work = dsv4_sparse_attn_finish(&at, m_w, m_w + B_ROWS * H);
    }
    DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, o[x], sizeof(float) * (size_t)(n * HD), peer, TAG_O, &s.rq[2 + x]));
  }
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, &s.rq[2], 2));
  int64_t status = work != DSV4_OK;
  int nr = 0;
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, s.lse, sizeof(float) * (size_t)(p->m * H), peer, TAG_LSE, &s.rq[nr++]));
  if (teacher)
    DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, s.teacher, sizeof(float) * (size_t)(p->m * K), peer, TAG_TEACHER,
                             &s.rq[nr++]));
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, &status, sizeof status, peer, TAG_STATUS, &s.rq[nr++]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, s.rq, nr));
  rc = work;
fail:
  free(m_w);
  bufs_free(&s);
  return rc;
}

/* The parts whose turn comes at the end of the light rank's call [i0, i0 + n), each served by fn:
 * every part answered, the first failure reported. */
static dsv4_status serve_parts(dsv4_core *c, int64_t i0, int64_t n,
                               dsv4_status (*fn)(dsv4_core *, const dsv4_offload_part *)) {
  dsv4_status rc = DSV4_OK;
  for (int i = 0; i < c->off.n_part; i++) {
    const int64_t e = c->off.part[i].light_end;
    if (e <= i0 || e > i0 + n) continue;
    const dsv4_status r = fn(c, &c->off.part[i]);
    rc = rc == DSV4_OK ? r : rc;
  }
  return rc;
}

dsv4_status dsv4_offload_fwd_serve(dsv4_core *c, int64_t i0, int64_t n) { return serve_parts(c, i0, n, fwd_serve_part); }

dsv4_status dsv4_offload_bwd_post(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *o,
                                  const float *d_o, float *dq) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  dsv4_offload_run *r = &st->orun;
  const int64_t H = c->cfg.n_heads, HD = H * c->cfg.head_dim, D = c->cfg.head_dim;
  int first, count, nb = 0;
  DSV4_TRY(parts_in(c, i0, n, &first, &count));
  DSV4_TRY(reserve_parts(c, first, count, 4));
  for (int i = 0; i < count; i++) {
    const dsv4_offload_part *p = &c->off.part[first + i];
    DSV4_ALLOC(r->sums[i], 2 * D * p->kv_rows);
    r->kv_part[i] = first + i;
    DSV4_TRY(send_common(c, p, BWD, TAG_B_IDS, TAG_B_KV));
    DSV4_TRY(send(c, BWD, st->sv.lse + p->f * H, sizeof(float) * (size_t)(p->m * H), TAG_B_LSE));
    for (int64_t b = 0; b < batches(p->m); b++, nb++) {
      const int64_t at = (p->f - i0 + b * B_ROWS) * HD;
      const size_t bytes = sizeof(float) * (size_t)(batch_rows(p->m, b) * HD);
      DSV4_TRY(send(c, BWD, q + at, bytes, TAG_B_Q));
      r->do_req[nb] = r->n_req;
      DSV4_TRY(send(c, BWD, d_o + at, bytes, TAG_B_DO));
      DSV4_TRY(send(c, BWD, o + at, bytes, TAG_B_O));
      r->dq_at[nb] = dq + at, r->dq_rows[nb] = batch_rows(p->m, b);
    }
    DSV4_TRY(recv(c, BWD, r->sums[i], sizeof(int64_t) * (size_t)(2 * D * p->kv_rows), TAG_B_SUMS));
    DSV4_TRY(recv(c, BWD, &r->status[i], sizeof(int64_t), TAG_B_STATUS));
  }
  r->bwd = 1;
fail:
  return rc;
}

/* Posts batch b's d q receive once its d o has left (they may share memory). */
static dsv4_status post_dq(dsv4_offload_run *r, int b) {
  dsv4_core *c = r->c;
  const int64_t HD = (int64_t)c->cfg.n_heads * c->cfg.head_dim;
  r->dq_posted[b] = 1;
  return recv(c, BWD, r->dq_at[b], sizeof(float) * (size_t)(r->dq_rows[b] * HD), TAG_B_DQ);
}

void dsv4_offload_progress(void *ctx) {
  dsv4_core *c = ctx;
  dsv4_offload_run *r = &c->run.orun;
  if (!r->req || r->err != DSV4_OK) return;
  r->err = dsv4_comm_test(c->xfer.comm, r->req, r->n_req);
  if (!r->bwd) return;
  /* in batch order (the d q messages share a tag: the n-th receive posted gets the n-th batch) */
  for (int b = 0; b < r->nb && r->err == DSV4_OK; b++) {
    if (r->dq_posted[b]) continue;
    if (r->req[r->do_req[b]]) break;
    r->err = post_dq(r, b);
  }
}

dsv4_status dsv4_offload_bwd_wait(dsv4_core *c) {
  dsv4_status rc = DSV4_OK;
  dsv4_offload_run *r = &c->run.orun;
  const int64_t D = c->cfg.head_dim;
  for (int b = 0; b < r->nb; b++)
    if (!r->dq_posted[b]) {
      DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, &r->req[r->do_req[b]], 1));
      DSV4_TRY(post_dq(r, b));
    }
  DSV4_TRY(finish_wait(c, BWD));
  /* the window rows' sums (copy 0 of x_ext; the copies are merged at the end) */
  for (int i = 0; i < r->n_part; i++) {
    const dsv4_offload_part *p = &c->off.part[r->kv_part[i]];
    int64_t *x = c->run.bs.x_ext + ext_row(c, p->f, p->kv_g0) * 2 * D;
    const int64_t *y = r->sums[i];
    for (int64_t j = 0; j < p->kv_rows; j++)
      dsv4_xacc_merge(x + j * 2 * D, x + j * 2 * D + D, y + j * 2 * D, y + j * 2 * D + D, D);
  }
fail:
  run_free(r);
  return rc;
}

static dsv4_status bwd_serve_part(dsv4_core *c, const dsv4_offload_part *p) {
  dsv4_status rc = DSV4_OK, work = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const int64_t H = c->cfg.n_heads, D = c->cfg.head_dim, HD = H * D, nbat = batches(p->m);
  const int peer = c->off.peer;
  serve_bufs s = {0};
  dsv4_xrows xo = {0};
  /* two sets of q, d o, o (the next batch arrives while one is computed) and of d q (one leaves) */
  DSV4_TRY(serve_common(c, p, BWD, TAG_B_IDS, TAG_B_KV, &s, 0, 8 * B_ROWS * HD));
  DSV4_TRY(dsv4_xfer_irecv(&c->xfer, BWD, s.lse, sizeof(float) * (size_t)(p->m * H), peer, TAG_B_LSE, &s.rq[0]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, s.rq, 1));
  /* a view (the operator leaves the copies to its caller, who sends them) */
  DSV4_TRY(dsv4_xrows_alloc(&xo, 0, p->kv_rows, D, st->dm.nt, "attention rows of another rank"));
  xo.view = 1;
  dsv4_xrows xc = dsv4_xrows_view_locked(st->bs.x_cmp, st->bs.x_lock, st->dm.n_cmp, D, st->dm.nt);
  float *in[2][3], *dq[2];
  for (int x = 0; x < 2; x++) {
    for (int i = 0; i < 3; i++) in[x][i] = s.buf + (x * 3 + i) * B_ROWS * HD;
    dq[x] = s.buf + (6 + x) * B_ROWS * HD;
  }
  const int tags[3] = {TAG_B_Q, TAG_B_DO, TAG_B_O};
  dsv4_comm_req *rin[2][3] = {{0}}, *rdq[2] = {0};
  DSV4_TRY(post_batch(c, BWD, batch_rows(p->m, 0), in[0], tags, 3, rin[0]));
  for (int64_t b = 0; b < nbat; b++) {
    const int64_t j0 = b * B_ROWS, n = batch_rows(p->m, b), x = b % 2;
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, rin[x], 3));
    if (b + 1 < nbat) DSV4_TRY(post_batch(c, BWD, batch_rows(p->m, b + 1), in[1 - x], tags, 3, rin[1 - x]));
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, &rdq[x], 1));
    if (work == DSV4_OK) {
      const dsv4_attn_bwd_args ab = {.dq = dq[x], .d_ori_kv = st->bs.d_ext, .d_cmp_kv = st->bs.d_cmp,
                                     .d_sink = dsv4_w(st->grads, W_SINK), .dout = in[x][1], .out = in[x][2],
                                     .lse = s.lse + j0 * H, .fwd = moved_args(c, &s, j0, n, in[x][0], NULL)};
      work = dsv4_sparse_attn_bwd_into(&ab, &xo, &xc);
    }
    DSV4_TRY(dsv4_xfer_isend(&c->xfer, BWD, dq[x], sizeof(float) * (size_t)(n * HD), peer, TAG_B_DQ, &rdq[x]));
  }
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, rdq, 2));
  dsv4_xrows_merge(&xo);
  int64_t status = work != DSV4_OK;
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, BWD, xo.base, sizeof(int64_t) * (size_t)(2 * D * p->kv_rows), peer, TAG_B_SUMS,
                           &s.rq[0]));
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, BWD, &status, sizeof status, peer, TAG_B_STATUS, &s.rq[1]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, s.rq, 2));
  rc = work;
fail:
  free(xo.base);
  bufs_free(&s);
  return rc;
}

dsv4_status dsv4_offload_bwd_serve(dsv4_core *c, int64_t i0, int64_t n) { return serve_parts(c, i0, n, bwd_serve_part); }

void dsv4_offload_drain(dsv4_core *c) {
  dsv4_offload_run *r = &c->run.orun;
  if (!r->req) return;
  if (r->bwd)
    for (int b = 0; b < r->nb; b++)
      if (!r->dq_posted[b] && dsv4_comm_wait(c->xfer.comm, &r->req[r->do_req[b]], 1) == DSV4_OK) post_dq(r, b);
  dsv4_comm_wait(c->xfer.comm, r->req, r->n_req);
  run_free(r);
}
