/* AWQ, SmoothQuant and LLM.int8() on one layer with synthetic activations that have planted
 * outlier channels (a few input features 20-50x larger than the rest, as in real LLMs).
 * Each method is compared with round-to-nearest on held-out tokens where it should win. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/awq.h"
#include "nanolm/base.h"
#include "nanolm/llmint8.h"
#include "nanolm/qgrid.h"
#include "nanolm/smoothquant.h"

enum { TOK = 512, COLS = 256, ROWS = 128 };
static const int planted[4] = {3, 77, 150, 201};

/* x (2*TOK, COLS): first half calibration, second half held out. w (ROWS, COLS). */
static void make_data(float *x, float *w, float outlier_gain, uint64_t seed) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (int i = 0; i < 2 * TOK * COLS; i++) x[i] = (float)nl_rng_normal(&r);
    for (int t = 0; t < 2 * TOK; t++)
        for (int k = 0; k < 4; k++) x[t * COLS + planted[k]] *= outlier_gain;
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)(0.05 * nl_rng_normal(&r));
}

/* sum over tokens of ||x w^T - xq wq^T||^2 (xq may be x), in double. */
static double out_err(const float *x, const float *w, const float *xq, const float *wq, int tokens) {
    double s = 0;
    for (int t = 0; t < tokens; t++)
        for (int r = 0; r < ROWS; r++) {
            double a = 0, b = 0;
            for (int j = 0; j < COLS; j++) {
                a += (double)x[t * COLS + j] * w[r * COLS + j];
                b += (double)xq[t * COLS + j] * wq[r * COLS + j];
            }
            s += (a - b) * (a - b);
        }
    return s;
}

static void test_awq_beats_rtn(void **state) {
    (void)state;
    float *x = malloc(2 * TOK * COLS * sizeof(float)), *w = malloc(ROWS * COLS * sizeof(float));
    float *wh = malloc(ROWS * COLS * sizeof(float)), *wr = malloc(ROWS * COLS * sizeof(float));
    float *xs = malloc(TOK * COLS * sizeof(float)), s[COLS];
    make_data(x, w, 20.f, 11);
    const float *held = x + TOK * COLS;
    const int cfg[3][2] = {{4, 128}, {4, 32}, {3, 32}};
    for (int c = 0; c < 3; c++) {
        nl_awq_opts o = nl_awq_defaults();
        o.bits = cfg[c][0];
        o.group_size = cfg[c][1];
        const float *wl[1] = {w};
        float *whl[1] = {wh};
        int rows[1] = {ROWS};
        double alpha = -1, e_best = 0, e_rtn = 0, errors[20];
        assert_int_equal(nl_awq_search(x, TOK, COLS, 1, wl, rows, &o, s, whl, &alpha, &e_best, &e_rtn, errors), NL_OK);
        /* alpha = 0 is RTN on the same grid: the search's own baseline equals an independent one. */
        assert_int_equal(nl_qgrid_rtn(w, ROWS, COLS, o.bits, o.group_size, 0, NULL, NULL, NULL, wr), NL_OK);
        double rtn_calib = out_err(x, w, x, wr, TOK);
        assert_true(fabs(e_rtn - rtn_calib) < 1e-3 * rtn_calib);
        assert_true(e_best <= e_rtn);
        for (int t = 0; t < TOK; t++)
            for (int j = 0; j < COLS; j++) xs[t * COLS + j] = held[t * COLS + j] / s[j];
        double awq_held = out_err(held, w, xs, wh, TOK), rtn_held = out_err(held, w, held, wr, TOK);
        print_message("  awq int%d g%-3d alpha %.2f: held-out ||y - y^||^2 awq %.2f rtn %.2f (%.2fx); "
                      "salient s %.2f vs median-ish s[0] %.2f\n",
                      o.bits, o.group_size, alpha, awq_held, rtn_held, rtn_held / awq_held, s[planted[0]], s[0]);
        assert_true(alpha > 0.0);
        assert_true(awq_held < rtn_held);
        assert_true(s[planted[0]] > s[0]); /* salient channels are scaled up */
    }
    /* Bad input. */
    nl_awq_opts o = nl_awq_defaults();
    o.bits = 1;
    const float *wl[1] = {w};
    int rows[1] = {ROWS};
    assert_int_equal(nl_awq_search(x, TOK, COLS, 1, wl, rows, &o, s, NULL, NULL, NULL, NULL, NULL), NL_ERR_INVALID);
    o = nl_awq_defaults();
    x[5 * COLS + 9] = NAN;
    assert_int_equal(nl_awq_search(x, TOK, COLS, 1, wl, rows, &o, s, NULL, NULL, NULL, NULL, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "token 5 feature 9"));
    free(x);
    free(w);
    free(wh);
    free(wr);
    free(xs);
}

