/*
 * GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
 * Pre-trained Transformers", Algorithm 1) for one linear layer on plain arrays.
 *
 * A layer y = W x has W (rows = output channels, cols = input features). Calibration inputs
 * X give the Hessian of the layer's squared output error, H = 2 X X^T (cols, cols). GPTQ
 * quantizes the columns of W in order; after each column the rounding error, divided by the
 * diagonal of U = chol(H^-1) (upper), is spread to the not-yet-quantized columns through U's
 * row, so later columns compensate for earlier rounding. Updates to columns outside the
 * current block of 128 are applied lazily once per block (a rank-128 update).
 *
 * Details, as in the public reference implementation (IST-DASLab/gptq, gptq.py):
 *  - dead inputs (H_ii == 0, the feature was always 0) get H_ii = 1 and W[:, i] = 0;
 *  - dampening: H += damp_frac * mean(diag H) * I (damp_frac = 0.01);
 *  - the grid is qgrid's per-group min-max with a zero point (include/nanolm/qgrid.h);
 *    a group's scale and zero are computed when its first column is reached, from the weights
 *    as the lazy block updates left them: they include the error feedback of all earlier
 *    blocks but not that of earlier columns of the same 128-block (the reference reads the
 *    global W there; with group 128 = block 128 the two coincide);
 *    group_size 0 means one grid per row computed once from the original weights;
 *  - no activation reordering (act-order off), columns in natural order.
 * Everything runs in double: the Hessian, its factorization and the column loop.
 * U is computed as the inverse of the "upper" Cholesky factor of H (H = V V^T, V upper),
 * which is the unique upper factor of H^-1 = U^T U; the reference gets the same U with
 * cholesky -> cholesky_inverse -> cholesky(upper).
 */
#ifndef NANOLM_GPTQ_H
#define NANOLM_GPTQ_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_gptq_opts {
    int bits;         /* 2..8 */
    int group_size;   /* 0 = one grid per row, else columns per group (32, 64, 128, ...) */
    int block_size;   /* lazy-batch block, 128 */
    double damp_frac; /* 0.01 = 1% of the mean diagonal */
    int symmetric;    /* 0 = min-max with zero point (reference default), 1 = symmetric */
} nl_gptq_opts;

/* bits 4, group 128, block 128, damp 0.01, min-max. */
nl_gptq_opts nl_gptq_defaults(void);

/* Running Hessian of one layer's input: h = 2/N sum_t x_t x_t^T over the N tokens seen
 * (the mean, as the reference keeps it; GPTQ is invariant to the scale of H). */
typedef struct nl_gptq_hessian {
    int n; /* input features */
    int64_t n_tokens;
    double *h; /* (n, n), symmetric, full storage */
} nl_gptq_hessian;

/* Allocates a zero Hessian for n input features. NL_ERR_INVALID for n <= 0, NL_ERR_NOMEM. */
nl_status nl_gptq_hessian_init(nl_gptq_hessian *hs, int n);
/* Adds n_tokens input rows x (n_tokens, n) row-major. NL_ERR_INVALID for a NaN/inf input
 * (message names the token and feature). */
nl_status nl_gptq_hessian_add(nl_gptq_hessian *hs, const float *x, int64_t n_tokens);
void nl_gptq_hessian_free(nl_gptq_hessian *hs);

/* Quantizes w (rows, cols) with GPTQ given the Hessian h (cols, cols) (not modified).
 * Outputs (any may be NULL): codes (rows, cols) in 0..2^bits-1, scales and zeros
 * (rows, n_groups) with n_groups = nl_qgrid_n_groups(cols, group_size), w_hat (rows, cols)
 * = scale * (code - zero), and *loss = sum over entries of (w - w^)^2 / (2 U_jj^2), the
 * reference's error estimate. Uses nl_threads() OpenMP threads over row tiles; the result
 * does not depend on the thread count.
 * Errors: NL_ERR_INVALID (bits, group, block, damp, shapes, non-finite w or h),
 * NL_ERR_NUMERIC (H + damp is not positive definite), NL_ERR_NOMEM. */
nl_status nl_gptq_quantize(const float *w, int rows, int cols, const double *h, const nl_gptq_opts *opts,
                           uint8_t *codes, float *scales, float *zeros, float *w_hat, double *loss);

/* The factor U (cols, cols), upper, with (H + damp)^-1 = U^T U, after the dead-column fix;
 * `dead` (cols) is set to 1 where H_ii == 0 (may be NULL). Exposed for tests. */
nl_status nl_gptq_inverse_factor(const double *h, int cols, double damp_frac, double *u, uint8_t *dead);

#ifdef __cplusplus
}
#endif
#endif
