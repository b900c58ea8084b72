/* Number formats: the course's known codes and examples, properties, rounding modes,
 * overflow policies, neighbours, and every bulk kernel against the scalar reference. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/formats.h"

static uint32_t enc(nl_format f, float x) {
    uint32_t c = 0xDEADBEEF;
    assert_int_equal(nl_fmt_encode(f, x, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c), NL_OK);
    return c;
}

static uint32_t enc_ro(nl_format f, float x, nl_rounding r, nl_overflow o) {
    uint32_t c = 0xDEADBEEF;
    assert_int_equal(nl_fmt_encode(f, x, r, o, 0, &c), NL_OK);
    return c;
}

static float bits2f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static uint32_t f2bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static void test_course_examples(void **state) {
    (void)state;
    /* fp16(70000) = inf (max 65504); fp16(1e-8) = 0; fp16(257) = 257 */
    assert_true(isinf(nl_fmt_round(NL_FMT_FP16, 70000.0f)) && nl_fmt_round(NL_FMT_FP16, 70000.0f) > 0);
    assert_true(nl_fmt_info(NL_FMT_FP16)->max_finite == 65504.0);
    assert_true(nl_fmt_round(NL_FMT_FP16, 1e-8f) == 0.0f);
    assert_true(nl_fmt_round(NL_FMT_FP16, 257.0f) == 257.0f);
    /* bf16(257) = 256, neighbours 256 and 258; bf16(70000) = 70144; bf16(1e-8) ~ 1.0012e-8 */
    assert_true(nl_fmt_round(NL_FMT_BF16, 257.0f) == 256.0f);
    double lo, hi;
    assert_int_equal(nl_fmt_neighbors(NL_FMT_BF16, 257.0f, &lo, &hi), NL_OK);
    assert_true(lo == 256.0 && hi == 258.0);
    assert_true(nl_fmt_round(NL_FMT_BF16, 70000.0f) == 70144.0f);
    float t = nl_fmt_round(NL_FMT_BF16, 1e-8f);
    assert_true(fabs(t - 1.0012e-8) < 0.00005e-8);
    /* E4M3 max 448, E5M2 max 57344 */
    assert_true(nl_fmt_info(NL_FMT_E4M3)->max_finite == 448.0);
    assert_true(nl_fmt_info(NL_FMT_E5M2)->max_finite == 57344.0);
    assert_true(nl_fmt_decode(NL_FMT_E4M3, 0x7E) == 448.0f);
    assert_true(nl_fmt_decode(NL_FMT_E5M2, 0x7B) == 57344.0f);
    /* E4M3 spacing on [64, 128) is 8; 64 + 3 = 64 */
    assert_true(nl_fmt_ulp(NL_FMT_E4M3, 64.0f) == 8.0);
    assert_true(nl_fmt_ulp(NL_FMT_E4M3, 100.0f) == 8.0);
    assert_true(nl_fmt_round(NL_FMT_E4M3, 64.0f + 3.0f) == 64.0f);
    /* 100 threes in E4M3: reaches 64 at step 18 and stays; promoting every 8 gives 300 */
    float s = 0;
    int first64 = 0;
    for (int i = 1; i <= 100; i++) {
        s = nl_fmt_round(NL_FMT_E4M3, s + 3.0f);
        if (s == 64.0f && !first64) first64 = i;
    }
    assert_int_equal(first64, 18);
    assert_true(s == 64.0f);
    float acc = 0, part = 0;
    for (int i = 1; i <= 100; i++) {
        part = nl_fmt_round(NL_FMT_E4M3, part + 3.0f);
        if (i % 8 == 0 || i == 100) {
            acc += part;
            part = 0;
        }
    }
    assert_true(acc == 300.0f);
}

