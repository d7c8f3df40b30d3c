/* dsv4cp.h: DeepSeek V4 hybrid attention (sliding window, CSA, HCA), forward and backward, with
 * two-stage context parallelism. The one public header of libdsv4cp.
 *
 * Conventions
 *  - Every exported symbol starts with dsv4_, every macro and enum value with DSV4_.
 *  - Functions return dsv4_status; on failure dsv4_last_error() holds one line that names the bad
 *    argument. The library never exits and never prints to stdout.
 *  - Tensors are fp32, row-major, contiguous; a comment gives each pointer's shape, e.g. // [T, H, D].
 *    Notation as in docs/spec.md ("SPEC n" in comments is its section n): T tokens, H heads,
 *    D head dim, d model dim, dq q latent, Hi/Di indexer
 *    heads/dim, C compressed slots, k = index_topk, r = compress ratio of the layer (0, 4, 128).
 *  - "overwritten" outputs are fully written; "accumulated" outputs are added into (zero them first).
 *  - Pointers marked "may be NULL" are optional.
 */
#ifndef DSV4CP_H
#define DSV4CP_H

#include <stddef.h>
#include <stdint.h>

/* Version of this header and library (dsv4_version() reports the library's at run time). */
#define DSV4_VERSION_MAJOR 0
#define DSV4_VERSION_MINOR 2
#define DSV4_VERSION_PATCH 0
#define DSV4_VERSION_STRING "0.2.0"

/* Exported symbols: the library is built with -fvisibility=hidden, so only what this header and
 * dsv4cp_mpi.h declare is visible to programs linking the shared library. */
#if defined(DSV4_BUILDING_LIBRARY) && defined(__GNUC__)
#define DSV4_API __attribute__((visibility("default")))
#else
#define DSV4_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* "MAJOR.MINOR.PATCH" of the library actually linked (compare with DSV4_VERSION_STRING). */
DSV4_API const char *dsv4_version(void);

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */
typedef enum {
  DSV4_OK = 0,
  DSV4_ERR_ARG,         /* an argument has a bad value or shape */
  DSV4_ERR_CONFIG,      /* a config key is missing or impossible */
  DSV4_ERR_IO,          /* a file cannot be opened, read or written */
  DSV4_ERR_FORMAT,      /* a file is malformed (truncated, garbage header) */
  DSV4_ERR_TENSOR,      /* a tensor is missing or has the wrong shape or dtype */
  DSV4_ERR_NOMEM,       /* allocation failed */
  DSV4_ERR_LAYOUT,      /* a distributed layout was rejected by an operator's infer rule */
  DSV4_ERR_COMM,        /* communication failed, or ranks disagree on their inputs */
  DSV4_ERR_STATE,       /* call out of order (e.g. backward without a training forward) */
  DSV4_ERR_UNSUPPORTED  /* a valid request this build does not support */
} dsv4_status;

DSV4_API const char *dsv4_status_string(dsv4_status st);
/* Message of the last failure on the calling thread (names the failing argument). */
DSV4_API const char *dsv4_last_error(void);
/* "file.c:123" where the last failure was detected. */
DSV4_API const char *dsv4_last_error_location(void);
DSV4_API void dsv4_clear_error(void);

/* ---------------------------------------------------------------------------------------------
 * Configuration (SPEC section 1)
 * ------------------------------------------------------------------------------------------- */
#define DSV4_MAX_LAYERS 1024

typedef enum { DSV4_KL_SPARSE = 0, DSV4_KL_DENSE = 1 } dsv4_kl_mode;

typedef struct {
  int dim;              /* hidden_size, d */
  int n_heads;          /* num_attention_heads, H */
  int head_dim;         /* head_dim, D (one shared KV head: K = V) */
  int rope_dim;         /* qk_rope_head_dim, R: RoPE on the last R dims of every rotated vector */
  int q_lora_rank;      /* dq */
  int o_groups;         /* G */
  int o_lora_rank;      /* Ro */
  int window;           /* sliding_window, W */
  int index_n_heads;    /* Hi */
  int index_head_dim;   /* Di */
  int index_topk;       /* k */
  int n_layers;         /* length of compress_ratios */
  int compress_ratios[DSV4_MAX_LAYERS]; /* r per layer: 0, 4 or 128 */
  double rope_theta;          /* r == 0 layers, no YaRN */
  double compress_rope_theta; /* r > 0 layers, with YaRN */
  double rope_factor;         /* rope_scaling.factor */
  double rope_orig_max_pos;   /* rope_scaling.original_max_position_embeddings; 0 disables YaRN */
  double beta_fast, beta_slow;
  double eps;                 /* rms_norm_eps */
  double index_loss_coeff;    /* index_loss_coeff (not a DeepSeek key; default 1e-3; 0 = loss off) */
  dsv4_kl_mode index_loss_mode; /* index_loss_mode: "sparse" (over sel[p]) or "dense" (all visible) */
  int n_hidden_layers;  /* num_hidden_layers (ModelArgs: n_layers): layers L >= it are the
                           multi-token-prediction layers, named mtp.{L - n_hidden_layers}.attn.* in
                           checkpoints; 0 = unknown (every layer named layers.L.attn.*) */
  int fp8_block[2];     /* quantization_config.weight_block_size: rows x cols of the weight block one
                           FP8 scale covers (128 x 128 in V4); 0 = not given, which means 128 */
} dsv4_config;

