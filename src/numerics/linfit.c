/* Least-squares straight lines (see include/nanolm/linfit.h). */
#include "nanolm/linfit.h"

#include <math.h>

static double weight(const double *w, size_t i) { return w ? w[i] : 1.0; }

/* Weighted residual sum of squares of y = a + b x, and SS_tot about the weighted mean my. */
static void sums(const double *x, const double *y, const double *w, size_t n, double a, double b, double my,
                 double *ss_res, double *ss_tot) {
    double r = 0, t = 0;
    for (size_t i = 0; i < n; i++) {
        double e = y[i] - (a + b * x[i]), d = y[i] - my;
        r += weight(w, i) * e * e;
        t += weight(w, i) * d * d;
    }
    *ss_res = r;
    *ss_tot = t;
}

static double r2_of(double ss_res, double ss_tot) { return ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0; }

/* Weighted means of x and y; NL_ERR_INVALID on n < 2 or a bad weight. */
static nl_status means(const double *x, const double *y, const double *w, size_t n, double *mx, double *my) {
    if (n < 2) return nl_fail(NL_ERR_INVALID, "line fit: need at least 2 points, got %zu", n);
    double sw = 0, sx = 0, sy = 0;
    for (size_t i = 0; i < n; i++) {
        double wi = weight(w, i);
        if (!(wi >= 0) || !isfinite(wi))
            return nl_fail(NL_ERR_INVALID, "line fit: weight %zu is %g (must be finite and >= 0)", i, wi);
        sw += wi;
        sx += wi * x[i];
        sy += wi * y[i];
    }
    if (!(sw > 0)) return nl_fail(NL_ERR_INVALID, "line fit: all %zu weights are 0", n);
    *mx = sx / sw;
    *my = sy / sw;
    return NL_OK;
}

nl_status nl_linfit_fit(const double *x, const double *y, const double *w, size_t n, nl_linfit *out) {
    double mx = 0, my = 0;
    nl_status rc = means(x, y, w, n, &mx, &my);
    if (rc) return rc;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        double wi = weight(w, i), dx = x[i] - mx;
        sxx += wi * dx * dx;
        sxy += wi * dx * (y[i] - my);
    }
    if (!(sxx > 0)) return nl_fail(NL_ERR_INVALID, "line fit: the %zu x values do not spread (all %g)", n, mx);
    nl_linfit f = {.slope = sxy / sxx, .clamped = 0};
    f.intercept = my - f.slope * mx;
    double ss_res, ss_tot;
    sums(x, y, w, n, f.intercept, f.slope, my, &ss_res, &ss_tot);
    f.r2 = r2_of(ss_res, ss_tot);
    *out = f;
    return NL_OK;
}

nl_status nl_linfit_nonneg(const double *x, const double *y, const double *w, size_t n, nl_linfit *out) {
    nl_linfit f;
    nl_status rc = nl_linfit_fit(x, y, w, n, &f);
    if (rc) return rc;
    if (f.slope >= 0 && f.intercept >= 0) {
        *out = f;
        return NL_OK;
    }
    double mx = 0, my = 0;
    means(x, y, w, n, &mx, &my);
    /* the two boundaries: through the origin (intercept 0) and flat (slope 0); the convex
     * objective's constrained minimum lies on the feasible one with the smaller residual */
    double sxx0 = 0, sxy0 = 0;
    for (size_t i = 0; i < n; i++) {
        sxx0 += weight(w, i) * x[i] * x[i];
        sxy0 += weight(w, i) * x[i] * y[i];
    }
    nl_linfit best = {.slope = 0, .intercept = my > 0 ? my : 0, .clamped = 1};
    double res_best, res, tot;
    sums(x, y, w, n, best.intercept, best.slope, my, &res_best, &tot);
    if (sxx0 > 0) {
        nl_linfit o = {.slope = sxy0 / sxx0 > 0 ? sxy0 / sxx0 : 0, .intercept = 0, .clamped = 2};
        sums(x, y, w, n, o.intercept, o.slope, my, &res, &tot);
        if (res < res_best) {
            best = o;
            res_best = res;
        }
    }
    best.r2 = r2_of(res_best, tot);
    *out = best;
    return NL_OK;
}
