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
  } else {
    DSV4_FAIL(DSV4_ERR_ARG, "unknown config preset '%s' (expected flash, pro or tiny)", name);
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
    DSV4_CHECK(r == 0 || r == 4 || r == 128, DSV4_ERR_CONFIG,
               "config: compress_ratios[%d] = %d, expected 0, 4 or 128", i, r);
  }
  DSV4_CHECK(c->n_heads % c->o_groups == 0, DSV4_ERR_CONFIG,
             "config: num_attention_heads (%d) must be a multiple of o_groups (%d)", c->n_heads,
             c->o_groups);
  DSV4_CHECK(c->rope_dim % 2 == 0, DSV4_ERR_CONFIG, "config: qk_rope_head_dim (%d) must be even",
             c->rope_dim);
  DSV4_CHECK(c->rope_dim <= c->head_dim, DSV4_ERR_CONFIG,
             "config: qk_rope_head_dim (%d) is larger than head_dim (%d)", c->rope_dim, c->head_dim);
  if (any_ratio(c, 4)) {
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
  cJSON *root = NULL;
  DSV4_CHECK(json_text, DSV4_ERR_ARG, "config: NULL text");
  set_defaults(cfg);
  root = cJSON_Parse(json_text);
  DSV4_CHECK(root, DSV4_ERR_FORMAT, "config: not valid JSON (near byte %ld)",
             cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - json_text) : -1L);
  DSV4_CHECK(cJSON_IsObject(root), DSV4_ERR_FORMAT, "config: top level must be a JSON object");
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
  int need_index = any_ratio(cfg, 4);
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
  cJSON_Delete(root);
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
