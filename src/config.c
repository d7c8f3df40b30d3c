/* config.c: the layer configuration: built-in presets, config.json parsing (cJSON) under the
 * released Hugging Face key names or the ModelArgs names of DeepSeek's inference code, and
 * validation. Structural keys are required (a wrong guess would silently compute a different
 * model; ModelArgs' dataclass defaults are a tiny debug model and are never used); rope, eps and
 * loss hyperparameters default to the V4-Flash values of SPEC section 1. Every JSON number is
 * range-checked before it is converted. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "util/abi.h"
#include "util/err.h"
#include "util/fileio.h"
#include "util/json.h"

/* V4-Flash values of SPEC section 1 for the keys that may be omitted. */
#define FLASH_ROPE_THETA 10000.0
#define FLASH_COMPRESS_ROPE_THETA 160000.0
#define FLASH_YARN_FACTOR 16.0
#define FLASH_YARN_ORIG 65536.0
#define FLASH_YARN_BETA_FAST 32.0
#define FLASH_YARN_BETA_SLOW 1.0
#define FLASH_EPS 1e-6
#define DEFAULT_INDEX_LOSS_COEFF 1e-3
#define DSV4_FP8_BLOCK_DEFAULT 128   /* V4's scale block (DeepSeek's model.py: block_size = 128) */
#define DSV4_FP8_BLOCK_MAX (1 << 20) /* larger blocks are nonsense, and products stay in int64 */
#define DSV4_MAX_DIM (1 << 20)       /* any size or count: keeps every product of a few in int64 */
#define FLASH_HIDDEN_LAYERS 43       /* num_hidden_layers: layer 43 is V4-Flash's MTP layer */
#define PRO_HIDDEN_LAYERS 61
/* V4.1-Flash (docs/spec.md section 10) */
#define FLASH41_EPS 1e-20
#define FLASH41_HIDDEN_LAYERS 40     /* 40 model layers, then 3 DSpark draft stages */
#define FLASH41_LAYERS 43
#define FLASH41_FP8_BLOCK 32

/* Fills the keys shared by every preset and the defaults of optional keys. */
static void set_defaults(dsv4_config *c) {
  memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->struct_version = DSV4_STRUCT_VERSION;
  c->rope_theta = FLASH_ROPE_THETA;
  c->compress_rope_theta = FLASH_COMPRESS_ROPE_THETA;
  c->rope_factor = FLASH_YARN_FACTOR;
  c->rope_orig_max_pos = FLASH_YARN_ORIG;
  c->beta_fast = FLASH_YARN_BETA_FAST;
  c->beta_slow = FLASH_YARN_BETA_SLOW;
  c->eps = FLASH_EPS;
  c->index_loss_coeff = DEFAULT_INDEX_LOSS_COEFF;
  c->index_loss_mode = DSV4_KL_SPARSE;
  c->fp8_block[0] = c->fp8_block[1] = DSV4_FP8_BLOCK_DEFAULT;
  c->candidate_source = -1;
}

/* V4.1 sources from a list (kept sorted). */
static void set_sources(int *n, int *dst, const int *ids, int k) {
  *n = k;
  for (int i = 0; i < k; i++) dst[i] = ids[i];
}

/* V4 layer pattern: `head` leading layers of ratio `first`, then alternating CSA (even index) and
 * HCA (odd index) up to the last model layer, then one SWA-only MTP layer. */
static void set_pattern(dsv4_config *c, int n_layers, int first) {
  c->n_layers = n_layers;
  for (int i = 0; i < n_layers; i++) c->compress_ratios[i] = (i % 2 == 0) ? 4 : 128;
  c->compress_ratios[0] = c->compress_ratios[1] = first;
  c->compress_ratios[n_layers - 1] = 0;
}

/* The library-side functions work on full-size structs; the public ones wrap them (util/abi.h). */
static dsv4_status validate(const dsv4_config *c);

