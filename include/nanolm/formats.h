/*
 * nanolm number formats: fp32, tf32, bf16, fp16, OCP FP8 (E4M3 "e4m3fn", E5M2), the OCP MX
 * element formats FP6 E3M2 / FP6 E2M3 / FP4 E2M1, the MX shared scale E8M0, int8 and int4.
 *
 * A "code" is the bit pattern of a value in the format, in the low bits of a uint32_t:
 * sign | exponent | mantissa, sign in bit (bits-1). tf32 codes are 19-bit (1-8-10), not
 * the fp32 layout. int8/int4 codes are two's complement in the low 8/4 bits. E8M0 has no sign.
 *
 * Conversion fp32 -> code rounds to nearest, ties to even, by default; round toward zero,
 * stochastic rounding (caller-supplied 32 random bits) and nearest-ties-away are available.
 * Subnormals are kept, never flushed. Overflow is a policy:
 *   NL_OVERFLOW_SATURATE  beyond the largest finite value (and +-inf) -> +-max finite
 *                         (hardware SATFINITE);
 *   NL_OVERFLOW_IEEE      inf where the format has one, NaN for E4M3 (which has no inf);
 *                         an error for formats with neither (E3M2, E2M3, E2M1, int8, int4);
 *                         with NL_ROUND_TOWARD_ZERO a finite input never becomes inf (IEEE);
 *   NL_OVERFLOW_DEFAULT   saturate for FP8, MX and int formats, IEEE for fp16/bf16/tf32.
 * NaN stays NaN (sign kept, canonical quiet payload: fp16 0x7E00, bf16 0x7FC0, tf32 0x3FE00,
 * E5M2 0x7E, E4M3 0x7F, E8M0 0xFF); into a format without NaN it is an error.
 * Decoding a code to fp32 is exact (every value of every format here is an fp32 value).
 */
#ifndef NANOLM_FORMATS_H
#define NANOLM_FORMATS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_format {
    NL_FMT_FP32,
    NL_FMT_TF32,
    NL_FMT_BF16,
    NL_FMT_FP16,
    NL_FMT_E4M3,
    NL_FMT_E5M2, /* OCP FP8: e4m3fn (no inf), e5m2 (IEEE-like) */
    NL_FMT_E3M2,
    NL_FMT_E2M3,
    NL_FMT_E2M1, /* OCP MX element formats FP6/FP6/FP4 */
    NL_FMT_E8M0, /* MX shared scale: 2^(e-127), 0xFF = NaN */
    NL_FMT_INT8,
    NL_FMT_INT4,
    NL_FMT_COUNT
} nl_format;

typedef enum nl_rounding {
    NL_ROUND_NEAREST_EVEN,
    NL_ROUND_TOWARD_ZERO,
    NL_ROUND_STOCHASTIC,
    NL_ROUND_NEAREST_AWAY
} nl_rounding;

typedef enum nl_overflow { NL_OVERFLOW_DEFAULT, NL_OVERFLOW_SATURATE, NL_OVERFLOW_IEEE } nl_overflow;

typedef enum nl_fmt_kind { NL_FMT_KIND_FLOAT, NL_FMT_KIND_SCALE, NL_FMT_KIND_INT } nl_fmt_kind;

/* Properties of a format. Values are exact (doubles). For int formats exp_bits = 0,
 * man_bits = bits - 1, bias = 0, min_normal = min_subnormal = epsilon = 1. */
typedef struct nl_format_info {
    const char *name;        /* "bf16", "e4m3", ... (what nl_fmt_from_name accepts) */
    const char *description; /* one line, e.g. "OCP FP8 e4m3fn: no inf, NaN = S.1111.111" */
    nl_fmt_kind kind;
    int bits, exp_bits, man_bits, bias;
    double max_finite;    /* largest finite value */
    double min_normal;    /* smallest positive normal */
    double min_subnormal; /* smallest positive value (== min_normal if no subnormals) */
    double epsilon;       /* distance from 1.0 to the next larger value */
    int has_inf, has_nan, has_sign;
    int saturate_by_default;  /* NL_OVERFLOW_DEFAULT saturates (FP8, MX, int) */
    uint32_t max_code;        /* code of +max_finite */
    uint32_t inf_code;        /* code of +inf (0 if none) */
    uint32_t nan_code;        /* canonical code of +NaN (0 if none) */
    const char *inf_encoding; /* e.g. "S.11111.0000000000", or "none" */
    const char *nan_encoding; /* e.g. "S.11111.(non-zero)", "S.1111.111", or "none" */
} nl_format_info;

/* Properties of format f; NULL if f is out of range. */
const nl_format_info *nl_fmt_info(nl_format f);
/* Parses a format name (case-insensitive; also accepts "float32", "bfloat16", "half",
 * "fp8_e4m3", "e4m3fn", "fp6_e3m2", "fp4", "mxfp4"...). On an unknown name returns
 * NL_ERR_INVALID with a message that lists the valid names. */
nl_status nl_fmt_from_name(const char *name, nl_format *out);
/* Canonical short name ("bf16", "e4m3", ...); "?" if f is out of range. */
const char *nl_fmt_name(nl_format f);
/* All valid names, comma separated (for usage messages). */
const char *nl_fmt_names(void);

