/* Small GEMM tiles for the attention of training (see tile_gemm.h). */
#include "numerics/tile_gemm.h"

#include "nanolm/isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TILE_X86 1
#endif

/* The reference: the same k-ordered sums, one element at a time. */
static void tile_scalar(float *c, int64_t crs, int64_t m, const float *a, int64_t ars, int64_t acs, const float *b,
                        int64_t brs, int64_t n, int64_t kc, float alpha, int acc) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < kc; k++) s += a[i * ars + k * acs] * b[k * brs + j];
            c[i * crs + j] = acc ? s * alpha + c[i * crs + j] : s * alpha;
        }
}

static void transpose_scalar(float *xt, const float *x, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t d = 0; d < cols; d++)
        for (int64_t t = 0; t < rows; t++) xt[d * rows + t] = x[t * ld + d];
}

#ifdef TILE_X86
int nl_tile_gemm_avx2(void) { return nl_isa_has(NL_ISA_AVX2); }

/* 8 x 8 blocks: 8 row loads, the three rounds of unpack/shuffle/permute, 8 row stores. */
__attribute__((target("avx2"))) static void transpose_avx2(float *xt, const float *x, int64_t rows, int64_t cols,
                                                           int64_t ld) {
    for (int64_t t = 0; t < rows; t += 8)
        for (int64_t d = 0; d < cols; d += 8) {
            const float *s = x + t * ld + d;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ld), r2 = _mm256_loadu_ps(s + 2 * ld);
            __m256 r3 = _mm256_loadu_ps(s + 3 * ld), r4 = _mm256_loadu_ps(s + 4 * ld), r5 = _mm256_loadu_ps(s + 5 * ld);
            __m256 r6 = _mm256_loadu_ps(s + 6 * ld), r7 = _mm256_loadu_ps(s + 7 * ld);
            __m256 u0 = _mm256_unpacklo_ps(r0, r1), u1 = _mm256_unpackhi_ps(r0, r1);
            __m256 u2 = _mm256_unpacklo_ps(r2, r3), u3 = _mm256_unpackhi_ps(r2, r3);
            __m256 u4 = _mm256_unpacklo_ps(r4, r5), u5 = _mm256_unpackhi_ps(r4, r5);
            __m256 u6 = _mm256_unpacklo_ps(r6, r7), u7 = _mm256_unpackhi_ps(r6, r7);
            __m256 v0 = _mm256_shuffle_ps(u0, u2, 0x44), v1 = _mm256_shuffle_ps(u0, u2, 0xEE);
            __m256 v2 = _mm256_shuffle_ps(u1, u3, 0x44), v3 = _mm256_shuffle_ps(u1, u3, 0xEE);
            __m256 v4 = _mm256_shuffle_ps(u4, u6, 0x44), v5 = _mm256_shuffle_ps(u4, u6, 0xEE);
            __m256 v6 = _mm256_shuffle_ps(u5, u7, 0x44), v7 = _mm256_shuffle_ps(u5, u7, 0xEE);
            float *o = xt + d * rows + t;
            _mm256_storeu_ps(o, _mm256_permute2f128_ps(v0, v4, 0x20));
            _mm256_storeu_ps(o + rows, _mm256_permute2f128_ps(v1, v5, 0x20));
            _mm256_storeu_ps(o + 2 * rows, _mm256_permute2f128_ps(v2, v6, 0x20));
            _mm256_storeu_ps(o + 3 * rows, _mm256_permute2f128_ps(v3, v7, 0x20));
            _mm256_storeu_ps(o + 4 * rows, _mm256_permute2f128_ps(v0, v4, 0x31));
            _mm256_storeu_ps(o + 5 * rows, _mm256_permute2f128_ps(v1, v5, 0x31));
            _mm256_storeu_ps(o + 6 * rows, _mm256_permute2f128_ps(v2, v6, 0x31));
            _mm256_storeu_ps(o + 7 * rows, _mm256_permute2f128_ps(v3, v7, 0x31));
        }
}

/* Rows 0..M-1 of C, columns j..j+15: 2M accumulators (M <= 6: 12 of the 16 ymm registers, two
 * for the row of B, one for the broadcast), a k-ordered FMA chain each. */
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile_cols(int M, float *c, int64_t crs, const float *a, int64_t ars, int64_t acs, const float *b, int64_t brs,
          int64_t kc, float alpha, int acc) {
    __m256 s0[6], s1[6];
    for (int i = 0; i < M; i++) s0[i] = s1[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++, a += acs, b += brs) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        for (int i = 0; i < M; i++) {
            __m256 x = _mm256_broadcast_ss(a + i * ars);
            s0[i] = _mm256_fmadd_ps(x, b0, s0[i]);
            s1[i] = _mm256_fmadd_ps(x, b1, s1[i]);
        }
    }
    __m256 va = _mm256_set1_ps(alpha);
    for (int i = 0; i < M; i++) {
        float *ci = c + i * crs;
        __m256 r0 = _mm256_mul_ps(s0[i], va), r1 = _mm256_mul_ps(s1[i], va);
        if (acc) {
            r0 = _mm256_add_ps(r0, _mm256_loadu_ps(ci));
            r1 = _mm256_add_ps(r1, _mm256_loadu_ps(ci + 8));
        }
        _mm256_storeu_ps(ci, r0);
        _mm256_storeu_ps(ci + 8, r1);
    }
}

#define TILE_M(M)                                                                                                      \
    __attribute__((target("avx2,fma"))) static void tile_avx2_##M(float *c, int64_t crs, const float *a, int64_t ars,  \
                                                                  int64_t acs, const float *b, int64_t brs, int64_t n, \
                                                                  int64_t kc, float alpha, int acc) {                  \
        for (int64_t j = 0; j < n; j += 16) tile_cols(M, c + j, crs, a, ars, acs, b + j, brs, kc, alpha, acc);         \
    }
TILE_M(1)
TILE_M(2)
TILE_M(3)
TILE_M(4)
TILE_M(5)
TILE_M(6)
#undef TILE_M

static void (*const tile_avx2[7])(float *, int64_t, const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                                  int64_t, float, int) = {NULL,        tile_avx2_1, tile_avx2_2, tile_avx2_3,
                                                          tile_avx2_4, tile_avx2_5, tile_avx2_6};

#else
int nl_tile_gemm_avx2(void) { return 0; }
#endif

void nl_tile_gemm(float *c, int64_t crs, int64_t m, const float *a, int64_t ars, int64_t acs, const float *b,
                  int64_t brs, int64_t n, int64_t kc, float alpha, int acc) {
#ifdef TILE_X86
    if (nl_tile_gemm_avx2() && m >= 1 && m <= NL_TILE_MR) {
        tile_avx2[m](c, crs, a, ars, acs, b, brs, n, kc, alpha, acc);
        return;
    }
#endif
    tile_scalar(c, crs, m, a, ars, acs, b, brs, n, kc, alpha, acc);
}

void nl_tile_transpose(float *xt, const float *x, int64_t rows, int64_t cols, int64_t ld) {
#ifdef TILE_X86
    if (nl_tile_gemm_avx2() && rows % 8 == 0 && cols % 8 == 0) {
        transpose_avx2(xt, x, rows, cols, ld);
        return;
    }
#endif
    transpose_scalar(xt, x, rows, cols, ld);
}
