/* dsv4cp.h: DeepSeek V4 hybrid attention (sliding window, CSA, HCA), forward and backward, with
 * two-stage context parallelism: the layer API of libdsv4cp. Beside it: dsv4cp_mpi.h (the MPI
 * communicator), dsv4cp_ops.h (the three operators on their own, their naive references and
 * layouts) and dsv4cp_io.h (safetensors files, checkpoints, seeded random inputs).
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
 *  - Structs a caller fills or receives begin with struct_size and struct_version (NCCL's idea):
 *    initialise them with their DSV4_..._INIT macro (e.g. `dsv4_packing pk = DSV4_PACKING_INIT;`,
 *    then set fields). The library reads only the first struct_size bytes of an input (fields a
 *    caller's older header lacks take their defaults) and writes only the first struct_size bytes
 *    of an output, so structs can grow without breaking callers or bindings. A struct_size of 0 is
 *    refused (DSV4_ERR_ARG: the struct was not initialised).
 *  - Threads: every object runs its parallel regions with its own thread count (dsv4_*_set_threads;
 *    0: the calling thread's OpenMP default); the library never changes process-wide OpenMP or BLAS
 *    settings.
 *  - "Collective" functions must be called by every rank of the object's communicator, in the same
 *    order (a rank that calls one alone waits forever for the others). On one rank nothing is
 *    collective.
 */
#ifndef DSV4CP_H
#define DSV4CP_H

#include <stddef.h>
#include <stdint.h>

/* Version of this header and library (dsv4_version() reports the library's at run time). */
#define DSV4_VERSION_MAJOR 0
#define DSV4_VERSION_MINOR 4
#define DSV4_VERSION_PATCH 0
#define DSV4_VERSION_STRING "0.4.0"

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

/* Versioned structs (see the conventions above). */
#define DSV4_STRUCT_VERSION 1u
#define DSV4_STRUCT_HEAD \
  uint32_t struct_size;  /* sizeof the struct as the caller compiled it (set by DSV4_..._INIT) */ \
  uint32_t struct_version /* DSV4_STRUCT_VERSION */
/* The head of a versioned struct inside a designated initialiser: {DSV4_HEAD(dsv4_packing), .T = 64} */
#define DSV4_HEAD(type) .struct_size = (uint32_t)sizeof(type), .struct_version = DSV4_STRUCT_VERSION

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
 * Configuration (docs/spec.md section 1; DeepSeek V4.1: section 10)
 * ------------------------------------------------------------------------------------------- */
#define DSV4_MAX_LAYERS 1024

typedef enum { DSV4_KL_SPARSE = 0, DSV4_KL_DENSE = 1 } dsv4_kl_mode;

typedef struct {
  DSV4_STRUCT_HEAD;
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
  int compress_ratios[DSV4_MAX_LAYERS]; /* r per layer: 0, 4 or 128 (V4.1: 0, 1 or 2) */
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
                           FP8 scale covers (128 x 128 in V4, 32 x 32 in V4.1); 0 = not given (128) */
  /* DeepSeek V4.1 (CSA2; docs/spec.md section 10): layers share compressed kv and top-k */
  int v41;              /* 1: a V4.1 config (kv_source_layer_ids given) */
  int n_kv_sources;     /* kv_source_layer_ids (sorted): the layers that own a compressor */
  int kv_sources[DSV4_MAX_LAYERS];
  int n_index_sources;  /* index_source_layer_ids (sorted): the layers that select (own indexer queries) */
  int index_sources[DSV4_MAX_LAYERS];
  int candidate_source; /* candidate_source_layer_id: ranks blocks of entries for the later index
                           sources; -1: none */
  int candidate_topk_blocks, candidate_block_size;
} dsv4_config;
#define DSV4_CONFIG_INIT {DSV4_HEAD(dsv4_config)}

