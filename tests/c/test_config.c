/* test_config.c: presets, config.json parsing (required keys, defaults, rope_scaling forms, the
 * released config.json and DeepSeek's inference config.json with ModelArgs names, conflicting
 * namings, quantization_config, range checks of every number) and validation errors that name the
 * key. */
#include <string.h>

#include "model/weights.h"
#include "testutil.h"

#define BASE                                                                                          \
  "\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32, \"qk_rope_head_dim\": 16, "   \
  "\"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, \"sliding_window\": 16"
#define INDEX "\"index_n_heads\": 2, \"index_head_dim\": 32, \"index_topk\": 8"

/* Parses text; expects status want and (on error) a message containing needle. */
static void parse_case(const char *what, const char *text, dsv4_status want, const char *needle) {
  dsv4_config c = DSV4_CONFIG_INIT;
  dsv4_status st = dsv4_config_parse(&c, text);
  tu_check(st == want && (want == DSV4_OK || strstr(dsv4_last_error(), needle)), "config %s -> %s (%s)", what,
           dsv4_status_string(st), st == DSV4_OK ? "ok" : dsv4_last_error());
}

/* DeepSeek's inference/config.json for V4-Flash (ModelArgs names), as published. */
static const char *INFERENCE_FLASH =
    "{\"vocab_size\": 129280, \"dim\": 4096, \"moe_inter_dim\": 2048, \"n_layers\": 43, \"n_hash_layers\": 3, "
    "\"n_heads\": 64, \"n_routed_experts\": 256, \"n_routed_experts_score\": 128, \"n_shared_experts\": 1, "
    "\"n_activated_experts\": 6, \"score_func\": \"sqrtsoftplus\", \"route_scale\": 1.5, \"swiglu_limit\": 10.0, "
    "\"q_lora_rank\": 1024, \"head_dim\": 512, \"rope_head_dim\": 64, \"o_groups\": 8, \"o_lora_rank\": 1024, "
    "\"window_size\": 128, \"original_seq_len\": 65536, \"rope_theta\": 10000, \"rope_factor\": 16, "
    "\"beta_fast\": 32, \"beta_slow\": 1, \"index_n_heads\": 64, \"index_head_dim\": 128, \"index_topk\": 512, "
    "\"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"dtype\": \"fp8\", \"scale_fmt\": \"ue8m0\", "
    "\"expert_dtype\": \"fp4\", \"compress_rope_theta\": 160000, \"compress_ratios\": [0, 0, 4, 128, 4, 128, 4, "
    "128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, "
    "128, 4, 128, 4, 128, 4, 128, 4, 0]}";

/* The released config.json of V4-Flash (Hugging Face names; MoE and quantization keys included). */
static const char *RELEASED_FLASH =
    "{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\", \"hidden_size\": 4096, "
    "\"num_attention_heads\": 64, \"head_dim\": 512, \"qk_rope_head_dim\": 64, \"q_lora_rank\": 1024, "
    "\"o_groups\": 8, \"o_lora_rank\": 1024, \"sliding_window\": 128, \"index_n_heads\": 64, "
    "\"index_head_dim\": 128, \"index_topk\": 512, \"num_hidden_layers\": 43, \"num_nextn_predict_layers\": 1, "
    "\"n_routed_experts\": 256, \"moe_intermediate_size\": 2048, \"rope_theta\": 10000, "
    "\"compress_rope_theta\": 160000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, "
    "\"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1}, \"rms_norm_eps\": 1e-06, "
    "\"max_position_embeddings\": 1048576, \"quantization_config\": {\"fmt\": \"e4m3\", \"quant_method\": \"fp8\", "
    "\"scale_fmt\": \"ue8m0\", \"weight_block_size\": [128, 128]}, \"compress_ratios\": [0, 0, 4, 128, 4, 128, 4, "
    "128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, "
    "128, 4, 128, 4, 128, 4, 128, 4, 0]}";

