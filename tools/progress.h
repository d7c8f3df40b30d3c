/* progress.h: a progress line for long commands (run, check, train, bench): elapsed time and an
 * estimate of the time left, redrawn in place ("\r") on stderr. Only rank 0 draws, and only when
 * stderr is a terminal: output captured by a file, a pipe or a test stays exactly as without it.
 *
 * Work is described as a fraction done in [0, 1], set between calls (progress_at); while a long
 * library call runs, a helper thread redraws the line every PROGRESS_REDRAW_S seconds so the elapsed
 * time keeps moving. The estimate extrapolates the rate measured so far:
 *   left = elapsed_at_mark * (1 - done) / done - (now - mark)     (unknown until done > 0) */
#ifndef DSV4_PROGRESS_H
#define DSV4_PROGRESS_H

#include <pthread.h>

#define PROGRESS_MAX_PHASES 8

typedef struct {
  int on; /* drawing (rank 0, stderr a terminal, not silenced) */
  char title[64], label[64];
  double t0, mark, done; /* start, time of the last progress_at, fraction done then */
  const char *phase[PROGRESS_MAX_PHASES];
  double phase_done[PROGRESS_MAX_PHASES];
  int n_phases;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
} progress;

/* Starts the line "title: ..." when rank is 0, stderr is a terminal and quiet is 0. */
void progress_start(progress *p, int rank, int quiet, const char *title);
/* Marks `done` (fraction of the work finished) and what runs now. */
void progress_at(progress *p, const char *label, double done);
/* Named phases and the fraction done when each starts (e.g. forward 0, backward 0.3), for code that
 * only knows which phase it enters (progress_phase). */
void progress_phases(progress *p, int n, const char *const *names, const double *done_at_start);
void progress_phase(progress *p, const char *name);
/* Around other output to the terminal: hold clears the line (and keeps the helper thread from
 * drawing), release draws it again below that output. */
void progress_hold(progress *p);
void progress_release(progress *p);
/* Clears the line for good (at the end, and before an error message). Safe to call twice. */
void progress_stop(progress *p);

#endif
