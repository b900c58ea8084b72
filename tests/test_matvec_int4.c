/* int4 decode weights (nanolm/matvec.h, NL_WFMT_INT4): the quantizer against the rule written
 * out here (fp16 absmax / 7 per group of 32 columns, rint, clamp), the kernels against a double
 * precision product of the dequantized weights and the int8-dequantized activations on odd sizes,
 * every path (portable, AVX2, AVX-512 VNNI, NEON) bit for bit, batch invariance over M = 1..9, threads and row
 * splits, and bad input (NaN/inf, a scale beyond fp16) refused with the index named. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/matvec.h"
#include "nanolm/qlinear.h"

static void fill(float *x, size_t n, uint64_t seed) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)nl_rng_normal(&r);
}

/* The fp16 value nearest (ties to even) to v. */
static double fp16_round(float v) {
    uint32_t c;
    assert_int_equal(nl_fmt_encode(NL_FMT_FP16, v, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 0, &c), NL_OK);
    return nl_fmt_decode(NL_FMT_FP16, c);
}

/* Every dequantized weight equals code x scale of the rule: per row and 32 columns, scale =
 * fp16(absmax / 7), code = clamp(rint(w / scale), -8, 7); an all-zero group and a group whose
 * scale underflows fp16 dequantize to zeros; bytes = N*G*16 + N*G*2. */
static void test_quantizer_rule(void **state) {
    (void)state;
    const int64_t N = 5, K = 70, G = 3;
    float w[5 * 70], dq[5 * 70];
    fill(w, (size_t)(N * K), 21);
    for (int64_t k = 32; k < 64; k++) w[1 * K + k] = 0.0f;  /* row 1, group 1: zeros */
    for (int64_t k = 0; k < 32; k++) w[2 * K + k] = 1e-12f; /* row 2, group 0: scale underflows */
    w[3 * K + 65] = 40.0f;                                  /* row 3, last (partial) group */
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_OK);
    assert_int_equal(wt.groups, G);
    assert_int_equal(nl_mv_weight_bytes(&wt), (size_t)(N * G * 16 + N * G * 2));
    assert_int_equal(nl_mv_int4_dequantize(&wt, dq), NL_OK);
    int clamped = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const int64_t k0 = 32 * g, k1 = k0 + 32 < K ? k0 + 32 : K;
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; k++) amax = fmaxf(amax, fabsf(w[n * K + k]));
            const double d = fp16_round(amax / 7.0f);
            for (int64_t k = k0; k < k1; k++) {
                double q = d > 0 ? rint((double)(w[n * K + k] / (float)d)) : 0.0;
                clamped += q > 7 || q < -8;
                q = q > 7 ? 7 : q < -8 ? -8 : q;
                assert_true(dq[n * K + k] == (float)(q * d));
            }
        }
    print_message("codes beyond [-8, 7] before the clamp: %d\n", clamped);
    for (int64_t k = 32; k < 64; k++) assert_true(dq[1 * K + k] == 0.0f);
    for (int64_t k = 0; k < 32; k++) assert_true(dq[2 * K + k] == 0.0f);
    assert_true(dq[3 * K + 65] == (float)(7 * fp16_round(40.0f / 7.0f))); /* a group's absmax takes code 7 */
    nl_mv_weight_free(&wt);
    /* K a multiple of 32: the N*K/2 + N*(K/32)*2 */
    float w2[3 * 64];
    fill(w2, 3 * 64, 22);
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w2, 3, 64, 0), NL_OK);
    assert_int_equal(nl_mv_weight_bytes(&wt), (size_t)(3 * 64 / 2 + 3 * (64 / 32) * 2));
    nl_mv_weight_free(&wt);
}

/* y_ref (M, N) in double: dequantized weights . int8-dequantized activations (per token absmax,
 * the quantizer the kernels use); sabs (M, N): the sum of |terms|, the scale of rounding error. */
static void reference(const nl_mv_weight *wt, const float *x, int64_t M, double *yref, double *sabs) {
    const int64_t N = wt->rows, K = wt->cols;
    float *dq = malloc((size_t)(N * K) * 4), *xs = malloc((size_t)M * 4);
    int8_t *q = malloc((size_t)(M * K));
    assert_int_equal(nl_mv_int4_dequantize(wt, dq), NL_OK);
    assert_int_equal(nl_qlinear_quantize_tokens(x, M, K, K, q, NULL, xs), NL_OK);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                double t = (double)dq[n * K + k] * ((double)q[m * K + k] * (double)xs[m]);
                s += t;
                a += fabs(t);
            }
            yref[m * N + n] = s;
            sabs[m * N + n] = a;
        }
    free(dq);
    free(xs);
    free(q);
}

