/* nanolm quant demo / outliers: the course's numbers through the CLI, and its errors. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *run_json(const char *args) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("nanolm %s exited %d: %s", args, rc, out ? out : "");
    cJSON *d = cJSON_Parse(out);
    if (!d) fail_msg("nanolm %s: not JSON: %s", args, out);
    free(out);
    return d;
}

static cJSON *step(cJSON *d, int i) { return cJSON_GetArrayItem(cJSON_GetObjectItem(d, "steps"), i); }
static double num(cJSON *o, const char *k, int i) {
    return cJSON_GetArrayItem(cJSON_GetObjectItem(o, k), i)->valuedouble;
}

static void test_demo_numbers(void **state) {
    (void)state;
    cJSON *d = run_json("quant demo --json");
    /* (0.3, -0.5, 0.12, 1.5): scale 1.5/127 ~ 0.0118, q = (25, -42, 10, 127), back (0.295, -0.496, 0.118, 1.5) */
    cJSON *s = step(d, 0);
    assert_true(fabs(num(s, "scales", 0) - 0.0118) < 0.00005);
    const int q0[4] = {25, -42, 10, 127};
    const double b0[4] = {0.295, -0.496, 0.118, 1.5};
    for (int i = 0; i < 4; i++) {
        assert_int_equal((int)num(s, "q", i), q0[i]);
        assert_true(fabs(num(s, "dequantized", i) - b0[i]) < 0.0006);
    }
    /* Outlier 30: scale ~ 0.236, q = (1, -2, 1, 127); |x| <= 0.5 gets 5 levels (-2..2) of 255. */
    s = step(d, 1);
    assert_true(fabs(num(s, "scales", 0) - 0.236) < 0.0005);
    const int q1[4] = {1, -2, 1, 127};
    for (int i = 0; i < 4; i++) assert_int_equal((int)num(s, "q", i), q1[i]);
    assert_int_equal(cJSON_GetObjectItem(d, "levels_within_0_5")->valueint, 5);
    assert_int_equal(cJSON_GetObjectItem(d, "levels_lo")->valueint, -2);
    assert_int_equal(cJSON_GetObjectItem(d, "levels_hi")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(d, "levels_total")->valueint, 255);
    /* Blocks of 2: the first pair gets (76, -127). */
    s = step(d, 2);
    assert_int_equal((int)num(s, "q", 0), 76);
    assert_int_equal((int)num(s, "q", 1), -127);
    cJSON_Delete(d);
    /* The human version prints the same numbers. */
    char *out = NULL;
    assert_int_equal(tu_run_cli("quant demo", &out), 0);
    assert_non_null(strstr(out, "(25, -42, 10, 127)"));
    assert_non_null(strstr(out, "(0.295, -0.496, 0.118, 1.500)"));
    assert_non_null(strstr(out, "(1, -2, 1, 127)"));
    assert_non_null(strstr(out, "5 levels (-2..2) of 255"));
    assert_non_null(strstr(out, "(76, -127, 1, 127)"));
    free(out);
}

static double item(cJSON *o, const char *k) { return cJSON_GetObjectItem(o, k)->valuedouble; }

/* `quant values`: one's own values, checked against the absmax and affine rules computed here in
 * fp32 as the course states them (scale = max|x| / 127, q = round(x / scale), back = q * scale). */
