/* numerics/qlinear: the int8 GEMM paths agree exactly with a plain reference, and the
 * QuantizedLinear forward (W8A8, weight-only) is close to fp32 and identical across paths. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/qlinear.h"
#include "nanolm/quant.h"
#include "quant_check.h"

static const nl_qdot_path PATHS[] = {NL_QDOT_PORTABLE, NL_QDOT_AVX2, NL_QDOT_VNNI};

static void ref_gemm(const int8_t *a, const int8_t *b, int64_t M, int64_t N, int64_t K, int32_t *c) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t s = 0;
            for (int64_t k = 0; k < K; k++) s += (int64_t)a[m * K + k] * b[n * K + k];
            c[m * N + n] = (int32_t)s;
        }
}

/* Every available path gives exactly the reference int32 sums, for odd shapes (tails of K,
 * partial tiles of M and N) and the full int8 range including -128. */
static void test_paths_exact(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{1, 1, 1}, {1, 7, 77}, {3, 5, 64}, {5, 13, 200}, {9, 6, 1000}, {70, 9, 129}};
    nl_rng r;
    nl_rng_seed(&r, 11);
    int tested = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int8_t *a = malloc((size_t)(M * K)), *b = malloc((size_t)(N * K));
        int32_t *want = malloc(sizeof(int32_t) * (size_t)(M * N)), *got = malloc(sizeof(int32_t) * (size_t)(M * N));
        for (int64_t i = 0; i < M * K; i++) a[i] = (int8_t)(nl_rng_below(&r, 256) - 128);
        for (int64_t i = 0; i < N * K; i++) b[i] = (int8_t)(nl_rng_below(&r, 256) - 128);
        ref_gemm(a, b, M, N, K, want);
        for (int p = 0; p < 3; p++) {
            if (!nl_qdot_available(PATHS[p])) {
                print_message("[  SKIP    ] int8 path %s not available on this CPU\n", nl_qdot_path_name(PATHS[p]));
                continue;
            }
            memset(got, 0x55, sizeof(int32_t) * (size_t)(M * N));
            QOK(nl_qgemm_s8(PATHS[p], a, K, b, K, M, N, K, got, N));
            for (int64_t i = 0; i < M * N; i++)
                if (got[i] != want[i])
                    fail_msg("path %s, M=%lld N=%lld K=%lld: c[%lld] = %d, want %d", nl_qdot_path_name(PATHS[p]),
                             (long long)M, (long long)N, (long long)K, (long long)i, got[i], want[i]);
            tested++;
        }
        free(a);
        free(b);
        free(want);
        free(got);
    }
    assert_true(tested >= 6);
    /* The extremes at the largest K: (-128)(-128) * 65536 = 2^30 and 127 * (-128) * 65536. */
    const int64_t K = NL_QDOT_MAX_K;
    int8_t *a = malloc(K * 2), *b = malloc(K);
    for (int64_t k = 0; k < K; k++) {
        a[k] = -128;
        a[K + k] = 127;
        b[k] = -128;
    }
    for (int p = 0; p < 3; p++) {
        if (!nl_qdot_available(PATHS[p])) continue;
        int32_t c[2];
        QOK(nl_qgemm_s8(PATHS[p], a, K, b, K, 2, 1, K, c, 1));
        assert_int_equal(c[0], 1 << 30);
        assert_int_equal(c[1], -127 * 128 * 65536);
    }
    int32_t c[1];
    assert_int_equal(nl_qgemm_s8(NL_QDOT_PORTABLE, a, K + 1, b, K + 1, 1, 1, K + 1, c, 1), NL_ERR_INVALID);
    assert_int_equal(nl_qgemm_s8(NL_QDOT_COUNT, a, K, b, K, 1, 1, K, c, 1), NL_ERR_INVALID);
    free(a);
    free(b);
}

static void fill_normal(float *x, size_t n, uint64_t seed, float sd) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = sd * (float)nl_rng_normal(&r);
}

