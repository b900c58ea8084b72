/* Decode kernels (nanolm/matvec.h) against the scalar reference: every format and path, odd
 * sizes (K not a multiple of 8 or 16, N not a multiple of 4 or 16, M tails), and batch
 * invariance (a token's outputs are the same bits whatever M and the thread count). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/matvec.h"

static void fill(float *x, size_t n, uint64_t seed) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)nl_rng_normal(&r);
}

/* Max |y - ref| relative to the RMS of ref. */
static double rel_err(const float *y, const float *ref, size_t n) {
    double ss = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        ss += (double)ref[i] * ref[i];
        double d = fabs((double)y[i] - ref[i]);
        if (d > mx || d != d) mx = d != d ? INFINITY : d;
    }
    return mx / sqrt(ss / (double)n + 1e-30);
}

/* N below, at and past a 48-row panel, K odd (bf16 panels pair the columns) and even */
static const int64_t SIZES[][3] = {{1, 1, 1},    {1, 5, 7},   {3, 17, 33},   {5, 64, 64},
                                   {9, 33, 130}, {6, 70, 96}, {1, 100, 768}, {13, 7, 1001}};

static void test_fp32_bf16_paths(void **state) {
    (void)state;
    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
        int64_t M = SIZES[si][0], N = SIZES[si][1], K = SIZES[si][2];
        float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
        float *y = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
        fill(w, (size_t)(N * K), 1 + si);
        fill(x, (size_t)(M * K), 100 + si);
        for (int bf = 0; bf <= 1; bf++) {
            nl_mv_weight wt;
            assert_int_equal(nl_mv_weight_init(&wt, bf ? NL_WFMT_BF16 : NL_WFMT_FP32, w, N, K, 1), NL_OK);
            nl_mv_reference(ref, x, w, M, N, K, bf);
            /* each path, then AVX-512 again: the weight moves out of its panels and back */
            static const nl_mv_path order[] = {NL_MV_AVX512, NL_MV_PORTABLE, NL_MV_AVX2, NL_MV_NEON, NL_MV_AVX512};
            for (size_t oi = 0; oi < sizeof order / sizeof order[0]; oi++) {
                const nl_mv_path p = order[oi];
                if (!nl_mv_available((nl_mv_path)p)) {
                    print_message("[  SKIP    ] path %s not on this CPU\n", nl_mv_path_name((nl_mv_path)p));
                    continue;
                }
                assert_int_equal(nl_mv_weight_set_path(&wt, (nl_mv_path)p), NL_OK);
                memset(y, 0xFF, (size_t)(M * N) * 4); /* NaN: every output must be written */
                assert_int_equal(nl_mv_forward(&wt, x, M, y, 2), NL_OK);
                double err = rel_err(y, ref, (size_t)(M * N));
                if (err > 1e-5)
                    print_message("M=%lld N=%lld K=%lld %s %s: rel err %g\n", (long long)M, (long long)N, (long long)K,
                                  bf ? "bf16" : "fp32", nl_mv_path_name((nl_mv_path)p), err);
                assert_true(err < 1e-5);
            }
            nl_mv_weight_free(&wt);
        }
        free(w);
        free(x);
        free(y);
        free(ref);
    }
}

/* nl_mv_forward with th threads writes every output (y starts as NaN) with the bits of ref. */
static void forward_is(const nl_mv_weight *wt, const float *x, int64_t M, int64_t N, float *y, const float *ref,
                       int th) {
    memset(y, 0xFF, (size_t)(M * N) * 4);
    assert_int_equal(nl_mv_forward(wt, x, M, y, th), NL_OK);
    assert_memory_equal(y, ref, (size_t)(M * N) * 4);
}

