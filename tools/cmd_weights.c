/* cmd_weights.c: `dsv4cp weights`: what one layer needs from a checkpoint. Without --weights, the
 * names and shapes a user must provide; with --weights, where each tensor is (shard, dtype, bytes,
 * FP8 scale), then the layer is loaded and checked as `run` would load it, with the time taken;
 * --export writes the dequantised fp32 tensors under the names they were read from. Rank 0 works;
 * the others only take part in the error check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_io.h"
#include "job.h"

#define MB 1e6
#define FP8_BLOCK_DEFAULT 128 /* dsv4_config.fp8_block 0 = not given = V4's 128 */

static const char *USAGE =
    "usage: dsv4cp weights (--config config.json | --preset NAME) (--layer L | --layers A-B)\n"
    "                      [--weights PATH] [--export out.safetensors]\n"
    "\n"
    "Lists every tensor layer L (or each layer of A..B) needs: a DeepSeek V4.1 layer only what its role\n"
    "reads. Without --weights: the names and shapes a checkpoint must provide.\n"
    "With --weights (a .safetensors file, a model.safetensors.index.json, or a directory holding one):\n"
    "for each tensor the name found, shape, dtype in the file, shard, bytes read and whether it is\n"
    "dequantised (FP8 E4M3 x block scale) or converted; then loads the layer as `run` does, checking every\n"
    "value, and prints the time. --export also writes the layer's fp32 tensors under those names.";

/* "CSA, compress ratio 4", "V4.1 reuse layer, compress ratio 2" ... */
static void kind_name(const dsv4_config *cfg, int layer, char *buf, size_t n) {
  const int r = dsv4_config_ratio(cfg, layer);
  dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
  if (cfg->v41 && dsv4_config_layer(cfg, layer, &in) == DSV4_OK) {
    static const char *ROLE[] = {"window only", "own", "kv source", "reindex layer", "reuse layer"};
    snprintf(buf, n, "V4.1 %s, compress ratio %d", ROLE[in.role], r);
    return;
  }
  snprintf(buf, n, "%s", r == 0 ? "SWA, sliding window only" : r == 4 ? "CSA, compress ratio 4" : "HCA, compress ratio 128");
}

/* Prints s escaped (names come from files) left-aligned in width columns. */
static void put(const char *s, int width) {
  char e[600];
  printf("%-*s", width, dsv4_escape(e, sizeof e, s));
}

/* The names a checkpoint must hold for this layer (nothing read). */
static void list_required(const dsv4_config *cfg, int layer, const dsv4_weights *w) {
  const int nh = cfg->n_hidden_layers, mtp = nh > 0 && layer >= nh && !cfg->v41;
  char prefix[48], shape[64], sshape[64], name[160], kind[64];
  kind_name(cfg, layer, kind, sizeof kind);
  const int64_t b0 = cfg->fp8_block[0] > 0 ? cfg->fp8_block[0] : FP8_BLOCK_DEFAULT;
  const int64_t b1 = cfg->fp8_block[1] > 0 ? cfg->fp8_block[1] : FP8_BLOCK_DEFAULT;
  if (mtp) snprintf(prefix, sizeof prefix, "mtp.%d.", layer - nh);
  else snprintf(prefix, sizeof prefix, "layers.%d.", layer);
  printf("layer %d (%s%s): the tensors a checkpoint must provide\n", layer, kind, mtp ? ", the multi-token-prediction layer" : "");
  printf("(names may also start with \"model.\"; a one-layer file may use the names after \"%s\". 2-d weights\n"
         " may be F8_E4M3 with a block scale \"<name minus weight>scale\" or \"<name>_scale_inv\", F8_E8M0 or F32,\n"
         " %lld x %lld blocks)\n\n", prefix, (long long)b0, (long long)b1);
  printf("%-56s %-14s %s\n", "tensor", "shape", "dtype");
  int64_t params = 0;
  for (int i = 0; i < dsv4_weights_count(w); i++) {
    dsv4_tensor t = DSV4_TENSOR_INIT;
    dsv4_weights_get(w, i, &t);
    snprintf(name, sizeof name, "%s%s", prefix, t.name);
    dsv4_st_shape_str(shape, sizeof shape, t.shape, t.ndim);
    const int64_t ss[2] = {(t.shape[0] + b0 - 1) / b0, (t.shape[1] + b1 - 1) / b1};
    dsv4_st_shape_str(sshape, sizeof sshape, ss, 2);
    const int fp8_ok = t.ndim == 2 && strlen(t.name) > 6 && !strcmp(t.name + strlen(t.name) - 6, "weight");
    printf("%-56s %-14s F32, BF16 or F16%s%s\n", name, shape, fp8_ok ? "; or F8_E4M3 + scale " : "",
           fp8_ok ? sshape : "");
    params += t.numel;
  }
  printf("\n%d tensors, %lld parameters\n", dsv4_weights_count(w), (long long)params);
}

