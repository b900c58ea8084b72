/*
 * SIMD bulk kernels for fp32 -> bf16 / fp16 / FP8 / MX codes, compiled per target with
 * __attribute__((target(...))) and chosen at run time (nl_isa_has: the CPU's sets under NANOLM_ISA's cap), so one binary
 * runs everywhere. Each computes exactly what the portable kernels in formats.c compute (see
 * formats_kernels.h for the recipe); the tests hold every kernel to the scalar reference.
 *
 * Hardware conversions need two fix-ups to be bit-identical to the reference:
 *  - vcvtneps2bf16 treats fp32 subnormal inputs as zero (DAZ); those lanes are recomputed
 *    with the integer round-to-nearest-even trick;
 *  - vcvtneps2bf16 and vcvtps2ph keep (truncated) NaN payloads; NaN lanes are replaced by
 *    the canonical sign | quiet NaN code.
 * Tails shorter than a vector go through the portable kernels.
 */
#include <string.h>

#include "nanolm/isa.h"
#include "numerics/formats_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* The CPU's sets under NANOLM_ISA's cap (nanolm/isa.h): AVX2 there includes F16C. */
int nl_fmt_cpu_avx2(void) { return nl_isa_has(NL_ISA_AVX2); }

int nl_fmt_cpu_avx512(void) { return nl_isa_has(NL_ISA_AVX512); }

int nl_fmt_cpu_avx512bf16(void) { return nl_isa_has_ext("avx512bf16"); }

/* ---- AVX-512: 16 lanes ---------------------------------------------------------------------- */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))

T512 static inline __m512i mini16(const nl_fmt_mini *p, __m512i u, __mmask16 *nanm) {
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i a = _mm512_and_si512(u, absmask);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, (unsigned)p->shift), _mm512_set1_epi32(1));
    __m512i n = _mm512_add_epi32(a, _mm512_set1_epi32((int)(p->rebias + p->round_base)));
    n = _mm512_srli_epi32(_mm512_add_epi32(n, lsb), (unsigned)p->shift);
    __m512i d = _mm512_set1_epi32((int)p->d_bits);
    __m512i s = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(d))), d);
    __mmask16 sub = _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32((int)p->min_normal_bits));
    __m512i c = _mm512_mask_blend_epi32(sub, n, s);
    __mmask16 ovf = _mm512_cmpgt_epu32_mask(c, _mm512_set1_epi32((int)p->max_code));
    c = _mm512_mask_blend_epi32(ovf, c, _mm512_set1_epi32((int)p->ovf_code));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    c = _mm512_mask_blend_epi32(nan, c, _mm512_set1_epi32((int)p->nan_code));
    *nanm |= nan;
    __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(u, 31), (unsigned)p->sign_shift);
    return _mm512_or_si512(c, sign);
}

T512 int nl_fmt_mini_avx512_u8(const nl_fmt_mini *pp, const float *x, size_t n, uint8_t *out) {
    const nl_fmt_mini local = *pp, *p = &local; /* a copy: stores to out cannot alias it */
    __mmask16 nan = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i c = mini16(p, _mm512_loadu_si512((const void *)(x + i)), &nan);
        _mm_storeu_si128((__m128i *)(out + i), _mm512_cvtepi32_epi8(c));
    }
    int tail = nl_fmt_mini_portable_u8(p, x + i, n - i, out + i);
    return nan != 0 || tail;
}