static void test_smoothquant_beats_w8a8(void **state) {
    (void)state;
    float *x = malloc(2 * TOK * COLS * sizeof(float)), *w = malloc(ROWS * COLS * sizeof(float));
    float *ws = malloc(ROWS * COLS * sizeof(float)), *xs = malloc(TOK * COLS * sizeof(float));
    float *y = malloc(TOK * ROWS * sizeof(float)), *yq = malloc(TOK * ROWS * sizeof(float));
    int8_t *wc = malloc(ROWS * COLS);
    float wsc[ROWS], amax[COLS] = {0}, s[COLS], gain[COLS];
    make_data(x, w, 50.f, 12);
    const float *held = x + TOK * COLS;
    assert_int_equal(nl_smoothquant_observe(x, TOK, COLS, amax), NL_OK);
    const float *wl[1] = {w};
    int rows[1] = {ROWS};
    assert_int_equal(nl_smoothquant_scales(amax, COLS, 1, wl, rows, 0.5, s), NL_OK);
    /* s_j = sqrt(max|x_j| / max|W_j|) at alpha = 0.5: check one channel by hand. */
    float wmax3 = 0;
    for (int r = 0; r < ROWS; r++) wmax3 = fmaxf(wmax3, fabsf(w[r * COLS + 3]));
    assert_true(fabsf(s[3] - sqrtf(amax[3] / wmax3)) < 1e-5f * s[3]);
    memcpy(ws, w, ROWS * COLS * sizeof(float));
    for (int j = 0; j < COLS; j++) gain[j] = 1.f;
    nl_smoothquant_apply(ws, ROWS, COLS, s, gain);
    for (int t = 0; t < TOK; t++)
        for (int j = 0; j < COLS; j++) xs[t * COLS + j] = held[t * COLS + j] * gain[j]; /* x / s via the folded gain */
    /* Exact math is unchanged by smoothing. */
    for (int t = 0; t < TOK; t += 37)
        for (int r = 0; r < ROWS; r += 13) {
            double a = 0, b = 0;
            for (int j = 0; j < COLS; j++) {
                a += (double)held[t * COLS + j] * w[r * COLS + j];
                b += (double)xs[t * COLS + j] * ws[r * COLS + j];
            }
            assert_true(fabs(a - b) < 1e-4 * (1 + fabs(a)));
        }
    /* W8A8 (per-token int8 activations, per-channel int8 weights) with and without smoothing. */
    double e_plain = 0, e_smooth = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float *xin = pass ? xs : held, *win = pass ? ws : w;
        assert_int_equal(nl_llmint8_quantize_weight(win, ROWS, COLS, wc, wsc), NL_OK);
        assert_int_equal(nl_llmint8_forward(xin, TOK, COLS, wc, wsc, ROWS, INFINITY, yq, NULL), NL_OK);
        double e = 0;
        for (int t = 0; t < TOK; t++)
            for (int r = 0; r < ROWS; r++) {
                double a = 0;
                for (int j = 0; j < COLS; j++) a += (double)held[t * COLS + j] * w[r * COLS + j];
                e += (a - yq[t * ROWS + r]) * (a - yq[t * ROWS + r]);
            }
        if (pass)
            e_smooth = e;
        else
            e_plain = e;
    }
    print_message("  smoothquant alpha 0.5 W8A8 held-out ||y - y^||^2: plain %.3f smoothed %.3f (%.1fx)\n", e_plain,
                  e_smooth, e_plain / e_smooth);
    assert_true(e_smooth * 2 < e_plain);
    assert_int_equal(nl_smoothquant_scales(amax, COLS, 1, wl, rows, 1.5, s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "alpha"));
    free(x);
    free(w);
    free(ws);
    free(xs);
    free(y);
    free(yq);
    free(wc);
}

