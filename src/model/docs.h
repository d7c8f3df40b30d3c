/* docs.h: the packed-sequence meta of SPEC section 4, validated once per call: document table,
 * per-document compressed slot counts, and the token map (doc, doc-local position, real) of a set
 * of global token ranges. Shared by the one-rank core and the CP core. */
#ifndef DSV4_DOCS_H
#define DSV4_DOCS_H

#include <stdint.h>
#include "dsv4cp.h"

typedef struct {
  int n_docs;
  int64_t T;
  int ratio;          /* compress ratio the slot counts refer to (0: no slots) */
  int batched;
  int64_t *cu;        /* [n_docs + 1] padded prefix sums */
  int64_t *real;      /* [n_docs] real tokens */
  int64_t *cu_cmp;    /* [n_docs + 1] prefix sums of real // ratio (all zero when ratio == 0) */
  int64_t n_cmp;      /* total compressed slots */
} dsv4_docs;

/* Validates pk for a layer of the given ratio (errors name cu_seqlens / seqlens_real and the
 * document) and builds the table. */
dsv4_status dsv4_docs_build(dsv4_docs *d, const dsv4_packing *pk, int ratio);
void dsv4_docs_free(dsv4_docs *d);
/* Document containing global token g (binary search). */
int dsv4_docs_find(const dsv4_docs *d, int64_t g);

/* Owned storage behind a dsv4_token_map. */
typedef struct {
  dsv4_token_map map;
  int64_t *global;
  int32_t *doc, *pos;
  uint8_t *real;
  int64_t cap;
} dsv4_tokmap_buf;

/* Fills the map for n local rows whose global indices are glob[0..n). */
dsv4_status dsv4_tokmap_fill(dsv4_tokmap_buf *b, const dsv4_docs *d, const int64_t *glob, int64_t n);
void dsv4_tokmap_free(dsv4_tokmap_buf *b);

#endif
