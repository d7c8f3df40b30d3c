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
 * core_fwd.c and core_bwd.c run them in order for a chunk of rows at a time (the layer recomputes
 * q and o chunk by chunk when asked to), core.c holds the object. */
#ifndef DSV4_CORE_H
#define DSV4_CORE_H

#include "cp/exchange.h"
#include "model/arenas.h"
#include "ops/kernels.h"
#include "plan/plan.h"

/* What a stage needs besides its buffers. */
typedef struct {
  const dsv4_config *cfg;
  const dsv4_weights *w;
  dsv4_impl impl;
  const dsv4_plan *p;
  dsv4_xfer *x;
} dsv4_stage_env;

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
  float d_loss;
} dsv4_core_run;

struct dsv4_core {
  dsv4_config cfg;
  int layer, ratio;
  const dsv4_weights *w;
  dsv4_impl impl;
  int threads;               /* OpenMP threads of its public calls; 0: the caller's default */
  int recompute;             /* 1: the caller recomputes q, o in the backward; the core its indexer queries */
  dsv4_comm *self;           /* the one-rank communicator a core starts with */
  dsv4_xfer xfer;            /* over self, or the communicator dsv4_cp_patch gave */
  dsv4_split split;
  int have_plan;
  dsv4_plan plan;            /* the latest forward's plan, reused while its key repeats */
  uint64_t cfg_hash;         /* what the agreement compares */
  dsv4_arena saved, scratch;
  dsv4_core_run run;
};

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

/* stage1.c. which = 0: the main compressor (dim D), 1: the indexer's (dim Di).
 * start: projections of the local rows into C/Z_ext [R_c, c dim], the compressor halo, pooling of
 * the owned slots into blk [n_blk, dim] (rows it does not own stay 0), the all-gather into all
 * [n_blk_all, dim] started. finish: waits, then out[id] = all[gather[id]] ([n_cmp, dim]). */
dsv4_status dsv4_stage1_start(const dsv4_stage_env *e, int which, const float *x, float *C, float *Z, float *blk,
                              float *all);
dsv4_status dsv4_stage1_finish(const dsv4_stage_env *e, int which, const float *all, float *out);
/* Backward of one compressor from this rank's d out [n_cmp, dim]: scatter through the gather index,
 * reduce-scatter to the owners, compressor backward, halo gradients back to the ranks that sent
 * the rows, weight gradients (accumulated into grads) and, when dx is not NULL, dx += dC Wkv + dZ
 * Wgate. d_all, d_blk, dC, dZ: scratch of the sizes of arenas.h. */
dsv4_status dsv4_stage1_backward(const dsv4_stage_env *e, int which, const float *d_out, const float *x,
                                 const float *C, const float *Z, float *d_all, float *d_blk, float *dC, float *dZ,
                                 dsv4_weights *grads, float *dx);

/* window.c. The window halo: kv_ext's own rows copied from kv [n, D], its halo rows from the left
 * neighbours. Backward: d_ext's halo rows go to their owners and are added there; dkv [n, D] gets
 * the own rows. */
dsv4_status dsv4_window_halo(const dsv4_stage_env *e, const float *kv, float *kv_ext);
dsv4_status dsv4_window_halo_bwd(const dsv4_stage_env *e, float *d_ext, float *dkv);

/* select.c. Indexer queries [n, Hi Di] (RoPE at each row's position) and head weights [n, Hi] of
 * local rows [i0, i0 + n), from qr and x (whole arrays); top-k ids and scores against the global
 * keys KI [n_cmp, Di]; backward: the projections' weight gradients from d qI, d w (scaled and
 * rotated here, in place). */
dsv4_status dsv4_select_queries(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *qr, const float *x,
                                float *qI, float *wI);
dsv4_status dsv4_select_topk(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *qI, const float *wI,
                             const float *KI, int32_t *topk, float *scores);
dsv4_status dsv4_select_queries_bwd(const dsv4_stage_env *e, int64_t i0, int64_t n, float *d_qI, float *d_w,
                                    const float *qr, const float *x, dsv4_weights *grads);

/* attend.c. The attention arguments of local rows [i0, i0 + n): queries q, output o, lse, the window
 * rows of ori_kv ([R_kv, D]: kv_ext, or kv when there is no halo) and, when cmp is not NULL, the
 * global compressed kv with each query's visible range (r == 128) or top-k ids (r == 4). */
dsv4_attn_args dsv4_attend_args(const dsv4_stage_env *e, int64_t i0, int64_t n, const float *q, float *o, float *lse,
                                const float *ori_kv, const float *cmp, const int32_t *topk);
/* The window phase (m_w, l_w: [n, H] running max and sum), letting pending all-gathers progress;
 * the compressed phase merged with it (teacher, when not NULL: [n, k] the KL teacher); the whole
 * attention in one call (the naive path, and recomputation). */
dsv4_status dsv4_attend_window(const dsv4_stage_env *e, const dsv4_attn_args *at, float *m_w, float *l_w,
                               int progress);
dsv4_status dsv4_attend_finish(const dsv4_stage_env *e, const dsv4_attn_args *at, const float *m_w,
                               const float *l_w);
dsv4_status dsv4_attend_whole(const dsv4_stage_env *e, const dsv4_attn_args *at);
dsv4_status dsv4_attend_bwd(const dsv4_stage_env *e, const dsv4_attn_bwd_args *ab);

/* loss.c. The KL terms of local rows [i0, i0 + n) (kl_rows [n] doubles; *valid += queries with a
 * term); the loss reduced exactly over ranks from every row's term (coeff * sum / n_valid);
 * the KL backward of a chunk (d qI, d w overwritten; d KI [n_cmp, Di] accumulated). */
typedef struct {
  const float *q, *cmp, *qI, *wI, *KI, *teacher, *scores;
  const int32_t *topk;
  double *kl_rows;
} dsv4_loss_in;
dsv4_status dsv4_loss_rows(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in, int64_t *valid);
dsv4_status dsv4_loss_reduce(const dsv4_stage_env *e, const double *kl_rows, int64_t kl_valid, int64_t *n_valid,
                             float *loss);
dsv4_status dsv4_loss_bwd_rows(const dsv4_stage_env *e, int64_t i0, int64_t n, const dsv4_loss_in *in,
                               float grad_scale, float *d_qI, float *d_w, float *d_KI);

#endif