/* Built-in presets: "flash" (V4-Flash, 43 layers + the MTP layer), "pro" (V4-Pro, 61 + MTP), "tiny"
 * (small dims for tests/demos: layers 0, 1, 2 are SWA, CSA, HCA, no MTP layer), "flash41"
 * (V4.1-Flash: 40 layers + 3 DSpark stages) and "tiny41" (small V4.1 dims with every role: layers
 * 0 and 9 window only, 1 FULL r = 2 (kv source), 2 and 4 REUSE, 3 REINDEX, 5 FULL r = 1 (kv and
 * candidate source), 6 and 8 REUSE, 7 REINDEX selecting inside the candidates). The three
 * functions below write *cfg (its struct_size must be set: DSV4_CONFIG_INIT). */
DSV4_API dsv4_status dsv4_config_preset(dsv4_config *cfg, const char *name);
/* Parses a DeepSeek V4 / V4.1 config.json (text or file): the released Hugging Face style keys
 * (hidden_size, rope_scaling, ...; V4.1 nests them under text_config, quantization_config at the
 * top) or the ModelArgs names of DeepSeek's inference code (dim, n_heads, window_size, rope_factor,
 * original_seq_len, kv_source_layers, ...); a quantity given under both names with different values
 * is an error naming both keys. V4.1 is detected by kv_source_layer_ids (or kv_source_layers);
 * its roles are validated (docs/spec.md section 10), errors naming the key and the layer. Structural keys are required (never the
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

/* What a layer does. V4: a compressed layer owns its compressor (and, r = 4, its indexer): OWN.
 * V4.1 (docs/spec.md section 10): FULL owns the compressor and indexer keys (a kv source, also an
 * index source), REINDEX selects with its own indexer queries against its kv source's keys, REUSE
 * reads its kv source's compressed kv and its index source's selection. */
typedef enum { DSV4_ROLE_WINDOW = 0, DSV4_ROLE_OWN, DSV4_ROLE_FULL, DSV4_ROLE_REINDEX, DSV4_ROLE_REUSE } dsv4_role;

typedef struct {
  DSV4_STRUCT_HEAD;
  int layer, ratio;
  dsv4_role role;
  int kv_source;           /* the layer whose compressed kv it attends to (itself, or -1 for none) */
  int index_source;        /* the layer whose selection it uses (itself, or -1: none / all visible) */
  int selects;             /* 1: it computes a top-k (and has the KL loss) */
  int candidate_source;    /* 1: it ranks candidate blocks for the later index sources */
  int uses_candidates;     /* 1: it selects only inside the candidate source's blocks */
} dsv4_layer_info;
#define DSV4_LAYER_INFO_INIT {DSV4_HEAD(dsv4_layer_info)}

/* The role of a layer (out->struct_size set). Errors: layer out of range; a V4.1 layer at or above
 * num_hidden_layers (the DSpark draft stages are not this layer). */
DSV4_API dsv4_status dsv4_config_layer(const dsv4_config *cfg, int layer, dsv4_layer_info *out);

/* ---------------------------------------------------------------------------------------------
 * The state DeepSeek V4.1 layers share in one forward pass (docs/spec.md section 10): a kv source
 * writes its global compressed kv and indexer keys there, an index source its top-k ids (the
 * candidate source also its candidate blocks); the layers of its group read them; in the backward
 * they add their gradients of the compressed kv and keys there, and the kv source's backward, which
 * comes last, uses the sums. The caller owns one per forward pass, hands it to every layer
 * (dsv4_layer_fwd_args.shared), calls the layers in order for the forward and in reverse for the
 * backward, and keeps it (not reset, not freed) until the pass's last backward. A consumer whose
 * source did not run in the pass, a packing that differs from its source's, a backward out of order
 * or after a reset is an error naming the layers. V4 layers ignore it; a kv source given none uses
 * one of its own (it needs no other layer).
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_shared dsv4_shared;

DSV4_API dsv4_status dsv4_shared_create(dsv4_shared **out);
/* Starts a new forward pass: forgets every entry (their buffers are kept for the next pass). */
DSV4_API void dsv4_shared_reset(dsv4_shared *s);
DSV4_API void dsv4_shared_free(dsv4_shared *s);
/* Bytes its buffers hold. */
DSV4_API size_t dsv4_shared_bytes(const dsv4_shared *s);
/* Declares that `layer`, which read a kv source's compressed kv in this pass's training forward,
 * will not run its backward (its outputs do not reach the loss): its gradient contribution is zero,
 * and the source's backward no longer waits for it. Call it before the source's backward, on every
 * rank alike. Errors: the layer read no kv source in this pass, or its backward (or its source's)
 * already ran. */