static void test_known_codes(void **state) {
    (void)state;
    assert_int_equal(enc(NL_FMT_FP16, 1.0f), 0x3C00);
    assert_int_equal(enc(NL_FMT_FP16, 65504.0f), 0x7BFF);
    assert_int_equal(enc(NL_FMT_FP16, 0x1p-24f), 0x0001);
    assert_int_equal(enc(NL_FMT_FP16, (float)M_PI), 0x4248);
    assert_int_equal(enc(NL_FMT_BF16, 1.0f), 0x3F80);
    assert_int_equal(enc(NL_FMT_BF16, bits2f(0x3F808000)), 0x3F80); /* tie -> even */
    assert_int_equal(enc(NL_FMT_BF16, bits2f(0x3F818000)), 0x3F82); /* tie -> even (up) */
    assert_int_equal(enc(NL_FMT_BF16, (float)M_PI), 0x4049);
    assert_int_equal(enc(NL_FMT_E4M3, 448.0f), 0x7E);
    assert_int_equal(enc(NL_FMT_E4M3, 1.0f), 0x38);
    assert_int_equal(enc(NL_FMT_E4M3, 240.0f), 0x77);
    assert_int_equal(enc(NL_FMT_E4M3, 0x1p-6f), 0x08);
    assert_int_equal(enc(NL_FMT_E4M3, 0x1p-9f), 0x01);
    assert_true(isnan(nl_fmt_decode(NL_FMT_E4M3, 0x7F)));
    assert_true(isnan(nl_fmt_decode(NL_FMT_E4M3, 0xFF)));
    assert_int_equal(enc(NL_FMT_E4M3, 500.0f), 0x7E); /* saturating default */
    assert_int_equal(enc(NL_FMT_E4M3, 400.0f), 0x7C); /* 384: tie between 384 and 416 -> even */
    assert_true(nl_fmt_decode(NL_FMT_E4M3, 0x7C) == 384.0f);
    assert_int_equal(enc(NL_FMT_E5M2, 57344.0f), 0x7B);
    assert_int_equal(enc(NL_FMT_E5M2, 1.0f), 0x3C);
    assert_true(isinf(nl_fmt_decode(NL_FMT_E5M2, 0x7C)) && nl_fmt_decode(NL_FMT_E5M2, 0x7C) > 0);
    const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (uint32_t c = 0; c < 8; c++) {
        assert_true(nl_fmt_decode(NL_FMT_E2M1, c) == e2m1[c]);
        assert_true(nl_fmt_decode(NL_FMT_E2M1, c | 8) == -e2m1[c] || c == 0);
        assert_int_equal(enc(NL_FMT_E2M1, e2m1[c]), c);
    }
    assert_true(nl_fmt_decode(NL_FMT_E8M0, 0x7F) == 1.0f);
    assert_true(nl_fmt_decode(NL_FMT_E8M0, 0x00) == 0x1p-127f);
    assert_true(nl_fmt_decode(NL_FMT_E8M0, 0xFE) == 0x1p127f);
    assert_true(isnan(nl_fmt_decode(NL_FMT_E8M0, 0xFF)));
    assert_true(nl_fmt_round(NL_FMT_TF32, 1.0001f) == 1.0f);
    /* MX maxima */
    assert_true(nl_fmt_decode(NL_FMT_E3M2, 0x1F) == 28.0f);
    assert_true(nl_fmt_decode(NL_FMT_E2M3, 0x1F) == 7.5f);
    assert_true(nl_fmt_decode(NL_FMT_E2M1, 0x7) == 6.0f);
    assert_int_equal(enc(NL_FMT_E3M2, 1000.0f), 0x1F);
    assert_int_equal(enc(NL_FMT_E2M1, -7.0f), 0xF);
    /* int */
    assert_int_equal(enc(NL_FMT_INT8, 2.5f), 2);
    assert_int_equal(enc(NL_FMT_INT8, 3.5f), 4);
    assert_int_equal(enc(NL_FMT_INT8, -3.5f), 0xFC);
    assert_int_equal(enc(NL_FMT_INT8, 300.0f), 0x7F);
    assert_int_equal(enc(NL_FMT_INT8, -300.0f), 0x80);
    assert_int_equal(enc(NL_FMT_INT4, -9.0f), 0x8);
    assert_true(nl_fmt_decode(NL_FMT_INT4, 0x8) == -8.0f);
    assert_true(nl_fmt_decode(NL_FMT_INT8, 0xFF) == -1.0f);
}

