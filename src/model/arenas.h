/* arenas.h: the memory layout of a layer call, described once.
 *
 * A layer and its core each keep two arenas (one allocation each, kept across calls so that pages
 * fault only on the first call): SAVED holds what a training forward keeps for the backward (and
 * what the forward itself works in), SCRATCH the temporaries of one phase. The forward and the
 * backward carve the same scratch arena differently (their temporaries are never alive at once),
 * so it is as large as the larger phase. Each arena is described by one carve function over the
 * call's dimensions: called with base NULL it only counts bytes (what dsv4_cp_plan_memory reports),
 * with a base it hands out the named pieces (what the call uses). dsv4_layer_saved_bytes reports
 * the bytes the last training forward carved, so planned and measured cannot drift apart.
 *
 *   core SAVED     lse [n, H]; kv_ext [R_kv, D] (window halo rows exist); r > 0: C, Z [R_c, c D],
 *                  cmp [n_cmp, D]; r = 4: CI, ZI [R_c, 2 Di], KI [n_cmp, Di], top-k ids and scores
 *                  [n, k], KL teacher [n, k] (sparse mode), KL terms [n] (double), and without
 *                  recomputation the indexer queries [n, Hi Di] and weights [n, Hi].
 *                  V4.1: a kv source C [R_c, D], Z (r = 2), the owned slots' latent [n_blk, D] and
 *                  unnormed keys [n_blk, Di]; an index source scores, teacher, KL terms and indexer
 *                  queries as r = 4; cmp, KI and top-k ids live in the shared state (model/shared.h)
 *   core SCRATCH   forward:  slot buffers [n_blk, D | Di] and their all-gathers [n_blk_all, D | Di],
 *                            window-phase state [2, n, H] (fast path), recomputation: one chunk's
 *                            indexer queries [m, Hi Di] and weights [m, Hi]
 *                  backward: d kv_ext [R_kv, D], d cmp [n_cmp, D], d KI [n_cmp, Di], the slot
 *                            gradients [n_blk_all, D] and [n_blk, D], dC, dZ [R_c, c D], a chunk's
 *                            d indexer queries and weights; recomputation: a chunk's lse [m, H],
 *                            attention logits [m, H keys], indexer queries and weights
 *   layer SAVED    a, qr [n, dq]; c, kv [n, D]; u [n, G Ro]; inverse rms of a and c [n]; without
 *                  recomputation q, o [n, H D] and each head's inverse rms [n, H]
 *   layer SCRATCH  forward:  og [chunk, (H/G) D]; recomputation: a chunk's q, o, head norms
 *                  backward: g [m, d], du [m, G Ro], d op [m, H D], d qr [m, dq], dkv [n, D];
 *                            recomputation: a chunk's q, o, head norms
 * (n local rows, m = min(n, DSV4_CHUNK_ROWS), c = 2 for r = 4 else 1; plan.h for R_kv, R_c,
 * n_blk.) With recomputation q, o (2 H D floats a row, most of the total) and the indexer queries
 * are rebuilt chunk by chunk in the backward. */
#ifndef DSV4_ARENAS_H
#define DSV4_ARENAS_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4cp.h"
#include "plan/plan.h"
#include "util/err.h"

/* One allocation, grown when a call needs more (contents are not kept when it grows). */
typedef struct {
  char *base;
  size_t cap;
  size_t used;  /* bytes the current call carved */
} dsv4_arena;

/* Makes the arena hold at least `bytes`; `what` names it in the out-of-memory error. */
dsv4_status dsv4_arena_reserve(dsv4_arena *a, size_t bytes, const char *what);
void dsv4_arena_free(dsv4_arena *a);

/* Everything the carve functions depend on. */
typedef struct {
  int ratio, recompute, fast, sparse_kl;
  int compresses;          /* Stage 1 runs here: V4 r > 0, a V4.1 kv source */
  int gate;                /* its compressor has a gate (all but V4.1's r = 1) */
  int v4_keys;             /* V4 r = 4: the indexer's own compressor (CI, ZI) */
  int v41_keys;            /* a V4.1 kv source: indexer keys from the compressor's latent */
  int own_cmp;             /* cmp, KI and their gradients in the core's arenas (V4; V4.1: the shared state) */
  int selects;             /* top-k and KL loss: V4 r = 4, V4.1 index sources */
  int sparse;              /* attends to top-k ids: V4 r = 4, every V4.1 compressed layer */
  int head_norm;           /* the queries have a per-head RMSNorm (V4; not V4.1) */
  int64_t n, m;            /* local rows, backward chunk rows */
  int64_t R_kv, R_c;       /* extended rows (plan.h) */
  int ext_kv;
  int64_t n_blk, n_blk_all, n_cmp;
  int gather_identity;     /* all-gathered slot rows == global ids (plan.h): no x_ring */
  int64_t max_keys;        /* keys of the query with the most (window + compressed) */
  int H, D, d, dq, GRo, HGD, Hi, Di, k;
  int nt;                  /* threads of the backward's exact key-gradient sums (copies; 1 on the naive path) */
} dsv4_dims;