/* fp32 and bf16 on every path: each output is one fused multiply-add chain over k = 0 .. K - 1
 * from +0 (fmaf in order, over the bf16-rounded weights for bf16), the same bits for every path,
 * M, tile and row split. The SIMD paths read panels of 48 rows; portable C reads rows. Sizes with
 * N not a multiple of the panel (48), K odd (bf16's last pair half empty), M past one register
 * tile (AVX2: 2 tokens against a whole panel, 6 against a slice of 16 rows; AVX-512: 8), and M
 * <= 4 over two whole panels (read two at a time) followed by a partial one; and row ranges cut
 * inside a panel and inside a slice (nl_mv_forward_range). */
static void test_panels_are_an_fma_chain(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{1, 47, 5},   {9, 49, 33},  {17, 100, 130}, {3, 96, 768},
                                        {1, 200, 64}, {4, 200, 64}, {2, 150, 1},    {7, 97, 31}};
    for (int bf = 0; bf <= 1; bf++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
            float *y = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
            fill(w, (size_t)(N * K), 21 + si);
            fill(x, (size_t)(M * K), 31 + si);
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    float s = 0.0f;
                    for (int64_t k = 0; k < K; k++) {
                        const float wv = bf ? nl_f32_from_bf16(nl_bf16_from_f32(w[n * K + k])) : w[n * K + k];
                        s = fmaf(wv, x[m * K + k], s);
                    }
                    ref[m * N + n] = s;
                }
            for (int p = NL_MV_PORTABLE; p < NL_MV_COUNT; p++) {
                if (!nl_mv_available((nl_mv_path)p)) continue;
                nl_mv_weight wt;
                assert_int_equal(nl_mv_weight_init(&wt, bf ? NL_WFMT_BF16 : NL_WFMT_FP32, w, N, K, 0), NL_OK);
                assert_int_equal(nl_mv_weight_set_path(&wt, (nl_mv_path)p), NL_OK);
                if (p != NL_MV_PORTABLE)
                    assert_true(bf ? wt.bf16_panels != NULL && wt.bf16 == NULL : wt.f32_panels != NULL);
                for (int th = 1; th <= 2; th++) forward_is(&wt, x, M, N, y, ref, th);
                /* row ranges cut anywhere: every output once, the same bits */
                nl_mv_act act;
                memset(&act, 0, sizeof act);
                assert_int_equal(nl_mv_act_prepare(&act, &wt, x, M), NL_OK);
                memset(y, 0xFF, (size_t)(M * N) * 4);
                static const int64_t cuts[] = {0, 5, 11, 37, 61, 100, 143};
                for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0] && cuts[c] < N; c++)
                    nl_mv_forward_range(&wt, &act, y, cuts[c], cuts[c + 1] < N ? cuts[c + 1] : N);
                if (N > 143) nl_mv_forward_range(&wt, &act, y, 143, N);
                assert_memory_equal(y, ref, (size_t)(M * N) * 4);
                nl_mv_act_free(&act);
                /* the portable path frees the panels (bf16 moves back into rows), a SIMD path
                 * rebuilds them */
                assert_int_equal(nl_mv_weight_set_path(&wt, NL_MV_PORTABLE), NL_OK);
                assert_null(wt.f32_panels);
                assert_null(wt.bf16_panels);
                assert_true(bf ? wt.bf16 != NULL : 1);
                forward_is(&wt, x, M, N, y, ref, 2);
                assert_int_equal(nl_mv_weight_set_path(&wt, (nl_mv_path)p), NL_OK);
                forward_is(&wt, x, M, N, y, ref, 2);
                nl_mv_weight_free(&wt);
            }
            free(w);
            free(x);
            free(y);
            free(ref);
        }
}

/* A weight detached from its fp32 source reads nothing of it again: the source is freed at once
 * (under AddressSanitizer any later read of it fails the test), and on every path the outputs
 * have the bits of a weight made the usual way from a copy of the source (fp32 with panels
 * rebuilds its rows from them when it goes to the portable path). fp32 without panels (the
 * portable path) keeps reading the source and says so. */
