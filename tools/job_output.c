/* job_output.c: where a job's results go: rank 0 collects rows that every rank holds a share of
 * (one primitive, job_collect_rows, for the whole-result gather of check / demo and for the output
 * file's writer), and writes out.safetensors with the names of docs/spec.md section 7. Rank 0
 * never holds more than its own rows and one 64 MiB piece of a tensor being written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4cp_io.h"
#include "job.h"

/* Bytes of one collected piece: keeps every message far below MPI's int count limit and rank 0's
 * buffer small, whatever T is. */
#define PIECE_BYTES (64u << 20)

void job_check_output_path(cli_ctx *c, const char *opt, const char *path) {
  /* the library's rule, checked by rank 0, the one rank that writes (another rank's node may not
   * even have that directory); cli_sync makes its error every rank's line */
  if (c->rank == 0 && dsv4_output_check(path) != DSV4_OK) cli_error(c, "%s: %s", opt, dsv4_last_error());
}

static int cmp_run(const void *a, const void *b) {
  const job_run *x = a, *y = b;
  return (x->g0 > y->g0) - (x->g0 < y->g0);
}

int job_owners(cli_ctx *c, const job *j, job_run **out, int *n_out) {
  int64_t *rows = malloc(sizeof(int64_t) * (size_t)(j->n + 1)), n = 0;
  job_run *v = NULL;
  int cnt = 0, cap = 0;
  *out = NULL;
  *n_out = 0;
  if (!rows) return cli_error(c, "out of memory"), 1;
  for (int q = 0; q < c->size; q++) {
    if (cli_lib(c, dsv4_cp_shard_rows(&j->pk, &j->cp, q, c->size, rows, &n))) break;
    for (int64_t i = 0, e; i < n; i = e) {
      for (e = i + 1; e < n && rows[e] == rows[e - 1] + 1; e++) {}
      if (cnt == cap) {
        job_run *bigger = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 64));
        if (!bigger) {
          cli_error(c, "out of memory");
          break;
        }
        v = bigger;
      }
      v[cnt++] = (job_run){rows[i], e - i, i, q};
    }
  }
  free(rows);
  if (c->err[0]) return free(v), 1;
  qsort(v, (size_t)cnt, sizeof *v, cmp_run);
  *out = v;
  *n_out = cnt;
  return 0;
}

/* The one collection primitive (job.h): the same walk over the owners' runs on every rank, so the
 * messages pair up in order. */
void job_collect_rows(const cli_ctx *c, const job_run *runs, int n_runs, const void *local, size_t row_bytes,
                      int64_t r0, int64_t n, void *dst) {
  for (int i = 0; i < n_runs; i++) {
    const job_run *o = &runs[i];
    const int64_t a = o->g0 > r0 ? o->g0 : r0, b = o->g0 + o->len < r0 + n ? o->g0 + o->len : r0 + n;
    if (a >= b) continue;
    const char *src = (const char *)local + (size_t)(o->lo + a - o->g0) * row_bytes;
    const size_t bytes = (size_t)(b - a) * row_bytes;
    if (c->rank == 0) {
      char *to = (char *)dst + (size_t)(a - r0) * row_bytes;
      if (o->rank == 0) memcpy(to, src, bytes);
      else MPI_Recv(to, (int)bytes, MPI_BYTE, o->rank, 1, c->comm, MPI_STATUS_IGNORE);
    } else if (o->rank == c->rank) {
      MPI_Send(src, (int)bytes, MPI_BYTE, 0, 1, c->comm);
    }
  }
}

/* Rows per piece of a tensor whose rows are row_bytes (the same on every rank). */
static int64_t piece_rows(size_t row_bytes) {
  const int64_t r = (int64_t)(PIECE_BYTES / row_bytes);
  return r > 0 ? r : 1;
}

void job_gather_rows(cli_ctx *c, const job *j, const void *local, size_t row_bytes, void *full) {
  job_run *runs = NULL;
  int n_runs = 0;
  if (job_owners(c, j, &runs, &n_runs)) { /* global values only: every rank fails alike */
    cli_abort(c);
    return;
  }
  const int64_t per = piece_rows(row_bytes);
  for (int64_t r0 = 0; r0 < j->T; r0 += per)
    job_collect_rows(c, runs, n_runs, local, row_bytes, r0, j->T - r0 < per ? j->T - r0 : per,
                     full ? (char *)full + (size_t)r0 * row_bytes : NULL);
  free(runs);
}

void job_grad_name(const job *j, const char *short_name, char *buf, size_t n) {
  snprintf(buf, n, "grad.%s%s", dsv4_weights_prefix(j->w), short_name);
}

/* What the writer's fill callback collects: one tensor's rows. */
typedef struct {
  const cli_ctx *c;
  const job_run *runs;
  int n_runs;
  const void *local;
  size_t row_bytes;
} piece_ctx;

static dsv4_status fill_piece(void *vctx, int64_t r0, int64_t n, void *dst) {
  const piece_ctx *s = vctx;
  job_collect_rows(s->c, s->runs, s->n_runs, s->local, s->row_bytes, r0, n, dst);
  return DSV4_OK;
}

/* The tensors of one layer's results in the order the file holds them, with their row sources. */
typedef struct {
  char name[48];
  const void *local;
  size_t row_bytes;
  int dtype, ndim;
  int64_t shape[3];
} row_tensor;

