/* The course's quantizers: quantize_symmetric (absmax per tensor / per channel),
 * quantize_affine (zero point, PyTorch's MinMaxObserver rule), quantize_blockwise, and
 * dequantize. Plain arrays in, nl_qtensor out; nothing here knows about models.
 *
 * Rounding: q = rint(x * (1/scale)) in fp32 with the default rounding mode (nearest, ties to
 * even), exactly as PyTorch's quantize_per_tensor computes it (it multiplies by the inverse
 * scale; dividing would give 127.49998 instead of 127.5 for some inputs). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "nanolm/quant.h"

/* min/max that compile to single vector instructions (fminf/fmaxf are library calls because of
 * their NaN rules; NaN never reaches these: inputs are checked for it). */
static inline float qmin_f(float a, float b) { return a < b ? a : b; }
static inline float qmax_f(float a, float b) { return a > b ? a : b; }

/* The finite scale for a group whose absmax is `amax` with `qmax` levels each side: an
 * all-zero group gets 1 (its codes are all 0). */
static float absmax_scale(float amax, int qmax) {
    if (amax == 0.0f) return 1.0f;
    float s = amax / (float)qmax;
    /* amax near FLT_MAX: amax/qmax may round up so that qmax * s, the dequantized extreme,
     * overflows to inf; one ulp smaller keeps it finite (found by tests/test_edge_cases.c). */
    if (isinf(s * (float)qmax)) s = nextafterf(s, 0.0f);
    return s > 0.0f ? s : FLT_TRUE_MIN; /* amax below 127 * 2^-149 underflows */
}

/* Encodes n values x[0..n) of a row, starting at column c0, with one scale into the row's
 * codes (int8 one per byte, or nibbles when nib). */
static void encode_sym(const float *x, int64_t n, float scale, int qmax, uint8_t *row, int64_t c0, int nib) {
    float inv = 1.0f / scale, lim = (float)qmax;
    if (!isfinite(inv)) { /* scale is subnormal: divide instead */
        for (int64_t i = 0; i < n; i++) {
            float v = qmin_f(qmax_f(rintf(x[i] / scale), -lim), lim);
            int64_t c = c0 + i;
            if (nib)
                row[c >> 1] = (uint8_t)((row[c >> 1] & ~(0xF << ((c & 1) * 4))) | (((int)v & 0xF) << ((c & 1) * 4)));
            else
                row[c] = (uint8_t)(int8_t)v;
        }
        return;
    }
    if (!nib) {
        int8_t *q = (int8_t *)row + c0;
        for (int64_t i = 0; i < n; i++) q[i] = (int8_t)(int)qmin_f(qmax_f(rintf(x[i] * inv), -lim), lim);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        int v = (int)qmin_f(qmax_f(rintf(x[i] * inv), -lim), lim);
        int64_t c = c0 + i;
        int sh = (int)(c & 1) * 4;
        row[c >> 1] = (uint8_t)((row[c >> 1] & ~(0xF << sh)) | ((v & 0xF) << sh));
    }
}

/* max|x| over n values; sets *bad when one of them is NaN or inf, in the same pass. Works on
 * the bits: for |x| as an unsigned integer the order is the order of magnitudes, and NaN/inf
 * are exactly the patterns >= 0x7F800000 (an integer max vectorizes; a float one does not). */
static float absmax_checked(const float *x, int64_t n, int *bad) {
    uint32_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, x + i, 4);
        v &= 0x7FFFFFFFu;
        m = v > m ? v : m;
    }
    if (m >= 0x7F800000u) *bad = 1;
    float f;
    memcpy(&f, &m, 4);
    return f;
}

/* Absmax codes and scales of x into an allocated symmetric tensor q. Per channel and per
 * block read the input once: the NaN/inf check rides on the absmax pass, and a row is encoded
 * while it is still in cache. */