T512 int nl_fmt_fp16_avx512(const float *x, size_t n, uint16_t *out) {
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __mmask16 anynan = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i u = _mm512_castps_si512(v);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), _mm512_set1_epi32(0x7F800000));
        if (nan) {
            __m512i fix = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                                          _mm512_set1_epi32(0x7E00));
            h = _mm256_mask_blend_epi16(nan, h, _mm512_cvtepi32_epi16(fix));
            anynan |= nan;
        }
        _mm256_storeu_si256((__m256i *)(out + i), h);
    }
    for (; i < n; i++) { /* tail: one lane at a time through the same instruction */
        __m512 v = _mm512_maskz_loadu_ps(1, x + i);
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        uint32_t u;
        memcpy(&u, x + i, 4);
        uint16_t c = (uint16_t)_mm256_extract_epi16(h, 0);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
            c = (uint16_t)(((u >> 16) & 0x8000u) | 0x7E00u);
            anynan = 1;
        }
        out[i] = c;
    }
    return anynan != 0;
}

T512 static inline __m512i bf16_int16(__m512i u) {
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
}

T512 static inline __m512i bf16_nanfix(__m512i u) {
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                           _mm512_set1_epi32(0x7FC0));
}

T512 int nl_fmt_bf16_avx512(const float *x, size_t n, uint16_t *out) {
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __mmask16 anynan = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(x + i));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), _mm512_set1_epi32(0x7F800000));
        __m512i r = _mm512_mask_blend_epi32(nan, bf16_int16(u), bf16_nanfix(u));
        anynan |= nan;
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(r));
    }
    int tail = nl_fmt_bf16_portable(x + i, n - i, out + i);
    return anynan != 0 || tail;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) int nl_fmt_bf16_avx512bf16(const float *x, size_t n,
                                                                                           uint16_t *out) {
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __mmask16 anynan = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        __m512i u = _mm512_castps_si512(v);
        __m512i a = _mm512_and_si512(u, absmask);
        /* a - 1 < 0x7FFFFF  <=>  0 < a < 2^-126: a subnormal input, which the instruction zeroes */
        __mmask16 sub = _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFFFF));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
        if (sub | nan) {
            __m512i fix = _mm512_mask_blend_epi32(nan, bf16_int16(u), bf16_nanfix(u));
            h = _mm256_mask_blend_epi16(sub | nan, h, _mm512_cvtepi32_epi16(fix));
            anynan |= nan;
        }
        _mm256_storeu_si256((__m256i *)(out + i), h);
    }
    int tail = nl_fmt_bf16_portable(x + i, n - i, out + i);
    return anynan != 0 || tail;
}

__attribute__((target("avx512f,f16c"))) void nl_fmt_fp16_decode_avx512(const uint16_t *c, size_t n, float *out) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + i))));
    for (; i < n; i++) out[i] = _cvtsh_ss(c[i]);
}

/* ---- AVX2: 8 lanes -------------------------------------------------------------------------- */

#define T256 __attribute__((target("avx2,f16c")))

T256 static inline __m256i mini8(const nl_fmt_mini *p, __m256i u, __m256i *nanacc) {
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, (int)p->shift), _mm256_set1_epi32(1));
    __m256i n = _mm256_add_epi32(a, _mm256_set1_epi32((int)(p->rebias + p->round_base)));
    n = _mm256_srli_epi32(_mm256_add_epi32(n, lsb), (int)p->shift);
    __m256i d = _mm256_set1_epi32((int)p->d_bits);
    __m256i s = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(d))), d);
    /* all compared quantities are < 2^31, so signed compares are exact */
    __m256i sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)p->min_normal_bits), a);
    __m256i c = _mm256_blendv_epi8(n, s, sub);
    __m256i ovf = _mm256_cmpgt_epi32(c, _mm256_set1_epi32((int)p->max_code));
    /* c may exceed 2^31 only for a > 0x7F800000 (NaN), replaced below */
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32((int)p->ovf_code), ovf);
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    c = _mm256_blendv_epi8(c, _mm256_set1_epi32((int)p->nan_code), nan);
    *nanacc = _mm256_or_si256(*nanacc, nan);
    __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(u, 31), (int)p->sign_shift);
    return _mm256_or_si256(c, sign);
}

