/*
 * Number formats: properties, the scalar reference encoder/decoder, neighbours, and the bulk
 * array API with run-time kernel dispatch (portable kernels here, SIMD in formats_simd.c).
 *
 * The scalar encoder is the reference: it writes |x| = mant * 2^e exactly as integers, picks
 * the target quantum 2^(max(floor(log2|x|), 1-B) - M), splits mant into quotient and
 * remainder by that quantum and rounds the quotient by the remainder. The code is then
 * ((max(E, 1-B) + B - 1) << M) + q, which also handles a carry into the next binade and the
 * subnormal -> normal step.
 */
#include "nanolm/formats.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "numerics/formats_kernels.h"

static const nl_format_info INFO[NL_FMT_COUNT] = {
    [NL_FMT_FP32] = {"fp32",
                     "IEEE binary32",
                     NL_FMT_KIND_FLOAT,
                     32,
                     8,
                     23,
                     127,
                     0x1.fffffep127,
                     0x1p-126,
                     0x1p-149,
                     0x1p-23,
                     1,
                     1,
                     1,
                     0,
                     0x7F7FFFFFu,
                     0x7F800000u,
                     0x7FC00000u,
                     "S.11111111.000..0",
                     "S.11111111.(non-zero)"},
    [NL_FMT_TF32] = {"tf32",
                     "NVIDIA TensorFloat-32: fp32 range, fp16 mantissa (19-bit code)",
                     NL_FMT_KIND_FLOAT,
                     19,
                     8,
                     10,
                     127,
                     0x1.ffcp127,
                     0x1p-126,
                     0x1p-136,
                     0x1p-10,
                     1,
                     1,
                     1,
                     0,
                     0x3FBFFu,
                     0x3FC00u,
                     0x3FE00u,
                     "S.11111111.0000000000",
                     "S.11111111.(non-zero)"},
    [NL_FMT_BF16] = {"bf16",
                     "bfloat16: fp32 range, 8 significant bits",
                     NL_FMT_KIND_FLOAT,
                     16,
                     8,
                     7,
                     127,
                     0x1.fep127,
                     0x1p-126,
                     0x1p-133,
                     0x1p-7,
                     1,
                     1,
                     1,
                     0,
                     0x7F7Fu,
                     0x7F80u,
                     0x7FC0u,
                     "S.11111111.0000000",
                     "S.11111111.(non-zero)"},
    [NL_FMT_FP16] = {"fp16",
                     "IEEE binary16",
                     NL_FMT_KIND_FLOAT,
                     16,
                     5,
                     10,
                     15,
                     65504.0,
                     0x1p-14,
                     0x1p-24,
                     0x1p-10,
                     1,
                     1,
                     1,
                     0,
                     0x7BFFu,
                     0x7C00u,
                     0x7E00u,
                     "S.11111.0000000000",
                     "S.11111.(non-zero)"},
    [NL_FMT_E4M3] = {"e4m3",
                     "OCP FP8 e4m3fn: no inf, NaN only S.1111.111",
                     NL_FMT_KIND_FLOAT,
                     8,
                     4,
                     3,
                     7,
                     448.0,
                     0x1p-6,
                     0x1p-9,
                     0x1p-3,
                     0,
                     1,
                     1,
                     1,
                     0x7Eu,
                     0u,
                     0x7Fu,
                     "none",
                     "S.1111.111"},
    [NL_FMT_E5M2] = {"e5m2",
                     "OCP FP8 e5m2: IEEE-like inf and NaN",
                     NL_FMT_KIND_FLOAT,
                     8,
                     5,
                     2,
                     15,
                     57344.0,
                     0x1p-14,
                     0x1p-16,
                     0x1p-2,
                     1,
                     1,
                     1,
                     1,
                     0x7Bu,
                     0x7Cu,
                     0x7Eu,
                     "S.11111.00",
                     "S.11111.(non-zero)"},
    [NL_FMT_E3M2] = {"e3m2",
                     "OCP MX FP6 E3M2: no inf, no NaN",
                     NL_FMT_KIND_FLOAT,
                     6,
                     3,
                     2,
                     3,
                     28.0,
                     0x1p-2,
                     0x1p-4,
                     0x1p-2,
                     0,
                     0,
                     1,
                     1,
                     0x1Fu,
                     0u,
                     0u,
                     "none",
                     "none"},
    [NL_FMT_E2M3] = {"e2m3",
                     "OCP MX FP6 E2M3: no inf, no NaN",
                     NL_FMT_KIND_FLOAT,
                     6,
                     2,
                     3,
                     1,
                     7.5,
                     1.0,
                     0x1p-3,
                     0x1p-3,
                     0,
                     0,
                     1,
                     1,
                     0x1Fu,
                     0u,
                     0u,
                     "none",
                     "none"},
    [NL_FMT_E2M1] = {"e2m1",
                     "OCP MX FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6",
                     NL_FMT_KIND_FLOAT,
                     4,
                     2,
                     1,
                     1,
                     6.0,
                     1.0,
                     0.5,
                     0.5,
                     0,
                     0,
                     1,
                     1,
                     0x7u,
                     0u,
                     0u,
                     "none",
                     "none"},
    [NL_FMT_E8M0] = {"e8m0",
                     "OCP MX scale: 2^(e-127), no zero, no sign",
                     NL_FMT_KIND_SCALE,
                     8,
                     8,
                     0,
                     127,
                     0x1p127,
                     0x1p-127,
                     0x1p-127,
                     1.0,
                     0,
                     1,
                     0,
                     1,
                     0xFEu,
                     0u,
                     0xFFu,
                     "none",
                     "11111111"},
    [NL_FMT_INT8] = {"int8",
                     "two's complement integer -128..127",
                     NL_FMT_KIND_INT,
                     8,
                     0,
                     7,
                     0,
                     127.0,
                     1.0,
                     1.0,
                     1.0,
                     0,
                     0,
                     1,
                     1,
                     0x7Fu,
                     0u,
                     0u,
                     "none",
                     "none"},
    [NL_FMT_INT4] = {"int4",
                     "two's complement integer -8..7",
                     NL_FMT_KIND_INT,
                     4,
                     0,
                     3,
                     0,
                     7.0,
                     1.0,
                     1.0,
                     1.0,
                     0,
                     0,
                     1,
                     1,
                     0x7u,
                     0u,
                     0u,
                     "none",
                     "none"},
};

