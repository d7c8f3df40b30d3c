/* shared.c: the per-forward-pass state V4.1 layers share (shared.h): entries by source layer, their
 * buffers kept across resets, and the public create / reset / free. */
#include <string.h>

#include "shared.h"
#include "util/err.h"

dsv4_status dsv4_shared_create(dsv4_shared **out) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(out, DSV4_ERR_ARG, "shared: NULL out");
  DSV4_ALLOC(*out, 1);
fail:
  return rc;
}

void dsv4_shared_reset(dsv4_shared *s) {
  if (!s) return;
  s->gen++;
  for (int i = 0; i < s->n_kv; i++) dsv4_shared_drop_kv(s->kv[i]);
  for (int i = 0; i < s->n_sel; i++) dsv4_shared_drop_sel(s->sel[i]);
}

void dsv4_shared_drop_kv(dsv4_shared_kv *e) {
  dsv4_plan_key_free(&e->key);
  e->active = e->complete = e->train = e->sums_ready = e->bwd_done = 0;
  memset(e->reader, 0, sizeof e->reader);
  memset(e->done, 0, sizeof e->done);
}

void dsv4_shared_drop_sel(dsv4_shared_sel *e) { e->active = e->complete = 0; }

void dsv4_shared_free(dsv4_shared *s) {
  if (!s) return;
  for (int i = 0; i < s->n_kv; i++) {
    dsv4_plan_key_free(&s->kv[i]->key);
    free(s->kv[i]->cmp);
    free(s->kv[i]->x_cmp);
    free(s->kv[i]);
  }
  for (int i = 0; i < s->n_sel; i++) {
    free(s->sel[i]->topk);
    free(s->sel[i]);
  }
  free(s->kv);
  free(s->sel);
  free(s);
}

size_t dsv4_shared_bytes(const dsv4_shared *s) {
  size_t b = 0;
  if (!s) return 0;
  for (int i = 0; i < s->n_kv; i++) b += sizeof(float) * (s->kv[i]->cap + s->kv[i]->d_cap);
  for (int i = 0; i < s->n_sel; i++) b += sizeof(int32_t) * s->sel[i]->cap;
  return b;
}

dsv4_status dsv4_shared_skip_backward(dsv4_shared *s, int layer) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(s, DSV4_ERR_ARG, "shared: NULL state");
  DSV4_CHECK(layer >= 0 && layer < DSV4_MAX_LAYERS, DSV4_ERR_ARG, "shared: layer %d out of range", layer);
  for (int i = 0; i < s->n_kv; i++) {
    dsv4_shared_kv *e = s->kv[i];
    DSV4_CHECK(!e->active || e->layer != layer, DSV4_ERR_STATE,
               "shared: layer %d is a kv source: its backward cannot be skipped (it sums its readers')", layer);
    if (!e->active || !e->reader[layer]) continue;
    DSV4_CHECK(!e->done[layer], DSV4_ERR_STATE, "shared: layer %d's backward already ran (or was skipped) in this pass",
               layer);
    DSV4_CHECK(!e->bwd_done, DSV4_ERR_STATE,
               "shared: layer %d's kv source, layer %d, already ran its backward (skip before it)", layer, e->layer);
    e->done[layer] = 1; /* adds nothing to the sums: the source's backward sees a zero contribution */
    return DSV4_OK;
  }
  DSV4_FAIL(DSV4_ERR_STATE, "shared: layer %d read no kv source in a training forward of this pass", layer);
fail:
  return rc;
}

size_t dsv4_shared_kv_bytes(int64_t n_cmp, int D, int Di) { return sizeof(float) * (size_t)n_cmp * (size_t)(D + Di); }

size_t dsv4_shared_sel_bytes(int64_t n, int k, int n_cand) {
  return sizeof(int32_t) * (size_t)n * (size_t)(k + n_cand);
}

dsv4_shared_kv *dsv4_shared_kv_of(dsv4_shared *s, int layer) {
  for (int i = 0; s && i < s->n_kv; i++)
    if (s->kv[i]->active && s->kv[i]->layer == layer) return s->kv[i];
  return NULL;
}

dsv4_shared_sel *dsv4_shared_sel_of(dsv4_shared *s, int layer) {
  for (int i = 0; s && i < s->n_sel; i++)
    if (s->sel[i]->active && s->sel[i]->layer == layer) return s->sel[i];
  return NULL;
}

/* A new zeroed entry of size bytes appended to the pointer array *arr of *n. */
static dsv4_status grow(void ***arr, int *n, size_t size) {
  dsv4_status rc = DSV4_OK;
  void **grown = realloc(*arr, sizeof(void *) * (size_t)(*n + 1));
  DSV4_CHECK(grown, DSV4_ERR_NOMEM, "shared: out of memory for an entry");
  *arr = grown;
  DSV4_CHECK(grown[*n] = calloc(1, size), DSV4_ERR_NOMEM, "shared: out of memory for an entry");
  (*n)++;
fail:
  return rc;
}

