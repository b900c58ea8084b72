/* GPTQ for one linear layer (see include/nanolm/gptq.h for the algorithm and its choices). */
#include "nanolm/gptq.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "nanolm/qgrid.h"

nl_gptq_opts nl_gptq_defaults(void) {
    nl_gptq_opts o = {.bits = 4, .group_size = 128, .block_size = 128, .damp_frac = 0.01, .symmetric = 0};
    return o;
}

/* ---- Hessian ------------------------------------------------------------------------------ */

nl_status nl_gptq_hessian_init(nl_gptq_hessian *hs, int n) {
    memset(hs, 0, sizeof *hs);
    if (n <= 0) return nl_fail(NL_ERR_INVALID, "gptq: Hessian needs n > 0 features, got %d", n);
    hs->h = nl_calloc((size_t)n * (size_t)n, sizeof(double), "gptq Hessian");
    if (!hs->h) return NL_ERR_NOMEM;
    hs->n = n;
    return NL_OK;
}

void nl_gptq_hessian_free(nl_gptq_hessian *hs) {
    nl_free(hs->h);
    memset(hs, 0, sizeof *hs);
}

nl_status nl_gptq_hessian_add(nl_gptq_hessian *hs, const float *x, int64_t n_tokens) {
    if (!hs->h) return nl_fail(NL_ERR_INVALID, "gptq: Hessian not initialized");
    if (n_tokens < 0) return nl_fail(NL_ERR_INVALID, "gptq: negative token count %lld", (long long)n_tokens);
    if (n_tokens == 0) return NL_OK;
    const int n = hs->n;
    int64_t bad = nl_qgrid_first_nonfinite(x, n_tokens * n);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "gptq: calibration input token %lld feature %lld is not finite",
                       (long long)(bad / n), (long long)(bad % n));
    const int64_t chunk = 1024;
    double *xd =
        nl_malloc((size_t)(n_tokens < chunk ? n_tokens : chunk) * (size_t)n * sizeof(double), "gptq Hessian chunk");
    if (!xd) return NL_ERR_NOMEM;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
        int64_t t = n_tokens - t0 < chunk ? n_tokens - t0 : chunk;
        for (int64_t i = 0; i < t * n; i++) xd[i] = x[t0 * n + i];
        /* Running mean: h = h * N/(N+t) + 2/(N+t) * X^T X (upper triangle). */
        double total = (double)(hs->n_tokens + t);
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, n, (int)t, 2.0 / total, xd, n, (double)hs->n_tokens / total,
                    hs->h, n);
        hs->n_tokens += t;
    }
    nl_free(xd);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) hs->h[(size_t)i * n + j] = hs->h[(size_t)j * n + i];
    return NL_OK;
}

/* ---- U = chol(H^-1), upper ----------------------------------------------------------------- */

/* In-place lower Cholesky of a (n, n) row-major (lower triangle used), blocked by 128:
 * unblocked factor of the diagonal block, triangular solve of the panel below it, rank-b
 * update of the trailing matrix (the last two with BLAS level 3). Returns the first column
 * whose pivot is not positive, or -1. */
static int64_t chol_lower(double *a, int64_t n) {
    const int64_t nb = 128;
    for (int64_t k = 0; k < n; k += nb) {
        const int64_t b = n - k < nb ? n - k : nb;
        for (int64_t j = k; j < k + b; j++) {
            double *aj = a + j * n;
            double s = aj[j];
            for (int64_t p = k; p < j; p++) s -= aj[p] * aj[p];
            if (!(s > 0.0)) return j;
            const double d = sqrt(s);
            aj[j] = d;
            for (int64_t i = j + 1; i < k + b; i++) {
                double *ai = a + i * n;
                double t = ai[j];
                for (int64_t p = k; p < j; p++) t -= ai[p] * aj[p];
                ai[j] = t / d;
            }
        }
        const int64_t m = n - k - b;
        if (m > 0) {
            double *panel = a + (k + b) * n + k;
            cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit, (int)m, (int)b, 1.0,
                        a + k * n + k, (int)n, panel, (int)n);
            cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (int)m, (int)b, -1.0, panel, (int)n, 1.0,
                        a + (k + b) * n + (k + b), (int)n);
        }
    }
    return -1;
}