static nl_status absmax_fill(const float *x, nl_qtensor *q) {
    const int64_t rows = q->rows, cols = q->cols, block = q->spec.block;
    const nl_quant_granularity gran = q->spec.gran;
    if (gran == NL_QUANT_PER_TENSOR) NL_TRY(nl_quant_check_finite(x, (size_t)rows * (size_t)cols, "quantize input"));
    const int qmax = (1 << (q->spec.bits - 1)) - 1;
    const int nib = nl_quant_spec_nibbles(&q->spec);
    if (gran == NL_QUANT_PER_TENSOR) {
        uint32_t mb = 0; /* max |x| on the bits, as in absmax_checked (x is known finite here) */
        const int64_t n = rows * cols;
#pragma omp parallel for reduction(max : mb) schedule(static) if (n > (1 << 16))
        for (int64_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, x + i, 4);
            v &= 0x7FFFFFFFu;
            mb = v > mb ? v : mb;
        }
        float m;
        memcpy(&m, &mb, 4);
        q->scales[0] = absmax_scale(m, qmax);
    }
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        uint8_t *row = q->codes + r * q->row_bytes;
        if (gran == NL_QUANT_PER_TENSOR) {
            encode_sym(xr, cols, q->scales[0], qmax, row, 0, nib);
        } else if (gran == NL_QUANT_PER_CHANNEL) {
            q->scales[r] = absmax_scale(absmax_checked(xr, cols, &bad), qmax);
            encode_sym(xr, cols, q->scales[r], qmax, row, 0, nib);
        } else {
            for (int64_t g = 0; g < q->groups_per_row; g++) {
                int64_t c0 = g * block, n = cols - c0 < block ? cols - c0 : block;
                float s = absmax_scale(absmax_checked(xr + c0, n, &bad), qmax);
                q->scales[r * q->groups_per_row + g] = s;
                encode_sym(xr + c0, n, s, qmax, row, c0, nib);
            }
        }
    }
    if (bad) return nl_quant_check_finite(x, (size_t)rows * (size_t)cols, "quantize input");
    return NL_OK;
}

/* Absmax quantization with one scale per tensor, per row or per block of a row. */
static nl_status absmax_quant(const float *x, int64_t rows, int64_t cols, int bits, nl_quant_granularity gran,
                              int64_t block, nl_qtensor *out) {
    nl_quant_spec spec = {.kind = NL_QUANT_SYMMETRIC, .gran = gran, .bits = bits, .block = block};
    memset(out, 0, sizeof *out);
    NL_TRY(nl_quant_check_spec(&spec));
    if (!x || rows <= 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "tensor shape must be positive, got (%lld, %lld)", (long long)rows,
                       (long long)cols);
    NL_TRY(nl_qtensor_alloc(out, &spec, rows, cols));
    nl_status rc = absmax_fill(x, out);
    if (rc) nl_qtensor_free(out);
    return rc;
}

nl_status nl_quant_absmax_into(const float *x, nl_qtensor *q) {
    if (!x || !q || !q->codes || q->spec.kind != NL_QUANT_SYMMETRIC)
        return nl_fail(NL_ERR_INVALID, "nl_quant_absmax_into needs an allocated symmetric (absmax) tensor");
    return absmax_fill(x, q);
}

nl_status nl_quant_symmetric(const float *x, int64_t rows, int64_t cols, int bits, int per_channel, nl_qtensor *out) {
    return absmax_quant(x, rows, cols, bits, per_channel ? NL_QUANT_PER_CHANNEL : NL_QUANT_PER_TENSOR, 0, out);
}

nl_status nl_quant_blockwise(const float *x, int64_t rows, int64_t cols, int bits, int64_t block, nl_qtensor *out) {
    return absmax_quant(x, rows, cols, bits, NL_QUANT_PER_BLOCK, block, out);
}

nl_status nl_quant_affine_params(float min, float max, int qmin, int qmax, float *scale, int32_t *zero_point) {
    if (!isfinite(min) || !isfinite(max))
        return nl_fail(NL_ERR_INVALID, "affine range [%g, %g] is not finite", (double)min, (double)max);
    if (qmin >= qmax) return nl_fail(NL_ERR_INVALID, "affine code range [%d, %d] is empty", qmin, qmax);
    /* MinMaxObserver._calculate_qparams (affine): widen to include 0, fp32 arithmetic. */
    float lo = qmin_f(min, 0.0f), hi = qmax_f(max, 0.0f);
    if (!isfinite(hi - lo))
        return nl_fail(NL_ERR_INVALID, "affine range [%g, %g] is wider than fp32 can hold (max - min overflows)",
                       (double)min, (double)max);
    float s = (hi - lo) / (float)(qmax - qmin);
    s = qmax_f(s, FLT_EPSILON);
    /* As absmax_scale: keep (qmax - qmin) * s, the widest dequantized span, finite. */
    if (isinf(s * (float)(qmax - qmin))) s = nextafterf(s, 0.0f);
    float zp = (float)qmin - rintf(lo / s);
    if (zp < (float)qmin) zp = (float)qmin;
    if (zp > (float)qmax) zp = (float)qmax;
    *scale = s;
    *zero_point = (int32_t)zp;
    return NL_OK;
}

