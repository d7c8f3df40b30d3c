/* weights.c: the weight set of one layer: the table of DeepSeek V4 tensor names and shapes
 * (SPEC section 2), one allocation carved into tensors, deterministic random initialisation,
 * and loading from a checkpoint (src/io/checkpoint.c: one file, an index of shards, FP8) with the
 * layer's name prefix found and every name, shape and dtype checked. */
#include "weights.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/checkpoint.h"
#include "util/abi.h"
#include "util/err.h"
#include "util/rng.h"

/* How random initial values are scaled (they only need to exercise every path sensibly). */
typedef enum { INIT_LINEAR, INIT_NORM, INIT_APE, INIT_SINK } init_kind;
#define INIT_NORM_SPREAD 0.1f
#define INIT_APE_SCALE 0.5f
#define FP8_BLOCK_DEFAULT 128 /* dsv4_config.fp8_block 0 = not given = V4's 128 */

struct dsv4_weights {
  dsv4_config cfg;
  int layer, ratio;
  char prefix[32];             /* "layers.L.", "mtp.i.", either with "model." in front, or "": the names
                                  the loaded checkpoint uses (random weights: "layers.L.") */
  dsv4_tensor t[W_COUNT];      /* data == NULL for tensors this layer kind does not have */
  init_kind init[W_COUNT];
  float *block;
};

static const char *const NAMES[W_COUNT] = {
    "attn.wq_a.weight", "attn.q_norm.weight", "attn.wq_b.weight", "attn.wkv.weight",
    "attn.kv_norm.weight", "attn.attn_sink", "attn.wo_a.weight", "attn.wo_b.weight",
    "attn.compressor.ape", "attn.compressor.wkv.weight", "attn.compressor.wgate.weight",
    "attn.compressor.norm.weight", "attn.indexer.wq_b.weight", "attn.indexer.weights_proj.weight",
    "attn.indexer.compressor.ape", "attn.indexer.compressor.wkv.weight",
    "attn.indexer.compressor.wgate.weight", "attn.indexer.compressor.norm.weight", "attn.indexer.wk.weight",
    "attn.indexer.k_norm.weight"};

static void set_shape(dsv4_weights *w, dsv4_wid id, int64_t a, int64_t b, init_kind kind) {
  dsv4_tensor *t = &w->t[id];
  t->name = NAMES[id];
  t->ndim = b ? 2 : 1;
  t->shape[0] = a;
  t->shape[1] = b;
  t->numel = b ? a * b : a;
  w->init[id] = kind;
}

/* Fills the table of names and shapes of `layer` (no data yet). */
static dsv4_status set_shapes(dsv4_weights *w, const dsv4_config *cfg, int layer) {
  dsv4_status rc = DSV4_OK;
  DSV4_TRY(dsv4_config_in(&w->cfg, cfg));
  cfg = &w->cfg;
  DSV4_TRY(dsv4_config_validate(cfg));
  int r = dsv4_config_ratio(cfg, layer);
  DSV4_CHECK(r >= 0, DSV4_ERR_ARG, "layer %d out of range (config has %d layers)", layer, cfg->n_layers);
  dsv4_layer_info info = DSV4_LAYER_INFO_INIT;
  DSV4_TRY(dsv4_config_layer(cfg, layer, &info)); /* refuses V4.1's draft stages */
  w->layer = layer;
  w->ratio = r;
  snprintf(w->prefix, sizeof w->prefix, "layers.%d.", layer);
  const int64_t d = cfg->dim, H = cfg->n_heads, D = cfg->head_dim, dq = cfg->q_lora_rank;
  const int64_t G = cfg->o_groups, Ro = cfg->o_lora_rank, Hi = cfg->index_n_heads,
                Di = cfg->index_head_dim;
  set_shape(w, W_WQ_A, dq, d, INIT_LINEAR);
  set_shape(w, W_Q_NORM, dq, 0, INIT_NORM);
  set_shape(w, W_WQ_B, H * D, dq, INIT_LINEAR);
  set_shape(w, W_WKV, D, d, INIT_LINEAR);
  set_shape(w, W_KV_NORM, D, 0, INIT_NORM);
  set_shape(w, W_SINK, H, 0, INIT_SINK);
  set_shape(w, W_WO_A, G * Ro, (H / G) * D, INIT_LINEAR);
  set_shape(w, W_WO_B, d, G * Ro, INIT_LINEAR);
  if (cfg->v41) { /* docs/spec.md section 10 "Weights": what the role reads */
    if (info.role == DSV4_ROLE_FULL) {
      set_shape(w, W_C_WKV, D, d, INIT_LINEAR);
      if (r == 2) set_shape(w, W_C_WGATE, D, d, INIT_LINEAR);
      set_shape(w, W_C_NORM, D, 0, INIT_NORM);
      set_shape(w, W_I_WK, Di, D, INIT_LINEAR);
      set_shape(w, W_I_KNORM, Di, 0, INIT_NORM);
    }
    if (info.selects) {
      set_shape(w, W_I_WQ_B, Hi * Di, dq, INIT_LINEAR);
      set_shape(w, W_I_PROJ, Hi, d, INIT_LINEAR);
    }
  } else if (r > 0) {
    const int64_t c = (r == 4) ? 2 : 1;
    set_shape(w, W_C_APE, r, c * D, INIT_APE);
    set_shape(w, W_C_WKV, c * D, d, INIT_LINEAR);
    set_shape(w, W_C_WGATE, c * D, d, INIT_LINEAR);
    set_shape(w, W_C_NORM, D, 0, INIT_NORM);
  }
  if (!cfg->v41 && r == 4) {
    set_shape(w, W_I_WQ_B, Hi * Di, dq, INIT_LINEAR);
    set_shape(w, W_I_PROJ, Hi, d, INIT_LINEAR);
    set_shape(w, W_I_APE, 4, 2 * Di, INIT_APE);
    set_shape(w, W_I_WKV, 2 * Di, d, INIT_LINEAR);
    set_shape(w, W_I_WGATE, 2 * Di, d, INIT_LINEAR);
    set_shape(w, W_I_NORM, Di, 0, INIT_NORM);
  }
fail:
  return rc;
}

