/* job.c: loading a job's files (or seeded random data), sharding, gathering and writing. */
#define _GNU_SOURCE
#include "job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsv4cp_mpi.h"
#include "io/outfile.h"
#include "io/safetensors.h"
#include "util/rng.h"

#define DEFAULT_SEQ 256
#define DSV4_XSTR(v) #v
#define DSV4_STR(v) DSV4_XSTR(v)
#define RANDOM_X_STREAM "input.x"
#define RANDOM_DOUT_STREAM "input.dout"

int job_common_opts(job_opts *o, cli_opt *opts, job_cmd cmd) {
  const int bench = cmd == JOB_CMD_BENCH;
  int n = 0;
  opts[n++] = (cli_opt){"config", "FILE",
                        bench ? "Hugging Face style config.json (default: --preset flash)"
                              : "Hugging Face style config.json (required unless --preset)",
                        &o->config, NULL};
  opts[n++] = (cli_opt){"preset", "NAME",
                        bench ? "built-in config instead of --config: flash (default), pro or tiny"
                              : "built-in config instead of --config: flash, pro or tiny",
                        &o->preset, NULL};
  opts[n++] = (cli_opt){"layer", "L", "layer index; its compress ratio picks the layer kind (required)", &o->layer,
                        NULL};
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

static void load_config(cli_ctx *c, job *j, const job_opts *o) {
  int64_t v;
  if (o->preset) {
    if (cli_lib(c, dsv4_config_preset(&j->cfg, o->preset))) return;
  } else if (!o->config) {
    cli_error(c, "--config is required");
    return;
  } else if (cli_lib(c, dsv4_config_load(&j->cfg, o->config))) {
    return;
  }
  if (!o->layer) {
    cli_error(c, "--layer is required");
    return;
  }
  if (cli_int(c, "layer", o->layer, 0, j->cfg.n_layers - 1, &v)) return;
  j->layer = (int)v;
  j->ratio = dsv4_config_ratio(&j->cfg, j->layer);
  j->recompute = o->recompute;
  if (o->seed && cli_int(c, "seed", o->seed, 0, INT64_MAX, &v) == 0) j->seed = (uint64_t)v;
  job_parse_split(c, o, &j->cp);
}

int job_parse_split(cli_ctx *c, const job_opts *o, dsv4_cp_config *cp) {
  cp->split = DSV4_SPLIT_CONTIGUOUS;
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
  if (cli_lib(c, dsv4_weights_create(&j->w, &j->cfg, j->layer))) return;
  if (o->weights)
    cli_lib(c, dsv4_weights_load(j->w, o->weights));
  else
    cli_lib(c, dsv4_weights_init_random(j->w, j->seed));
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
  const uint64_t stream = dsv4_name_stream("input.doc_lengths");
  while (j->cu && t < j->T) {
    if (n + 2 > cap) {
      int32_t *bigger = realloc(j->cu, sizeof(int32_t) * (size_t)(cap *= 2));
      if (!bigger) break;
      j->cu = bigger;
    }
    j->cu[n] = (int32_t)t;
    const double u = 0.5 * (1.0 + dsv4_uniform(j->seed, stream, (uint64_t)n)); /* [0, 1) */
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
  const dsv4_st_info *x = *xi = dsv4_st_find(*fp, "x");
  if (!x) {
    cli_error(c, "%s: missing tensor 'x'", o->input);
    return;
  }
  if (x->ndim != 2 && x->ndim != 3) {
    cli_error(c, "%s: tensor 'x' must be [T, d] or [B, S, d] (has %d dims)", o->input, x->ndim);
    return;
  }
  if (input_float_dtype(c, o->input, x)) return;
  if (x->shape[x->ndim - 1] != d) {
    cli_error(c, "%s: tensor 'x' has width %lld but hidden_size is %lld", o->input,
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
  j->pk = (dsv4_packing){.cu_seqlens = j->cu, .seqlens_real = j->real, .n_docs = j->n_docs, .T = j->T,
                         .batched = j->x_ndim == 3};
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

static void load_grad(cli_ctx *c, job *j, const job_opts *o) {
  dsv4_st_file *g = NULL;
  if (cli_lib(c, dsv4_st_open(&g, o->grad))) return;
  const dsv4_st_info *t = dsv4_st_find(g, "dout");
  if (!t) {
    cli_error(c, "%s: missing tensor 'dout'", o->grad);
  } else if (input_float_dtype(c, o->grad, t)) { /* recorded */
  } else if (t->ndim != j->x_ndim || t->numel != j->T * j->cfg.dim || t->shape[t->ndim - 1] != j->cfg.dim ||
             (j->x_ndim == 3 && t->shape[0] != j->B)) { /* exactly x's shape, checked before any read */
    cli_error(c, "%s: tensor 'dout' must have the shape of the output (%s)", o->grad,
              j->x_ndim == 3 ? "[B, S, d]" : "[T, d]");
  } else {
    j->dout = read_rows(c, j, g, t, "dout");
  }
  dsv4_st_close(g);
}

/* This rank's rows of a seeded random [T, d] tensor: element (g, e) depends only on (seed, g, e). */
static float *random_rows(cli_ctx *c, const job *j, const char *stream_name) {
  const int64_t d = j->cfg.dim;
  float *v = malloc(sizeof(float) * (size_t)(j->n * d + 1));
  if (!v) {
    cli_error(c, "out of memory for %s", stream_name);
    return NULL;
  }
  const uint64_t stream = dsv4_name_stream(stream_name);
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
      j->x = read_rows(c, j, f, xi, "x");
    } else {
      j->x = random_rows(c, j, RANDOM_X_STREAM);
    }
  }
  if (!c->err[0] && o->grad) load_grad(c, j, o);
  if (!c->err[0] && !o->grad && o->random_dout) j->dout = random_rows(c, j, RANDOM_DOUT_STREAM);
  dsv4_st_close(f);
}

void job_free(job *j) {
  dsv4_weights_free(j->w);
  free(j->cu);
  free(j->real);
  free(j->rows);
  free(j->x);
  free(j->dout);
  memset(j, 0, sizeof *j);
}

/* Rows per message when gathering: keeps every message far below MPI's int count limit and the
 * receive buffer small, whatever T is. */
#define GATHER_CHUNK_BYTES (64u << 20)

void job_gather_rows(cli_ctx *c, const job *j, const void *local, int64_t width, size_t elem, void *full) {
  const size_t row_bytes = (size_t)width * elem;
  const int64_t chunk = (int64_t)(GATHER_CHUNK_BYTES / row_bytes) > 0 ? (int64_t)(GATHER_CHUNK_BYTES / row_bytes) : 1;
  if (c->rank != 0) { /* every rank holds j->n rows; rank 0 knows which ones from the shard rule */
    for (int64_t i = 0; i < j->n; i += chunk) {
      const int64_t m = j->n - i < chunk ? j->n - i : chunk;
      MPI_Send((const char *)local + i * row_bytes, (int)(m * row_bytes), MPI_BYTE, 0, 0, c->comm);
    }
    return;
  }
  for (int64_t i = 0; i < j->n; i++)
    memcpy((char *)full + j->rows[i] * row_bytes, (const char *)local + i * row_bytes, row_bytes);
  if (c->size == 1) return;
  int64_t *rows = malloc(sizeof(int64_t) * (size_t)(j->n + 1)), n = 0;
  char *buf = malloc(row_bytes * (size_t)(j->n < chunk ? j->n : chunk) + 1);
  dsv4_cp_config cp = j->cp;
  if (!rows || !buf) { /* the other ranks are sending: nothing to do but stop the job */
    cli_error(c, "out of memory gathering results on rank 0");
    cli_abort(c);
  }
  for (int r = 1; r < c->size; r++) {
    dsv4_cp_shard_rows(&j->pk, &cp, r, c->size, rows, &n);
    for (int64_t i = 0; i < n; i += chunk) {
      const int64_t m = n - i < chunk ? n - i : chunk;
      MPI_Recv(buf, (int)(m * row_bytes), MPI_BYTE, r, 0, c->comm, MPI_STATUS_IGNORE);
      for (int64_t k = 0; k < m; k++) memcpy((char *)full + rows[i + k] * row_bytes, buf + k * row_bytes, row_bytes);
    }
  }
  free(rows);
  free(buf);
}

/* The library's rule (src/io/outfile.h), checked by rank 0, the one rank that writes (another
 * rank's node may not even have that directory); cli_sync makes its error every rank's line. */
void job_check_output_path(cli_ctx *c, const char *opt, const char *path) {
  if (c->rank == 0 && dsv4_output_check(path) != DSV4_OK) cli_error(c, "%s: %s", opt, dsv4_last_error());
}

/* ---- streaming the results to rank 0's file ------------------------------------------------
 * The file holds out, topk_ids and dx in global row order; every rank holds its own rows. Rank 0's
 * writer asks for STREAM_CHUNK_BYTES of rows at a time; each piece of the chunk comes from the rank
 * that owns it (rank 0 copies its own), and every other rank walks the same chunks and sends its
 * pieces in the same order. Rank 0 never holds more than its own rows and one chunk. */
#define STREAM_CHUNK_BYTES (64u << 20)

typedef struct {
  int64_t g0, len, lo; /* global rows [g0, g0 + len) held by `rank` at its local rows lo.. */
  int rank;
} owner_run;

typedef struct {
  cli_ctx *c;
  const job *j;
  owner_run *runs;     /* every rank's runs, sorted by g0 */
  int n_runs;
  const void *local;   /* this rank's rows of the tensor being written */
  size_t row_bytes;
} stream_ctx;

static int cmp_run(const void *a, const void *b) {
  const owner_run *x = a, *y = b;
  return (x->g0 > y->g0) - (x->g0 < y->g0);
}

/* Every rank's runs of consecutive global rows (from the shard rule; no messages). */
static int owner_runs(cli_ctx *c, const job *j, owner_run **out, int *n_out) {
  int64_t *rows = malloc(sizeof(int64_t) * (size_t)(j->n + 1)), n = 0;
  owner_run *v = NULL;
  int cnt = 0, cap = 0;
  if (!rows) return cli_error(c, "out of memory"), 1;
  for (int q = 0; q < c->size; q++) {
    if (cli_lib(c, dsv4_cp_shard_rows(&j->pk, &j->cp, q, c->size, rows, &n))) break;
    for (int64_t i = 0, e; i < n; i = e) {
      for (e = i + 1; e < n && rows[e] == rows[e - 1] + 1; e++) {}
      if (cnt == cap) {
        owner_run *bigger = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 64));
        if (!bigger) {
          cli_error(c, "out of memory");
          break;
        }
        v = bigger;
      }
      v[cnt++] = (owner_run){rows[i], e - i, i, q};
    }
  }
  free(rows);
  if (c->err[0]) return free(v), 1;
  qsort(v, (size_t)cnt, sizeof *v, cmp_run);
  *out = v;
  *n_out = cnt;
  return 0;
}

/* The pieces of rows [r0, r0 + n): on rank 0 into dst (receiving what others own); on the others,
 * sending what they own. The same walk on every rank, so the messages pair up in order. */
static dsv4_status stream_rows(void *vctx, int64_t r0, int64_t n, void *dst) {
  stream_ctx *s = vctx;
  const cli_ctx *c = s->c;
  for (int i = 0; i < s->n_runs; i++) {
    const owner_run *o = &s->runs[i];
    const int64_t a = o->g0 > r0 ? o->g0 : r0, b = o->g0 + o->len < r0 + n ? o->g0 + o->len : r0 + n;
    if (a >= b) continue;
    const char *src = (const char *)s->local + (size_t)(o->lo + a - o->g0) * s->row_bytes;
    const size_t bytes = (size_t)(b - a) * s->row_bytes;
    if (c->rank == 0) {
      char *to = (char *)dst + (size_t)(a - r0) * s->row_bytes;
      if (o->rank == 0) memcpy(to, src, bytes);
      else MPI_Recv(to, (int)bytes, MPI_BYTE, o->rank, 1, c->comm, MPI_STATUS_IGNORE);
    } else if (o->rank == c->rank) {
      MPI_Send(src, (int)bytes, MPI_BYTE, 0, 1, c->comm);
    }
  }
  return DSV4_OK;
}

/* Rows per chunk of a tensor whose rows are row_bytes (the same on every rank). */
static int64_t chunk_rows(size_t row_bytes) {
  const int64_t r = (int64_t)(STREAM_CHUNK_BYTES / row_bytes);
  return r > 0 ? r : 1;
}

void job_grad_name(const job *j, const char *short_name, char *buf, size_t n) {
  snprintf(buf, n, "grad.%s%s", dsv4_weights_prefix(j->w), short_name);
}

void job_write(cli_ctx *c, const job *j, const job_result *r, const char *path) {
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk;
  int64_t xshape[3] = {j->x_ndim == 3 ? j->B : j->T, j->x_ndim == 3 ? j->S : d, d};
  int64_t tshape[2] = {j->T, k}, one = 1;
  stream_ctx ctx[3] = {{0}};
  dsv4_st_writer *w = NULL;
  char **names = NULL;
  const int n_grads = r->grads ? dsv4_weights_count(r->grads) : 0;
  int n_runs = 0;
  owner_run *runs = NULL;
  if (owner_runs(c, j, &runs, &n_runs)) { /* global values only: every rank fails alike */
    cli_abort(c);
    return;
  }
  const void *locals[3] = {r->out, r->topk, r->dx};
  const size_t row_bytes[3] = {sizeof(float) * (size_t)d, sizeof(int32_t) * (size_t)k, sizeof(float) * (size_t)d};
  for (int t = 0; t < 3; t++) ctx[t] = (stream_ctx){c, j, runs, n_runs, locals[t], row_bytes[t]};
  if (c->rank != 0) { /* the senders: the same chunks, in the order rank 0's writer asks for them */
    for (int t = 0; t < 3; t++) {
      if (!locals[t]) continue;
      const int64_t per = chunk_rows(row_bytes[t]);
      for (int64_t r0 = 0; r0 < j->T; r0 += per) stream_rows(&ctx[t], r0, j->T - r0 < per ? j->T - r0 : per, NULL);
    }
    free(runs);
    return;
  }
  int bad = cli_lib(c, dsv4_st_writer_create(&w));
  if (!bad && !(names = calloc((size_t)n_grads + 1, sizeof *names))) bad = (cli_error(c, "out of memory"), 1);
  if (!bad)
    bad = cli_lib(c, dsv4_st_writer_add_rows(w, "out", DSV4_DT_F32, j->x_ndim, xshape, chunk_rows(row_bytes[0]),
                                             stream_rows, &ctx[0]));
  if (!bad && r->topk)
    bad = cli_lib(c, dsv4_st_writer_add_rows(w, "topk_ids", DSV4_DT_I32, 2, tshape, chunk_rows(row_bytes[1]),
                                             stream_rows, &ctx[1]));
  if (!bad && j->ratio == 4) bad = cli_lib(c, dsv4_st_writer_add(w, "indexer_loss", DSV4_DT_F32, 1, &one, &r->loss));
  if (!bad && r->dx)
    bad = cli_lib(c, dsv4_st_writer_add_rows(w, "dx", DSV4_DT_F32, j->x_ndim, xshape, chunk_rows(row_bytes[2]),
                                             stream_rows, &ctx[2]));
  for (int i = 0; i < n_grads && !bad; i++) {
    dsv4_tensor t;
    const char *prefix = dsv4_weights_prefix(j->w);
    bad = cli_lib(c, dsv4_weights_get(r->grads, i, &t));
    const size_t len = bad ? 0 : strlen(prefix) + strlen(t.name) + 8;
    if (!bad && !(names[i] = malloc(len))) bad = (cli_error(c, "out of memory"), 1);
    if (!bad) {
      job_grad_name(j, t.name, names[i], len);
      bad = cli_lib(c, dsv4_st_writer_add(w, names[i], DSV4_DT_F32, t.ndim, t.shape, t.data));
    }
  }
  /* the other ranks are sending (or about to): a failure here cannot be reported by cli_sync */
  if (bad || cli_lib(c, dsv4_st_writer_save(w, path))) cli_abort(c);
  dsv4_st_writer_free(w);
  for (int i = 0; names && i < n_grads; i++) free(names[i]);
  free(names);
  free(runs);
}

void job_result_free(job_result *r) {
  free(r->out);
  free(r->dx);
  free(r->topk);
  dsv4_weights_free(r->grads);
  memset(r, 0, sizeof *r);
}

int job_make_layer(cli_ctx *c, job *j, int cp, dsv4_layer **l, dsv4_comm **comm) {
  *l = NULL;
  *comm = NULL;
  if (cli_lib(c, dsv4_layer_create(l, &j->cfg, j->layer, j->w))) return 1;
  if (j->recompute && cli_lib(c, dsv4_layer_set_recompute(*l, 1))) return 1;
  if (!cp || c->size == 1) return 0;
  if (cli_lib(c, dsv4_comm_create_mpi(comm, c->comm))) return 1;
  return cli_lib(c, dsv4_cp_patch(dsv4_layer_core(*l), *comm, &j->cp));
}

void job_diff(const float *a, const float *b, int64_t n, double *max_diff, double *max_ref) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - b[i]);
    if (e > d || isnan(e)) d = e; /* a NaN sticks: nothing compares greater than it */
    m = fabs(b[i]) > m ? fabs(b[i]) : m;
  }
  *max_diff = d;
  *max_ref = m;
}