/* Properties agree with the codes: max, min normal, min subnormal, epsilon. */
static void test_properties(void **state) {
    (void)state;
    for (int f = 0; f < NL_FMT_COUNT; f++) {
        const nl_format_info *fi = nl_fmt_info((nl_format)f);
        assert_non_null(fi);
        nl_format g;
        assert_int_equal(nl_fmt_from_name(fi->name, &g), NL_OK);
        assert_int_equal(g, f);
        assert_true((double)nl_fmt_decode((nl_format)f, fi->max_code) == fi->max_finite);
        if (fi->kind == NL_FMT_KIND_FLOAT) {
            assert_int_equal(fi->bits, 1 + fi->exp_bits + fi->man_bits);
            assert_true((double)nl_fmt_decode((nl_format)f, 1) == fi->min_subnormal);
            assert_true((double)nl_fmt_decode((nl_format)f, 1u << fi->man_bits) == fi->min_normal);
            assert_true(fi->epsilon == ldexp(1.0, -fi->man_bits));
            assert_true(nl_fmt_ulp((nl_format)f, 1.0f) == fi->epsilon);
            if (fi->has_inf) assert_true(isinf(nl_fmt_decode((nl_format)f, fi->inf_code)));
            if (fi->has_nan) assert_true(isnan(nl_fmt_decode((nl_format)f, fi->nan_code)));
        }
    }
    nl_format g;
    assert_int_equal(nl_fmt_from_name("bfloat16", &g), NL_OK);
    assert_int_equal(g, NL_FMT_BF16);
    assert_int_equal(nl_fmt_from_name("fp7", &g), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "fp7"));
    assert_non_null(strstr(nl_last_error(), "e4m3"));
}

/* Decode is exact: re-encoding every decoded code gives the code back. */
static void test_decode_exact(void **state) {
    (void)state;
    for (int f = NL_FMT_BF16; f < NL_FMT_COUNT; f++) {
        const nl_format_info *fi = nl_fmt_info((nl_format)f);
        for (uint32_t c = 0; c < (1u << fi->bits); c++) {
            float v = nl_fmt_decode((nl_format)f, c);
            if (isnan(v)) continue;
            if (f == NL_FMT_E8M0 || fi->kind == NL_FMT_KIND_INT) {
                assert_int_equal(enc((nl_format)f, v), c);
                continue;
            }
            uint32_t mag = c & ((1u << (fi->bits - 1)) - 1);
            if (v == 0 && mag == 0) continue; /* +-0 both fine */
            assert_int_equal(enc_ro((nl_format)f, v, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_IEEE), c);
        }
    }
}

