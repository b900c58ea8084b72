/* AWQ scale search (see include/nanolm/awq.h). */
#include "nanolm/awq.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "nanolm/qgrid.h"

nl_awq_opts nl_awq_defaults(void) {
    nl_awq_opts o = {.bits = 4, .group_size = 128, .n_grid = 20, .symmetric = 0};
    return o;
}

/* s_j = max(mean_j^alpha, 1e-4) / sqrt(max s * min s). */
static void awq_scales(const double *mean_abs, int cols, double alpha, float *s) {
    double smax = 0, smin = INFINITY;
    for (int j = 0; j < cols; j++) {
        double v = pow(mean_abs[j], alpha);
        if (v < 1e-4) v = 1e-4;
        s[j] = (float)v;
        if (s[j] > smax) smax = s[j];
        if (s[j] < smin) smin = s[j];
    }
    float norm = (float)sqrt(smax * smin);
    for (int j = 0; j < cols; j++) s[j] /= norm;
}

nl_status nl_awq_search(const float *x, int64_t tokens, int cols, int n_w, const float *const *w, const int *rows,
                        const nl_awq_opts *opts, float *s, float *const *w_hat, double *best_alpha, double *err_best,
                        double *err_rtn, double *errors) {
    nl_awq_opts o = opts ? *opts : nl_awq_defaults();
    if (o.bits < 2 || o.bits > 8) return nl_fail(NL_ERR_INVALID, "awq: bits must be 2..8, got %d", o.bits);
    if (o.group_size < 0) return nl_fail(NL_ERR_INVALID, "awq: group size must be >= 0, got %d", o.group_size);
    if (o.n_grid < 1) return nl_fail(NL_ERR_INVALID, "awq: grid must have >= 1 point, got %d", o.n_grid);
    if (tokens <= 0 || cols <= 0 || n_w <= 0)
        return nl_fail(NL_ERR_INVALID, "awq: bad shapes (tokens %lld, cols %d, layers %d)", (long long)tokens, cols,
                       n_w);
    int64_t bad = nl_qgrid_first_nonfinite(x, tokens * cols);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "awq: calibration input token %lld feature %lld is not finite",
                       (long long)(bad / cols), (long long)(bad % cols));
    int max_rows = 0;
    for (int i = 0; i < n_w; i++) {
        if (rows[i] <= 0) return nl_fail(NL_ERR_INVALID, "awq: layer %d has %d rows", i, rows[i]);
        bad = nl_qgrid_first_nonfinite(w[i], (int64_t)rows[i] * cols);
        if (bad >= 0)
            return nl_fail(NL_ERR_INVALID, "awq: layer %d weight row %lld col %lld is not finite", i,
                           (long long)(bad / cols), (long long)(bad % cols));
        if (rows[i] > max_rows) max_rows = rows[i];
    }
    nl_status rc = NL_OK;
    double *mean_abs = nl_calloc((size_t)cols, sizeof(double), "awq mean |x|");
    float *sc = nl_malloc((size_t)cols * sizeof(float), "awq scales");
    float *xs = nl_malloc((size_t)(tokens * cols) * sizeof(float), "awq scaled input");
    float *ws = nl_malloc((size_t)max_rows * cols * sizeof(float), "awq scaled weight");
    float *y = nl_malloc((size_t)(tokens * max_rows) * sizeof(float), "awq output");
    float *yq = nl_malloc((size_t)(tokens * max_rows) * sizeof(float), "awq quantized output");
    if (!mean_abs || !sc || !xs || !ws || !y || !yq) {
        rc = NL_ERR_NOMEM;
        goto done;
    }
    for (int64_t t = 0; t < tokens; t++)
        for (int j = 0; j < cols; j++) mean_abs[j] += fabs((double)x[t * cols + j]);
    for (int j = 0; j < cols; j++) mean_abs[j] /= (double)tokens;

    double best = INFINITY;
    for (int a = 0; a < o.n_grid; a++) {
        double alpha = (double)a / o.n_grid;
        awq_scales(mean_abs, cols, alpha, sc);
        for (int64_t t = 0; t < tokens; t++)
            for (int j = 0; j < cols; j++) xs[t * cols + j] = x[t * cols + j] / sc[j];
        double err = 0;
        for (int i = 0; i < n_w; i++) {
            const int R = rows[i];
            for (int r = 0; r < R; r++)
                for (int j = 0; j < cols; j++) ws[(int64_t)r * cols + j] = w[i][(int64_t)r * cols + j] * sc[j];
            rc = nl_qgrid_rtn(ws, R, cols, o.bits, o.group_size, o.symmetric, NULL, NULL, NULL, ws);
            if (rc != NL_OK) goto done;
            /* y = x W^T (tokens, R) and yq = (x/s) Q(W s)^T. */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tokens, R, cols, 1.f, x, cols, w[i], cols, 0.f, y,
                        R);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)tokens, R, cols, 1.f, xs, cols, ws, cols, 0.f, yq,
                        R);
            for (int64_t k = 0; k < tokens * R; k++) {
                double d = (double)y[k] - yq[k];
                err += d * d;
            }
        }
        if (errors) errors[a] = err;
        if (a == 0 && err_rtn) *err_rtn = err;
        if (err < best) {
            best = err;
            memcpy(s, sc, (size_t)cols * sizeof(float));
            if (best_alpha) *best_alpha = alpha;
        }
    }
    if (err_best) *err_best = best;
    if (w_hat)
        for (int i = 0; i < n_w; i++) {
            if (!w_hat[i]) continue;
            for (int r = 0; r < rows[i]; r++)
                for (int j = 0; j < cols; j++) w_hat[i][(int64_t)r * cols + j] = w[i][(int64_t)r * cols + j] * s[j];
            rc = nl_qgrid_rtn(w_hat[i], rows[i], cols, o.bits, o.group_size, o.symmetric, NULL, NULL, NULL, w_hat[i]);
            if (rc != NL_OK) goto done;
        }
done:
    if (rc == NL_ERR_NOMEM) nl_fail(rc, "awq: out of memory (tokens %lld, cols %d)", (long long)tokens, cols);
    nl_free(mean_abs);
    nl_free(sc);
    nl_free(xs);
    nl_free(ws);
    nl_free(y);
    nl_free(yq);
    return rc;
}
