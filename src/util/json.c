/* json.c: checked JSON number conversions (see json.h). */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"

const char *dsv4_num_text(double v, char *buf, size_t cap) {
  for (int prec = 1; prec <= 17; prec++) { /* 17 significant digits always read back exactly */
    snprintf(buf, cap, "%.*g", prec, v);
    if (!isfinite(v) || strtod(buf, NULL) == v) break;
  }
  return buf;
}

dsv4_status dsv4_json_int(const cJSON *it, const char *what, int64_t lo, int64_t hi, int64_t *out) {
  dsv4_status rc = DSV4_OK;
  char num[40];
  DSV4_CHECK(cJSON_IsNumber(it), DSV4_ERR_CONFIG, "%s must be a number", what);
  const double v = it->valuedouble;
  /* the range test comes first and is done in double: (int64_t)v is only defined once v is in range */
  DSV4_CHECK(isfinite(v) && v == floor(v) && v >= (double)lo && v <= (double)hi, DSV4_ERR_CONFIG,
             "%s must be an integer in [%lld, %lld] (got %s)", what, (long long)lo, (long long)hi,
             dsv4_num_text(v, num, sizeof num));
  *out = (int64_t)v;
fail:
  return rc;
}

dsv4_status dsv4_json_num(const cJSON *it, const char *what, double *out) {
  dsv4_status rc = DSV4_OK;
  char num[40];
  DSV4_CHECK(cJSON_IsNumber(it), DSV4_ERR_CONFIG, "%s must be a number", what);
  DSV4_CHECK(isfinite(it->valuedouble), DSV4_ERR_CONFIG, "%s must be a finite number (got %s)", what,
             dsv4_num_text(it->valuedouble, num, sizeof num));
  *out = it->valuedouble;
fail:
  return rc;
}