/* The buffer *p holding at least n elements of size bytes (contents not kept when it grows). */
static dsv4_status hold(void **p, size_t *cap, size_t n, size_t size, const char *what, int layer) {
  dsv4_status rc = DSV4_OK;
  if (*p && n <= *cap) return DSV4_OK;
  free(*p);
  *cap = 0;
  *p = malloc((n ? n : 1) * size);
  dsv4_mem_advise(*p, (n ? n : 1) * size);
  DSV4_CHECK(*p, DSV4_ERR_NOMEM, "shared: out of memory: %zu bytes for layer %d's %s", n * size, layer, what);
  *cap = n;
fail:
  return rc;
}

dsv4_status dsv4_shared_kv_new(dsv4_shared *s, int layer, int ratio, uint64_t cfg_hash, const dsv4_plan_key *key,
                               int64_t n_cmp, int D, int Di, int train, dsv4_shared_kv **out) {
  dsv4_status rc = DSV4_OK;
  int i = 0;
  DSV4_CHECK(!dsv4_shared_kv_of(s, layer), DSV4_ERR_STATE,
             "layer %d already ran in this forward pass of the shared state: use one dsv4_shared per forward "
             "pass (dsv4_shared_reset between passes)", layer);
  while (i < s->n_kv && s->kv[i]->layer != layer) i++; /* its entry of an earlier pass keeps its buffers */
  if (i == s->n_kv) DSV4_TRY(grow((void ***)&s->kv, &s->n_kv, sizeof **s->kv));
  dsv4_shared_kv *e = s->kv[i];
  void *buf = e->cmp;
  DSV4_TRY(hold(&buf, &e->cap, (size_t)n_cmp * (size_t)(D + Di), sizeof(float), "compressed kv", layer));
  e->cmp = buf;
  e->KI = e->cmp + (size_t)n_cmp * (size_t)D;
  DSV4_TRY(dsv4_plan_key_copy(&e->key, key));
  e->layer = layer, e->ratio = ratio, e->cfg_hash = cfg_hash, e->n_cmp = n_cmp, e->D = D, e->Di = Di;
  e->train = train != 0;
  e->complete = e->sums_ready = e->bwd_done = 0;
  memset(e->reader, 0, sizeof e->reader);
  memset(e->done, 0, sizeof e->done);
  e->active = 1;
  *out = e;
fail:
  return rc;
}

dsv4_status dsv4_shared_kv_sums(dsv4_shared_kv *e) {
  dsv4_status rc = DSV4_OK;
  if (e->sums_ready) return DSV4_OK;
  const size_t n = (size_t)e->n_cmp * (size_t)(4 * e->D + 5 * e->Di); /* in floats: an exact element is four */
  void *buf = e->x_cmp;
  DSV4_TRY(hold(&buf, &e->d_cap, n, sizeof(float), "compressed kv gradient", e->layer));
  e->x_cmp = buf;
  e->x_KI = e->x_cmp + (size_t)e->n_cmp * 2 * (size_t)e->D;
  e->d_KI = (float *)(e->x_KI + (size_t)e->n_cmp * 2 * (size_t)e->Di);
  memset(buf, 0, sizeof(float) * n);
  e->sums_ready = 1;
fail:
  return rc;
}

dsv4_status dsv4_shared_sel_new(dsv4_shared *s, int layer, int64_t n, int k, int n_cand, dsv4_shared_sel **out) {
  dsv4_status rc = DSV4_OK;
  int i = 0;
  DSV4_CHECK(!dsv4_shared_sel_of(s, layer), DSV4_ERR_STATE,
             "layer %d already selected in this forward pass of the shared state: use one dsv4_shared per "
             "forward pass (dsv4_shared_reset between passes)", layer);
  while (i < s->n_sel && s->sel[i]->layer != layer) i++;
  if (i == s->n_sel) DSV4_TRY(grow((void ***)&s->sel, &s->n_sel, sizeof **s->sel));
  dsv4_shared_sel *e = s->sel[i];
  void *buf = e->topk;
  DSV4_TRY(hold(&buf, &e->cap, (size_t)n * (size_t)(k + n_cand), sizeof(int32_t), "selection", layer));
  e->topk = buf;
  e->cand = n_cand > 0 ? e->topk + (size_t)n * (size_t)k : NULL;
  e->layer = layer, e->n = n, e->k = k, e->n_cand = n_cand;
  e->active = 1;
  e->complete = 0;
  *out = e;
fail:
  return rc;
}
