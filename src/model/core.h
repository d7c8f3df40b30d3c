/* core.h: the core attention object (compressor, indexer, sink, sparse attention, KL loss) and the
 * stages of two-stage CP it runs over a plan (plan/plan.h) and a transport (cp/exchange.h).
 *
 * One algorithm for one rank and N ranks: a core starts on a one-rank communicator (its halo plans
 * hold only its own rows, its all-gather is a copy) and dsv4_cp_patch gives it another; nothing
 * else changes. The stages are functions over plain data:
 *   stage1.c  Stage 1: compressor projections, compressor halo, pooling of the owned slots, the
 *             all-gather and select-and-pad into the global compressed sequence (and its backward:
 *             scatter, reduce-scatter, compressor backward, halo gradients home, weight gradients)
 *   window.c  the window halo (kv rows from the left neighbours) and its backward
 *   select.c  the indexer's queries and top-k against the global keys, and their backward
 *   attend.c  the sparse attention of a chunk of queries: window phase, compressed phase, backward
 *   loss.c    the KL loss terms of a chunk, the exact reduction over ranks, the KL backward
 *   offload.c the attention of rows one rank computes for another (plan/offload.h)
 * core_fwd.c and core_bwd.c run them in order for a chunk of rows at a time (the layer recomputes
 * q and o chunk by chunk when asked to), core.c holds the object. */
#ifndef DSV4_CORE_H
#define DSV4_CORE_H

#include "cp/exchange.h"
#include "model/arenas.h"
#include "model/offload.h"
#include "model/shared.h"
#include "model/wgrad.h"
#include "ops/kernels.h"
#include "plan/offload.h"
#include "plan/plan.h"
#include "util/xrows.h"

/* What a stage needs besides its buffers. */
typedef struct {
  const dsv4_config *cfg;
  const dsv4_weights *w;
  dsv4_impl impl;
  const dsv4_plan *p;
  dsv4_xfer *x;
} dsv4_stage_env;

/* 1 when the layer attends to top-k ids (V4 r = 4, every V4.1 compressed layer) rather than to every
 * visible compressed entry (V4 r = 128). */
static inline int dsv4_env_sparse(const dsv4_stage_env *e) {
  return e->cfg->v41 ? e->p->key.ratio > 0 : e->p->key.ratio == 4;
}

/* The state of one forward and its backward: the plan, borrowed inputs, the arenas' pieces. */
typedef struct {
  int valid;                 /* a training forward completed: backward may run */
  int stage1_done;
  const float *q, *o;        /* [n, H, D] the caller's whole q and o (NULL: recomputation) */
  const float *kv, *x, *qr;  /* borrowed from the caller: [n, D], [n, d], [n, dq] */
  int32_t *topk_out;         /* [n, k] the caller's top-k output (may be NULL) */
  dsv4_dims dm;
  dsv4_core_saved sv;
  dsv4_core_fwd_scratch fs;
  dsv4_core_bwd_scratch bs;
  int64_t kl_valid;          /* local queries with a KL term */
  int64_t n_valid;           /* KL valid tokens over all ranks */
  dsv4_weights *grads;       /* backward: accumulated into */
  dsv4_wsinks sinks;         /* backward: exact sums of the gradients summed over calls (model/wgrad.h) */
  dsv4_wsink *d_KI_sum;      /* backward: the indexer keys' gradients, exact (a local sink) */
  int keep_rows;             /* backward with recomputation: keep the indexer queries' gradient rows
                                (kqI, kwI) for their weight products at the end, instead of sinks */
  float *kqI, *kwI;
  char sink_what[32];
  float d_loss;
  /* what the stages read and write: the core's own arenas (V4) or the shared state (V4.1) */
  float *cmp, *KI;           /* [n_cmp, D], [n_cmp, Di] the global compressed kv and indexer keys */
  float *d_KI;               /* the indexer keys' gradients (V4.1: the kv source's sums) */
  int32_t *topk;             /* [n, k] the top-k ids attended to (own, or the index source's) */
  const int32_t *cand_in;    /* [n, n_cand] the candidate source's blocks (V4.1 later index sources) */
  int32_t *cand_out;         /* [n, n_cand] this candidate source's blocks */
  dsv4_shared *sh;           /* V4.1: the forward pass's shared state and its generation then */
  uint64_t sh_gen;
  dsv4_shared_kv *kv_e;      /* V4.1: the kv source's entry */
  dsv4_shared_sel *sel_e;    /* V4.1: this index source's entry */
  dsv4_offload_run orun;     /* attention rows in flight to or from the offload peer (model/offload.h) */
} dsv4_core_run;