static const char *const ALIASES[][2] = {
    {"float32", "fp32"},  {"f32", "fp32"},      {"float", "fp32"},       {"tensorfloat32", "tf32"},
    {"bfloat16", "bf16"}, {"float16", "fp16"},  {"half", "fp16"},        {"f16", "fp16"},
    {"fp8_e4m3", "e4m3"}, {"e4m3fn", "e4m3"},   {"fp8e4m3", "e4m3"},     {"float8_e4m3fn", "e4m3"},
    {"fp8_e5m2", "e5m2"}, {"fp8e5m2", "e5m2"},  {"float8_e5m2", "e5m2"}, {"fp6_e3m2", "e3m2"},
    {"fp6_e2m3", "e2m3"}, {"fp4_e2m1", "e2m1"}, {"fp4", "e2m1"},         {"mxfp4", "e2m1"},
    {"scale", "e8m0"},    {"i8", "int8"},       {"i4", "int4"},
};

const nl_format_info *nl_fmt_info(nl_format f) {
    if ((unsigned)f >= NL_FMT_COUNT) return NULL;
    return &INFO[f];
}

const char *nl_fmt_name(nl_format f) { return (unsigned)f < NL_FMT_COUNT ? INFO[f].name : "?"; }

const char *nl_fmt_names(void) { return "fp32, tf32, bf16, fp16, e4m3, e5m2, e3m2, e2m3, e2m1, e8m0, int8, int4"; }

