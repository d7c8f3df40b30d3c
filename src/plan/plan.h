/* plan.h: the plan of one layer forward (and its backward) on one rank, as plain data.
 *
 * Everything that depends on WHERE the tokens are (packing, split, this rank among N) and not on
 * their values is derived once, on the host, from global meta only, so every rank computes every
 * other rank's part without a message, and is kept in one dsv4_plan:
 *   docs      the document table (docs/spec.md section 4) and its compressed slot counts
 *   lay       this rank's segments (contiguous runs of the global stream), their window and
 *             compressor halos, where their rows sit in the extended buffers, the slots they own,
 *             and the gather index (global compressed id -> row of the all-gathered slot buffers)
 *   halo      which rows go to / come from which peer for the three halos (window, compressor)
 *   tok       global index, document, document-local position and real flag of each local row
 *   rows      each local query's window (rows of kv_ext) and visible compressed range
 *   slots     each owned slot's first rows in C/Z_ext, RoPE position and row in the slot buffer
 *   chunks    the row chunks every backward uses (and a recomputing forward)
 *   rope      the RoPE table of the positions this rank uses
 * A plan is built from its key alone (dsv4_plan_build). A cached plan is reused only when the whole
 * key compares equal (dsv4_plan_key_equal compares every array element; no hash decides).
 *
 * Extended buffers (per segment, in segment order):
 *   kv_ext  [R_kv, D]   win_halo rows (the W-1 raw kv rows before the segment, clamped to the
 *                       document start), then the segment's own rows
 *   C/Z_ext [R_c, c*D]  c_halo rows (the part of the segment's first owned slot, and for r = 4 of
 *                       its previous window, that lies before the segment), then its own rows
 * Slot ownership: a compressed slot is pooled by the segment holding its LAST token (docs.h), so a
 * window straddling any number of segment or rank boundaries is pooled once, by one owner, from rows
 * it received as a left halo (the window halo's direction). A segment of len rows owns at most
 * ceil(len / r) slots; that capacity is its part of the rank's slot buffer, all-gathered in rank
 * order; the gather index maps each global id to its row there (unused capacity is never selected).
 * Worked examples: plan/layout.c, plan/halo.c, docs/cp.md, tests/c/test_cp_plan.c. */
#ifndef DSV4_PLAN_H
#define DSV4_PLAN_H

#include "dsv4cp.h"
#include "ops/rope.h"
#include "plan/docs.h"

/* ---- layout of one rank -------------------------------------------------------------------- */

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
  int ext_kv;        /* R_kv > n: window halo rows exist, kv_ext is a buffer of its own (else kv is used) */
  int64_t n_blk;     /* rows of the local slot buffer: sum of ceil(len / r) (the same on every rank) */
  int64_t n_blk_all; /* rows of all ranks' slot buffers */
  int64_t n_own;     /* slots this rank owns */
  int32_t *gather;   /* [docs.n_cmp] global compressed id -> row of the all-gathered slot buffers */
} dsv4_layout;

/* The layout of local rows made of segments segs[0..n_seg) (global runs, in local row order):
 * halos, buffer offsets, slot ownership (plan/layout.c). No gather index (it needs every rank). */
dsv4_status dsv4_layout_build(dsv4_layout *lay, const dsv4_docs *docs, const dsv4_range *segs, int n_seg, int W);
/* gather[id] for the slots lay (rank `rank`) owns: rank * n_blk + its row in the slot buffer. */
void dsv4_layout_set_gather(const dsv4_layout *lay, int rank, int32_t *gather);
void dsv4_layout_free(dsv4_layout *lay);
/* Every rank's layout (lays: [size], caller frees each and the array) from the split. */
dsv4_status dsv4_layouts_all(const dsv4_docs *docs, const dsv4_packing *pk, dsv4_split split, int size, int W,
                             dsv4_layout **lays);

/* ---- halo plans (plan/halo.c) ------------------------------------------------------------- */

/* The three halos: the window's raw kv rows; the compressor rows that carry only the first half of
 * the channels (r = 4: the previous window of a segment's first owned slot); the compressor rows
 * that carry every channel (that slot's own window). */
typedef enum { DSV4_HALO_WINDOW = 0, DSV4_HALO_CMP_HALF, DSV4_HALO_CMP_FULL, DSV4_HALO_KINDS } dsv4_halo_kind;

/* Rows one rank exchanges with one peer, in the order both sides pack them. */
typedef struct {
  int peer;
  int64_t n;
  int32_t *rows;  /* send: source rows in this rank's extended buffer; recv: destination rows */
} dsv4_halo_msg;

typedef struct {
  int n_send, n_recv;
  dsv4_halo_msg *send, *recv;
  int64_t n_self;             /* halo rows this rank holds itself (zigzag, batched, one rank) */
  int32_t *self_src, *self_dst;
} dsv4_halo_plan;

void dsv4_halo_plan_free(dsv4_halo_plan *p);
/* Halo plan of rank `me` for one kind, given every rank's layout (lays[0..size)). */
dsv4_status dsv4_halo_plan_build(const dsv4_layout *lays, int size, int me, dsv4_halo_kind kind, dsv4_halo_plan *p);
/* For every rank q (arrays of size entries, accumulated): halo rows of one kind it sends and
 * receives, and the messages it sends and receives (distinct peers, itself excluded). */
dsv4_status dsv4_halo_counts(const dsv4_layout *lays, int size, dsv4_halo_kind kind, uint64_t *rows_sent,
                             uint64_t *rows_recv, uint64_t *msgs_sent, uint64_t *msgs_recv);

/* ---- the plan ------------------------------------------------------------------------------ */

