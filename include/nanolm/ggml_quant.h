/*
 * ggml's tensor element types on plain arrays: blocks -> fp32 (dequantize) and fp32 -> blocks
 * (quantize, llama.cpp's reference quantizers: quantize_row_q8_0_ref / q4_0_ref). Knows nothing of
 * files or models (nanolm/gguf.h reads the container).
 *
 * Blocks (little-endian, d and m fp16):
 *   Q8_0  32 values: d, 32 x int8 q                         x = q * d
 *   Q4_0  32 values: d, 16 bytes; byte j holds value j in its low nibble and value j + 16 in its
 *         high nibble                                         x = (nibble - 8) * d
 *   Q4_1  32 values: d, m, 16 bytes as Q4_0                   x = nibble * d + m
 *   Q4_K  256 values: d, dmin, 12 bytes of 8 6-bit (scale, min) pairs, 128 bytes of nibbles;
 *         sub-block s of 32 values: x = d * scale_s * nibble - dmin * min_s
 *   Q6_K  256 values: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, d;
 *         x = d * scale * (q6 - 32)
 * F32, F16, BF16 are converted exactly (widening).
 */
#ifndef NANOLM_GGML_QUANT_H
#define NANOLM_GGML_QUANT_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when nl_ggml_to_f32 converts this type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K). */
int nl_ggml_can_dequantize(uint32_t type);
/* 1 when nl_ggml_from_f32 writes this type (F32, F16, BF16, Q8_0, Q4_0). */
int nl_ggml_can_quantize(uint32_t type);

/* n values (a multiple of the type's block) from src into dst. NL_ERR_UNSUPPORTED naming the
 * type for the others; NL_ERR_INVALID for n not whole blocks. */
nl_status nl_ggml_to_f32(uint32_t type, const void *src, int64_t n, float *dst);
/* n values of src into blocks of `type` at dst (nl_ggml_nbytes bytes). F16/BF16 round to nearest
 * even; Q8_0/Q4_0 as llama.cpp's reference quantizers. Errors: NL_ERR_UNSUPPORTED, NL_ERR_INVALID
 * (n not whole blocks, NaN/inf for the block types naming the index). */
nl_status nl_ggml_from_f32(uint32_t type, const float *src, int64_t n, void *dst);

#ifdef __cplusplus
}
#endif
#endif