static int64_t total_numel(const dsv4_weights *w) {
  int64_t total = 0;
  for (int i = 0; i < W_COUNT; i++) total += w->t[i].numel;
  return total;
}

dsv4_status dsv4_weights_numel(const dsv4_config *cfg, int layer, int64_t *n) {
  dsv4_status rc = DSV4_OK;
  dsv4_weights w = {0};
  DSV4_CHECK(cfg && n, DSV4_ERR_ARG, "weights: NULL argument");
  DSV4_TRY(set_shapes(&w, cfg, layer));
  *n = total_numel(&w);
fail:
  return rc;
}

dsv4_status dsv4_weights_create(dsv4_weights **out, const dsv4_config *cfg, int layer) {
  dsv4_status rc = DSV4_OK;
  dsv4_weights *w = NULL;
  DSV4_CHECK(out && cfg, DSV4_ERR_ARG, "weights: NULL argument");
  *out = NULL;
  DSV4_ALLOC(w, 1);
  DSV4_TRY(set_shapes(w, cfg, layer));
  const int64_t total = total_numel(w);
  DSV4_ALLOC(w->block, total);
  int64_t off = 0;
  for (int i = 0; i < W_COUNT; i++)
    if (w->t[i].numel) {
      w->t[i].data = w->block + off;
      off += w->t[i].numel;
    }
  *out = w;
  return DSV4_OK;
fail:
  dsv4_weights_free(w);
  return rc;
}

void dsv4_weights_free(dsv4_weights *w) {
  if (!w) return;
  free(w->block);
  free(w);
}

float *dsv4_w(const dsv4_weights *w, dsv4_wid id) { return w->t[id].data; }
int dsv4_weights_layer(const dsv4_weights *w) { return w->layer; }

float *dsv4_weights_block(const dsv4_weights *w, int64_t *n) {
  int64_t total = 0;
  for (int i = 0; i < W_COUNT; i++) total += w->t[i].numel;
  *n = total;
  return w->block;
}
const dsv4_config *dsv4_weights_config(const dsv4_weights *w) { return &w->cfg; }
const char *dsv4_weights_prefix(const dsv4_weights *w) { return w->prefix; }

/* The public index i runs over present tensors only, in the order of the id table. */
static int nth_present(const dsv4_weights *w, int i) {
  for (int id = 0; id < W_COUNT; id++)
    if (w->t[id].data && i-- == 0) return id;
  return -1;
}

int dsv4_weights_count(const dsv4_weights *w) {
  int n = 0;
  for (int id = 0; id < W_COUNT; id++) n += w->t[id].data != NULL;
  return n;
}