static dsv4_status preset(dsv4_config *cfg, const char *name) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(name, DSV4_ERR_ARG, "config preset: NULL name");
  set_defaults(cfg);
  if (!strcmp(name, "flash")) {
    cfg->dim = 4096; cfg->n_heads = 64; cfg->head_dim = 512; cfg->rope_dim = 64;
    cfg->q_lora_rank = 1024; cfg->o_groups = 8; cfg->o_lora_rank = 1024; cfg->window = 128;
    cfg->index_n_heads = 64; cfg->index_head_dim = 128; cfg->index_topk = 512;
    set_pattern(cfg, FLASH_HIDDEN_LAYERS + 1, 0);
    cfg->n_hidden_layers = FLASH_HIDDEN_LAYERS;
  } else if (!strcmp(name, "pro")) {
    cfg->dim = 7168; cfg->n_heads = 128; cfg->head_dim = 512; cfg->rope_dim = 64;
    cfg->q_lora_rank = 1536; cfg->o_groups = 16; cfg->o_lora_rank = 1024; cfg->window = 128;
    cfg->index_n_heads = 64; cfg->index_head_dim = 128; cfg->index_topk = 1024;
    set_pattern(cfg, PRO_HIDDEN_LAYERS + 1, 128);
    cfg->n_hidden_layers = PRO_HIDDEN_LAYERS;
  } else if (!strcmp(name, "tiny")) {
    /* Small enough for naive checks, large enough that every path has real work:
     * layers 0, 1, 2 are SWA, CSA and HCA. YaRN's original length is shortened so the frequency
     * ramp matters at the positions a tiny run reaches. */
    cfg->dim = 64; cfg->n_heads = 4; cfg->head_dim = 32; cfg->rope_dim = 16;
    cfg->q_lora_rank = 48; cfg->o_groups = 2; cfg->o_lora_rank = 24; cfg->window = 16;
    cfg->index_n_heads = 2; cfg->index_head_dim = 32; cfg->index_topk = 8;
    cfg->n_layers = 3;
    cfg->compress_ratios[0] = 0; cfg->compress_ratios[1] = 4; cfg->compress_ratios[2] = 128;
    cfg->rope_orig_max_pos = 256;
    cfg->n_hidden_layers = 3; /* no MTP layer: every layer is named layers.L. */
  } else if (!strcmp(name, "flash41")) {
    static const int kv[] = {2, 8, 14, 20}, ix[] = {2, 8, 14, 20, 24, 28, 32, 36};
    cfg->dim = 5120; cfg->n_heads = 64; cfg->head_dim = 512; cfg->rope_dim = 64;
    cfg->q_lora_rank = 1280; cfg->o_groups = 8; cfg->o_lora_rank = 1024; cfg->window = 128;
    cfg->index_n_heads = 32; cfg->index_head_dim = 128; cfg->index_topk = 512;
    cfg->n_layers = FLASH41_LAYERS;
    for (int i = 0; i < FLASH41_LAYERS; i++) cfg->compress_ratios[i] = i < 2 || i >= 40 ? 0 : i < 20 ? 2 : 1;
    cfg->n_hidden_layers = FLASH41_HIDDEN_LAYERS;
    cfg->eps = FLASH41_EPS;
    cfg->fp8_block[0] = cfg->fp8_block[1] = FLASH41_FP8_BLOCK;
    cfg->v41 = 1;
    set_sources(&cfg->n_kv_sources, cfg->kv_sources, kv, 4);
    set_sources(&cfg->n_index_sources, cfg->index_sources, ix, 8);
    cfg->candidate_source = 20;
    cfg->candidate_topk_blocks = 2048;
    cfg->candidate_block_size = 8;
  } else if (!strcmp(name, "tiny41")) {
    /* every V4.1 role at test sizes (the dims tests/ref/gen_case41.py writes by default) */
    static const int ratios[] = {0, 2, 2, 2, 2, 1, 1, 1, 1, 0}, kv[] = {1, 5}, ix[] = {1, 3, 5, 7};
    cfg->dim = 32; cfg->n_heads = 4; cfg->head_dim = 16; cfg->rope_dim = 8;
    cfg->q_lora_rank = 24; cfg->o_groups = 2; cfg->o_lora_rank = 12; cfg->window = 8;
    cfg->index_n_heads = 2; cfg->index_head_dim = 16; cfg->index_topk = 4;
    cfg->n_layers = 10;
    for (int i = 0; i < 10; i++) cfg->compress_ratios[i] = ratios[i];
    cfg->n_hidden_layers = 10;
    cfg->fp8_block[0] = cfg->fp8_block[1] = FLASH41_FP8_BLOCK; /* V4.1's released block */
    cfg->v41 = 1;
    set_sources(&cfg->n_kv_sources, cfg->kv_sources, kv, 2);
    set_sources(&cfg->n_index_sources, cfg->index_sources, ix, 4);
    cfg->candidate_source = 5;
    cfg->candidate_topk_blocks = 2;
    cfg->candidate_block_size = 2;
  } else {
    DSV4_FAIL(DSV4_ERR_ARG, "unknown config preset '%s' (expected flash, pro, tiny, flash41 or tiny41)", name);
  }
  return validate(cfg);
fail:
  return rc;
}

dsv4_status dsv4_config_preset(dsv4_config *cfg, const char *name) {
  dsv4_status rc = DSV4_OK;
  dsv4_config full;
  DSV4_TRY(DSV4_STRUCT_CHECK(cfg, dsv4_config));
  DSV4_TRY(preset(&full, name));
  DSV4_TRY(DSV4_STRUCT_OUT(cfg, &full, dsv4_config));
fail:
  return rc;
}

dsv4_status dsv4_config_in(dsv4_config *full, const dsv4_config *cfg) {
  return DSV4_STRUCT_IN(full, cfg, dsv4_config, NULL);
}

int dsv4_config_ratio(const dsv4_config *cfg, int layer) {
  if (!cfg || cfg->struct_size < offsetof(dsv4_config, compress_ratios) + sizeof cfg->compress_ratios) return -1;
  if (layer < 0 || layer >= cfg->n_layers) return -1;
  return cfg->compress_ratios[layer];
}

/* The largest entry of the sorted ids[0..n) that is <= layer, or -1. */
static int largest_at_most(const int *ids, int n, int layer) {
  int best = -1;
  for (int i = 0; i < n && ids[i] <= layer; i++) best = ids[i];
  return best;
}

static int contains(const int *ids, int n, int layer) {
  for (int i = 0; i < n; i++)
    if (ids[i] == layer) return 1;
  return 0;
}