static void test_detach_frees_the_source(void **state) {
    (void)state;
    const int64_t M = 5, N = 100, K = 67;
    float *x = malloc((size_t)(M * K) * 4), *y = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
    float *w0 = malloc((size_t)(N * K) * 4);
    fill(x, (size_t)(M * K), 41);
    static const nl_mv_path order[] = {NL_MV_AVX512, NL_MV_PORTABLE, NL_MV_AVX2, NL_MV_NEON, NL_MV_AVX512};
    for (int f = NL_WFMT_FP32; f < NL_WFMT_COUNT; f++) {
        fill(w0, (size_t)(N * K), 42 + f);
        float *w = malloc((size_t)(N * K) * 4);
        memcpy(w, w0, (size_t)(N * K) * 4);
        nl_mv_weight wt, fresh;
        assert_int_equal(nl_mv_weight_init(&wt, (nl_wfmt)f, w, N, K, 0), NL_OK);
        assert_int_equal(nl_mv_weight_init(&fresh, (nl_wfmt)f, w0, N, K, 0), NL_OK);
        const int has_own = f != NL_WFMT_FP32 || wt.f32_panels != NULL;
        assert_int_equal(nl_mv_weight_detach(&wt), has_own);
        if (has_own) {
            memset(w, 0x7F, (size_t)(N * K) * 4); /* what a stale read would see, then gone */
            free(w);
            w = NULL;
        }
        for (size_t oi = 0; oi < sizeof order / sizeof order[0]; oi++) {
            if (!nl_mv_available(order[oi])) continue;
            assert_int_equal(nl_mv_weight_set_path(&wt, order[oi]), NL_OK);
            assert_int_equal(nl_mv_weight_set_path(&fresh, order[oi]), NL_OK);
            assert_int_equal(nl_mv_forward(&fresh, x, M, ref, 2), NL_OK);
            forward_is(&wt, x, M, N, y, ref, 2);
        }
        nl_mv_weight_free(&wt);
        nl_mv_weight_free(&fresh);
        free(w);
    }
    free(w0);
    free(x);
    free(y);
    free(ref);
}

/* int8 on AVX-512 VNNI reads its codes from panels (and keeps no rows): the bits of
 * nl_qlinear_forward on a layer quantized alike, for M past one register tile (8), M <= 4 over two
 * whole panels and a partial one, K not a multiple of 4 or 64; another path moves the codes back
 * into rows, with the same bits. */
static void test_int8_panels(void **state) {
    (void)state;
    if (!nl_mv_available(NL_MV_AVX512) || !nl_qdot_available(NL_QDOT_VNNI)) {
        print_message("[  SKIP    ] no AVX-512 VNNI on this CPU\n");
        return;
    }
    static const int64_t shapes[][3] = {{1, 47, 5},    {9, 49, 33},   {3, 200, 64},
                                        {4, 200, 130}, {1, 150, 768}, {13, 100, 70}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
        float *y = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
        fill(w, (size_t)(N * K), 41 + si);
        fill(x, (size_t)(M * K), 51 + si);
        nl_qlinear ql;
        assert_int_equal(nl_qlinear_init(&ql, w, N, K, NL_QLINEAR_W8A8), NL_OK);
        for (int64_t m = 0; m < M; m++) assert_int_equal(nl_qlinear_forward(&ql, x + m * K, 1, ref + m * N), NL_OK);
        nl_mv_weight wt;
        assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT8, w, N, K, 0), NL_OK);
        assert_non_null(wt.q8_panels);
        assert_null(wt.q8.w);
        for (int th = 1; th <= 2; th++) forward_is(&wt, x, M, N, y, ref, th);
        assert_int_equal(nl_mv_weight_set_path(&wt, NL_MV_AVX2), NL_OK);
        assert_null(wt.q8_panels);
        assert_memory_equal(wt.q8.w, ql.w, (size_t)(N * ql.k_pad));
        forward_is(&wt, x, M, N, y, ref, 2);
        assert_int_equal(nl_mv_weight_set_path(&wt, NL_MV_AVX512), NL_OK);
        assert_non_null(wt.q8_panels);
        forward_is(&wt, x, M, N, y, ref, 2);
        nl_mv_weight_free(&wt);
        nl_qlinear_free(&ql);
        free(w);
        free(x);
        free(y);
        free(ref);
    }
}