DSV4_API dsv4_status dsv4_shared_skip_backward(dsv4_shared *s, int layer);

/* ---------------------------------------------------------------------------------------------
 * Weights of one layer (SPEC section 2): an owned set of fp32 tensors with DeepSeek's names.
 * The same object type holds gradients (dsv4_weights_create gives zeros).
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_weights dsv4_weights;

typedef struct {
  DSV4_STRUCT_HEAD;
  const char *name;   /* short name, e.g. "attn.wq_a.weight" */
  int ndim;           /* 1 or 2 */
  int64_t shape[2];
  int64_t numel;
  float *data;
} dsv4_tensor;
#define DSV4_TENSOR_INIT {DSV4_HEAD(dsv4_tensor)}

DSV4_API dsv4_status dsv4_weights_create(dsv4_weights **out, const dsv4_config *cfg, int layer);
DSV4_API void dsv4_weights_free(dsv4_weights *w);
DSV4_API int dsv4_weights_count(const dsv4_weights *w);
/* Tensor i (0 <= i < count) into *t (t->struct_size set: DSV4_TENSOR_INIT); data points into w. */
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
  DSV4_STRUCT_HEAD;
  const int32_t *cu_seqlens;   /* [n_docs + 1] prefix sums of PADDED lengths, cu[0] = 0, cu[n] = T;
                                  may be NULL: one document [0, T) */
  const int32_t *seqlens_real; /* [n_docs] real tokens per document (0 < real <= padded); may be NULL */
  int n_docs;                  /* ignored when cu_seqlens is NULL */
  int64_t T;                   /* GLOBAL packed token count (all ranks together) */
  int batched;                 /* 1: B equal-length sequences (BSND); under CP each rank then holds
                                  S/N tokens of EVERY sequence instead of a contiguous T/N slice */
} dsv4_packing;
#define DSV4_PACKING_INIT {DSV4_HEAD(dsv4_packing)}

/* Which implementation runs: the fast kernels (BLAS, OpenMP) or the naive reference loops. */
typedef enum { DSV4_IMPL_FAST = 0, DSV4_IMPL_NAIVE = 1 } dsv4_impl;

/* ---------------------------------------------------------------------------------------------
 * Core attention: everything after the q/kv projections and before the output projection
 * (compressor, indexer, sink, sparse attention, KL loss), the object dsv4_cp_patch gives a
 * communicator. A core starts on a one-rank communicator; patched, the same calls take this rank's
 * shard and return its shard of the one-rank result (the stages, docs/design.md, are the same).
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_core dsv4_core;

typedef struct {
  DSV4_STRUCT_HEAD;
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
  dsv4_shared *shared;      /* V4.1: this forward pass's shared state (see dsv4_shared); V4: ignored */
} dsv4_core_fwd_args;
#define DSV4_CORE_FWD_ARGS_INIT {DSV4_HEAD(dsv4_core_fwd_args)}

typedef struct {
  DSV4_STRUCT_HEAD;
  float *dq;                /* [n, H, D] overwritten; may alias d_o (saves n H D floats) */
  float *dkv;               /* [n, D] overwritten */
  float *dx;                /* [n, d] accumulated (main compressor path; the indexer is detached) */
  dsv4_weights *grads;      /* accumulated: attn_sink, compressor.*, indexer.* (summed over the CP
                               group: every rank gets the total, the same bits for every N) */
  const float *d_o;         /* [n, H, D] */
  float d_loss;             /* d objective / d indexer_loss (1 for sum(out * dout) + indexer_loss) */
} dsv4_core_bwd_args;
#define DSV4_CORE_BWD_ARGS_INIT {DSV4_HEAD(dsv4_core_bwd_args), .d_loss = 1.0f}