dsv4_status dsv4_config_layer(const dsv4_config *cfg, int layer, dsv4_layer_info *out) {
  dsv4_status rc = DSV4_OK;
  dsv4_config c;
  DSV4_TRY(dsv4_config_in(&c, cfg));
  DSV4_CHECK(layer >= 0 && layer < c.n_layers, DSV4_ERR_ARG, "layer %d out of range (config has %d)", layer,
             c.n_layers);
  const int r = c.compress_ratios[layer];
  dsv4_layer_info in = {DSV4_HEAD(dsv4_layer_info), .layer = layer, .ratio = r, .kv_source = -1, .index_source = -1};
  if (!c.v41) {
    in.role = r == 0 ? DSV4_ROLE_WINDOW : DSV4_ROLE_OWN;
    in.kv_source = r > 0 ? layer : -1;
    in.index_source = r == 4 ? layer : -1;
    in.selects = r == 4;
  } else {
    DSV4_CHECK(layer < c.n_hidden_layers, DSV4_ERR_UNSUPPORTED,
               "layer %d is a DSpark draft stage (num_hidden_layers is %d): not this attention layer, refused", layer,
               c.n_hidden_layers);
    if (r == 0) {
      in.role = DSV4_ROLE_WINDOW;
    } else {
      in.kv_source = largest_at_most(c.kv_sources, c.n_kv_sources, layer);
      in.index_source = largest_at_most(c.index_sources, c.n_index_sources, layer);
      in.role = in.kv_source == layer ? DSV4_ROLE_FULL : in.index_source == layer ? DSV4_ROLE_REINDEX : DSV4_ROLE_REUSE;
      in.selects = in.index_source == layer;
      in.candidate_source = c.candidate_source == layer;
      in.uses_candidates = c.candidate_source >= 0 && in.selects && layer > c.candidate_source;
    }
  }
  DSV4_TRY(DSV4_STRUCT_OUT(out, &in, dsv4_layer_info));
fail:
  return rc;
}

static int any_ratio(const dsv4_config *c, int r) {
  for (int i = 0; i < c->n_layers; i++)
    if (c->compress_ratios[i] == r) return 1;
  return 0;
}

dsv4_status dsv4_config_validate(const dsv4_config *cfg) {
  dsv4_status rc = DSV4_OK;
  dsv4_config full;
  DSV4_TRY(dsv4_config_in(&full, cfg));
  DSV4_TRY(validate(&full));
fail:
  return rc;
}

/* docs/spec.md section 10, Roles: every rule, with an error naming the key and the layer. */
static dsv4_status validate_v41(const dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  const char *keys[2] = {"kv_source_layer_ids", "index_source_layer_ids"};
  const int *lists[2] = {c->kv_sources, c->index_sources}, counts[2] = {c->n_kv_sources, c->n_index_sources};
  DSV4_CHECK(c->n_hidden_layers > 0, DSV4_ERR_CONFIG, "config: a V4.1 config needs num_hidden_layers");
  for (int l = 0; l < 2; l++) {
    DSV4_CHECK(counts[l] >= 0 && counts[l] <= c->n_hidden_layers, DSV4_ERR_CONFIG, "config: %s has %d entries",
               keys[l], counts[l]);
    for (int i = 0; i < counts[l]; i++) {
      const int s = lists[l][i];
      DSV4_CHECK(s >= 0 && s < c->n_hidden_layers, DSV4_ERR_CONFIG,
                 "config: %s names layer %d, outside 0..%d (num_hidden_layers - 1; the DSpark draft stages are "
                 "not this layer)", keys[l], s, c->n_hidden_layers - 1);
      DSV4_CHECK(i == 0 || s > lists[l][i - 1], DSV4_ERR_CONFIG, "config: %s must be increasing without repeats "
                 "(layer %d after %d)", keys[l], s, lists[l][i - 1]);
      DSV4_CHECK(c->compress_ratios[s] != 0, DSV4_ERR_CONFIG, "config: %s names layer %d, whose compress ratio is 0",
                 keys[l], s);
    }
  }
  for (int i = 0; i < c->n_kv_sources; i++)
    DSV4_CHECK(contains(c->index_sources, c->n_index_sources, c->kv_sources[i]), DSV4_ERR_CONFIG,
               "config: kv_source_layer_ids layer %d is not in index_source_layer_ids (a kv source owns the indexer "
               "keys and selects with them)", c->kv_sources[i]);
  for (int L = 0; L < c->n_hidden_layers; L++) {
    const int r = c->compress_ratios[L];
    if (r == 0) continue;
    const int kv = largest_at_most(c->kv_sources, c->n_kv_sources, L);
    const int ix = largest_at_most(c->index_sources, c->n_index_sources, L);
    DSV4_CHECK(kv >= 0, DSV4_ERR_CONFIG, "config: kv_source_layer_ids: layer %d (compress ratio %d) has no kv "
               "source at or below it", L, r);
    DSV4_CHECK(c->compress_ratios[kv] == r, DSV4_ERR_CONFIG, "config: compress_ratios: layer %d has ratio %d but "
               "its kv source, layer %d, has ratio %d", L, r, kv, c->compress_ratios[kv]);
    DSV4_CHECK(c->compress_ratios[ix] == r, DSV4_ERR_CONFIG, "config: compress_ratios: layer %d has ratio %d but "
               "its index source, layer %d, has ratio %d", L, r, ix, c->compress_ratios[ix]);
  }
  if (c->candidate_source >= 0) {
    const int cs = c->candidate_source;
    DSV4_CHECK(c->n_kv_sources > 0 && cs == c->kv_sources[c->n_kv_sources - 1], DSV4_ERR_CONFIG,
               "config: candidate_source_layer_id layer %d is not the last kv source (layer %d)", cs,
               c->n_kv_sources > 0 ? c->kv_sources[c->n_kv_sources - 1] : -1);
    DSV4_CHECK(c->candidate_topk_blocks > 0 && c->candidate_topk_blocks <= DSV4_MAX_DIM &&
                   c->candidate_block_size > 0 && c->candidate_block_size <= DSV4_MAX_DIM, DSV4_ERR_CONFIG,
               "config: candidate_topk_blocks and candidate_block_size must be in [1, %d] (got %d, %d)", DSV4_MAX_DIM,
               c->candidate_topk_blocks, c->candidate_block_size);
    DSV4_CHECK((int64_t)c->candidate_topk_blocks * c->candidate_block_size >= c->index_topk, DSV4_ERR_CONFIG,
               "config: candidate_topk_blocks * candidate_block_size (%d * %d) < index_topk (%d) at candidate "
               "source layer %d", c->candidate_topk_blocks, c->candidate_block_size, c->index_topk, cs);
  }
fail:
  return rc;
}

