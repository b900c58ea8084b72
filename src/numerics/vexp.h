/* A vectorizable expf for the softmax and SwiGLU loops (libm's expf is a scalar call that stops
 * GCC from vectorizing them). Cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial
 * for e^r, then the exponent bits; relative error ~2 ulp. Inputs below -87.3 give ~1.2e-38
 * (never a subnormal); inputs near 88.7 and above give inf, as expf overflows; NaN stays NaN.
 * Private to the library (src/model, and src/numerics/paged_attention.c, whose attention must give
 * the bits of nl_model_step's). */
#ifndef NANOLM_NUMERICS_VEXP_H
#define NANOLM_NUMERICS_VEXP_H

#include <stdint.h>
#include <string.h>

static inline float nl_vexpf(float x) {
    float xc = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
    xc = x != x ? 0.0f : xc;                                            /* NaN: compute on 0, return NaN below */
    float fn = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
    float r = xc - fn * 0.693359375f - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)fn + 127) << 23; /* fn in [-126, 128] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x != x ? x : p * scale;
}

#endif
