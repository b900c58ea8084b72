/*
 * LLM.int8() mixed-precision decomposition (Dettmers et al. 2022) for one linear layer
 * y = x W^T on plain arrays.
 *
 * Weights: int8, vector-wise (one absmax scale per output row: s_r = max_j |W_rj| / 127).
 * Activations: the feature dimensions j in which any token has |x_tj| > threshold (6.0 in the
 * paper) are "outlier dimensions"; they are multiplied in fp32 with the dequantized weight
 * columns. The other dimensions are quantized per token (absmax over the non-outlier
 * dimensions, /127), multiplied int8 x int8 with int32 accumulation, and rescaled by both
 * scales. threshold = INFINITY gives plain vector-wise W8A8 (no decomposition), the baseline.
 * Rounding is to nearest, ties to even; codes are clamped to [-127, 127]; an all-zero row or
 * token gets scale 0 and codes 0 (never NaN).
 */
#ifndef NANOLM_LLMINT8_H
#define NANOLM_LLMINT8_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Vector-wise int8 weights: codes (rows, cols), scales (rows). NL_ERR_INVALID on shapes or a
 * non-finite weight (message names row and column). */
nl_status nl_llmint8_quantize_weight(const float *w, int rows, int cols, int8_t *codes, float *scales);

/* Marks in is_outlier (cols) the dimensions where some |x_tj| > threshold over x
 * (tokens, cols); *n_outliers gets their number (either output may be NULL). */
nl_status nl_llmint8_outlier_dims(const float *x, int64_t tokens, int cols, float threshold, uint8_t *is_outlier,
                                  int *n_outliers);

/* y (tokens, rows) = x (tokens, cols) W^T with the decomposition at `threshold`, given the
 * int8 weight from nl_llmint8_quantize_weight. *n_outliers (may be NULL) gets the number of
 * outlier dimensions of this x. NL_ERR_INVALID on shapes or a non-finite input. */
nl_status nl_llmint8_forward(const float *x, int64_t tokens, int cols, const int8_t *w_codes, const float *w_scales,
                             int rows, float threshold, float *y, int *n_outliers);

#ifdef __cplusplus
}
#endif
#endif