static dsv4_status validate(const dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
#define POSITIVE(field, key)                                                                            \
  DSV4_CHECK(c->field > 0 && c->field <= DSV4_MAX_DIM, DSV4_ERR_CONFIG, "config: %s must be in [1, %d] (got %d)", \
             key, DSV4_MAX_DIM, c->field)
  POSITIVE(dim, "hidden_size");
  POSITIVE(n_heads, "num_attention_heads");
  POSITIVE(head_dim, "head_dim");
  POSITIVE(rope_dim, "qk_rope_head_dim");
  POSITIVE(q_lora_rank, "q_lora_rank");
  POSITIVE(o_groups, "o_groups");
  POSITIVE(o_lora_rank, "o_lora_rank");
  POSITIVE(window, "sliding_window");
  DSV4_CHECK(c->n_layers > 0 && c->n_layers <= DSV4_MAX_LAYERS, DSV4_ERR_CONFIG,
             "config: compress_ratios must have 1..%d entries (got %d)", DSV4_MAX_LAYERS, c->n_layers);
  for (int i = 0; i < c->n_layers; i++) {
    int r = c->compress_ratios[i];
    if (c->v41)
      DSV4_CHECK(r == 0 || r == 1 || r == 2, DSV4_ERR_CONFIG,
                 "config: compress_ratios[%d] = %d, expected 0, 1 or 2 (a V4.1 config)", i, r);
    else
      DSV4_CHECK(r == 0 || r == 4 || r == 128, DSV4_ERR_CONFIG,
                 "config: compress_ratios[%d] = %d, expected 0, 4 or 128%s", i, r,
                 r == 1 || r == 2 ? " (ratios 1 and 2 are V4.1's: give kv_source_layer_ids)" : "");
  }
  DSV4_CHECK(c->n_heads % c->o_groups == 0, DSV4_ERR_CONFIG,
             "config: num_attention_heads (%d) must be a multiple of o_groups (%d)", c->n_heads,
             c->o_groups);
  DSV4_CHECK(c->rope_dim % 2 == 0, DSV4_ERR_CONFIG, "config: qk_rope_head_dim (%d) must be even",
             c->rope_dim);
  DSV4_CHECK(c->rope_dim <= c->head_dim, DSV4_ERR_CONFIG,
             "config: qk_rope_head_dim (%d) is larger than head_dim (%d)", c->rope_dim, c->head_dim);
  if (any_ratio(c, 4) || (c->v41 && c->n_index_sources > 0)) {
    POSITIVE(index_n_heads, "index_n_heads");
    POSITIVE(index_head_dim, "index_head_dim");
    POSITIVE(index_topk, "index_topk");
    DSV4_CHECK(c->rope_dim <= c->index_head_dim, DSV4_ERR_CONFIG,
               "config: qk_rope_head_dim (%d) is larger than index_head_dim (%d)", c->rope_dim,
               c->index_head_dim);
  }
#undef POSITIVE
  DSV4_CHECK(c->rope_theta > 1.0 && isfinite(c->rope_theta), DSV4_ERR_CONFIG,
             "config: rope_theta must be > 1 (got %g)", c->rope_theta);
  DSV4_CHECK(c->compress_rope_theta > 1.0 && isfinite(c->compress_rope_theta), DSV4_ERR_CONFIG,
             "config: compress_rope_theta must be > 1 (got %g)", c->compress_rope_theta);
  DSV4_CHECK(c->rope_orig_max_pos >= 0 && isfinite(c->rope_orig_max_pos), DSV4_ERR_CONFIG,
             "config: rope_scaling.original_max_position_embeddings must be >= 0 (got %g)",
             c->rope_orig_max_pos);
  if (c->rope_orig_max_pos > 0) {
    DSV4_CHECK(c->rope_factor >= 1.0 && isfinite(c->rope_factor), DSV4_ERR_CONFIG,
               "config: rope_scaling.factor must be >= 1 (got %g)", c->rope_factor);
    DSV4_CHECK(c->beta_fast > 0 && c->beta_slow > 0 && isfinite(c->beta_fast) &&
                   isfinite(c->beta_slow), DSV4_ERR_CONFIG,
               "config: rope_scaling.beta_fast and beta_slow must be positive (got %g, %g)",
               c->beta_fast, c->beta_slow);
  }
  DSV4_CHECK(c->eps > 0 && c->eps < 1, DSV4_ERR_CONFIG, "config: rms_norm_eps must be in (0, 1) (got %g)",
             c->eps);
  DSV4_CHECK(c->index_loss_coeff >= 0 && isfinite(c->index_loss_coeff), DSV4_ERR_CONFIG,
             "config: index_loss_coeff must be >= 0 (got %g)", c->index_loss_coeff);
  DSV4_CHECK(c->n_hidden_layers >= 0 && c->n_hidden_layers <= c->n_layers, DSV4_ERR_CONFIG,
             "config: num_hidden_layers (%d) must be in [0, %d] (the length of compress_ratios)", c->n_hidden_layers,
             c->n_layers);
  for (int i = 0; i < 2; i++)
    DSV4_CHECK(c->fp8_block[i] >= 0 && c->fp8_block[i] <= DSV4_FP8_BLOCK_MAX, DSV4_ERR_CONFIG,
               "config: quantization_config.weight_block_size[%d] = %d is not in [1, %d]", i, c->fp8_block[i],
               DSV4_FP8_BLOCK_MAX);
  if (c->v41) DSV4_TRY(validate_v41(c));
fail:
  return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Parsing. A quantity may be named as in the released config.json (Hugging Face: hidden_size,
 * rope_scaling.factor, ...) or as in DeepSeek's inference/model.py ModelArgs (dim, rope_factor, ...).
 * Key presence decides; both present with different values is an error naming both.
 * ------------------------------------------------------------------------------------------- */

/* Where a quantity is read from: its HF key (in hf_obj: the top level, or rope_scaling for the YaRN
 * keys; hf_shown is how messages name it) and its ModelArgs key at the top level (NULL when the
 * names agree). */
typedef struct {
  const cJSON *hf_obj;
  const char *hf, *hf_shown, *ma;
} key_names;

/* Finds the item of a quantity (NULL when absent under both names); *shown = the key found. */
static dsv4_status find_item(const cJSON *root, key_names k, const cJSON **it, const char **shown) {
  dsv4_status rc = DSV4_OK;
  const cJSON *a = k.hf_obj ? cJSON_GetObjectItemCaseSensitive(k.hf_obj, k.hf) : NULL;
  const cJSON *b = k.ma ? cJSON_GetObjectItemCaseSensitive(root, k.ma) : NULL;
  if (a && cJSON_IsNull(a)) a = NULL;
  if (b && cJSON_IsNull(b)) b = NULL;
  DSV4_CHECK(!a || !b || cJSON_Compare(a, b, 1), DSV4_ERR_CONFIG,
             "config: keys '%s' and '%s' name the same quantity with different values", k.hf_shown, k.ma);
  *it = a ? a : b;
  *shown = a ? k.hf_shown : k.ma;
fail:
  return rc;
}

/* Message subject "config: key 'name'". */
static const char *subject(char *buf, size_t cap, const char *name) {
  snprintf(buf, cap, "config: key '%s'", name);
  return buf;
}

/* An int32 quantity; missing is an error when required (naming both spellings), else *dst stays. */
static dsv4_status get_int(const cJSON *root, const char *hf, const char *ma, int required, int *dst) {
  dsv4_status rc = DSV4_OK;
  const cJSON *it = NULL;
  const char *shown = hf;
  char what[96];
  int64_t v = 0;
  DSV4_TRY(find_item(root, (key_names){root, hf, hf, ma}, &it, &shown));
  if (!it) {
    DSV4_CHECK(!required, DSV4_ERR_CONFIG, "config: missing required key '%s'%s%s%s", hf, ma ? " (or '" : "",
               ma ? ma : "", ma ? "')" : "");
    return DSV4_OK;
  }
  DSV4_TRY(dsv4_json_int(it, subject(what, sizeof what, shown), INT32_MIN, INT32_MAX, &v));
  *dst = (int)v;
fail:
  return rc;
}

/* A finite real quantity; absent (or null) leaves *dst; *found tells whether it was given. */
static dsv4_status get_num(const cJSON *root, key_names k, double *dst, int *found) {
  dsv4_status rc = DSV4_OK;
  const cJSON *it = NULL;
  const char *shown = k.hf_shown;
  char what[96];
  DSV4_TRY(find_item(root, k, &it, &shown));
  if (found) *found = it != NULL;
  if (it) DSV4_TRY(dsv4_json_num(it, subject(what, sizeof what, shown), dst));
fail:
  return rc;
}

/* A top-level real key with one name. */
static dsv4_status get_top_num(const cJSON *root, const char *key, const char *ma, double *dst, int *found) {
  return get_num(root, (key_names){root, key, key, ma}, dst, found);
}

/* A string member of obj, or NULL when absent/null; anything else is an error. */
static dsv4_status get_str(const cJSON *obj, const char *key, const char *shown, const char **out) {
  dsv4_status rc = DSV4_OK;
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = NULL;
  if (!it || cJSON_IsNull(it)) return DSV4_OK;
  DSV4_CHECK(cJSON_IsString(it), DSV4_ERR_CONFIG, "config: key '%s' must be a string", shown);
  *out = it->valuestring;
fail:
  return rc;
}

/* YaRN. HF: rope_scaling absent -> V4-Flash YaRN; null -> no YaRN; an object -> its four keys
 * (required). ModelArgs: rope_factor, original_seq_len (0 = no YaRN), beta_fast, beta_slow at the
 * top level. A ModelArgs-style file (ma_style) must give original_seq_len (its ModelArgs default 0
 * differs from V4-Flash's 65536), and rope_factor when YaRN is on (default 40 vs 16). */
static dsv4_status get_rope_scaling(const cJSON *root, dsv4_config *c, int ma_style) {
  dsv4_status rc = DSV4_OK;
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  static const char *hf[] = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow"};
  static const char *shown[] = {"rope_scaling.factor", "rope_scaling.original_max_position_embeddings",
                                "rope_scaling.beta_fast", "rope_scaling.beta_slow"};
  static const char *ma[] = {"rope_factor", "original_seq_len", "beta_fast", "beta_slow"};
  double *dst[] = {&c->rope_factor, &c->rope_orig_max_pos, &c->beta_fast, &c->beta_slow};
  int found[4] = {0};
  DSV4_CHECK(!rs || cJSON_IsNull(rs) || cJSON_IsObject(rs), DSV4_ERR_CONFIG,
             "config: key 'rope_scaling' must be an object or null");
  if (rs && cJSON_IsNull(rs)) {
    double orig = 0;
    DSV4_TRY(get_top_num(root, "original_seq_len", NULL, &orig, NULL));
    DSV4_CHECK(orig == 0, DSV4_ERR_CONFIG, "config: keys 'rope_scaling' (null: no YaRN) and 'original_seq_len' (%g) "
               "disagree", orig);
    c->rope_orig_max_pos = 0;
    return DSV4_OK;
  }
  const char *type = NULL;
  if (rs) DSV4_TRY(get_str(rs, cJSON_GetObjectItemCaseSensitive(rs, "type") ? "type" : "rope_type",
                           "rope_scaling.type", &type));
  DSV4_CHECK(!type || !strcmp(type, "yarn"), DSV4_ERR_UNSUPPORTED, "config: rope_scaling.type \"%.40s\" is not "
             "supported (V4 uses \"yarn\")", type);
  for (int i = 0; i < 4; i++) {
    DSV4_CHECK(!rs || cJSON_GetObjectItemCaseSensitive(rs, hf[i]), DSV4_ERR_CONFIG,
               "config: missing required key 'rope_scaling.%s'", hf[i]);
    DSV4_TRY(get_num(root, (key_names){rs, hf[i], shown[i], ma[i]}, dst[i], &found[i]));
  }
  DSV4_CHECK(!ma_style || found[1], DSV4_ERR_CONFIG, "config: missing required key 'original_seq_len' (or "
             "'rope_scaling.original_max_position_embeddings'): DeepSeek's ModelArgs default (0, no YaRN) and "
             "V4-Flash's (65536) differ");
  DSV4_CHECK(!ma_style || found[0] || c->rope_orig_max_pos == 0, DSV4_ERR_CONFIG,
             "config: missing required key 'rope_factor' (or 'rope_scaling.factor'): DeepSeek's ModelArgs default "
             "(40) and V4-Flash's (16) differ");
fail:
  return rc;
}

static dsv4_status get_ratios(const cJSON *root, dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "compress_ratios");
  char what[64];
  DSV4_CHECK(arr, DSV4_ERR_CONFIG, "config: missing required key 'compress_ratios'");
  DSV4_CHECK(cJSON_IsArray(arr), DSV4_ERR_CONFIG, "config: key 'compress_ratios' must be an array");
  int n = cJSON_GetArraySize(arr);
  DSV4_CHECK(n > 0 && n <= DSV4_MAX_LAYERS, DSV4_ERR_CONFIG,
             "config: compress_ratios must have 1..%d entries (got %d)", DSV4_MAX_LAYERS, n);
  c->n_layers = n;
  int i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) {
    int64_t v;
    snprintf(what, sizeof what, "config: key 'compress_ratios[%d]'", i);
    DSV4_TRY(dsv4_json_int(it, what, INT32_MIN, INT32_MAX, &v));
    c->compress_ratios[i++] = (int)v;
  }