nl_status nl_fmt_from_name(const char *name, nl_format *out) {
    if (!name || !out) return nl_fail(NL_ERR_INVALID, "format name is missing");
    const char *n = name;
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (!strcasecmp(name, ALIASES[i][0])) n = ALIASES[i][1];
    for (int f = 0; f < NL_FMT_COUNT; f++)
        if (!strcasecmp(n, INFO[f].name)) {
            *out = (nl_format)f;
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown format '%s' (valid: %s)", name, nl_fmt_names());
}

static inline uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ---- scalar encode ------------------------------------------------------------------------ */

static int saturates(const nl_format_info *fi, nl_overflow o) {
    return o == NL_OVERFLOW_SATURATE || (o == NL_OVERFLOW_DEFAULT && fi->saturate_by_default);
}

/* Rounds mant * 2^-sh (mant < 2^24, sh >= 1) to an integer by rounding mode r. */
static uint64_t round_shift(uint64_t mant, int sh, nl_rounding r, uint32_t rand32) {
    if (sh > 40) { /* value < 2^-16: only stochastic rounding can give 1 */
        if (r == NL_ROUND_STOCHASTIC) return (double)rand32 * 0x1p-32 < ldexp((double)mant, -sh);
        return 0;
    }
    uint64_t q = mant >> sh, rem = mant & ((UINT64_C(1) << sh) - 1), half = UINT64_C(1) << (sh - 1);
    switch (r) {
    case NL_ROUND_NEAREST_EVEN:
        if (rem > half || (rem == half && (q & 1))) q++;
        break;
    case NL_ROUND_NEAREST_AWAY:
        if (rem >= half) q++;
        break;
    case NL_ROUND_STOCHASTIC:
        if ((double)rand32 * 0x1p-32 < ldexp((double)rem, -sh)) q++;
        break;
    case NL_ROUND_TOWARD_ZERO: break;
    }
    return q;
}

static nl_status encode_float(const nl_format_info *fi, float x, nl_rounding r, nl_overflow o, uint32_t rand32,
                              uint32_t *code) {
    uint32_t u = f2u(x), a = u & 0x7FFFFFFFu;
    uint32_t sbit = (u >> 31) << (fi->bits - 1);
    if (a > 0x7F800000u) {
        if (!fi->has_nan) return nl_fail(NL_ERR_INVALID, "NaN cannot be stored in %s (it has no NaN)", fi->name);
        *code = sbit | fi->nan_code;
        return NL_OK;
    }
    int sat = saturates(fi, o);
    uint64_t mag;
    if (a == 0x7F800000u) {
        mag = UINT64_MAX; /* infinite: always beyond max_code */
    } else if (a == 0) {
        mag = 0;
    } else {
        int ef = (int)(a >> 23);
        uint64_t mant = a & 0x7FFFFFu;
        int e, E;
        if (ef) {
            mant |= 0x800000u;
            e = ef - 150;
            E = ef - 127;
        } else {
            e = -149;
            E = (31 - __builtin_clz((uint32_t)mant)) - 149;
        }
        int emin = 1 - fi->bias, M = fi->man_bits;
        int Eq = E > emin ? E : emin;
        int sh = (Eq - M) - e;
        uint64_t q = sh <= 0 ? mant << -sh : round_shift(mant, sh, r, rand32);
        mag = ((uint64_t)(Eq + fi->bias - 1) << M) + q;
    }
    if (mag > fi->max_code) {
        int finite_in = a != 0x7F800000u;
        if (sat || (finite_in && r == NL_ROUND_TOWARD_ZERO))
            mag = fi->max_code;
        else if (fi->has_inf)
            mag = fi->inf_code;
        else if (fi->has_nan)
            mag = fi->nan_code;
        else
            return nl_fail(NL_ERR_RANGE, "%g overflows %s (max %g, no inf or NaN; use saturation)", (double)x, fi->name,
                           fi->max_finite);
    }
    *code = sbit | (uint32_t)mag;
    return NL_OK;
}

static nl_status encode_e8m0(float x, nl_rounding r, nl_overflow o, uint32_t rand32, uint32_t *code) {
    uint32_t u = f2u(x);
    if (x != x) {
        *code = 0xFF;
        return NL_OK;
    }
    if (!(x > 0)) return nl_fail(NL_ERR_RANGE, "e8m0 has no zero and no sign, cannot store %g", (double)x);
    int sat = o != NL_OVERFLOW_IEEE;
    if (u == 0x7F800000u) {
        *code = sat ? 0xFE : 0xFF;
        return NL_OK;
    }
    /* x = 2^k * (1 + f), f in [0, 1) (fp32 subnormals: below 2^-126) */
    uint32_t ef = u >> 23, mf = u & 0x7FFFFFu;
    uint32_t c = 0;
    if (ef == 0) {
        /* candidates 2^-127 (code 0, = mf 0x400000) and 2^-126 (code 1); nothing below 2^-127 */
        if (mf <= 0x400000u)
            c = 0;
        else if (r == NL_ROUND_TOWARD_ZERO)
            c = 0;
        else if (r == NL_ROUND_STOCHASTIC)
            c = (double)rand32 * 0x1p-32 < (mf - 0x400000u) * 0x1p-22;
        else
            c = mf > 0x600000u || (mf == 0x600000u && r == NL_ROUND_NEAREST_AWAY);
        /* tie at 1.5 * 2^-127 under nearest-even: codes 0 (even) and 1 -> 0 */
    } else {
        c = ef; /* 2^(ef-127), the value rounded down */
        if (mf) {
            /* next value 2^(ef-126); midpoint is mantissa 0x400000 */
            int up = 0;
            switch (r) {
            case NL_ROUND_NEAREST_EVEN: up = mf > 0x400000u || (mf == 0x400000u && (ef & 1)); break;
            case NL_ROUND_NEAREST_AWAY: up = mf >= 0x400000u; break;
            case NL_ROUND_STOCHASTIC: up = (double)rand32 * 0x1p-32 < mf * 0x1p-23; break;
            case NL_ROUND_TOWARD_ZERO: break;
            }
            c += (uint32_t)up;
        }
    }
    if (c > 0xFE) c = sat ? 0xFE : 0xFF;
    *code = c;
    return NL_OK;
}

static nl_status encode_int(const nl_format_info *fi, float x, nl_rounding r, nl_overflow o, uint32_t rand32,
                            uint32_t *code) {
    if (x != x) return nl_fail(NL_ERR_INVALID, "NaN cannot be stored in %s", fi->name);
    double lo = -(double)fi->max_finite - 1, hi = fi->max_finite;
    double v = (double)x, t;
    if (v > hi + 1 || v < lo - 1) {
        t = v; /* far out of range: no rounding needed to decide */
    } else {
        t = trunc(v);
        double frac = fabs(v - t), step = v < 0 ? -1 : 1;
        switch (r) {
        case NL_ROUND_NEAREST_EVEN:
            if (frac > 0.5 || (frac == 0.5 && fmod(t, 2) != 0)) t += step;
            break;
        case NL_ROUND_NEAREST_AWAY:
            if (frac >= 0.5) t += step;
            break;
        case NL_ROUND_STOCHASTIC:
            if ((double)rand32 * 0x1p-32 < frac) t += step;
            break;
        case NL_ROUND_TOWARD_ZERO: break;
        }
    }
    if (t > hi || t < lo) {
        if (o == NL_OVERFLOW_IEEE)
            return nl_fail(NL_ERR_RANGE, "%g is outside %s's range [%g, %g]", (double)x, fi->name, lo, hi);
        t = t > hi ? hi : lo;
    }
    *code = (uint32_t)(int32_t)t & ((1u << fi->bits) - 1);
    return NL_OK;
}

nl_status nl_fmt_encode(nl_format f, float x, nl_rounding r, nl_overflow o, uint32_t rand32, uint32_t *code) {
    if ((unsigned)f >= NL_FMT_COUNT) return nl_fail(NL_ERR_INVALID, "unknown format id %d", (int)f);
    if ((unsigned)r > NL_ROUND_NEAREST_AWAY) return nl_fail(NL_ERR_INVALID, "unknown rounding mode %d", (int)r);
    if ((unsigned)o > NL_OVERFLOW_IEEE) return nl_fail(NL_ERR_INVALID, "unknown overflow policy %d", (int)o);
    if (!code) return nl_fail(NL_ERR_INVALID, "nl_fmt_encode: code is NULL");
    const nl_format_info *fi = &INFO[f];
    if (f == NL_FMT_FP32) {
        uint32_t u = f2u(x);
        if (o == NL_OVERFLOW_SATURATE && (u & 0x7FFFFFFFu) == 0x7F800000u) u = (u & 0x80000000u) | 0x7F7FFFFFu;
        *code = u;
        return NL_OK;
    }
    if (f == NL_FMT_E8M0) return encode_e8m0(x, r, o, rand32, code);
    if (fi->kind == NL_FMT_KIND_INT) return encode_int(fi, x, r, o, rand32, code);
    return encode_float(fi, x, r, o, rand32, code);
}

/* ---- scalar decode ------------------------------------------------------------------------ */

float nl_fmt_decode(nl_format f, uint32_t code) {
    if ((unsigned)f >= NL_FMT_COUNT) return NAN;
    const nl_format_info *fi = &INFO[f];
    switch (f) {
    case NL_FMT_FP32: return u2f(code);
    case NL_FMT_TF32: return u2f((code & 0x7FFFFu) << 13);
    case NL_FMT_BF16: return u2f((code & 0xFFFFu) << 16);
    case NL_FMT_E8M0: code &= 0xFF; return code == 0xFF ? NAN : (float)ldexp(1.0, (int)code - 127);
    case NL_FMT_INT8: return (float)(int8_t)(uint8_t)code;
    case NL_FMT_INT4: {
        int v = (int)(code & 0xF);
        return (float)(v >= 8 ? v - 16 : v);
    }
    default: break;
    }
    int M = fi->man_bits, E = fi->exp_bits;
    uint32_t s = (code >> (fi->bits - 1)) & 1u;
    uint32_t mag = code & ((1u << (fi->bits - 1)) - 1);
    uint32_t ef = mag >> M, mf = mag & ((1u << M) - 1);
    if (fi->has_inf && ef == (1u << E) - 1) {
        if (mf == 0) return s ? -INFINITY : INFINITY;
        return u2f((s << 31) | 0x7FC00000u | (mf << (23 - M)));
    }
    if (fi->has_nan && !fi->has_inf && mag == fi->nan_code) /* E4M3: S.1111.111 */
        return u2f((s << 31) | 0x7FC00000u | (mf << (23 - M)));
    double v = ef ? ldexp((double)(mf + (1u << M)), (int)ef - fi->bias - M) : ldexp((double)mf, 1 - fi->bias - M);
    return (float)(s ? -v : v);
}

float nl_fmt_round(nl_format f, float x) {
    if (x != x) return x;
    uint32_t c = 0;
    if (nl_fmt_encode(f, x, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c) != NL_OK) {
        nl_clear_error();
        return NAN; /* E8M0 of x <= 0 */
    }
    return nl_fmt_decode(f, c);
}

/* ---- neighbours --------------------------------------------------------------------------- */

/* Largest representable magnitude <= m (m >= 0, not NaN), as a code; -1 if none (E8M0). */
static int64_t floor_code(nl_format f, float m) {
    uint32_t c = 0;
    if (f == NL_FMT_E8M0 && m < 0x1p-127f) return -1;
    if (nl_fmt_encode(f, m, NL_ROUND_TOWARD_ZERO, NL_OVERFLOW_SATURATE, 0, &c) != NL_OK) return -1;
    return (int64_t)c;
}

static double value_or_none(nl_format f, int64_t code, double inf_side) {
    /* Callers pass a checked format; the test tells GCC so (-O2 -Warray-bounds at RelWithDebInfo). */
    if ((unsigned)f >= NL_FMT_COUNT) return NAN;
    const nl_format_info *fi = &INFO[f];
    if (code < 0) return fi->has_inf ? -INFINITY : NAN;
    if ((uint64_t)code > fi->max_code) return fi->has_inf ? inf_side : NAN;
    return (double)nl_fmt_decode(f, (uint32_t)code);
}

/* Neighbours of m >= 0 among magnitudes (float and E8M0 codes are monotone in magnitude). */
static void mag_neighbors(nl_format f, float m, double *below, double *above) {
    if ((unsigned)f >= NL_FMT_COUNT) {
        *below = *above = NAN;
        return;
    }
    const nl_format_info *fi = &INFO[f];
    int64_t c = floor_code(f, m);
    double v = c < 0 ? -1 : (double)nl_fmt_decode(f, (uint32_t)c);
    if (isinf(m)) {
        *below = fi->max_finite;
        *above = NAN;
    } else if (c >= 0 && v == (double)m) {
        *below = c == 0 ? (fi->has_sign ? -fi->min_subnormal : NAN) : value_or_none(f, c - 1, INFINITY);
        *above = value_or_none(f, c + 1, INFINITY);
    } else {
        *below = c < 0 ? NAN : v;
        *above = value_or_none(f, c + 1, INFINITY);
    }
}

nl_status nl_fmt_neighbors(nl_format f, float x, double *below, double *above) {
    if ((unsigned)f >= NL_FMT_COUNT) return nl_fail(NL_ERR_INVALID, "unknown format id %d", (int)f);
    if (x != x) return nl_fail(NL_ERR_INVALID, "neighbours of NaN are undefined");
    double b, a;
    const nl_format_info *fi = &INFO[f];
    if (fi->kind == NL_FMT_KIND_INT) {
        double fl = floor((double)x), lo = -fi->max_finite - 1, hi = fi->max_finite;
        b = fl == x ? fl - 1 : fl;
        a = fl + 1;
        if (b > hi) b = hi;
        if (b < lo) b = NAN;
        if (a < lo) a = lo;
        if (a > hi) a = NAN;
    } else if (f == NL_FMT_E8M0 && !(x > 0)) {
        b = NAN;
        a = 0x1p-127;
    } else if (signbit(x) && x != 0) {
        double nb, na;
        mag_neighbors(f, -x, &nb, &na);
        b = -na;
        a = -nb;
    } else {
        if (x == 0) {
            b = fi->has_sign ? -fi->min_subnormal : NAN;
            a = fi->min_subnormal;
        } else {
            mag_neighbors(f, x, &b, &a);
        }
    }
    if (below) *below = b;
    if (above) *above = a;
    return NL_OK;
}

double nl_fmt_ulp(nl_format f, float x) {
    if ((unsigned)f >= NL_FMT_COUNT || x != x) return NAN;
    const nl_format_info *fi = &INFO[f];
    if (fi->kind == NL_FMT_KIND_INT) return 1.0;
    float m = fabsf(x);
    if (f == NL_FMT_E8M0) {
        if (m < 0x1p-127f) return 0x1p-127;
        int64_t c = floor_code(f, m);
        if (c >= 0xFE) c = 0xFD;
        return ldexp(1.0, (int)c - 127); /* 2^(c+1-127) - 2^(c-127) */
    }
    int64_t c = floor_code(f, m);
    if (c >= (int64_t)fi->max_code) c = (int64_t)fi->max_code - 1;
    return (double)nl_fmt_decode(f, (uint32_t)c + 1) - (double)nl_fmt_decode(f, (uint32_t)c);
}

/* ---- bulk: portable kernels --------------------------------------------------------------- */

static nl_fmt_mini MINI[NL_FMT_COUNT];
static pthread_once_t MINI_ONCE = PTHREAD_ONCE_INIT;
static float FP16_DEC[65536];
static float BYTE_DEC[NL_FMT_COUNT][256];

static void init_tables(void) {
    for (int f = 0; f < NL_FMT_COUNT; f++) {
        const nl_format_info *fi = &INFO[f];
        if (fi->kind == NL_FMT_KIND_FLOAT && fi->bias < 127) {
            int M = fi->man_bits, B = fi->bias;
            nl_fmt_mini *p = &MINI[f];
            p->shift = (uint32_t)(23 - M);
            p->rebias = (uint32_t)(B - 127) << 23;
            p->round_base = (1u << (22 - M)) - 1;
            p->min_normal_bits = (uint32_t)(127 + 1 - B) << 23;
            p->d_bits = (uint32_t)(127 + 24 - B - M) << 23;
            p->max_code = fi->max_code;
            p->ovf_code = fi->saturate_by_default ? fi->max_code : fi->inf_code;
            p->nan_code = fi->nan_code;
            p->sign_shift = (uint32_t)(fi->bits - 1);
        }
        if (fi->bits <= 8 && f != NL_FMT_FP32)
            for (uint32_t c = 0; c < (1u << fi->bits); c++) BYTE_DEC[f][c] = nl_fmt_decode((nl_format)f, c);
    }
    for (uint32_t c = 0; c < 65536; c++) FP16_DEC[c] = nl_fmt_decode(NL_FMT_FP16, c);
}

static void ensure_init(void) { pthread_once(&MINI_ONCE, init_tables); }

static inline uint32_t mini_one(const nl_fmt_mini *p, uint32_t u, int *nan) {
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t n = (a + p->rebias + p->round_base + ((a >> p->shift) & 1u)) >> p->shift;
    uint32_t s = f2u(u2f(a) + u2f(p->d_bits)) - p->d_bits;
    uint32_t c = a < p->min_normal_bits ? s : n;
    c = c > p->max_code ? p->ovf_code : c;
    int isnan = a > 0x7F800000u;
    *nan |= isnan;
    c = isnan ? p->nan_code : c;
    return c | ((u >> 31) << p->sign_shift);
}

int nl_fmt_mini_portable_u8(const nl_fmt_mini *pp, const float *x, size_t n, uint8_t *out) {
    const nl_fmt_mini local = *pp, *p = &local; /* a copy: stores to out cannot alias it */
    int nan = 0;
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)mini_one(p, f2u(x[i]), &nan);
    return nan;
}