dsv4_status dsv4_weights_get(const dsv4_weights *w, int i, dsv4_tensor *t) {
  dsv4_status rc = DSV4_OK;
  int id = nth_present(w, i);
  DSV4_CHECK(id >= 0, DSV4_ERR_ARG, "weights: tensor index %d out of range", i);
  dsv4_tensor full = w->t[id];
  full.struct_size = sizeof full;
  DSV4_TRY(DSV4_STRUCT_OUT(t, &full, dsv4_tensor));
fail:
  return rc;
}

float *dsv4_weights_find(const dsv4_weights *w, const char *name) {
  char full[128], loaded[128];
  for (int id = 0; w && name && id < W_COUNT; id++) {
    if (!w->t[id].data) continue;
    snprintf(full, sizeof full, "layers.%d.%s", w->layer, NAMES[id]);
    snprintf(loaded, sizeof loaded, "%s%s", w->prefix, NAMES[id]);
    if (!strcmp(name, NAMES[id]) || !strcmp(name, full) || !strcmp(name, loaded)) return w->t[id].data;
  }
  return NULL;
}

void dsv4_weights_zero(dsv4_weights *w) {
  for (int id = 0; id < W_COUNT; id++)
    if (w->t[id].data) memset(w->t[id].data, 0, sizeof(float) * (size_t)w->t[id].numel);
}

dsv4_status dsv4_weights_add(dsv4_weights *dst, const dsv4_weights *src) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(dst && src && dst->layer == src->layer && dst->ratio == src->ratio, DSV4_ERR_ARG,
             "weights_add: sets of different layers");
  for (int id = 0; id < W_COUNT; id++) {
    DSV4_CHECK(dst->t[id].numel == src->t[id].numel, DSV4_ERR_ARG,
               "weights_add: tensor '%s' differs in size", NAMES[id]);
    for (int64_t i = 0; i < dst->t[id].numel; i++) dst->t[id].data[i] += src->t[id].data[i];
  }
fail:
  return rc;
}

dsv4_status dsv4_weights_init_random(dsv4_weights *w, uint64_t seed) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(w, DSV4_ERR_ARG, "weights: NULL");
  for (int id = 0; id < W_COUNT; id++) {
    dsv4_tensor *t = &w->t[id];
    if (!t->data) continue;
    uint64_t stream = dsv4_name_stream(NAMES[id]);
    switch (w->init[id]) {
      case INIT_LINEAR: /* uniform with std 1/sqrt(fan_in): keeps activations O(1) */
        dsv4_random_fill(t->data, t->numel, seed, stream, 0, sqrtf(3.0f / (float)t->shape[1]));
        break;
      case INIT_NORM:
        dsv4_random_fill(t->data, t->numel, seed, stream, 0, INIT_NORM_SPREAD);
        for (int64_t i = 0; i < t->numel; i++) t->data[i] += 1.0f;
        break;
      case INIT_APE: dsv4_random_fill(t->data, t->numel, seed, stream, 0, INIT_APE_SCALE); break;
      case INIT_SINK: dsv4_random_fill(t->data, t->numel, seed, stream, 0, 1.0f); break;
    }
  }
fail:
  return rc;
}

/* The name prefixes layer L may have in a checkpoint, most specific first: a multi-token-prediction
 * layer (L >= n_hidden_layers > 0) is mtp.{L - n_hidden_layers}. in DeepSeek's files (layers.L. is
 * accepted too); others are layers.L.; each optionally with model. in front. Returns how many. */
static int layer_prefixes(const dsv4_weights *w, char out[4][32]) {
  const int nh = w->cfg.n_hidden_layers, L = w->layer;
  int n = 0;
  if (nh > 0 && L >= nh && !w->cfg.v41) {
    snprintf(out[n++], 32, "mtp.%d.", L - nh);
    snprintf(out[n++], 32, "model.mtp.%d.", L - nh);
  }
  snprintf(out[n++], 32, "layers.%d.", L);
  snprintf(out[n++], 32, "model.layers.%d.", L);
  return n;
}

/* Picks the prefix the checkpoint uses for this layer, probing for attn.wq_a.weight: exactly one
 * full prefix, else bare short names (a single-layer file), else an error listing what was tried. */
