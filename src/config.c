/* config.c: the layer configuration: built-in presets, Hugging Face config.json parsing (cJSON),
 * and validation. Structural keys are required (a wrong guess would silently compute a different
 * model); rope, eps and loss hyperparameters default to the V4-Flash values of SPEC section 1. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util/err.h"
#include "util/fileio.h"

/* V4-Flash values of SPEC section 1 for the keys that may be omitted. */
#define FLASH_ROPE_THETA 10000.0
#define FLASH_COMPRESS_ROPE_THETA 160000.0
#define FLASH_YARN_FACTOR 16.0
#define FLASH_YARN_ORIG 65536.0
#define FLASH_YARN_BETA_FAST 32.0
#define FLASH_YARN_BETA_SLOW 1.0
#define FLASH_EPS 1e-6
#define DEFAULT_INDEX_LOSS_COEFF 1e-3

/* Fills the keys shared by every preset and the defaults of optional keys. */
static void set_defaults(dsv4_config *c) {
  memset(c, 0, sizeof *c);
  c->rope_theta = FLASH_ROPE_THETA;
  c->compress_rope_theta = FLASH_COMPRESS_ROPE_THETA;
  c->rope_factor = FLASH_YARN_FACTOR;
  c->rope_orig_max_pos = FLASH_YARN_ORIG;
  c->beta_fast = FLASH_YARN_BETA_FAST;
  c->beta_slow = FLASH_YARN_BETA_SLOW;
  c->eps = FLASH_EPS;
  c->index_loss_coeff = DEFAULT_INDEX_LOSS_COEFF;
  c->index_loss_mode = DSV4_KL_SPARSE;
}

/* V4 layer pattern: `head` leading layers of ratio `first`, then alternating CSA (even index) and
 * HCA (odd index) up to the last model layer, then one SWA-only MTP layer. */
static void set_pattern(dsv4_config *c, int n_layers, int first) {
  c->n_layers = n_layers;
  for (int i = 0; i < n_layers; i++) c->compress_ratios[i] = (i % 2 == 0) ? 4 : 128;
  c->compress_ratios[0] = c->compress_ratios[1] = first;
  c->compress_ratios[n_layers - 1] = 0;
}

dsv4_status dsv4_config_preset(dsv4_config *cfg, const char *name) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(cfg && name, DSV4_ERR_ARG, "config preset: NULL argument");
  set_defaults(cfg);
  if (!strcmp(name, "flash")) {
    cfg->dim = 4096; cfg->n_heads = 64; cfg->head_dim = 512; cfg->rope_dim = 64;
    cfg->q_lora_rank = 1024; cfg->o_groups = 8; cfg->o_lora_rank = 1024; cfg->window = 128;
    cfg->index_n_heads = 64; cfg->index_head_dim = 128; cfg->index_topk = 512;
    set_pattern(cfg, 44, 0);
  } else if (!strcmp(name, "pro")) {
    cfg->dim = 7168; cfg->n_heads = 128; cfg->head_dim = 512; cfg->rope_dim = 64;
    cfg->q_lora_rank = 1536; cfg->o_groups = 16; cfg->o_lora_rank = 1024; cfg->window = 128;
    cfg->index_n_heads = 64; cfg->index_head_dim = 128; cfg->index_topk = 1024;
    set_pattern(cfg, 62, 128);
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
  } else {
    DSV4_FAIL(DSV4_ERR_ARG, "unknown config preset '%s' (expected flash, pro or tiny)", name);
  }
  return dsv4_config_validate(cfg);
fail:
  return rc;
}

int dsv4_config_ratio(const dsv4_config *cfg, int layer) {
  if (!cfg || layer < 0 || layer >= cfg->n_layers) return -1;
  return cfg->compress_ratios[layer];
}

static int any_ratio(const dsv4_config *c, int r) {
  for (int i = 0; i < c->n_layers; i++)
    if (c->compress_ratios[i] == r) return 1;
  return 0;
}

dsv4_status dsv4_config_validate(const dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(c, DSV4_ERR_ARG, "config: NULL");
#define POSITIVE(field, key) \
  DSV4_CHECK(c->field > 0, DSV4_ERR_CONFIG, "config: %s must be positive (got %d)", key, c->field)
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
fail:
  return rc;
}

/* Reads an integer key; missing is an error when required, else leaves *dst unchanged. */
static dsv4_status get_int(const cJSON *root, const char *key, int required, int *dst) {
  dsv4_status rc = DSV4_OK;
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!it) {
    DSV4_CHECK(!required, DSV4_ERR_CONFIG, "config: missing required key '%s'", key);
    return DSV4_OK;
  }
  DSV4_CHECK(cJSON_IsNumber(it), DSV4_ERR_CONFIG, "config: key '%s' must be a number", key);
  double v = it->valuedouble;
  DSV4_CHECK(v == floor(v) && fabs(v) < 1e9, DSV4_ERR_CONFIG,
             "config: key '%s' must be an integer (got %g)", key, v);
  *dst = (int)v;
fail:
  return rc;
}

static dsv4_status get_num(const cJSON *root, const char *prefix, const char *key, double *dst) {
  dsv4_status rc = DSV4_OK;
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!it || cJSON_IsNull(it)) return DSV4_OK;
  DSV4_CHECK(cJSON_IsNumber(it), DSV4_ERR_CONFIG, "config: key '%s%s' must be a number", prefix, key);
  *dst = it->valuedouble;
fail:
  return rc;
}