fail:
  return rc;
}

/* A list of layer ids under its HF or ModelArgs name (sorted, duplicates refused by validation);
 * *found tells whether it was given. */
static dsv4_status get_layer_list(const cJSON *root, const char *hf, const char *ma, int *n, int *dst, int *found) {
  dsv4_status rc = DSV4_OK;
  const cJSON *arr = NULL, *it;
  const char *shown = hf;
  char what[96];
  DSV4_TRY(find_item(root, (key_names){root, hf, hf, ma}, &arr, &shown));
  *found = arr != NULL;
  if (!arr) return DSV4_OK;
  DSV4_CHECK(cJSON_IsArray(arr), DSV4_ERR_CONFIG, "config: key '%s' must be an array of layer ids", shown);
  const int m = cJSON_GetArraySize(arr);
  DSV4_CHECK(m <= DSV4_MAX_LAYERS, DSV4_ERR_CONFIG, "config: key '%s' has %d entries (at most %d)", shown, m,
             DSV4_MAX_LAYERS);
  int i = 0;
  cJSON_ArrayForEach(it, arr) {
    int64_t v;
    snprintf(what, sizeof what, "config: key '%s[%d]'", shown, i);
    DSV4_TRY(dsv4_json_int(it, what, 0, DSV4_MAX_LAYERS - 1, &v));
    dst[i++] = (int)v;
  }
  *n = m;
  for (int a = 1; a < m; a++) /* insertion sort: the lists are short */
    for (int b = a; b > 0 && dst[b] < dst[b - 1]; b--) {
      const int t = dst[b];
      dst[b] = dst[b - 1];
      dst[b - 1] = t;
    }
fail:
  return rc;
}