static void test_forward(void **state) {
    (void)state;
    const int64_t M = 6, N = 37, K = 150;
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
    float *yf = malloc(sizeof(float) * M * N), *yq = malloc(sizeof(float) * M * N), *y0 = malloc(sizeof(float) * M * N);
    fill_normal(w, (size_t)(N * K), 1, 0.05f);
    fill_normal(x, (size_t)(M * K), 2, 1.0f);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[m * K + k] * w[n * K + k];
            yf[m * N + n] = (float)s;
        }
    double ref_rms = 0;
    for (int64_t i = 0; i < M * N; i++) ref_rms += (double)yf[i] * yf[i];
    ref_rms = sqrt(ref_rms / (double)(M * N));
    nl_qlinear l;
    /* W8A8: close to fp32, and bit-identical on every path. */
    QOK(nl_qlinear_init(&l, w, N, K, NL_QLINEAR_W8A8));
    assert_int_equal(nl_qlinear_bytes(&l), N * K + N * 4);
    int first = 1;
    for (int p = 0; p < 3; p++) {
        if (!nl_qdot_available(PATHS[p])) continue;
        QOK(nl_qlinear_set_path(&l, PATHS[p]));
        QOK(nl_qlinear_forward(&l, x, M, yq));
        double e = 0;
        for (int64_t i = 0; i < M * N; i++) e += ((double)yq[i] - yf[i]) * ((double)yq[i] - yf[i]);
        e = sqrt(e / (double)(M * N));
        assert_true(e < 0.02 * ref_rms);
        if (first)
            memcpy(y0, yq, sizeof(float) * M * N);
        else
            assert_memory_equal(y0, yq, sizeof(float) * M * N);
        first = 0;
    }
    /* The W8A8 result is exactly sum(qx * qw) * (sx * sw) with our own quantizers. */
    nl_qtensor qw, qx;
    QOK(nl_quant_symmetric(w, N, K, 8, 1, &qw));
    QOK(nl_quant_symmetric(x, M, K, 8, 1, &qx));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int32_t s = 0;
            for (int64_t k = 0; k < K; k++) s += nl_qtensor_code(&qx, m, k) * nl_qtensor_code(&qw, n, k);
            float want = (float)s * (qx.scales[m] * qw.scales[n]);
            assert_true(y0[m * N + n] == want);
        }
    nl_qtensor_free(&qx);
    /* Weight-only: equals fp32 activations times the dequantized weights. */
    nl_qlinear_free(&l);
    QOK(nl_qlinear_init(&l, w, N, K, NL_QLINEAR_WEIGHT_ONLY));
    QOK(nl_qlinear_forward(&l, x, M, yq));
    float *wd = malloc(sizeof(float) * N * K);
    QOK(nl_quant_dequantize(&qw, wd));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[m * K + k] * wd[n * K + k];
            assert_true(fabs(yq[m * N + n] - s) < 1e-4 * (1 + fabs(s)));
        }
    nl_qtensor_free(&qw);
    nl_qlinear_free(&l);
    /* Bad input: NaN in x names the index; all-zero token rows give zeros. */
    x[2 * K + 3] = NAN;
    QOK(nl_qlinear_init(&l, w, N, K, NL_QLINEAR_W8A8));
    assert_int_equal(nl_qlinear_forward(&l, x, M, yq), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 303"));
    memset(x, 0, sizeof(float) * M * K);
    QOK(nl_qlinear_forward(&l, x, M, yq));
    for (int64_t i = 0; i < M * N; i++) assert_true(yq[i] == 0.0f);
    nl_qlinear_free(&l);
    w[5] = INFINITY;
    assert_int_equal(nl_qlinear_init(&l, w, N, K, NL_QLINEAR_W8A8), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 5"));
    free(w);
    free(x);
    free(yf);
    free(yq);
    free(y0);
    free(wd);
}

/* ggml-style gate for the W8A8 dot: x[i] = 0.1 + 2 cos(i) as a 1 x 4096 weight, y[i] = 0.1 +
 * 2 cos(i + 1) as the activation: |dot_q - dot_f| / n < 0.02. */
static void test_dot_gate(void **state) {
    (void)state;
    enum { N = 4096 };
    static float x[N], y[N];
    double df = 0;
    for (int i = 0; i < N; i++) {
        x[i] = 0.1f + 2.0f * cosf((float)i);
        y[i] = 0.1f + 2.0f * cosf((float)i + 1.0f);
        df += (double)x[i] * y[i];
    }
    nl_qlinear l;
    QOK(nl_qlinear_init(&l, x, 1, N, NL_QLINEAR_W8A8));
    float dq;
    QOK(nl_qlinear_forward(&l, y, 1, &dq));
    double err = fabs(dq - df) / N;
    print_message("[  GATE    ] W8A8 dot error %.6f (< 0.02)\n", err);
    assert_true(err < 0.02);
    nl_qlinear_free(&l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_exact),
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_dot_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
