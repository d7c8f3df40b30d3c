/* checkpoint_api.c: the public checkpoint steps of dsv4cp_io.h (open, locate a layer's tensors,
 * read them) over the loader's internals (io/checkpoint.c, model/weights.c), so that a program can
 * report where every tensor is before it reads it. */
#include <string.h>

#include "dsv4cp_io.h"
#include "io/checkpoint.h"
#include "model/weights.h"
#include "util/abi.h"
#include "util/err.h"

struct dsv4_checkpoint {
  dsv4_ckpt *ck;
  dsv4_ckpt_tensor src[W_COUNT];
  const dsv4_weights *located;   /* the weight set the sources are for (NULL: none yet) */
};

dsv4_status dsv4_checkpoint_open(dsv4_checkpoint **out, const char *path) {
  dsv4_status rc = DSV4_OK;
  dsv4_checkpoint *c = NULL;
  DSV4_CHECK(out && path, DSV4_ERR_ARG, "checkpoint: NULL argument");
  *out = NULL;
  DSV4_ALLOC(c, 1);
  DSV4_TRY(dsv4_ckpt_open(&c->ck, path));
  *out = c;
  return DSV4_OK;
fail:
  dsv4_checkpoint_close(c);
  return rc;
}

void dsv4_checkpoint_close(dsv4_checkpoint *c) {
  if (!c) return;
  dsv4_ckpt_close(c->ck);
  free(c);
}

const char *dsv4_checkpoint_path(const dsv4_checkpoint *c) { return c ? dsv4_ckpt_path(c->ck) : NULL; }

int dsv4_checkpoint_shards(const dsv4_checkpoint *c, int *opened) {
  if (!c) {
    if (opened) *opened = 0;
    return 0;
  }
  return dsv4_ckpt_shards(c->ck, opened);
}

dsv4_status dsv4_checkpoint_locate(dsv4_checkpoint *c, dsv4_weights *w, dsv4_weight_source *src) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(c && w, DSV4_ERR_ARG, "checkpoint locate: NULL argument");
  c->located = NULL;
  DSV4_TRY(dsv4_weights_locate(w, c->ck, c->src));
  c->located = w;
  for (int i = 0; src && i < dsv4_weights_count(w); i++) {
    const dsv4_ckpt_tensor *t = &c->src[i];
    dsv4_weight_source s = {DSV4_HEAD(dsv4_weight_source), .name = t->t->name, .dtype = t->t->dtype_name,
                            .ndim = t->t->ndim, .shard = t->shard, .bytes = dsv4_ckpt_bytes(t)};
    for (int k = 0; k < t->t->ndim && k < 2; k++) s.shape[k] = t->t->shape[k];
    if (t->scale) {
      s.scale_name = t->scale->name;
      s.scale_dtype = t->scale->dtype_name;
      for (int k = 0; k < t->scale->ndim && k < 2; k++) s.scale_shape[k] = t->scale->shape[k];
      s.scale_shard = t->scale_shard;
      s.block[0] = t->block[0];
      s.block[1] = t->block[1];
    }
    DSV4_TRY(DSV4_STRUCT_OUT(&src[i], &s, dsv4_weight_source));
  }
fail:
  return rc;
}

dsv4_status dsv4_checkpoint_read(dsv4_checkpoint *c, dsv4_weights *w) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(c && w, DSV4_ERR_ARG, "checkpoint read: NULL argument");
  DSV4_CHECK(c->located == w, DSV4_ERR_STATE, "checkpoint read: locate this weight set first (dsv4_checkpoint_locate)");
  DSV4_TRY(dsv4_weights_read(w, c->src));
fail:
  return rc;
}
