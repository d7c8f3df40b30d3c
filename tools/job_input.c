/* job_input.c: what a job reads: its options, the config, the weights (a checkpoint or seeded
 * random), the input's global meta (shape of x, cu_seqlens, seqlens_real, or seeded random
 * documents), this rank's shard of the rows, and this rank's rows of x and dout (byte ranges of the
 * files, or seeded random rows), every size checked before it is read. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_io.h"
#include "job.h"

#define DEFAULT_SEQ 256
#define DSV4_XSTR(v) #v
#define DSV4_STR(v) DSV4_XSTR(v)
#define RANDOM_X_STREAM "input.x"
#define RANDOM_DOUT_STREAM "input.dout"
#define RANDOM_DOCS_STREAM "input.doc_lengths"

int job_common_opts(job_opts *o, cli_opt *opts, job_cmd cmd) {
  const int bench = cmd == JOB_CMD_BENCH;
  int n = 0;
  opts[n++] = (cli_opt){"config", "FILE",
                        bench ? "Hugging Face style config.json (default: --preset flash)"
                              : "Hugging Face style config.json (required unless --preset)",
                        &o->config, NULL};
  opts[n++] = (cli_opt){"preset", "NAME",
                        bench ? "built-in config instead of --config: flash (default), pro, tiny, flash41 or tiny41"
                              : "built-in config instead of --config: flash, pro, tiny, flash41 or tiny41",
                        &o->preset, NULL};
  opts[n++] = (cli_opt){"layer", "L", "layer index; its compress ratio picks the layer kind (this or --layers)",
                        &o->layer, NULL};
  opts[n++] = (cli_opt){"layers", "A-B", "layers A..B in order with one shared state (V4.1 source groups; tensors "
                        "x.{L}, dout.{L}, out.{L}, ...)", &o->layers, NULL};
  opts[n++] = (cli_opt){"weights", "PATH", "the layer's tensors: .safetensors, model.safetensors.index.json or "
                        "a directory holding one (default: random from --seed)",
                        &o->weights, NULL};
  opts[n++] = (cli_opt){"input", "FILE", "x [T, d] (+ cu_seqlens, seqlens_real) or x [B, S, d], F32, BF16 or F16 "
                        "(default: random from --seed)", &o->input, NULL};
  if (cmd == JOB_CMD_RUN)
    opts[n++] = (cli_opt){"grad-output", "FILE", "safetensors with dout (shape of out; F32, BF16 or F16): run the "
                          "backward too", &o->grad, NULL};
  if (cmd == JOB_CMD_CHECK || cmd == JOB_CMD_BENCH)
    opts[n++] = (cli_opt){"grad-output", "FILE", "safetensors with the backward's dout (default: random from --seed)",
                          &o->grad, NULL};
  opts[n++] = (cli_opt){"seed", "S", "seed of random weights and input (default 0)", &o->seed, NULL};
  opts[n++] = (cli_opt){"seq", "S", "random input: tokens per sequence (default " DSV4_STR(DEFAULT_SEQ) ")", &o->seq,
                        NULL};
  opts[n++] = (cli_opt){"batch", "B", "random input: B sequences of --seq tokens, as [B, S, d]", &o->batch, NULL};
  opts[n++] = (cli_opt){"doc-lengths", "MIN:MAX", "random input: pack documents of lengths drawn from [MIN, MAX] "
                        "(seeded)", &o->doc_lengths, NULL};
  opts[n++] = (cli_opt){"split", "MODE", "CP split: contiguous (default) or zigzag", &o->split, NULL};
  opts[n++] = (cli_opt){"recompute", NULL, "keep fewer activations and rebuild q, o in the backward (same results)",
                        NULL, &o->recompute};
  return n;
}

/* --layers A-B (or a single L): 0 <= A <= B < n_layers. */
static int parse_range(cli_ctx *c, job *j, const char *text) {
  long long a = 0, b = 0;
  char tail = 0;
  const int got = sscanf(text, "%lld-%lld%c", &a, &b, &tail);
  if (got == 1 && sscanf(text, "%lld%c", &a, &tail) == 1) b = a;
  else if (got != 2) return cli_error(c, "--layers: '%s' is not A-B (two layer indices)", text), 1;
  if (a < 0 || b < a || b >= j->cfg.n_layers)
    return cli_error(c, "--layers: '%s' must satisfy 0 <= A <= B < %d (the config's layers)", text, j->cfg.n_layers), 1;
  j->layer = (int)a;
  j->n_lay = (int)(b - a + 1);
  j->suffixed = 1;
  return 0;
}