int nl_fmt_mini_portable_u16(const nl_fmt_mini *pp, const float *x, size_t n, uint16_t *out) {
    const nl_fmt_mini local = *pp, *p = &local;
    int nan = 0;
    for (size_t i = 0; i < n; i++) out[i] = (uint16_t)mini_one(p, f2u(x[i]), &nan);
    return nan;
}

int nl_fmt_bf16_portable(const float *x, size_t n, uint16_t *out) {
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = f2u(x[i]);
        int isnan = (u & 0x7FFFFFFFu) > 0x7F800000u;
        uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
        nan |= isnan;
        out[i] = (uint16_t)(isnan ? (((u >> 16) & 0x8000u) | 0x7FC0u) : r);
    }
    return nan;
}

/* tf32: the bf16 trick with 13 dropped bits; the sign lands in bit 18 of the 19-bit code. */
static int tf32_portable(const float *x, size_t n, uint32_t *out) {
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = f2u(x[i]);
        int isnan = (u & 0x7FFFFFFFu) > 0x7F800000u;
        uint32_t r = (u + 0xFFFu + ((u >> 13) & 1u)) >> 13;
        nan |= isnan;
        out[i] = isnan ? (((u >> 13) & 0x40000u) | 0x3FE00u) : r;
    }
    return nan;
}