static void test_values(void **state) {
    (void)state;
    const float x[4] = {0.3f, -0.5f, 0.12f, 1.5f};
    cJSON *d = run_json("quant values 0.3,-0.5,0.12,1.5 --json");
    assert_string_equal(cJSON_GetObjectItem(d, "scheme")->valuestring, "int8-tensor");
    cJSON *g = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "groups"), 0);
    float scale = 1.5f / 127.0f;
    assert_true(item(g, "scale") == (double)scale);
    assert_true(item(g, "zero_point") == 0);
    const int course[4] = {25, -42, 10, 127}; /* the course's walk-through */
    for (int i = 0; i < 4; i++) {
        assert_true(num(d, "x", i) == (double)x[i]);
        assert_int_equal((int)num(d, "codes", i), course[i]);
        assert_int_equal((int)num(d, "codes", i), (int)rintf(x[i] * (1.0f / scale)));
        assert_true(num(d, "dequantized", i) == (double)((float)course[i] * scale));
    }
    cJSON_Delete(d);
    /* an outlier with blocks of 2: the first pair keeps its own step, (76, -127) */
    d = run_json("quant values 0.3,-0.5,0.12,30 --block 2 --json");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(d, "groups")), 2);
    assert_true(item(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "groups"), 0), "scale") == (double)(0.5f / 127.0f));
    const int blocks[4] = {76, -127, 1, 127};
    for (int i = 0; i < 4; i++) assert_int_equal((int)num(d, "codes", i), blocks[i]);
    cJSON_Delete(d);
    /* int4: step max|x| / 7 */
    d = run_json("quant values 0.3,-0.5,0.12,1.5 --scheme int4 --json");
    assert_true(item(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "groups"), 0), "scale") == (double)(1.5f / 7.0f));
    const int q4[4] = {1, -2, 1, 7};
    for (int i = 0; i < 4; i++) assert_int_equal((int)num(d, "codes", i), q4[i]);
    cJSON_Delete(d);
    /* affine uint8: scale = (max - min) / 255, zero point = -round(min / scale), 0.0 exact */
    d = run_json("quant values 0.3,-0.5,0.12,1.5 --scheme affine --json");
    g = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "groups"), 0);
    float as = 2.0f / 255.0f;
    int zp = (int)-rintf(-0.5f / as);
    assert_true(item(g, "scale") == (double)as);
    assert_int_equal((int)item(g, "zero_point"), zp);
    assert_int_equal(zp, 64);
    for (int i = 0; i < 4; i++) {
        int q = (int)rintf(x[i] * (1.0f / as)) + zp;
        assert_int_equal((int)num(d, "codes", i), q);
        assert_true(fabs(num(d, "dequantized", i) - (double)((float)(q - zp) * as)) < 1e-7);
    }
    cJSON_Delete(d);
    /* the table shows the same numbers, the values as typed */
    char *out = NULL;
    assert_int_equal(tu_run_cli("quant values 0.3,-0.5,0.12,1.5", &out), 0);
    assert_non_null(strstr(out, "x            = 0.3 -0.5 0.12 1.5"));
    assert_non_null(strstr(out, "q            = 25 -42 10 127"));
    assert_non_null(strstr(out, "max|x| / 127 = 1.5 / 127"));
    free(out);
    /* bad input names what was wrong */
    assert_int_equal(tu_run_cli("quant values 0.3,abc", &out), 2);
    assert_non_null(strstr(out, "'abc'"));
    free(out);
    assert_int_equal(tu_run_cli("quant values 1e39", &out), 2);
    assert_non_null(strstr(out, "fp32"));
    free(out);
    assert_int_equal(tu_run_cli("quant values 1,2 --scheme affine --block 2", &out), 2);
    assert_non_null(strstr(out, "--block"));
    free(out);
    assert_int_equal(tu_run_cli("quant values 1,2 --scheme int9", &out), 2);
    assert_non_null(strstr(out, "int9"));
    free(out);
    assert_int_equal(tu_run_cli("quant values", &out), 2);
    assert_non_null(strstr(out, "give the values"));
    free(out);
}

static void test_outliers(void **state) {
    (void)state;
    cJSON *d = run_json("quant outliers --rows 64 --cols 256 --json");
    cJSON *a = cJSON_GetObjectItem(d, "schemes");
    assert_int_equal(cJSON_GetArraySize(a), 5);
    double t = cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "mse")->valuedouble;
    double t_rest = cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "mse_other_rows")->valuedouble;
    for (int i = 1; i < 5; i++) {
        cJSON *o = cJSON_GetArrayItem(a, i);
        /* per channel and per block are far better than per tensor with an outlier row */
        assert_true(cJSON_GetObjectItem(o, "mse")->valuedouble * 10 < t);
        assert_true(cJSON_GetObjectItem(o, "mse_other_rows")->valuedouble * 100 < t_rest);
        assert_true(cJSON_GetObjectItem(o, "sqnr_db")->valuedouble >
                    cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "sqnr_db")->valuedouble + 10);
    }
    /* Smaller blocks: lower error, more bytes. */
    for (int i = 2; i < 4; i++) {
        cJSON *o = cJSON_GetArrayItem(a, i), *p = cJSON_GetArrayItem(a, i + 1);
        assert_true(cJSON_GetObjectItem(o, "mse")->valuedouble < cJSON_GetObjectItem(p, "mse")->valuedouble);
        assert_true(cJSON_GetObjectItem(o, "bytes")->valuedouble > cJSON_GetObjectItem(p, "bytes")->valuedouble);
    }
    /* int8 per channel: one byte per weight plus one fp32 scale per row. */
    assert_int_equal((int)cJSON_GetObjectItem(cJSON_GetArrayItem(a, 1), "bytes")->valuedouble, 64 * 256 + 64 * 4);
    cJSON_Delete(d);
}