/* Every layer's sources inside the range (a V4.1 consumer needs its kv source, index source and
 * candidate source to run first, in the same pass); the library's role errors (DSpark stages) too. */
static int check_sources(cli_ctx *c, job *j) {
  const int A = j->layer, B = j->layer + j->n_lay - 1;
  for (int L = A; L <= B; L++) {
    dsv4_layer_info in = DSV4_LAYER_INFO_INIT;
    if (cli_lib(c, dsv4_config_layer(&j->cfg, L, &in))) return 1;
    const int src[3] = {in.kv_source, in.index_source, in.uses_candidates ? j->cfg.candidate_source : -1};
    static const char *what[3] = {"compressed kv", "top-k", "candidate blocks"};
    for (int s = 0; s < 3; s++) {
      if (src[s] < 0 || (src[s] >= A && src[s] <= B)) continue;
      if (j->suffixed)
        cli_error(c, "--layers %d-%d: layer %d reads layer %d's %s, which lies outside the range (start it at %d)", A,
                  B, L, src[s], what[s], src[s]);
      else
        cli_error(c, "--layer %d reads layer %d's %s: run them together with --layers %d-%d", L, src[s], what[s],
                  src[s], L);
      return 1;
    }
  }
  return 0;
}

static void load_config(cli_ctx *c, job *j, const job_opts *o) {
  int64_t v;
  j->cfg = (dsv4_config)DSV4_CONFIG_INIT;
  if (o->preset) {
    if (cli_lib(c, dsv4_config_preset(&j->cfg, o->preset))) return;
  } else if (!o->config) {
    cli_error(c, "--config is required");
    return;
  } else if (cli_lib(c, dsv4_config_load(&j->cfg, o->config))) {
    return;
  }
  if (!o->layer == !o->layers) {
    cli_error(c, o->layer ? "--layer and --layers cannot both be given" : "--layer (or --layers) is required");
    return;
  }
  if (o->layers) {
    if (parse_range(c, j, o->layers)) return;
  } else {
    if (cli_int(c, "layer", o->layer, 0, j->cfg.n_layers - 1, &v)) return;
    j->layer = (int)v;
    j->n_lay = 1;
  }
  j->ratio = dsv4_config_ratio(&j->cfg, j->layer);
  if (check_sources(c, j)) return;
  j->recompute = o->recompute;
  if (o->seed && cli_int(c, "seed", o->seed, 0, INT64_MAX, &v) == 0) j->seed = (uint64_t)v;
  job_parse_split(c, o, &j->cp);
}

int job_parse_split(cli_ctx *c, const job_opts *o, dsv4_cp_config *cp) {
  *cp = (dsv4_cp_config)DSV4_CP_CONFIG_INIT;
  if (!o->split || !strcmp(o->split, "contiguous")) return 0;
  if (!strcmp(o->split, "zigzag")) {
    cp->split = DSV4_SPLIT_ZIGZAG;
    return 0;
  }
  cli_error(c, "--split: '%s' is not contiguous or zigzag", o->split);
  return 1;
}

int job_parse_shape(cli_ctx *c, const job_opts *o, int64_t *S, int64_t *B) {
  if (o->seq && cli_int(c, "seq", o->seq, 1, INT32_MAX, S)) return 1;
  if (o->batch && cli_int(c, "batch", o->batch, 1, INT32_MAX, B)) return 1;
  if (*S * *B > INT32_MAX) { /* cu_seqlens are int32 */
    cli_error(c, "--seq x --batch = %lld tokens is too many (at most %d)", (long long)(*S * *B), INT32_MAX);
    return 1;
  }
  return 0;
}

