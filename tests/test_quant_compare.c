/* nanolm quant compare on the real stories260K model: GPTQ and AWQ beat RTN at int4 group 32,
 * the 8-bit methods (AWQ int8, SmoothQuant W8A8, LLM.int8()) stay within 1% of fp32, bytes
 * follow the documented count, bad schemes are rejected. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/quant_compare.h"

static cJSON *find_scheme(cJSON *doc, const char *name) {
    cJSON *r;
    cJSON_ArrayForEach(
        r,
        cJSON_GetObjectItem(doc, "schemes")) if (!strcmp(cJSON_GetObjectItem(r, "scheme")->valuestring, name)) return r;
    fail_msg("scheme %s missing from the output", name);
    return NULL;
}

static double num(cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItem(o, k);
    if (!cJSON_IsNumber(v)) fail_msg("field %s missing", k);
    return v->valuedouble;
}

/* Packed codes + (fp32 scale, u8 zero) per group of 32 for a (rows, cols) weight. */
static double wbytes(double rows, double cols, int bits) {
    return ceil(rows * cols * bits / 8) + rows * ceil(cols / 32) * 5;
}

static void test_stories260k_table(void **state) {
    (void)state;
    TU_REQUIRE_DATA(ckpt, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tok, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(text, "tinystories/tinystories_head.txt");
    char args[2048], *out = NULL;
    snprintf(args, sizeof args,
             "quant-compare --ckpt '%s' --tokenizer '%s' --data '%s' --calib '%s' --calib-tokens 2048 --eval-tokens "
             "8192 --json "
             "--schemes rtn-int4-g32,gptq-int4-g32,awq-int4-g32,awq-int8-g32,smoothquant-w8a8,int8-outlier6",
             ckpt, tok, text, text);
    int rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("quant-compare exited %d: %s", rc, out ? out : "");
    cJSON *doc = cJSON_Parse(out);
    assert_non_null(doc);
    double fp = num(doc, "fp32_loss");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(doc, "split_halves")));
    assert_true(num(doc, "calib_tokens") == 2048);
    double rtn = num(find_scheme(doc, "rtn-int4-g32"), "delta_loss");
    double gptq = num(find_scheme(doc, "gptq-int4-g32"), "delta_loss");
    double awq = num(find_scheme(doc, "awq-int4-g32"), "delta_loss");
    print_message("  fp32 %.4f; int4-g32 delta: rtn %+.4f gptq %+.4f awq %+.4f\n", fp, rtn, gptq, awq);
    assert_true(rtn > 0);
    assert_true(gptq < rtn);
    assert_true(awq < rtn);
    const char *eight[3] = {"awq-int8-g32", "smoothquant-w8a8", "int8-outlier6"};
    for (int i = 0; i < 3; i++) {
        double d = num(find_scheme(doc, eight[i]), "delta_loss");
        print_message("  %s delta %+.5f (%.3f%%)\n", eight[i], d, 100 * d / fp);
        assert_true(fabs(d) < 0.01 * fp);
    }
    /* Bytes from the arch (dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512, tied). */
    double fp32_other = 4.0 * (512 * 64 + 5 * 2 * 64 + 64);
    double lin = 0;
    for (int l = 0; l < 5; l++)
        lin +=
            wbytes(64, 64, 4) + 2 * wbytes(32, 64, 4) + wbytes(64, 64, 4) + 2 * wbytes(172, 64, 4) + wbytes(64, 172, 4);
    assert_true(num(find_scheme(doc, "rtn-int4-g32"), "bytes") == fp32_other + lin);
    double lin8 =
        5 * (64 * 64 + 2 * 32 * 64 + 64 * 64 + 2 * 172 * 64 + 64 * 172 + 4.0 * (64 + 32 + 32 + 64 + 172 + 172 + 64));
    assert_true(num(find_scheme(doc, "smoothquant-w8a8"), "bytes") == fp32_other + lin8);
    /* one table per result: the per-layer outlier rows are under outlier_dims.<scheme>, not inside the scheme's row */
    cJSON *ol = cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "outlier_dims"), "int8-outlier6");
    assert_int_equal(cJSON_GetArraySize(ol), 5 * 4);
    cJSON_Delete(doc);
    free(out);
}