/* Built-in presets: "flash" (V4-Flash, 43 layers + the MTP layer), "pro" (V4-Pro, 61 + MTP), "tiny"
 * (small dims for tests/demos: layers 0, 1, 2 are SWA, CSA, HCA, no MTP layer). */
DSV4_API dsv4_status dsv4_config_preset(dsv4_config *cfg, const char *name);
/* Parses a DeepSeek V4 config.json (text or file): the released Hugging Face style keys
 * (hidden_size, rope_scaling, ...) or the ModelArgs names of DeepSeek's inference code (dim,
 * n_heads, window_size, rope_factor, original_seq_len, ...); a quantity given under both names
 * with different values is an error naming both keys. Structural keys are required (never the
 * ModelArgs debug defaults); rope/eps keys default to V4-Flash values, except that a ModelArgs-style
 * file must give compress_rope_theta and original_seq_len (and rope_factor when YaRN is on), whose
 * ModelArgs defaults differ. quantization_config must be fp8 / e4m3 / ue8m0-or-F32 scales with any
 * weight_block_size, or absent. Every number is range-checked; unknown keys are ignored. */
DSV4_API dsv4_status dsv4_config_parse(dsv4_config *cfg, const char *json_text);
DSV4_API dsv4_status dsv4_config_load(dsv4_config *cfg, const char *path);
/* Checks every value (H % o_groups, rope_dim even and <= every rotated vector, ratios in {0,4,128}...). */
DSV4_API dsv4_status dsv4_config_validate(const dsv4_config *cfg);
/* Compress ratio of a layer, or -1 when layer is out of range. */
DSV4_API int dsv4_config_ratio(const dsv4_config *cfg, int layer);

/* ---------------------------------------------------------------------------------------------
 * Weights of one layer (SPEC section 2): an owned set of fp32 tensors with DeepSeek's names.
 * The same object type holds gradients (dsv4_weights_create gives zeros).
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_weights dsv4_weights;

typedef struct {
  const char *name;   /* short name, e.g. "attn.wq_a.weight" */
  int ndim;           /* 1 or 2 */
  int64_t shape[2];
  int64_t numel;
  float *data;
} dsv4_tensor;

DSV4_API dsv4_status dsv4_weights_create(dsv4_weights **out, const dsv4_config *cfg, int layer);
DSV4_API void dsv4_weights_free(dsv4_weights *w);
DSV4_API int dsv4_weights_count(const dsv4_weights *w);
DSV4_API dsv4_status dsv4_weights_get(const dsv4_weights *w, int i, dsv4_tensor *t);
/* Tensor by short name ("attn.wq_a.weight") or full name ("layers.2.attn.wq_a.weight", or with the
 * prefix it was loaded under, e.g. "mtp.0.attn.wq_a.weight"); NULL if absent. */
DSV4_API float *dsv4_weights_find(const dsv4_weights *w, const char *name);
DSV4_API void dsv4_weights_zero(dsv4_weights *w);
/* Deterministic random values from seed: element i of tensor t depends only on (seed, t's name, i). */
DSV4_API dsv4_status dsv4_weights_init_random(dsv4_weights *w, uint64_t seed);
/* Loads the layer's tensors from a checkpoint (SPEC 2): a .safetensors file, a
 * model.safetensors.index.json (shards relative to it), or a directory holding one. Names are
 * "layers.L.<short>" (the multi-token-prediction layer L >= cfg.n_hidden_layers:
 * "mtp.{L - n_hidden_layers}.<short>"), optionally with "model." in front, or bare "<short>" in a
 * one-layer file. Only the layer's tensors are read, by byte range; other tensors of any dtype are
 * skipped. F32/BF16/F16, and F8_E4M3 2-d weights with their E8M0 (or F32) block scale, dequantised
 * exactly. A missing tensor or shard, a wrong shape, dtype or scale, a NaN or infinite weight is an
 * error naming the file and the tensor. */