static void test_int8_against_reference(void **state) {
    (void)state;
    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++) {
        int64_t M = SIZES[si][0], N = SIZES[si][1], K = SIZES[si][2];
        float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
        float *y = malloc((size_t)(M * N) * 4), *ref = malloc((size_t)(M * N) * 4);
        fill(w, (size_t)(N * K), 7 + si);
        fill(x, (size_t)(M * K), 70 + si);
        nl_mv_weight wt;
        assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT8, w, N, K, 0), NL_OK);
        assert_int_equal(nl_mv_weight_bytes(&wt), (size_t)(N * K + 4 * N));
        nl_mv_reference(ref, x, w, M, N, K, 0);
        assert_int_equal(nl_mv_forward(&wt, x, M, y, 2), NL_OK);
        /* W8A8 with absmax scales: error ~ sqrt(K) * step^2; relative to the output RMS < 3% */
        double err = rel_err(y, ref, (size_t)(M * N));
        print_message("int8 M=%lld N=%lld K=%lld: max err / rms %.4f\n", (long long)M, (long long)N, (long long)K, err);
        assert_true(K < 8 || err < 0.05);
        nl_mv_weight_free(&wt);
        free(w);
        free(x);
        free(y);
        free(ref);
    }
}

/* The int8 kernels give the bits of nl_qlinear_forward (the same codes, scales and formula),
 * and nl_mv_forward_range over any split of the rows gives the bits of nl_mv_forward. */
static void int8_ranges(int64_t K);
static void test_int8_matches_qlinear_and_ranges(void **state) {
    (void)state;
    for (int64_t K = 191; K <= 200; K += 9) /* cuts inside a 48-row panel; K odd and even */
        int8_ranges(K);
}

static void int8_ranges(int64_t K) {
    const int64_t M = 6, N = 70;
    float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
    float *y = malloc((size_t)(M * N) * 4), *yq = malloc((size_t)(M * N) * 4), *yr = malloc((size_t)(M * N) * 4);
    fill(w, (size_t)(N * K), 11);
    fill(x, (size_t)(M * K), 12);
    for (int f = NL_WFMT_FP32; f < NL_WFMT_COUNT; f++) {
        nl_mv_weight wt;
        assert_int_equal(nl_mv_weight_init(&wt, (nl_wfmt)f, w, N, K, 0), NL_OK);
        assert_int_equal(nl_mv_forward(&wt, x, M, y, 2), NL_OK);
        if (f == NL_WFMT_INT8) {
            /* nl_qlinear_forward one token at a time (its own tiles) on a layer quantized alike:
             * on VNNI the matvec weight reads its codes from panels and keeps no rows */
            nl_qlinear ql;
            assert_int_equal(nl_qlinear_init(&ql, w, N, K, NL_QLINEAR_W8A8), NL_OK);
            assert_memory_equal(ql.w_scale, wt.q8.w_scale, (size_t)N * 4);
            for (int64_t m = 0; m < M; m++) assert_int_equal(nl_qlinear_forward(&ql, x + m * K, 1, yq + m * N), NL_OK);
            assert_memory_equal(y, yq, (size_t)(M * N) * 4);
            nl_qlinear_free(&ql);
        }
        nl_mv_act act;
        memset(&act, 0, sizeof act);
        assert_int_equal(nl_mv_act_prepare(&act, &wt, x, M), NL_OK);
        memset(yr, 0xFF, (size_t)(M * N) * 4);
        const int64_t cuts[] = {0, 3, 17, 18, 48, 64, N};
        for (int c = 0; c + 1 < (int)(sizeof cuts / sizeof cuts[0]); c++)
            nl_mv_forward_range(&wt, &act, yr, cuts[c], cuts[c + 1]);
        assert_memory_equal(y, yr, (size_t)(M * N) * 4);
        nl_mv_act_free(&act);
        nl_mv_weight_free(&wt);
    }
    x[5] = NAN;
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT8, w, N, K, 0), NL_OK);
    nl_mv_act act;
    memset(&act, 0, sizeof act);
    assert_int_equal(nl_mv_act_prepare(&act, &wt, x, M), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "index 5"));
    nl_mv_act_free(&act);
    nl_mv_weight_free(&wt);
    free(w);
    free(x);
    free(y);
    free(yq);
    free(yr);
}

