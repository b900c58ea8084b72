/* nl_vexpf over arrays (see vexp_simd.h). */
#include "numerics/vexp_simd.h"

#include <math.h>

#include "nanolm/isa.h"
#include "numerics/vexp.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define VEXP_X86 1
#endif

int nl_vexp_simd_avx2(void) { return nl_isa_has(NL_ISA_AVX2); }

#ifdef VEXP_X86
/* nl_vexpf (vexp.h) step by step: the clamps (max/min agree with the scalar selects on every
 * non-NaN input), round(x / ln2) by the 1.5 * 2^23 trick, the two-part ln2 reduction, the
 * degree-6 polynomial, the exponent bits, and x itself for NaN lanes. */
__attribute__((target("avx2"))) static inline __m256 vexp8(__m256 x) {
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    __m256 big = _mm256_set1_ps(12582912.0f);
    __m256 fn = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)), big), big);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(fn, _mm256_set1_ps(0.693359375f))),
                             _mm256_mul_ps(fn, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fn), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

__attribute__((target("avx2"))) static int64_t shift_avx2(float *e, const float *x, float c, int64_t n) {
    __m256 vc = _mm256_set1_ps(c);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(e + i, vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vc)));
    return i;
}

/* Softmax of a[0..n) in place, a[n..len) = 0; len a multiple of 8. Lanes past n in the last
 * vector are masked out of the max and the sum (their exps are computed and dropped). */
__attribute__((target("avx2"))) static void softmax_prefix_avx2(float *a, int64_t n, int64_t len) {
    int64_t n8 = (n + 7) / 8 * 8;
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 last = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - (n8 - 8))), lane));
    __m256 ninf = _mm256_set1_ps(-INFINITY), vm = ninf;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 x = _mm256_loadu_ps(a + i);
        if (i + 8 == n8) x = _mm256_blendv_ps(ninf, x, last);
        vm = _mm256_max_ps(vm, x);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    __m256 vc = _mm256_broadcastss_ps(m4), vs = _mm256_setzero_ps();
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 e = vexp8(_mm256_sub_ps(_mm256_loadu_ps(a + i), vc));
        if (i + 8 == n8) e = _mm256_and_ps(e, last);
        vs = _mm256_add_ps(vs, e);
        _mm256_storeu_ps(a + i, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(vs), _mm256_extractf128_ps(vs, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
    __m256 inv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(s4));
    for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), inv));
    for (int64_t i = n8; i < len; i += 8) _mm256_storeu_ps(a + i, _mm256_setzero_ps());
}

__attribute__((target("avx2"))) static int64_t neg_avx2(float *e, const float *x, int64_t n) {
    __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(e + i, vexp8(_mm256_xor_ps(_mm256_loadu_ps(x + i), sign)));
    return i;
}
#endif

void nl_vexp_shift(float *e, const float *x, float c, int64_t n) {
    int64_t i = 0;
#ifdef VEXP_X86
    if (nl_vexp_simd_avx2()) i = shift_avx2(e, x, c, n);
#endif
    for (; i < n; i++) e[i] = nl_vexpf(x[i] - c);
}

void nl_vexp_neg(float *e, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef VEXP_X86
    if (nl_vexp_simd_avx2()) i = neg_avx2(e, x, n);
#endif
    for (; i < n; i++) e[i] = nl_vexpf(-x[i]);
}

void nl_vsoftmax_prefix(float *a, int64_t n, int64_t len) {
#ifdef VEXP_X86
    if (nl_vexp_simd_avx2() && len % 8 == 0) {
        softmax_prefix_avx2(a, n, len);
        return;
    }
#endif
    float mx = -INFINITY, sum = 0.0f;
    for (int64_t i = 0; i < n; i++) mx = a[i] > mx ? a[i] : mx;
    nl_vexp_shift(a, a, mx, n);
    for (int64_t i = 0; i < n; i++) sum += a[i];
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) a[i] *= inv;
    for (int64_t i = n; i < len; i++) a[i] = 0.0f;
}