struct dsv4_core {
  dsv4_config cfg;
  int layer, ratio;
  dsv4_layer_info info;      /* its role (V4: WINDOW or OWN; V4.1: docs/spec.md section 10) */
  const dsv4_weights *w;
  dsv4_impl impl;
  int threads;               /* OpenMP threads of its public calls; 0: the caller's default */
  int recompute;             /* 1: the caller recomputes q, o in the backward; the core its indexer queries */
  dsv4_comm *self;           /* the one-rank communicator a core starts with */
  dsv4_xfer xfer;            /* over self, or the communicator dsv4_cp_patch gave */
  dsv4_split split;
  int have_plan;
  dsv4_plan plan;            /* the latest forward's plan, reused while its key repeats */
  dsv4_offload off;          /* its attention rows moved to or from another rank (plan/offload.h) */
  uint64_t cfg_hash;         /* what the agreement compares */
  uint64_t group_hash;       /* the config without the layer: a V4.1 consumer's must be its source's */
  dsv4_shared *own_shared;   /* a V4.1 kv source's, when the caller gives none */
  dsv4_arena saved, scratch;
  dsv4_core_run run;
};

/* 1 when this rank's last row call moves attention rows to its offload peer (heavy) or computes the
 * peer's (light): the fast path only (the ranks agree on the path). */
static inline int dsv4_core_offloads(const dsv4_core *c) { return c->off.peer >= 0 && c->impl == DSV4_IMPL_FAST; }

/* ---- the per-forward protocol (core_fwd.c, core_bwd.c) -------------------------------------- */

/* Collective. The agreement check, then the plan of this call (the cached one when its key is
 * equal): *plan stays valid until the next prepare of this core. */
dsv4_status dsv4_core_prepare(dsv4_core *c, const dsv4_packing *pk, int64_t n, const dsv4_plan **plan);

/* What the forward borrows: kv, x, qr for every local row; q and o whole, or NULL (recomputation:
 * the backward is given each chunk's q and o again). */
typedef struct {
  const float *q, *kv, *x, *qr;
  float *o;
  int32_t *topk_ids;
  int train;
  dsv4_shared *shared;       /* V4.1: the forward pass's (NULL: a kv source uses its own) */
} dsv4_core_begin_args;

/* The chunked forward over the prepared plan: begin (Stage 1 started, window halo exchanged), then
 * rows for every chunk of queries in order (window phase, Stage 1 finished at the first call,
 * top-k, compressed phase, KL terms; q: [n, H, D] of the chunk, o: [n, H, D] receives their
 * output), then end (KL loss reduced; *loss may be NULL). */
dsv4_status dsv4_core_fwd_begin(dsv4_core *c, const dsv4_core_begin_args *a);
dsv4_status dsv4_core_fwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o);
dsv4_status dsv4_core_fwd_end(dsv4_core *c, float *loss, int train);
/* The chunked backward (the plan's chunks): begin; per chunk optionally recompute (o of the chunk's
 * queries from q, bitwise the forward's; and the indexer queries), then rows (attention backward:
 * dq [n, H, D] overwritten, may alias d_o; KL backward); then end (halo gradients home,
 * compressors; dkv [n_local, D] overwritten, dx [n_local, d] accumulated). */
dsv4_status dsv4_core_bwd_begin(dsv4_core *c, dsv4_weights *grads, float d_loss);
/* Collective, after dsv4_core_bwd_end (and the caller's own sink additions): the gradient sinks
 * summed over ranks and stored (grads are then the rank-summed gradients). */