static void load_weights(cli_ctx *c, job *j, const job_opts *o) {
  j->lw = calloc((size_t)j->n_lay, sizeof *j->lw);
  j->lx = calloc((size_t)j->n_lay, sizeof *j->lx);
  j->ldout = calloc((size_t)j->n_lay, sizeof *j->ldout);
  if (!j->lw || !j->lx || !j->ldout) {
    cli_error(c, "out of memory");
    return;
  }
  for (int i = 0; i < j->n_lay && !c->err[0]; i++) {
    if (cli_lib(c, dsv4_weights_create(&j->lw[i], &j->cfg, j->layer + i))) return;
    if (o->weights)
      cli_lib(c, dsv4_weights_load(j->lw[i], o->weights));
    else
      cli_lib(c, dsv4_weights_init_random(j->lw[i], j->seed));
  }
  j->w = j->lw[0];
}

/* x and dout must be F32, BF16 or F16 (docs/spec.md section 7); F64 and integer dtypes are refused
 * by name before anything is read. Returns 1 (error recorded) when t is another dtype. */
static int input_float_dtype(cli_ctx *c, const char *file, const dsv4_st_info *t) {
  if (t->dtype == DSV4_DT_F32 || t->dtype == DSV4_DT_BF16 || t->dtype == DSV4_DT_F16) return 0;
  cli_error(c, "%s: tensor '%s' has dtype %s; it must be F32, BF16 or F16", file, t->name, t->dtype_name);
  return 1;
}

/* A 1-d meta tensor's length is checked against what the run needs BEFORE it is read: memory for
 * a hostile file (a 12 KB sparse file may declare 2^28 entries) is then bounded by what a real
 * input with the same T needs. Returns 1 (error recorded) when t is not 1-d with lo..hi entries. */
static int meta_length_ok(cli_ctx *c, const char *file, const dsv4_st_info *t, int64_t lo, int64_t hi,
                          const char *why) {
  if (t->ndim == 1 && t->numel >= lo && t->numel <= hi) return 1;
  char want[64];
  if (lo == hi) snprintf(want, sizeof want, "%lld", (long long)lo);
  else snprintf(want, sizeof want, "%lld to %lld", (long long)lo, (long long)hi);
  cli_error(c, "%s: %s must be a 1-d tensor of %s entries (%s), has %lld in %d dims: not read", file, t->name, want,
            why, (long long)t->numel, t->ndim);
  return 0;
}

/* Reads an I32 meta tensor into a fresh array. */
static int32_t *read_i32(cli_ctx *c, dsv4_st_file *f, const dsv4_st_info *t) {
  int32_t *v = malloc(sizeof(int32_t) * (size_t)(t->numel + 1));
  if (!v) cli_error(c, "out of memory reading %s", t->name);
  else if (cli_lib(c, dsv4_st_read_i32(f, t, v))) {
    free(v);
    v = NULL;
  }
  return v;
}

/* --doc-lengths MIN:MAX: random input packed as documents whose lengths are drawn uniformly from
 * [MIN, MAX] with the seed (the last one cut at T), every token real: real training data, which
 * has no alignment to compress ratios or ranks. */
