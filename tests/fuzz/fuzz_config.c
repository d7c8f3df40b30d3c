/* fuzz_config.c: config.json parsing on arbitrary text (both namings, quantization_config, every
 * number range-checked): a parse either fails with a message or gives a config that validates,
 * whose every layer's weight count is computed without overflow. */
#include "fuzz_util.h"
#include "model/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  dsv4_config cfg = DSV4_CONFIG_INIT;
  if (dsv4_config_parse(&cfg, text) == DSV4_OK) {
    if (dsv4_config_validate(&cfg) != DSV4_OK) abort(); /* parse returns only valid configs */
    for (int layer = 0; layer < cfg.n_layers; layer++) {
      int64_t n = 0;
      if (dsv4_weights_numel(&cfg, layer, &n) != DSV4_OK || n <= 0) abort();
    }
  }
  if (strchr(dsv4_last_error(), '\n')) abort(); /* messages are one line */
  free(text);
  return 0;
}
