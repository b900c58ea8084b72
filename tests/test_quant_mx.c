/* numerics/quant MX formats (OCP Microscaling v1.0) and the ggml-style error gates. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/quant.h"
#include "quant_check.h"

static float mx_value(const nl_qtensor *q, int64_t c) {
    float y[64];
    QOK(nl_quant_dequantize(q, y));
    return y[c];
}

/* Known cases from the issue: MXFP4 scales and saturation. */
static void test_mxfp4_scales(void **state) {
    (void)state;
    struct {
        float amax;
        int e8m0;
        float scale;
    } cases[] = {{1.0f, 125, 0.25f}, {7.0f, 127, 1.0f}, {0.3f, 123, 0.0625f}};
    for (int k = 0; k < 3; k++) {
        float x[32];
        for (int i = 0; i < 32; i++) x[i] = cases[k].amax * (float)(i % 7) / 7.0f * (i % 2 ? -1.0f : 1.0f);
        x[5] = cases[k].amax;
        nl_qtensor q;
        QOK(nl_quant_mx(x, 1, 32, NL_MX_E2M1, NL_MX_TIES_EVEN, &q));
        assert_int_equal(q.n_scales, 1);
        assert_int_equal(q.scale_e8m0[0], cases[k].e8m0);
        assert_true(q.scales[0] == cases[k].scale);
        if (k == 1) assert_true(mx_value(&q, 5) == 6.0f); /* 7.0 saturates to 6.0 (E2M1 max) */
        if (k == 0) assert_true(mx_value(&q, 5) == 1.0f); /* 1.0 / 2^-2 = 4 is exact in E2M1 */
        assert_int_equal(nl_qtensor_bytes(&q), 16 + 1);   /* 32 nibbles + one E8M0 byte */
        nl_qtensor_free(&q);
    }
}

/* MXFP8-E4M3 block [485, 475, 400, -485, -475, -450, 2^-6, -2^-6]: scale 1, elements
 * [448, 448, 384 (ties to even) or 416 (ties away), -448, -448, -448, 2^-6, -2^-6]. */
static void test_mxfp8_e4m3_case(void **state) {
    (void)state;
    const float x[8] = {485, 475, 400, -485, -475, -450, 0.015625f, -0.015625f};
    const float even[8] = {448, 448, 384, -448, -448, -448, 0.015625f, -0.015625f};
    for (int away = 0; away <= 1; away++) {
        nl_qtensor q;
        float y[8];
        QOK(nl_quant_mx(x, 1, 8, NL_MX_E4M3, away ? NL_MX_TIES_AWAY : NL_MX_TIES_EVEN, &q));
        assert_int_equal(q.scale_e8m0[0], 127);
        assert_true(q.scales[0] == 1.0f);
        QOK(nl_quant_dequantize(&q, y));
        for (int i = 0; i < 8; i++) {
            float want = (i == 2 && away) ? 416.0f : even[i];
            if (y[i] != want)
                fail_msg("ties %s: element %d = %g, want %g", away ? "away" : "even", i, (double)y[i], (double)want);
        }
        nl_qtensor_free(&q);
    }
}

/* Every element format: the block's amax lands in the top binade, errors within half an
 * element ulp times the scale, zero blocks give zeros, partial blocks work. */
