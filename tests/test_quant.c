/* numerics/quant: absmax, affine, blockwise, int4 packing, dequantize, bad input. */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/quant.h"
#include "quant_check.h"

/* The course's walk-through (week 14): numbers from the text, not from the program. */
static void test_course_example(void **state) {
    (void)state;
    const float x[4] = {0.3f, -0.5f, 0.12f, 1.5f};
    nl_qtensor q;
    QOK(nl_quant_symmetric(x, 1, 4, 8, 0, &q));
    assert_true(fabs(q.scales[0] - 0.0118) < 0.00005);
    const int want[4] = {25, -42, 10, 127};
    const float back[4] = {0.295f, -0.496f, 0.118f, 1.5f};
    float y[4];
    QOK(nl_quant_dequantize(&q, y));
    for (int i = 0; i < 4; i++) {
        assert_int_equal(nl_qtensor_code(&q, 0, i), want[i]);
        assert_true(fabsf(y[i] - back[i]) < 0.0006f);
    }
    nl_qtensor_free(&q);

    /* Outlier 30: the step grows to ~0.236, 0.3 and 0.12 merge. */
    const float xo[4] = {0.3f, -0.5f, 0.12f, 30.0f};
    QOK(nl_quant_symmetric(xo, 1, 4, 8, 0, &q));
    assert_true(fabs(q.scales[0] - 0.236) < 0.0005);
    const int wanto[4] = {1, -2, 1, 127};
    for (int i = 0; i < 4; i++) assert_int_equal(nl_qtensor_code(&q, 0, i), wanto[i]);
    /* Values up to 0.5 in magnitude get the 5 levels -2..2 of 255. */
    int levels = 0;
    for (int c = -127; c <= 127; c++) levels += fabsf((float)c * q.scales[0]) <= 0.5f;
    assert_int_equal(levels, 5);
    nl_qtensor_free(&q);

    /* Blocks of 2: the first pair gets its own step. */
    QOK(nl_quant_blockwise(xo, 1, 4, 8, 2, &q));
    assert_int_equal(q.n_scales, 2);
    assert_int_equal(nl_qtensor_code(&q, 0, 0), 76);
    assert_int_equal(nl_qtensor_code(&q, 0, 1), -127);
    assert_int_equal(nl_qtensor_code(&q, 0, 3), 127);
    nl_qtensor_free(&q);
}

static void fill_normal(float *x, size_t n, uint64_t seed) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)nl_rng_normal(&r);
}

/* Every code within range, every reconstruction within half a step, per tensor/channel/block
 * and for every bit width. */
static void test_error_bounds(void **state) {
    (void)state;
    const int64_t R = 7, C = 37; /* odd sizes: partial blocks and odd nibble rows */
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C);
    fill_normal(x, R * C, 1);
    for (int64_t c = 0; c < C; c++) x[3 * C + c] *= 50.0f; /* an outlier row */
    for (int bits = 2; bits <= 8; bits++) {
        const int qmax = (1 << (bits - 1)) - 1;
        for (int mode = 0; mode < 4; mode++) {
            nl_qtensor q;
            if (mode < 2)
                QOK(nl_quant_symmetric(x, R, C, bits, mode, &q));
            else
                QOK(nl_quant_blockwise(x, R, C, bits, mode == 2 ? 8 : 5, &q));
            QOK(nl_quant_dequantize(&q, y));
            for (int64_t r = 0; r < R; r++) {
                for (int64_t c = 0; c < C; c++) {
                    int32_t code = nl_qtensor_code(&q, r, c);
                    float s = q.scales[nl_qtensor_group(&q, r, c)];
                    assert_true(code >= -qmax && code <= qmax);
                    assert_true(fabsf(x[r * C + c] - y[r * C + c]) <= 0.5f * s * 1.0001f);
                }
            }
            /* The group's absmax maps to +-qmax exactly. */
            if (mode == 1)
                for (int64_t r = 0; r < R; r++) {
                    int hit = 0;
                    for (int64_t c = 0; c < C; c++) hit |= abs(nl_qtensor_code(&q, r, c)) == qmax;
                    assert_true(hit);
                }
            nl_qtensor_free(&q);
        }
    }
    free(x);
    free(y);
}

static void test_ties_to_even(void **state) {
    (void)state;
    /* absmax 127 -> scale 1 exactly: k + 0.5 rounds to the even neighbour. */
    const float x[8] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.0f};
    const int want[8] = {0, 2, 2, 0, -2, -2, 126, 127};
    nl_qtensor q;
    QOK(nl_quant_symmetric(x, 1, 8, 8, 0, &q));
    assert_true(q.scales[0] == 1.0f);
    for (int i = 0; i < 8; i++) assert_int_equal(nl_qtensor_code(&q, 0, i), want[i]);
    nl_qtensor_free(&q);
}

