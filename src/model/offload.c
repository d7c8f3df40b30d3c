/* offload.c: the moved attention rows' messages and the light rank's work on them (offload.h). */
#include "offload.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "model/weights.h"
#include "ops/sparse_attn.h"
#include "util/err.h"
#include "util/xacc.h"

/* Message tags (each pair's messages of one tag arrive in order: the batches share theirs). */
enum {
  TAG_IDS = 140, TAG_KV, TAG_Q, TAG_O, TAG_LSE, TAG_TEACHER, TAG_STATUS,
  TAG_B_IDS = 150, TAG_B_KV, TAG_B_LSE, TAG_B_Q, TAG_B_DO, TAG_B_O, TAG_B_DQ, TAG_B_SUMS, TAG_B_STATUS
};

#define FWD DSV4_MSG_ATTN_OFFLOAD
#define BWD DSV4_MSG_ATTN_OFFLOAD_BWD

static int64_t batches(const dsv4_offload *o) { return (o->m + DSV4_OFFLOAD_BATCH - 1) / DSV4_OFFLOAD_BATCH; }
static int64_t batch_rows(const dsv4_offload *o, int64_t b) {
  const int64_t j0 = b * DSV4_OFFLOAD_BATCH;
  return o->m - j0 < DSV4_OFFLOAD_BATCH ? o->m - j0 : DSV4_OFFLOAD_BATCH;
}

/* Row of kv_ext (or kv) holding global raw kv row g of the heavy rank's last segment. */
static int64_t ext_row(const dsv4_core *c, int64_t g) {
  const dsv4_seg *s = &c->plan.lay.seg[c->plan.lay.n_seg - 1];
  return s->kv_row + s->win_halo + (g - s->g0);
}

static const float *ori_kv(const dsv4_core *c) { return c->plan.lay.ext_kv ? c->run.sv.kv_ext : c->run.kv; }

static dsv4_status run_reserve(dsv4_offload_run *r, dsv4_core *c, int n) {
  dsv4_status rc = DSV4_OK;
  memset(r, 0, sizeof *r);
  r->c = c;
  r->nb = (int)batches(&c->off);
  DSV4_ALLOC(r->req, n);
  DSV4_ALLOC(r->do_req, r->nb + 1);
  DSV4_ALLOC(r->dq_posted, r->nb + 1);
fail:
  return rc;
}

static void run_free(dsv4_offload_run *r) {
  free(r->req), free(r->do_req), free(r->dq_posted), free(r->sums);
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

/* The heavy rank's inputs every batch needs: top-k ids and the windows' kv rows. */
static dsv4_status send_common(dsv4_core *c, dsv4_msg_kind k, int tag_ids, int tag_kv) {
  const dsv4_offload *o = &c->off;
  const int64_t f = c->plan.n - o->m, K = c->cfg.index_topk, D = c->cfg.head_dim;
  dsv4_status rc = send(c, k, c->run.topk + f * K, sizeof(int32_t) * (size_t)(o->m * K), tag_ids);
  if (rc == DSV4_OK)
    rc = send(c, k, ori_kv(c) + ext_row(c, o->kv_g0) * D, sizeof(float) * (size_t)(o->kv_rows * D), tag_kv);
  return rc;
}

dsv4_status dsv4_offload_fwd_post(dsv4_core *c, int64_t i0, const float *q, float *o) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_offload *of = &c->off;
  const int64_t H = c->cfg.n_heads, HD = H * c->cfg.head_dim, K = c->cfg.index_topk, f = c->plan.n - of->m;
  DSV4_CHECK(f >= i0 && c->plan.global[f] == of->g0, DSV4_ERR_STATE,
             "core forward: the moved attention rows are not in this call's rows");
  DSV4_TRY(run_reserve(&st->orun, c, 2 * (int)batches(of) + 8));
  DSV4_TRY(send_common(c, FWD, TAG_IDS, TAG_KV));
  for (int64_t b = 0; b < st->orun.nb; b++) {
    const int64_t j0 = b * DSV4_OFFLOAD_BATCH, nb = batch_rows(of, b);
    DSV4_TRY(send(c, FWD, q + (f - i0 + j0) * HD, sizeof(float) * (size_t)(nb * HD), TAG_Q));
    DSV4_TRY(recv(c, FWD, o + (f - i0 + j0) * HD, sizeof(float) * (size_t)(nb * HD), TAG_O));
  }
  DSV4_TRY(recv(c, FWD, st->sv.lse + f * H, sizeof(float) * (size_t)(of->m * H), TAG_LSE));
  if (st->sv.teacher) DSV4_TRY(recv(c, FWD, st->sv.teacher + f * K, sizeof(float) * (size_t)(of->m * K), TAG_TEACHER));
  DSV4_TRY(recv(c, FWD, &st->orun.status[0], sizeof(int64_t), TAG_STATUS));
fail:
  return rc;
}

