/* test_config.c: presets, config.json parsing (required keys, defaults, rope_scaling forms) and
 * validation errors that name the key. */
#include <string.h>

#include "model/weights.h"
#include "testutil.h"

#define BASE                                                                                          \
  "\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 32, \"qk_rope_head_dim\": 16, "   \
  "\"q_lora_rank\": 48, \"o_groups\": 2, \"o_lora_rank\": 24, \"sliding_window\": 16"
#define INDEX "\"index_n_heads\": 2, \"index_head_dim\": 32, \"index_topk\": 8"

/* Parses text; expects status want and (on error) a message containing needle. */
static void parse_case(const char *what, const char *text, dsv4_status want, const char *needle) {
  dsv4_config c;
  dsv4_status st = dsv4_config_parse(&c, text);
  tu_check(st == want && (want == DSV4_OK || strstr(dsv4_last_error(), needle)), "config %s -> %s (%s)", what,
           dsv4_status_string(st), st == DSV4_OK ? "ok" : dsv4_last_error());
}

int main(void) {
  dsv4_config c;
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
  return tu_finish();
}