static void test_bad_scheme(void **state) {
    (void)state;
    char *out = NULL;
    int rc = tu_run_cli("quant-compare --ckpt x --data y --calib y --schemes rtn-int4-g32,gptq-int9-g32", &out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "gptq-int9-g32"));
    free(out);
    rc = tu_run_cli("quant-compare --ckpt x --data y --calib y --schemes magic", &out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "magic"));
    free(out);
    rc = tu_run_cli("quant-compare --ckpt x --data y --calib y --frobnicate", &out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "frobnicate"));
    free(out);
}

/* fp32 is the baseline row: listing it in --schemes printed it twice. */
static void test_fp32_listed_once(void **state) {
    (void)state;
    TU_REQUIRE_DATA(ckpt, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tok, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(text, "tinystories/tinystories_head.txt");
    char args[2048], *out = NULL;
    snprintf(
        args, sizeof args,
        "quant compare --ckpt '%s' --tokenizer '%s' --data '%s' --calib '%s' --calib-tokens 512 --eval-tokens 1024 "
        "--schemes fp32,rtn-int8-g32",
        ckpt, tok, text, text);
    int rc = tu_run_cli(args, &out);
    if (rc != 0) fail_msg("quant compare exited %d: %s", rc, out ? out : "");
    int fp32_rows = 0, rtn_rows = 0;
    for (char *line = out; line; line = strchr(line, '\n')) {
        if (*line == '\n') line++;
        fp32_rows += !strncmp(line, "fp32 ", 5);
        rtn_rows += !strncmp(line, "rtn-int8-g32 ", 13);
    }
    print_message("%s", out);
    assert_int_equal(fp32_rows, 1);
    assert_int_equal(rtn_rows, 1);
    free(out);
    snprintf(args, sizeof args, "quant compare --ckpt x --data y --calib y --schemes fp32");
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "baseline"));
    free(out);
    snprintf(args, sizeof args, "quant compare --ckpt x --data y --calib y --schemes rtn-int4-g32,rtn-int4-g32");
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "rtn-int4-g32 twice"));
    free(out);
}

/* The bar chart of the loss increases: one bar per scheme, labelled with its name and the increase
 * over fp32; the method names the table prints. */
static void test_svg_and_names(void **state) {
    (void)state;
    nl_qc_row rows[3];
    int n = 0;
    assert_int_equal(nl_qc_parse_schemes("rtn-int4-g32,awq-int3-g32,int8-outlier6", rows, 3, &n), NL_OK);
    assert_int_equal(n, 3);
    assert_string_equal(nl_qm_method_name(rows[0].s.method), "rtn");
    assert_string_equal(nl_qm_method_name(rows[1].s.method), "awq");
    assert_string_equal(nl_qm_method_name(rows[2].s.method), "llm.int8");
    assert_string_equal(nl_qm_method_name(NL_QM_FP32), "fp32");
    const double loss[3] = {2.5, 2.75, 2.4};
    for (int i = 0; i < 3; i++) rows[i].loss = loss[i];
    char *dir = tu_tmpdir(), path[1100];
    snprintf(path, sizeof path, "%s/qc.svg", dir);
    assert_int_equal(nl_qc_svg(path, rows, 3, 2.45), NL_OK);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "loss increase over fp32"));
    assert_non_null(strstr(svg, "awq-int3-g32"));
    assert_non_null(strstr(svg, "+0.3000"));
    assert_non_null(strstr(svg, "-0.0500"));
    free(svg);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_svg_and_names),
        cmocka_unit_test(test_bad_scheme),
        cmocka_unit_test(test_fp32_listed_once),
        cmocka_unit_test(test_stories260k_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
