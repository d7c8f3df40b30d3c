/* dsv4cp_ops.h: the three operators of DeepSeek V4's core attention, usable on their own
 * (docs/spec.md section 5): lightning_indexer, sparse_attn_sharedkv and indexer_kl_loss, each with a
 * fast version and a naive reference (_ref) with the same arguments, and their distributed layouts
 * (placements, infer rules, and the operators behind them). dsv4cp.h is the layer API; this header
 * is for callers who build their own attention from the pieces.
 *
 * Argument structs are plain C structs: initialise them with designated initialisers (every field
 * not named is 0). Fields are only ever appended, and a 0 in a new field keeps the old behaviour,
 * so code written against this header keeps compiling and meaning the same. */
#ifndef DSV4CP_OPS_H
#define DSV4CP_OPS_H

#include "dsv4cp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * The three operators, usable on their own. Each has a fast version and a naive reference (_ref)
 * with the same arguments. Row indices in the argument structs are into the tensors passed, so the
 * same kernels serve one rank and CP shards (where ori_kv carries a left halo and k_idx / cmp_kv are
 * the gathered global compressed sequence).
 * ------------------------------------------------------------------------------------------- */

/* lightning_indexer: I[p, j] = sum_h w[p,h] * ReLU(q_idx[p,h] . k_idx[j]) over the visible rows
 * j in [vis_begin[p], vis_begin[p] + vis_count[p]); returns the min(topk, vis_count[p]) best rows
 * sorted by (score desc, row asc), padded with -1 (scores -INFINITY).
 * V4.1's two-level selection (docs/spec.md section 10 step 5), with block > 0: block b of a query
 * holds its visible rows vis_begin + [b block, (b + 1) block) (vis_begin is its document's first
 * compressed entry, so blocks are document-local). cand_out receives the n_cand blocks with the
 * highest score (the max of I over the block), the block of the query's newest visible row pinned
 * first, sorted by (score desc, block asc), -1 padded; with cand_in, only rows inside the given
 * blocks are selected (the others score -inf and are never selected: fewer than topk may come
 * out). topk_scores stay the unmasked I. */
typedef struct {
  int32_t *topk_ids;        /* [S1, topk] out, overwritten */
  float *topk_scores;       /* [S1, topk] out, overwritten; may be NULL */
  const float *q_idx;       /* [S1, Hi, Di] indexer queries (after RoPE) */
  const float *k_idx;       /* [C, Di] compressed indexer keys */
  const float *weights;     /* [S1, Hi] per-head weights (already scaled by Di^-0.5 * Hi^-0.5) */
  const int32_t *vis_begin; /* [S1] first visible row of k_idx */
  const int32_t *vis_count; /* [S1] visible rows; 0 = none (padding tokens, early positions) */
  int64_t S1, C;
  int Hi, Di, topk;
  int threads;              /* OpenMP threads; 0: the calling thread's default */
  int block;                /* V4.1 candidate_block_size; 0: no candidates */
  int n_cand;               /* candidate_topk_blocks */
  int32_t *cand_out;        /* [S1, n_cand] out, may be NULL: this query's candidate blocks */
  const int32_t *cand_in;   /* [S1, n_cand] may be NULL: select only inside these blocks */
} dsv4_indexer_args;

DSV4_API dsv4_status dsv4_lightning_indexer(const dsv4_indexer_args *a);
DSV4_API dsv4_status dsv4_lightning_indexer_ref(const dsv4_indexer_args *a);

/* sparse_attn_sharedkv: per query p and head h, keys = the window rows of ori_kv
 * [win_start[p], win_start[p] + win_len[p]) followed by the compressed rows (cmp_ids[p, :] without
 * -1, or the range [cmp_begin[p], cmp_begin[p] + cmp_count[p])); K = V.
 *   z_j = scale * q[p,h] . key_j;  out = sum_j e^{z_j} key_j / (sum_j e^{z_j} + e^{sink[h]})
 *   lse = log(sum_j e^{z_j} + e^{sink[h]}).  A query with win_len 0 (padding) gets out = 0. */