static void test_zero_groups(void **state) {
    (void)state;
    float x[3 * 8] = {0};
    x[2 * 8 + 5] = 1.0f; /* rows 0 and 1 all zero; row 2 has one value in its second block */
    float y[24];
    for (int mode = 0; mode < 3; mode++) {
        nl_qtensor q;
        if (mode == 2)
            QOK(nl_quant_blockwise(x, 3, 8, 4, 4, &q));
        else
            QOK(nl_quant_symmetric(x, 3, 8, 8, mode, &q));
        for (int64_t g = 0; g < q.n_scales; g++) assert_true(isfinite(q.scales[g]) && q.scales[g] > 0);
        QOK(nl_quant_dequantize(&q, y));
        for (int i = 0; i < 24; i++) assert_true(y[i] == x[i]);
        nl_qtensor_free(&q);
    }
    /* An all-zero tensor with affine codes: 0 is exact. */
    nl_qtensor q;
    float z[5] = {0};
    QOK(nl_quant_affine(z, 1, 5, 8, 1, 0, &q));
    assert_true(isfinite(q.scales[0]));
    QOK(nl_quant_dequantize(&q, y));
    for (int i = 0; i < 5; i++) assert_true(y[i] == 0.0f);
    nl_qtensor_free(&q);
}

static void test_affine(void **state) {
    (void)state;
    /* All-positive data: the range is widened to include 0, so 0 maps to a code exactly. */
    const float x[6] = {0.5f, 1.0f, 2.0f, 3.0f, 0.75f, 0.0f};
    nl_qtensor q;
    float y[6];
    QOK(nl_quant_affine(x, 1, 6, 8, 1, 0, &q));
    assert_true(fabsf(q.scales[0] - 3.0f / 255.0f) < 1e-7f);
    assert_int_equal(q.zero_points[0], 0);
    assert_int_equal(nl_qtensor_code(&q, 0, 3), 255);
    QOK(nl_quant_dequantize(&q, y));
    assert_true(y[5] == 0.0f);
    nl_qtensor_free(&q);
    /* Asymmetric range [-1, 3] in signed 8-bit: scale 4/255, zero point -128 - round(-1/s). */
    const float x2[4] = {-1.0f, 3.0f, 0.0f, 1.0f};
    QOK(nl_quant_affine(x2, 1, 4, 8, 0, 0, &q));
    float s = 4.0f / 255.0f;
    assert_true(fabsf(q.scales[0] - s) < 1e-7f);
    assert_int_equal(q.zero_points[0], -128 + 64); /* round(-1 / (4/255)) = round(-63.75) = -64 */
    assert_int_equal(nl_qtensor_code(&q, 0, 0), -128);
    assert_int_equal(nl_qtensor_code(&q, 0, 1), 127);
    QOK(nl_quant_dequantize(&q, y));
    assert_true(y[2] == 0.0f);
    for (int i = 0; i < 4; i++) assert_true(fabsf(y[i] - x2[i]) <= 0.5f * s * 1.001f);
    nl_qtensor_free(&q);
    /* Per channel and 4-bit unsigned: codes in 0..15, error within half a step. */
    float x3[2 * 9];
    fill_normal(x3, 18, 5);
    float y3[18];
    QOK(nl_quant_affine(x3, 2, 9, 4, 1, 1, &q));
    assert_int_equal(q.n_scales, 2);
    QOK(nl_quant_dequantize(&q, y3));
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 9; c++) {
            int32_t code = nl_qtensor_code(&q, r, c);
            assert_true(code >= 0 && code <= 15);
            assert_true(fabsf(y3[r * 9 + c] - x3[r * 9 + c]) <= 0.5f * q.scales[r] * 1.001f);
        }
    assert_int_equal(nl_qtensor_bytes(&q), 2 * 5 + 2 * 4 + 2 * 4);
    nl_qtensor_free(&q);
}

static void test_int4_packing(void **state) {
    (void)state;
    int8_t v[7] = {-8, 7, -1, 0, 3, -5, 6}, w[7];
    uint8_t p[4];
    nl_quant_pack_int4(v, 7, p);
    assert_int_equal(p[0], 0x78); /* -8 low nibble (0x8), 7 high (0x7) */
    assert_int_equal(p[1], 0x0F);
    nl_quant_unpack_int4(p, 7, w);
    assert_memory_equal(v, w, 7);
    /* int4 tensors use half a byte per code plus the scales. */
    float x[4 * 64];
    fill_normal(x, 256, 9);
    nl_qtensor q;
    QOK(nl_quant_blockwise(x, 4, 64, 4, 32, &q));
    assert_int_equal(q.row_bytes, 32);
    assert_int_equal(nl_qtensor_bytes(&q), 4 * 32 + 8 * 4);
    /* The packed codes of a row equal nl_quant_pack_int4 of the unpacked codes. */
    int8_t codes[64];
    uint8_t packed[32];
    for (int c = 0; c < 64; c++) codes[c] = (int8_t)nl_qtensor_code(&q, 1, c);
    nl_quant_pack_int4(codes, 64, packed);
    assert_memory_equal(packed, q.codes + q.row_bytes, 32);
    nl_qtensor_free(&q);
    QOK(nl_quant_symmetric(x, 4, 64, 8, 1, &q));
    assert_int_equal(nl_qtensor_bytes(&q), 4 * 64 + 4 * 4);
    nl_qtensor_free(&q);
}

