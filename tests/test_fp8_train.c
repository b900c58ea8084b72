/* train/fp8_linear and train/precision: FP8 linears inside NanoLM's forward and backward, and
 * the gradient underflow counts. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/fp8_linear.h"
#include "nanolm/precision.h"
#include <cjson/cJSON.h>
#include <stdio.h>

/* A small model on random tokens: vocab 64, dim 64, 2 layers, seq 32, batch 4. */
static void tiny(nl_model *m, int32_t **x, int32_t **y, int64_t B, int64_t T) {
    nl_arch a = tu_arch("tiny", 64, 64, 2, 4, 2, 96, 32);
    tu_model(m, &a, 5);
    assert_int_equal(nl_model_alloc_grads(m), NL_OK);
    assert_int_equal(nl_model_alloc_acts(m, B, T), NL_OK);
    *x = malloc(sizeof(int32_t) * (size_t)(B * T));
    *y = malloc(sizeof(int32_t) * (size_t)(B * T));
    nl_rng r;
    nl_rng_seed(&r, 9);
    for (int64_t i = 0; i < B * T; i++) {
        (*x)[i] = (int32_t)nl_rng_below(&r, 64);
        (*y)[i] = (int32_t)nl_rng_below(&r, 64);
    }
}

static double cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

/* The FP8 model's loss and gradients stay close to fp32; every linear but the classifier ran
 * three FP8 GEMMs (forward, dgrad, wgrad). */
static void test_fp8_linears_track_fp32(void **state) {
    (void)state;
    const int64_t B = 4, T = 32;
    nl_model m;
    int32_t *x, *y;
    tiny(&m, &x, &y, B, T);
    float loss32, loss8;
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss32), NL_OK);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    float *g32 = malloc(sizeof(float) * m.n_params);
    memcpy(g32, m.train->grads, sizeof(float) * m.n_params);
    const char *names[2] = {"e4m3 block fp32-acc", "hybrid e5m2-grad block 14-bit/128"};
    for (int v = 0; v < 2; v++) {
        nl_fp8_recipe r;
        nl_fp8_recipe_default(&r);
        if (v == 1) {
            r.fmt_grad = NL_FMT_E5M2;
            r.acc = (nl_fp8_acc){14, 32, 128, NL_FP8_ACC_TRUNCATE};
        }
        nl_fp8_linear f;
        assert_int_equal(nl_fp8_linear_install(&f, &m, &r), NL_OK);
        nl_model_zero_grad(&m);
        assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss8), NL_OK);
        assert_int_equal(nl_model_backward(&m), NL_OK);
        assert_int_equal(nl_fp8_linear_status(&f), NL_OK);
        const double cs = cosine(g32, m.train->grads, m.n_params);
        print_message("%s: loss fp32 %.5f fp8 %.5f, gradient cosine %.5f, %lld GEMMs, %lld flushed, %lld saturated\n",
                      names[v], loss32, loss8, cs, (long long)f.stats.gemms, (long long)f.stats.flushed,
                      (long long)f.stats.saturated);
        assert_int_equal(f.stats.gemms, m.L * 4 * 3);
        assert_true(fabs(loss8 - loss32) < 0.02 * loss32);
        assert_true(cs > 0.99);
        assert_true(cs < 1.0 - 1e-7); /* it did change something */
        nl_fp8_linear_remove(&f);
        assert_null(m.linear_ops);
    }
    /* removed: back to the exact fp32 path */
    nl_model_zero_grad(&m);
    float again;
    assert_int_equal(nl_model_forward(&m, x, y, B, T, &again), NL_OK);
    assert_true(again == loss32);
    free(g32);
    free(x);
    free(y);
    nl_model_free(&m);
}

/* Delayed scaling keeps one state per linear and role; a NaN weight makes the GEMM fail, the
 * output NaN (so the loss is NaN) and the status names the layer. Bad recipes are refused. */