static void random_documents(cli_ctx *c, job *j, const job_opts *o) {
  long long lo = 0, hi = 0;
  char tail = 0;
  if (sscanf(o->doc_lengths, "%lld:%lld%c", &lo, &hi, &tail) != 2 || lo < 1 || hi < lo || hi > INT32_MAX) {
    cli_error(c, "--doc-lengths: '%s' is not MIN:MAX with 1 <= MIN <= MAX", o->doc_lengths);
    return;
  }
  if (o->batch) {
    cli_error(c, "--doc-lengths packs one stream; it cannot be used with --batch");
    return;
  }
  int64_t cap = 16, n = 0, t = 0;
  j->cu = malloc(sizeof(int32_t) * (size_t)cap);
  const uint64_t stream = dsv4_random_stream(RANDOM_DOCS_STREAM);
  while (j->cu && t < j->T) {
    if (n + 2 > cap) {
      int32_t *bigger = realloc(j->cu, sizeof(int32_t) * (size_t)(cap *= 2));
      if (!bigger) break;
      j->cu = bigger;
    }
    j->cu[n] = (int32_t)t;
    float v;
    dsv4_random_fill(&v, 1, j->seed, stream, n, 1.0f);
    const double u = 0.5 * (1.0 + v); /* [0, 1) */
    const int64_t len = lo + (int64_t)(u * (double)(hi - lo + 1));
    t = t + len < j->T ? t + len : j->T;
    n++;
  }
  if (!j->cu || t < j->T) {
    cli_error(c, "out of memory packing random documents");
    return;
  }
  j->cu[n] = (int32_t)j->T;
  j->n_docs = (int)n;
}

/* Global meta of the input: shape of x, cu_seqlens, seqlens_real. Keeps the file open in *fp. */
static void input_meta(cli_ctx *c, job *j, const job_opts *o, dsv4_st_file **fp, const dsv4_st_info **xi) {
  const int64_t d = j->cfg.dim;
  if (!o->input) {
    int64_t S = DEFAULT_SEQ, B = 1;
    if (job_parse_shape(c, o, &S, &B)) return;
    j->T = S * B;
    j->B = B;
    j->S = S;
    j->x_ndim = o->batch ? 3 : 2;
    if (o->doc_lengths) random_documents(c, j, o);
    return;
  }
  if (o->seq || o->batch || o->doc_lengths) {
    cli_error(c, "--seq/--batch/--doc-lengths describe random input; they cannot be used with --input");
    return;
  }
  if (cli_lib(c, dsv4_st_open(fp, o->input))) return;
  char first[32];
  job_tensor_name(j, "x", j->layer, first, sizeof first);
  const dsv4_st_info *x = *xi = dsv4_st_find(*fp, "x");
  if (!x && j->suffixed) x = *xi = dsv4_st_find(*fp, first); /* x.{L} for every layer of the range */
  if (!x) {
    if (j->suffixed) cli_error(c, "%s: missing tensor 'x' (one for every layer) or '%s'", o->input, first);
    else cli_error(c, "%s: missing tensor 'x'", o->input);
    return;
  }
  if (x->ndim != 2 && x->ndim != 3) {
    cli_error(c, "%s: tensor 'x' must be [T, d] or [B, S, d] (has %d dims)", o->input, x->ndim);
    return;
  }
  if (input_float_dtype(c, o->input, x)) return;
  if (x->shape[x->ndim - 1] != d) {
    cli_error(c, "%s: tensor '%s' has width %lld but hidden_size is %lld", o->input, x->name,
              (long long)x->shape[x->ndim - 1], (long long)d);
    return;
  }
  j->x_ndim = x->ndim;
  j->T = x->ndim == 2 ? x->shape[0] : x->shape[0] * x->shape[1];
  if (j->T <= 0 || j->T > INT32_MAX) {
    cli_error(c, "%s: tensor 'x' has %lld tokens", o->input, (long long)j->T);
    return;
  }
  if (x->ndim == 3) {
    j->B = x->shape[0];
    j->S = x->shape[1];
  }
  const dsv4_st_info *cu = dsv4_st_find(*fp, "cu_seqlens"), *re = dsv4_st_find(*fp, "seqlens_real");
  if (x->ndim == 3 && cu) {
    cli_error(c, "%s: cu_seqlens given with a [B, S, d] input (use [T, d] for packed documents)", o->input);
    return;
  }
  if (re && !cu && x->ndim == 2) {
    cli_error(c, "%s: seqlens_real given without cu_seqlens", o->input);
    return;
  }
  if (cu) { /* documents hold at least one token each: at most T of them */
    if (!meta_length_ok(c, o->input, cu, 2, j->T + 1, "n_docs + 1, at most T + 1")) return;
    j->n_docs = (int)(cu->numel - 1);
    if (!(j->cu = read_i32(c, *fp, cu))) return;
  }
  if (re) {
    int n_docs = j->n_docs ? j->n_docs : (int)j->B;
    if (!meta_length_ok(c, o->input, re, n_docs, n_docs, "one entry per document")) return;
    j->real = read_i32(c, *fp, re);
  }
}