static int layer_tensors(const job *j, const job_result *r, row_tensor *t) {
  const int64_t d = j->cfg.dim, k = j->cfg.index_topk;
  const int64_t xs[3] = {j->x_ndim == 3 ? j->B : j->T, j->x_ndim == 3 ? j->S : d, d};
  int n = 0;
  t[n] = (row_tensor){"", r->out, sizeof(float) * (size_t)d, DSV4_DT_F32, j->x_ndim, {xs[0], xs[1], xs[2]}};
  job_tensor_name(j, "out", r->layer, t[n++].name, sizeof t->name);
  if (r->topk) {
    t[n] = (row_tensor){"", r->topk, sizeof(int32_t) * (size_t)k, DSV4_DT_I32, 2, {j->T, k, 0}};
    job_tensor_name(j, "topk_ids", r->layer, t[n++].name, sizeof t->name);
  }
  if (r->dx) {
    t[n] = (row_tensor){"", r->dx, sizeof(float) * (size_t)d, DSV4_DT_F32, j->x_ndim, {xs[0], xs[1], xs[2]}};
    job_tensor_name(j, "dx", r->layer, t[n++].name, sizeof t->name);
  }
  return n;
}

void job_write(cli_ctx *c, const job *j, const job_result *r, const char *path) {
  const int nl = j->n_lay;
  int64_t one = 1;
  row_tensor *rt = calloc((size_t)nl * 3 + 1, sizeof *rt);
  piece_ctx *ctx = calloc((size_t)nl * 3 + 1, sizeof *ctx);
  dsv4_st_writer *w = NULL;
  char **names = NULL;
  int n_names = 0, n_rt = 0, n_runs = 0, bad = 0;
  job_run *runs = NULL;
  if (!rt || !ctx) bad = (cli_error(c, "out of memory"), 1);
  if (!bad && job_owners(c, j, &runs, &n_runs)) bad = 1; /* global values only: every rank fails alike */
  if (bad) {
    cli_abort(c);
    return;
  }
  int first[nl + 1]; /* each layer's first row tensor */
  for (int i = 0; i < nl; i++) {
    first[i] = n_rt;
    n_rt += layer_tensors(j, &r[i], rt + n_rt);
  }
  first[nl] = n_rt;
  for (int t = 0; t < n_rt; t++) ctx[t] = (piece_ctx){c, runs, n_runs, rt[t].local, rt[t].row_bytes};
  if (c->rank != 0) { /* the senders: the same pieces, in the order rank 0's writer asks for them */
    for (int t = 0; t < n_rt; t++) {
      const int64_t per = piece_rows(rt[t].row_bytes);
      for (int64_t r0 = 0; r0 < j->T; r0 += per) fill_piece(&ctx[t], r0, j->T - r0 < per ? j->T - r0 : per, NULL);
    }
    free(runs), free(rt), free(ctx);
    return;
  }
  int n_grads = 0;
  for (int i = 0; i < nl; i++) n_grads += r[i].grads ? dsv4_weights_count(r[i].grads) : 0;
  bad = cli_lib(c, dsv4_st_writer_create(&w));
  if (!bad && !(names = calloc((size_t)(n_grads + nl) + 1, sizeof *names))) bad = (cli_error(c, "out of memory"), 1);
  for (int i = 0; i < nl && !bad; i++) {
    for (int t = first[i]; t < first[i + 1] && !bad; t++) {
      bad = cli_lib(c, dsv4_st_writer_add_rows(w, rt[t].name, (dsv4_dtype)rt[t].dtype, rt[t].ndim, rt[t].shape,
                                               piece_rows(rt[t].row_bytes), fill_piece, &ctx[t]));
      if (!bad && r[i].has_loss && t == first[i] + (r[i].topk ? 1 : 0)) { /* indexer_loss after topk_ids */
        char *nm = names[n_names++] = malloc(48);
        if (!nm) bad = (cli_error(c, "out of memory"), 1);
        else {
          job_tensor_name(j, "indexer_loss", r[i].layer, nm, 48);
          bad = cli_lib(c, dsv4_st_writer_add(w, nm, DSV4_DT_F32, 1, &one, &r[i].loss));
        }
      }
    }
  }
  for (int i = 0; i < nl && !bad; i++)
    for (int g = 0; r[i].grads && g < dsv4_weights_count(r[i].grads) && !bad; g++) {
      dsv4_tensor t = DSV4_TENSOR_INIT;
      const char *prefix = dsv4_weights_prefix(j->lw[i]);
      bad = cli_lib(c, dsv4_weights_get(r[i].grads, g, &t));
      const size_t len = bad ? 0 : strlen(prefix) + strlen(t.name) + 8;
      if (!bad && !(names[n_names] = malloc(len))) bad = (cli_error(c, "out of memory"), 1);
      if (!bad) {
        snprintf(names[n_names], len, "grad.%s%s", prefix, t.name);
        bad = cli_lib(c, dsv4_st_writer_add(w, names[n_names++], DSV4_DT_F32, t.ndim, t.shape, t.data));
      }
    }
  /* the other ranks are sending (or about to): a failure here cannot be reported by cli_sync */
  if (bad || cli_lib(c, dsv4_st_writer_save(w, path))) cli_abort(c);
  dsv4_st_writer_free(w);
  for (int i = 0; names && i < n_names; i++) free(names[i]);
  free(names);
  free(runs), free(rt), free(ctx);
}