/* The core borrows w (attn_sink, compressor.*, indexer.*), which must outlive it. */
DSV4_API dsv4_status dsv4_core_create(dsv4_core **out, const dsv4_config *cfg, int layer, const dsv4_weights *w);
/* Collective when patched (frees nothing of the communicator, which the caller owns). */
DSV4_API void dsv4_core_free(dsv4_core *c);
DSV4_API void dsv4_core_set_impl(dsv4_core *c, dsv4_impl impl);
/* OpenMP threads of this core's calls; 0 (the default): the calling thread's OpenMP default. */
DSV4_API dsv4_status dsv4_core_set_threads(dsv4_core *c, int threads);
/* Collective. The forward over this rank's n rows; begins with one agreement check of every rank's
 * config, packing meta, row count and split (a mismatch fails on every rank). */
DSV4_API dsv4_status dsv4_core_forward(dsv4_core *c, const dsv4_core_fwd_args *a);
/* Collective. The backward of the latest training forward. */
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

/* OpenMP threads of this layer's calls; 0 (the default): the calling thread's OpenMP default. */
DSV4_API dsv4_status dsv4_layer_set_threads(dsv4_layer *l, int threads);

/* Forward over this rank's n rows of x. */
typedef struct {
  DSV4_STRUCT_HEAD;
  float *out;               /* [n, d] out, overwritten (zero on padding rows) */
  int32_t *topk_ids;        /* [n, k] out (r == 4; V4.1 index sources): global compressed ids, -1
                               padded; may be NULL (left untouched by layers that do not select) */
  float *indexer_loss;      /* [1] out (r == 4; V4.1 index sources): the whole-batch KL loss (CP: on
                               every rank); may be NULL */
  const float *x;           /* [n, d] this rank's rows (must stay valid until the backward when train) */
  int64_t n;                /* local rows */
  const dsv4_packing *pk;   /* GLOBAL packing meta (every rank the same) */
  int train;                /* 1: keep what dsv4_layer_backward needs */
  dsv4_shared *shared;      /* V4.1: this forward pass's shared state (see dsv4_shared); NULL for a
                               layer that needs no other (window-only, a kv source); V4: ignored */
} dsv4_layer_fwd_args;
#define DSV4_LAYER_FWD_ARGS_INIT {DSV4_HEAD(dsv4_layer_fwd_args)}

/* Backward of sum(out * dout) + d_loss * indexer_loss for the latest training forward. */
typedef struct {
  DSV4_STRUCT_HEAD;
  float *dx;                /* [n, d] out, overwritten (zero on padding rows) */
  dsv4_weights *grads;      /* accumulated: grads += the gradients summed over the CP group (every
                               rank gets the total, the same bits for every N, split and thread
                               count: the backward is collective; it consumes the forward's saved
                               state, so one backward per training forward; after a failed
                               backward the gradient set's contents are unspecified) */
  const float *dout;        /* [n, d] */
  float d_loss;             /* d objective / d indexer_loss (default 1) */
} dsv4_layer_bwd_args;
#define DSV4_LAYER_BWD_ARGS_INIT {DSV4_HEAD(dsv4_layer_bwd_args), .d_loss = 1.0f}

/* Collective under CP (the core's communicator); one agreement check first, as dsv4_core_forward. */
DSV4_API dsv4_status dsv4_layer_forward(dsv4_layer *l, const dsv4_layer_fwd_args *a);
/* Collective under CP. */
DSV4_API dsv4_status dsv4_layer_backward(dsv4_layer *l, const dsv4_layer_bwd_args *a);

