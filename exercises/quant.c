/* Course exercise (week 14): the quantizers. Same public functions as src/numerics/quant.c;
 * the bodies are yours to write. Build and test against this file with
 *
 *     NANOLM_IMPL=exercises BUILD=build-ex make test
 *
 * Each quantization test then fails with a message that names the function to write; when
 * all of them pass, your quantizers behave like the reference (and like PyTorch: the fixture
 * test compares codes with torch.quantize_per_tensor on 100,000 values).
 *
 * What you may use (declared in nanolm/quant.h, implemented in files that stay as they are):
 *   nl_qtensor_alloc(q, &spec, rows, cols)   codes (rows, row_bytes), scales (n_scales), ...
 *   nl_qtensor_set_code / nl_qtensor_code    one code at (r, c), nibble packing handled
 *   nl_qtensor_group(q, r, c)                index of the scale of element (r, c)
 *   nl_quant_check_finite(x, n, what)        the error naming the first NaN/inf index
 *   nl_quant_check_spec(&spec)               bits 2..8, block > 0
 *   nl_mx_elem_decode(elem, code)            the value of an MX element code
 * Rounding: rintf(x * (1.0f / scale)) rounds half to even, as PyTorch does (it multiplies by
 * the inverse scale; dividing gives different codes for some inputs).
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "nanolm/quant.h"

#define TODO(fn, what) nl_fail(NL_ERR_NOT_IMPLEMENTED, "exercise: write %s in exercises/quant.c (%s)", fn, what)

/* quantize_symmetric. Steps:
 *  1. Validate: bits 2..8 (nl_quant_check_spec), positive shape, no NaN/inf (error must name
 *     the first bad index: nl_quant_check_finite does that).
 *  2. nl_qtensor_alloc with {.kind = NL_QUANT_SYMMETRIC, .gran = per_channel ? PER_CHANNEL :
 *     PER_TENSOR, .bits = bits}.
 *  3. qmax = 2^(bits-1) - 1. For each group (the whole tensor, or each row):
 *     scale = max|x| / qmax; an all-zero group gets a finite scale (say 1) and codes 0.
 *  4. q = rintf(x * (1/scale)) clamped to [-qmax, qmax]; store with nl_qtensor_set_code.
 * Check with the course example: (0.3, -0.5, 0.12, 1.5) -> scale 0.0118, q = (25, -42, 10, 127). */
nl_status nl_quant_symmetric(const float *x, int64_t rows, int64_t cols, int bits, int per_channel, nl_qtensor *out) {
    (void)x;
    (void)rows;
    (void)cols;
    (void)bits;
    (void)per_channel;
    memset(out, 0, sizeof *out);
    return TODO("nl_quant_symmetric", "quantize_symmetric: absmax per tensor / per channel");
}

/* quantize_blockwise: as nl_quant_symmetric, but one scale per run of `block` values inside
 * each row (.gran = NL_QUANT_PER_BLOCK, .block = block); the last block of a row may be
 * shorter. With blocks of 2 the course's (0.3, -0.5, 0.12, 30) gives (76, -127, 1, 127). */
nl_status nl_quant_blockwise(const float *x, int64_t rows, int64_t cols, int bits, int64_t block, nl_qtensor *out) {
    (void)x;
    (void)rows;
    (void)cols;
    (void)bits;
    (void)block;
    memset(out, 0, sizeof *out);
    return TODO("nl_quant_blockwise", "quantize_blockwise: absmax per block of a row");
}

/* Re-quantize x into an already allocated absmax tensor q (same as above, without the
 * allocation): reuse your code for step 3-4 with q->spec. */
nl_status nl_quant_absmax_into(const float *x, nl_qtensor *q) {
    (void)x;
    (void)q;
    return TODO("nl_quant_absmax_into", "absmax into an allocated tensor");
}

/* PyTorch's MinMaxObserver rule, in fp32: widen [min, max] to include 0 (lo = min(min, 0),
 * hi = max(max, 0)); scale = (hi - lo) / (qmax - qmin), at least FLT_EPSILON;
 * zero_point = qmin - rintf(lo / scale), clamped to [qmin, qmax]. */
nl_status nl_quant_affine_params(float min, float max, int qmin, int qmax, float *scale, int32_t *zero_point) {
    (void)min;
    (void)max;
    (void)qmin;
    (void)qmax;
    (void)scale;
    (void)zero_point;
    return TODO("nl_quant_affine_params", "the MinMaxObserver scale and zero point");
}

/* q[i] = clamp(zero_point + rintf(x[i] * (1/scale)), qmin, qmax): note the zero point is added
 * after rounding (PyTorch does so; with an odd zero point it matters for ties). */
nl_status nl_quant_affine_codes(const float *x, size_t n, float scale, int32_t zero_point, int qmin, int qmax,
                                int32_t *q) {
    (void)x;
    (void)n;
    (void)scale;
    (void)zero_point;
    (void)qmin;
    (void)qmax;
    (void)q;
    return TODO("nl_quant_affine_codes", "codes for a given scale and zero point");
}

/* quantize_affine: per tensor or per row, min and max of the group -> nl_quant_affine_params ->
 * codes (signed -2^(b-1)..2^(b-1)-1, or unsigned 0..2^b-1 when is_unsigned). Allocate with
 * {.kind = NL_QUANT_AFFINE, .is_unsigned = ...}: out->zero_points is there for you. */
nl_status nl_quant_affine(const float *x, int64_t rows, int64_t cols, int bits, int is_unsigned, int per_channel,
                          nl_qtensor *out) {
    (void)x;
    (void)rows;
    (void)cols;
    (void)bits;
    (void)is_unsigned;
    (void)per_channel;
    memset(out, 0, sizeof *out);
    return TODO("nl_quant_affine", "quantize_affine: zero point, MinMaxObserver rule");
}

/* dequantize every scheme: symmetric and blockwise: code * scale; affine: (code - zero_point)
 * * scale; MX: nl_mx_elem_decode(elem, code) * scale. The scale of (r, c) is
 * q->scales[nl_qtensor_group(q, r, c)]. */
nl_status nl_quant_dequantize(const nl_qtensor *q, float *out) {
    (void)q;
    (void)out;
    return TODO("nl_quant_dequantize", "x ~ q * scale for every scheme");
}
