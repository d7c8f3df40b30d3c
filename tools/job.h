/* job.h: one layer's job as the CLI sees it (docs/spec.md section 7), in three files:
 *   job_input.c   options, config, weights, the input (file or seeded random), this rank's shard
 *   job_run.c     the layer (patched for CP), forward, backward, the rank-summed gradients
 *   job_output.c  rank 0 collecting rows every rank holds a share of, and the output file
 * The program uses only the library's public headers (dsv4cp.h, dsv4cp_io.h, dsv4cp_mpi.h). */
#ifndef DSV4_JOB_H
#define DSV4_JOB_H

#include "cli.h"

typedef struct {
  const char *config, *layer, *layers, *weights, *input, *grad, *seed, *seq, *batch, *split, *preset, *doc_lengths;
  int random_dout; /* without grad: dout from the seed (check, demo) */
  int recompute;   /* --recompute: keep fewer activations, rebuild them in the backward */
} job_opts;

typedef struct {
  dsv4_config cfg;
  int layer, ratio;    /* the (first) layer */
  uint64_t seed;
  dsv4_weights *w;     /* its weights (lw[0]) */
  /* --layers A-B (docs/spec.md section 10): layers A..B run in order with one shared state, the
   * backward in reverse; tensors are named x.{L}, dout.{L}, out.{L}, ... (--layer L: one layer,
   * unsuffixed names) */
  int n_lay;           /* layers in the range (1 for --layer) */
  int suffixed;        /* 1: --layers */
  dsv4_weights **lw;   /* [n_lay] */
  float **lx, **ldout; /* [n_lay] this rank's rows of each layer's x and dout (lx[i] may be lx[0]:
                          one x for every layer; ldout NULL entries without a backward) */
  /* the whole input (every rank knows the meta) */
  int64_t T, B, S;     /* B, S set for a [B, S, d] input (batched) */
  int x_ndim;          /* 2: [T, d], 3: [B, S, d] */
  int32_t *cu, *real;  /* [n_docs + 1], [n_docs] */
  int n_docs;
  dsv4_packing pk;
  dsv4_cp_config cp;
  int recompute;
  /* this rank's shard */
  int64_t n;
  int64_t *rows;       /* [n] global row of each local row */
  float *x;            /* [n, d] */
  float *dout;         /* [n, d] or NULL */
  int keep_local;      /* job_execute leaves this rank's rows in the result (for job_write) instead of
                          gathering the whole result on rank 0 */
  int threads;         /* OpenMP threads of the layer's calls (0: the process default) */
} job;

/* A run of consecutive global rows held by one rank (at its local rows lo..). */
typedef struct {
  int64_t g0, len, lo;
  int rank;
} job_run;

/* The commands that share the job options. They read slightly different subsets (train builds its
 * own objective so has no --grad-output; bench defaults to --preset flash), and --help lists exactly
 * what each reads. */
typedef enum { JOB_CMD_RUN, JOB_CMD_CHECK, JOB_CMD_TRAIN, JOB_CMD_BENCH } job_cmd;

/* Writes the shared options command `cmd` reads into opts (returns how many; at most 16). */
int job_common_opts(job_opts *o, cli_opt *opts, job_cmd cmd);

/* Loads everything on every rank; errors are recorded in c (check with cli_sync). */
void job_load(cli_ctx *c, job *j, const job_opts *o);
/* Re-shards the same job for another rank count (used to recompute CP = 1 on rank 0). */
void job_reshard(cli_ctx *c, job *j, int rank, int size);
void job_free(job *j);

/* Every rank's runs of rows, sorted by first global row (from the shard rule, no message); *runs is
 * allocated. Returns 1 (error recorded) on failure, identically on every rank. */
