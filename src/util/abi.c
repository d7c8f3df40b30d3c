/* abi.c: reading and writing versioned structs (abi.h). */
#include "abi.h"

#include <string.h>

#include "err.h"

typedef struct {
  DSV4_STRUCT_HEAD;
} head;

/* The caller's struct_size, validated. */
static dsv4_status caller_size(const void *p, const char *type, size_t *size) {
  dsv4_status rc = DSV4_OK;
  DSV4_CHECK(p, DSV4_ERR_ARG, "%s is NULL", type);
  const head *h = p;
  DSV4_CHECK(h->struct_size >= sizeof(head), DSV4_ERR_ARG,
             "%s has struct_size %u: initialise it with its DSV4_..._INIT macro", type, (unsigned)h->struct_size);
  DSV4_CHECK(h->struct_version >= 1 && h->struct_version <= DSV4_STRUCT_VERSION, DSV4_ERR_ARG,
             "%s has struct_version %u; this library (%s) knows 1..%u", type, (unsigned)h->struct_version,
             DSV4_VERSION_STRING, (unsigned)DSV4_STRUCT_VERSION);
  *size = h->struct_size;
fail:
  return rc;
}

dsv4_status dsv4__struct_in(void *dst, const void *src, size_t full, const void *defaults, const char *type) {
  dsv4_status rc = DSV4_OK;
  size_t size = 0;
  DSV4_TRY(caller_size(src, type, &size));
  if (defaults) memcpy(dst, defaults, full);
  else memset(dst, 0, full);
  memcpy(dst, src, size < full ? size : full);
  ((head *)dst)->struct_size = (uint32_t)full;
  ((head *)dst)->struct_version = DSV4_STRUCT_VERSION;
fail:
  return rc;
}

dsv4_status dsv4__struct_out(void *dst, const void *src, size_t full, const char *type) {
  dsv4_status rc = DSV4_OK;
  size_t size = 0;
  DSV4_TRY(caller_size(dst, type, &size));
  const head keep = *(const head *)dst;
  memcpy(dst, src, size < full ? size : full);
  *(head *)dst = keep;
fail:
  return rc;
}

dsv4_status dsv4__struct_check(const void *p, const char *type) {
  size_t size = 0;
  return caller_size(p, type, &size);
}
