/* core_internal.h: the core attention object and the two-stage algorithm's seams.
 *
 * One algorithm serves one rank and N ranks. It works on the local rows, split into segments
 * (contiguous runs of the global stream) that carry room for halos in front of them; everything
 * that crosses ranks goes through a dsv4_exchange. The one-rank exchange moves nothing (its layout
 * has no halos and its all-gather is a copy); the CP exchange (src/cp/) sends the messages. So a
 * token is computed by the same code, with the same shapes, whoever owns it.
 *
 * Extended buffers (per segment, in segment order):
 *   kv_ext    [R_kv, D]   : win_halo rows (the W-1 raw kv rows before the segment, clamped to the
 *                           document start), then the segment's own rows
 *   C/Z_ext   [R_c, c*D]  : c_halo rows (the part of the segment's first owned slot, and for r = 4
 *                           of its previous window, that lies before the segment), then the
 *                           segment's own rows
 * Slot ownership: a compressed slot is computed by the segment holding its LAST token (its end;
 * model/docs.h), so a window straddling any number of segment or rank boundaries is pooled once,
 * by one owner, from rows it received as a left halo - the same direction as the window halo.
 * A segment of len rows owns at most ceil(len / r) slots (their windows are disjoint runs of r
 * tokens ending inside it); that capacity is its part of the rank's slot buffer, all-gathered in
 * rank order, and the gather index maps each global compressed id to its row there (unused
 * capacity rows are never selected). */
#ifndef DSV4_CORE_INTERNAL_H
#define DSV4_CORE_INTERNAL_H

#include "dsv4cp.h"
#include "model/docs.h"
#include "ops/kernels.h"
#include "ops/rope.h"
#include "util/exactsum.h"
#include "util/slot.h"

/* The core's swappable part: dsv4_cp_patch replaces it (src/cp/patch.c). The two-stage algorithm
 * itself (core_fwd.c, core_bwd.c) is shared; only the token map and the exchange differ. */
typedef struct dsv4_exchange dsv4_exchange;
typedef struct {
  dsv4_status (*token_map)(dsv4_core *c, const dsv4_packing *pk, int64_t n, dsv4_token_map *map);
  /* The exchange of the next call (built in *storage when it is not a static object). */
  const dsv4_exchange *(*exchange)(dsv4_core *c, dsv4_exchange *storage);
} dsv4_core_ops;

/* The current ops, and a way to replace them (what dsv4_cp_patch uses). */
dsv4_core_ops dsv4_core_get_ops(const dsv4_core *c);
void dsv4_core_set_ops(dsv4_core *c, const dsv4_core_ops *ops, void *impl_state, void (*free_state)(void *));
void *dsv4_core_impl_state(const dsv4_core *c);

typedef struct {
  int64_t g0, len;   /* global tokens [g0, g0 + len) */
  int64_t lo;        /* first local row */
  int64_t win_halo;  /* window halo rows before the segment */
  int64_t kv_row;    /* first row of the halo in kv_ext (own rows start at kv_row + win_halo) */
  int64_t c_halo;    /* compressor halo rows before the segment (global [g0 - c_halo, g0)) */
  int64_t c_full;    /* the last c_full of them carry every channel (the first owned slot's own
                        window); the others only the first half (r = 4: its previous window) */
  int64_t c_row;     /* first row of the halo in C/Z_ext (own rows start at c_row + c_halo) */
  int64_t id0, n_own;/* the global slot ids [id0, id0 + n_own) this segment owns (ends inside it) */
  int64_t blk0;      /* first row of the segment's part of the local slot buffer */
} dsv4_seg;

typedef struct {
  int ratio;
  int n_seg;
  dsv4_seg *seg;
  int64_t n;         /* local rows */
  int64_t R_kv, R_c; /* rows of kv_ext and C/Z_ext */
  int64_t n_blk;     /* rows of the local slot buffer: sum of ceil(len / r) (the same on every rank) */
  int64_t n_blk_all; /* rows of all ranks' slot buffers */
  int64_t n_own;     /* slots this rank owns */
  int32_t *gather;   /* [docs.n_cmp] global compressed id -> row of the all-gathered slot buffers */
  int64_t panel;     /* projection panel rows (dsv4_panel_rows of the global T) */
  int ext_kv;        /* 1: build kv_ext and run the window halo exchange (every CP rank, so the
                        point-to-point messages match); 0: kv is used as it is (one rank) */
} dsv4_layout;

