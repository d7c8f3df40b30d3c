/* shared.h: the state several DeepSeek V4.1 layers share in one forward pass (docs/spec.md section
 * 10, "Running layers that share"). The model owns one dsv4_shared per forward pass and hands it to
 * every layer, in order for the forward and in reverse for the backward:
 *   a kv source (FULL) writes its global compressed kv and indexer keys into a kv entry; every layer
 *     of its group attends to them; in the backward each adds its gradient of them into the entry's
 *     sums, and the source's backward, which comes last, runs Stage 1's backward once on the sums;
 *   an index source (FULL, REINDEX) writes this rank's top-k ids into a selection entry (REUSE
 *     layers attend with them); the candidate source also its candidate blocks.
 * The entries check the calling order: a consumer whose source did not run in this pass, a
 * packing that differs from the source's, a consumer's backward after its source's, or a source's
 * backward before all its consumers' are each a clear error (core_fwd.c, core_bwd.c).
 * Entries keep their buffers across dsv4_shared_reset (a model resets once per step), so pages
 * fault once. */
#ifndef DSV4_SHARED_H
#define DSV4_SHARED_H

#include "dsv4cp.h"
#include "plan/plan.h"

typedef struct {
  int active;              /* written in this pass */
  int layer, ratio;        /* the kv source */
  uint64_t cfg_hash;       /* its configuration (layer-independent values) */
  dsv4_plan_key key;       /* the packing of its forward (every consumer's must be equal) */
  int64_t n_cmp;
  int D, Di;
  float *cmp, *KI;         /* [n_cmp, D], [n_cmp, Di] the global compressed kv and indexer keys */
  int64_t *x_cmp;          /* backward: the exact sums ([n_cmp, 2 D], util/xacc.h) of every reader's d cmp */
  float *d_KI;             /* backward: what reference paths add to d KI [n_cmp, Di] (settled into x_KI) */
  int64_t *x_KI;           /* backward: the exact sums ([n_cmp, 2 Di]) of every reader's d KI */
  size_t cap, d_cap;       /* floats allocated for cmp + KI, x_cmp (4 D per row) + d_KI + x_KI (4 Di) */
  int complete;            /* the source's forward finished (a failed one leaves no entry) */
  int train;               /* the source's forward was a training one */
  uint8_t reader[DSV4_MAX_LAYERS]; /* 1: layer L ran a training forward that reads it */
  uint8_t done[DSV4_MAX_LAYERS];   /* 1: ... and its backward */
  int sums_ready;          /* x_cmp, d_KI zeroed for this pass's backward */
  int bwd_done;            /* the source's backward ran */
} dsv4_shared_kv;

typedef struct {
  int active, complete;
  int layer;               /* the index source */
  int64_t n;               /* this rank's rows */
  int k, n_cand;
  int32_t *topk;           /* [n, k] */
  int32_t *cand;           /* [n, n_cand] candidate blocks (the candidate source), or NULL */
  size_t cap;              /* int32 allocated for topk + cand */
} dsv4_shared_sel;

struct dsv4_shared {
  uint64_t gen;            /* bumped by every reset: a layer's backward checks its forward's */
  dsv4_shared_kv **kv;     /* entries allocated one by one: the cores keep pointers to them */
  int n_kv;
  dsv4_shared_sel **sel;
  int n_sel;
};

/* The active kv / selection entry of a source layer in this pass, or NULL. A failed forward of the
 * source drops its entry (dsv4_shared_drop_*); a consumer reads only complete ones. */
dsv4_shared_kv *dsv4_shared_kv_of(dsv4_shared *s, int layer);
dsv4_shared_sel *dsv4_shared_sel_of(dsv4_shared *s, int layer);
/* The entry of a source's forward (an error when the source already ran in this pass); the entry
 * takes a copy of key. */
dsv4_status dsv4_shared_kv_new(dsv4_shared *s, int layer, int ratio, uint64_t cfg_hash, const dsv4_plan_key *key,
                               int64_t n_cmp, int D, int Di, int train, dsv4_shared_kv **out);
dsv4_status dsv4_shared_sel_new(dsv4_shared *s, int layer, int64_t n, int k, int n_cand, dsv4_shared_sel **out);
void dsv4_shared_drop_kv(dsv4_shared_kv *e);
void dsv4_shared_drop_sel(dsv4_shared_sel *e);
/* The sums of a kv entry, allocated and zeroed at the first backward that adds to them. */
dsv4_status dsv4_shared_kv_sums(dsv4_shared_kv *e);
/* Bytes of a kv entry (cmp and KI; the backward's sums are as large) and of a selection entry
 * (what the planner counts for them). */
size_t dsv4_shared_kv_bytes(int64_t n_cmp, int D, int Di);
size_t dsv4_shared_sel_bytes(int64_t n, int k, int n_cand);

#endif