static dsv4_status find_prefix(dsv4_weights *w, const dsv4_ckpt *c) {
  dsv4_status rc = DSV4_OK;
  char pre[4][32], name[4][96], tried[400];
  const int n = layer_prefixes(w, pre);
  int found = -1;
  size_t k = 0;
  for (int i = 0; i < n; i++) {
    snprintf(name[i], sizeof name[i], "%s%s", pre[i], NAMES[W_WQ_A]);
    k += (size_t)snprintf(tried + k, sizeof tried - k, "'%s', ", name[i]);
    if (!dsv4_ckpt_has(c, name[i])) continue;
    DSV4_CHECK(found < 0, DSV4_ERR_TENSOR, "%s: layer %d is there twice, as '%s' and '%s'", dsv4_ckpt_path(c),
               w->layer, name[found], name[i]);
    found = i;
  }
  if (found >= 0) {
    snprintf(w->prefix, sizeof w->prefix, "%s", pre[found]);
  } else {
    DSV4_CHECK(dsv4_ckpt_has(c, NAMES[W_WQ_A]), DSV4_ERR_TENSOR, "%s: missing tensor %snor '%s'", dsv4_ckpt_path(c),
               tried, NAMES[W_WQ_A]);
    w->prefix[0] = 0;
  }
fail:
  return rc;
}

dsv4_status dsv4_weights_locate(dsv4_weights *w, dsv4_ckpt *c, dsv4_ckpt_tensor *src) {
  dsv4_status rc = DSV4_OK;
  char full[160], want[64], got[64];
  DSV4_CHECK(w && c && src, DSV4_ERR_ARG, "weights: NULL argument");
  DSV4_TRY(find_prefix(w, c));
  const int block[2] = {w->cfg.fp8_block[0] > 0 ? w->cfg.fp8_block[0] : FP8_BLOCK_DEFAULT,
                        w->cfg.fp8_block[1] > 0 ? w->cfg.fp8_block[1] : FP8_BLOCK_DEFAULT};
  int i = 0;
  for (int id = 0; id < W_COUNT; id++) {
    const dsv4_tensor *t = &w->t[id];
    if (!t->data) continue;
    snprintf(full, sizeof full, "%s%s", w->prefix, NAMES[id]);
    dsv4_ckpt_tensor *s = &src[i++];
    DSV4_TRY(dsv4_ckpt_locate(c, full, block, s));
    const dsv4_st_info *info = s->t;
    DSV4_CHECK(info->dtype == DSV4_DT_F32 || info->dtype == DSV4_DT_BF16 || info->dtype == DSV4_DT_F16 ||
                   info->dtype == DSV4_DT_F8_E4M3,
               DSV4_ERR_TENSOR, "%s: tensor '%s' has dtype %s, expected F32, BF16, F16 or F8_E4M3 (with a block scale)",
               dsv4_st_path(s->file), full, info->dtype_name);
    int same = info->ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = info->shape[d] == t->shape[d];
    if (!same) {
      dsv4_st_shape_str(want, sizeof want, t->shape, t->ndim);
      dsv4_st_shape_str(got, sizeof got, info->shape, info->ndim);
      DSV4_FAIL(DSV4_ERR_TENSOR, "%s: tensor '%s' has shape %s, expected %s", dsv4_st_path(s->file), full, got, want);
    }
  }
fail:
  return rc;
}

dsv4_status dsv4_weights_read(dsv4_weights *w, const dsv4_ckpt_tensor *src) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(w && src, DSV4_ERR_ARG, "weights: NULL argument");
  int i = 0;
  for (int id = 0; id < W_COUNT; id++) {
    dsv4_tensor *t = &w->t[id];
    if (!t->data) continue;
    const dsv4_ckpt_tensor *s = &src[i++];
    DSV4_TRY(dsv4_ckpt_read_f32(s, t->data));
    if (s->scale) continue; /* dequantisation checked every value already */
    for (int64_t k = 0; k < t->numel; k++)
      DSV4_CHECK(isfinite(t->data[k]), DSV4_ERR_TENSOR, "%s: tensor '%s' has a non-finite value at %lld",
                 dsv4_st_path(s->file), s->t->name, (long long)k);
  }
fail:
  return rc;
}

dsv4_status dsv4_weights_load(dsv4_weights *w, const char *path) {
  dsv4_status rc = DSV4_OK;
  dsv4_ckpt *c = NULL;
  dsv4_ckpt_tensor src[W_COUNT];
  DSV4_CHECK(w && path, DSV4_ERR_ARG, "weights: NULL argument");
  DSV4_TRY(dsv4_ckpt_open(&c, path));
  DSV4_TRY(dsv4_weights_locate(w, c, src));
  DSV4_TRY(dsv4_weights_read(w, src));
fail:
  dsv4_ckpt_close(c);
  return rc;
}