/* int8 at the ends of the code range (codes from a file may hold -128; activation codes reach
 * +-127): the sums stay exact on every path (AVX2's vpmaddubsw pairs reach 2 x 128 x 127 and must
 * not saturate), y = (float)sum x (token scale x row scale) with the sum taken here in int64. */
static void test_int8_extreme_codes(void **state) {
    (void)state;
    const int64_t M = 3, N = 6, K = 200;
    int8_t *codes = malloc((size_t)(N * K));
    float *x = malloc((size_t)(M * K) * 4), *y = malloc((size_t)(M * N) * 4), scales[6];
    for (int64_t n = 0; n < N; n++) {
        scales[n] = 0.01f * (float)(n + 1);
        for (int64_t k = 0; k < K; k++)
            codes[n * K + k] = (int8_t)(n == 0   ? -128
                                        : n == 1 ? 127
                                        : n == 2 ? (k & 1 ? -128 : 127)
                                                 : (k * 37 + n) % 256 - 128);
    }
    for (int64_t m = 0; m < M; m++) /* |x| = 1 everywhere: every code is +-127 */
        for (int64_t k = 0; k < K; k++) x[m * K + k] = m == 0 ? -1.0f : m == 1 ? 1.0f : (k % 3 ? 1.0f : -1.0f);
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init_int8(&wt, codes, scales, N, K), NL_OK);
    assert_int_equal(nl_mv_forward(&wt, x, M, y, 1), NL_OK);
    const float xs = 1.0f / 127.0f;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t sum = 0;
            for (int64_t k = 0; k < K; k++) sum += (int64_t)codes[n * K + k] * (x[m * K + k] > 0 ? 127 : -127);
            assert_true(y[m * N + n] == (float)(int32_t)sum * (xs * scales[n]));
        }
    nl_mv_weight_free(&wt);
    free(codes);
    free(x);
    free(y);
}

/* Each token's outputs are bit-identical whether it runs alone or among 37 others, with 1 or
 * 2 threads, for every format and path. */
static void batch_invariance(int64_t K);
static void test_batch_invariance(void **state) {
    (void)state;
    batch_invariance(300);
    batch_invariance(321); /* K odd: bf16 panels end in a half-empty pair */
}