static void test_rounding_modes(void **state) {
    (void)state;
    /* bf16 around 257: RTZ -> 256, away 257 -> 258 (tie), RNE -> 256 */
    assert_int_equal(enc_ro(NL_FMT_BF16, 257.0f, NL_ROUND_TOWARD_ZERO, NL_OVERFLOW_DEFAULT), 0x4380);
    assert_int_equal(enc_ro(NL_FMT_BF16, 257.0f, NL_ROUND_NEAREST_AWAY, NL_OVERFLOW_DEFAULT), 0x4381);
    assert_int_equal(enc_ro(NL_FMT_BF16, -257.0f, NL_ROUND_TOWARD_ZERO, NL_OVERFLOW_DEFAULT), 0xC380);
    assert_int_equal(enc_ro(NL_FMT_E4M3, 67.0f, NL_ROUND_TOWARD_ZERO, NL_OVERFLOW_DEFAULT), 0x68);  /* 64 */
    assert_int_equal(enc_ro(NL_FMT_E4M3, 68.0f, NL_ROUND_NEAREST_AWAY, NL_OVERFLOW_DEFAULT), 0x69); /* 72 */
    assert_int_equal(enc_ro(NL_FMT_E4M3, 68.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT), 0x68); /* tie 64|72 */
    /* overflow policies */
    assert_int_equal(enc_ro(NL_FMT_E4M3, 500.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_IEEE), 0x7F);
    assert_int_equal(enc_ro(NL_FMT_E4M3, -INFINITY, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT), 0xFE);
    assert_int_equal(enc_ro(NL_FMT_E5M2, 1e6f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_IEEE), 0x7C);
    assert_int_equal(enc_ro(NL_FMT_E5M2, 1e6f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT), 0x7B);
    assert_int_equal(enc_ro(NL_FMT_FP16, 1e6f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_SATURATE), 0x7BFF);
    assert_int_equal(enc_ro(NL_FMT_FP16, 1e6f, NL_ROUND_TOWARD_ZERO, NL_OVERFLOW_IEEE), 0x7BFF);
    assert_int_equal(enc_ro(NL_FMT_FP16, 65519.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT), 0x7BFF);
    assert_int_equal(enc_ro(NL_FMT_FP16, 65520.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT), 0x7C00);
    uint32_t c;
    assert_int_equal(nl_fmt_encode(NL_FMT_E2M1, 7.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_IEEE, 0, &c), NL_ERR_RANGE);
    assert_int_equal(nl_fmt_encode(NL_FMT_E2M1, NAN, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c),
                     NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "e2m1"));
    assert_int_equal(nl_fmt_encode(NL_FMT_E8M0, 0.0f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c), NL_ERR_RANGE);
    /* NaN stays NaN */
    assert_int_equal(enc(NL_FMT_FP16, -NAN), 0xFE00);
    assert_int_equal(enc(NL_FMT_BF16, NAN), 0x7FC0);
    assert_int_equal(enc(NL_FMT_E4M3, NAN), 0x7F);
    assert_int_equal(enc(NL_FMT_E5M2, NAN), 0x7E);
    assert_true(isnan(nl_fmt_round(NL_FMT_E2M1, NAN)));
    /* subnormals kept: fp16 2^-25 * 1.5 rounds to 2^-24; bf16 of an fp32 subnormal */
    assert_int_equal(enc(NL_FMT_FP16, 0x1.8p-25f), 0x0001);
    assert_int_equal(enc(NL_FMT_FP16, 0x1p-25f), 0x0000); /* tie -> even (0) */
    assert_int_equal(enc(NL_FMT_BF16, bits2f(0x00018000)), 0x0002);
    assert_int_equal(enc(NL_FMT_BF16, bits2f(0x00008000)), 0x0000);
    /* E8M0: nearest power of two in value, ties (1.5 * 2^k) to the even code */
    assert_int_equal(enc(NL_FMT_E8M0, 1.5f), 0x80); /* 1 (0x7F) or 2 (0x80): tie -> even */
    assert_int_equal(enc(NL_FMT_E8M0, 3.0f), 0x80); /* 2 (0x80) or 4 (0x81) -> 0x80 */
    assert_int_equal(enc(NL_FMT_E8M0, 1.4f), 0x7F);
    assert_int_equal(enc(NL_FMT_E8M0, 1e-45f), 0x00);
}

/* Stochastic rounding is unbiased: the mean of many roundings of x approaches x. */
static void test_stochastic(void **state) {
    (void)state;
    nl_rng r;
    nl_rng_seed(&r, 7);
    const float xs[] = {257.0f, 257.5f, 1.1f, 65.0f, 3e-3f};
    const nl_format fs[] = {NL_FMT_BF16, NL_FMT_BF16, NL_FMT_E4M3, NL_FMT_E4M3, NL_FMT_E5M2};
    for (int k = 0; k < 5; k++) {
        double sum = 0;
        int n = 200000;
        double lo, hi;
        assert_int_equal(nl_fmt_neighbors(fs[k], xs[k], &lo, &hi), NL_OK);
        for (int i = 0; i < n; i++) {
            uint32_t c;
            assert_int_equal(nl_fmt_encode(fs[k], xs[k], NL_ROUND_STOCHASTIC, NL_OVERFLOW_DEFAULT, nl_rng_u32(&r), &c),
                             NL_OK);
            double v = nl_fmt_decode(fs[k], c);
            assert_true(v == lo || v == hi);
            sum += v;
        }
        double sd = (hi - lo) * 0.5 / sqrt(n);
        assert_true(fabs(sum / n - xs[k]) < 5 * sd);
    }
}