T256 int nl_fmt_mini_avx2_u8(const nl_fmt_mini *pp, const float *x, size_t n, uint8_t *out) {
    const nl_fmt_mini local = *pp, *p = &local; /* a copy: stores to out cannot alias it */
    __m256i nan = _mm256_setzero_si256();
    const __m256i gather = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i c = mini8(p, _mm256_loadu_si256((const __m256i *)(x + i)), &nan);
        __m256i w = _mm256_packus_epi32(c, c); /* per 128-bit lane: 4 x u16, twice */
        __m256i b = _mm256_packus_epi16(w, w); /* per lane: 4 x u8 in dword 0 */
        b = _mm256_permutevar8x32_epi32(b, gather);
        _mm_storel_epi64((__m128i *)(out + i), _mm256_castsi256_si128(b));
    }
    int tail = nl_fmt_mini_portable_u8(p, x + i, n - i, out + i);
    return !_mm256_testz_si256(nan, nan) || tail;
}

T256 int nl_fmt_bf16_avx2(const float *x, size_t n, uint16_t *out) {
    __m256i anynan = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
        __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
        __m256i fix = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                                      _mm256_set1_epi32(0x7FC0));
        r = _mm256_blendv_epi8(r, fix, nan);
        anynan = _mm256_or_si256(anynan, nan);
        __m256i w = _mm256_packus_epi32(r, r);
        w = _mm256_permute4x64_epi64(w, 0x08); /* qwords 0 and 2 */
        _mm_storeu_si128((__m128i *)(out + i), _mm256_castsi256_si128(w));
    }
    int tail = nl_fmt_bf16_portable(x + i, n - i, out + i);
    return !_mm256_testz_si256(anynan, anynan) || tail;
}

T256 int nl_fmt_fp16_f16c(const float *x, size_t n, uint16_t *out) {
    int anynan = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        int nm = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        _mm_storeu_si128((__m128i *)(out + i), h);
        if (nm) {
            anynan = 1;
            for (int j = 0; j < 8; j++)
                if (nm >> j & 1) {
                    uint32_t u;
                    memcpy(&u, x + i + j, 4);
                    out[i + j] = (uint16_t)(((u >> 16) & 0x8000u) | 0x7E00u);
                }
        }
    }
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
            out[i] = (uint16_t)(((u >> 16) & 0x8000u) | 0x7E00u);
            anynan = 1;
        } else {
            out[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        }
    }
    return anynan;
}

#else /* not x86: only the portable kernels exist */

int nl_fmt_cpu_avx2(void) { return 0; }
int nl_fmt_cpu_avx512(void) { return 0; }
int nl_fmt_cpu_avx512bf16(void) { return 0; }
int nl_fmt_mini_avx2_u8(const nl_fmt_mini *p, const float *x, size_t n, uint8_t *out) {
    return nl_fmt_mini_portable_u8(p, x, n, out);
}
int nl_fmt_mini_avx512_u8(const nl_fmt_mini *p, const float *x, size_t n, uint8_t *out) {
    return nl_fmt_mini_portable_u8(p, x, n, out);
}
int nl_fmt_fp16_f16c(const float *x, size_t n, uint16_t *out) {
    (void)x;
    (void)n;
    (void)out;
    return 0;
}
int nl_fmt_fp16_avx512(const float *x, size_t n, uint16_t *out) {
    (void)x;
    (void)n;
    (void)out;
    return 0;
}
int nl_fmt_bf16_avx2(const float *x, size_t n, uint16_t *out) { return nl_fmt_bf16_portable(x, n, out); }
int nl_fmt_bf16_avx512(const float *x, size_t n, uint16_t *out) { return nl_fmt_bf16_portable(x, n, out); }
int nl_fmt_bf16_avx512bf16(const float *x, size_t n, uint16_t *out) { return nl_fmt_bf16_portable(x, n, out); }
void nl_fmt_fp16_decode_avx512(const uint16_t *c, size_t n, float *out) {
    (void)c;
    (void)n;
    (void)out;
}

#endif