/* The layout of local rows made of segments segs[0..n_seg) (global runs, in local row order):
 * halos, buffer offsets, slot ownership (model/layout.c). ext_kv as in dsv4_layout. No gather
 * index (it needs every rank's layout: dsv4_layout_set_gather). */
dsv4_status dsv4_layout_build(dsv4_layout *lay, const dsv4_docs *docs, const dsv4_range *segs, int n_seg, int W,
                              int ext_kv);
/* gather[id] for the slots that lay (rank `rank`) owns: rank * n_blk + its row in the slot buffer. */
void dsv4_layout_set_gather(const dsv4_layout *lay, int rank, int32_t *gather);
void dsv4_layout_free(dsv4_layout *lay);
/* dst = a deep copy of src (n_cmp entries of the gather index). */
dsv4_status dsv4_layout_copy(dsv4_layout *dst, const dsv4_layout *src, int64_t n_cmp);

/* Everything that crosses ranks. Every rank calls every function in the same order, even when its
 * share is empty, so collectives always match. `which` is 0 for the main compressor, 1 for the
 * indexer's. */
struct dsv4_exchange {
  void *st;
  int nranks;      /* the CP mesh size the operators' layouts are checked against */
  /* First call of a forward: every rank checks that all agree on the config, the packing meta and
   * the local row count (so that a bad input fails on every rank instead of hanging one). */
  dsv4_status (*agree)(void *st, const dsv4_core *c, const dsv4_packing *pk, int64_t n_local);
  /* The layout of the local rows (segments, halos, offsets, gather index; see the top of file). */
  dsv4_status (*layout)(void *st, const dsv4_docs *docs, int64_t n_local, int W, dsv4_layout *lay);
  /* Stage 1: fills the compressor halo rows (first c*D/2 channels of C and Z). */
  dsv4_status (*cmp_halo)(void *st, const dsv4_layout *lay, float *C, float *Z, int cD, int which);
  /* Stage 1: all-gather of the local blocks [n_blk, D] into [n_blk_all, D]; start, then wait. */
  dsv4_status (*gather_start)(void *st, const dsv4_layout *lay, const float *local, float *all, int D,
                              int which);
  dsv4_status (*gather_wait)(void *st, int which);
  /* Lets started all-gathers progress (called between queries of the window phase, from the main
   * thread); may be NULL. */
  void (*progress)(void *st);
  /* Completes any started all-gather (called on the error path before buffers are freed). */
  void (*drain)(void *st);
  /* Stage 2: fills the window halo rows of kv_ext. */
  dsv4_status (*win_halo)(void *st, const dsv4_layout *lay, float *kv_ext, int D);
  /* Sums the KL loss partials (exactly) and valid counts over ranks, in place. */
  dsv4_status (*reduce_loss)(void *st, dsv4_exactsum *sum, int64_t *count);
  /* Backward: halo row gradients of d_kv_ext go back to their owners and are added there. */
  dsv4_status (*win_halo_bwd)(void *st, const dsv4_layout *lay, float *d_kv_ext, int D);
  /* Backward: d_all [n_blk_all, D] summed over ranks, each rank keeping its own blocks. */
  dsv4_status (*blocks_reduce_scatter)(void *st, const dsv4_layout *lay, const float *d_all,
                                       float *d_local, int D, int which);
  /* Backward: compressor halo row gradients go back to their owners and are added there. */
  dsv4_status (*cmp_halo_bwd)(void *st, const dsv4_layout *lay, float *dC, float *dZ, int cD, int which);
};

/* The state of one forward and its backward. Rows are processed in chunks (core_fwd.c): the
 * caller passes each chunk's queries and receives its attention output, so with recomputation
 * neither q nor o is ever held whole. */