static void test_fp8_linear_delayed_and_errors(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    nl_model m;
    int32_t *x, *y;
    tiny(&m, &x, &y, B, T);
    nl_fp8_recipe r;
    nl_fp8_recipe_default(&r);
    r.scaling = NL_FP8_SCALE_DELAYED;
    nl_fp8_linear f;
    assert_int_equal(nl_fp8_linear_install(&f, &m, &r), NL_OK);
    float loss;
    for (int step = 0; step < 3; step++) {
        nl_model_zero_grad(&m);
        assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss), NL_OK);
        assert_int_equal(nl_model_backward(&m), NL_OK);
    }
    assert_true(isfinite(loss));
    assert_int_equal(f.delayed[0].steps, 3); /* layer 0 qkv, forward activations */
    assert_true(f.delayed[0].scale != 1.0f);
    m.w.layers[1].wo[3] = NAN;
    assert_int_equal(nl_model_forward(&m, x, y, B, T, &loss), NL_OK);
    assert_true(isnan(loss));
    assert_int_equal(nl_fp8_linear_status(&f), NL_ERR_NUMERIC);
    assert_non_null(strstr(f.error, "layer 1"));
    assert_non_null(strstr(f.error, "B["));
    nl_fp8_linear_remove(&f);

    nl_fp8_recipe_default(&r);
    char id[96], desc[140];
    assert_string_equal(nl_fp8_recipe_id(&r, id, sizeof id), "e4m3/e4m3/block/acc0/promote128");
    assert_string_equal(nl_fp8_recipe_desc(&r, desc, sizeof desc), "e4m3/e4m3, block scaling, fp32 accumulation");
    r.fmt_grad = NL_FMT_E5M2, r.acc.bits = 14, r.scaling = NL_FP8_SCALE_TENSOR;
    assert_string_equal(nl_fp8_recipe_id(&r, id, sizeof id), "e4m3/e5m2/tensor/acc14/promote128");
    assert_string_equal(nl_fp8_recipe_desc(&r, desc, sizeof desc),
                        "e4m3/e5m2, tensor scaling, 14-bit accumulator, promote 128");
    r.fmt_grad = NL_FMT_FP16;
    assert_int_equal(nl_fp8_linear_install(&f, &m, &r), NL_ERR_INVALID);
    nl_fp8_recipe_default(&r);
    r.acc = (nl_fp8_acc){14, 32, 0, NL_FP8_ACC_TRUNCATE}; /* block scales without promotion */
    assert_int_equal(nl_fp8_linear_install(&f, &m, &r), NL_ERR_INVALID);
    assert_null(m.linear_ops);
    free(x);
    free(y);
    nl_model_free(&m);
}

/* fp16: smallest subnormal 2^-24 (values up to half of it flush), smallest normal 2^-14,
 * largest 65504 (65520 and up round to inf). bf16 has fp32's range. */
static void test_underflow_counts_by_hand(void **state) {
    (void)state;
    const float g[6] = {0.0f, 1e-8f, 3e-5f, 1.0f, 1e5f, -2.9e-8f};
    nl_underflow_counts c;
    memset(&c, 0, sizeof c);
    assert_int_equal(nl_underflow_count(NL_FMT_FP16, 1.0f, g, 6, &c), NL_OK);
    assert_int_equal(c.values, 6);
    assert_int_equal(c.nonzero, 5);
    assert_int_equal(c.flushed, 2);   /* 1e-8 and -2.9e-8 (< 2^-25 = 2.98e-8) */
    assert_int_equal(c.subnormal, 1); /* 3e-5 < 2^-14 = 6.1e-5 */
    assert_int_equal(c.overflow, 1);  /* 1e5 */
    memset(&c, 0, sizeof c);
    assert_int_equal(nl_underflow_count(NL_FMT_FP16, 1024.0f, g, 6, &c), NL_OK);
    assert_int_equal(c.flushed, 0); /* 1e-8 * 1024 = 1.02e-5: subnormal, kept */
    assert_int_equal(c.subnormal, 2);
    assert_int_equal(c.overflow, 1);
    memset(&c, 0, sizeof c);
    assert_int_equal(nl_underflow_count(NL_FMT_BF16, 1.0f, g, 6, &c), NL_OK);
    assert_int_equal(c.flushed + c.subnormal + c.overflow, 0);
    assert_int_equal(nl_underflow_count(NL_FMT_FP16, 0.0f, g, 6, &c), NL_ERR_INVALID);
    assert_int_equal(nl_underflow_count(NL_FMT_INT8, 1.0f, g, 6, &c), NL_ERR_INVALID);
    /* largest power of two keeping max |g| = 1e5 below 65504: none >= 1 -> 0.5 */
    assert_true(nl_underflow_max_scale(g, 6, 65504.0, 0x1p24) == 0.5);
    const float h[2] = {1e-3f, -2.0f};
    assert_true(nl_underflow_max_scale(h, 2, 65504.0, 0x1p24) == 16384.0); /* 2 * 2^15 = 65536 overflows */
    assert_true(nl_underflow_max_scale(h, 0, 65504.0, 0x1p24) == 0.0);
}