/* FLOPs one layer call must do (docs/perf.md): real tokens only, no recomputation counted. */
typedef struct {
  DSV4_STRUCT_HEAD;
  double fwd, bwd;                                   /* totals */
  double projections_fwd, attention_fwd, indexer_fwd;
  double projections_bwd, attention_bwd, indexer_bwd;
  double tokens;                                     /* real tokens counted */
} dsv4_flops;
#define DSV4_FLOPS_INIT {DSV4_HEAD(dsv4_flops)}

DSV4_API dsv4_status dsv4_layer_flops(const dsv4_config *cfg, int layer, const dsv4_packing *pk, dsv4_flops *f);

/* Bytes the layer (and its core) hold for the backward after a training forward on this rank. */
DSV4_API size_t dsv4_layer_saved_bytes(const dsv4_layer *l);

/* ---------------------------------------------------------------------------------------------
 * Context parallelism (SPEC section 5)
 * ------------------------------------------------------------------------------------------- */
typedef struct dsv4_comm dsv4_comm;

/* A communicator of one rank (no messages). MPI: see dsv4cp_mpi.h. */
DSV4_API dsv4_status dsv4_comm_create_self(dsv4_comm **out);
/* Collective for an MPI communicator (it frees the library's duplicate). */
DSV4_API void dsv4_comm_free(dsv4_comm *c);
DSV4_API int dsv4_comm_rank(const dsv4_comm *c);
DSV4_API int dsv4_comm_size(const dsv4_comm *c);

typedef enum {
  DSV4_SPLIT_CONTIGUOUS = 0, /* rank q holds tokens [q L, (q+1) L) */
  DSV4_SPLIT_ZIGZAG = 1      /* 2N chunks; rank q holds chunks q and 2N-1-q (balances causal work) */
} dsv4_split;

typedef struct {
  DSV4_STRUCT_HEAD;
  dsv4_split split;
  int overlap;               /* 1 (default): the Stage-1 all-gather runs while the window phase computes;
                                0: it blocks (stats report hidden_seconds 0); results are the same bits */
} dsv4_cp_config;
#define DSV4_CP_CONFIG_INIT {DSV4_HEAD(dsv4_cp_config), .split = DSV4_SPLIT_CONTIGUOUS, .overlap = 1}

/* Message kinds for accounting (forward and backward; docs/cp.md gives each one's bytes). The
 * three WGRAD kinds are the backward's weight gradients, summed over the ranks inside the backward:
 * rows of the weight products moved to the rank that computes a panel or block (and the lists of
 * who holds which rows), their exact sums reduced as int64, and the rounded blocks all-gathered.
 * The ATTN_OFFLOAD kinds carry the sparse attention of rows one rank computes for another, whose
 * work would otherwise be heavier (docs/cp.md "Attention offload"), forward and backward. */
typedef enum {
  DSV4_MSG_WINDOW_HALO = 0,
  DSV4_MSG_COMPRESSOR_HALO,
  DSV4_MSG_SLOT_ALLGATHER,
  DSV4_MSG_LOSS_REDUCE,
  DSV4_MSG_META_CHECK,
  DSV4_MSG_WINDOW_HALO_BWD,
  DSV4_MSG_COMPRESSOR_HALO_BWD,
  DSV4_MSG_SLOT_REDUCE_SCATTER,
  DSV4_MSG_WGRAD_ROWS,       /* added in 0.3.0, like the two below */
  DSV4_MSG_WGRAD_SUMS,
  DSV4_MSG_WGRAD_ALLGATHER,
  DSV4_MSG_ATTN_OFFLOAD,     /* added in 0.4.0, like the one below */
  DSV4_MSG_ATTN_OFFLOAD_BWD,
  DSV4_MSG_KINDS
} dsv4_msg_kind;
/* The kinds of 0.2.x and of 0.3.x: a dsv4_cp_stats of either size (compiled against those headers)
 * is written with its own layout, the kinds it knows only. */
#define DSV4_MSG_KINDS_0_2 8
#define DSV4_MSG_KINDS_0_3 11

