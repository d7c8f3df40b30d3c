/* cmd_plan.c: `dsv4cp plan`: cluster sizing from the formulas of docs/cp.md evaluated on the actual
 * layouts, for one layer of each kind (or --layer): bytes each rank sends and receives per message
 * kind in one forward + backward (min / mean / max over ranks, what the benchmark measures
 * exactly), the work its rows give it (dsv4_cp_plan_flops: how evenly the split shares it; under
 * CSA the attention rows moved to even it out, dsv4_cp_plan_offload), and
 * what a rank holds in memory (weights, gradients, saved activations with their replicated
 * compressed part, transient buffers, the caller's inputs and outputs). --json writes every rank's
 * numbers; --memory-budget answers the longest sequence that fits. Runs on one process for any
 * number of ranks. */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"

/* "254.0 KiB", "1.95 GiB": at most 10 characters. */
static const char *fmt_bytes(double b, char *buf, size_t cap) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024.0 && u < 5) b /= 1024.0, u++;
  if (u == 0) snprintf(buf, cap, "%.0f B", b);
  else snprintf(buf, cap, b < 10 ? "%.2f %s" : b < 100 ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

/* min / mean / max FLOPs in the unit that keeps the largest under 1000 (GFLOP and up: a layer's
 * work), and max / mean. */
static const char *fmt_flops3(double lo, double sum, double hi, int n, char *buf, size_t cap) {
  static const char *unit[] = {"GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  double s = 1e9;
  int u = 0;
  for (; hi / s >= 1000 && u < 3; u++) s *= 1000;
  snprintf(buf, cap, "%.3g / %.3g / %.3g %s, max / mean %.3f", lo / s, sum / n / s, hi / s, unit[u],
           sum > 0 ? hi / (sum / n) : 1.0);
  return buf;
}

/* "80G", "141GiB", "512M", "1T", plain bytes: powers of 1024. Returns 0 on a bad value. */
static uint64_t parse_size(const char *s) {
  char *end = NULL;
  const double v = strtod(s, &end);
  if (end == s || !(v > 0)) return 0;
  double mult = 1;
  switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1024.0, end++; break;
    case 'M': mult = 1048576.0, end++; break;
    case 'G': mult = 1073741824.0, end++; break;
    case 'T': mult = 1099511627776.0, end++; break;
    default: break;
  }
  if (!strcmp(end, "iB") || !strcmp(end, "B") || !strcmp(end, "ib") || !strcmp(end, "b")) end += strlen(end);
  if (*end) return 0;
  return (uint64_t)(v * mult);
}

typedef struct {
  const dsv4_config *cfg;
  dsv4_cp_config cp;
  dsv4_plan_opts opts;
  int N;
  FILE *json;
} plan_run;

/* "SWA", "CSA", "HCA"; V4.1: "window", "kv source", "reindex", "reuse". */
static const char *kind_name(const dsv4_config *cfg, int layer) {
  const int r = dsv4_config_ratio(cfg, layer);
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  if (!cfg->v41 || dsv4_config_layer(cfg, layer, &in) != DSV4_OK) return r == 0 ? "SWA" : r == 4 ? "CSA" : "HCA";
  static const char *ROLE[] = {"window", "own", "kv source", "reindex", "reuse"};
  return ROLE[in.role];
}

/* What a source group holds and sends together (--layers): every layer's activations and shared
 * entries live until the backward, the transient buffers of one layer at a time. */
typedef struct {
  double sent_max;          /* sum over layers of the largest rank's bytes sent */
  uint64_t weights, saved, shared, transient, io;
} group_sum;

/* The largest memory plan over ranks (by total) for a packing. */
static dsv4_status worst_rank(const plan_run *pr, int layer, const dsv4_packing *pk, dsv4_memory_plan *worst,
                              int *which) {
  dsv4_status rc = DSV4_OK;
  *worst = (dsv4_memory_plan)DSV4_MEMORY_PLAN_INIT;
  for (int q = 0; q < pr->N; q++) {
    dsv4_memory_plan m = DSV4_MEMORY_PLAN_INIT;
    if ((rc = dsv4_cp_plan_memory(pr->cfg, layer, pk, &pr->cp, &pr->opts, q, pr->N, &m)) != DSV4_OK) return rc;
    if (m.total > worst->total) *worst = m, *which = q;
  }
  return rc;
}

/* Longest single sequence (a multiple of the split's pieces) whose worst rank fits the budget. */
static dsv4_status longest_fit(const plan_run *pr, int layer, uint64_t budget, int64_t *best) {
  dsv4_status rc = DSV4_OK;
  const int64_t pieces = pr->cp.split == DSV4_SPLIT_ZIGZAG ? 2 * pr->N : pr->N;
  int64_t lo = 0, hi = 1; /* in units of pieces; lo fits (0 = nothing), hi does not */
  int32_t cu[2] = {0, 0};
  dsv4_packing pk = {DSV4_HEAD(dsv4_packing), .cu_seqlens = cu, .n_docs = 1};
  for (;;) { /* grow hi until it does not fit (or int32 tokens) */
    if (hi * pieces > INT32_MAX) {
      hi = INT32_MAX / pieces + 1;
      break;
    }
    cu[1] = (int32_t)(hi * pieces), pk.T = hi * pieces;
    dsv4_memory_plan m = DSV4_MEMORY_PLAN_INIT;
    int q;
    if ((rc = worst_rank(pr, layer, &pk, &m, &q)) != DSV4_OK) return rc;
    if (m.total > budget) break;
    lo = hi, hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    cu[1] = (int32_t)(mid * pieces), pk.T = mid * pieces;
    dsv4_memory_plan m = DSV4_MEMORY_PLAN_INIT;
    int q;
    if ((rc = worst_rank(pr, layer, &pk, &m, &q)) != DSV4_OK) return rc;
    if (m.total <= budget) lo = mid; else hi = mid;
  }
  *best = lo * pieces;
  return rc;
}

static void json_layer(const plan_run *pr, int layer, int r, const dsv4_cp_stats *st, const dsv4_memory_plan *mem,
                       const dsv4_flops *fl, const dsv4_cp_offload *off, int first) {
  FILE *f = pr->json;
  fprintf(f, "%s{\"layer\": %d, \"ratio\": %d, \"kind\": \"%s\", \"per_rank\": [", first ? "" : ", ", layer, r,
          kind_name(pr->cfg, layer));
  for (int q = 0; q < pr->N; q++) {
    fprintf(f, "%s{\"rank\": %d, \"messages\": {", q ? ", " : "", q);
    for (int k = 0, n = 0; k < DSV4_MSG_KINDS; k++) {
      if (!st[q].messages[k] && !st[q].bytes_sent[k] && !st[q].bytes_recv[k]) continue;
      fprintf(f, "%s\"%s\": {\"bytes_sent\": %" PRIu64 ", \"bytes_recv\": %" PRIu64 ", \"messages\": %" PRIu64 "}",
              n++ ? ", " : "", dsv4_msg_kind_name((dsv4_msg_kind)k), st[q].bytes_sent[k], st[q].bytes_recv[k],
              st[q].messages[k]);
    }
    const dsv4_memory_plan *m = &mem[q];
    fprintf(f, "}, \"memory\": {\"weights\": %" PRIu64 ", \"grads\": %" PRIu64 ", \"saved\": %" PRIu64
               ", \"replicated\": %" PRIu64 ", \"shared\": %" PRIu64 ", \"transient\": %" PRIu64 ", \"io\": %" PRIu64
               ", \"total\": %" PRIu64 "}, \"flops\": {\"fwd\": %.0f, \"bwd\": %.0f, \"attention\": %.0f}, "
               "\"offload\": {\"peer\": %d, \"heavy\": %s, \"rows\": %lld}}",
            m->weights, m->grads, m->saved, m->replicated, m->shared, m->transient, m->io, m->total, fl[q].fwd,
            fl[q].bwd, fl[q].attention_fwd + fl[q].attention_bwd, off[q].peer, off[q].heavy ? "true" : "false",
            (long long)off[q].rows);
  }
  fprintf(f, "]");
}

/* The attention rows the fast path moves (dsv4_cp_plan_offload): pairs, rows, and the pairs'
 * estimated work ratio (heavy / light) before and after the move. */
static void print_offload(const dsv4_cp_offload *off, int N) {
  int pairs = 0;
  int64_t rows = 0, most = 0;
  double before = 1, after = 1;
  for (int q = 0; q < N; q++) {
    const dsv4_cp_offload *o = &off[q];
    if (o->peer < 0 || !o->heavy) continue;
    pairs++, rows += o->rows, most = o->rows > most ? o->rows : most;
    const double b = o->work_heavy / o->work_light, a = (o->work_heavy - o->work_moved) / (o->work_light + o->work_moved);
    before = b > before ? b : before;
    after = (a > 1 ? a : 1 / a) > after ? (a > 1 ? a : 1 / a) : after;
  }
  if (!pairs) return;
  printf("  attention rows moved (fast path): %d pair%s, %lld rows (%lld at most); pairs' estimated work heavier / "
         "lighter %.3f -> %.3f\n", pairs, pairs > 1 ? "s" : "", (long long)rows, (long long)most, before, after);
}

/* One layer kind: message kinds (min / mean / max over ranks) and memory (the worst rank). */
static int plan_layer(cli_ctx *c, const plan_run *pr, int layer, const dsv4_packing *pk, uint64_t budget,
                      int first, group_sum *gs) {
  const int N = pr->N, r = dsv4_config_ratio(pr->cfg, layer);
  dsv4_cp_stats *st = calloc((size_t)N, sizeof *st);
  dsv4_memory_plan *mem = calloc((size_t)N, sizeof *mem);
  dsv4_flops *fl = calloc((size_t)N, sizeof *fl);
  dsv4_cp_offload *off = calloc((size_t)N, sizeof *off);
  char a[16], b[16], e[16], f[16], g[16], h[16];
  if (!st || !mem || !fl || !off) {
    free(st), free(mem), free(fl), free(off);
    return cli_lib(c, DSV4_ERR_NOMEM);
  }
  for (int q = 0; q < N; q++)
    st[q] = (dsv4_cp_stats)DSV4_CP_STATS_INIT, mem[q] = (dsv4_memory_plan)DSV4_MEMORY_PLAN_INIT,
    off[q] = (dsv4_cp_offload)DSV4_CP_OFFLOAD_INIT;
  int bad = cli_lib(c, dsv4_cp_plan_traffic_all_opts(pr->cfg, layer, pk, &pr->cp, &pr->opts, N, st));
  if (!bad) bad = cli_lib(c, dsv4_cp_plan_offload(pr->cfg, layer, pk, &pr->cp, N, off));
  int worst = 0;
  for (int q = 0; q < N && !bad; q++) {
    fl[q] = (dsv4_flops)DSV4_FLOPS_INIT;
    bad = cli_lib(c, dsv4_cp_plan_flops(pr->cfg, layer, pk, &pr->cp, q, N, &fl[q]));
    if (!bad) bad = cli_lib(c, dsv4_cp_plan_memory(pr->cfg, layer, pk, &pr->cp, &pr->opts, q, N, &mem[q]));
    if (!bad && mem[q].total > mem[worst].total) worst = q;
  }
  if (bad) goto done;
  printf("\nlayer %d: %s (compress ratio %d), per rank, one forward + backward\n", layer, kind_name(pr->cfg, layer), r);
  double smax_all = 0;
  for (int q = 0; q < N; q++) {
    double s = 0;
    for (int k = 0; k < DSV4_MSG_KINDS; k++) s += (double)st[q].bytes_sent[k];
    smax_all = s > smax_all ? s : smax_all;
  }
  if (N > 1) {
    printf("  %-20s %34s  %34s  %9s\n", "message kind", "sent: min / mean / max", "received: min / mean / max",
           "messages");
    for (int k = 0; k < DSV4_MSG_KINDS; k++) {
      double smin = 1e300, smax = 0, ssum = 0, rmin = 1e300, rmax = 0, rsum = 0, msum = 0;
      for (int q = 0; q < N; q++) {
        const double s = (double)st[q].bytes_sent[k], rv = (double)st[q].bytes_recv[k];
        smin = s < smin ? s : smin, smax = s > smax ? s : smax, ssum += s;
        rmin = rv < rmin ? rv : rmin, rmax = rv > rmax ? rv : rmax, rsum += rv;
        msum += (double)st[q].messages[k];
      }
      if (msum == 0 && smax == 0) continue;
      char sent[64], recv[64];
      snprintf(sent, sizeof sent, "%s / %s / %s", fmt_bytes(smin, a, 16), fmt_bytes(ssum / N, b, 16), fmt_bytes(smax, e, 16));
      snprintf(recv, sizeof recv, "%s / %s / %s", fmt_bytes(rmin, f, 16), fmt_bytes(rsum / N, g, 16), fmt_bytes(rmax, h, 16));
      printf("  %-20s %34s  %34s  %9.1f\n", dsv4_msg_kind_name((dsv4_msg_kind)k), sent, recv, msum / N);
    }
  }
  if (N > 1) { /* the FLOP formula over each rank's rows: how evenly the split shares the work */
    double fmin_ = 1e300, fmax_ = 0, fsum = 0, amin = 1e300, amax = 0, asum = 0;
    for (int q = 0; q < N; q++) {
      const double w = fl[q].fwd + fl[q].bwd, at = fl[q].attention_fwd + fl[q].attention_bwd;
      fmin_ = w < fmin_ ? w : fmin_, fmax_ = w > fmax_ ? w : fmax_, fsum += w;
      amin = at < amin ? at : amin, amax = at > amax ? at : amax, asum += at;
    }
    char wk[80], at[80];
    printf("  work per rank (FLOP formula): %s; attention %s\n", fmt_flops3(fmin_, fsum, fmax_, N, wk, sizeof wk),
           fmt_flops3(amin, asum, amax, N, at, sizeof at));
    print_offload(off, N);
  }
  const dsv4_memory_plan *m = &mem[worst];
  if (pr->cfg->v41)
    printf("  memory (rank %d, the largest): weights %s + gradients %s + saved activations %s\n", worst,
           fmt_bytes((double)m->weights, a, 16), fmt_bytes((double)m->grads, b, 16), fmt_bytes((double)m->saved, e, 16));
  else
    printf("  memory (rank %d, the largest): weights %s + gradients %s + saved activations %s (of which replicated "
           "compressed %s)\n", worst, fmt_bytes((double)m->weights, a, 16), fmt_bytes((double)m->grads, b, 16),
           fmt_bytes((double)m->saved, e, 16), fmt_bytes((double)m->replicated, f, 16));
  if (m->shared)
    printf("                              + shared state %s (the group's global compressed kv and keys with their "
           "gradient sums, replicated %s; this rank's top-k)\n",
           fmt_bytes((double)m->shared, a, 16), fmt_bytes((double)m->replicated, b, 16));
  printf("                              + transient %s + inputs/outputs %s = %s\n", fmt_bytes((double)m->transient, a, 16),
         fmt_bytes((double)m->io, b, 16), fmt_bytes((double)m->total, e, 16));
  gs->sent_max += smax_all;
  gs->weights += m->weights + m->grads, gs->saved += m->saved, gs->shared += m->shared, gs->io += m->io;
  gs->transient = m->transient > gs->transient ? m->transient : gs->transient;
  int64_t fit = -1;
  if (budget) {
    if ((bad = cli_lib(c, longest_fit(pr, layer, budget, &fit)))) goto done;
    printf("  longest sequence within %s per rank at N = %d: %lld tokens%s\n", fmt_bytes((double)budget, a, 16), N,
           (long long)fit, fit == 0 ? " (even the smallest does not fit)" : "");
  }
  if (pr->json) {
    json_layer(pr, layer, r, st, mem, fl, off, first);
    if (budget) fprintf(pr->json, ", \"memory_budget\": %" PRIu64 ", \"longest_fit_tokens\": %lld", budget, (long long)fit);
    fprintf(pr->json, "}");
  }
done:
  free(st);
  free(mem);
  free(fl);
  free(off);
  return bad;
}

int cmd_plan(cli_ctx *c, int argc, char **argv) {
  static const char *USAGE =
      "usage: dsv4cp plan (--preset NAME | --config config.json) [--seq S] [--batch B] [--ranks N]\n"
      "                   [--layer L | --layers A-B]\n"
      "                   [--split contiguous|zigzag] [--recompute] [--threads T] [--json FILE] [--memory-budget SIZE]\n"
      "\n"
      "Sizes a cluster for one layer of each kind in the config (or --layer): per rank, the bytes sent and\n"
      "received per message kind in one forward + backward with CP = N (min / mean / max over ranks), the\n"
      "work each rank's rows give it (the FLOP formula of docs/perf.md; max / mean is how evenly the split\n"
      "shares it; under CSA, the attention rows the fast path moves between ranks to even it out), and the\n"
      "memory of the largest rank: weights, gradients, saved activations (and their\n"
      "replicated compressed part, which grows with the sequence, not with the shard), transient buffers\n"
      "and the caller's inputs/outputs. Formulas of docs/cp.md on the actual layout; one process, any N.\n"
      "--layers A-B plans every layer of a (V4.1 source) group and their sum: activations and shared\n"
      "state of every layer live until the backward, transient buffers one layer at a time.";
  const char *config = NULL, *preset = NULL, *seq = NULL, *batch = NULL, *ranks_s = NULL, *layer_s = NULL;
  const char *layers_s = NULL;
  const char *split = NULL, *threads_s = NULL, *json = NULL, *budget_s = NULL;
  int recompute = 0;
  const cli_opt opts[] = {
      {"preset", "NAME", "built-in config: flash (default), pro, tiny, flash41 or tiny41", &preset, NULL},
      {"config", "FILE", "Hugging Face style config.json instead of --preset", &config, NULL},
      {"seq", "S", "tokens per sequence (default 4096)", &seq, NULL},
      {"batch", "B", "B sequences of --seq tokens (default 1)", &batch, NULL},
      {"ranks", "N", "CP ranks (default 2)", &ranks_s, NULL},
      {"layer", "L", "plan this layer only (default: the first layer of each kind)", &layer_s, NULL},
      {"layers", "A-B", "plan layers A..B and their sum (a V4.1 source group)", &layers_s, NULL},
      {"split", "MODE", "CP split: contiguous (default) or zigzag", &split, NULL},
      {"recompute", NULL, "the layer recomputes q and o in the backward (keeps fewer activations)", NULL, &recompute},
      {"threads", "T", "OpenMP threads per rank, for per-thread scratch (default 1)", &threads_s, NULL},
      {"json", "FILE", "write every rank's numbers as JSON", &json, NULL},
      {"memory-budget", "SIZE", "also the longest sequence whose largest rank fits SIZE (e.g. 80G, 141GiB)",
       &budget_s, NULL},
      {0}};
  const int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  int64_t N = 2, S = 4096, B = 1, layer = -1, last = -1, threads = 1;
  uint64_t budget = 0;
  dsv4_cp_config cp = DSV4_CP_CONFIG_INIT;
  dsv4_config cfg = DSV4_CONFIG_INIT;
  if (p == 0) {
    job_opts jo = {.seq = seq, .batch = batch, .split = split};
    if (ranks_s) cli_int(c, "ranks", ranks_s, 1, 1 << 20, &N);
    if (threads_s) cli_int(c, "threads", threads_s, 1, 4096, &threads);
    if (budget_s && !(budget = parse_size(budget_s)))
      cli_error(c, "--memory-budget: '%s' is not a size such as 80G or 141GiB", budget_s);
    if (config && preset) cli_error(c, "--config and --preset: give one of them");
    if (!c->err[0]) job_parse_shape(c, &jo, &S, &B);
    if (!c->err[0]) job_parse_split(c, &jo, &cp);
    if (!c->err[0]) cli_lib(c, config ? dsv4_config_load(&cfg, config) : dsv4_config_preset(&cfg, preset ? preset : "flash"));
    if (!c->err[0] && layer_s) cli_int(c, "layer", layer_s, 0, cfg.n_layers - 1, &layer);
    if (!c->err[0] && layers_s) {
      long long a = -1, b = -1;
      char tail = 0;
      if (layer_s) cli_error(c, "--layer and --layers cannot both be given");
      else if (sscanf(layers_s, "%lld-%lld%c", &a, &b, &tail) != 2 || a < 0 || b < a || b >= cfg.n_layers)
        cli_error(c, "--layers: '%s' is not A-B with 0 <= A <= B < %d", layers_s, cfg.n_layers);
      layer = a, last = b;
    }
  }
  if (cli_sync(c)) return 1;
  if (c->rank != 0) return cli_sync(c); /* rank 0 plans for all ranks */
  int32_t *cu = calloc((size_t)B + 1, sizeof(int32_t));
  if (!cu) return cli_lib(c, DSV4_ERR_NOMEM), cli_sync(c);
  for (int64_t b = 0; b <= B; b++) cu[b] = (int32_t)(b * S);
  const dsv4_packing pk = {DSV4_HEAD(dsv4_packing), .cu_seqlens = cu, .n_docs = (int)B, .T = S * B, .batched = B > 1};
  plan_run pr = {&cfg, cp, {DSV4_HEAD(dsv4_plan_opts), .recompute = recompute, .threads = (int)threads}, (int)N, NULL};
  if (json && !(pr.json = fopen(json, "w"))) cli_error(c, "--json: cannot write '%s'", json);
  if (!c->err[0]) {
    printf("plan: %s, T = %lld (%lld x %lld), CP = %lld, %s split, %s, %lld thread%s per rank\n",
           config ? config : preset ? preset : "flash", (long long)(S * B), (long long)B, (long long)S, (long long)N,
           cp.split == DSV4_SPLIT_ZIGZAG ? "zigzag" : "contiguous", recompute ? "recomputation" : "no recomputation",
           (long long)threads, threads > 1 ? "s" : "");
    if (pr.json)
      fprintf(pr.json, "{\"config\": \"%s\", \"T\": %lld, \"batch\": %lld, \"seq\": %lld, \"ranks\": %lld, "
                       "\"split\": \"%s\", \"recompute\": %s, \"threads\": %lld, \"layers\": [",
              config ? "file" : preset ? preset : "flash", (long long)(S * B), (long long)B, (long long)S, (long long)N,
              cp.split == DSV4_SPLIT_ZIGZAG ? "zigzag" : "contiguous", recompute ? "true" : "false", (long long)threads);
  }
  int failed = c->err[0] != 0, first = 1;
  group_sum gs = {0};
  if (last < 0 && layer >= 0) last = layer;
  for (int L = 0; L < cfg.n_layers && !failed; L++) {
    if (layer >= 0 && (L < layer || L > last)) continue;
    int seen = 0; /* default: the first layer of each kind (ratio and V4.1 role) */
    for (int i = 0; i < L && layer < 0 && !seen; i++)
      seen = cfg.compress_ratios[i] == cfg.compress_ratios[L] && !strcmp(kind_name(&cfg, i), kind_name(&cfg, L));
    if (seen || (cfg.v41 && cfg.n_hidden_layers > 0 && L >= cfg.n_hidden_layers)) continue; /* DSpark stages */
    failed = plan_layer(c, &pr, L, &pk, budget, first, &gs);
    first = 0;
  }
  if (!failed && last > layer) {
    char a[16], b[16], e[16], f[16], g[16], h[16];
    printf("\nlayers %lld-%lld together (one forward pass, backward in reverse), per rank:\n", (long long)layer,
           (long long)last);
    printf("  bytes sent (largest rank, per layer summed) %s\n", fmt_bytes(gs.sent_max, a, 16));
    printf("  memory: weights + gradients %s + saved activations %s + shared state %s + transient %s (one layer at a "
           "time)\n          + inputs/outputs %s = %s\n", fmt_bytes((double)gs.weights, a, 16),
           fmt_bytes((double)gs.saved, b, 16), fmt_bytes((double)gs.shared, e, 16),
           fmt_bytes((double)gs.transient, f, 16), fmt_bytes((double)gs.io, g, 16),
           fmt_bytes((double)(gs.weights + gs.saved + gs.shared + gs.transient + gs.io), h, 16));
  }
  if (pr.json) {
    fprintf(pr.json, "]}\n");
    if (fclose(pr.json) != 0) cli_error(c, "--json: error writing '%s'", json);
  }
  free(cu);
  return cli_sync(c);
}