/* V4.1's sharing keys (docs/spec.md section 10): kv and index sources, the candidate source and
 * its sizes. Sets v41 when kv_source_layer_ids (or kv_source_layers) is given. */
static dsv4_status get_sharing(const cJSON *root, dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  int found = 0, found_ix = 0;
  DSV4_TRY(get_layer_list(root, "kv_source_layer_ids", "kv_source_layers", &c->n_kv_sources, c->kv_sources, &found));
  if (!found) return DSV4_OK;
  c->v41 = 1;
  DSV4_TRY(get_layer_list(root, "index_source_layer_ids", "index_source_layers", &c->n_index_sources,
                          c->index_sources, &found_ix));
  DSV4_CHECK(found_ix, DSV4_ERR_CONFIG, "config: missing required key 'index_source_layer_ids' (or "
             "'index_source_layers') beside kv_source_layer_ids");
  int cand = -1;
  DSV4_TRY(get_int(root, "candidate_source_layer_id", "candidate_source_layer", 0, &cand));
  c->candidate_source = cand < 0 ? -1 : cand; /* ModelArgs' default -1: no candidates */
  if (c->candidate_source >= 0) {
    DSV4_TRY(get_int(root, "candidate_topk_blocks", NULL, 1, &c->candidate_topk_blocks));
    DSV4_TRY(get_int(root, "candidate_block_size", NULL, 1, &c->candidate_block_size));
  }
fail:
  return rc;
}