typedef struct {
  DSV4_STRUCT_HEAD;
  uint64_t bytes_sent[DSV4_MSG_KINDS];
  uint64_t bytes_recv[DSV4_MSG_KINDS];
  uint64_t messages[DSV4_MSG_KINDS];
  double seconds[DSV4_MSG_KINDS];   /* wall time spent waiting for each kind */
  double hidden_seconds;            /* Stage-1 all-gather time overlapped with computation */
  double overlap_window_seconds;    /* time of the computation it overlapped with */
} dsv4_cp_stats;
#define DSV4_CP_STATS_INIT {DSV4_HEAD(dsv4_cp_stats)}

DSV4_API const char *dsv4_msg_kind_name(dsv4_msg_kind k);

/* The plan of one layer forward + backward under CP, computed on the host (docs/cp.md): bytes and
 * messages per kind for rank `rank` of `size` (what dsv4_cp_get_stats measures, exactly), for a
 * layer without recomputation (dsv4_cp_plan_traffic_opts: either). */
DSV4_API dsv4_status dsv4_cp_plan_traffic(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                          const dsv4_cp_config *cp, int rank, int size, dsv4_cp_stats *out);
/* The same for every rank at once (out: [size], each element's struct_size set, e.g. from
 * DSV4_CP_STATS_INIT); much faster than size calls for large size. */
DSV4_API dsv4_status dsv4_cp_plan_traffic_all(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                              const dsv4_cp_config *cp, int size, dsv4_cp_stats *out);

/* How a layer will be run, for planning its memory and its messages. */
typedef struct {
  DSV4_STRUCT_HEAD;
  int recompute;     /* dsv4_layer_set_recompute */
  int threads;       /* OpenMP threads per rank (per-thread scratch); 0 = 1 */
} dsv4_plan_opts;
#define DSV4_PLAN_OPTS_INIT {DSV4_HEAD(dsv4_plan_opts)}

/* dsv4_cp_plan_traffic(_all) for a layer run as opts says (NULL: the default mode): with
 * recomputation, the weight gradients whose rows are not kept reach the other ranks as whole-weight
 * sums (docs/cp.md). */
DSV4_API dsv4_status dsv4_cp_plan_traffic_opts(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                               const dsv4_cp_config *cp, const dsv4_plan_opts *opts, int rank,
                                               int size, dsv4_cp_stats *out);
DSV4_API dsv4_status dsv4_cp_plan_traffic_all_opts(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                                   const dsv4_cp_config *cp, const dsv4_plan_opts *opts, int size,
                                                   dsv4_cp_stats *out);

/* What one rank holds for one layer forward + backward, in bytes. */
typedef struct {
  DSV4_STRUCT_HEAD;
  uint64_t weights;    /* the layer's weight set (fp32) */
  uint64_t grads;      /* its gradients (as large) */
  uint64_t saved;      /* activations a training forward keeps for the backward (dsv4_layer_saved_bytes) */
  uint64_t replicated; /* of saved (V4.1: of shared): the global compressed kv and indexer keys
                          every rank holds whole: they grow with T, not with T / N */
  uint64_t transient;  /* the library's other buffers at the peak (temporaries stay in per-object
                          buffers between calls) and per-call scratch */
  uint64_t io;         /* the caller's per-rank x, dout, out, dx and top-k ids */
  uint64_t total;      /* the sum of the above but replicated (already in saved or shared) */
  uint64_t shared;     /* V4.1: what the layer writes into the pass's shared state (a kv source: the
                          global compressed kv and keys, and in the backward their gradient sums; an
                          index source: its top-k ids and candidate blocks), alive until the pass's
                          backward; not in saved (which is dsv4_layer_saved_bytes) */
} dsv4_memory_plan;
#define DSV4_MEMORY_PLAN_INIT {DSV4_HEAD(dsv4_memory_plan)}

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