void job_execute(cli_ctx *c, job *j, int cp, job_path path, job_result *r, dsv4_cp_stats *stats) {
  dsv4_layer *l = NULL;
  dsv4_comm *comm = NULL;
  float *out = NULL, *dx = NULL;
  int32_t *topk = NULL;
  dsv4_weights *grads = NULL;
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk, n = j->n;
  const int use_cp = cp && c->size > 1;
  memset(r, 0, sizeof *r);
  if (job_make_layer(c, j, cp, &l, &comm)) goto done;
  dsv4_layer_set_impl(l, path == JOB_NAIVE ? DSV4_IMPL_NAIVE : DSV4_IMPL_FAST);
  if (path == JOB_NAIVE_OPS) dsv4_core_set_impl(dsv4_layer_core(l), DSV4_IMPL_NAIVE);
  out = malloc(sizeof(float) * (size_t)(n * d + 1));
  topk = j->ratio == 4 ? malloc(sizeof(int32_t) * (size_t)(n * k + 1)) : NULL;
  if (!out || (j->ratio == 4 && !topk)) {
    cli_error(c, "out of memory for the output");
    goto done;
  }
  MPI_Barrier(c->comm);
  cli_phase(c, "forward");
  double t0 = MPI_Wtime();
  if (cli_lib(c, dsv4_layer_forward(l, out, topk, &r->loss, j->x, n, &j->pk, j->dout != NULL))) goto done;
  r->fwd_seconds = MPI_Wtime() - t0;
  if (j->dout) {
    dx = malloc(sizeof(float) * (size_t)(n * d + 1));
    if (!dx) {
      cli_error(c, "out of memory for dx");
      goto done;
    }
    if (cli_lib(c, dsv4_weights_create(&grads, &j->cfg, j->layer))) goto done;
    cli_phase(c, "backward");
    t0 = MPI_Wtime();
    if (cli_lib(c, dsv4_layer_backward(l, dx, grads, j->dout, 1.0f))) goto done;
    if (use_cp && cli_lib(c, dsv4_cp_allreduce_grads(comm, grads))) goto done;
    r->bwd_seconds = MPI_Wtime() - t0;
  }
  double times[2] = {r->fwd_seconds, r->bwd_seconds};
  MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, c->comm);
  r->fwd_seconds = times[0];
  r->bwd_seconds = times[1];
  if (stats && use_cp) dsv4_cp_get_stats(dsv4_layer_core(l), stats);
  if (!j->keep_local) { /* the whole result on rank 0 (check, demo) */
    const int full = c->rank == 0;
    float *fo = full ? malloc(sizeof(float) * (size_t)(j->T * d + 1)) : NULL;
    int32_t *ft = full && topk ? malloc(sizeof(int32_t) * (size_t)(j->T * k + 1)) : NULL;
    float *fd = full && dx ? malloc(sizeof(float) * (size_t)(j->T * d + 1)) : NULL;
    if (full && (!fo || (topk && !ft) || (dx && !fd))) { /* the others send next: stop the job */
      cli_error(c, "out of memory for the gathered results on rank 0 (%lld rows)", (long long)j->T);
      cli_abort(c);
    }
    job_gather_rows(c, j, out, d, sizeof(float), fo);
    if (topk) job_gather_rows(c, j, topk, k, sizeof(int32_t), ft);
    if (dx) job_gather_rows(c, j, dx, d, sizeof(float), fd);
    free(out), free(topk), free(dx);
    out = fo, topk = ft, dx = fd;
  }
  r->out = out, r->topk = topk, r->dx = dx;
  out = NULL, topk = NULL, dx = NULL;
  r->grads = grads;
  grads = NULL;
done:
  dsv4_weights_free(grads);
  free(out);
  free(dx);
  free(topk);
  dsv4_layer_free(l);
  dsv4_comm_free(comm);
}
