/* The per-group min-max grid shared by GPTQ, AWQ and RTN (see include/nanolm/qgrid.h). */
#include "nanolm/qgrid.h"

#include <math.h>

void nl_qgrid_params(const double *x, int64_t n, int64_t stride, int bits, int symmetric, double *scale, double *zero) {
    double xmin = 0.0, xmax = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i * stride];
        if (v < xmin) xmin = v;
        if (v > xmax) xmax = v;
    }
    double maxq = (double)((1 << bits) - 1);
    if (symmetric) {
        if (-xmin > xmax) xmax = -xmin;
        if (xmin < 0) xmin = -xmax;
    }
    if (xmin == 0.0 && xmax == 0.0) {
        xmin = -1.0;
        xmax = 1.0;
    }
    double s = (double)(float)((xmax - xmin) / maxq);
    *scale = s;
    *zero = symmetric ? (maxq + 1.0) / 2.0 : nearbyint(-xmin / s);
}

int64_t nl_qgrid_n_groups(int64_t cols, int group_size) {
    if (group_size <= 0) return 1;
    return (cols + group_size - 1) / group_size;
}

int64_t nl_qgrid_first_nonfinite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

nl_status nl_qgrid_rtn(const float *w, int64_t rows, int64_t cols, int bits, int group_size, int symmetric,
                       uint8_t *codes, float *scales, float *zeros, float *w_hat) {
    if (bits < 2 || bits > 8) return nl_fail(NL_ERR_INVALID, "rtn: bits must be 2..8, got %d", bits);
    if (group_size < 0) return nl_fail(NL_ERR_INVALID, "rtn: group size must be >= 0, got %d", group_size);
    if (rows <= 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "rtn: bad weight shape (%lld, %lld)", (long long)rows, (long long)cols);
    int64_t bad = nl_qgrid_first_nonfinite(w, rows * cols);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "rtn: weight[%lld] (row %lld, col %lld) is not finite", (long long)bad,
                       (long long)(bad / cols), (long long)(bad % cols));
    int64_t g = group_size > 0 ? group_size : cols;
    int64_t ng = nl_qgrid_n_groups(cols, group_size);
    int maxq = (1 << bits) - 1;
    double buf[256];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t gi = 0; gi < ng; gi++) {
            int64_t c0 = gi * g, n = cols - c0 < g ? cols - c0 : g;
            double s, z, xmin = 0, xmax = 0;
            /* nl_qgrid_params on doubles; groups larger than the buffer use min/max directly. */
            if (n <= 256) {
                for (int64_t i = 0; i < n; i++) buf[i] = w[r * cols + c0 + i];
                nl_qgrid_params(buf, n, 1, bits, symmetric, &s, &z);
            } else {
                for (int64_t i = 0; i < n; i++) {
                    double v = w[r * cols + c0 + i];
                    if (v < xmin) xmin = v;
                    if (v > xmax) xmax = v;
                }
                double two[2] = {xmin, xmax};
                nl_qgrid_params(two, 2, 1, bits, symmetric, &s, &z);
            }
            if (scales) scales[r * ng + gi] = (float)s;
            if (zeros) zeros[r * ng + gi] = (float)z;
            for (int64_t i = 0; i < n; i++) {
                int q = nl_qgrid_code(w[r * cols + c0 + i], s, z, maxq);
                if (codes) codes[r * cols + c0 + i] = (uint8_t)q;
                if (w_hat) w_hat[r * cols + c0 + i] = (float)(s * (q - z));
            }
        }
    }
    return NL_OK;
}