static void test_bad_input(void **state) {
    (void)state;
    float x[10];
    for (int i = 0; i < 10; i++) x[i] = (float)i;
    nl_qtensor q;
    x[6] = NAN;
    assert_int_equal(nl_quant_symmetric(x, 2, 5, 8, 1, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 6"));
    x[6] = 1.0f;
    x[3] = -INFINITY;
    x[8] = INFINITY;
    assert_int_equal(nl_quant_blockwise(x, 1, 10, 4, 4, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 3"));
    assert_int_equal(nl_quant_affine(x, 1, 10, 8, 1, 0, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 3"));
    x[3] = x[8] = 0.0f;
    assert_int_equal(nl_quant_symmetric(x, 1, 10, 9, 0, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bits must be 2..8, got 9"));
    assert_int_equal(nl_quant_symmetric(x, 1, 10, 1, 0, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "got 1"));
    assert_int_equal(nl_quant_blockwise(x, 1, 10, 8, 0, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "block size must be > 0"));
    nl_quant_spec s;
    assert_int_equal(nl_quant_spec_parse("int9-channel", &s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bits must be 2..8"));
    assert_int_equal(nl_quant_spec_parse("fp3-magic", &s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "unknown quantization scheme 'fp3-magic'"));
    assert_int_equal(nl_quant_spec_parse("int8-b0", &s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "block size must be > 0"));
    int32_t codes[2];
    assert_int_equal(nl_quant_affine_codes(x, 2, 0.0f, 0, 0, 255, codes), NL_ERR_INVALID);
}

static void test_scheme_names(void **state) {
    (void)state;
    const char *names[] = {"int8-channel",
                           "int8-tensor",
                           "int8-b32",
                           "int4-b128",
                           "int2-b7",
                           "affine-uint8-tensor",
                           "affine-int4-channel",
                           "mxfp8-e4m3",
                           "mxfp8-e5m2",
                           "mxfp6-e3m2",
                           "mxfp6-e2m3",
                           "mxfp4",
                           "mxint8",
                           "mxfp4-away"};
    char buf[64];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        nl_quant_spec s;
        QOK(nl_quant_spec_parse(names[i], &s));
        assert_string_equal(nl_quant_spec_name(&s, buf, sizeof buf), names[i]);
    }
    nl_quant_spec s;
    QOK(nl_quant_spec_parse("mxfp8", &s));
    assert_int_equal(s.mx_elem, NL_MX_E4M3);
    QOK(nl_quant_spec_parse("int4-b32", &s));
    assert_int_equal(s.bits, 4);
    assert_int_equal(s.block, 32);
    /* nl_quant_tensor dispatches to the same quantizer. */
    float x[64];
    fill_normal(x, 64, 3);
    nl_qtensor a, b;
    QOK(nl_quant_tensor(x, 2, 32, &s, &a));
    QOK(nl_quant_blockwise(x, 2, 32, 4, 32, &b));
    assert_memory_equal(a.codes, b.codes, 32);
    nl_qtensor_free(&a);
    nl_qtensor_free(&b);
}

/* Re-quantizing into an allocated tensor gives the same codes and scales as a fresh call. */
static void test_absmax_into(void **state) {
    (void)state;
    float x[6 * 40], x2[6 * 40];
    fill_normal(x, 240, 21);
    fill_normal(x2, 240, 22);
    for (int mode = 0; mode < 3; mode++) {
        nl_qtensor q, fresh;
        if (mode == 2)
            QOK(nl_quant_blockwise(x, 6, 40, 4, 16, &q));
        else
            QOK(nl_quant_symmetric(x, 6, 40, 8, mode, &q));
        QOK(nl_quant_absmax_into(x2, &q));
        if (mode == 2)
            QOK(nl_quant_blockwise(x2, 6, 40, 4, 16, &fresh));
        else
            QOK(nl_quant_symmetric(x2, 6, 40, 8, mode, &fresh));
        assert_memory_equal(q.codes, fresh.codes, (size_t)(q.rows * q.row_bytes));
        assert_memory_equal(q.scales, fresh.scales, sizeof(float) * (size_t)q.n_scales);
        x2[77] = NAN;
        assert_int_equal(nl_quant_absmax_into(x2, &q), NL_ERR_INVALID);
        assert_non_null(strstr(nl_last_error(), "index 77"));
        x2[77] = 0.0f;
        nl_qtensor_free(&q);
        nl_qtensor_free(&fresh);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_course_example), cmocka_unit_test(test_error_bounds), cmocka_unit_test(test_ties_to_even),
        cmocka_unit_test(test_zero_groups),    cmocka_unit_test(test_affine),       cmocka_unit_test(test_int4_packing),
        cmocka_unit_test(test_bad_input),      cmocka_unit_test(test_scheme_names), cmocka_unit_test(test_absmax_into),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