static void test_neighbors(void **state) {
    (void)state;
    double lo, hi;
    assert_int_equal(nl_fmt_neighbors(NL_FMT_FP16, 257.0f, &lo, &hi), NL_OK);
    assert_true(lo == 256.75 && hi == 257.25);
    assert_int_equal(nl_fmt_neighbors(NL_FMT_BF16, -257.0f, &lo, &hi), NL_OK);
    assert_true(lo == -258 && hi == -256);
    assert_int_equal(nl_fmt_neighbors(NL_FMT_E4M3, 448.0f, &lo, &hi), NL_OK);
    assert_true(lo == 416 && isnan(hi));
    assert_int_equal(nl_fmt_neighbors(NL_FMT_FP16, 70000.0f, &lo, &hi), NL_OK);
    assert_true(lo == 65504 && isinf(hi));
    assert_int_equal(nl_fmt_neighbors(NL_FMT_E2M1, 0.0f, &lo, &hi), NL_OK);
    assert_true(lo == -0.5 && hi == 0.5);
    assert_int_equal(nl_fmt_neighbors(NL_FMT_E2M1, 2.5f, &lo, &hi), NL_OK);
    assert_true(lo == 2 && hi == 3);
    assert_int_equal(nl_fmt_neighbors(NL_FMT_INT8, 2.5f, &lo, &hi), NL_OK);
    assert_true(lo == 2 && hi == 3);
    assert_int_equal(nl_fmt_neighbors(NL_FMT_E8M0, 3.0f, &lo, &hi), NL_OK);
    assert_true(lo == 2 && hi == 4);
    assert_true(nl_fmt_ulp(NL_FMT_BF16, 257.0f) == 2.0);
    assert_true(nl_fmt_ulp(NL_FMT_FP16, 0.0f) == 0x1p-24);
    assert_int_equal(nl_fmt_neighbors(NL_FMT_FP16, NAN, &lo, &hi), NL_ERR_INVALID);
}

/* Random fp32 bit patterns plus special values (every exponent with edge mantissas). */
static float *make_inputs(size_t *n_out) {
    size_t n = 300000;
    float *x = malloc(n * sizeof *x);
    nl_rng r;
    nl_rng_seed(&r, 12345);
    size_t i = 0;
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = 0; e < 256; e++) {
            const uint32_t ms[] = {0,        1,        2,        0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF,
                                   0x7FFFFE, 0x8000,   0x7FFF,   0x18000,  0x10000,  0xFFFF,   0x1000,
                                   0x80000,  0x100000, 0x200000, 0x180000, 0x0FFFFF, 0x300000, 0x0C0000};
            for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) x[i++] = bits2f(s << 31 | e << 23 | ms[k]);
        }
    while (i < n / 2) x[i++] = bits2f(nl_rng_u32(&r));
    while (i < n) x[i++] = (float)(nl_rng_normal(&r) * ldexp(1.0, (int)nl_rng_below(&r, 60) - 30));
    *n_out = n;
    return x;
}

static void check_kernel(nl_format f, nl_fmt_kernel k, const float *x, size_t n, int skip_nan) {
    size_t w = nl_fmt_code_bytes(f);
    uint8_t *codes = calloc(n + 64, w);
    /* odd lengths and offsets exercise the vector tails */
    for (size_t off = 0; off < 3; off++) {
        size_t m = n - off * 7;
        memset(codes, 0xAB, (n + 64) * w);
        if (skip_nan) { /* caller passes NaN-free input */
        }
        nl_status rc = nl_fmt_encode_array_kernel(f, k, x + off, m, codes);
        assert_int_equal(rc, NL_OK);
        for (size_t i = 0; i < m; i++) {
            uint32_t ref = enc(f, x[off + i]);
            uint32_t got = w == 4 ? ((uint32_t *)codes)[i] : w == 2 ? ((uint16_t *)codes)[i] : codes[i];
            if (got != ref) {
                print_error("%s kernel %s: x=%a (0x%08X) got 0x%X want 0x%X\n", nl_fmt_name(f), nl_fmt_kernel_name(k),
                            (double)x[off + i], f2bits(x[off + i]), got, ref);
                fail();
            }
        }
        assert_int_equal(w == 4   ? ((uint32_t *)codes)[m]
                         : w == 2 ? ((uint16_t *)codes)[m]
                                  : codes[m],
                         w == 4   ? 0xABABABABu
                         : w == 2 ? 0xABAB
                                  : 0xAB);
    }
    free(codes);
}