static void build_packing(cli_ctx *c, job *j) {
  if (j->x_ndim == 3 && !j->cu) {
    j->n_docs = (int)j->B;
    j->cu = malloc(sizeof(int32_t) * (size_t)(j->B + 1));
    if (!j->cu) {
      cli_error(c, "out of memory");
      return;
    }
    for (int64_t b = 0; b <= j->B; b++) j->cu[b] = (int32_t)(b * j->S);
  }
  j->pk = (dsv4_packing){DSV4_HEAD(dsv4_packing), .cu_seqlens = j->cu, .seqlens_real = j->real,
                         .n_docs = j->n_docs, .T = j->T, .batched = j->x_ndim == 3};
}

void job_reshard(cli_ctx *c, job *j, int rank, int size) {
  free(j->rows);
  j->rows = NULL;
  if (cli_lib(c, dsv4_cp_shard_rows(&j->pk, &j->cp, rank, size, NULL, &j->n))) return;
  j->rows = malloc(sizeof(int64_t) * (size_t)(j->n + 1));
  if (!j->rows) {
    cli_error(c, "out of memory");
    return;
  }
  cli_lib(c, dsv4_cp_shard_rows(&j->pk, &j->cp, rank, size, j->rows, &j->n));
}

/* This rank's rows of a [T, d]-sized float tensor, read run by run (byte ranges of the file: the
 * whole tensor is never read, so each rank's input memory falls as 1/N). */
static float *read_rows(cli_ctx *c, job *j, dsv4_st_file *f, const dsv4_st_info *t, const char *what) {
  const int64_t d = j->cfg.dim;
  float *mine = malloc(sizeof(float) * (size_t)(j->n * d + 1));
  if (!mine) {
    cli_error(c, "out of memory reading %s", what);
    return NULL;
  }
  for (int64_t i = 0, e; i < j->n && !c->err[0]; i = e) {
    for (e = i + 1; e < j->n && j->rows[e] == j->rows[e - 1] + 1; e++) {}
    cli_lib(c, dsv4_st_read_f32_range(f, t, j->rows[i] * d, (e - i) * d, mine + i * d));
  }
  for (int64_t i = 0; i < j->n * d && !c->err[0]; i++)
    if (!isfinite(mine[i])) cli_error(c, "%s has a non-finite value at row %lld", what, (long long)j->rows[i / d]);
  if (c->err[0]) {
    free(mine);
    mine = NULL;
  }
  return mine;
}

/* Tensor `name` of f, of x's shape ([T, d] or [B, S, d]) and a float dtype, checked before any read;
 * NULL (error recorded) otherwise. */
static const dsv4_st_info *row_tensor(cli_ctx *c, const job *j, dsv4_st_file *f, const char *file, const char *name,
                                      const char *what) {
  const dsv4_st_info *t = dsv4_st_find(f, name);
  if (!t) {
    cli_error(c, "%s: missing tensor '%s'", file, name);
  } else if (input_float_dtype(c, file, t)) { /* recorded */
    t = NULL;
  } else if (t->ndim != j->x_ndim || t->numel != j->T * j->cfg.dim || t->shape[t->ndim - 1] != j->cfg.dim ||
             (j->x_ndim == 3 && t->shape[0] != j->B)) {
    cli_error(c, "%s: tensor '%s' must have the shape of %s (%s)", file, name, what,
              j->x_ndim == 3 ? "[B, S, d]" : "[T, d]");
    t = NULL;
  }
  return t;
}