DSV4_API dsv4_status dsv4_weights_load(dsv4_weights *w, const char *path);
/* Prefix of the tensor names the layer was loaded from ("layers.L.", "mtp.0.", "model.layers.L.",
 * "" ...; random weights: "layers.L."), for naming gradients. */
DSV4_API const char *dsv4_weights_prefix(const dsv4_weights *w);
/* dst += src, tensor by tensor (same config and layer). */
DSV4_API dsv4_status dsv4_weights_add(dsv4_weights *dst, const dsv4_weights *src);

/* ---------------------------------------------------------------------------------------------
 * Packed sequences (SPEC section 4)
 * ------------------------------------------------------------------------------------------- */
typedef struct {
  const int32_t *cu_seqlens;   /* [n_docs + 1] prefix sums of PADDED lengths, cu[0] = 0, cu[n] = T;
                                  may be NULL: one document [0, T) */
  const int32_t *seqlens_real; /* [n_docs] real tokens per document (0 < real <= padded); may be NULL */
  int n_docs;                  /* ignored when cu_seqlens is NULL */
  int64_t T;                   /* GLOBAL packed token count (all ranks together) */
  int batched;                 /* 1: B equal-length sequences (BSND); under CP each rank then holds
                                  S/N tokens of EVERY sequence instead of a contiguous T/N slice */
} dsv4_packing;

/* Which implementation runs: the fast kernels (BLAS, OpenMP) or the naive reference loops. */
typedef enum { DSV4_IMPL_FAST = 0, DSV4_IMPL_NAIVE = 1 } dsv4_impl;

/* ---------------------------------------------------------------------------------------------
 * The three operators, usable on their own. Each has a fast version and a naive reference (_ref)
 * with the same arguments. Row indices in the argument structs are into the tensors passed, so the
 * same kernels serve one rank and CP shards (where ori_kv carries a left halo and k_idx / cmp_kv are
 * the gathered global compressed sequence).
 * ------------------------------------------------------------------------------------------- */

/* lightning_indexer: I[p, j] = sum_h w[p,h] * ReLU(q_idx[p,h] . k_idx[j]) over the visible rows
 * j in [vis_begin[p], vis_begin[p] + vis_count[p]); returns the min(topk, vis_count[p]) best rows
 * sorted by (score desc, row asc), padded with -1 (scores -INFINITY). */
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

/* ---------------------------------------------------------------------------------------------
 * Core attention: everything after the q/kv projections and before the output projection
 * (compressor, indexer, sink, sparse attention, KL loss). Its forward and backward are called
 * through function pointers so that dsv4_cp_patch can swap them; the model code never changes.
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_core dsv4_core;

typedef struct {
  float *o;                 /* [n, H, D] out: attention output per head, before inverse RoPE */
  int32_t *topk_ids;        /* [n, k] out (r == 4): global compressed ids, -1 padded; may be NULL */
  float *indexer_loss;      /* [1] out (r == 4): the whole-batch loss (CP: on every rank); may be NULL */
  const float *q;           /* [n, H, D] queries after per-head RMSNorm and RoPE */
  const float *kv;          /* [n, D] shared key/value after kv_norm and RoPE */
  const float *x;           /* [n, d] layer input (compressors, indexer weights) */
  const float *qr;          /* [n, dq] normed query latent (indexer queries) */
  const dsv4_packing *pk;   /* global packing meta */
  int64_t n;                /* local rows */
  int train;                /* 1: keep what backward needs (q, kv, x, qr, o must stay valid until then) */
} dsv4_core_fwd_args;

typedef struct {
  float *dq;                /* [n, H, D] overwritten; may alias d_o (saves n H D floats) */
  float *dkv;               /* [n, D] overwritten */
  float *dx;                /* [n, d] accumulated (main compressor path; the indexer is detached) */
  dsv4_weights *grads;      /* accumulated: attn_sink, compressor.*, indexer.* (per-rank partial) */
  const float *d_o;         /* [n, H, D] */
  float d_loss;             /* d objective / d indexer_loss (1 for sum(out * dout) + indexer_loss) */
} dsv4_core_bwd_args;

