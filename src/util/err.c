/* err.c: status strings and the per-thread last-error message (see err.h). The message is
 * escaped when recorded, so whatever bytes a file put in a name, dsv4_last_error() is one
 * printable line that cannot write terminal escape codes. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ERR_MSG_BYTES 1024          /* formatted message before escaping */
#define ERR_ESCAPED_BYTES 2048      /* recorded line: room for some \xNN escapes */

static _Thread_local char last_msg[ERR_ESCAPED_BYTES];
static _Thread_local char last_where[256];

char *dsv4_escape(char *dst, size_t cap, const char *src) {
  static const char hex[] = "0123456789abcdef";
  size_t k = 0;
  if (!cap) return dst;
  for (const unsigned char *p = (const unsigned char *)src; p && *p; p++) {
    if (*p >= 0x20 && *p < 0x7f) {
      if (k + 1 >= cap) break;
      dst[k++] = (char)*p;
    } else {
      if (k + 4 >= cap) break;
      dst[k++] = '\\', dst[k++] = 'x', dst[k++] = hex[*p >> 4], dst[k++] = hex[*p & 15];
    }
  }
  dst[k] = 0;
  return dst;
}

dsv4_status dsv4__err(dsv4_status st, const char *file, int line, const char *fmt, ...) {
  char raw[ERR_MSG_BYTES];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  dsv4_escape(last_msg, sizeof last_msg, raw);
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