static void test_kernels_vs_scalar(void **state) {
    (void)state;
    size_t n;
    float *x = make_inputs(&n);
    float *xn = malloc(n * sizeof *xn); /* NaN-free copy for formats without NaN */
    size_t nn = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(x[i])) xn[nn++] = x[i];
    const nl_format fs[] = {NL_FMT_BF16, NL_FMT_FP16, NL_FMT_E4M3, NL_FMT_E5M2, NL_FMT_E3M2, NL_FMT_E2M3,
                            NL_FMT_E2M1, NL_FMT_FP32, NL_FMT_TF32, NL_FMT_E8M0, NL_FMT_INT8, NL_FMT_INT4};
    int ran = 0;
    for (size_t j = 0; j < sizeof fs / sizeof fs[0]; j++) {
        const nl_format_info *fi = nl_fmt_info(fs[j]);
        for (int k = NL_FMT_KERNEL_AUTO; k < NL_FMT_KERNEL_COUNT; k++) {
            if (!nl_fmt_kernel_available(fs[j], (nl_fmt_kernel)k)) {
                print_message("[  INFO    ] %s kernel %s not available here\n", fi->name,
                              nl_fmt_kernel_name((nl_fmt_kernel)k));
                continue;
            }
            if (fs[j] == NL_FMT_E8M0) { /* no zero or negatives: use |x| > 0 */
                float *xp = malloc(nn * sizeof *xp);
                size_t np = 0;
                for (size_t i = 0; i < nn; i++)
                    if (xn[i] != 0) xp[np++] = fabsf(xn[i]);
                check_kernel(fs[j], (nl_fmt_kernel)k, xp, np, 0);
                free(xp);
            } else {
                check_kernel(fs[j], (nl_fmt_kernel)k, fi->has_nan ? x : xn, fi->has_nan ? n : nn, 0);
            }
            ran++;
        }
    }
    assert_true(ran >= 24); /* at least auto + portable for each */
    free(x);
    free(xn);
}

static void test_array_api(void **state) {
    (void)state;
    size_t n;
    float *x = make_inputs(&n);
    /* NaN into a format without NaN: error naming the index */
    uint8_t c8[40];
    float y[40];
    for (int i = 0; i < 40; i++) y[i] = (float)i * 0.25f;
    y[33] = NAN;
    assert_int_equal(nl_fmt_encode_array(NL_FMT_E2M1, y, 40, c8), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "x[33]"));
    /* round_array == nl_fmt_round elementwise, for every format; decode_array == decode */
    float *r = malloc(n * sizeof *r);
    uint32_t *codes = malloc(n * 4);
    float *d = malloc(n * sizeof *d);
    for (int f = 0; f < NL_FMT_COUNT; f++) {
        memcpy(r, x, n * sizeof *r);
        assert_int_equal(nl_fmt_round_array((nl_format)f, r, n), NL_OK);
        for (size_t i = 0; i < n; i++) {
            float want = nl_fmt_round((nl_format)f, x[i]);
            if (isnan(want))
                assert_true(isnan(r[i]));
            else
                assert_true(f2bits(r[i]) == f2bits(want));
        }
        const nl_format_info *fi = nl_fmt_info((nl_format)f);
        if (!fi->has_nan || f == NL_FMT_E8M0) continue;
        assert_int_equal(nl_fmt_encode_array((nl_format)f, x, n, codes), NL_OK);
        assert_int_equal(nl_fmt_decode_array((nl_format)f, codes, n, d), NL_OK);
        size_t w = nl_fmt_code_bytes((nl_format)f);
        for (size_t i = 0; i < n; i++) {
            uint32_t c = w == 4 ? codes[i] : w == 2 ? ((uint16_t *)codes)[i] : ((uint8_t *)codes)[i];
            assert_true(f2bits(d[i]) == f2bits(nl_fmt_decode((nl_format)f, c)));
        }
    }
    /* every fp16 code through the bulk decoder (vcvtph2ps where present) == scalar decode */
    uint16_t *h = malloc(65536 * 2);
    for (uint32_t c = 0; c < 65536; c++) h[c] = (uint16_t)c;
    float *hd = malloc(65536 * sizeof *hd);
    assert_int_equal(nl_fmt_decode_array(NL_FMT_FP16, h, 65536, hd), NL_OK);
    for (uint32_t c = 0; c < 65536; c++) assert_true(f2bits(hd[c]) == f2bits(nl_fmt_decode(NL_FMT_FP16, c)));
    /* inline helpers == the format API */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(nl_bf16_from_f32(x[i]), enc(NL_FMT_BF16, x[i]));
        uint16_t b = (uint16_t)(i * 2654435761u);
        assert_true(f2bits(nl_f32_from_bf16(b)) == f2bits(nl_fmt_decode(NL_FMT_BF16, b)));
    }
    free(h);
    free(hd);
    free(r);
    free(codes);
    free(d);
    free(x);
}