static void load_grad(cli_ctx *c, job *j, const job_opts *o) {
  dsv4_st_file *g = NULL;
  if (cli_lib(c, dsv4_st_open(&g, o->grad))) return;
  const int one = j->suffixed && dsv4_st_find(g, "dout"); /* one dout for every layer, like one x */
  for (int i = 0; i < j->n_lay && !c->err[0]; i++) {
    char name[32];
    job_tensor_name(j, "dout", j->layer + i, name, sizeof name);
    const dsv4_st_info *t = row_tensor(c, j, g, o->grad, one ? "dout" : name, "the output");
    if (t) j->ldout[i] = read_rows(c, j, g, t, one ? "dout" : name);
  }
  j->dout = j->ldout[0];
  dsv4_st_close(g);
}

/* x of every layer: the one 'x', or x.{L} for each layer of the range. */
static void load_x(cli_ctx *c, job *j, dsv4_st_file *f, const dsv4_st_info *xi, const char *file) {
  if (!strcmp(xi->name, "x")) {
    if ((j->lx[0] = read_rows(c, j, f, xi, "x")))
      for (int i = 1; i < j->n_lay; i++) j->lx[i] = j->lx[0];
  } else {
    for (int i = 0; i < j->n_lay && !c->err[0]; i++) {
      char name[32];
      job_tensor_name(j, "x", j->layer + i, name, sizeof name);
      const dsv4_st_info *t = row_tensor(c, j, f, file, name, "the first layer's x");
      if (t) j->lx[i] = read_rows(c, j, f, t, name);
    }
  }
  j->x = j->lx[0];
}

/* This rank's rows of a seeded random [T, d] tensor: element (g, e) depends only on (seed, g, e). */
static float *random_rows(cli_ctx *c, const job *j, const char *stream_name) {
  const int64_t d = j->cfg.dim;
  float *v = malloc(sizeof(float) * (size_t)(j->n * d + 1));
  if (!v) {
    cli_error(c, "out of memory for %s", stream_name);
    return NULL;
  }
  const uint64_t stream = dsv4_random_stream(stream_name);
  for (int64_t i = 0; i < j->n; i++) dsv4_random_fill(v + i * d, d, j->seed, stream, j->rows[i] * d, 1.0f);
  return v;
}

void job_load(cli_ctx *c, job *j, const job_opts *o) {
  dsv4_st_file *f = NULL;
  const dsv4_st_info *xi = NULL;
  memset(j, 0, sizeof *j);
  load_config(c, j, o);
  if (!c->err[0]) load_weights(c, j, o);
  if (!c->err[0]) input_meta(c, j, o, &f, &xi);
  if (!c->err[0]) build_packing(c, j);
  if (!c->err[0]) job_reshard(c, j, c->rank, c->size);
  if (!c->err[0]) {
    if (f) {
      load_x(c, j, f, xi, o->input);
    } else { /* one random x serves every layer of the range */
      if ((j->x = j->lx[0] = random_rows(c, j, RANDOM_X_STREAM)))
        for (int i = 1; i < j->n_lay; i++) j->lx[i] = j->lx[0];
    }
  }
  if (!c->err[0] && o->grad) load_grad(c, j, o);
  for (int i = 0; i < j->n_lay && !c->err[0] && !o->grad && o->random_dout; i++) {
    char name[48]; /* a stream per layer of a range (the first keeps the one-layer stream) */
    job_tensor_name(j, RANDOM_DOUT_STREAM, j->layer + i, name, sizeof name);
    j->ldout[i] = random_rows(c, j, i == 0 ? RANDOM_DOUT_STREAM : name);
  }
  if (j->ldout) j->dout = j->ldout[0];
  dsv4_st_close(f);
}

void job_free(job *j) {
  for (int i = 0; j->lw && i < j->n_lay; i++) dsv4_weights_free(j->lw[i]);
  for (int i = 0; j->lx && i < j->n_lay; i++)
    if (i == 0 || j->lx[i] != j->lx[0]) free(j->lx[i]);
  for (int i = 0; j->ldout && i < j->n_lay; i++) free(j->ldout[i]);
  free(j->lw);
  free(j->lx);
  free(j->ldout);
  free(j->cu);
  free(j->real);
  free(j->rows);
  memset(j, 0, sizeof *j);
}