static dsv4_status finish_wait(dsv4_core *c, dsv4_msg_kind k, int which) {
  dsv4_status rc = DSV4_OK;
  dsv4_offload_run *r = &c->run.orun;
  DSV4_TRY(r->err);
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, k, r->req, r->n_req));
  DSV4_CHECK(r->status[which] == 0, DSV4_ERR_COMM,
             "rank %d failed computing the attention rows rank %d moved to it (layer %d %s): see its message",
             c->off.peer, c->xfer.comm->rank, c->layer, which ? "backward" : "forward");
fail:
  return rc;
}

dsv4_status dsv4_offload_fwd_wait(dsv4_core *c) {
  dsv4_status rc = finish_wait(c, FWD, 0);
  run_free(&c->run.orun);
  return rc;
}

/* The light rank's copy of what every moved row needs: ids, windows, kv rows. */
typedef struct {
  int32_t *ids, *ws, *wl;
  float *kv, *lse, *teacher;
  float *buf;             /* batch buffers */
  dsv4_comm_req *rq[8];
} serve_bufs;

static void bufs_free(serve_bufs *s) {
  free(s->ids), free(s->ws), free(s->wl), free(s->kv), free(s->lse), free(s->teacher), free(s->buf);
}

static dsv4_status serve_common(dsv4_core *c, dsv4_msg_kind k, int tag_ids, int tag_kv, serve_bufs *s, int teacher,
                                int64_t batch_floats) {
  dsv4_status rc = DSV4_OK;
  const dsv4_offload *o = &c->off;
  const int64_t K = c->cfg.index_topk, D = c->cfg.head_dim, H = c->cfg.n_heads, m = o->m;
  DSV4_ALLOC(s->ids, m * K);
  DSV4_ALLOC(s->ws, m);
  DSV4_ALLOC(s->wl, m);
  DSV4_ALLOC(s->kv, o->kv_rows * D);
  DSV4_ALLOC(s->lse, m * H);
  if (teacher) DSV4_ALLOC(s->teacher, m * K);
  DSV4_ALLOC(s->buf, batch_floats);
  for (int64_t j = 0; j < m; j++) dsv4_offload_window(&c->plan.docs, c->cfg.window, o, j, &s->ws[j], &s->wl[j]);
  DSV4_TRY(dsv4_xfer_irecv(&c->xfer, k, s->ids, sizeof(int32_t) * (size_t)(m * K), o->peer, tag_ids, &s->rq[0]));
  DSV4_TRY(dsv4_xfer_irecv(&c->xfer, k, s->kv, sizeof(float) * (size_t)(o->kv_rows * D), o->peer, tag_kv, &s->rq[1]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, k, s->rq, 2));
fail:
  return rc;
}