static void test_all_elements(void **state) {
    (void)state;
    const int64_t R = 3, C = 75; /* 2 full blocks + a partial block of 11 per row */
    float x[3 * 75], y[3 * 75];
    nl_rng r;
    nl_rng_seed(&r, 7);
    for (int i = 0; i < R * C; i++) x[i] = (float)nl_rng_normal(&r) * (i < 75 ? 1e-3f : 3.0f);
    for (int i = 75; i < 75 + 32; i++) x[i] = 0.0f; /* a zero block */
    const nl_mx_elem es[] = {NL_MX_E4M3, NL_MX_E5M2, NL_MX_E3M2, NL_MX_E2M3, NL_MX_E2M1, NL_MX_INT8};
    const double rel[] = {1.0 / 32, 1.0 / 16, 1.0 / 16,
                          1.0 / 32, 1.0 / 8,  1.0 / 256}; /* half ulp at the top binade / 2^(emax+1) */
    for (int k = 0; k < 6; k++) {
        nl_qtensor q;
        QOK(nl_quant_mx(x, R, C, es[k], NL_MX_TIES_EVEN, &q));
        assert_int_equal(q.groups_per_row, 3);
        QOK(nl_quant_dequantize(&q, y));
        for (int64_t row = 0; row < R; row++)
            for (int64_t g = 0; g < 3; g++) {
                int64_t c0 = g * 32, n = g == 2 ? 11 : 32;
                float amax = 0;
                for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[row * C + c0 + i]));
                float X = q.scales[row * 3 + g];
                if (amax == 0) {
                    for (int64_t i = 0; i < n; i++) assert_true(y[row * C + c0 + i] == 0.0f);
                    continue;
                }
                /* X = 2^(floor(log2 amax) - emax) */
                assert_true(X == ldexpf(1.0f, (int)floorf(log2f(amax)) - nl_mx_elem_emax(es[k])));
                for (int64_t i = 0; i < n; i++) {
                    float e = fabsf(x[row * C + c0 + i] - y[row * C + c0 + i]);
                    /* bounded by half the spacing at the top binade, or saturation to max */
                    double bound = rel[k] * ldexp(1.0, nl_mx_elem_emax(es[k]) + 1) * X;
                    if (fabsf(x[row * C + c0 + i]) > nl_mx_elem_max(es[k]) * X)
                        bound = fabsf(x[row * C + c0 + i]) - nl_mx_elem_max(es[k]) * X + 1e-30;
                    if (e > bound * 1.0001)
                        fail_msg("%s row %lld col %lld: |x - y| = %g > %g", nl_mx_elem_name(es[k]), (long long)row,
                                 (long long)(c0 + i), (double)e, bound);
                }
            }
        nl_qtensor_free(&q);
    }
    /* Bad input names the index. */
    x[100] = NAN;
    nl_qtensor q;
    assert_int_equal(nl_quant_mx(x, R, C, NL_MX_E4M3, NL_MX_TIES_EVEN, &q), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 100"));
}

/* ggml-style gates on x[i] = 0.1 + 2 cos(i), y[i] = 0.1 + 2 cos(i + 1), n = 4096:
 * sqrt(sum (x - x^)^2) / n < 0.002 and |dot(x^, y^) - dot(x, y)| / n < 0.02. */
static void gate(const char *scheme) {
    enum { N = 4096 };
    static float x[N], y[N], xq[N], yq[N];
    for (int i = 0; i < N; i++) {
        x[i] = 0.1f + 2.0f * cosf((float)i);
        y[i] = 0.1f + 2.0f * cosf((float)i + 1.0f);
    }
    nl_quant_spec s;
    QOK(nl_quant_spec_parse(scheme, &s));
    nl_qtensor qx, qy;
    QOK(nl_quant_tensor(x, 1, N, &s, &qx));
    QOK(nl_quant_tensor(y, 1, N, &s, &qy));
    QOK(nl_quant_dequantize(&qx, xq));
    QOK(nl_quant_dequantize(&qy, yq));
    double e2 = 0, dq = 0, df = 0;
    for (int i = 0; i < N; i++) {
        e2 += ((double)x[i] - xq[i]) * ((double)x[i] - xq[i]);
        dq += (double)xq[i] * yq[i];
        df += (double)x[i] * y[i];
    }
    double err = sqrt(e2) / N, derr = fabs(dq - df) / N;
    print_message("[  GATE    ] %-10s total error %.6f (< 0.002), dot error %.6f (< 0.02)\n", scheme, err, derr);
    if (!(err < 0.002)) fail_msg("%s: quantization error %g >= 0.002", scheme, err);
    if (!(derr < 0.02)) fail_msg("%s: dot product error %g >= 0.02", scheme, derr);
    nl_qtensor_free(&qx);
    nl_qtensor_free(&qy);
}

static void test_gates(void **state) {
    (void)state;
    gate("int8-b32");
    gate("int4-b32");
    gate("mxfp8-e4m3");
    gate("mxfp8-e5m2");
    gate("mxfp6-e3m2");
    gate("mxfp6-e2m3");
    gate("mxfp4");
    gate("mxint8");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mxfp4_scales),
        cmocka_unit_test(test_mxfp8_e4m3_case),
        cmocka_unit_test(test_all_elements),
        cmocka_unit_test(test_gates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