/* 1 when two configs hold the same model (every field the layer uses). */
static int same_model(const dsv4_config *a, const dsv4_config *b) {
  return a->dim == b->dim && a->n_heads == b->n_heads && a->head_dim == b->head_dim && a->rope_dim == b->rope_dim &&
         a->q_lora_rank == b->q_lora_rank && a->o_groups == b->o_groups && a->o_lora_rank == b->o_lora_rank &&
         a->window == b->window && a->index_n_heads == b->index_n_heads && a->index_head_dim == b->index_head_dim &&
         a->index_topk == b->index_topk && a->n_layers == b->n_layers &&
         !memcmp(a->compress_ratios, b->compress_ratios, sizeof(int) * (size_t)a->n_layers) &&
         a->rope_theta == b->rope_theta && a->compress_rope_theta == b->compress_rope_theta &&
         a->rope_factor == b->rope_factor && a->rope_orig_max_pos == b->rope_orig_max_pos &&
         a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow && a->eps == b->eps &&
         a->n_hidden_layers == b->n_hidden_layers && a->fp8_block[0] == b->fp8_block[0] &&
         a->fp8_block[1] == b->fp8_block[1];
}

/* Both namings, conflicts, the released files, quantization_config and range checks. */
static void test_namings(void) {
  dsv4_config flash = DSV4_CONFIG_INIT, c = DSV4_CONFIG_INIT;
  dsv4_config_preset(&flash, "flash");
  tu_check(flash.n_hidden_layers == 43 && flash.fp8_block[0] == 128 && flash.fp8_block[1] == 128,
           "config flash preset: 43 hidden layers (layer 43 is the MTP layer), 128 x 128 FP8 blocks");
  dsv4_config_preset(&c, "pro");
  tu_check(c.n_hidden_layers == 61, "config pro preset: 61 hidden layers");
  dsv4_config_preset(&c, "tiny");
  tu_check(c.n_hidden_layers == c.n_layers, "config tiny preset: no MTP layer");
  tu_check(dsv4_config_parse(&c, INFERENCE_FLASH) == DSV4_OK && same_model(&c, &flash),
           "config DeepSeek's inference/config.json (ModelArgs names) = the flash preset (%s)", dsv4_last_error());
  tu_check(dsv4_config_parse(&c, RELEASED_FLASH) == DSV4_OK && same_model(&c, &flash),
           "config released config.json (HF names, quantization_config) = the flash preset (%s)", dsv4_last_error());
  parse_case("both namings, same value", "{" BASE ", \"dim\": 64, \"window_size\": 16, \"compress_ratios\": [0], "
             "\"compress_rope_theta\": 160000, \"original_seq_len\": 0}", DSV4_OK, NULL);
  parse_case("both namings, different values", "{" BASE ", \"dim\": 65, \"compress_ratios\": [0]}", DSV4_ERR_CONFIG,
             "'hidden_size' and 'dim'");
  parse_case("window_size vs sliding_window", "{" BASE ", \"window_size\": 8, \"compress_ratios\": [0]}",
             DSV4_ERR_CONFIG, "'sliding_window' and 'window_size'");
  parse_case("rope_scaling.factor vs rope_factor", "{" BASE ", \"compress_ratios\": [0], \"rope_factor\": 40, "
             "\"rope_scaling\": {\"factor\": 16, \"original_max_position_embeddings\": 65536, \"beta_fast\": 32, "
             "\"beta_slow\": 1}}", DSV4_ERR_CONFIG, "'rope_scaling.factor' and 'rope_factor'");
  parse_case("rms_norm_eps vs norm_eps", "{" BASE ", \"compress_ratios\": [0], \"rms_norm_eps\": 1e-6, "
             "\"norm_eps\": 1e-5}", DSV4_ERR_CONFIG, "'rms_norm_eps' and 'norm_eps'");
  parse_case("rope_scaling null vs original_seq_len", "{" BASE ", \"compress_ratios\": [0], \"rope_scaling\": null, "
             "\"original_seq_len\": 4096}", DSV4_ERR_CONFIG, "original_seq_len");
  parse_case("num_hidden_layers vs n_layers", "{" BASE ", \"compress_ratios\": [0, 0], \"num_hidden_layers\": 1, "
             "\"n_layers\": 2}", DSV4_ERR_CONFIG, "'num_hidden_layers' and 'n_layers'");
  const char *ma = "\"dim\": 64, \"n_heads\": 4, \"head_dim\": 32, \"rope_head_dim\": 16, \"q_lora_rank\": 48, "
                   "\"o_groups\": 2, \"o_lora_rank\": 24, \"window_size\": 16, \"compress_ratios\": [0, 128]";
  char text[1024];
  snprintf(text, sizeof text, "{%s, \"compress_rope_theta\": 160000, \"rope_factor\": 16}", ma);
  parse_case("ModelArgs without original_seq_len", text, DSV4_ERR_CONFIG, "original_seq_len");
  snprintf(text, sizeof text, "{%s, \"original_seq_len\": 65536, \"rope_factor\": 16}", ma);
  parse_case("ModelArgs without compress_rope_theta", text, DSV4_ERR_CONFIG, "compress_rope_theta");
  snprintf(text, sizeof text, "{%s, \"original_seq_len\": 65536, \"compress_rope_theta\": 160000}", ma);
  parse_case("ModelArgs without rope_factor (YaRN on)", text, DSV4_ERR_CONFIG, "rope_factor");
  snprintf(text, sizeof text, "{%s, \"original_seq_len\": 0, \"compress_rope_theta\": 160000, \"n_layers\": 1}", ma);
  tu_check(dsv4_config_parse(&c, text) == DSV4_OK && c.rope_orig_max_pos == 0 && c.n_hidden_layers == 1 &&
               c.dim == 64 && c.window == 16 && c.rope_dim == 16,
           "config ModelArgs: original_seq_len 0 (no YaRN) needs no rope_factor; n_layers is num_hidden_layers");
  snprintf(text, sizeof text, "{\"n_heads\": 4, \"head_dim\": 32, \"rope_head_dim\": 16, \"q_lora_rank\": 48, "
           "\"o_groups\": 2, \"o_lora_rank\": 24, \"window_size\": 16, \"compress_ratios\": [0]}");
  parse_case("ModelArgs structural key missing (no debug default)", text, DSV4_ERR_CONFIG, "'hidden_size' (or 'dim')");

  /* quantization_config */
  parse_case("quantization_config 32 x 32 blocks", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": "
             "{\"quant_method\": \"fp8\", \"weight_block_size\": [32, 32], \"activation_scheme\": \"dynamic\"}}", DSV4_OK, NULL);
  dsv4_config_parse(&c, "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": {\"quant_method\": \"fp8\", "
                        "\"weight_block_size\": [64, 32]}}");
  tu_check(c.fp8_block[0] == 64 && c.fp8_block[1] == 32, "config weight_block_size [64, 32] read as rows x cols");
  parse_case("quant_method awq", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": {\"quant_method\": "
             "\"awq\"}}", DSV4_ERR_UNSUPPORTED, "quant_method");
  parse_case("quantization fmt e5m2", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": {\"quant_method\": "
             "\"fp8\", \"fmt\": \"e5m2\"}}", DSV4_ERR_UNSUPPORTED, "fmt");
  parse_case("quantization scale_fmt", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": {\"quant_method\": "
             "\"fp8\", \"scale_fmt\": \"e4m3\"}}", DSV4_ERR_UNSUPPORTED, "scale_fmt");
  parse_case("quantization without quant_method", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": {}}",
             DSV4_ERR_CONFIG, "quant_method");
  parse_case("weight_block_size 0", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": {\"quant_method\": "
             "\"fp8\", \"weight_block_size\": [0, 128]}}", DSV4_ERR_CONFIG, "weight_block_size[0]");
  parse_case("weight_block_size of one number", "{" BASE ", \"compress_ratios\": [0], \"quantization_config\": "
             "{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}}", DSV4_ERR_CONFIG, "weight_block_size");
  parse_case("rope_scaling type linear", "{" BASE ", \"compress_ratios\": [0], \"rope_scaling\": {\"type\": \"linear\", "
             "\"factor\": 16, \"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1}}",
             DSV4_ERR_UNSUPPORTED, "rope_scaling.type");

  /* every number is range-checked before conversion, the message shows it as written */
  parse_case("compress_ratios 1e300", "{" BASE ", \"compress_ratios\": [0, 1e300]}", DSV4_ERR_CONFIG,
             "'compress_ratios[1]' must be an integer in [-2147483648, 2147483647] (got 1e+300)");
  parse_case("compress_ratios -1e300", "{" BASE ", \"compress_ratios\": [-1e300]}", DSV4_ERR_CONFIG, "-1e+300");
  parse_case("compress_ratios 2^31", "{" BASE ", \"compress_ratios\": [2147483648]}", DSV4_ERR_CONFIG, "2147483648");
  parse_case("compress_ratios 1e999 (inf)", "{" BASE ", \"compress_ratios\": [1e999]}", DSV4_ERR_CONFIG, "inf");
  parse_case("compress_ratios fractional", "{" BASE ", \"compress_ratios\": [4.5]}", DSV4_ERR_CONFIG, "4.5");
  parse_case("hidden_size 1e300", "{\"hidden_size\": 1e300, \"num_attention_heads\": 4, \"head_dim\": 32, "
             "\"qk_rope_head_dim\": 16, \"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, "
             "\"sliding_window\": 16, \"compress_ratios\": [0]}", DSV4_ERR_CONFIG, "'hidden_size'");
  parse_case("hidden_size 2^21 (sizes are bounded so products stay in int64)", "{\"hidden_size\": 2097152, "
             "\"num_attention_heads\": 4, \"head_dim\": 32, \"qk_rope_head_dim\": 16, \"q_lora_rank\": 48, "
             "\"o_groups\": 2, \"o_lora_rank\": 24, \"sliding_window\": 16, \"compress_ratios\": [0]}",
             DSV4_ERR_CONFIG, "hidden_size must be in [1, 1048576]");
  parse_case("num_hidden_layers 1e19", "{" BASE ", \"compress_ratios\": [0], \"num_hidden_layers\": 1e19}",
             DSV4_ERR_CONFIG, "1e+19");
  parse_case("rope_theta 1e999 (inf)", "{" BASE ", \"compress_ratios\": [0], \"rope_theta\": 1e999}", DSV4_ERR_CONFIG,
             "rope_theta");
  parse_case("rope_theta a string", "{" BASE ", \"compress_ratios\": [0], \"rope_theta\": \"1e4\"}", DSV4_ERR_CONFIG,
             "rope_theta");
  tu_check(dsv4_config_load(&c, "/tmp") == DSV4_ERR_IO && strstr(dsv4_last_error(), "/tmp is a directory") &&
               !strstr(dsv4_last_error(), "bytes"),
           "config: a directory as the file says 'is a directory' (%s)", dsv4_last_error());
  tu_check(dsv4_config_load(&c, "/dev/null") == DSV4_ERR_IO && strstr(dsv4_last_error(), "character device"),
           "config: a device as the file says so (%s)", dsv4_last_error());
}

/* DeepSeek V4.1 (docs/spec.md section 10): the presets' roles, the released nesting and the
 * ModelArgs names, and every validation rule with its key and layer. */
#define V41_TEXT                                                                                     \
  BASE ", " INDEX ", \"compress_ratios\": [0, 2, 2, 2, 1, 1, 1, 0], \"num_hidden_layers\": 7, "     \
  "\"kv_source_layer_ids\": [1, 4], \"index_source_layer_ids\": [1, 3, 4, 6]"
static void test_v41(void) {
  dsv4_config c = DSV4_CONFIG_INIT;
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  tu_ok(dsv4_config_preset(&c, "flash41"), "flash41 preset");
  tu_check(c.v41 && c.dim == 5120 && c.q_lora_rank == 1280 && c.n_hidden_layers == 40 && c.n_layers == 43 &&
               c.compress_ratios[2] == 2 && c.compress_ratios[20] == 1 && c.compress_ratios[40] == 0 &&
               c.candidate_source == 20 && c.candidate_topk_blocks == 2048 && c.candidate_block_size == 8 &&
               c.fp8_block[0] == 32 && c.eps == 1e-20,
           "config flash41 preset: V4.1-Flash values (ratios, sources, candidates, 32 x 32 FP8 blocks, eps 1e-20)");
  static const struct { int layer; dsv4_role role; int kv, ix, sel, cand, uses; } ROLES[] = {
      {0, DSV4_ROLE_WINDOW, -1, -1, 0, 0, 0}, {2, DSV4_ROLE_FULL, 2, 2, 1, 0, 0},
      {3, DSV4_ROLE_REUSE, 2, 2, 0, 0, 0},    {20, DSV4_ROLE_FULL, 20, 20, 1, 1, 0},
      {23, DSV4_ROLE_REUSE, 20, 20, 0, 0, 0}, {24, DSV4_ROLE_REINDEX, 20, 24, 1, 0, 1},
      {39, DSV4_ROLE_REUSE, 20, 36, 0, 0, 0}};
  for (size_t i = 0; i < sizeof ROLES / sizeof ROLES[0]; i++) {
    const int ok = dsv4_config_layer(&c, ROLES[i].layer, &in) == DSV4_OK;
    tu_check(ok && in.role == ROLES[i].role && in.kv_source == ROLES[i].kv && in.index_source == ROLES[i].ix &&
                 in.selects == ROLES[i].sel && in.candidate_source == ROLES[i].cand &&
                 in.uses_candidates == ROLES[i].uses,
             "config flash41 layer %d: role %d, kv source %d, index source %d", ROLES[i].layer, (int)in.role,
             in.kv_source, in.index_source);
  }
  tu_check(dsv4_config_layer(&c, 41, &in) == DSV4_ERR_UNSUPPORTED && strstr(dsv4_last_error(), "DSpark"),
           "config flash41 layer 41 is a DSpark draft stage: refused (%s)", dsv4_last_error());
  dsv4_weights *w = NULL;
  tu_check(dsv4_weights_create(&w, &c, 40) != DSV4_OK && strstr(dsv4_last_error(), "layer 40"),
           "weights of a DSpark stage refused (%s)", dsv4_last_error());
  tu_ok(dsv4_config_preset(&c, "tiny41"), "tiny41 preset");
  int roles[5] = {0};
  for (int L = 0; L < c.n_layers; L++)
    if (dsv4_config_layer(&c, L, &in) == DSV4_OK) roles[in.role]++, roles[DSV4_ROLE_OWN] += in.uses_candidates;
  tu_check(roles[DSV4_ROLE_WINDOW] == 2 && roles[DSV4_ROLE_FULL] == 2 && roles[DSV4_ROLE_REINDEX] == 2 &&
               roles[DSV4_ROLE_REUSE] == 4 && roles[DSV4_ROLE_OWN] == 1,
           "config tiny41: 2 window, 2 kv sources (r = 2 and r = 1), 2 reindex (one inside candidates), 4 reuse");
  /* the released nesting: text keys under text_config, quantization_config at the top */
  parse_case("V4.1 released nesting", "{\"model_type\": \"deepseek_v41\", \"text_config\": {" V41_TEXT "}, "
             "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"scale_fmt\": \"ue8m0\", "
             "\"weight_block_size\": [32, 32]}}", DSV4_OK, NULL);
  dsv4_config_parse(&c, "{\"text_config\": {" V41_TEXT "}, \"quantization_config\": {\"quant_method\": \"fp8\", "
                        "\"fmt\": \"e4m3\", \"weight_block_size\": [32, 32]}}");
  tu_check(c.v41 && c.n_kv_sources == 2 && c.kv_sources[1] == 4 && c.n_index_sources == 4 && c.fp8_block[1] == 32 &&
               c.eps == 1e-20 && c.candidate_source == -1,
           "config V4.1 nested: sources, FP8 block 32 from quantization_config, eps default 1e-20, no candidates");
  parse_case("V4.1 ModelArgs names", "{\"dim\": 64, \"n_heads\": 4, \"head_dim\": 32, \"rope_head_dim\": 16, "
             "\"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, \"window_size\": 16, " INDEX ", "
             "\"compress_ratios\": [0, 2, 2, 1, 1], \"n_layers\": 5, \"kv_source_layers\": [1, 3], "
             "\"index_source_layers\": [1, 3], \"candidate_source_layer\": 3, \"candidate_topk_blocks\": 4, "
             "\"candidate_block_size\": 2, \"compress_rope_theta\": 160000, \"original_seq_len\": 65536, "
             "\"rope_factor\": 16}", DSV4_OK, NULL);
  static const struct { const char *what, *keys, *needle; } BAD[] = {
      {"a kv source that is not an index source",
       "\"kv_source_layer_ids\": [1, 4], \"index_source_layer_ids\": [1, 3, 6]", "layer 4 is not in"},
      {"a source of ratio 0", "\"kv_source_layer_ids\": [0, 1, 4], \"index_source_layer_ids\": [0, 1, 4]",
       "layer 0, whose compress ratio is 0"},
      {"a layer whose source has another ratio", "\"kv_source_layer_ids\": [1], \"index_source_layer_ids\": [1]",
       "layer 4 has ratio 1 but its kv source, layer 1"},
      {"a candidate source that is not the last kv source",
       "\"kv_source_layer_ids\": [1, 4], \"index_source_layer_ids\": [1, 3, 4, 6], \"candidate_source_layer_id\": 1, "
       "\"candidate_topk_blocks\": 8, \"candidate_block_size\": 2", "candidate_source_layer_id layer 1"},
      {"candidate blocks too few for index_topk",
       "\"kv_source_layer_ids\": [1, 4], \"index_source_layer_ids\": [1, 3, 4, 6], \"candidate_source_layer_id\": 4, "
       "\"candidate_topk_blocks\": 3, \"candidate_block_size\": 2", "< index_topk (8)"},
      {"a source at a DSpark stage", "\"kv_source_layer_ids\": [1, 4, 7], \"index_source_layer_ids\": [1, 4, 7]",
       "names layer 7, outside 0..6"},
  };
  for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text, "{" BASE ", " INDEX ", \"compress_ratios\": [0, 2, 2, 2, 1, 1, 1, 0], "
             "\"num_hidden_layers\": 7, %s}", BAD[i].keys);
    parse_case(BAD[i].what, text, DSV4_ERR_CONFIG, BAD[i].needle);
  }
  parse_case("V4.1 with ratio 4", "{" BASE ", " INDEX ", \"compress_ratios\": [0, 4], \"num_hidden_layers\": 2, "
             "\"kv_source_layer_ids\": [1], \"index_source_layer_ids\": [1]}", DSV4_ERR_CONFIG, "compress_ratios[1]");
}