/* What to build: everything a forward needs (every rank's layout for the gather index and the halo
 * plans), or only this rank's layout and the sizes of the rest (memory planning at thousands of
 * ranks: no per-row tables, no RoPE table, only their sizes in `bytes`). */
typedef enum { DSV4_PLAN_FULL = 0, DSV4_PLAN_LOCAL = 1 } dsv4_plan_mode;

/* Everything a plan depends on besides the configuration of the object that holds it. */
typedef struct {
  int64_t T, n_local;
  int n_docs;        /* documents described by cu (0: one document [0, T)) */
  int batched, has_real;
  int ratio, window, rank, size;
  dsv4_split split;
  int32_t *cu, *real;/* copies: [n_docs + 1], [n_docs] (NULL when absent) */
} dsv4_plan_key;

typedef struct {
  dsv4_plan_key key;
  dsv4_docs docs;
  dsv4_layout lay;
  dsv4_plan_mode mode;                /* LOCAL: no gather index, no halo plans */
  dsv4_halo_plan halo[DSV4_HALO_KINDS];
  int64_t n;                          /* local rows */
  int64_t panel;                      /* projection panel rows (util/gemm.h) */
  int64_t *global;                    /* [n] token map: global index */
  int32_t *doc, *pos;                 /* [n] document, document-local position (every RoPE) */
  uint8_t *real;                      /* [n] 1 = real token */
  int32_t *win_start, *win_len;       /* [n] window of each query in kv_ext (length 0: padding) */
  int32_t *cmp_begin, *cmp_count;     /* [n] visible compressed ids (ratio > 0) */
  int64_t n_slot;                     /* slots this rank owns, in global id order: */
  int32_t *slot_cur, *slot_prev;      /*   first row of the own / previous window in C/Z_ext (-1: none) */
  int32_t *slot_pos, *slot_blk;       /*   RoPE position j r, row in the local slot buffer */
  int64_t *slot_gid;                  /*   global compressed id (V4.1's indexer key projection) */
  int64_t n_chunk, *chunk;            /* [n_chunk + 1] row chunk boundaries (DSV4_CHUNK_ROWS) */
  int gather_identity;                /* the all-gathered slot blocks are the global ids in order
                                         (gather[id] == id): contiguous, one stream, no unused slot rows */
  int32_t *blk_id;                    /* [lay.n_blk_all] the global id in each all-gathered slot row
                                         (-1: unused capacity), the inverse of lay.gather; full plans
                                         without gather_identity only */
  int64_t partial, partial_max;       /* rows of partial panel runs a product sink keeps at once: this
                                         rank's, and the most on any rank (dsv4_partial_rows) */
  int64_t max_win, max_cmp;           /* longest window, most visible compressed ids of a local query */
  dsv4_rope rope;                     /* positions this rank uses */
  size_t bytes;                       /* what the plan holds (halo plans and RoPE table included) */
} dsv4_plan;

/* Rows are processed in chunks of at most DSV4_CHUNK_ROWS local rows whose positions in their
 * global projection panels (index mod panel) are all different, so each chunk is one panel-shaped
 * call of every backward row product (dsv4_plan_chunk_end). The backward always uses these chunks,
 * with or without recomputation, so both give the same bits; the forward may use any chunks (a
 * row's forward result does not depend on them).
 * 512 rows, the largest projection panel: weight-gradient products with an inner dimension of 512
 * run as fast as whole ones (the BLAS blocks the inner dimension by a few hundred anyway), and
 * recomputation holds q, o and d o of one chunk (3 x 512 x 2 H D floats: 384 MiB at V4-Flash sizes)
 * instead of q and o of every row. */
#define DSV4_CHUNK_ROWS 512

/* Validates what a key is made from (identically on every rank: global values only) and copies the
 * packing arrays into it. */
dsv4_status dsv4_plan_key_set(dsv4_plan_key *k, const dsv4_packing *pk, int64_t n_local, int ratio, int window,
                              dsv4_split split, int rank, int size);
void dsv4_plan_key_free(dsv4_plan_key *k);
/* dst = a copy of src with arrays of its own. */
dsv4_status dsv4_plan_key_copy(dsv4_plan_key *dst, const dsv4_plan_key *src);
/* 1 when a and b are the same key (every field and array element). */
int dsv4_plan_key_equal(const dsv4_plan_key *a, const dsv4_plan_key *b);
/* Builds the plan of key for an object with configuration cfg; takes ownership of key's arrays
 * (key is left empty). The local row count must be the rank's share (an error names both
 * otherwise). */
dsv4_status dsv4_plan_build(dsv4_plan *p, const dsv4_config *cfg, dsv4_plan_key *key, dsv4_plan_mode mode);
void dsv4_plan_free(dsv4_plan *p);

/* End of the chunk that starts at local row i0 (< n). */
int64_t dsv4_plan_chunk_end(const dsv4_plan *p, int64_t i0);
/* The same rule for any rank's rows: g [n] their global indices in local order, P the panel rows. */
int64_t dsv4_chunk_end_of(const int64_t *g, int64_t n, int64_t P, int64_t i0);
/* The most rows a product sink (model/wgrad.c) keeps at once on a rank whose rows are the segments
 * segs[0..n_seg) (in local order, increasing): the chunks' partial runs (consecutive global rows of
 * one panel of T's that do not cover it), each kept until the rank's own rows complete its panel or,
 * for a panel other ranks share, until the finish. From the segments, not row by row (partial.c);
 * -1 when out of memory. */
int64_t dsv4_partial_rows(const dsv4_range *segs, int n_seg, int64_t T, int64_t P);
/* The same for rank `rank` of the split (*mine) and the most over its `size` ranks (*most). */
dsv4_status dsv4_partial_rows_all(const dsv4_packing *pk, dsv4_split split, int size, int rank, int64_t *mine,
                                  int64_t *most);

#endif
