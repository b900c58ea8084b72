/* nanolm quant demo / outliers: the course's numbers through the CLI, and its errors. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
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
static double num(cJSON *o, const char *k, int i) { return cJSON_GetArrayItem(cJSON_GetObjectItem(o, k), i)->valuedouble; }

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_numbers),
        cmocka_unit_test(test_outliers),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