dsv4_status dsv4_core_bwd_finish(dsv4_core *c);
/* An abandoned backward: sinks dropped, every gradient back to its value at dsv4_core_bwd_begin. */
void dsv4_core_bwd_abort(dsv4_core *c);
dsv4_status dsv4_core_bwd_recompute(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o);
dsv4_status dsv4_core_bwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *o,
                               const float *d_o, float *dq);
dsv4_status dsv4_core_bwd_end(dsv4_core *c, float *dkv, float *dx);
/* Forgets the forward's state after a failure (completing started all-gathers first). */
void dsv4_core_fail(dsv4_core *c);
/* Forgets a pending training forward (buffers stay). */
void dsv4_core_forget(dsv4_core *c);
/* Bytes the last training forward keeps in the core's saved arena (0 when none). */
size_t dsv4_core_saved_bytes(const dsv4_core *c);
void dsv4_core_set_recompute(dsv4_core *c, int on);

/* ---- the stages -------------------------------------------------------------------------------- */

/* stage1.c. which = 0: the main compressor (dim D), 1: V4's indexer compressor (dim Di).
 * start: projections of the local rows into C/Z_ext [R_c, c dim] (V4.1 r = 1: C only), the
 * compressor halo, pooling of the owned slots into blk [n_blk, dim] (rows it does not own stay 0;
 * latent, when not NULL, gets them before RoPE), the all-gather into all [n_blk_all, dim] started
 * (when all is not NULL). keys (V4.1 kv sources): the indexer keys of the owned slots from their
 * latent (kpre: [n_blk, Di] before k_norm, kept for the backward) into blk [n_blk, Di], their
 * all-gather started. finish: waits, then out[id] = all[gather[id]] ([n_cmp, dim]). */
dsv4_status dsv4_stage1_start(const dsv4_stage_env *e, int which, const float *x, float *C, float *Z, float *blk,
                              float *latent, float *all);
dsv4_status dsv4_stage1_keys(const dsv4_stage_env *e, const float *latent, float *kpre, float *blk, float *all);
dsv4_status dsv4_stage1_finish(const dsv4_stage_env *e, int which, const float *all, float *out);
/* Backward of one compressor from this rank's d out [n_cmp, dim]: scatter through the gather index,
 * reduce-scatter to the owners, compressor backward, halo gradients back to the ranks that sent
 * the rows, weight gradients (accumulated into grads) and, when dx is not NULL, dx += dC Wkv + dZ
 * Wgate. d out is exact sums (x_out [n_cmp, 2 dim], util/xacc.h): the reduce-scatter is exact,
 * through x_ring and x_blk, and d_blk the owners' sums rounded once, the same bits for every N.
 * d_blk, dC, dZ, x_ring, x_blk: scratch of the sizes of arenas.h.
 * Weight gradients over global panels, collective (model/wgrad.h).
 * keys_bwd: the V4.1 keys' backward from the exact sums of d KI [n_cmp, 2 Di] (to the owners,
 * k_norm's terms into the sinks ks, indexer.wk; nothing to the latent: detached). */
typedef struct {
  const int64_t *x_out; /* NULL only when there are no compressed entries */
  int64_t *x_ring, *x_blk;
} dsv4_stage1_grad;
dsv4_status dsv4_stage1_backward(const dsv4_stage_env *e, int which, const dsv4_stage1_grad *g, const float *x,
                                 const float *C, const float *Z, float *d_blk, float *dC, float *dZ,
                                 dsv4_weights *grads, float *dx);
dsv4_status dsv4_stage1_keys_bwd(const dsv4_stage_env *e, const int64_t *x_KI, const float *latent,
                                 float *kpre, int64_t *x_ring, int64_t *x_blk, float *d_blk, dsv4_wsinks *ks,
                                 dsv4_weights *grads);

/* window.c. The window halo: kv_ext's own rows copied from kv [n, D], its halo rows from the left
 * neighbours. Backward, over the exact sums x_ext [R_kv, 2 D] (util/xacc.h): the halo rows go to
 * their owners and are merged there; dkv [n, D] gets the own rows' sums, rounded once (the same
 * bits whichever ranks computed the terms). */
dsv4_status dsv4_window_halo(const dsv4_stage_env *e, const float *kv, float *kv_ext);
dsv4_status dsv4_window_halo_bwd(const dsv4_stage_env *e, int64_t *x_ext, float *dkv);