typedef struct {
  int valid;                          /* a training forward completed: backward may run */
  dsv4_exchange xch;                  /* the exchange of this forward (and its backward) */
  const float *q, *o;                 /* [n, H, D] the caller's whole q and o (NULL: recomputation) */
  const float *kv, *x, *qr;           /* borrowed from the caller: [n, D], [n, d], [n, dq] */
  int32_t *topk_out;                  /* [n, k] the caller's top-k output (may be NULL) */
  int64_t n;
  dsv4_docs docs;
  dsv4_layout lay;
  float *kv_ext;                      /* [R_kv, D]; NULL when the layout has no halo (kv is used) */
  int32_t *win_start, *win_len;       /* [n] */
  float *lse;                         /* [n, H] */
  float *win_state;                   /* [2, n, H] running max and sum of the window phase (fast path) */
  float *C, *Z;                       /* [R_c, c*D] main compressor projections */
  int32_t *slot_cur, *slot_prev, *slot_pos, *slot_blk; /* [n_slot] slots this rank owns */
  int64_t n_slot;
  float *all_main, *all_idx;          /* all-gathered slot buffers, until Stage 1 is finished */
  int stage1_done;
  float *cmp;                         /* [n_cmp, D] global compressed kv */
  int32_t *cmp_begin, *cmp_count;     /* [n] visible compressed ranges */
  float *CI, *ZI;                     /* [R_c, 2 Di] indexer compressor projections */
  float *KI;                          /* [n_cmp, Di] global indexer keys */
  float *qI, *wI;                     /* [n, Hi*Di], [n, Hi] (recomputation: [chunk, ...] scratch) */
  int32_t *topk;                      /* [n, k] */
  float *scores, *teacher;            /* [n, k] indexer scores of topk, KL teacher (sparse mode) */
  double *kl_rows;                    /* [n] each local query's KL term */
  int64_t kl_valid;                   /* local queries with a KL term */
  int64_t n_valid;                    /* KL valid tokens over all ranks */
  /* backward accumulators */
  dsv4_weights *grads;
  float d_loss;
  float *d_ext, *d_cmp, *d_KI;        /* [R_kv, D], [n_cmp, D], [n_cmp, Di] */
  float *rc_scores;                   /* recomputation: the chunk's attention logits, handed from the
                                         recomputed forward to the backward ([chunk, rc_stride]) */
  int64_t rc_stride;
} dsv4_core_saved;

/* Buffers kept across calls (util/slot.h): one per saved tensor, then the temporaries. A forward
 * temporary and a backward temporary never live at once, so each pair shares one buffer (named
 * for both of its uses). */
enum {
  CS_WIN_START, CS_WIN_LEN, CS_LSE, CS_KV_EXT, CS_C, CS_Z, CS_SLOT_CUR, CS_SLOT_PREV, CS_SLOT_POS,
  CS_SLOT_BLK, CS_CMP, CS_CMP_BEGIN, CS_CMP_COUNT, CS_CI, CS_ZI, CS_KI, CS_QI, CS_WI, CS_TOPK, CS_SCORES,
  CS_TEACHER, CS_KL_ROWS,
  CS_D_EXT, CS_D_CMP, CS_D_KI,           /* backward accumulators [R_kv, D], [n_cmp, D], [n_cmp, Di] */
  /* forward temporary                   backward temporary */
  CS_SLOTS_MAIN,                         CS_D_SLOTS_ALL = CS_SLOTS_MAIN,     /* [n_blk, D]      | [n_blk_all, dim] */
  CS_SLOTS_MAIN_ALL,                     CS_D_SLOTS = CS_SLOTS_MAIN_ALL,     /* [n_blk_all, D]  | [n_blk, dim] */
  CS_SLOTS_IDX,                          CS_DC = CS_SLOTS_IDX,               /* [n_blk, Di]     | [R_c, cD] */
  CS_SLOTS_IDX_ALL,                      CS_DZ = CS_SLOTS_IDX_ALL,           /* [n_blk_all, Di] | [R_c, cD] */
  CS_WIN_STATE,                          CS_D_QI = CS_WIN_STATE,             /* [2, n, H]       | [chunk, Hi Di] */
  CS_RC_LSE,                             CS_D_WI = CS_RC_LSE,                /* [chunk, H] (recomputed lse) | [chunk, Hi] */
  CS_RC_SCORES,                          /* recomputation: the chunk's attention logits [chunk, H, keys] */
  CS_COUNT
};

struct dsv4_core {
  dsv4_config cfg;
  int layer, ratio;
  const dsv4_weights *w;
  dsv4_impl impl;
  int recompute;      /* 1: the caller recomputes q, o in the backward; the core its indexer queries */
  dsv4_rope rope;
  dsv4_core_ops ops;
  void *impl_state;
  void (*free_state)(void *);
  dsv4_tokmap_buf tok;
  dsv4_core_saved sv;
  dsv4_slot slot[CS_COUNT];
};

