/* shard.c: the split of the token stream over ranks.
 * Units: the whole stream, or (batched input) each sequence. Each unit is cut into `size` equal
 * slices (contiguous) or 2 size equal chunks of which rank q takes q and 2 size - 1 - q (zigzag:
 * early chunks see few compressed slots, late ones many, so each rank gets one of each).
 * Worked example, T = 16, size = 2, zigzag: chunks of 4; rank 0 holds [0,4) and [12,16), rank 1
 * holds [4,8) and [8,12). Contiguous: rank 0 [0,8), rank 1 [8,16). */
#include "shard.h"

#include "util/abi.h"
#include "util/err.h"

dsv4_status dsv4_shard_segments(const dsv4_packing *pk, dsv4_split split, int rank, int size, dsv4_range **segs,
                                int *n_seg) {
  dsv4_status rc = DSV4_OK;
  *segs = NULL;
  *n_seg = 0;
  DSV4_CHECK(pk && size >= 1 && rank >= 0 && rank < size, DSV4_ERR_ARG, "shard: bad rank %d of %d", rank, size);
  DSV4_CHECK(split == DSV4_SPLIT_CONTIGUOUS || split == DSV4_SPLIT_ZIGZAG, DSV4_ERR_ARG,
             "shard: unknown split %d", (int)split);
  DSV4_CHECK(pk->T > 0, DSV4_ERR_ARG, "T must be positive (got %lld)", (long long)pk->T);
  int64_t units = 1, U = pk->T;
  if (pk->batched && pk->cu_seqlens && pk->n_docs > 1) {
    units = pk->n_docs;
    U = (int64_t)pk->cu_seqlens[1] - pk->cu_seqlens[0];
    DSV4_CHECK(pk->cu_seqlens[0] == 0 && U > 0, DSV4_ERR_ARG,
               "batched input: cu_seqlens must start at 0 with a positive sequence length (got %d, %d)",
               pk->cu_seqlens[0], pk->cu_seqlens[1]);
    for (int i = 0; i < pk->n_docs; i++)
      DSV4_CHECK((int64_t)pk->cu_seqlens[i + 1] - pk->cu_seqlens[i] == U, DSV4_ERR_ARG,
                 "batched input: sequence %d has length %lld, expected %lld", i,
                 (long long)pk->cu_seqlens[i + 1] - pk->cu_seqlens[i], (long long)U);
    DSV4_CHECK(units * U == pk->T, DSV4_ERR_ARG, "batched input: %lld sequences of %lld tokens, but T = %lld",
               (long long)units, (long long)U, (long long)pk->T);
  }
  if (size == 1) { /* one rank holds everything, whatever the split or batching: one run */
    DSV4_ALLOC(*segs, 1);
    (*segs)[0] = (dsv4_range){0, pk->T};
    *n_seg = 1;
    return DSV4_OK;
  }
  const int pieces = split == DSV4_SPLIT_ZIGZAG ? 2 * size : size;
  const char *what = units > 1 ? "the sequence length S" : "T";
  DSV4_CHECK(U % pieces == 0, DSV4_ERR_ARG,
             "%s = %lld cannot be split over %d CP ranks%s: it must be a multiple of %d (e.g. pad to %lld)", what,
             (long long)U, size, split == DSV4_SPLIT_ZIGZAG ? " with the zigzag split" : "", pieces,
             (long long)((U + pieces - 1) / pieces * pieces));
  const int64_t L = U / pieces;
  const int per_unit = split == DSV4_SPLIT_ZIGZAG ? 2 : 1;
  DSV4_ALLOC(*segs, units * per_unit);
  for (int64_t u = 0; u < units; u++) {
    const int64_t base = u * U;
    if (split == DSV4_SPLIT_CONTIGUOUS) {
      (*segs)[u] = (dsv4_range){base + rank * L, L};
    } else {
      (*segs)[2 * u] = (dsv4_range){base + rank * L, L};
      (*segs)[2 * u + 1] = (dsv4_range){base + (2 * (int64_t)size - 1 - rank) * L, L};
    }
  }
  *n_seg = (int)(units * per_unit);
fail:
  return rc;
}

dsv4_status dsv4_cp_shard_rows(const dsv4_packing *pk, const dsv4_cp_config *cfg, int rank, int size,
                               int64_t *rows, int64_t *n) {
  static const dsv4_cp_config cp_defaults = DSV4_CP_CONFIG_INIT;
  dsv4_status rc = DSV4_OK;
  dsv4_range *segs = NULL;
  dsv4_packing p;
  dsv4_cp_config cp = cp_defaults;
  int ns = 0;
  DSV4_CHECK(n, DSV4_ERR_ARG, "shard rows: NULL n");
  DSV4_TRY(DSV4_STRUCT_IN(&p, pk, dsv4_packing, NULL));
  if (cfg) DSV4_TRY(DSV4_STRUCT_IN(&cp, cfg, dsv4_cp_config, &cp_defaults));
  DSV4_TRY(dsv4_shard_segments(&p, cp.split, rank, size, &segs, &ns));
  int64_t k = 0;
  for (int s = 0; s < ns; s++)
    for (int64_t i = 0; i < segs[s].len; i++, k++)
      if (rows) rows[k] = segs[s].g0 + i;
  *n = k;
fail:
  free(segs);
  return rc;
}
