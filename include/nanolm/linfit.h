/*
 * nanolm linfit: the (weighted) least-squares line y = intercept + slope * x, the one home of
 * the straight-line fit used by the scaling-law fits (log-log lines), the IsoFLOP sweeps and the
 * alpha-beta model of the collectives.
 */
#ifndef NANOLM_LINFIT_H
#define NANOLM_LINFIT_H

#include <stddef.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_linfit {
    double slope, intercept;
    double r2;   /* weighted coefficient of determination, 1 - SS_res / SS_tot (1 if SS_tot = 0) */
    int clamped; /* nl_linfit_nonneg only: 1 slope forced to 0, 2 intercept forced to 0 */
} nl_linfit;

/*
 * Fits y = intercept + slope * x to n points by least squares with weights w (NULL: all 1),
 * computed about the weighted means (x, y, w: (n,)). Returns NL_ERR_INVALID (with a message)
 * when n < 2, a weight is negative or not finite, or the x values do not spread (all equal);
 * *out is then left untouched.
 */
nl_status nl_linfit_fit(const double *x, const double *y, const double *w, size_t n, nl_linfit *out);

/*
 * The same fit constrained to slope >= 0 and intercept >= 0 (a latency and a time per byte
 * cannot be negative). When the free fit breaks a constraint, the best fit on that boundary
 * is returned and out->clamped says which one was forced to 0. Errors as nl_linfit_fit.
 */
nl_status nl_linfit_nonneg(const double *x, const double *y, const double *w, size_t n, nl_linfit *out);

#ifdef __cplusplus
}
#endif
#endif
