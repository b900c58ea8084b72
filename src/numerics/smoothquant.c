/* SmoothQuant smoothing factors (see include/nanolm/smoothquant.h). */
#include "nanolm/smoothquant.h"

#include <math.h>

#include "nanolm/qgrid.h"

nl_status nl_smoothquant_observe(const float *x, int64_t tokens, int cols, float *act_absmax) {
    if (tokens < 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "smoothquant: bad input shape (%lld, %d)", (long long)tokens, cols);
    int64_t bad = nl_qgrid_first_nonfinite(x, tokens * cols);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "smoothquant: input token %lld feature %lld is not finite",
                       (long long)(bad / cols), (long long)(bad % cols));
    for (int64_t t = 0; t < tokens; t++)
        for (int j = 0; j < cols; j++) act_absmax[j] = fmaxf(act_absmax[j], fabsf(x[t * cols + j]));
    return NL_OK;
}

nl_status nl_smoothquant_scales(const float *act_absmax, int cols, int n_w, const float *const *w, const int *rows,
                                double alpha, float *s) {
    if (!(alpha >= 0.0 && alpha <= 1.0))
        return nl_fail(NL_ERR_INVALID, "smoothquant: alpha must be in [0, 1], got %g", alpha);
    if (cols <= 0 || n_w <= 0)
        return nl_fail(NL_ERR_INVALID, "smoothquant: bad shapes (cols %d, layers %d)", cols, n_w);
    int64_t bad = nl_qgrid_first_nonfinite(act_absmax, cols);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "smoothquant: activation absmax of channel %lld is not finite", (long long)bad);
    for (int j = 0; j < cols; j++) s[j] = 0.f;
    for (int i = 0; i < n_w; i++) {
        if (rows[i] <= 0) return nl_fail(NL_ERR_INVALID, "smoothquant: layer %d has %d rows", i, rows[i]);
        bad = nl_qgrid_first_nonfinite(w[i], (int64_t)rows[i] * cols);
        if (bad >= 0)
            return nl_fail(NL_ERR_INVALID, "smoothquant: layer %d weight row %lld col %lld is not finite", i,
                           (long long)(bad / cols), (long long)(bad % cols));
        for (int r = 0; r < rows[i]; r++)
            for (int j = 0; j < cols; j++) s[j] = fmaxf(s[j], fabsf(w[i][(int64_t)r * cols + j]));
    }
    for (int j = 0; j < cols; j++) {
        double wmax = s[j], amax = act_absmax[j];
        if (wmax <= 0.0 || amax <= 0.0) {
            s[j] = 1.f;
            continue;
        }
        double v = pow(amax, alpha) / pow(wmax < 1e-5 ? 1e-5 : wmax, 1.0 - alpha);
        s[j] = (float)(v < 1e-5 ? 1e-5 : v);
    }
    return NL_OK;
}

void nl_smoothquant_apply(float *w, int rows, int cols, const float *s, float *gain) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) w[(int64_t)r * cols + j] *= s[j];
    if (gain)
        for (int j = 0; j < cols; j++) gain[j] /= s[j];
}