static void test_cli_errors(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("quant outliers --bits 9", &out), 2);
    assert_non_null(strstr(out, "--bits"));
    free(out);
    assert_int_equal(tu_run_cli("quant demo --frobnicate", &out), 2);
    assert_non_null(strstr(out, "--frobnicate"));
    free(out);
    assert_int_equal(tu_run_cli("quant sideways", &out), 2);
    assert_non_null(strstr(out, "sideways"));
    free(out);
    assert_int_equal(tu_run_cli("quant outliers --outlier -3", &out), 2);
    assert_non_null(strstr(out, "--outlier"));
    free(out);
    assert_int_equal(tu_run_cli("quant --help", &out), 0);
    assert_non_null(strstr(out, "usage: nanolm quant demo"));
    free(out);
}

/* quant model: errors, and one small real run (stories260K, 2048 tokens). */
static void test_model_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("quant model --data x.txt", &out), 2);
    assert_non_null(strstr(out, "--ckpt"));
    free(out);
    assert_int_equal(tu_run_cli("quant model --ckpt a --data b --scheme int3-b0", &out), 2);
    assert_non_null(strstr(out, "block size must be > 0"));
    free(out);
    assert_int_equal(tu_run_cli("quant model --ckpt a --data b --scheme int9-channel", &out), 2);
    assert_non_null(strstr(out, "bits must be 2..8"));
    free(out);
    assert_int_equal(tu_run_cli("quant model --ckpt a --data b --scheme nf4", &out), 2);
    assert_non_null(strstr(out, "unknown quantization scheme 'nf4'"));
    free(out);
    assert_int_equal(tu_run_cli("quant model --ckpt a --data b --scheme int8-channel --scheme mxfp4 --out q.st", &out),
                     2);
    assert_non_null(strstr(out, "--out needs exactly one --scheme"));
    free(out);
    assert_int_equal(tu_run_cli("quant model --ckpt missing.bin --data b", &out), 1);
    assert_non_null(strstr(out, "missing.bin"));
    free(out);
    TU_REQUIRE_DATA(bin, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(txt, "tinystories/tinystories_head.txt");
    char args[2048];
    snprintf(args, sizeof args,
             "quant model --ckpt %s --tokenizer %s --data %s --max-tokens 2048 --scheme int8-channel --scheme mxfp4 "
             "--gen 8 --json",
             bin, tokp, txt);
    cJSON *d = run_json(args);
    cJSON *a = cJSON_GetObjectItem(d, "schemes");
    assert_int_equal(cJSON_GetArraySize(a), 3);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "scheme")->valuestring, "fp32");
    cJSON *q = cJSON_GetArrayItem(a, 1);
    assert_string_equal(cJSON_GetObjectItem(q, "scheme")->valuestring, "int8-channel");
    assert_string_equal(cJSON_GetObjectItem(q, "mode")->valuestring, "w8a8");
    assert_int_equal((int)cJSON_GetObjectItem(q, "linear_bytes")->valuedouble, 226560 + 3000 * 4);
    assert_true(fabs(cJSON_GetObjectItem(q, "delta_loss_rel")->valuedouble) < 0.01);
    assert_int_equal(cJSON_GetObjectItem(q, "greedy_shared_with_first")->valueint, 8);
    cJSON *m4 = cJSON_GetArrayItem(a, 2);
    /* MXFP4: 4 bits + one E8M0 byte per 32 (rows of 64 and 172: 2 and 6 blocks) */
    assert_int_equal((int)cJSON_GetObjectItem(m4, "linear_bytes")->valuedouble,
                     226560 / 2 + 5 * ((64 + 32 + 32 + 64 + 172 + 172) * 2 + 64 * 6));
    cJSON_Delete(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_numbers), cmocka_unit_test(test_outliers),  cmocka_unit_test(test_values),
        cmocka_unit_test(test_cli_errors),   cmocka_unit_test(test_model_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