/* The released V4.1 config.json nests the text model's keys under text_config with
 * quantization_config at the top: one flat object of text_config's keys, then every top-level key
 * text_config lacks. NULL when there is no text_config (the root is flat already). */
static dsv4_status flatten_text_config(const cJSON *root, cJSON **flat) {
  dsv4_status rc = DSV4_OK;
  const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config"), *it;
  *flat = NULL;
  if (!text || cJSON_IsNull(text)) return DSV4_OK;
  DSV4_CHECK(cJSON_IsObject(text), DSV4_ERR_CONFIG, "config: key 'text_config' must be an object");
  *flat = cJSON_Duplicate(text, 1);
  DSV4_CHECK(*flat, DSV4_ERR_NOMEM, "config: out of memory");
  cJSON_ArrayForEach(it, root) {
    if (!it->string || !strcmp(it->string, "text_config") || cJSON_GetObjectItemCaseSensitive(*flat, it->string))
      continue;
    cJSON *copy = cJSON_Duplicate(it, 1);
    DSV4_CHECK(copy && cJSON_AddItemToObject(*flat, it->string, copy), DSV4_ERR_NOMEM, "config: out of memory");
  }
fail:
  return rc;
}

/* quantization_config (released checkpoints): {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt":
 * "ue8m0", "weight_block_size": [128, 128]}. Any block size is read; anything else that would
 * change how the bytes decode is refused. Absent (DeepSeek's inference config.json has none; its
 * model.py hard-codes block_size = 128): 128 x 128. */
static dsv4_status get_quantization(const cJSON *root, dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
  const char *method = NULL, *fmt = NULL, *scale_fmt = NULL;
  c->fp8_block[0] = c->fp8_block[1] = DSV4_FP8_BLOCK_DEFAULT;
  if (!q || cJSON_IsNull(q)) return DSV4_OK;
  DSV4_CHECK(cJSON_IsObject(q), DSV4_ERR_CONFIG, "config: key 'quantization_config' must be an object");
  DSV4_TRY(get_str(q, "quant_method", "quantization_config.quant_method", &method));
  DSV4_CHECK(method, DSV4_ERR_CONFIG, "config: missing required key 'quantization_config.quant_method'");
  DSV4_CHECK(!strcmp(method, "fp8"), DSV4_ERR_UNSUPPORTED, "config: quantization_config.quant_method \"%.40s\" is "
             "not supported (only \"fp8\": E4M3 weights with block scales)", method);
  DSV4_TRY(get_str(q, "fmt", "quantization_config.fmt", &fmt));
  DSV4_CHECK(!fmt || !strcmp(fmt, "e4m3"), DSV4_ERR_UNSUPPORTED, "config: quantization_config.fmt \"%.40s\" is not "
             "supported (only \"e4m3\")", fmt);
  DSV4_TRY(get_str(q, "scale_fmt", "quantization_config.scale_fmt", &scale_fmt));
  DSV4_CHECK(!scale_fmt || !strcmp(scale_fmt, "ue8m0"), DSV4_ERR_UNSUPPORTED, "config: quantization_config.scale_fmt "
             "\"%.40s\" is not supported (\"ue8m0\", or absent for F32 scales)", scale_fmt);
  const cJSON *bs = cJSON_GetObjectItemCaseSensitive(q, "weight_block_size");
  if (bs && !cJSON_IsNull(bs)) {
    DSV4_CHECK(cJSON_IsArray(bs) && cJSON_GetArraySize(bs) == 2, DSV4_ERR_CONFIG,
               "config: key 'quantization_config.weight_block_size' must be an array of two integers");
    for (int i = 0; i < 2; i++) {
      char what[80];
      int64_t v;
      snprintf(what, sizeof what, "config: key 'quantization_config.weight_block_size[%d]'", i);
      DSV4_TRY(dsv4_json_int(cJSON_GetArrayItem(bs, i), what, 1, DSV4_FP8_BLOCK_MAX, &v));
      c->fp8_block[i] = (int)v;
    }
  }
fail:
  return rc;
}