static void test_llmint8_decomposition(void **state) {
    (void)state;
    float *x = malloc(2 * TOK * COLS * sizeof(float)), *w = malloc(ROWS * COLS * sizeof(float));
    float *y8 = malloc(TOK * ROWS * sizeof(float)), *ym = malloc(TOK * ROWS * sizeof(float));
    int8_t *wc = malloc(ROWS * COLS);
    float wsc[ROWS];
    uint8_t mask[COLS];
    make_data(x, w, 20.f, 13);
    int n_out = -1;
    assert_int_equal(nl_llmint8_outlier_dims(x, TOK, COLS, 6.f, mask, &n_out), NL_OK);
    assert_int_equal(n_out, 4);
    for (int k = 0; k < 4; k++) assert_int_equal(mask[planted[k]], 1);
    assert_int_equal(nl_llmint8_quantize_weight(w, ROWS, COLS, wc, wsc), NL_OK);
    int n8 = -1, nm = -1;
    assert_int_equal(nl_llmint8_forward(x, TOK, COLS, wc, wsc, ROWS, INFINITY, y8, &n8), NL_OK);
    assert_int_equal(nl_llmint8_forward(x, TOK, COLS, wc, wsc, ROWS, 6.f, ym, &nm), NL_OK);
    assert_int_equal(n8, 0);
    assert_int_equal(nm, 4);
    double e8 = 0, em = 0;
    for (int t = 0; t < TOK; t++)
        for (int r = 0; r < ROWS; r++) {
            double a = 0;
            for (int j = 0; j < COLS; j++) a += (double)x[t * COLS + j] * w[r * COLS + j];
            e8 += (a - y8[t * ROWS + r]) * (a - y8[t * ROWS + r]);
            em += (a - ym[t * ROWS + r]) * (a - ym[t * ROWS + r]);
        }
    print_message("  llm.int8 threshold 6: %d outlier dims of %d; ||y - y^||^2 int8 %.3f mixed %.3f (%.1fx)\n", nm,
                  COLS, e8, em, e8 / em);
    assert_true(em * 5 < e8);
    /* A hand-checked token: x = (1, -2, 10, 0.5), threshold 6 -> dim 2 in fp32; the rest
     * int8 with scale 2/127: codes (64, -127, 32) (63.5 rounds to even 64). W = identity-ish row
     * (1, 1, 1, 1) -> codes 127 with scale 1/127. */
    float xt[4] = {1.f, -2.f, 10.f, 0.5f}, wt[4] = {1.f, 1.f, 1.f, 1.f}, yt;
    int8_t wct[4];
    float wst[1];
    assert_int_equal(nl_llmint8_quantize_weight(wt, 1, 4, wct, wst), NL_OK);
    assert_int_equal(nl_llmint8_forward(xt, 1, 4, wct, wst, 1, 6.f, &yt, &nm), NL_OK);
    double expect = ((64 - 127 + 32) * 127.0 * (2.0 / 127) + 10.0 * 127) * (1.0 / 127);
    assert_int_equal(nm, 1);
    assert_true(fabs(yt - expect) < 1e-5);
    x[TOK * COLS - 1] = INFINITY;
    assert_int_equal(nl_llmint8_forward(x, TOK, COLS, wc, wsc, ROWS, 6.f, ym, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "not finite"));
    free(x);
    free(w);
    free(y8);
    free(ym);
    free(wc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awq_beats_rtn),
        cmocka_unit_test(test_smoothquant_beats_w8a8),
        cmocka_unit_test(test_llmint8_decomposition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
