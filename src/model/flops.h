/* flops.h: the FLOP formula of one token (flops.c's header comment), for the counts of flops.c and
 * for the planner's estimate of each rank's work (plan/offload.c). */
#ifndef DSV4_FLOPS_H
#define DSV4_FLOPS_H

#include "dsv4cp.h"
#include "plan/docs.h"

/* Per real token of one layer: forward FLOPs of its projections and compressors (proj; the backward
 * does twice that) and of the indexer's projections (idx_proj; once more in the backward, weight
 * gradients only), per compressed entry of a V4.1 kv source its key projection, per attended key
 * 4 H D forward (twice that backward), per visible slot the indexer's scoring, per selected key
 * the KL backward. */
typedef struct {
  int r, W, topk, sparse, selects;
  double proj, idx_proj, key_proj, key, vis, sel;
} dsv4_token_cost;

/* The keys of the token at document-local position t: window, visible slots (0 unless the layer
 * selects), compressed keys attended. */
typedef struct {
  int64_t nw, nv, nc;
} dsv4_token_keys;

dsv4_status dsv4_token_cost_of(const dsv4_config *cfg, int layer, dsv4_token_cost *c);

static inline dsv4_token_keys dsv4_token_keys_at(const dsv4_token_cost *c, int64_t t) {
  const int64_t nw = (t < c->W - 1 ? t : c->W - 1) + 1, nv = c->r > 0 ? (t + 1) / c->r : 0;
  const int64_t nc = c->sparse ? (nv < c->topk ? nv : c->topk) : nv;
  return (dsv4_token_keys){nw, c->selects ? nv : 0, nc};
}

/* Forward + backward FLOPs of a real token at position t, and of its attention alone. */
static inline double dsv4_token_flops(const dsv4_token_cost *c, int64_t t, double *attention) {
  const dsv4_token_keys k = dsv4_token_keys_at(c, t);
  *attention = 3 * c->key * (double)(k.nw + k.nc);
  return 3 * c->proj + 2 * c->idx_proj + c->vis * (double)k.nv + c->sel * (double)k.nc +
         *attention;
}

#endif
