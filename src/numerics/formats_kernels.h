/*
 * Internal: the bulk fp32 -> code kernels behind nl_fmt_encode_array (formats.c holds the
 * portable ones, formats_simd.c the AVX2 / AVX-512 / AVX-512 BF16 ones).
 *
 * Minifloat kernels (fp16, E4M3, E5M2, E3M2, E2M3, E2M1) all run one branch-free recipe on
 * the fp32 bits, with per-format constants in nl_fmt_mini:
 *   a = |x| bits;  if a >= bits(target min normal):  re-bias the exponent and round the
 *   mantissa to M bits with the "add half-ulp - 1 + lsb, then shift" trick (carries move into
 *   the exponent); else (target subnormal range) add the float D = 2^(24-B-M), whose fp32
 *   ulp is the target's subnormal spacing, so the fp32 adder rounds (to nearest even) for us;
 *   the code is bits(|x| + D) - bits(D). Then overflow (> max code -> ovf_code), NaN, sign.
 * Every kernel returns nonzero if it saw a NaN input (for formats without NaN the caller
 * turns that into an error; the code written there is 0 | sign).
 */
#ifndef NANOLM_FORMATS_KERNELS_H
#define NANOLM_FORMATS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct nl_fmt_mini {
    uint32_t shift;           /* 23 - M */
    uint32_t rebias;          /* (B - 127) << 23, as a wrapping uint32 */
    uint32_t round_base;      /* (1 << (22 - M)) - 1 */
    uint32_t min_normal_bits; /* fp32 bits of the target's smallest normal, 2^(1-B) */
    uint32_t d_bits;          /* fp32 bits of D = 2^(24-B-M) */
    uint32_t max_code;        /* largest finite magnitude code */
    uint32_t ovf_code;        /* what a magnitude above max_code becomes (max_code or inf) */
    uint32_t nan_code;        /* magnitude code of NaN (0 if the format has none) */
    uint32_t sign_shift;      /* bits - 1: fp32 sign bit 31 moves here */
} nl_fmt_mini;

/* Portable (plain C). */
int nl_fmt_mini_portable_u8(const nl_fmt_mini *p, const float *x, size_t n, uint8_t *out);
int nl_fmt_mini_portable_u16(const nl_fmt_mini *p, const float *x, size_t n, uint16_t *out);
int nl_fmt_bf16_portable(const float *x, size_t n, uint16_t *out);

/* CPU feature checks (run time). */
int nl_fmt_cpu_avx2(void);       /* avx2 + f16c */
int nl_fmt_cpu_avx512(void);     /* avx512f + bw + vl */
int nl_fmt_cpu_avx512bf16(void); /* the above + avx512bf16 */

/* SIMD kernels; call only when the matching nl_fmt_cpu_* says yes. */
int nl_fmt_mini_avx2_u8(const nl_fmt_mini *p, const float *x, size_t n, uint8_t *out);
int nl_fmt_mini_avx512_u8(const nl_fmt_mini *p, const float *x, size_t n, uint8_t *out);
int nl_fmt_fp16_f16c(const float *x, size_t n, uint16_t *out);
int nl_fmt_fp16_avx512(const float *x, size_t n, uint16_t *out);
int nl_fmt_bf16_avx2(const float *x, size_t n, uint16_t *out);
int nl_fmt_bf16_avx512(const float *x, size_t n, uint16_t *out);
int nl_fmt_bf16_avx512bf16(const float *x, size_t n, uint16_t *out);
/* fp16 codes -> fp32 with vcvtph2ps (16 lanes). */
void nl_fmt_fp16_decode_avx512(const uint16_t *c, size_t n, float *out);

#endif