/* ---- bulk: dispatch ----------------------------------------------------------------------- */

const char *nl_fmt_kernel_name(nl_fmt_kernel k) {
    static const char *names[NL_FMT_KERNEL_COUNT] = {"auto", "portable", "avx2", "avx512", "avx512bf16"};
    return (unsigned)k < NL_FMT_KERNEL_COUNT ? names[k] : "?";
}

static int is_mini(nl_format f) {
    return f == NL_FMT_FP16 || f == NL_FMT_E4M3 || f == NL_FMT_E5M2 || f == NL_FMT_E3M2 || f == NL_FMT_E2M3 ||
           f == NL_FMT_E2M1;
}

int nl_fmt_kernel_available(nl_format f, nl_fmt_kernel k) {
    if ((unsigned)f >= NL_FMT_COUNT) return 0;
    switch (k) {
    case NL_FMT_KERNEL_AUTO:
    case NL_FMT_KERNEL_PORTABLE: return 1;
    case NL_FMT_KERNEL_AVX2: return (is_mini(f) || f == NL_FMT_BF16) && nl_fmt_cpu_avx2();
    case NL_FMT_KERNEL_AVX512: return (is_mini(f) || f == NL_FMT_BF16) && nl_fmt_cpu_avx512();
    case NL_FMT_KERNEL_AVX512BF16: return f == NL_FMT_BF16 && nl_fmt_cpu_avx512bf16();
    default: return 0;
    }
}

