/* err.h: internal error recording and the CHECK / goto-fail pattern.
 *
 * Every library function returns a dsv4_status. On failure it records one line that names the
 * failing argument (and the file:line that detected it) in a per-thread buffer, read back with
 * dsv4_last_error(). The buffer is per thread so that concurrent callers do not overwrite each
 * other; it is the only state the library keeps outside its handles (like errno).
 * Messages often quote bytes from files (tensor names, dtypes, paths): the recorded line escapes
 * every control byte and every byte >= 0x7f as \xNN, so it is always one printable line.
 *
 * Usage inside a function that owns resources:
 *
 *     dsv4_status rc = DSV4_OK;
 *     float *buf = NULL;
 *     DSV4_CHECK(n > 0, DSV4_ERR_ARG, "n must be positive (got %d)", n);
 *     DSV4_ALLOC(buf, n);
 *     DSV4_TRY(other_step(buf));
 * fail:
 *     free(buf);
 *     return rc;
 */
#ifndef DSV4_ERR_H
#define DSV4_ERR_H

#include <stdlib.h>
#include "dsv4cp.h"
#include "util/mem.h"

/* Records the message and location; returns st so that it can be used in a return statement. */
dsv4_status dsv4__err(dsv4_status st, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* dsv4_escape (dsv4cp_io.h) truncates only between whole characters / escapes. */
#include "dsv4cp_io.h"

#define DSV4_FAIL(st, ...)                                                   \
  do {                                                                       \
    rc = dsv4__err((st), __FILE__, __LINE__, __VA_ARGS__);                   \
    goto fail;                                                               \
  } while (0)

#define DSV4_CHECK(cond, st, ...)                                            \
  do {                                                                       \
    if (!(cond)) DSV4_FAIL(st, __VA_ARGS__);                                 \
  } while (0)

#define DSV4_TRY(expr)                                                       \
  do {                                                                       \
    rc = (expr);                                                             \
    if (rc != DSV4_OK) goto fail;                                            \
  } while (0)

/* Allocates n elements of *ptr's type, zero-filled (calloc), or fails with DSV4_ERR_NOMEM. */
#define DSV4_ALLOC(ptr, n)                                                   \
  do {                                                                       \
    size_t dsv4__n = (size_t)(n);                                            \
    (ptr) = dsv4_calloc(dsv4__n ? dsv4__n : 1, sizeof(*(ptr)));              \
    if (!(ptr))                                                              \
      DSV4_FAIL(DSV4_ERR_NOMEM, "out of memory allocating %zu elements for %s", \
                dsv4__n, #ptr);                                              \
  } while (0)

#endif
