/* fuzz_index.c: model.safetensors.index.json on arbitrary bytes: the index parser (weight_map,
 * shard paths kept inside the directory, duplicates) and the loader's name lookups on it. Shards
 * named by the input do not exist (or are the index itself): every lookup must fail cleanly. */
#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "model/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dsv4_weights *w;
  if (!w) {
    dsv4_config cfg;
    if (dsv4_config_preset(&cfg, "tiny") || dsv4_weights_create(&w, &cfg, 1)) abort();
  }
  const char *path = fuzz_file("model.safetensors.index.json", data, size);
  dsv4_ckpt *c = NULL;
  if (dsv4_ckpt_open(&c, path) == DSV4_OK) {
    dsv4_ckpt_tensor src[W_COUNT];
    int opened = 0;
    dsv4_ckpt_shards(c, &opened);
    if (dsv4_weights_locate(w, c, src) == DSV4_OK) dsv4_weights_read(w, src);
    dsv4_st_file *f;
    const dsv4_st_info *t;
    dsv4_ckpt_get(c, "layers.1.attn.wq_a.weight", &f, &t, NULL);
  }
  dsv4_ckpt_close(c);
  if (strchr(dsv4_last_error(), '\n')) abort();
  return 0;
}