/* rope_scaling: absent -> V4-Flash YaRN; null -> no YaRN; object -> its four keys (required). */
static dsv4_status get_rope_scaling(const cJSON *root, dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  if (!rs) return DSV4_OK;
  if (cJSON_IsNull(rs)) {
    c->rope_orig_max_pos = 0;
    return DSV4_OK;
  }
  DSV4_CHECK(cJSON_IsObject(rs), DSV4_ERR_CONFIG, "config: key 'rope_scaling' must be an object or null");
  static const char *keys[] = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow"};
  double *dst[] = {&c->rope_factor, &c->rope_orig_max_pos, &c->beta_fast, &c->beta_slow};
  for (int i = 0; i < 4; i++) {
    DSV4_CHECK(cJSON_GetObjectItemCaseSensitive(rs, keys[i]), DSV4_ERR_CONFIG,
               "config: missing required key 'rope_scaling.%s'", keys[i]);
    DSV4_TRY(get_num(rs, "rope_scaling.", keys[i], dst[i]));
  }
fail:
  return rc;
}

static dsv4_status get_ratios(const cJSON *root, dsv4_config *c) {
  dsv4_status rc = DSV4_OK;
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "compress_ratios");
  DSV4_CHECK(arr, DSV4_ERR_CONFIG, "config: missing required key 'compress_ratios'");
  DSV4_CHECK(cJSON_IsArray(arr), DSV4_ERR_CONFIG, "config: key 'compress_ratios' must be an array");
  int n = cJSON_GetArraySize(arr);
  DSV4_CHECK(n > 0 && n <= DSV4_MAX_LAYERS, DSV4_ERR_CONFIG,
             "config: compress_ratios must have 1..%d entries (got %d)", DSV4_MAX_LAYERS, n);
  c->n_layers = n;
  for (int i = 0; i < n; i++) {
    const cJSON *it = cJSON_GetArrayItem(arr, i);
    DSV4_CHECK(cJSON_IsNumber(it) && it->valuedouble == floor(it->valuedouble), DSV4_ERR_CONFIG,
               "config: compress_ratios[%d] must be an integer", i);
    c->compress_ratios[i] = (int)it->valuedouble;
  }
fail:
  return rc;
}

dsv4_status dsv4_config_parse(dsv4_config *cfg, const char *json_text) {
  dsv4_status rc = DSV4_OK;
  cJSON *root = NULL;
  DSV4_CHECK(cfg && json_text, DSV4_ERR_ARG, "config: NULL argument");
  set_defaults(cfg);
  root = cJSON_Parse(json_text);
  DSV4_CHECK(root, DSV4_ERR_FORMAT, "config: not valid JSON (near byte %ld)",
             cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - json_text) : -1L);
  DSV4_CHECK(cJSON_IsObject(root), DSV4_ERR_FORMAT, "config: top level must be a JSON object");
  DSV4_TRY(get_int(root, "hidden_size", 1, &cfg->dim));
  DSV4_TRY(get_int(root, "num_attention_heads", 1, &cfg->n_heads));
  DSV4_TRY(get_int(root, "head_dim", 1, &cfg->head_dim));
  DSV4_TRY(get_int(root, "qk_rope_head_dim", 1, &cfg->rope_dim));
  DSV4_TRY(get_int(root, "q_lora_rank", 1, &cfg->q_lora_rank));
  DSV4_TRY(get_int(root, "o_groups", 1, &cfg->o_groups));
  DSV4_TRY(get_int(root, "o_lora_rank", 1, &cfg->o_lora_rank));
  DSV4_TRY(get_int(root, "sliding_window", 1, &cfg->window));
  DSV4_TRY(get_ratios(root, cfg));
  int need_index = any_ratio(cfg, 4);
  DSV4_TRY(get_int(root, "index_n_heads", need_index, &cfg->index_n_heads));
  DSV4_TRY(get_int(root, "index_head_dim", need_index, &cfg->index_head_dim));
  DSV4_TRY(get_int(root, "index_topk", need_index, &cfg->index_topk));
  DSV4_TRY(get_num(root, "", "rope_theta", &cfg->rope_theta));
  DSV4_TRY(get_num(root, "", "compress_rope_theta", &cfg->compress_rope_theta));
  DSV4_TRY(get_rope_scaling(root, cfg));
  DSV4_TRY(get_num(root, "", "rms_norm_eps", &cfg->eps));
  DSV4_TRY(get_num(root, "", "index_loss_coeff", &cfg->index_loss_coeff));
  const cJSON *mode = cJSON_GetObjectItemCaseSensitive(root, "index_loss_mode");
  if (mode) {
    DSV4_CHECK(cJSON_IsString(mode) && (!strcmp(mode->valuestring, "sparse") ||
                                        !strcmp(mode->valuestring, "dense")),
               DSV4_ERR_CONFIG, "config: index_loss_mode must be \"sparse\" or \"dense\"");
    cfg->index_loss_mode = strcmp(mode->valuestring, "dense") ? DSV4_KL_SPARSE : DSV4_KL_DENSE;
  }
  int n_hidden = -1;
  DSV4_TRY(get_int(root, "num_hidden_layers", 0, &n_hidden));
  /* HF configs list one ratio per layer plus the MTP layers; fewer than the layers is an error. */
  DSV4_CHECK(n_hidden < 0 || cfg->n_layers >= n_hidden, DSV4_ERR_CONFIG,
             "config: compress_ratios has %d entries but num_hidden_layers is %d", cfg->n_layers,
             n_hidden);
  DSV4_TRY(dsv4_config_validate(cfg));
fail:
  cJSON_Delete(root);
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
