/* topk.h: top-k selection with the contract's total order: score descending, then id ascending
 * (so exact ties go to the smaller id, on every rank and in every run). */
#ifndef DSV4_TOPK_H
#define DSV4_TOPK_H

#include <stdint.h>

typedef struct {
  float score;
  int32_t id;
} dsv4_scored;

/* 1 when a comes before b in the output order. */
static inline int dsv4_scored_before(dsv4_scored a, dsv4_scored b) {
  return a.score > b.score || (a.score == b.score && a.id < b.id);
}

/* Reorders v[0..n) so that its first k entries are the k best, sorted (k <= n). O(n + k log k). */
void dsv4_topk_select(dsv4_scored *v, int64_t n, int64_t k);

/* Writes k best of v[0..n) to ids/scores (width w, padded with -1 / -INFINITY); scores may be NULL. */
void dsv4_topk_write(dsv4_scored *v, int64_t n, int w, int32_t *ids, float *scores);

#endif