typedef struct {
  float *out;               /* [S1, H, D] out, overwritten */
  float *lse;               /* [S1, H] out, overwritten */
  const float *q;           /* [S1, H, D] */
  const float *ori_kv;      /* [R, D] raw kv rows (a left halo, then local rows) */
  const int32_t *win_start; /* [S1] */
  const int32_t *win_len;   /* [S1] */
  const float *cmp_kv;      /* [C, D] compressed kv; may be NULL (r == 0) */
  const int32_t *cmp_ids;   /* [S1, n_cmp_ids] rows of cmp_kv, -1 = unused; may be NULL */
  const int32_t *cmp_begin; /* [S1] used when cmp_ids is NULL and cmp_kv is not; may be NULL */
  const int32_t *cmp_count; /* [S1] */
  const float *sink;        /* [H] */
  int64_t S1, R, C;
  int H, D, n_cmp_ids;
  float scale;              /* D^-0.5 */
  float *teacher;           /* [S1, n_cmp_ids] out, may be NULL (fast path, cmp_ids given): the KL
                               teacher of each selected row, mean over heads of the per-head softmax
                               of the compressed logits alone (no window, no sink); 0 at -1 ids.
                               Costs a few exps: the logits are the attention's own. */
  float *scores_out;        /* [S1, score_stride] out, may be NULL (fast path): each query's scaled
                               logits as the forward computed them, window keys [H, nw] then
                               compressed keys [H, nc]; a backward given them (dsv4_attn_bwd_args
                               .scores) skips recomputing them (bitwise the same results) */
  int64_t score_stride;     /* floats per query in scores_out / scores (>= H times the keys) */
  int threads;              /* OpenMP threads; 0: the calling thread's default */
} dsv4_attn_args;

/* Backward of sparse_attn_sharedkv. Same keys as the forward. */
typedef struct {
  float *dq;                /* [S1, H, D] out, overwritten; may alias dout */
  float *d_ori_kv;          /* [R, D] accumulated */
  float *d_cmp_kv;          /* [C, D] accumulated; may be NULL when cmp_kv is NULL */
  float *d_sink;            /* [H] accumulated */
  const float *dout;        /* [S1, H, D] */
  const float *out;         /* [S1, H, D] forward output */
  const float *lse;         /* [S1, H] forward lse */
  const float *scores;      /* [S1, fwd.score_stride] the forward's scores_out; may be NULL (fast path:
                               recomputed from q and the keys, as FlashAttention does) */
  dsv4_attn_args fwd;       /* the forward's arguments (out/lse fields ignored) */
} dsv4_attn_bwd_args;

DSV4_API dsv4_status dsv4_sparse_attn(const dsv4_attn_args *a);
DSV4_API dsv4_status dsv4_sparse_attn_ref(const dsv4_attn_args *a);
DSV4_API dsv4_status dsv4_sparse_attn_bwd(const dsv4_attn_bwd_args *a);
DSV4_API dsv4_status dsv4_sparse_attn_bwd_ref(const dsv4_attn_bwd_args *a);

/* indexer_kl_loss (SPEC 3, "Indexer KL loss"): for each query with a non-empty set J_p
 * (sparse: the ids in topk_ids[p]; dense: all visible rows):
 *   teacher t_j = mean_h softmax_j(scale * q[p,h] . cmp_kv[j])   (detached, no window, no sink)
 *   student s_j = softmax_j(I[p, j])
 *   loss_sum += sum_j t_j (log t_j - log s_j);  n_valid += 1
 * Gradients (when the pointers are not NULL) are those of grad_scale * loss_sum:
 *   dI_j = grad_scale * (s_j - t_j), pushed through I to q_idx, weights and k_idx. */
typedef struct {
  double *loss_sum;         /* [1] out, overwritten (sum of loss_rows in query order) */
  int64_t *n_valid;         /* [1] out, overwritten */
  double *loss_rows;        /* [S1] out, overwritten: each query's term (0 when not valid);
                               may be NULL. Lets callers sum exactly across ranks. */
  float *d_q_idx;           /* [S1, Hi, Di] overwritten; may be NULL */
  float *d_weights;         /* [S1, Hi] overwritten; may be NULL */
  float *d_k_idx;           /* [C, Di] accumulated; may be NULL */
  const float *q;           /* [S1, H, D] main queries (teacher, detached) */
  const float *cmp_kv;      /* [C, D] main compressed kv (teacher, detached) */
  const int32_t *topk_ids;  /* [S1, topk] selected rows (sparse mode) */
  const float *q_idx;       /* [S1, Hi, Di] */
  const float *k_idx;       /* [C, Di] */
  const float *weights;     /* [S1, Hi] */
  const int32_t *vis_begin; /* [S1] visible rows (dense mode) */
  const int32_t *vis_count; /* [S1] */
  int64_t S1, C;
  int H, D, Hi, Di, topk;
  int dense;                /* 0: over sel[p]; 1: over all visible rows */
  float scale;              /* main attention scale, D^-0.5 */
  float grad_scale;         /* coeff / n_valid_global * dloss */
  const float *teacher;     /* [S1, topk] sparse mode: the teacher already computed by the attention
                               (dsv4_attn_args.teacher); may be NULL: computed here from q, cmp_kv */
  const float *scores;      /* [S1, topk] sparse mode: the indexer's scores of topk_ids
                               (topk_scores); may be NULL: recomputed here */
  int threads;              /* OpenMP threads; 0: the calling thread's default */
} dsv4_kl_args;