nl_fmt_kernel nl_fmt_kernel_auto(nl_format f) {
    static const nl_fmt_kernel order[] = {NL_FMT_KERNEL_AVX512BF16, NL_FMT_KERNEL_AVX512, NL_FMT_KERNEL_AVX2};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (nl_fmt_kernel_available(f, order[i])) return order[i];
    return NL_FMT_KERNEL_PORTABLE;
}

size_t nl_fmt_code_bytes(nl_format f) {
    if ((unsigned)f >= NL_FMT_COUNT) return 0;
    return INFO[f].bits > 16 ? 4 : INFO[f].bits > 8 ? 2 : 1;
}

/* Runs kernel k (already checked available); returns nonzero if a NaN was seen. */
static int run_kernel(nl_format f, nl_fmt_kernel k, const float *x, size_t n, void *codes) {
    if (f == NL_FMT_BF16) {
        switch (k) {
        case NL_FMT_KERNEL_AVX512BF16: return nl_fmt_bf16_avx512bf16(x, n, codes);
        case NL_FMT_KERNEL_AVX512: return nl_fmt_bf16_avx512(x, n, codes);
        case NL_FMT_KERNEL_AVX2: return nl_fmt_bf16_avx2(x, n, codes);
        default: return nl_fmt_bf16_portable(x, n, codes);
        }
    }
    if (f == NL_FMT_FP16) {
        switch (k) {
        case NL_FMT_KERNEL_AVX512: return nl_fmt_fp16_avx512(x, n, codes);
        case NL_FMT_KERNEL_AVX2: return nl_fmt_fp16_f16c(x, n, codes);
        default: return nl_fmt_mini_portable_u16(&MINI[f], x, n, codes);
        }
    }
    if (is_mini(f)) {
        switch (k) {
        case NL_FMT_KERNEL_AVX512: return nl_fmt_mini_avx512_u8(&MINI[f], x, n, codes);
        case NL_FMT_KERNEL_AVX2: return nl_fmt_mini_avx2_u8(&MINI[f], x, n, codes);
        default: return nl_fmt_mini_portable_u8(&MINI[f], x, n, codes);
        }
    }
    if (f == NL_FMT_FP32) {
        memmove(codes, x, n * sizeof(float));
        return 0;
    }
    if (f == NL_FMT_TF32) return tf32_portable(x, n, codes);
    return -1; /* E8M0, int8, int4: the scalar loop in the caller */
}

