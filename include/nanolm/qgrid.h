/*
 * qgrid: the per-group uniform grid that GPTQ, AWQ and their round-to-nearest (RTN) baseline
 * share, so that the three are compared on exactly the same codes.
 *
 * The rule is the one of the public GPTQ reference quantizer (min-max with a zero point):
 *   xmin = min(min x, 0), xmax = max(max x, 0)             (the range always contains 0)
 *   symmetric: xmax = max(|xmin|, xmax); xmin = -xmax if xmin < 0
 *   if xmin == xmax == 0: xmin = -1, xmax = 1              (an all-zero group: finite scale, q = zero)
 *   scale = (xmax - xmin) / maxq, rounded to fp32          (maxq = 2^bits - 1)
 *   zero  = round(-xmin / scale)  (symmetric: (maxq + 1) / 2)
 *   q     = clamp(round(x / scale) + zero, 0, maxq)        (round = ties to even)
 *   x^    = scale * (q - zero)
 * Codes are unsigned 0..maxq; scale is stored as fp32 and zero as a small integer.
 */
#ifndef NANOLM_QGRID_H
#define NANOLM_QGRID_H

#include <math.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Grid parameters of the `n` values x[0], x[stride], ... for `bits` (2..8). Never fails
 * (the caller checks bits); NaN in x is the caller's business (checked at the API edge). */
void nl_qgrid_params(const double *x, int64_t n, int64_t stride, int bits, int symmetric, double *scale, double *zero);

/* Code of x on the grid (scale, zero) with maxq = 2^bits - 1. */
static inline int nl_qgrid_code(double x, double scale, double zero, int maxq) {
    double q = nearbyint(x / scale) + zero;
    if (q < 0) q = 0;
    if (q > maxq) q = maxq;
    return (int)q;
}

/* Round-to-nearest on the grid for a (rows, cols) row-major weight with groups of
 * `group_size` consecutive input columns per row (0 = one group per row; a last partial group
 * is allowed). Writes any of codes (rows, cols), scales/zeros (rows, n_groups) and the
 * dequantized w_hat (rows, cols) that are not NULL. Returns NL_ERR_INVALID for bits outside
 * 2..8, a negative group size, bad shapes, or a NaN/inf weight (message names the index). */
nl_status nl_qgrid_rtn(const float *w, int64_t rows, int64_t cols, int bits, int group_size, int symmetric,
                       uint8_t *codes, float *scales, float *zeros, float *w_hat);

/* Number of groups per row for `cols` columns and `group_size` (0 = one). */
int64_t nl_qgrid_n_groups(int64_t cols, int group_size);

/* First non-finite value of x[0..n) or -1. */
int64_t nl_qgrid_first_nonfinite(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