/* The attention arguments of moved rows [j0, j0 + n) on the light rank. */
static dsv4_attn_args moved_args(dsv4_core *c, const serve_bufs *s, int64_t j0, int64_t n, const float *q, float *o) {
  const dsv4_stage_env e = {&c->cfg, c->w, c->impl, &c->plan, &c->xfer};
  const int64_t H = c->cfg.n_heads, K = c->cfg.index_topk;
  dsv4_attn_args at = dsv4_attend_args(&e, 0, 0, q, o, s->lse + j0 * H, s->kv, c->run.cmp, NULL);
  at.S1 = n, at.R = c->off.kv_rows;
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

dsv4_status dsv4_offload_fwd_serve(dsv4_core *c) {
  dsv4_status rc = DSV4_OK, work = DSV4_OK;
  const dsv4_offload *of = &c->off;
  const int64_t H = c->cfg.n_heads, HD = H * c->cfg.head_dim, K = c->cfg.index_topk, B = DSV4_OFFLOAD_BATCH;
  const int64_t nbat = batches(of);
  const int teacher = c->run.sv.teacher != NULL;
  serve_bufs s = {0};
  float *m_w = NULL;
  /* two sets of q and o (the next batch arrives and the last one leaves while one is computed) */
  DSV4_TRY(serve_common(c, FWD, TAG_IDS, TAG_KV, &s, teacher, 4 * B * HD));
  DSV4_ALLOC(m_w, 2 * B * H);
  float *q[2] = {s.buf, s.buf + B * HD}, *o[2] = {s.buf + 2 * B * HD, s.buf + 3 * B * HD};
  const int tq = TAG_Q;
  DSV4_TRY(post_batch(c, FWD, batch_rows(of, 0), &q[0], &tq, 1, &s.rq[0]));
  for (int64_t b = 0; b < nbat; b++) {
    const int64_t j0 = b * B, n = batch_rows(of, b), x = b % 2;
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, &s.rq[x], 1));
    if (b + 1 < nbat) DSV4_TRY(post_batch(c, FWD, batch_rows(of, b + 1), &q[1 - x], &tq, 1, &s.rq[1 - x]));
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, &s.rq[2 + x], 1)); /* o[x] left two batches ago */
    if (work == DSV4_OK) { /* the forward's two phases, as on the heavy rank (and on one rank) */
      const dsv4_attn_args at = moved_args(c, &s, j0, n, q[x], o[x]);
      work = dsv4_sparse_attn_window(&at, m_w, m_w + B * H);
      if (work == DSV4_OK) work = dsv4_sparse_attn_finish(&at, m_w, m_w + B * H);
    }
    DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, o[x], sizeof(float) * (size_t)(n * HD), of->peer, TAG_O, &s.rq[2 + x]));
  }
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, &s.rq[2], 2));
  int64_t status = work != DSV4_OK;
  int nr = 0;
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, s.lse, sizeof(float) * (size_t)(of->m * H), of->peer, TAG_LSE, &s.rq[nr++]));
  if (teacher)
    DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, s.teacher, sizeof(float) * (size_t)(of->m * K), of->peer, TAG_TEACHER,
                             &s.rq[nr++]));
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, FWD, &status, sizeof status, of->peer, TAG_STATUS, &s.rq[nr++]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, FWD, s.rq, nr));
  rc = work;
fail:
  free(m_w);
  bufs_free(&s);
  return rc;
}