int job_owners(cli_ctx *c, const job *j, job_run **runs, int *n_runs);
/* The one collection primitive. Collective: rows [r0, r0 + n) of a tensor of T rows of row_bytes,
 * of which every rank holds its own rows in `local` (in local row order), land in dst on rank 0
 * (which copies its own pieces and receives the others'); the other ranks send their pieces (dst
 * ignored). Every rank walks the same runs, so the messages pair up in order. */
void job_collect_rows(const cli_ctx *c, const job_run *runs, int n_runs, const void *local, size_t row_bytes,
                      int64_t r0, int64_t n, void *dst);
/* Rank 0 receives full [T, row_bytes] (placed by global row) from every rank's local rows, 64 MiB
 * at a time. Collective. */
void job_gather_rows(cli_ctx *c, const job *j, const void *local, size_t row_bytes, void *full);

/* Results of one run, per layer of the range: full size on rank 0 (NULL elsewhere), or this rank's
 * rows when job.keep_local is set. */
typedef struct {
  int layer;
  float *out, *dx;        /* [T, d] or [n, d] */
  int32_t *topk;          /* [T, k] or [n, k], or NULL (layers that do not select) */
  int has_loss;           /* the layer has an indexer loss (r == 4, V4.1 index sources) */
  float loss;
  dsv4_weights *grads;    /* rank-summed, or NULL */
  double fwd_seconds, bwd_seconds; /* wall time of the layer calls (max over ranks) */
} job_result;

/* Runs the range's layers on this rank's shard: CP over all ranks when cp is 1 and there are
 * several, the forwards in order (one shared state), and the backwards in reverse when the job has
 * dout (gradients summed over ranks). r: [n_lay] results, gathered full size on rank 0 unless
 * keep_local (arrays allocated; free with job_result_free); stats: summed over the layers. */
typedef enum { JOB_FAST = 0, JOB_NAIVE, JOB_NAIVE_OPS /* naive operators, BLAS products */ } job_path;
void job_execute(cli_ctx *c, job *j, int cp, job_path path, job_result *r, dsv4_cp_stats *stats);
void job_result_free(job_result *r, int n);
/* The name of a per-layer tensor: base ("out") for --layer, base.{L} for --layers. */
void job_tensor_name(const job *j, const char *base, int layer, char *buf, size_t n);

/* --split into cp (contiguous when absent); an unknown mode is an error naming it. Returns 0 on success. */
int job_parse_split(cli_ctx *c, const job_opts *o, dsv4_cp_config *cp);
/* --seq / --batch into S and B (left as given when absent); S * B must fit the int32 cu_seqlens. */
int job_parse_shape(cli_ctx *c, const job_opts *o, int64_t *S, int64_t *B);

/* Layer i of the range over its weights, patched for CP over all ranks when cp is 1 and there are
 * several (with *comm, created when NULL; free both). Records errors in c; returns 0 on success. */
int job_make_layer(cli_ctx *c, job *j, int i, int cp, dsv4_layer **l, dsv4_comm **comm);

/* max |a - b| and max |b| over n values. */
void job_diff(const float *a, const float *b, int64_t n, double *max_diff, double *max_ref);

/* The name of a weight's gradient everywhere (files, reports): "grad." + the tensor's full name as
 * the weights file has it (SPEC 7), e.g. grad.layers.2.attn.wq_a.weight. */
void job_grad_name(const job *j, const char *short_name, char *buf, size_t n);

/* Writes out.safetensors with the names of SPEC 7. Collective: every rank streams its rows of out,
 * topk_ids and dx (job.keep_local results) to rank 0's writer, which never holds more than its own
 * rows and one 64 MiB chunk. A failure while the others are sending aborts the job. */
void job_write(cli_ctx *c, const job *j, const job_result *r, const char *path);
/* Rank 0, before any loading: the output file given by option opt ("--output") can be written
 * there (dsv4_output_check: its directory is writable, the path is absent or a regular file), so a
 * long run does not fail at the very end, nor replace a device, FIFO, directory or link. */
void job_check_output_path(cli_ctx *c, const char *opt, const char *path);

#endif
