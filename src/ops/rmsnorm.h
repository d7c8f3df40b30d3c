/* rmsnorm.h: RMSNorm of one row, forward and backward (SPEC 3). */
#ifndef DSV4_RMSNORM_H
#define DSV4_RMSNORM_H

/* y = v / sqrt(mean(v^2) + eps) * w (w may be NULL: no weight). y may alias v.
 * Returns the inverse rms s, which backward needs. The sum of squares is accumulated in double,
 * in index order, so a row's result never depends on where it sits. */
float dsv4_rmsnorm_row(float *y, const float *v, const float *w, int n, double eps);

/* The inverse rms 1 / sqrt(mean(v^2) + eps) alone (same arithmetic as dsv4_rmsnorm_row). */
float dsv4_rms_inv(const float *v, int n, double eps);

/* Backward of y = v * s * w:  dw += dy * v * s (if dw);  g = dy * w;
 * dv = s * g - s^3 * v * (g . v) / n   (overwritten; dv may alias dy). */
void dsv4_rmsnorm_bwd_row(float *dv, float *dw, const float *dy, const float *v, const float *w,
                          float s, int n);

#endif
