/*
 * SmoothQuant (Xiao et al. 2022) for linear layers that read one input x, on plain arrays.
 *
 * Activation outliers sit in a few channels and make per-token int8 activations coarse.
 * SmoothQuant moves part of that range into the weights with a per-input-channel factor
 *   s_j = max_t |x_tj|^alpha / max_i |W_ij|^(1 - alpha)      (alpha = 0.5)
 * (max over the rows of every layer reading x; s clamped below at 1e-5 as the reference
 * does, dims with no activation or weight range get s = 1): x' = x / s, W' = W diag(s), so
 * y = x' W'^T is unchanged in exact arithmetic, and both x' and W' are then quantized to int8
 * (W8A8: per-token activations, per-output-channel weights). 1/s is folded into the
 * preceding RMSNorm gain, so the division costs nothing at run time.
 */
#ifndef NANOLM_SMOOTHQUANT_H
#define NANOLM_SMOOTHQUANT_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Updates act_absmax (cols) with max_t |x_tj| over x (tokens, cols). Call once per
 * calibration batch on an array that starts at 0. NL_ERR_INVALID on a non-finite input. */
nl_status nl_smoothquant_observe(const float *x, int64_t tokens, int cols, float *act_absmax);

/* The smoothing factors s (cols) for n_w layers w[i] (rows[i], cols) reading x whose
 * per-channel absmax is act_absmax. NL_ERR_INVALID for alpha outside [0, 1], bad shapes or a
 * non-finite input. */
nl_status nl_smoothquant_scales(const float *act_absmax, int cols, int n_w, const float *const *w, const int *rows,
                                double alpha, float *s);

/* W <- W diag(s) for w (rows, cols), and, if gain (cols) is not NULL, gain <- gain / s
 * (the RMSNorm that produces x). */
void nl_smoothquant_apply(float *w, int rows, int cols, const float *s, float *gain);

#ifdef __cplusplus
}
#endif
#endif