/* Where each tensor is in the checkpoint; returns the bytes the load reads. */
static uint64_t list_found(const dsv4_weight_source *src, int n) {
  char shape[64], sshape[64];
  int wn = 6, ws = 5;
  for (int i = 0; i < n; i++) {
    wn = (int)strlen(src[i].name) > wn ? (int)strlen(src[i].name) : wn;
    ws = (int)strlen(src[i].shard) > ws ? (int)strlen(src[i].shard) : ws;
  }
  wn = wn > 70 ? 70 : wn, ws = ws > 60 ? 60 : ws;
  printf("%-*s %-14s %-8s %-*s %12s  %s\n", wn, "tensor", "shape", "dtype", ws, "shard", "bytes", "as fp32");
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    const dsv4_weight_source *s = &src[i];
    put(s->name, wn);
    printf(" %-14s ", dsv4_st_shape_str(shape, sizeof shape, s->shape, s->ndim));
    put(s->dtype, 8);
    printf(" ");
    put(s->shard, ws);
    printf(" %12llu  ", (unsigned long long)s->bytes);
    if (s->scale_name) {
      printf("dequantised: x ");
      put(s->scale_name, 0);
      printf(" (");
      put(s->scale_dtype, 0);
      printf(" %s, %d x %d blocks%s", dsv4_st_shape_str(sshape, sizeof sshape, s->scale_shape, 2), s->block[0],
             s->block[1], strcmp(s->scale_shard, s->shard) ? ", in " : "");
      if (strcmp(s->scale_shard, s->shard)) put(s->scale_shard, 0);
      printf(")\n");
    } else {
      printf("%s\n", !strcmp(s->dtype, "F32") ? "as stored" : "converted exactly");
    }
    total += s->bytes;
  }
  return total;
}

/* Locates, lists, loads (timed) and optionally exports the layer; errors recorded in c. */
static void inspect(cli_ctx *c, dsv4_weights *w, const char *path, const char *export_path) {
  dsv4_checkpoint *ck = NULL;
  dsv4_st_writer *wr = NULL;
  char e[600];
  const int n = dsv4_weights_count(w);
  dsv4_weight_source *src = calloc((size_t)n + 1, sizeof *src);
  char (*names)[160] = calloc((size_t)n + 1, sizeof *names);
  if (!src || !names) {
    cli_error(c, "out of memory");
    goto done;
  }
  for (int i = 0; i < n; i++) src[i] = (dsv4_weight_source)DSV4_WEIGHT_SOURCE_INIT;
  const double t0 = MPI_Wtime();
  if (cli_lib(c, dsv4_checkpoint_open(&ck, path)) || cli_lib(c, dsv4_checkpoint_locate(ck, w, src))) goto done;
  const double t1 = MPI_Wtime();
  int opened = 0;
  const int shards = dsv4_checkpoint_shards(ck, &opened);
  printf("checkpoint %s: %d shard%s, %d opened for this layer; ", dsv4_escape(e, sizeof e, dsv4_checkpoint_path(ck)),
         shards, shards == 1 ? "" : "s", opened);
  if (*dsv4_weights_prefix(w)) printf("names %sattn.*\n\n", dsv4_weights_prefix(w));
  else printf("short names (attn.*, no layer prefix)\n\n");
  const uint64_t bytes = list_found(src, n);
  fflush(stdout);
  const double t2 = MPI_Wtime();
  if (cli_lib(c, dsv4_checkpoint_read(ck, w))) goto done;
  const double t3 = MPI_Wtime();
  int64_t params = 0;
  for (int i = 0; i < n; i++) {
    dsv4_tensor t = DSV4_TENSOR_INIT;
    dsv4_weights_get(w, i, &t);
    params += t.numel;
  }
  printf("\n%d tensors, %lld parameters, %.1f MB read: loaded and checked in %.3f s (index and %d shard header%s "
         "%.3f s, data %.3f s = %.0f MB/s)\n", n, (long long)params, bytes / MB, (t1 - t0) + (t3 - t2), opened,
         opened == 1 ? "" : "s", t1 - t0, t3 - t2, t3 > t2 ? bytes / MB / (t3 - t2) : 0.0);
  if (!export_path) goto done;
  if (cli_lib(c, dsv4_st_writer_create(&wr))) goto done;
  for (int i = 0; i < n; i++) {
    dsv4_tensor t = DSV4_TENSOR_INIT;
    dsv4_weights_get(w, i, &t);
    snprintf(names[i], sizeof names[i], "%s%s", dsv4_weights_prefix(w), t.name);
    if (cli_lib(c, dsv4_st_writer_add(wr, names[i], DSV4_DT_F32, t.ndim, t.shape, t.data))) goto done;
  }
  if (!cli_lib(c, dsv4_st_writer_save(wr, export_path)))
    printf("wrote %s (%d fp32 tensors)\n", dsv4_escape(e, sizeof e, export_path), n);
done:
  dsv4_st_writer_free(wr);
  dsv4_checkpoint_close(ck);
  free(src);
  free(names);
}

