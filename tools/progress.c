/* progress.c: the progress line of long commands (see progress.h). */
#include "progress.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_REDRAW_S 0.5

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* "12.3 s", "4 min 05 s" */
static void fmt_time(char *buf, size_t n, double s) {
  if (s < 60)
    snprintf(buf, n, "%.1f s", s);
  else
    snprintf(buf, n, "%d min %02d s", (int)(s / 60), (int)s % 60);
}

/* One redraw; called with the mutex held. "\r" + clear-to-end-of-line keeps it one line. */
static void draw(progress *p) {
  const double t = now_s(), elapsed = t - p->t0;
  char el[32], left[48] = "estimating time left";
  fmt_time(el, sizeof el, elapsed);
  if (p->done >= 1) {
    snprintf(left, sizeof left, "finishing");
  } else if (p->done > 0) {
    double rest = (p->mark - p->t0) * (1 - p->done) / p->done - (t - p->mark);
    if (rest > 0) {
      char r[32];
      fmt_time(r, sizeof r, rest);
      snprintf(left, sizeof left, "about %s left", r);
    } else {
      snprintf(left, sizeof left, "finishing");
    }
  }
  fprintf(stderr, "\r\033[K%s: %s  %3.0f%%  elapsed %s, %s", p->title, p->label, 100 * p->done, el, left);
  fflush(stderr);
}

static void *ticker(void *arg) {
  progress *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)(PROGRESS_REDRAW_S * 1e9);
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT && !p->stop) draw(p);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

void progress_start(progress *p, int rank, int quiet, const char *title) {
  memset(p, 0, sizeof *p);
  if (rank != 0 || quiet || !isatty(STDERR_FILENO)) return;
  snprintf(p->title, sizeof p->title, "%s", title);
  snprintf(p->label, sizeof p->label, "starting");
  p->t0 = p->mark = now_s();
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->on = pthread_create(&p->thread, NULL, ticker, p) == 0;
  if (p->on) {
    pthread_mutex_lock(&p->mu);
    draw(p);
    pthread_mutex_unlock(&p->mu);
  }
}

void progress_at(progress *p, const char *label, double done) {
  if (!p || !p->on) return;
  pthread_mutex_lock(&p->mu);
  snprintf(p->label, sizeof p->label, "%s", label);
  p->done = done < 0 ? 0 : done > 1 ? 1 : done;
  p->mark = now_s();
  draw(p);
  pthread_mutex_unlock(&p->mu);
}

void progress_phases(progress *p, int n, const char *const *names, const double *done_at_start) {
  if (!p) return;
  p->n_phases = n < PROGRESS_MAX_PHASES ? n : PROGRESS_MAX_PHASES;
  for (int i = 0; i < p->n_phases; i++) {
    p->phase[i] = names[i];
    p->phase_done[i] = done_at_start[i];
  }
}

void progress_phase(progress *p, const char *name) {
  if (!p || !p->on) return;
  for (int i = 0; i < p->n_phases; i++)
    if (!strcmp(p->phase[i], name)) progress_at(p, name, p->phase_done[i]);
}

void progress_hold(progress *p) {
  if (!p || !p->on) return;
  pthread_mutex_lock(&p->mu);
  fprintf(stderr, "\r\033[K");
  fflush(stderr);
}

void progress_release(progress *p) {
  if (!p || !p->on) return;
  draw(p);
  pthread_mutex_unlock(&p->mu);
}

void progress_stop(progress *p) {
  if (!p || !p->on) return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->thread, NULL);
  fprintf(stderr, "\r\033[K");
  fflush(stderr);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  p->on = 0;
}