nl_status nl_quant_affine_codes(const float *x, size_t n, float scale, int32_t zero_point, int qmin, int qmax,
                                int32_t *q) {
    if (!(scale > 0.0f) || !isfinite(scale))
        return nl_fail(NL_ERR_INVALID, "scale must be positive and finite, got %g", (double)scale);
    if (qmin >= qmax) return nl_fail(NL_ERR_INVALID, "code range [%d, %d] is empty", qmin, qmax);
    NL_TRY(nl_quant_check_finite(x, n, "quantize input"));
    const float inv = 1.0f / scale;
    for (size_t i = 0; i < n; i++) {
        int64_t v = (int64_t)zero_point + (int64_t)rintf(x[i] * inv);
        q[i] = (int32_t)(v < qmin ? qmin : v > qmax ? qmax : v);
    }
    return NL_OK;
}

nl_status nl_quant_affine(const float *x, int64_t rows, int64_t cols, int bits, int is_unsigned, int per_channel,
                          nl_qtensor *out) {
    nl_quant_spec spec = {.kind = NL_QUANT_AFFINE,
                          .gran = per_channel ? NL_QUANT_PER_CHANNEL : NL_QUANT_PER_TENSOR,
                          .bits = bits,
                          .is_unsigned = is_unsigned != 0};
    memset(out, 0, sizeof *out);
    NL_TRY(nl_quant_check_spec(&spec));
    if (!x || rows <= 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "tensor shape must be positive, got (%lld, %lld)", (long long)rows,
                       (long long)cols);
    NL_TRY(nl_quant_check_finite(x, (size_t)rows * (size_t)cols, "quantize input"));
    NL_TRY(nl_qtensor_alloc(out, &spec, rows, cols));
    const int qmin = is_unsigned ? 0 : -(1 << (bits - 1));
    const int qmax = is_unsigned ? (1 << bits) - 1 : (1 << (bits - 1)) - 1;
    for (int64_t g = 0; g < out->n_scales; g++) {
        const float *xs = per_channel ? x + g * cols : x;
        int64_t n = per_channel ? cols : rows * cols;
        float lo = xs[0], hi = xs[0];
        for (int64_t i = 1; i < n; i++) {
            lo = qmin_f(lo, xs[i]);
            hi = qmax_f(hi, xs[i]);
        }
        nl_status rc = nl_quant_affine_params(lo, hi, qmin, qmax, &out->scales[g], &out->zero_points[g]);
        if (rc) {
            nl_qtensor_free(out);
            return rc;
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t g = per_channel ? r : 0;
        const float inv = 1.0f / out->scales[g];
        const int32_t zp = out->zero_points[g];
        for (int64_t c = 0; c < cols; c++) {
            int64_t v = zp + (int64_t)rintf(x[r * cols + c] * inv);
            nl_qtensor_set_code(out, r, c, (int32_t)(v < qmin ? qmin : v > qmax ? qmax : v));
        }
    }
    return NL_OK;
}

nl_status nl_quant_dequantize(const nl_qtensor *q, float *out) {
    if (!q || !q->codes || !q->scales) return nl_fail(NL_ERR_INVALID, "dequantize: empty quantized tensor");
    const int fast8 = q->spec.kind == NL_QUANT_SYMMETRIC && !nl_quant_spec_nibbles(&q->spec);
#pragma omp parallel for schedule(static) if (q->rows * q->cols > (1 << 16))
    for (int64_t r = 0; r < q->rows; r++) {
        float *o = out + r * q->cols;
        if (fast8) {
            const int8_t *c8 = (const int8_t *)q->codes + r * q->row_bytes;
            for (int64_t g = 0; g < q->groups_per_row; g++) {
                int64_t c0 = g * q->group_cols, n = q->cols - c0 < q->group_cols ? q->cols - c0 : q->group_cols;
                float s = q->scales[nl_qtensor_group(q, r, c0)];
                for (int64_t i = 0; i < n; i++) o[c0 + i] = (float)c8[c0 + i] * s;
            }
            continue;
        }
        for (int64_t c = 0; c < q->cols; c++) {
            int64_t g = nl_qtensor_group(q, r, c);
            int32_t code = nl_qtensor_code(q, r, c);
            if (q->spec.kind == NL_QUANT_AFFINE)
                o[c] = (float)(code - q->zero_points[g]) * q->scales[g];
            else if (q->spec.kind == NL_QUANT_MX)
                o[c] = nl_mx_elem_decode(q->spec.mx_elem, (uint32_t)code & ((1u << q->spec.bits) - 1)) * q->scales[g];
            else
                o[c] = (float)code * q->scales[g];
        }
    }
    return NL_OK;
}