/* The core borrows w (attn_sink, compressor.*, indexer.*), which must outlive it. */
DSV4_API dsv4_status dsv4_core_create(dsv4_core **out, const dsv4_config *cfg, int layer, const dsv4_weights *w);
DSV4_API void dsv4_core_free(dsv4_core *c);
DSV4_API void dsv4_core_set_impl(dsv4_core *c, dsv4_impl impl);
DSV4_API dsv4_status dsv4_core_forward(dsv4_core *c, const dsv4_core_fwd_args *a);
DSV4_API dsv4_status dsv4_core_backward(dsv4_core *c, const dsv4_core_bwd_args *a);

/* ---------------------------------------------------------------------------------------------
 * The layer: q/kv projections, the core, inverse RoPE and the grouped output projection.
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_layer dsv4_layer;

/* The layer borrows cfg's values (copied) and w (must outlive it). */
DSV4_API dsv4_status dsv4_layer_create(dsv4_layer **out, const dsv4_config *cfg, int layer, const dsv4_weights *w);
DSV4_API void dsv4_layer_free(dsv4_layer *l);
DSV4_API dsv4_core *dsv4_layer_core(dsv4_layer *l);
/* NAIVE: reference loops for every product and operator (slow; for self-checks). */
DSV4_API void dsv4_layer_set_impl(dsv4_layer *l, dsv4_impl impl);
/* on = 1: recomputation. A training forward keeps neither the queries q nor the attention output o
 * (2 H D floats per row, most of what the layer keeps) nor the indexer queries; the backward
 * rebuilds them chunk by chunk (512 rows at a time), so transient buffers stay bounded
 * too. Results (forward and backward) are bitwise the same as without it; the cost is one more
 * query projection and attention forward in the backward. Forgets a pending training forward. */
DSV4_API dsv4_status dsv4_layer_set_recompute(dsv4_layer *l, int on);

/* Forward over the n local rows of x. out: [n, d] overwritten (zero on padding rows);
 * topk_ids: [n, k] (r == 4; may be NULL); indexer_loss: [1] (r == 4; may be NULL).
 * train = 1 keeps activations for dsv4_layer_backward (x must stay valid until then). */
DSV4_API dsv4_status dsv4_layer_forward(dsv4_layer *l, float *out, int32_t *topk_ids, float *indexer_loss,
                               const float *x, int64_t n, const dsv4_packing *pk, int train);
/* Backward of sum(out * dout) + d_loss * indexer_loss. dx: [n, d] overwritten (zero on padding);
 * grads: accumulated (per-rank partial sums under CP; see dsv4_cp_allreduce_grads). */
DSV4_API dsv4_status dsv4_layer_backward(dsv4_layer *l, float *dx, dsv4_weights *grads, const float *dout,
                                float d_loss);

/* FLOPs one layer call must do (docs/perf.md): real tokens only, no recomputation counted. */
typedef struct {
  double fwd, bwd;                                   /* totals */
  double projections_fwd, attention_fwd, indexer_fwd;
  double projections_bwd, attention_bwd, indexer_bwd;
  double tokens;                                     /* real tokens counted */
} dsv4_flops;

DSV4_API dsv4_status dsv4_layer_flops(const dsv4_config *cfg, int layer, const dsv4_packing *pk, dsv4_flops *f);

/* Bytes the layer (and its core) hold for the backward after a training forward on this rank. */
DSV4_API size_t dsv4_layer_saved_bytes(const dsv4_layer *l);

/* ---------------------------------------------------------------------------------------------
 * Context parallelism (SPEC section 5)
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_comm dsv4_comm;

/* A communicator of one rank (no messages). MPI: see dsv4cp_mpi.h. */
DSV4_API dsv4_status dsv4_comm_create_self(dsv4_comm **out);
DSV4_API void dsv4_comm_free(dsv4_comm *c);
DSV4_API int dsv4_comm_rank(const dsv4_comm *c);
DSV4_API int dsv4_comm_size(const dsv4_comm *c);

typedef enum {
  DSV4_SPLIT_CONTIGUOUS = 0, /* rank q holds tokens [q L, (q+1) L) */
  DSV4_SPLIT_ZIGZAG = 1      /* 2N chunks; rank q holds chunks q and 2N-1-q (balances causal work) */
} dsv4_split;

typedef struct {
  dsv4_split split;
  int overlap;               /* 1: overlap the Stage-1 all-gather with window attention */
} dsv4_cp_config;