static dsv4_status parse(dsv4_config *cfg, const char *json_text) {
  dsv4_status rc = DSV4_OK;
  cJSON *parsed = NULL, *flat = NULL;
  DSV4_CHECK(json_text, DSV4_ERR_ARG, "config: NULL text");
  set_defaults(cfg);
  parsed = cJSON_Parse(json_text);
  DSV4_CHECK(parsed, DSV4_ERR_FORMAT, "config: not valid JSON (near byte %ld)",
             cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - json_text) : -1L);
  DSV4_CHECK(cJSON_IsObject(parsed), DSV4_ERR_FORMAT, "config: top level must be a JSON object");
  DSV4_TRY(flatten_text_config(parsed, &flat));
  const cJSON *root = flat ? flat : parsed;
  DSV4_TRY(get_sharing(root, cfg));
  if (cfg->v41) cfg->eps = FLASH41_EPS; /* V4.1-Flash's rms_norm_eps when the file omits it */
  /* a file written for DeepSeek's inference code names the model dimension "dim" */
  const int ma_style = cJSON_GetObjectItemCaseSensitive(root, "dim") != NULL ||
                       cJSON_GetObjectItemCaseSensitive(root, "n_heads") != NULL;
  DSV4_TRY(get_int(root, "hidden_size", "dim", 1, &cfg->dim));
  DSV4_TRY(get_int(root, "num_attention_heads", "n_heads", 1, &cfg->n_heads));
  DSV4_TRY(get_int(root, "head_dim", NULL, 1, &cfg->head_dim));
  DSV4_TRY(get_int(root, "qk_rope_head_dim", "rope_head_dim", 1, &cfg->rope_dim));
  DSV4_TRY(get_int(root, "q_lora_rank", NULL, 1, &cfg->q_lora_rank));
  DSV4_TRY(get_int(root, "o_groups", NULL, 1, &cfg->o_groups));
  DSV4_TRY(get_int(root, "o_lora_rank", NULL, 1, &cfg->o_lora_rank));
  DSV4_TRY(get_int(root, "sliding_window", "window_size", 1, &cfg->window));
  DSV4_TRY(get_ratios(root, cfg));
  int need_index = any_ratio(cfg, 4) || (cfg->v41 && cfg->n_index_sources > 0);
  DSV4_TRY(get_int(root, "index_n_heads", NULL, need_index, &cfg->index_n_heads));
  DSV4_TRY(get_int(root, "index_head_dim", NULL, need_index, &cfg->index_head_dim));
  DSV4_TRY(get_int(root, "index_topk", NULL, need_index, &cfg->index_topk));
  DSV4_TRY(get_top_num(root, "rope_theta", NULL, &cfg->rope_theta, NULL));
  int have_crt = 0;
  DSV4_TRY(get_top_num(root, "compress_rope_theta", NULL, &cfg->compress_rope_theta, &have_crt));
  DSV4_CHECK(!ma_style || have_crt, DSV4_ERR_CONFIG, "config: missing required key 'compress_rope_theta': DeepSeek's "
             "ModelArgs default (40000) and V4-Flash's (160000) differ");
  DSV4_TRY(get_rope_scaling(root, cfg, ma_style));
  DSV4_TRY(get_top_num(root, "rms_norm_eps", "norm_eps", &cfg->eps, NULL));
  DSV4_TRY(get_top_num(root, "index_loss_coeff", NULL, &cfg->index_loss_coeff, NULL));
  const cJSON *mode = cJSON_GetObjectItemCaseSensitive(root, "index_loss_mode");
  if (mode) {
    DSV4_CHECK(cJSON_IsString(mode) && (!strcmp(mode->valuestring, "sparse") ||
                                        !strcmp(mode->valuestring, "dense")),
               DSV4_ERR_CONFIG, "config: index_loss_mode must be \"sparse\" or \"dense\"");
    cfg->index_loss_mode = strcmp(mode->valuestring, "dense") ? DSV4_KL_SPARSE : DSV4_KL_DENSE;
  }
  cfg->n_hidden_layers = 0;
  DSV4_TRY(get_int(root, "num_hidden_layers", "n_layers", 0, &cfg->n_hidden_layers));
  /* HF configs list one ratio per layer plus the MTP layers; fewer than the layers is an error. */
  DSV4_CHECK(cfg->n_hidden_layers >= 0 && cfg->n_layers >= cfg->n_hidden_layers, DSV4_ERR_CONFIG,
             "config: compress_ratios has %d entries but num_hidden_layers is %d", cfg->n_layers,
             cfg->n_hidden_layers);
  DSV4_TRY(get_quantization(root, cfg));
  DSV4_TRY(validate(cfg));
fail:
  cJSON_Delete(flat);
  cJSON_Delete(parsed);
  return rc;
}

dsv4_status dsv4_config_parse(dsv4_config *cfg, const char *json_text) {
  dsv4_status rc = DSV4_OK;
  dsv4_config full;
  DSV4_TRY(DSV4_STRUCT_CHECK(cfg, dsv4_config));
  DSV4_TRY(parse(&full, json_text));
  DSV4_TRY(DSV4_STRUCT_OUT(cfg, &full, dsv4_config));
fail:
  return rc;
}

dsv4_status dsv4_config_load(dsv4_config *cfg, const char *path) {
  dsv4_status rc = DSV4_OK;
  char *text = NULL;
  DSV4_TRY(dsv4_read_text_file(path, &text));
  rc = dsv4_config_parse(cfg, text);
  if (rc != DSV4_OK) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", dsv4_last_error());
    dsv4__err(rc, __FILE__, __LINE__, "%s: %s", path, msg);
  }
fail:
  free(text);
  return rc;
}