int cmd_weights(cli_ctx *c, int argc, char **argv) {
  const char *config = NULL, *preset = NULL, *layer_s = NULL, *layers_s = NULL, *weights = NULL, *export_path = NULL;
  const cli_opt opts[] = {
      {"config", "FILE", "config.json (released HF names or DeepSeek's ModelArgs names)", &config, NULL},
      {"preset", "NAME", "built-in config instead of --config: flash, pro, tiny, flash41 or tiny41", &preset, NULL},
      {"layer", "L", "layer index (V4: num_hidden_layers + i is the MTP layer mtp.i) (this or --layers)", &layer_s,
       NULL},
      {"layers", "A-B", "every layer of A..B (a V4.1 source group)", &layers_s, NULL},
      {"weights", "PATH", "checkpoint: .safetensors, model.safetensors.index.json or a directory", &weights, NULL},
      {"export", "FILE", "write the layer's dequantised fp32 tensors here (needs --weights)", &export_path, NULL},
      {0}};
  int p = cli_parse(c, argc, argv, 2, opts, USAGE);
  if (p == 1) return 0;
  dsv4_config cfg = DSV4_CONFIG_INIT;
  int64_t layer = -1, last = -1;
  if (p == 0 && !config == !preset) cli_error(c, "give exactly one of --config and --preset");
  if (!c->err[0]) cli_lib(c, preset ? dsv4_config_preset(&cfg, preset) : dsv4_config_load(&cfg, config));
  if (!c->err[0] && !layer_s == !layers_s)
    cli_error(c, layer_s ? "--layer and --layers cannot both be given" : "--layer (or --layers) is required");
  if (!c->err[0] && layer_s && !cli_int(c, "layer", layer_s, 0, cfg.n_layers - 1, &layer)) last = layer;
  if (!c->err[0] && layers_s) {
    long long a = -1, b = -1;
    char tail = 0;
    if (sscanf(layers_s, "%lld-%lld%c", &a, &b, &tail) != 2 || a < 0 || b < a || b >= cfg.n_layers)
      cli_error(c, "--layers: '%s' is not A-B with 0 <= A <= B < %d", layers_s, cfg.n_layers);
    layer = a, last = b;
  }
  if (!c->err[0] && export_path && !weights) cli_error(c, "--export needs --weights (the checkpoint to read)");
  if (!c->err[0] && export_path && last > layer) cli_error(c, "--export writes one layer: use --layer");
  if (!c->err[0] && export_path) job_check_output_path(c, "--export", export_path);
  if (cli_sync(c)) return 1;
  for (int64_t L = layer; c->rank == 0 && L <= last && !c->err[0]; L++) {
    dsv4_weights *w = NULL;
    if (L > layer) printf("\n");
    if (!cli_lib(c, dsv4_weights_create(&w, &cfg, (int)L))) {
      if (weights) inspect(c, w, weights, export_path);
      else list_required(&cfg, (int)L, w);
    }
    dsv4_weights_free(w);
    fflush(stdout);
  }
  return cli_sync(c);
}