/* select.c. Indexer queries [n, Hi Di] (RoPE at each row's position) and head weights [n, Hi] of
 * local rows [i0, i0 + n), from qr and x (whole arrays); top-k ids and scores against the global
 * keys KI [n_cmp, Di] (V4.1: cand_out [n, n_cand] the candidate source's blocks; cand_in: select
 * only inside them; both whole arrays or NULL); backward: the projections' weight gradients from
 * d qI, d w (scaled and rotated here, in place). */
dsv4_status dsv4_select_queries(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *qr, const float *x,
                                float *qI, float *wI);
dsv4_status dsv4_select_topk(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *qI, const float *wI,
                             const float *KI, int32_t *topk, float *scores, const int32_t *cand_in,
                             int32_t *cand_out);
dsv4_status dsv4_select_queries_bwd(const dsv4_stage_env *e, int64_t i0, int64_t n, float *d_qI, float *d_w,
                                    const float *qr, const float *x, dsv4_weights *grads, dsv4_wsinks *ks,
                                    float *keep_qI, float *keep_wI);
/* Collective: the indexer query projections' gradients over every local row's kept d qI, d w. */
dsv4_status dsv4_select_wgrad(const dsv4_stage_env *e, const float *d_qI, const float *d_w, const float *qr,
                              const float *x, dsv4_weights *grads);

/* attend.c. The attention arguments of local rows [i0, i0 + n): queries q, output o, lse, the window
 * rows of ori_kv ([R_kv, D]: kv_ext, or kv when there is no halo) and, when cmp is not NULL, the
 * global compressed kv with each query's visible range (r == 128) or top-k ids (r == 4). */
dsv4_attn_args dsv4_attend_args(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *q, float *o, float *lse,
                                const float *ori_kv, const float *cmp, const int32_t *topk);
/* The window phase (m_w, l_w: [n, H] running max and sum), letting pending all-gathers progress;
 * the compressed phase merged with it (teacher, when not NULL: [n, k] the KL teacher), calling
 * progress(ctx) between queries when not NULL (moved rows in flight); the whole attention in one
 * call (the naive path, and recomputation). */
dsv4_status dsv4_attend_window(const dsv4_stage_env *e, const dsv4_attn_args *at, float *m_w, float *l_w,
                               int progress);
dsv4_status dsv4_attend_finish(const dsv4_stage_env *e, const dsv4_attn_args *at, const float *m_w,
                               const float *l_w, void (*progress)(void *), void *ctx);
dsv4_status dsv4_attend_whole(const dsv4_stage_env *e, const dsv4_attn_args *at);
/* The backward; x_ori / x_cmp (fast path, may be NULL): the key gradients go into these exact sums
 * instead of ab's d_ori_kv / d_cmp_kv; progress as above (fast path with sums). */
dsv4_status dsv4_attend_bwd(const dsv4_stage_env *e, const dsv4_attn_bwd_args *ab, dsv4_xrows *x_ori,
                            dsv4_xrows *x_cmp, void (*progress)(void *), void *ctx);

/* loss.c. The KL terms of local rows [i0, i0 + n) (kl_rows [n] doubles; *valid += queries with a
 * term); the loss reduced exactly over ranks from every row's term (coeff * sum / n_valid);
 * the KL backward of a chunk (d qI, d w overwritten; d KI [n_cmp, Di] accumulated, or, on the fast
 * path with x_KI non-NULL, added into those exact sums instead: d_KI is then not written). */
typedef struct {
  const float *q, *cmp, *qI, *wI, *KI, *teacher, *scores;
  const int32_t *topk;
  double *kl_rows;
} dsv4_loss_in;
dsv4_status dsv4_loss_rows(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in, int64_t *valid);
dsv4_status dsv4_loss_reduce(const dsv4_stage_env *e, const double *kl_rows, int64_t kl_valid, int64_t *n_valid,
                             float *loss);
dsv4_status dsv4_loss_bwd_rows(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in,
                               float grad_scale, float *d_qI, float *d_w, float *d_KI, dsv4_xrows *x_KI);

#endif