DSV4_API dsv4_status dsv4_indexer_kl_loss(const dsv4_kl_args *a);
DSV4_API dsv4_status dsv4_indexer_kl_loss_ref(const dsv4_kl_args *a);

/* ---------------------------------------------------------------------------------------------
 * Distributed layouts of the three operators (SPEC 5). Every tensor argument carries a placement
 * on the CP mesh of `nranks` ranks; each operator's infer rule returns the output placements or
 * rejects the layout with DSV4_ERR_LAYOUT and a message naming the argument. With nranks == 1
 * every placement is local and the operators are the plain single-rank ones.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
  DSV4_PLACE_REPLICATE = 0, /* every rank holds the whole tensor */
  DSV4_PLACE_SHARD_SEQ,     /* split along the sequence (the rank's tokens) */
  DSV4_PLACE_SHARD_HEAD,    /* split along heads or head dim: never accepted */
  DSV4_PLACE_PARTIAL_SUM,   /* every rank holds a partial sum of the whole tensor */
  DSV4_PLACE_WINDOW         /* the rank's rows preceded by a prepared left halo of `halo` rows */
} dsv4_place_kind;

typedef struct {
  dsv4_place_kind kind;
  int64_t halo;             /* DSV4_PLACE_WINDOW: halo rows in front of the local rows */
} dsv4_placement;

DSV4_API const char *dsv4_placement_name(dsv4_placement p); /* "SHARD(seq)", "WINDOW(127)", ... */

/* lightning_indexer: in = {q_idx, k_idx, weights}; out = {topk_ids, topk_scores}. */
DSV4_API dsv4_status dsv4_lightning_indexer_infer(int nranks, const dsv4_placement in[3], dsv4_placement out[2]);
/* sparse_attn_sharedkv: in = {q, ori_kv, cmp_kv, cmp_ids, sink} (cmp_* REPLICATE when absent);
 * out = {out, lse}; backward outputs bwd = {dq, d_ori_kv, d_cmp_kv, d_sink}. */
DSV4_API dsv4_status dsv4_sparse_attn_infer(int nranks, const dsv4_placement in[5], dsv4_placement out[2],
                                   dsv4_placement bwd[4]);
/* indexer_kl_loss: in = {q, cmp_kv, topk_ids, q_idx, k_idx, weights};
 * out = {loss, d_q_idx, d_weights, d_k_idx}. */
DSV4_API dsv4_status dsv4_indexer_kl_loss_infer(int nranks, const dsv4_placement in[6], dsv4_placement out[4]);

/* The operators behind their infer rules: the layout is checked (and a WINDOW placement checked
 * against the argument's row counts) before the local kernel runs. impl picks fast or naive. */
DSV4_API dsv4_status dsv4_lightning_indexer_dist(const dsv4_indexer_args *a, int nranks, const dsv4_placement in[3],
                                        dsv4_impl impl);
DSV4_API dsv4_status dsv4_sparse_attn_dist(const dsv4_attn_args *a, int nranks, const dsv4_placement in[5], dsv4_impl impl);
DSV4_API dsv4_status dsv4_sparse_attn_bwd_dist(const dsv4_attn_bwd_args *a, int nranks, const dsv4_placement in[5],
                                      dsv4_impl impl);
DSV4_API dsv4_status dsv4_indexer_kl_loss_dist(const dsv4_kl_args *a, int nranks, const dsv4_placement in[6],
                                      dsv4_impl impl);

#ifdef __cplusplus
}
#endif
#endif
