/* abi.h: the versioned structs of the public headers (dsv4cp.h conventions). A caller's struct may
 * be older (smaller) or newer (larger) than the library's: inputs are copied into a full-size local
 * struct whose missing fields keep their defaults; outputs are written only up to the caller's size. */
#ifndef DSV4_ABI_H
#define DSV4_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "dsv4cp.h"

/* *dst (full bytes, a library struct) = the caller's src (src->struct_size bytes), fields beyond
 * it taken from defaults (NULL: zeros); dst's head becomes the library's. `type` names the struct in
 * the error (NULL src, struct_size 0 or below the head, an unknown struct_version). */
dsv4_status dsv4__struct_in(void *dst, const void *src, size_t full, const void *defaults, const char *type);
/* Copies the library's src (full bytes) into the caller's dst up to dst->struct_size, keeping dst's
 * head; same errors. */
dsv4_status dsv4__struct_out(void *dst, const void *src, size_t full, const char *type);

/* Only the checks of struct_out (before a function computes what it will write). */
dsv4_status dsv4__struct_check(const void *p, const char *type);

#define DSV4_STRUCT_CHECK(p, type) dsv4__struct_check((p), #type)
#define DSV4_STRUCT_IN(dst, src, type, defaults) dsv4__struct_in((dst), (src), sizeof(type), (defaults), #type)
#define DSV4_STRUCT_OUT(dst, src, type) dsv4__struct_out((dst), (src), sizeof(type), #type)

/* The caller's config as a full-size library struct (src/config.c). */
dsv4_status dsv4_config_in(dsv4_config *full, const dsv4_config *cfg);

#endif