/* Scalar: fp32 -> code of format f (low bits of *code), with rounding r and overflow
 * policy o. rand32 is used only by NL_ROUND_STOCHASTIC: the result rounds away from zero
 * with probability (distance to the lower-magnitude neighbour) / spacing, comparing
 * rand32 / 2^32 against that fraction. Errors (nothing written to *code): NL_ERR_INVALID
 * for NaN into a format without NaN or a bad enum; NL_ERR_RANGE for an overflow that the
 * policy cannot represent (IEEE into a format with neither inf nor NaN; E8M0 of x <= 0). */
nl_status nl_fmt_encode(nl_format f, float x, nl_rounding r, nl_overflow o, uint32_t rand32, uint32_t *code);
/* Code -> fp32, exact. Bits above the format's width are ignored. NaN codes give an fp32
 * NaN of the same sign: for bf16 and tf32 the code's bits shifted into place (bf16 and tf32
 * are truncated fp32), for the others a quiet NaN carrying the payload (as vcvtph2ps does).
 * Returns NaN for an out-of-range f. */
float nl_fmt_decode(nl_format f, uint32_t code);
/* x rounded through format f: nearest-even, default overflow. NaN stays NaN (also for
 * formats without NaN, where nl_fmt_encode would fail); E8M0 of x <= 0 (no zero, no sign)
 * gives NaN. int8/int4 give the nearest integer, clamped. */
float nl_fmt_round(nl_format f, float x);

/* Representable neighbours of x in format f: if x is representable, the next smaller and
 * next larger values; otherwise the two values that bracket x. A side with no
 * representable value (beyond the largest finite value, below E8M0's smallest) is +-inf
 * when the format has inf and NaN otherwise. NL_ERR_INVALID if x is NaN. */
nl_status nl_fmt_neighbors(nl_format f, float x, double *below, double *above);
/* Spacing of the format's values at |x| (the ulp): the gap between the two representable
 * magnitudes that bracket |x|, or above |x| when |x| is representable; for |x| beyond the
 * largest finite value, the spacing just below it. NaN for NaN x. */
double nl_fmt_ulp(nl_format f, float x);

/* Bulk (SIMD where the CPU has it, chosen at run time; bit-identical to nl_fmt_encode with
 * nearest-even and default overflow). Codes are packed in the natural width: uint16_t for
 * bf16/fp16, uint8_t for 8/6/4-bit formats (one code per byte), uint32_t for fp32/tf32.
 * Errors: NL_ERR_INVALID naming the first index if x holds NaN and f has no NaN (codes
 * then hold unspecified values), or for a bad f / NULL pointer with n > 0. */
nl_status nl_fmt_encode_array(nl_format f, const float *x, size_t n, void *codes);
/* Codes (packed as above) -> fp32, exact. */
nl_status nl_fmt_decode_array(nl_format f, const void *codes, size_t n, float *out);
/* In place: x[i] = nl_fmt_round(f, x[i]) for all i (NaN stays NaN for every format). */
nl_status nl_fmt_round_array(nl_format f, float *x, size_t n);
/* Bytes per packed code of f in the arrays above (1, 2 or 4). */
size_t nl_fmt_code_bytes(nl_format f);

/* The bulk kernels, selectable for tests and benchmarks. NL_FMT_KERNEL_AUTO is what
 * nl_fmt_encode_array uses (the fastest this CPU supports). */
typedef enum nl_fmt_kernel {
    NL_FMT_KERNEL_AUTO,
    NL_FMT_KERNEL_PORTABLE,   /* plain C, every format */
    NL_FMT_KERNEL_AVX2,       /* 8 lanes: integer bit manipulation; fp16 via F16C */
    NL_FMT_KERNEL_AVX512,     /* 16 lanes: integer bit manipulation; fp16 via vcvtps2ph */
    NL_FMT_KERNEL_AVX512BF16, /* bf16 only: vcvtneps2bf16, subnormal and NaN lanes fixed up */
    NL_FMT_KERNEL_COUNT
} nl_fmt_kernel;
/* Name of a kernel ("portable", "avx2", ...). */
const char *nl_fmt_kernel_name(nl_fmt_kernel k);
/* 1 if kernel k exists for format f and this CPU can run it. */
int nl_fmt_kernel_available(nl_format f, nl_fmt_kernel k);
/* The kernel NL_FMT_KERNEL_AUTO picks for f on this CPU. */
nl_fmt_kernel nl_fmt_kernel_auto(nl_format f);
/* nl_fmt_encode_array through kernel k; NL_ERR_UNSUPPORTED if it is not available. */
nl_status nl_fmt_encode_array_kernel(nl_format f, nl_fmt_kernel k, const float *x, size_t n, void *codes);

/* ---- inline fast helpers ------------------------------------------------------------------ */

/* fp32 -> bf16, nearest-even, subnormals kept, overflow to inf; NaN -> sign | 0x7FC0. */
static inline uint16_t nl_bf16_from_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7FC0u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bf16 -> fp32, exact (bf16 is the top half of fp32). */
static inline float nl_f32_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

#ifdef __cplusplus
}
#endif
#endif
