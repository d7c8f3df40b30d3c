/* json.h: checked conversions of JSON numbers (cJSON keeps every number as a double): an integer
 * must be finite, integral and within the range its field can hold, so that no out-of-range double
 * is ever converted to int (undefined behaviour) and the message shows the value as written. */
#ifndef DSV4_JSON_H
#define DSV4_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "dsv4cp.h"

/* The shortest decimal text that reads back as v ("1e+300", "0.5", "inf"). Returns buf. */
const char *dsv4_num_text(double v, char *buf, size_t cap);
/* it must be a number holding an integer in [lo, hi]; what names it in messages
 * (e.g. "config: key 'compress_ratios[2]'"). Errors are DSV4_ERR_CONFIG. */
dsv4_status dsv4_json_int(const cJSON *it, const char *what, int64_t lo, int64_t hi, int64_t *out);
/* it must be a finite number. */
dsv4_status dsv4_json_num(const cJSON *it, const char *what, double *out);

#endif
