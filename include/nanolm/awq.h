/*
 * AWQ, activation-aware weight quantization (Lin et al. 2023), scale search for one group of
 * linear layers that read the same input x (e.g. q, k, v after one RMSNorm), on plain arrays.
 *
 * Salient input channels (large mean |x_j|) are protected by scaling them up before
 * quantization: W' = W diag(s), x' = x / s, so y = x' W'^T is unchanged in exact arithmetic and
 * the rounding error of channel j shrinks by s_j relative to the signal. As in the reference
 * (mit-han-lab/llm-awq, auto_scale):
 *   s_j = max(mean_t |x_tj|, ...)^alpha clamped below at 1e-4, then s /= sqrt(max s * min s);
 *   alpha in {0, 1/n_grid, ..., (n_grid - 1)/n_grid} (n_grid = 20), choosing the alpha with the
 *   smallest sum over the layers of ||x W^T - (x/s) Q(W diag s)^T||^2 on the calibration x.
 * alpha = 0 gives s = 1, i.e. plain round-to-nearest, so on the calibration data AWQ is never
 * worse than RTN. Q is qgrid's per-group min-max grid (group 128 by default). The weight
 * clipping search of the reference (auto_clip) is not done.
 * The caller folds 1/s into the operation that produces x (an RMSNorm gain, or the rows of the
 * previous linear layer) and uses Q(W diag s) as the layer's weight.
 */
#ifndef NANOLM_AWQ_H
#define NANOLM_AWQ_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nl_awq_opts {
    int bits;       /* 2..8 */
    int group_size; /* 128 by default; 0 = one group per row */
    int n_grid;     /* 20 */
    int symmetric;  /* grid: 0 = min-max with zero point */
} nl_awq_opts;

nl_awq_opts nl_awq_defaults(void);

/* Searches alpha for n_w layers w[i] (rows[i], cols) that all read x (tokens, cols).
 * Writes s (cols), and for each layer w_hat[i] (rows[i], cols) = Q(W_i diag s) dequantized
 * (the weight to use with inputs x / s; w_hat may be NULL). *best_alpha, *err_best and
 * *err_rtn (the alpha = 0 error) may be NULL; errors (n_grid, may be NULL) get the error of
 * every grid point. NL_ERR_INVALID for bad options or shapes, a non-finite x or w. */
nl_status nl_awq_search(const float *x, int64_t tokens, int cols, int n_w, const float *const *w, const int *rows,
                        const nl_awq_opts *opts, float *s, float *const *w_hat, double *best_alpha, double *err_best,
                        double *err_rtn, double *errors);

#ifdef __cplusplus
}
#endif
#endif