/* K: not a multiple of 32 or 64, exactly 512 + 1 group, 33 groups; N: not a multiple of 4. */
static const int64_t SIZES[][3] = {{1, 1, 1},     {1, 5, 7},     {3, 17, 33}, {5, 64, 64},  {9, 33, 130},
                                   {1, 100, 768}, {13, 7, 1001}, {2, 6, 544}, {4, 3, 1056}, {6, 10, 2048}};

static void test_against_reference(void **state) {
    (void)state;
    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
        const int64_t M = SIZES[si][0], N = SIZES[si][1], K = SIZES[si][2];
        float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
        float *y = malloc((size_t)(M * N) * 4), *yp = malloc((size_t)(M * N) * 4);
        double *ref = malloc((size_t)(M * N) * 8), *sabs = malloc((size_t)(M * N) * 8);
        fill(w, (size_t)(N * K), 31 + si);
        fill(x, (size_t)(M * K), 310 + si);
        nl_mv_weight wt;
        assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_OK);
        reference(&wt, x, M, ref, sabs);
        for (int p = NL_MV_PORTABLE; p < NL_MV_COUNT; p++) {
            if (!nl_mv_available((nl_mv_path)p)) continue;
            assert_int_equal(nl_mv_weight_set_path(&wt, (nl_mv_path)p), NL_OK);
            memset(y, 0xFF, (size_t)(M * N) * 4); /* NaN: every output must be written */
            assert_int_equal(nl_mv_forward(&wt, x, M, y, 2), NL_OK);
            double worst = 0;
            for (int64_t i = 0; i < M * N; i++) {
                double e = fabs((double)y[i] - ref[i]) / (sabs[i] + 1e-30);
                worst = e > worst || e != e ? e : worst;
            }
            if (worst > 1e-6)
                print_message("M=%lld N=%lld K=%lld %s: error / sum|terms| %g\n", (long long)M, (long long)N,
                              (long long)K, nl_mv_path_name((nl_mv_path)p), worst);
            assert_true(worst <= 1e-6);
            if (p == NL_MV_PORTABLE)
                memcpy(yp, y, (size_t)(M * N) * 4);
            else
                assert_memory_equal(y, yp, (size_t)(M * N) * 4); /* the same float operations */
        }
        nl_mv_weight_free(&wt);
        free(w);
        free(x);
        free(y);
        free(yp);
        free(ref);
        free(sabs);
    }
}

/* How far int4 is from the exact fp32 product (normal weights and activations): the format's
 * own error, not the kernel's; the RMS error relative to the RMS output. */
static void test_error_against_fp32(void **state) {
    (void)state;
    const int64_t M = 4, N = 64, K = 768;
    float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
    float *y = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
    fill(w, (size_t)(N * K), 41);
    fill(x, (size_t)(M * K), 42);
    nl_mv_reference(ref, x, w, M, N, K, 0);
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_OK);
    assert_int_equal(nl_mv_forward(&wt, x, M, y, 1), NL_OK);
    double se = 0, ss = 0;
    for (int64_t i = 0; i < M * N; i++) {
        se += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
        ss += (double)ref[i] * ref[i];
    }
    double rel = sqrt(se / ss);
    /* uniform rounding on a grid of absmax/7 with Gaussian weights (absmax of 32 ~ 2.1 sigma):
     * code error RMS ~ 0.3 / sqrt(12) x ... ~ 0.09 of the weight RMS; int8 activations add ~0.01 */
    print_message("int4 vs fp32: relative RMS error %.4f\n", rel);
    assert_true(rel > 0.03 && rel < 0.15);
    nl_mv_weight_free(&wt);
    free(w);
    free(x);
    free(y);
    free(ref);
}

/* Each token's outputs are the same bits alone and in batches of M = 1..9 (every token position
 * inside the batch), with 1 and 2 threads, and over any split of the rows (nl_mv_forward_range),
 * on every path. */