/* The CLI: table, cast, sum, and bad input (exit 2, names the problem). */
static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("formats", &out), 0);
    assert_non_null(strstr(out, "e4m3"));
    assert_non_null(strstr(out, "57344"));
    assert_non_null(strstr(out, "65504"));
    free(out);
    assert_int_equal(tu_run_cli("formats --json", &out), 0);
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    cJSON *arr = cJSON_GetObjectItem(doc, "formats");
    assert_int_equal(cJSON_GetArraySize(arr), NL_FMT_COUNT);
    for (int f = 0; f < NL_FMT_COUNT; f++) {
        cJSON *o = cJSON_GetArrayItem(arr, f);
        assert_string_equal(cJSON_GetObjectItem(o, "name")->valuestring, nl_fmt_name((nl_format)f));
        assert_true(cJSON_GetObjectItem(o, "max_finite")->valuedouble == nl_fmt_info((nl_format)f)->max_finite);
    }
    cJSON_Delete(doc);
    free(out);
    assert_int_equal(tu_run_cli("formats sum --format e4m3 --value 3 --count 100 --json", &out), 0);
    doc = cJSON_Parse(out);
    assert_non_null(doc);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "trajectory")), 100);
    assert_true(cJSON_GetObjectItem(doc, "result")->valuedouble == 64);
    assert_true(cJSON_GetObjectItem(doc, "stuck_from_step")->valuedouble == 18);
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "trajectory"), 17)->valuedouble == 64);
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "trajectory"), 16)->valuedouble == 60);
    cJSON_Delete(doc);
    free(out);
    assert_int_equal(tu_run_cli("formats cast 257 --to bf16", &out), 0);
    assert_non_null(strstr(out, "0x4380"));
    assert_non_null(strstr(out, "0 | 10000111 | 0000000"));
    assert_non_null(strstr(out, "decoded    256\n"));
    assert_non_null(strstr(out, "256 below, 258 above"));
    free(out);
    assert_int_equal(tu_run_cli("formats cast 257 --to fp16 --json", &out), 0);
    assert_non_null(strstr(out, "\"decoded\":\t257"));
    free(out);
    assert_int_equal(tu_run_cli("formats cast -500 --to e4m3", &out), 0);
    assert_non_null(strstr(out, "0xFE"));
    free(out);
    assert_int_equal(tu_run_cli("formats sum --format e4m3 --value 3 --count 100", &out), 0);
    assert_non_null(strstr(out, "result 64 (exact 300; reaches 64 at step 18 and stays there)"));
    free(out);
    assert_int_equal(tu_run_cli("formats sum --format e4m3 --value 3 --count 100 --promote-every 8", &out), 0);
    assert_non_null(strstr(out, "result 300 (exact 300)"));
    free(out);
    assert_int_equal(tu_run_cli("formats cast abc --to bf16", &out), 2);
    assert_non_null(strstr(out, "abc"));
    free(out);
    assert_int_equal(tu_run_cli("formats cast 1 --to fp7", &out), 2);
    assert_non_null(strstr(out, "fp7"));
    assert_non_null(strstr(out, "bf16, fp16, e4m3, e5m2"));
    free(out);
    assert_int_equal(tu_run_cli("formats sum --format bogus --value 3 --count 2", &out), 2);
    assert_non_null(strstr(out, "bogus"));
    free(out);
    assert_int_equal(tu_run_cli("formats --frobnicate", &out), 2);
    assert_non_null(strstr(out, "--frobnicate"));
    free(out);
    assert_int_equal(tu_run_cli("formats cast 1 --to bf16 --rounding up", &out), 2);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_course_examples), cmocka_unit_test(test_known_codes),
        cmocka_unit_test(test_properties),      cmocka_unit_test(test_decode_exact),
        cmocka_unit_test(test_rounding_modes),  cmocka_unit_test(test_stochastic),
        cmocka_unit_test(test_neighbors),       cmocka_unit_test(test_kernels_vs_scalar),
        cmocka_unit_test(test_array_api),       cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
