/* fuzz_packing.c: packing metadata (cu_seqlens, seqlens_real, batched, T) with CP ranks and split,
 * through the public entry points that validate it: dsv4_cp_shard_rows, dsv4_layer_flops and the
 * CP planner. Whatever the rules are, bad metadata must be refused with a message, never crash, and
 * metadata accepted must give rows inside [0, T).
 * Input layout: n_docs, flags (bit 0 cu_seqlens, 1 seqlens_real, 2 batched, 3 zigzag), size,
 * rank (signed), layer, T (int16), then int16 values for cu_seqlens and seqlens_real. */
#include "fuzz_util.h"
#include "dsv4cp.h"

#define MAX_DOCS 64
#define MAX_SIZE 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dsv4_config cfg = DSV4_CONFIG_INIT;
  if (!cfg.n_layers && dsv4_config_preset(&cfg, "tiny")) abort();
  uint8_t h[7] = {0};
  memcpy(h, data, size < 7 ? size : 7);
  const int n_docs = h[0] % MAX_DOCS, flags = h[1], N = h[2] % MAX_SIZE + 1, rank = (int8_t)h[3], layer = h[4] % 4;
  int32_t cu[MAX_DOCS + 1], real[MAX_DOCS];
  size_t at = 7;
  for (int i = 0; i < 2 * n_docs + 1; i++, at += 2) {
    int16_t v = 0;
    if (at + 2 <= size) memcpy(&v, data + at, 2);
    if (i <= n_docs) cu[i] = v;
    else real[i - n_docs - 1] = v;
  }
  int16_t T16;
  memcpy(&T16, h + 5, 2);
  const dsv4_packing pk = {DSV4_HEAD(dsv4_packing), .cu_seqlens = flags & 1 ? cu : NULL, .seqlens_real = flags & 2 ? real : NULL,
                           .n_docs = n_docs, .T = T16, .batched = (flags >> 2) & 1};
  const dsv4_cp_config cp = {DSV4_HEAD(dsv4_cp_config), .split = flags & 8 ? DSV4_SPLIT_ZIGZAG : DSV4_SPLIT_CONTIGUOUS};
  /* dsv4_layer_flops validates the whole packing (documents, T); dsv4_cp_shard_rows only the split.
   * Rows are checked against T where both accepted the metadata. */
  dsv4_flops fl = DSV4_FLOPS_INIT;
  const int valid = dsv4_layer_flops(&cfg, layer, &pk, &fl) == DSV4_OK;
  int64_t n = -1;
  if (dsv4_cp_shard_rows(&pk, &cp, rank, N, NULL, &n) == DSV4_OK && valid) {
    if (n < 0 || n > pk.T) abort();
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)(n + 1)), n2 = -1;
    if (dsv4_cp_shard_rows(&pk, &cp, rank, N, rows, &n2) != DSV4_OK || n2 != n) abort();
    for (int64_t i = 0; i < n; i++)
      if (rows[i] < 0 || rows[i] >= pk.T) abort();
    free(rows);
  }
  dsv4_cp_stats st = DSV4_CP_STATS_INIT;
  dsv4_memory_plan mp = DSV4_MEMORY_PLAN_INIT;
  const dsv4_plan_opts po = {DSV4_HEAD(dsv4_plan_opts), .threads = 1};
  if (rank >= 0 && rank < N) {
    dsv4_cp_plan_traffic(&cfg, layer, &pk, &cp, rank, N, &st);
    dsv4_cp_plan_memory(&cfg, layer, &pk, &cp, &po, rank, N, &mp);
  }
  if (strchr(dsv4_last_error(), '\n')) abort();
  return 0;
}
