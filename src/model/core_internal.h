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

/* The core's swappable implementation: dsv4_cp_patch replaces these (src/cp/patch.c). */
typedef struct {
  dsv4_status (*token_map)(dsv4_core *c, const dsv4_packing *pk, int64_t n, dsv4_token_map *map);
  dsv4_status (*forward)(dsv4_core *c, const dsv4_core_fwd_args *a);
  dsv4_status (*backward)(dsv4_core *c, const dsv4_core_bwd_args *a);
} dsv4_core_ops;

/* The current function pointers, and a way to replace them (what dsv4_cp_patch uses). */
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
typedef struct {
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
} dsv4_exchange;

/* What backward needs from the last training forward. */
typedef struct {
  int valid;
  const float *q, *kv, *x, *qr, *o;  /* borrowed from the caller */
  int64_t n;
  dsv4_docs docs;
  dsv4_layout lay;
  float *kv_ext;                      /* [R_kv, D]; NULL when the layout has no halo (kv is used) */
  int32_t *win_start, *win_len;       /* [n] */
  float *lse;                         /* [n, H] */
  float *C, *Z;                       /* [R_c, c*D] main compressor projections */
  int32_t *slot_cur, *slot_prev, *slot_pos, *slot_blk; /* [n_slot] local valid slots */
  int64_t n_slot;
  float *cmp;                         /* [n_cmp, D] global compressed kv */
  int32_t *cmp_begin, *cmp_count;     /* [n] visible compressed ranges */
  float *CI, *ZI;                     /* [R_c, 2 Di] indexer compressor projections */
  float *KI;                          /* [n_cmp, Di] global indexer keys */
  float *qI, *wI;                     /* [n, Hi*Di], [n, Hi] */
  int32_t *topk;                      /* [n, k] */
  float *scores, *teacher;            /* [n, k] indexer scores of topk, KL teacher (sparse mode) */
  int64_t n_valid;                    /* KL valid tokens over all ranks */
} dsv4_core_saved;

/* Buffers kept across calls (util/slot.h): one per saved tensor, then the temporaries. A forward
 * temporary and a backward temporary never live at once, so each pair shares one buffer (named
 * for both of its uses). */
enum {
  CS_WIN_START, CS_WIN_LEN, CS_LSE, CS_KV_EXT, CS_C, CS_Z, CS_SLOT_CUR, CS_SLOT_PREV, CS_SLOT_POS,
  CS_SLOT_BLK, CS_CMP, CS_CMP_BEGIN, CS_CMP_COUNT, CS_CI, CS_ZI, CS_KI, CS_QI, CS_WI, CS_TOPK, CS_SCORES,
  CS_TEACHER,
  /* forward temporary                     backward temporary */
  CS_SLOTS_MAIN,                         CS_D_KV_EXT = CS_SLOTS_MAIN,        /* [n_blk, D]      | [R_kv, D] */
  CS_SLOTS_MAIN_ALL,                     CS_D_CMP = CS_SLOTS_MAIN_ALL,       /* [n_blk_all, D]  | [n_cmp, D] */
  CS_SLOTS_IDX,                          CS_D_SLOTS_ALL = CS_SLOTS_IDX,      /* [n_blk, Di]     | [n_blk_all, dim] */
  CS_SLOTS_IDX_ALL,                      CS_D_SLOTS = CS_SLOTS_IDX_ALL,      /* [n_blk_all, Di] | [n_blk, dim] */
  CS_WIN_STATE,                          CS_DC = CS_WIN_STATE,               /* [2, n, H]       | [R_c, cD] */
  CS_KL_ROWS,                            CS_DZ = CS_KL_ROWS,                 /* [n] doubles     | [R_c, cD] */
  CS_D_QI,                                                                   /* [n, Hi Di] */
  CS_D_WI,                                                                   /* [n, Hi] */
  CS_D_KI,                                                                   /* [n_cmp, Di] */
  CS_COUNT
};

struct dsv4_core {
  dsv4_config cfg;
  int layer, ratio;
  const dsv4_weights *w;
  dsv4_impl impl;
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
                                int64_t R_c, int64_t n_slot, int64_t n_cmp);

/* The two-stage forward and backward over an exchange (core_fwd.c, core_bwd.c). */
dsv4_status dsv4_core_run_forward(dsv4_core *c, const dsv4_core_fwd_args *a, const dsv4_exchange *x);
dsv4_status dsv4_core_run_backward(dsv4_core *c, const dsv4_core_bwd_args *a, const dsv4_exchange *x);
/* Token map of a layout's local rows (into c->tok). */
dsv4_status dsv4_core_fill_tokmap(dsv4_core *c, const dsv4_docs *docs, const dsv4_layout *lay,
                                  dsv4_token_map *map);

#endif