/* dsv4_layer_flops for the rows rank `rank` of `size` holds under cp's split (cp may be NULL:
 * DSV4_CP_CONFIG_INIT's values): each token's terms on the rank that holds it, a compressed entry's
 * key projection (V4.1 kv sources) on the rank that holds its last token. The ranks' counts add up
 * to the layer's; their spread is how evenly the split shares the work (CSA under zigzag: the
 * queries past position 4 index_topk attend to a full top-k, so the middle chunks weigh more). */
DSV4_API dsv4_status dsv4_cp_plan_flops(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                        const dsv4_cp_config *cp, int rank, int size, dsv4_flops *f);

/* The attention rows the fast path moves between ranks for one layer (docs/cp.md, "Attention
 * offload"): under CSA the late queries of a document attend to more keys than the early ones, so
 * an equal split of the tokens leaves some ranks more attention work; the heaviest rank's last
 * rows are computed by the lightest rank (the next heaviest by the next lightest, ...), as many as
 * halve the pair's difference of estimated work (the FLOP formula, attention weighted 1.25x; pairs
 * within 2% move nothing). For
 * every rank of `size` (out: [size], the stride its first element's struct_size; cp may be NULL):
 * its peer (-1: it moves nothing), whether its rows move (heavy = 1) or it computes the peer's, how
 * many, and the pair's estimated work before the move (heavy, light) and the work that moves.
 * Results are the same bits with or without the move (DSV4_OFFLOAD=0 in the environment: none). */
typedef struct {
  DSV4_STRUCT_HEAD;
  int peer;
  int heavy;
  int64_t rows;
  double work_heavy, work_light, work_moved;
} dsv4_cp_offload;
#define DSV4_CP_OFFLOAD_INIT {DSV4_HEAD(dsv4_cp_offload)}

DSV4_API dsv4_status dsv4_cp_plan_offload(const dsv4_config *cfg, int layer, const dsv4_packing *pk,
                                          const dsv4_cp_config *cp, int size, dsv4_cp_offload *out);

/* Gives the core a communicator and a split: its forward and backward (and the layer's) then take
 * this rank's shard and return its shard of the CP = 1 result, with the same stages (one rank is
 * CP over a one-rank communicator). The core keeps its weights; comm must outlive the core; cfg
 * may be NULL (DSV4_CP_CONFIG_INIT's values). Forgets a pending training forward. */
DSV4_API dsv4_status dsv4_cp_patch(dsv4_core *core, dsv4_comm *comm, const dsv4_cp_config *cfg);
/* Kept for callers written before the exact gradient sums: the backwards now return gradients summed over the
 * CP group (exactly, so the same bits for every N), so this checks its arguments and does nothing. */
DSV4_API dsv4_status dsv4_cp_allreduce_grads(dsv4_comm *comm, dsv4_weights *grads);
/* Communication counters of a core since dsv4_cp_patch or dsv4_cp_stats_reset (all zero on one
 * rank); st->struct_size must be set (DSV4_CP_STATS_INIT). */
DSV4_API dsv4_status dsv4_cp_get_stats(const dsv4_core *core, dsv4_cp_stats *st);
DSV4_API void dsv4_cp_stats_reset(dsv4_core *core);

/* 1 when this BLAS gives a row at a given position of a fixed-shape, single-threaded call the same
 * bits whatever the call's other rows hold: what bitwise CP = N relies on (every row is computed at
 * its global position in a fixed-shape call, docs/design.md). Tests demand bitwise equality of
 * CP = N and CP = 1 when it holds; `dsv4cp info` reports it. */
DSV4_API int dsv4_blas_probe_invariance(void);

/* A hash of how this process's BLAS rounds: OpenBLAS's kernel family and the bytes of three small
 * products (NT, NN, TN) made as the library makes them; computed once per process. Ranks of one CP
 * job must share it (ranks whose products round differently could not give CP = 1's bits): every
 * CP forward checks it with the other inputs and fails on every rank when it differs. `dsv4cp info`
 * under mpirun compares it across ranks before a job. */
DSV4_API uint64_t dsv4_blas_fingerprint(void);

#ifdef __cplusplus
}
#endif
#endif