dsv4_status dsv4_offload_bwd_post(dsv4_core *c, int64_t i0, const float *q, const float *o, const float *d_o,
                                  float *dq) {
  dsv4_status rc = DSV4_OK;
  dsv4_core_run *st = &c->run;
  dsv4_offload_run *r = &st->orun;
  const dsv4_offload *of = &c->off;
  const int64_t H = c->cfg.n_heads, HD = H * c->cfg.head_dim, D = c->cfg.head_dim, f = c->plan.n - of->m;
  DSV4_CHECK(f >= i0 && c->plan.global[f] == of->g0, DSV4_ERR_STATE,
             "core backward: the moved attention rows are not in this call's rows");
  DSV4_TRY(run_reserve(r, c, 5 * (int)batches(of) + 8));
  DSV4_ALLOC(r->sums, 2 * D * of->kv_rows);
  r->dq = dq + (f - i0) * HD;
  DSV4_TRY(send_common(c, BWD, TAG_B_IDS, TAG_B_KV));
  DSV4_TRY(send(c, BWD, st->sv.lse + f * H, sizeof(float) * (size_t)(of->m * H), TAG_B_LSE));
  for (int64_t b = 0; b < r->nb; b++) {
    const int64_t at = (f - i0 + b * DSV4_OFFLOAD_BATCH) * HD;
    const size_t bytes = sizeof(float) * (size_t)(batch_rows(of, b) * HD);
    DSV4_TRY(send(c, BWD, q + at, bytes, TAG_B_Q));
    r->do_req[b] = r->n_req;
    DSV4_TRY(send(c, BWD, d_o + at, bytes, TAG_B_DO));
    DSV4_TRY(send(c, BWD, o + at, bytes, TAG_B_O));
  }
  DSV4_TRY(recv(c, BWD, r->sums, sizeof(int64_t) * (size_t)(2 * D * of->kv_rows), TAG_B_SUMS));
  DSV4_TRY(recv(c, BWD, &r->status[1], sizeof(int64_t), TAG_B_STATUS));
fail:
  return rc;
}

/* Posts batch b's d q receive once its d o has left (they may share memory). */
static dsv4_status post_dq(dsv4_offload_run *r, int64_t b) {
  dsv4_core *c = r->c;
  const int64_t HD = (int64_t)c->cfg.n_heads * c->cfg.head_dim;
  r->dq_posted[b] = 1;
  return recv(c, BWD, r->dq + b * DSV4_OFFLOAD_BATCH * HD, sizeof(float) * (size_t)(batch_rows(&c->off, b) * HD),
              TAG_B_DQ);
}

void dsv4_offload_progress(void *ctx) {
  dsv4_core *c = ctx;
  dsv4_offload_run *r = &c->run.orun;
  if (!r->req || r->err != DSV4_OK) return;
  r->err = dsv4_comm_test(c->xfer.comm, r->req, r->n_req);
  if (!r->dq) return;
  /* in batch order (the d q messages share a tag: the n-th receive posted gets the n-th batch) */
  for (int64_t b = 0; b < r->nb && r->err == DSV4_OK; b++) {
    if (r->dq_posted[b]) continue;
    if (r->req[r->do_req[b]]) break;
    r->err = post_dq(r, b);
  }
}

dsv4_status dsv4_offload_bwd_wait(dsv4_core *c) {
  dsv4_status rc = DSV4_OK;
  dsv4_offload_run *r = &c->run.orun;
  const dsv4_offload *of = &c->off;
  const int64_t D = c->cfg.head_dim;
  for (int64_t b = 0; b < r->nb; b++)
    if (!r->dq_posted[b]) {
      DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, &r->req[r->do_req[b]], 1));
      DSV4_TRY(post_dq(r, b));
    }
  DSV4_TRY(finish_wait(c, BWD, 1));
  /* the window rows' sums (copy 0 of x_ext; the copies are merged at the end) */
  int64_t *x = c->run.bs.x_ext + ext_row(c, of->kv_g0) * 2 * D;
  for (int64_t i = 0; i < of->kv_rows; i++)
    dsv4_xacc_merge(x + i * 2 * D, x + i * 2 * D + D, r->sums + i * 2 * D, r->sums + i * 2 * D + D, D);
fail:
  run_free(r);
  return rc;
}

