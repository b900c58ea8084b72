/* ggml block types <-> fp32. See include/nanolm/ggml_quant.h. */
#include "nanolm/ggml_quant.h"

#include <math.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/gguf.h"

static float h2f(const uint8_t *p) { return nl_fmt_decode(NL_FMT_FP16, (uint32_t)p[0] | (uint32_t)p[1] << 8); }
static void f2h(float x, uint8_t *p) {
    uint32_t c = 0;
    (void)nl_fmt_encode(NL_FMT_FP16, x, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c);
    p[0] = (uint8_t)c;
    p[1] = (uint8_t)(c >> 8);
}

int nl_ggml_can_dequantize(uint32_t t) {
    return t == NL_GGML_F32 || t == NL_GGML_F16 || t == NL_GGML_BF16 || t == NL_GGML_Q8_0 || t == NL_GGML_Q4_0 ||
           t == NL_GGML_Q4_1 || t == NL_GGML_Q4_K || t == NL_GGML_Q6_K;
}
int nl_ggml_can_quantize(uint32_t t) {
    return t == NL_GGML_F32 || t == NL_GGML_F16 || t == NL_GGML_BF16 || t == NL_GGML_Q8_0 || t == NL_GGML_Q4_0;
}

static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static nl_status check_blocks(uint32_t type, int64_t n) {
    int64_t b = nl_ggml_block_elems(type);
    if (!b) return nl_fail(NL_ERR_UNSUPPORTED, "ggml type %u is unknown", type);
    if (n < 0 || n % b)
        return nl_fail(NL_ERR_INVALID, "%lld values are not whole %s blocks of %lld", (long long)n,
                       nl_ggml_type_name(type), (long long)b);
    return NL_OK;
}

nl_status nl_ggml_to_f32(uint32_t type, const void *src, int64_t n, float *dst) {
    NL_TRY(check_blocks(type, n));
    const uint8_t *p = src;
    switch (type) {
    case NL_GGML_F32: memcpy(dst, src, (size_t)n * 4); return NL_OK;
    case NL_GGML_F16: return nl_fmt_decode_array(NL_FMT_FP16, src, (size_t)n, dst);
    case NL_GGML_BF16: return nl_fmt_decode_array(NL_FMT_BF16, src, (size_t)n, dst);
    case NL_GGML_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            float d = h2f(p);
            for (int j = 0; j < 32; j++) dst[32 * b + j] = (float)(int8_t)p[2 + j] * d;
        }
        return NL_OK;
    case NL_GGML_Q4_0:
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            float d = h2f(p);
            for (int j = 0; j < 16; j++) {
                dst[32 * b + j] = (float)((p[2 + j] & 0xF) - 8) * d;
                dst[32 * b + j + 16] = (float)((p[2 + j] >> 4) - 8) * d;
            }
        }
        return NL_OK;
    case NL_GGML_Q4_1:
        for (int64_t b = 0; b < n / 32; b++, p += 20) {
            float d = h2f(p), m = h2f(p + 2);
            for (int j = 0; j < 16; j++) {
                dst[32 * b + j] = (float)(p[4 + j] & 0xF) * d + m;
                dst[32 * b + j + 16] = (float)(p[4 + j] >> 4) * d + m;
            }
        }
        return NL_OK;
    case NL_GGML_Q4_K:
        for (int64_t b = 0; b < n / 256; b++, p += 144) {
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc = p + 4, *q = p + 16;
            float *y = dst + 256 * b;
            for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
                uint8_t s, m;
                scale_min_k4(is, sc, &s, &m);
                float d1 = d * s, m1 = dmin * m;
                scale_min_k4(is + 1, sc, &s, &m);
                float d2 = d * s, m2 = dmin * m;
                for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
                for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
            }
        }
        return NL_OK;
    case NL_GGML_Q6_K:
        for (int64_t b = 0; b < n / 256; b++, p += 210) {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            float *y = dst + 256 * b;
            for (int h = 0; h < 256; h += 128, y += 128, ql += 64, qh += 32, sc += 8)
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    y[l] = d * (float)sc[is] * (float)q1;
                    y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                    y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                    y[l + 96] = d * (float)sc[is + 6] * (float)q4;
                }
        }
        return NL_OK;
    default:
        return nl_fail(NL_ERR_UNSUPPORTED, "ggml type %s cannot be converted to fp32 yet", nl_ggml_type_name(type));
    }
}

nl_status nl_ggml_from_f32(uint32_t type, const float *src, int64_t n, void *dst) {
    NL_TRY(check_blocks(type, n));
    uint8_t *p = dst;
    if (type == NL_GGML_Q8_0 || type == NL_GGML_Q4_0)
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(src[i]))
                return nl_fail(NL_ERR_INVALID, "value %lld is %g: %s needs finite values", (long long)i, (double)src[i],
                               nl_ggml_type_name(type));
    switch (type) {
    case NL_GGML_F32: memcpy(dst, src, (size_t)n * 4); return NL_OK;
    case NL_GGML_F16: return nl_fmt_encode_array(NL_FMT_FP16, src, (size_t)n, dst);
    case NL_GGML_BF16: return nl_fmt_encode_array(NL_FMT_BF16, src, (size_t)n, dst);
    case NL_GGML_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            const float *x = src + 32 * b;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            f2h(d, p);
            for (int j = 0; j < 32; j++) p[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        }
        return NL_OK;
    case NL_GGML_Q4_0:
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            const float *x = src + 32 * b;
            float amax = 0, max = 0;
            for (int j = 0; j < 32; j++)
                if (amax < fabsf(x[j])) {
                    amax = fabsf(x[j]);
                    max = x[j];
                }
            float d = max / -8, id = d ? 1.0f / d : 0.0f;
            f2h(d, p);
            for (int j = 0; j < 16; j++) {
                int8_t a = (int8_t)(x[j] * id + 8.5f), c = (int8_t)(x[16 + j] * id + 8.5f);
                uint8_t q0 = (uint8_t)(a < 15 ? a : 15), q1 = (uint8_t)(c < 15 ? c : 15);
                p[2 + j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        return NL_OK;
    default: return nl_fail(NL_ERR_UNSUPPORTED, "cannot write ggml type %s", nl_ggml_type_name(type));
    }
}