/* The gradient sample: sizes, and the parameter gradients equal a plain backward's. */
static void test_grad_sample(void **state) {
    (void)state;
    const int64_t B = 2, T = 16;
    nl_model m;
    int32_t *x, *y;
    tiny(&m, &x, &y, B, T);
    int32_t toks[200];
    for (int i = 0; i < 200; i++) toks[i] = (i * 7 + 3) % 64;
    float *act, *wgt;
    size_t na, nw;
    assert_int_equal(nl_grad_sample(&m, toks, 200, B, T, 3, &act, &na, &wgt, &nw), NL_OK);
    /* per batch: every layer's qkv, o, gate/up, down outputs plus the classifier's logits */
    const size_t per = (size_t)(B * T) * (size_t)(m.L * (m.QKV + m.C + 2 * m.H + m.C) + m.V);
    assert_int_equal(na, 3 * per);
    assert_int_equal(nw, 3 * m.n_params);
    /* batch 2 by hand */
    for (int64_t i = 0; i < B; i++)
        for (int64_t t = 0; t < T; t++) {
            x[i * T + t] = toks[(2 * B + i) * (T + 1) + t];
            y[i * T + t] = toks[(2 * B + i) * (T + 1) + t + 1];
        }
    nl_model_zero_grad(&m);
    assert_int_equal(nl_model_forward(&m, x, y, B, T, NULL), NL_OK);
    assert_int_equal(nl_model_backward(&m), NL_OK);
    assert_memory_equal(wgt + 2 * m.n_params, m.train->grads, sizeof(float) * m.n_params);
    assert_int_equal(nl_grad_sample(&m, toks, 50, B, T, 3, &act, &na, &wgt, &nw) == NL_OK, 0);
    nl_free(act);
    nl_free(wgt);
    free(x);
    free(y);
    nl_model_free(&m);
}

/* The commands: nanolm train --precision fp8 and nanolm precision underflow, and their errors. */
static void test_cli(void **state) {
    (void)state;
    TU_REQUIRE_DATA(text, "tinyshakespeare/input.txt");
    char *dir = tu_tmpdir(), args[1024], ckpt[300], *out = NULL;
    snprintf(ckpt, sizeof ckpt, "%s/m.safetensors", dir);
    snprintf(args, sizeof args,
             "train --data %s --steps 3 --batch 2 --precision fp8 --fp8-recipe hybrid --eval-windows 2 --out %s --json",
             text, ckpt);
    int rc = tu_run_cli(args, &out);
    if (rc) print_message("%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    cJSON *f8 = cJSON_GetObjectItem(d, "fp8");
    assert_non_null(f8);
    assert_string_equal(cJSON_GetObjectItem(f8, "gradients")->valuestring, "e5m2");
    assert_true(cJSON_GetObjectItem(f8, "gemms")->valuedouble >= 3 * 4 * 4 * 3);
    assert_true(isfinite(cJSON_GetObjectItem(d, "val_loss")->valuedouble));
    cJSON_Delete(d);
    free(out);

    snprintf(args, sizeof args, "precision underflow --ckpt %s --data %s --batch 2 --batches 1 --json", ckpt, text);
    rc = tu_run_cli(args, &out);
    if (rc) print_message("%s\n", out);
    assert_int_equal(rc, 0);
    d = cJSON_Parse(out);
    assert_non_null(d);
    cJSON *rows = cJSON_GetObjectItem(d, "rows");
    assert_int_equal(cJSON_GetArraySize(rows), 8);
    for (int k = 0; k < 2; k++) {
        const double none = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 4 * k + 0), "flushed_frac")->valuedouble;
        const double s16 = cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 4 * k + 1), "flushed_frac")->valuedouble;
        assert_true(s16 <= none); /* scaling up can only keep more values */
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(rows, 4 * k + 3), "format")->valuestring, "bf16");
    }
    cJSON_Delete(d);
    free(out);

    char bad[8][600];
    snprintf(bad[0], 600, "train --data %s --precision fp9", text);
    snprintf(bad[1], 600, "train --data %s --precision fp8 --fp8-scaling rowwise", text);
    snprintf(bad[2], 600, "train --data %s --precision fp8 --fp8-acc-bits 14 --fp8-promote 0", text);
    snprintf(bad[3], 600, "train --data %s --precision bf16 --no-loss-scaling", text);
    snprintf(bad[4], 600, "precision underflow --data %s", text);
    snprintf(bad[5], 600, "precision overflow");
    snprintf(bad[6], 600, "train --data %s --precision fp8 --fp8-recipe e3m4", text);
    snprintf(bad[7], 600, "precision underflow --ckpt %s --data %s --seq 100000", ckpt, text);
    for (int i = 0; i < 8; i++) {
        rc = tu_run_cli(bad[i], &out);
        if (rc != 2) print_message("'%s' -> %d: %s\n", bad[i], rc, out);
        assert_int_equal(rc, 2);
        free(out);
    }
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_linears_track_fp32),
        cmocka_unit_test(test_fp8_linear_delayed_and_errors),
        cmocka_unit_test(test_underflow_counts_by_hand),
        cmocka_unit_test(test_grad_sample),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