/* The dimensions of a call of the layer (or core) of role info with configuration cfg on plan p. */
void dsv4_dims_of(dsv4_dims *dm, const dsv4_config *cfg, const dsv4_layer_info *info, const dsv4_plan *p,
                  int recompute, dsv4_impl impl);

typedef struct {
  float *lse, *kv_ext, *C, *Z, *CI, *ZI, *cmp, *KI, *qI, *wI, *scores, *teacher;
  float *lat, *kpre;       /* V4.1 kv source: the owned slots' latent [n_blk, D] and unnormed keys [n_blk, Di] */
  int32_t *topk;
  double *kl_rows;
} dsv4_core_saved;

typedef struct {
  float *blk[2], *all[2];  /* slot buffers and their all-gathers: [0] main, [1] indexer */
  float *win_state;        /* [2, n, H] running max and sum of the window phase */
  float *qI, *wI;          /* recomputation: a chunk's indexer queries and weights */
} dsv4_core_fwd_scratch;

/* x_ext, x_cmp: the exact sums (util/xacc.h) of the window rows' and compressed rows' gradients over
 * all chunks: x_ext nt copies of [R_kv] x 2 D int64; x_cmp one copy of [n_cmp] x 2 D (it grows with
 * the sequence), which the threads add into under the row locks x_lock [n_cmp] (util/xrows.h; the
 * KL's indexer-key sums take the same locks, one operator at a time); x_blk: the exact
 * reduce-scatter's result, [n_blk] x 2 max(D, Di) (the kv rows, or the indexer keys); x_ring: its
 * ring's room when the all-gathered rows are not the global ids (cp/exchange.h; otherwise the sums
 * are sent as they lie). d_ext, d_cmp: the naive path's float sums (then added to x_*; NULL on the
 * fast path). */
typedef struct {
  int64_t *x_ext, *x_cmp, *x_ring, *x_blk;
  uint8_t *x_lock;
  float *d_ext, *d_cmp, *d_KI, *d_blk, *dC, *dZ, *d_qI, *d_wI;
  float *rc_lse, *rc_scores, *qI, *wI;  /* recomputation: a chunk's lse, logits (or NULL), indexer queries */
  int64_t rc_stride;                    /* floats per query in rc_scores */
} dsv4_core_bwd_scratch;

typedef struct {
  float *a, *qr, *q, *c, *kv, *o, *u, *sa, *sb, *sc;
} dsv4_layer_saved;

typedef struct {
  float *og, *q, *o, *sb;  /* og; recomputation: the chunk's q, o, head norms */
} dsv4_layer_fwd_scratch;

typedef struct {
  float *g, *du, *dop, *dqr, *dkv, *q, *o, *sb;
} dsv4_layer_bwd_scratch;

/* Carve functions: base NULL counts; the return value is the bytes carved (64-byte aligned pieces). */
size_t dsv4_carve_core_saved(char *base, const dsv4_dims *dm, dsv4_core_saved *s);
size_t dsv4_carve_core_fwd(char *base, const dsv4_dims *dm, dsv4_core_fwd_scratch *s);
size_t dsv4_carve_core_bwd(char *base, const dsv4_dims *dm, dsv4_core_bwd_scratch *s);
size_t dsv4_carve_layer_saved(char *base, const dsv4_dims *dm, dsv4_layer_saved *s);
size_t dsv4_carve_layer_fwd(char *base, const dsv4_dims *dm, dsv4_layer_fwd_scratch *s);
size_t dsv4_carve_layer_bwd(char *base, const dsv4_dims *dm, dsv4_layer_bwd_scratch *s);

/* Scratch arena sizes: the larger of the two phases. */
size_t dsv4_core_scratch_bytes(const dsv4_dims *dm);
size_t dsv4_layer_scratch_bytes(const dsv4_dims *dm);

/* Per-call kernel workspace at the peak, which the kernels allocate themselves: the exact gradient
 * sums of every thread (util/xrows.h, 16 bytes per element) of the attention backward (sinks; its
 * key rows are summed in the core's arena) or of the KL loss (indexer keys), whichever is larger. */
size_t dsv4_kernel_scratch_bytes(const dsv4_dims *dm, int threads);

#endif