static nl_status encode_scalar_loop(nl_format f, const float *x, size_t n, void *codes) {
    size_t w = nl_fmt_code_bytes(f);
    for (size_t i = 0; i < n; i++) {
        uint32_t c;
        nl_status rc = nl_fmt_encode(f, x[i], NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c);
        if (rc != NL_OK) return nl_fail(rc, "x[%zu]: %s", i, nl_last_error());
        if (w == 4)
            ((uint32_t *)codes)[i] = c;
        else if (w == 2)
            ((uint16_t *)codes)[i] = (uint16_t)c;
        else
            ((uint8_t *)codes)[i] = (uint8_t)c;
    }
    return NL_OK;
}

static nl_status first_nan_error(nl_format f, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != x[i]) return nl_fail(NL_ERR_INVALID, "x[%zu] is NaN and %s has no NaN", i, INFO[f].name);
    return nl_fail(NL_ERR_INVALID, "NaN in input and %s has no NaN", INFO[f].name);
}

nl_status nl_fmt_encode_array_kernel(nl_format f, nl_fmt_kernel k, const float *x, size_t n, void *codes) {
    if ((unsigned)f >= NL_FMT_COUNT) return nl_fail(NL_ERR_INVALID, "unknown format id %d", (int)f);
    if (n && (!x || !codes)) return nl_fail(NL_ERR_INVALID, "nl_fmt_encode_array: NULL array with n = %zu", n);
    if (!nl_fmt_kernel_available(f, k))
        return nl_fail(NL_ERR_UNSUPPORTED, "kernel %s is not available for %s on this CPU", nl_fmt_kernel_name(k),
                       INFO[f].name);
    ensure_init();
    if (k == NL_FMT_KERNEL_AUTO) k = nl_fmt_kernel_auto(f);
    int nan = run_kernel(f, k, x, n, codes);
    if (nan < 0) return encode_scalar_loop(f, x, n, codes);
    if (nan && !INFO[f].has_nan) return first_nan_error(f, x, n);
    return NL_OK;
}