/* Message kinds for accounting (forward and backward). */
typedef enum {
  DSV4_MSG_WINDOW_HALO = 0,
  DSV4_MSG_COMPRESSOR_HALO,
  DSV4_MSG_SLOT_ALLGATHER,
  DSV4_MSG_LOSS_REDUCE,
  DSV4_MSG_META_CHECK,
  DSV4_MSG_WINDOW_HALO_BWD,
  DSV4_MSG_COMPRESSOR_HALO_BWD,
  DSV4_MSG_SLOT_REDUCE_SCATTER,
  DSV4_MSG_KINDS
} dsv4_msg_kind;

typedef struct {
  uint64_t bytes_sent[DSV4_MSG_KINDS];
  uint64_t bytes_recv[DSV4_MSG_KINDS];
  uint64_t messages[DSV4_MSG_KINDS];
  double seconds[DSV4_MSG_KINDS];   /* wall time spent waiting for each kind */
  double hidden_seconds;            /* Stage-1 all-gather time overlapped with computation */
  double overlap_window_seconds;    /* time of the computation it overlapped with */
} dsv4_cp_stats;

DSV4_API const char *dsv4_msg_kind_name(dsv4_msg_kind k);

/* The plan of one layer forward + backward under CP, computed on the host (docs/cp.md): bytes and
 * messages per kind for rank `rank` of `size` (what dsv4_cp_get_stats measures, exactly). */
DSV4_API dsv4_status dsv4_cp_plan_traffic(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                          const dsv4_cp_config *cp, int rank, int size, dsv4_cp_stats *out);
/* The same for every rank at once (out: [size]); much faster than size calls for large size. */
DSV4_API dsv4_status dsv4_cp_plan_traffic_all(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                              const dsv4_cp_config *cp, int size, dsv4_cp_stats *out);

/* How a layer will be run, for planning its memory. */
typedef struct {
  int recompute;     /* dsv4_layer_set_recompute */
  int threads;       /* OpenMP threads per rank (per-thread scratch); 0 = 1 */
} dsv4_plan_opts;

/* What one rank holds for one layer forward + backward, in bytes. */
typedef struct {
  uint64_t weights;    /* the layer's weight set (fp32) */
  uint64_t grads;      /* its gradients (as large) */
  uint64_t saved;      /* activations a training forward keeps for the backward (dsv4_layer_saved_bytes) */
  uint64_t replicated; /* of saved: the global compressed kv and indexer keys every rank holds whole:
                          they grow with T, not with T / N */
  uint64_t transient;  /* the library's other buffers at the peak (temporaries stay in per-object
                          buffers between calls) and per-call scratch */
  uint64_t io;         /* the caller's per-rank x, dout, out, dx and top-k ids */
  uint64_t total;      /* the sum of the above but replicated (already in saved) */
} dsv4_memory_plan;

DSV4_API dsv4_status dsv4_cp_plan_memory(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                         const dsv4_cp_config *cp, const dsv4_plan_opts *opts, int rank, int size,
                                         dsv4_memory_plan *out);

/* The global rows rank `rank` of `size` holds (SPEC 5): for the contiguous split the slice
 * [rank L, (rank+1) L) of the stream, L = T / size (for batched input the same slice of every
 * sequence); for zigzag, chunks rank and 2 size - 1 - rank of 2 size (of every sequence).
 * rows: [n] out, may be NULL to query n. Fails (the same way on every rank) when T, or the
 * sequence length, does not divide. */
DSV4_API dsv4_status dsv4_cp_shard_rows(const dsv4_packing *pk, const dsv4_cp_config *cfg, int rank, int size,
                               int64_t *rows, int64_t *n);

/* Swaps the core's forward/backward for the two-stage CP versions over comm. The core keeps its
 * weights; the comm must outlive the core. After this, dsv4_core_forward (and the layer) take
 * LOCAL shards and return the local shard of the CP = 1 result. */
DSV4_API dsv4_status dsv4_cp_patch(dsv4_core *core, dsv4_comm *comm, const dsv4_cp_config *cfg);
/* Sums per-rank partial weight gradients over the CP group (every rank gets the total). */
DSV4_API dsv4_status dsv4_cp_allreduce_grads(dsv4_comm *comm, dsv4_weights *grads);
/* Communication counters of a patched core (zeroed by dsv4_cp_stats_reset). */
DSV4_API dsv4_status dsv4_cp_get_stats(const dsv4_core *core, dsv4_cp_stats *st);
DSV4_API void dsv4_cp_stats_reset(dsv4_core *core);

#ifdef __cplusplus
}
#endif
#endif
