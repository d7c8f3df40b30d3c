/* cmd_plan.c: `dsv4cp plan`: for a config, a length and N ranks, the bytes each rank sends and
 * receives per message kind in one layer forward + backward, and what each rank holds in memory,
 * per layer kind, computed on the host (docs/cp.md formulas evaluated on the actual layouts). The
 * benchmark checks that measured bytes equal these exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"

#define MiB (1024.0 * 1024.0)

/* One layer kind: the table of message kinds x ranks, then memory per rank. */
static int plan_layer(cli_ctx *c, const dsv4_config *cfg, int layer, const dsv4_packing *pk, const dsv4_cp_config *cp,
                      int N) {
  dsv4_cp_stats *st = calloc((size_t)N, sizeof *st);
  if (!st) return cli_lib(c, DSV4_ERR_NOMEM);
  for (int q = 0; q < N; q++)
    if (cli_lib(c, dsv4_cp_plan_traffic(cfg, layer, pk, cp, q, N, &st[q]))) {
      free(st);
      return 1;
    }
  const int r = dsv4_config_ratio(cfg, layer);
  printf("\nlayer %d (compress ratio %d): bytes per rank for one forward + backward (sent / received)\n", layer, r);
  printf("  %-22s", "message kind");
  for (int q = 0; q < N; q++) printf("   rank %-2d sent / recv   ", q);
  printf("\n");
  for (int k = 0; k < DSV4_MSG_KINDS; k++) {
    int any = 0;
    for (int q = 0; q < N; q++) any |= st[q].messages[k] > 0;
    if (!any) continue;
    printf("  %-22s", dsv4_msg_kind_name((dsv4_msg_kind)k));
    for (int q = 0; q < N; q++)
      printf(" %12llu / %-12llu", (unsigned long long)st[q].bytes_sent[k], (unsigned long long)st[q].bytes_recv[k]);
    printf("\n");
  }
  printf("  memory per rank: ");
  for (int q = 0; q < N; q++) {
    size_t wb = 0, sb = 0;
    if (cli_lib(c, dsv4_cp_plan_memory(cfg, layer, pk, cp, q, N, &wb, &sb))) break;
    printf("%srank %d: weights %.1f MiB + gradients %.1f MiB + saved activations %.1f MiB", q ? "; " : "", q, wb / MiB,
           wb / MiB, sb / MiB);
  }
  printf("\n");
  free(st);
  return c->err[0] != 0;
}

int cmd_plan(cli_ctx *c, int argc, char **argv) {
  static const char *USAGE =
      "usage: dsv4cp plan (--preset NAME | --config config.json) [--seq S] [--batch B] [--ranks N] [--layer L]\n"
      "\n"
      "Bytes each rank sends and receives per message kind in one layer forward + backward with CP = N,\n"
      "and the memory each rank holds, per layer kind (by default the first layer of each compress\n"
      "ratio in the config), from the formulas of docs/cp.md on the actual layout. Runs on one process.";
  job_opts o = {0};
  const char *ranks_s = NULL;
  cli_opt opts[24];
  int k = job_common_opts(&o, opts, JOB_CMD_PLAN);
  opts[k++] = (cli_opt){"ranks", "N", "CP ranks to plan for (default 2)", &ranks_s, NULL};
  opts[k] = (cli_opt){0};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  int64_t N = 2;
  if (p == 0 && ranks_s) cli_int(c, "ranks", ranks_s, 1, 1 << 16, &N);
  if (p == 0 && !o.preset && !o.config) o.preset = "flash";
  if (cli_sync(c)) return 1;
  if (c->rank != 0) return cli_sync(c); /* rank 0 plans for all ranks */
  /* the job machinery on one "rank": config and packing only (no weights needed) */
  dsv4_config cfg;
  if (o.preset ? cli_lib(c, dsv4_config_preset(&cfg, o.preset)) : cli_lib(c, dsv4_config_load(&cfg, o.config)))
    return cli_sync(c);
  int64_t S = 4096, B = 1, layer = -1;
  dsv4_cp_config cp = {DSV4_SPLIT_CONTIGUOUS, 1};
  if (job_parse_shape(c, &o, &S, &B) || job_parse_split(c, &o, &cp)) return cli_sync(c);
  if (o.layer && cli_int(c, "layer", o.layer, 0, cfg.n_layers - 1, &layer)) return cli_sync(c);
  int32_t *cu = calloc((size_t)B + 1, sizeof(int32_t));
  if (!cu) return cli_lib(c, DSV4_ERR_NOMEM), cli_sync(c);
  for (int64_t b = 0; b <= B; b++) cu[b] = (int32_t)(b * S);
  dsv4_packing pk = {cu, NULL, (int)B, S * B, B > 1};
  printf("plan: %s, T = %lld (%lld x %lld), CP = %lld, %s split\n", o.preset ? o.preset : o.config,
         (long long)(S * B), (long long)B, (long long)S, (long long)N,
         cp.split == DSV4_SPLIT_ZIGZAG ? "zigzag" : "contiguous");
  int failed = 0;
  for (int r = 0; r <= 128 && !failed; r = r ? r * 32 : 4) {
    int L = (int)layer;
    if (L < 0)
      for (int i = 0; i < cfg.n_layers && L < 0; i++)
        if (cfg.compress_ratios[i] == r) L = i;
    if (L < 0 || (layer >= 0 && cfg.compress_ratios[L] != r)) continue;
    failed = plan_layer(c, &cfg, L, &pk, &cp, (int)N);
  }
  free(cu);
  return cli_sync(c);
}