static void test_batch_invariance(void **state) {
    (void)state;
    const int64_t MX = 9, N = 37, K = 1000;
    float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(MX * K) * 4);
    float *y1 = malloc((size_t)(MX * N) * 4), *yb = malloc((size_t)(MX * N) * 4), *yr = malloc((size_t)(MX * N) * 4);
    fill(w, (size_t)(N * K), 51);
    fill(x, (size_t)(MX * K), 52);
    for (int p = NL_MV_PORTABLE; p < NL_MV_COUNT; p++) {
        if (!nl_mv_available((nl_mv_path)p)) continue;
        nl_mv_weight wt;
        assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_OK);
        assert_int_equal(nl_mv_weight_set_path(&wt, (nl_mv_path)p), NL_OK);
        for (int64_t m = 0; m < MX; m++) assert_int_equal(nl_mv_forward(&wt, x + m * K, 1, y1 + m * N, 1), NL_OK);
        nl_mv_act act;
        memset(&act, 0, sizeof act);
        for (int64_t M = 1; M <= MX; M++)
            for (int th = 1; th <= 2; th++) {
                const int64_t m0 = MX - M; /* the last M tokens */
                memset(yb, 0xFF, (size_t)(M * N) * 4);
                assert_int_equal(nl_mv_forward_act(&wt, &act, x + m0 * K, M, yb, th), NL_OK);
                assert_memory_equal(yb, y1 + m0 * N, (size_t)(M * N) * 4);
                /* rows split at odd places, each range on this thread */
                assert_int_equal(nl_mv_act_prepare(&act, &wt, x + m0 * K, M), NL_OK);
                memset(yr, 0xFF, (size_t)(M * N) * 4);
                const int64_t cuts[] = {0, 1, 5, 16, 17, 30, N};
                for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof cuts[0]); c++)
                    nl_mv_forward_range(&wt, &act, yr, cuts[c], cuts[c + 1]);
                assert_memory_equal(yr, y1 + m0 * N, (size_t)(M * N) * 4);
            }
        nl_mv_act_free(&act);
        nl_mv_weight_free(&wt);
    }
    free(w);
    free(x);
    free(y1);
    free(yb);
    free(yr);
}

static void test_bad_input(void **state) {
    (void)state;
    const int64_t N = 3, K = 40;
    float w[3 * 40], x[2 * 40], y[2 * 3];
    fill(w, (size_t)(N * K), 61);
    fill(x, (size_t)(2 * K), 62);
    nl_mv_weight wt;
    w[77] = NAN;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_ERR_INVALID);
    print_message("%s\n", nl_last_error());
    assert_non_null(strstr(nl_last_error(), "int4"));
    assert_non_null(strstr(nl_last_error(), "index 77"));
    nl_mv_weight_free(&wt);
    w[77] = -INFINITY;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 77"));
    nl_mv_weight_free(&wt);
    w[77] = 1e7f; /* row 1, columns 32..39: 1e7 / 7 is beyond fp16's 65504 */
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_ERR_RANGE);
    print_message("%s\n", nl_last_error());
    assert_non_null(strstr(nl_last_error(), "row 1, columns 32..39"));
    nl_mv_weight_free(&wt);
    w[77] = 1.0f;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT4, w, N, K, 0), NL_OK);
    x[45] = NAN;
    assert_int_equal(nl_mv_forward(&wt, x, 2, y, 1), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 45"));
    assert_int_equal(nl_mv_forward(&wt, x, 0, y, 1), NL_ERR_INVALID);
    nl_mv_weight_free(&wt);
    nl_mv_weight f32;
    assert_int_equal(nl_mv_weight_init(&f32, NL_WFMT_FP32, w, N, K, 0), NL_OK);
    assert_int_equal(nl_mv_int4_dequantize(&f32, w), NL_ERR_INVALID);
    nl_mv_weight_free(&f32);
    nl_wfmt f;
    assert_int_equal(nl_wfmt_parse("int4", &f), NL_OK);
    assert_int_equal(f, NL_WFMT_INT4);
    assert_string_equal(nl_wfmt_name(NL_WFMT_INT4), "int4");
    assert_int_equal(nl_wfmt_parse("int3", &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "int3"));
    assert_non_null(strstr(nl_last_error(), "int4"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantizer_rule),     cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_error_against_fp32), cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
