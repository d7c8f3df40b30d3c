/* job.h: one layer's job as the CLI sees it (SPEC 7): config, weights, the input (file or seeded
 * random), this rank's shard of it, and the gathering and writing of results on rank 0. */
#ifndef DSV4_JOB_H
#define DSV4_JOB_H

#include "cli.h"

typedef struct {
  const char *config, *layer, *weights, *input, *grad, *seed, *seq, *batch, *split, *preset, *doc_lengths;
  int random_dout; /* without grad: dout from the seed (check, demo) */
  int recompute;   /* --recompute: keep fewer activations, rebuild them in the backward */
} job_opts;

typedef struct {
  dsv4_config cfg;
  int layer, ratio;
  uint64_t seed;
  dsv4_weights *w;
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
} job;

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

/* Rank 0 receives full[T, width] from every rank's local rows (placed by global row). Collective. */
void job_gather_rows(cli_ctx *c, const job *j, const void *local, int64_t width, size_t elem, void *full);

/* Results of one run: full size on rank 0 (NULL elsewhere), or this rank's rows when
 * job.keep_local is set. */
typedef struct {
  float *out, *dx;        /* [T, d] or [n, d] */
  int32_t *topk;          /* [T, k] or [n, k], or NULL */
  float loss;             /* indexer loss (r == 4) */
  dsv4_weights *grads;    /* rank-summed, or NULL */
  double fwd_seconds, bwd_seconds; /* wall time of the layer calls (max over ranks) */
} job_result;

/* Runs the layer on this rank's shard: CP over all ranks when cp is 1 and there are several,
 * forward, and backward when the job has dout (gradients summed over ranks). Results are gathered
 * full size on rank 0 (r's arrays allocated there; free with job_result_free). */
typedef enum { JOB_FAST = 0, JOB_NAIVE, JOB_NAIVE_OPS /* naive operators, BLAS products */ } job_path;
void job_execute(cli_ctx *c, job *j, int cp, job_path path, job_result *r, dsv4_cp_stats *stats);
void job_result_free(job_result *r);

/* --split into cp (contiguous when absent); an unknown mode is an error naming it. Returns 0 on success. */
int job_parse_split(cli_ctx *c, const job_opts *o, dsv4_cp_config *cp);
/* --seq / --batch into S and B (left as given when absent); S * B must fit the int32 cu_seqlens. */
int job_parse_shape(cli_ctx *c, const job_opts *o, int64_t *S, int64_t *B);

/* A layer over the job's weights, patched for CP over all ranks when cp is 1 and there are several
 * (*comm then holds the communicator; free both). Records errors in c; returns 0 on success. */
int job_make_layer(cli_ctx *c, job *j, int cp, dsv4_layer **l, dsv4_comm **comm);

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