nl_status nl_fmt_encode_array(nl_format f, const float *x, size_t n, void *codes) {
    return nl_fmt_encode_array_kernel(f, NL_FMT_KERNEL_AUTO, x, n, codes);
}

nl_status nl_fmt_decode_array(nl_format f, const void *codes, size_t n, float *out) {
    if ((unsigned)f >= NL_FMT_COUNT) return nl_fail(NL_ERR_INVALID, "unknown format id %d", (int)f);
    if (n && (!codes || !out)) return nl_fail(NL_ERR_INVALID, "nl_fmt_decode_array: NULL array with n = %zu", n);
    ensure_init();
    const nl_format_info *fi = &INFO[f];
    if (f == NL_FMT_FP32) {
        memmove(out, codes, n * 4);
    } else if (f == NL_FMT_TF32) {
        const uint32_t *c = codes;
        for (size_t i = 0; i < n; i++) out[i] = u2f((c[i] & 0x7FFFFu) << 13);
    } else if (f == NL_FMT_BF16) {
        const uint16_t *c = codes;
        for (size_t i = 0; i < n; i++) out[i] = u2f((uint32_t)c[i] << 16);
    } else if (f == NL_FMT_FP16) {
        if (nl_fmt_cpu_avx512()) {
            nl_fmt_fp16_decode_avx512(codes, n, out);
        } else {
            const uint16_t *c = codes;
            for (size_t i = 0; i < n; i++) out[i] = FP16_DEC[c[i]];
        }
    } else {
        const uint8_t *c = codes;
        uint8_t mask = (uint8_t)((1u << fi->bits) - 1);
        for (size_t i = 0; i < n; i++) out[i] = BYTE_DEC[f][c[i] & mask];
    }
    return NL_OK;
}

nl_status nl_fmt_round_array(nl_format f, float *x, size_t n) {
    if ((unsigned)f >= NL_FMT_COUNT) return nl_fail(NL_ERR_INVALID, "unknown format id %d", (int)f);
    if (n && !x) return nl_fail(NL_ERR_INVALID, "nl_fmt_round_array: NULL array with n = %zu", n);
    if (f == NL_FMT_FP32) return NL_OK;
    ensure_init();
    const nl_format_info *fi = &INFO[f];
    if (!is_mini(f) && f != NL_FMT_BF16) {
        for (size_t i = 0; i < n; i++) x[i] = nl_fmt_round(f, x[i]);
        return NL_OK;
    }
    enum { CHUNK = 1024 };
    _Alignas(64) uint16_t buf[CHUNK];
    nl_fmt_kernel k = nl_fmt_kernel_auto(f);
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        size_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        float *xs = x + i0;
        int nan = run_kernel(f, k, xs, m, buf);
        if (nan && !fi->has_nan) {
            for (size_t i = 0; i < m; i++)
                if (xs[i] == xs[i]) xs[i] = nl_fmt_decode(f, ((uint8_t *)buf)[i]);
            continue;
        }
        nl_fmt_decode_array(f, buf, m, xs);
    }
    return NL_OK;
}
