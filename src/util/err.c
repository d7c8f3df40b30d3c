/* err.c: status strings and the per-thread last-error message (see err.h). */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_msg[1024];
static _Thread_local char last_where[256];

dsv4_status dsv4__err(dsv4_status st, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  snprintf(last_where, sizeof last_where, "%s:%d", base ? base + 1 : file, line);
  return st;
}

const char *dsv4_last_error(void) { return last_msg[0] ? last_msg : "no error recorded"; }

const char *dsv4_last_error_location(void) { return last_where; }

void dsv4_clear_error(void) {
  last_msg[0] = 0;
  last_where[0] = 0;
}

const char *dsv4_status_string(dsv4_status st) {
  switch (st) {
    case DSV4_OK: return "ok";
    case DSV4_ERR_ARG: return "invalid argument";
    case DSV4_ERR_CONFIG: return "invalid configuration";
    case DSV4_ERR_IO: return "file input/output error";
    case DSV4_ERR_FORMAT: return "malformed file";
    case DSV4_ERR_TENSOR: return "missing or mismatched tensor";
    case DSV4_ERR_NOMEM: return "out of memory";
    case DSV4_ERR_LAYOUT: return "rejected distributed layout";
    case DSV4_ERR_COMM: return "communication error or ranks disagree";
    case DSV4_ERR_STATE: return "call out of order";
    case DSV4_ERR_UNSUPPORTED: return "unsupported";
  }
  return "unknown status";
}