/* Forgets the saved state (buffers stay in the core's slots; docs and layout are freed). */
void dsv4_core_saved_free(dsv4_core_saved *sv);
/* Bytes a training forward keeps for the backward (layer and core), from shapes (memory.c). */
size_t dsv4_saved_bytes_formula(const dsv4_config *c, int ratio, int64_t n, int64_t R_kv, int ext_kv,
                                int64_t R_c, int64_t n_slot, int64_t n_cmp, int recompute);

/* Bytes of the buffers held besides the saved activations after a training call (memory.c). */
size_t dsv4_transient_bytes_formula(const dsv4_config *c, int ratio, const dsv4_layout *lay, int64_t n_cmp,
                                    int64_t rope_positions, int recompute, int threads);

/* Rows are processed in chunks of at most DSV4_CHUNK_ROWS local rows that never cross a global
 * multiple of it (so projection panels, whose size divides it, are never split) nor a segment
 * boundary. The backward always uses these chunks, with or without recomputation, so both give
 * the same bits; the forward may use any chunks (a row's forward result does not depend on them).
 * 512 rows, the largest projection panel: weight-gradient products with an inner dimension of 512
 * run as fast as whole ones here (measured: 92 / 86 GFLOP/s for the wq_b / wo_b gradients in
 * 512-row pieces against 67 / 87 in one call: the BLAS blocks the inner dimension by a few hundred
 * anyway), and recomputation holds q, o and d o of one chunk (3 x 512 x 2 H D floats: 384 MiB at
 * V4-Flash sizes) instead of q and o of every row. */
#define DSV4_CHUNK_ROWS 512
/* Makes the RoPE table cover the positions a rank with rows at positions pos[0..n) uses. */
dsv4_status dsv4_core_reserve_rope(dsv4_core *c, const int32_t *pos, int64_t n);
/* End of the chunk that starts at local row i0 (tokmap of the current forward). */
int64_t dsv4_core_chunk_end(const dsv4_core *c, int64_t i0, int64_t max_rows);

/* The chunked forward: begin (Stage 1 started, halos exchanged), then rows for every chunk of
 * queries in order (window phase, Stage 1 finished at the first call, top-k, compressed phase,
 * KL terms; q: [n, H, D] queries of the chunk, o: [n, H, D] receives their output), then end
 * (KL loss reduced; *loss may be NULL). a->q and a->o may be NULL in begin: then the backward
 * must be given q and o again (recomputation). */
dsv4_status dsv4_core_fwd_begin(dsv4_core *c, const dsv4_core_fwd_args *a);
dsv4_status dsv4_core_fwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o);
dsv4_status dsv4_core_fwd_end(dsv4_core *c, float *loss, int train);
/* The chunked backward (chunks of dsv4_core_chunk_end): begin; per chunk optionally recompute
 * (o of the chunk's queries from q, bitwise the forward's; and the indexer queries), then rows
 * (attention backward: dq [n, H, D] overwritten, may alias d_o; KL backward); then end (halo
 * gradients home, compressors; dkv [n_local, D] overwritten, dx [n_local, d] accumulated). */
dsv4_status dsv4_core_bwd_begin(dsv4_core *c, dsv4_weights *grads, float d_loss);
dsv4_status dsv4_core_bwd_recompute(dsv4_core *c, int64_t i0, int64_t n, const float *q, float *o);
dsv4_status dsv4_core_bwd_rows(dsv4_core *c, int64_t i0, int64_t n, const float *q, const float *o,
                               const float *d_o, float *dq);
dsv4_status dsv4_core_bwd_end(dsv4_core *c, float *dkv, float *dx);
/* Indexer queries [n, Hi Di] (RoPE at each row's position) and head weights [n, Hi] of local rows
 * [i0, i0 + n), from the forward's qr and x. */
dsv4_status dsv4_core_indexer_queries(dsv4_core *c, int64_t i0, int64_t n, float *qI, float *wI);
/* Frees the saved state on a failed call (completing started all-gathers first). */
void dsv4_core_fail(dsv4_core *c);
/* The public one-call forward and backward (q, o, d_o, dq whole) over the chunked functions. */
dsv4_status dsv4_core_run_forward(dsv4_core *c, const dsv4_core_fwd_args *a);
dsv4_status dsv4_core_run_backward(dsv4_core *c, const dsv4_core_bwd_args *a);
/* Token map of a layout's local rows (into c->tok). */
dsv4_status dsv4_core_fill_tokmap(dsv4_core *c, const dsv4_docs *docs, const dsv4_layout *lay,
                                  dsv4_token_map *map);

#endif