static void test_v4(void) {
  dsv4_config c = DSV4_CONFIG_INIT;
  const char *presets[] = {"flash", "pro", "tiny"};
  for (int i = 0; i < 3; i++) tu_ok(dsv4_config_preset(&c, presets[i]), presets[i]);
  dsv4_config_preset(&c, "flash");
  tu_check(c.dim == 4096 && c.n_heads == 64 && c.head_dim == 512 && c.index_topk == 512 && c.n_layers == 44 &&
               c.compress_ratios[0] == 0 && c.compress_ratios[2] == 4 && c.compress_ratios[3] == 128 &&
               c.compress_ratios[42] == 4 && c.compress_ratios[43] == 0,
           "config flash preset: SPEC 1 values and the [0,0,4,128,...,4,0] pattern");
  dsv4_config_preset(&c, "pro");
  tu_check(c.dim == 7168 && c.n_heads == 128 && c.q_lora_rank == 1536 && c.o_groups == 16 && c.index_topk == 1024 &&
               c.n_layers == 62 && c.compress_ratios[0] == 128 && c.compress_ratios[1] == 128 &&
               c.compress_ratios[2] == 4 && c.compress_ratios[61] == 0,
           "config pro preset: SPEC 1 values and the [128,128,4,128,...,4,0] pattern");
  tu_check(dsv4_config_preset(&c, "huge") == DSV4_ERR_ARG && strstr(dsv4_last_error(), "huge"),
           "config unknown preset named in the error");

  parse_case("complete", "{" BASE ", " INDEX ", \"compress_ratios\": [0, 4, 128], \"rope_theta\": 10000, "
             "\"compress_rope_theta\": 160000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, "
             "\"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1}, "
             "\"rms_norm_eps\": 1e-6, \"unknown_key\": [1, 2]}", DSV4_OK, NULL);
  dsv4_config_parse(&c, "{" BASE ", \"compress_ratios\": [0, 128]}");
  tu_check(c.rope_theta == 10000 && c.compress_rope_theta == 160000 && c.rope_factor == 16 &&
               c.rope_orig_max_pos == 65536 && c.eps == 1e-6 && c.index_loss_coeff == 1e-3 &&
               c.index_loss_mode == DSV4_KL_SPARSE,
           "config omitted rope/eps/loss keys take the V4-Flash defaults");
  dsv4_config_parse(&c, "{" BASE ", \"compress_ratios\": [128], \"rope_scaling\": null}");
  tu_check(c.rope_orig_max_pos == 0, "config rope_scaling null disables YaRN");
  dsv4_config_parse(&c, "{" BASE ", " INDEX ", \"compress_ratios\": [4], \"index_loss_coeff\": 0.5, "
                    "\"index_loss_mode\": \"dense\"}");
  tu_check(c.index_loss_coeff == 0.5 && c.index_loss_mode == DSV4_KL_DENSE, "config index_loss_coeff and mode read");
  parse_case("index keys optional without a ratio-4 layer", "{" BASE ", \"compress_ratios\": [0, 128]}", DSV4_OK, NULL);
  parse_case("missing head_dim", "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"qk_rope_head_dim\": 16, "
             "\"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, \"sliding_window\": 16, "
             "\"compress_ratios\": [0]}", DSV4_ERR_CONFIG, "head_dim");
  parse_case("missing compress_ratios", "{" BASE "}", DSV4_ERR_CONFIG, "compress_ratios");
  parse_case("missing index_topk with a ratio-4 layer", "{" BASE ", \"compress_ratios\": [4], "
             "\"index_n_heads\": 2, \"index_head_dim\": 32}", DSV4_ERR_CONFIG, "index_topk");
  parse_case("rope_scaling without factor", "{" BASE ", \"compress_ratios\": [0], \"rope_scaling\": "
             "{\"original_max_position_embeddings\": 1, \"beta_fast\": 32, \"beta_slow\": 1}}", DSV4_ERR_CONFIG,
             "rope_scaling.factor");
  parse_case("H % o_groups", "{\"hidden_size\": 64, \"num_attention_heads\": 6, \"head_dim\": 32, "
             "\"qk_rope_head_dim\": 16, \"q_lora_rank\": 48, \"o_groups\": 4, \"o_lora_rank\": 24, "
             "\"sliding_window\": 16, \"compress_ratios\": [0]}", DSV4_ERR_CONFIG, "o_groups");
  parse_case("odd rope dim", "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32, "
             "\"qk_rope_head_dim\": 15, \"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, "
             "\"sliding_window\": 16, \"compress_ratios\": [0]}", DSV4_ERR_CONFIG, "qk_rope_head_dim");
  parse_case("rope dim above index_head_dim", "{" BASE ", \"compress_ratios\": [4], \"index_n_heads\": 2, "
             "\"index_head_dim\": 8, \"index_topk\": 4}", DSV4_ERR_CONFIG, "index_head_dim");
  parse_case("ratio 5", "{" BASE ", \"compress_ratios\": [0, 5]}", DSV4_ERR_CONFIG, "compress_ratios[1]");
  parse_case("fractional integer", "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32.5, "
             "\"qk_rope_head_dim\": 16, \"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, "
             "\"sliding_window\": 16, \"compress_ratios\": [0]}", DSV4_ERR_CONFIG, "head_dim");
  parse_case("negative window", "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32, "
             "\"qk_rope_head_dim\": 16, \"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, "
             "\"sliding_window\": -1, \"compress_ratios\": [0]}", DSV4_ERR_CONFIG, "sliding_window");
  parse_case("fewer ratios than layers", "{" BASE ", \"compress_ratios\": [0], \"num_hidden_layers\": 3}",
             DSV4_ERR_CONFIG, "num_hidden_layers");
  parse_case("bad loss mode", "{" BASE ", \"compress_ratios\": [0], \"index_loss_mode\": \"warm\"}", DSV4_ERR_CONFIG,
             "index_loss_mode");
  parse_case("not JSON", "{\"hidden_size\": ", DSV4_ERR_FORMAT, "JSON");
  parse_case("JSON array", "[1, 2]", DSV4_ERR_FORMAT, "object");
  tu_check(dsv4_config_load(&c, "/nonexistent/config.json") == DSV4_ERR_IO &&
               strstr(dsv4_last_error(), "/nonexistent/config.json"),
           "config missing file named in the error");
  tu_check(dsv4_config_ratio(&c, -1) == -1 && dsv4_config_ratio(&c, 1000) == -1, "config ratio of an absent layer");
  /* the planner counts a layer's weights without allocating them: the same count as the allocation */
  dsv4_config_preset(&c, "flash");
  for (int layer = 0; layer < 4; layer++) {
    dsv4_weights *w = NULL;
    int64_t counted = -1, allocated = -2;
    tu_ok(dsv4_weights_numel(&c, layer, &counted), "weights_numel");
    if (tu_ok(dsv4_weights_create(&w, &c, layer), "weights_create")) dsv4_weights_block(w, &allocated);
    tu_check(counted == allocated, "weights_numel of flash layer %d (ratio %d) = the allocation: %lld vs %lld", layer,
             dsv4_config_ratio(&c, layer), (long long)counted, (long long)allocated);
    dsv4_weights_free(w);
  }
  tu_check(dsv4_weights_numel(&c, 1000, &(int64_t){0}) == DSV4_ERR_ARG, "weights_numel of an absent layer fails");
}

static const tu_test TESTS[] = {
  {"config", "namings", test_namings},
  {"config", "v41", test_v41},
  {"config", "v4", test_v4},
};

int main(int argc, char **argv) { return tu_run(argc, argv, TESTS, (int)(sizeof TESTS / sizeof TESTS[0])); }