static void batch_invariance(int64_t K) {
    const int64_t M = 37, N = 131; /* N >= 128: int8 splits one token's rows over 2 threads */
    float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
    float *yb = malloc((size_t)(M * N) * 4), *y1 = malloc((size_t)N * 4);
    fill(w, (size_t)(N * K), 3);
    fill(x, (size_t)(M * K), 4);
    for (int f = NL_WFMT_FP32; f < NL_WFMT_COUNT; f++)
        for (int p = NL_MV_PORTABLE; p < NL_MV_COUNT; p++) {
            if (!nl_mv_available((nl_mv_path)p)) continue;
            nl_mv_weight wt;
            assert_int_equal(nl_mv_weight_init(&wt, (nl_wfmt)f, w, N, K, 0), NL_OK);
            assert_int_equal(nl_mv_weight_set_path(&wt, (nl_mv_path)p), NL_OK);
            assert_int_equal(nl_mv_forward(&wt, x, M, yb, 2), NL_OK);
            for (int64_t m = 0; m < M; m++) {
                assert_int_equal(nl_mv_forward(&wt, x + m * K, 1, y1, (int)(1 + m % 2)), NL_OK);
                assert_memory_equal(y1, yb + m * N, (size_t)N * 4);
            }
            /* sub-batches starting at token 3: every register tile width (2 and 3 rows of tokens
             * take the M < 4 path, 8 two 4-token tiles, 13 tiles of 5 and 4, 5 one tile) */
            static const int64_t sub[] = {2, 3, 5, 8, 13};
            float ys[13 * 131];
            for (size_t j = 0; j < sizeof sub / sizeof sub[0]; j++) {
                assert_int_equal(nl_mv_forward(&wt, x + 3 * K, sub[j], ys, 1), NL_OK);
                assert_memory_equal(ys, yb + 3 * N, (size_t)(sub[j] * N) * 4);
            }
            nl_mv_weight_free(&wt);
        }
    free(w);
    free(x);
    free(yb);
    free(y1);
}

/* More tokens than one cache tile (64) and a prefill-sized M: the same bits as one token at a
 * time, for every format on the fastest path. */
static void test_batch_invariance_large_m(void **state) {
    (void)state;
    const int64_t M = 70, N = 36, K = 160;
    float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
    float *yb = malloc((size_t)(M * N) * 4), *y1 = malloc((size_t)N * 4);
    fill(w, (size_t)(N * K), 5);
    fill(x, (size_t)(M * K), 6);
    for (int f = NL_WFMT_FP32; f < NL_WFMT_COUNT; f++) {
        nl_mv_weight wt;
        assert_int_equal(nl_mv_weight_init(&wt, (nl_wfmt)f, w, N, K, 0), NL_OK);
        assert_int_equal(nl_mv_forward(&wt, x, M, yb, 2), NL_OK);
        for (int64_t m = 0; m < M; m++) {
            assert_int_equal(nl_mv_forward(&wt, x + m * K, 1, y1, 1), NL_OK);
            assert_memory_equal(y1, yb + m * N, (size_t)N * 4);
        }
        nl_mv_weight_free(&wt);
    }
    free(w);
    free(x);
    free(yb);
    free(y1);
}

static void test_bad_input(void **state) {
    (void)state;
    float w[6] = {1, 2, 3, NAN, 5, 6}, x[3] = {1, 1, 1}, y[2];
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_BF16, w, 2, 3, 0), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bf16"));
    nl_mv_weight_free(&wt);
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_INT8, w, 2, 3, 0), NL_ERR_INVALID);
    nl_mv_weight_free(&wt);
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_FP32, w, 0, 3, 0), NL_ERR_INVALID);
    assert_int_equal(nl_mv_weight_init(&wt, NL_WFMT_FP32, w, 2, 3, 0), NL_OK);
    assert_int_equal(nl_mv_forward(&wt, x, 0, y, 1), NL_ERR_INVALID);
    nl_mv_weight_free(&wt);
    nl_wfmt f;
    assert_int_equal(nl_wfmt_parse("bf16", &f), NL_OK);
    assert_int_equal(f, NL_WFMT_BF16);
    assert_int_equal(nl_wfmt_parse("fp8", &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "fp8"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_bf16_paths),          cmocka_unit_test(test_panels_are_an_fma_chain),
        cmocka_unit_test(test_detach_frees_the_source),  cmocka_unit_test(test_int8_panels),
        cmocka_unit_test(test_int8_against_reference),   cmocka_unit_test(test_int8_matches_qlinear_and_ranges),
        cmocka_unit_test(test_int8_extreme_codes),       cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_batch_invariance_large_m), cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
