/* docs.h: the packed-sequence meta of docs/spec.md section 4, validated once per plan: the document
 * table, per-document compressed slot counts, and the slot arithmetic every rank derives alone. */
#ifndef DSV4_DOCS_H
#define DSV4_DOCS_H

#include <stdint.h>
#include "dsv4cp.h"

/* A run of global tokens [g0, g0 + len) (a segment of a rank's rows). */
typedef struct {
  int64_t g0, len;
} dsv4_range;

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

/* Validates pk (errors name cu_seqlens / seqlens_real and the document) and builds the table;
 * ratio only decides the slot counts (documents of any length are accepted). */
dsv4_status dsv4_docs_build(dsv4_docs *d, const dsv4_packing *pk, int ratio);
void dsv4_docs_free(dsv4_docs *d);
/* Document containing global token g (binary search). */
int dsv4_docs_find(const dsv4_docs *d, int64_t g);

/* Compressed slots (SPEC 4). Slot j of document i pools document-local tokens [jr, (j+1)r) (and
 * [(j-1)r, jr) for r = 4); its END is its last token cu[i] + (j+1)r - 1. Global slot ids follow
 * the documents' order, which is also the order of their ends, so the slots ending inside any
 * token range [g0, g1) are the consecutive ids [slots_before(g0), slots_before(g1)). */
/* Document-local positions [*lo, *hi) of the tokens [g0, g0 + len). */
void dsv4_docs_pos_range(const dsv4_docs *d, int64_t g0, int64_t len, int64_t *lo, int64_t *hi);
/* Number of slots whose end lies before global token g (0 <= g <= T). */
int64_t dsv4_docs_slots_before(const dsv4_docs *d, int64_t g);
/* Document and in-document index j of global slot id (0 <= id < n_cmp). */
void dsv4_docs_slot(const dsv4_docs *d, int64_t id, int *doc, int64_t *j);

#endif