static void reverse_flat(double *a, int64_t count) {
    for (int64_t i = 0, j = count - 1; i < j; i++, j--) {
        double t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

nl_status nl_gptq_inverse_factor(const double *h, int cols, double damp_frac, double *u, uint8_t *dead) {
    const int64_t n = cols;
    if (cols <= 0) return nl_fail(NL_ERR_INVALID, "gptq: bad column count %d", cols);
    if (!(damp_frac >= 0.0) || !isfinite(damp_frac))
        return nl_fail(NL_ERR_INVALID, "gptq: damp fraction must be finite and >= 0, got %g", damp_frac);
    for (int64_t i = 0; i < n * n; i++)
        if (!isfinite(h[i]))
            return nl_fail(NL_ERR_INVALID, "gptq: Hessian entry (%lld, %lld) is not finite", (long long)(i / n),
                           (long long)(i % n));
    double *a = nl_malloc((size_t)(n * n) * sizeof(double), "gptq factor");
    if (!a) return NL_ERR_NOMEM;
    memcpy(a, h, (size_t)(n * n) * sizeof(double));
    double mean_diag = 0.0;
    for (int64_t i = 0; i < n; i++) {
        int is_dead = a[i * n + i] == 0.0;
        if (dead) dead[i] = (uint8_t)is_dead;
        if (is_dead) a[i * n + i] = 1.0;
        mean_diag += a[i * n + i];
    }
    mean_diag /= (double)n;
    for (int64_t i = 0; i < n; i++) a[i * n + i] += damp_frac * mean_diag;

    /* With J the order reversal, J H J = L L^T gives H = V V^T with V = J L J upper, and
     * H^-1 = (V^-1)^T V^-1: U = V^-1 = J L^-1 J is the upper Cholesky factor of H^-1.
     * Reversing a row-major matrix in both indices is reversing its flat array. */
    reverse_flat(a, n * n);
    int64_t bad = chol_lower(a, n);
    if (bad >= 0) {
        nl_free(a);
        return nl_fail(NL_ERR_NUMERIC,
                       "gptq: H + damp is not positive definite at column %lld; "
                       "raise the dampening",
                       (long long)(n - 1 - bad));
    }
    /* L^-1 (lower) into u: solve L X = I one block column at a time (rows >= c only). */
    memset(u, 0, (size_t)(n * n) * sizeof(double));
    for (int64_t i = 0; i < n; i++) u[i * n + i] = 1.0;
    const int64_t nb = 128;
    for (int64_t c = 0; c < n; c += nb) {
        const int64_t b = n - c < nb ? n - c : nb;
        cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, (int)(n - c), (int)b, 1.0,
                    a + c * n + c, (int)n, u + c * n + c, (int)n);
    }
    nl_free(a);
    reverse_flat(u, n * n);
    return NL_OK;
}

/* ---- the column loop ---------------------------------------------------------------------- */

enum { TILE_ROWS = 16 };

nl_status nl_gptq_quantize(const float *w, int rows, int cols, const double *h, const nl_gptq_opts *opts,
                           uint8_t *codes, float *scales, float *zeros, float *w_hat, double *loss) {
    nl_gptq_opts o = opts ? *opts : nl_gptq_defaults();
    if (o.bits < 2 || o.bits > 8) return nl_fail(NL_ERR_INVALID, "gptq: bits must be 2..8, got %d", o.bits);
    if (o.group_size < 0) return nl_fail(NL_ERR_INVALID, "gptq: group size must be >= 0, got %d", o.group_size);
    if (o.block_size <= 0) return nl_fail(NL_ERR_INVALID, "gptq: block size must be > 0, got %d", o.block_size);
    if (rows <= 0 || cols <= 0) return nl_fail(NL_ERR_INVALID, "gptq: bad weight shape (%d, %d)", rows, cols);
    const int64_t n = cols, B = o.block_size;
    int64_t bad = nl_qgrid_first_nonfinite(w, (int64_t)rows * n);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "gptq: weight row %lld col %lld is not finite", (long long)(bad / n),
                       (long long)(bad % n));
    double *u = nl_malloc((size_t)(n * n) * sizeof(double), "gptq U");
    uint8_t *dead = nl_malloc((size_t)n, "gptq dead columns");
    if (!u || !dead) {
        nl_free(u);
        nl_free(dead);
        return NL_ERR_NOMEM;
    }
    nl_status rc = nl_gptq_inverse_factor(h, cols, o.damp_frac, u, dead);
    if (rc != NL_OK) {
        nl_free(u);
        nl_free(dead);
        return rc;
    }

    const int maxq = (1 << o.bits) - 1;
    const int64_t g = o.group_size > 0 ? o.group_size : n;
    const int64_t ng = nl_qgrid_n_groups(n, o.group_size);
    const int64_t n_tiles = (rows + TILE_ROWS - 1) / TILE_ROWS;
    double total_loss = 0.0;
    int nomem = 0;

#pragma omp parallel reduction(+ : total_loss)
    {
        double *wt = nl_malloc((size_t)(TILE_ROWS * n) * sizeof(double), "gptq tile");
        double *w1 = nl_malloc((size_t)(TILE_ROWS * B) * sizeof(double), "gptq block");
        double *e1 = nl_malloc((size_t)(TILE_ROWS * B) * sizeof(double), "gptq block errors");
        double sc[TILE_ROWS], zp[TILE_ROWS];
        if (!wt || !w1 || !e1) {
#pragma omp atomic write
            nomem = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t tile = 0; tile < n_tiles; tile++) {
            if (!wt || !w1 || !e1) continue;
            const int64_t r0 = tile * TILE_ROWS;
            const int64_t R = rows - r0 < TILE_ROWS ? rows - r0 : TILE_ROWS;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < n; c++) wt[r * n + c] = w[(r0 + r) * n + c];
            if (o.group_size == 0) /* one grid per row, from the original weights */
                for (int64_t r = 0; r < R; r++) {
                    nl_qgrid_params(wt + r * n, n, 1, o.bits, o.symmetric, &sc[r], &zp[r]);
                    if (scales) scales[r0 + r] = (float)sc[r];
                    if (zeros) zeros[r0 + r] = (float)zp[r];
                }
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < n; c++)
                    if (dead[c]) wt[r * n + c] = 0.0;
            for (int64_t i1 = 0; i1 < n; i1 += B) {
                const int64_t i2 = i1 + B < n ? i1 + B : n, cnt = i2 - i1;
                for (int64_t r = 0; r < R; r++)
                    for (int64_t k = 0; k < cnt; k++) w1[r * B + k] = wt[r * n + i1 + k];
                for (int64_t k = 0; k < cnt; k++) {
                    const int64_t j = i1 + k;
                    if (o.group_size > 0 && j % g == 0) {
                        const int64_t len = n - j < g ? n - j : g;
                        for (int64_t r = 0; r < R; r++) {
                            nl_qgrid_params(wt + r * n + j, len, 1, o.bits, o.symmetric, &sc[r], &zp[r]);
                            if (scales) scales[(r0 + r) * ng + j / g] = (float)sc[r];
                            if (zeros) zeros[(r0 + r) * ng + j / g] = (float)zp[r];
                        }
                    }
                    const double d = u[j * n + j];
                    const double *uj = u + j * n + i1;
                    for (int64_t r = 0; r < R; r++) {
                        double *row = w1 + r * B;
                        const double x = row[k];
                        const int q = nl_qgrid_code(x, sc[r], zp[r], maxq);
                        const double xq = sc[r] * (q - zp[r]);
                        if (codes) codes[(r0 + r) * n + j] = (uint8_t)q;
                        if (w_hat) w_hat[(r0 + r) * n + j] = (float)xq;
                        const double err = (x - xq) / d;
                        total_loss += 0.5 * err * err;
                        e1[r * B + k] = err;
                        for (int64_t m = k + 1; m < cnt; m++) row[m] -= err * uj[m];
                    }
                }
                /* Lazy batch update of the columns after the block: W[:, i2:] -= E1 U[i1:i2, i2:]. */
                if (i2 < n) {
                    const int64_t len = n - i2;
                    int64_t k = 0;
                    for (; k + 4 <= cnt; k += 4) {
                        const double *u0 = u + (i1 + k) * n + i2, *u1 = u0 + n, *u2 = u1 + n, *u3 = u2 + n;
                        for (int64_t r = 0; r < R; r++) {
                            double *dst = wt + r * n + i2;
                            const double *er = e1 + r * B + k;
                            const double a0 = er[0], a1 = er[1], a2 = er[2], a3 = er[3];
                            for (int64_t m = 0; m < len; m++)
                                dst[m] -= ((a0 * u0[m] + a1 * u1[m]) + (a2 * u2[m] + a3 * u3[m]));
                        }
                    }
                    for (; k < cnt; k++) {
                        const double *u0 = u + (i1 + k) * n + i2;
                        for (int64_t r = 0; r < R; r++) {
                            double *dst = wt + r * n + i2;
                            const double a0 = e1[r * B + k];
                            for (int64_t m = 0; m < len; m++) dst[m] -= a0 * u0[m];
                        }
                    }
                }
            }
        }
        nl_free(wt);
        nl_free(w1);
        nl_free(e1);
    }
    nl_free(u);
    nl_free(dead);
    if (nomem) return nl_fail(NL_ERR_NOMEM, "gptq: out of memory for the row tiles");
    if (loss) *loss = total_loss;
    return NL_OK;
}