dsv4_status dsv4_offload_bwd_serve(dsv4_core *c) {
  dsv4_status rc = DSV4_OK, work = DSV4_OK;
  dsv4_core_run *st = &c->run;
  const dsv4_offload *of = &c->off;
  const int64_t H = c->cfg.n_heads, D = c->cfg.head_dim, HD = H * D, B = DSV4_OFFLOAD_BATCH, nbat = batches(of);
  serve_bufs s = {0};
  dsv4_xrows xo = {0};
  /* two sets of q, d o, o (the next batch arrives while one is computed) and of d q (one leaves) */
  DSV4_TRY(serve_common(c, BWD, TAG_B_IDS, TAG_B_KV, &s, 0, 8 * B * HD));
  DSV4_TRY(dsv4_xfer_irecv(&c->xfer, BWD, s.lse, sizeof(float) * (size_t)(of->m * H), of->peer, TAG_B_LSE, &s.rq[0]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, s.rq, 1));
  /* a view (the operator leaves the copies to its caller, who sends them) */
  DSV4_TRY(dsv4_xrows_alloc(&xo, 0, of->kv_rows, D, st->dm.nt, "attention rows of another rank"));
  xo.view = 1;
  dsv4_xrows xc = dsv4_xrows_view(st->bs.x_cmp, st->dm.n_cmp, D, st->dm.nt);
  float *in[2][3], *dq[2];
  for (int x = 0; x < 2; x++) {
    for (int i = 0; i < 3; i++) in[x][i] = s.buf + (x * 3 + i) * B * HD;
    dq[x] = s.buf + (6 + x) * B * HD;
  }
  const int tags[3] = {TAG_B_Q, TAG_B_DO, TAG_B_O};
  dsv4_comm_req *rin[2][3] = {{0}}, *rdq[2] = {0};
  DSV4_TRY(post_batch(c, BWD, batch_rows(of, 0), in[0], tags, 3, rin[0]));
  for (int64_t b = 0; b < nbat; b++) {
    const int64_t j0 = b * B, n = batch_rows(of, b), x = b % 2;
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, rin[x], 3));
    if (b + 1 < nbat) DSV4_TRY(post_batch(c, BWD, batch_rows(of, b + 1), in[1 - x], tags, 3, rin[1 - x]));
    DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, &rdq[x], 1));
    if (work == DSV4_OK) {
      const dsv4_attn_bwd_args ab = {.dq = dq[x], .d_ori_kv = st->bs.d_ext, .d_cmp_kv = st->bs.d_cmp,
                                     .d_sink = dsv4_w(st->grads, W_SINK), .dout = in[x][1], .out = in[x][2],
                                     .lse = s.lse + j0 * H, .fwd = moved_args(c, &s, j0, n, in[x][0], NULL)};
      work = dsv4_sparse_attn_bwd_into(&ab, &xo, &xc);
    }
    DSV4_TRY(dsv4_xfer_isend(&c->xfer, BWD, dq[x], sizeof(float) * (size_t)(n * HD), of->peer, TAG_B_DQ, &rdq[x]));
  }
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, rdq, 2));
  dsv4_xrows_merge(&xo);
  int64_t status = work != DSV4_OK;
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, BWD, xo.base, sizeof(int64_t) * (size_t)(2 * D * of->kv_rows), of->peer,
                           TAG_B_SUMS, &s.rq[0]));
  DSV4_TRY(dsv4_xfer_isend(&c->xfer, BWD, &status, sizeof status, of->peer, TAG_B_STATUS, &s.rq[1]));
  DSV4_TRY(dsv4_xfer_wait(&c->xfer, BWD, s.rq, 2));
  rc = work;
fail:
  free(xo.base);
  bufs_free(&s);
  return rc;
}

void dsv4_offload_drain(dsv4_core *c) {
  dsv4_offload_run *r = &c->run.orun;
  if (!r->req) return;
  if (r->dq)
    for (int64_t b = 0; b < r->nb; b++)
      if (!r->dq_posted[b] && dsv4_comm_wait(c->xfer.comm, &r->req[r->do_req[b]], 1) == DSV4_OK) post_dq(r, b);
  dsv4_comm_wait(c->xfer.comm, r->req, r->n_req);
  run_free(r);
}
