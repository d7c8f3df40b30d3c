/* fuzz_safetensors.c: the safetensors reader on arbitrary bytes: dsv4_st_open must either refuse
 * the file with an error or accept it, and then every tensor of a readable dtype must read (or
 * fail) without touching memory it should not; the same file as a one-file checkpoint goes through
 * the weight loader (layer prefixes, FP8 dequantisation with block scales) of a small config.
 * Oracles beyond "no crash": a file refused for its header length never has that length (the
 * file's first 8 bytes as a number) in the message; a layer that loads has only block scales that
 * are powers of two E8M0 could hold, whatever their dtype. */
#include <math.h>

#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "model/weights.h"

/* A small V4-shaped config with 4 x 4 FP8 blocks; layer 1 is CSA (every tensor kind), 3 is MTP. */
static const char *CONFIG =
    "{\"hidden_size\": 16, \"num_attention_heads\": 2, \"head_dim\": 8, \"qk_rope_head_dim\": 4, \"q_lora_rank\": 8,"
    " \"o_groups\": 1, \"o_lora_rank\": 4, \"sliding_window\": 4, \"index_n_heads\": 1, \"index_head_dim\": 8,"
    " \"index_topk\": 2, \"compress_ratios\": [0, 4, 128, 0], \"num_hidden_layers\": 3,"
    " \"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [4, 4]}}";

/* The first 8 bytes as the header length, if the message of a refused file shows it. Only lengths
 * of 7 digits or more are looked for: shorter ones could be digits of the scratch path. */
static void check_no_length_shown(const uint8_t *data, size_t size) {
  if (size < 8) return;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
  char num[24];
  snprintf(num, sizeof num, "%llu", (unsigned long long)hlen);
  if (hlen >= 1000000 && strstr(dsv4_last_error(), num)) abort();
}

/* Every scale of a layer that loaded is 2^k, -127 <= k <= 127 (checked on the file's own values). */
static void check_scales(const dsv4_ckpt_tensor *src) {
  for (int i = 0; i < W_COUNT; i++) {
    const dsv4_st_info *s = src[i].scale;
    if (!s || s->dtype == DSV4_DT_F8_E8M0) continue;
    float *v = malloc(sizeof(float) * (size_t)(s->numel + 1));
    if (!v || dsv4_st_read_f32(src[i].scale_file, s, v) != DSV4_OK) abort();
    for (int64_t k = 0; k < s->numel; k++) {
      int e;
      const float m = frexpf(v[k], &e); /* v = m 2^e, m in [0.5, 1): a power of two has m = 0.5 */
      if (m != 0.5f || e - 1 < -127 || e - 1 > 127) abort();
    }
    free(v);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dsv4_weights *w[2];
  if (!w[0]) {
    dsv4_config cfg = DSV4_CONFIG_INIT;
    if (dsv4_config_parse(&cfg, CONFIG) || dsv4_weights_create(&w[0], &cfg, 1) || dsv4_weights_create(&w[1], &cfg, 3))
      abort();
  }
  const char *path = fuzz_file("x.safetensors", data, size);
  dsv4_st_file *f = NULL;
  if (dsv4_st_open(&f, path) != DSV4_OK) check_no_length_shown(data, size);
  if (f) {
    for (int i = 0; i < dsv4_st_count(f); i++) {
      const dsv4_st_info *t = dsv4_st_at(f, i);
      const uint64_t bytes = t->end - t->begin;
      void *buf = malloc(bytes / 2 * 4 + 8); /* room for fp32 from 2-byte elements too */
      uint8_t one[1];
      if (t->dtype == DSV4_DT_I32 || t->dtype == DSV4_DT_I64) dsv4_st_read_i32(f, t, buf);
      else dsv4_st_read_f32(f, t, buf);
      if (bytes) dsv4_st_read_bytes(f, t, bytes - 1, one, 1);
      dsv4_st_read_bytes(f, t, bytes, one, 1); /* past the end: refused */
      free(buf);
      dsv4_st_find(f, t->name);
    }
    dsv4_st_close(f);
  }
  for (int k = 0; k < 2; k++) {
    dsv4_ckpt *c = NULL;
    dsv4_ckpt_tensor src[W_COUNT] = {0}; /* entries past the layer's tensors stay empty */
    if (dsv4_ckpt_open(&c, path) == DSV4_OK && dsv4_weights_locate(w[k], c, src) == DSV4_OK &&
        dsv4_weights_read(w[k], src) == DSV4_OK)
      check_scales(src);
    dsv4_ckpt_close(c);
  }
  return 0;
}
