/* The studies that commands print, called as library functions: the FP8 GEMM error study, the
 * quantization demo and outlier study, reading a training log back and the quant-compare scheme
 * list (the collectives benchmark: tests/test_collectives_cli.c). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/format_study.h"
#include "nanolm/fp8_study.h"
#include "nanolm/quant_compare.h"
#include "nanolm/quant_study.h"
#include "nanolm/train.h"
#include "nanolm/train_log.h"

static nl_fp8_study_cfg small_cfg(void) {
    return (nl_fp8_study_cfg){.M = 16,
                              .N = 16,
                              .K = 256,
                              .fmt = NL_FMT_E4M3,
                              .outlier_col = -1,
                              .outlier_factor = 1,
                              .seed = 3,
                              .history = 4};
}

/* fp32 accumulation loses (almost) nothing beyond the FP8 operands; a 6-bit accumulator that is
 * never promoted loses far more; block scaling without promotion is skipped. */
static void test_fp8_study_rows(void **s) {
    (void)s;
    nl_fp8_study_cfg c = small_cfg();
    nl_fp8_study_row rows[3] = {{.scaling = NL_FP8_SCALE_TENSOR, .acc = {0, 32, 0, NL_FP8_ACC_TRUNCATE}},
                                {.scaling = NL_FP8_SCALE_TENSOR, .acc = {6, 32, 0, NL_FP8_ACC_TRUNCATE}},
                                {.scaling = NL_FP8_SCALE_BLOCK, .acc = {6, 32, 0, NL_FP8_ACC_TRUNCATE}}};
    assert_int_equal(nl_fp8_study_run(&c, c.K, rows, 3), NL_OK);
    assert_false(rows[0].skipped);
    assert_true(rows[0].acc_max < 1e-5);
    assert_true(rows[0].tot_max > rows[0].acc_max); /* the FP8 operands themselves cost something */
    assert_true(rows[1].acc_max > 100 * rows[0].acc_max);
    assert_true(rows[2].skipped);
    /* an outlier of 1e6 in one channel: per-tensor scaling flushes the other operand values */
    c.outlier_col = 5, c.outlier_factor = 1e6;
    nl_fp8_study_row o = {.scaling = NL_FP8_SCALE_TENSOR, .acc = {0, 32, 0, NL_FP8_ACC_TRUNCATE}};
    assert_int_equal(nl_fp8_study_run(&c, c.K, &o, 1), NL_OK);
    assert_true(o.st.a.flushed > 0);
}

static void test_fp8_study_sweep(void **s) {
    (void)s;
    nl_fp8_study_cfg c = small_cfg();
    c.K = 1024;
    nl_fp8_acc accs[2] = {{0, 32, 0, NL_FP8_ACC_TRUNCATE}, {8, 32, 0, NL_FP8_ACC_TRUNCATE}};
    nl_fp8_k_sweep sw;
    assert_int_equal(nl_fp8_study_sweep_k(&c, NL_FP8_SCALE_TENSOR, accs, 2, &sw), NL_OK);
    assert_int_equal(sw.nk, 4); /* 128, 256, 512, 1024 */
    assert_true(sw.k[0] == 128 && sw.k[3] == 1024);
    for (int k = 0; k < sw.nk; k++) assert_true(sw.err[1][k] > sw.err[0][k]);
    assert_true(sw.err[1][3] > sw.err[1][0]); /* a short accumulator loses more as K grows */
    c.K = 64;
    assert_int_equal(nl_fp8_study_sweep_k(&c, NL_FP8_SCALE_TENSOR, accs, 2, &sw), NL_ERR_INVALID);
}

/* The accumulators fp8 gemm compares, their names, and the plot of a K sweep (skipped ones left out). */
static void test_fp8_accs_and_plot(void **s) {
    (void)s;
    nl_fp8_acc accs[3];
    char b[64];
    assert_int_equal(nl_fp8_study_accs(14, 32, 0, accs), 2);
    assert_int_equal(nl_fp8_study_accs(14, 32, 128, accs), 3);
    assert_string_equal(nl_fp8_acc_name(&accs[0], b, sizeof b), "fp32");
    assert_string_equal(nl_fp8_acc_name(&accs[1], b, sizeof b), "14-bit, never promoted");
    assert_string_equal(nl_fp8_acc_name(&accs[2], b, sizeof b), "14-bit, promote every 128");
    for (int a = 0; a < 3; a++) assert_int_equal(nl_fp8_acc_validate(&accs[a]), NL_OK);
    nl_fp8_study_cfg c = small_cfg();
    c.K = 512;
    nl_fp8_k_sweep sw;
    assert_int_equal(nl_fp8_study_sweep_k(&c, NL_FP8_SCALE_TENSOR, accs, 3, &sw), NL_OK);
    char *dir = tu_tmpdir(), path[1100];
    snprintf(path, sizeof path, "%s/k.svg", dir);
    sw.skipped[1] = 1;
    assert_int_equal(nl_fp8_study_sweep_svg(path, &c, NL_FP8_SCALE_TENSOR, accs, 3, &sw), NL_OK);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "FP8 GEMM accumulation error vs K (e4m3, tensor scaling"));
    assert_non_null(strstr(svg, "14-bit, promote every 128"));
    assert_null(strstr(svg, "never promoted"));
    free(svg);
    tu_rmdir(dir);
    free(dir);
}

static void test_quant_demo(void **s) {
    (void)s;
    nl_quant_demo d;
    assert_int_equal(nl_quant_demo_run(&d), NL_OK);
    /* step 1: scale 1.5/127, 1.5 comes back exactly */
    assert_true(fabsf(d.st[0].back[3] - 1.5f) < 1e-6f);
    /* with the outlier 30 the step is 30/127: |x| <= 0.5 keeps codes -2..2 */
    assert_int_equal(d.levels, 5);
    assert_int_equal(d.lo, -2);
    assert_int_equal(d.hi, 2);
    assert_int_equal(d.st[2].q.n_scales, 2);
    nl_quant_demo_free(&d);
}

/* The outlier row spoils its neighbours per tensor; per channel and per block confine it. */
static void test_quant_outliers(void **s) {
    (void)s;
    nl_quant_outlier_row r[NL_QUANT_OUTLIER_SCHEMES];
    assert_int_equal(nl_quant_outlier_study(32, 256, 8, 50, 1, r), NL_OK);
    assert_string_equal(r[0].name, "per tensor");
    assert_true(r[0].mse_rest > 100 * r[1].mse_rest);
    assert_true(r[2].mse_rest < r[0].mse_rest);
    assert_true(r[1].sqnr > r[0].sqnr);
    assert_true(r[2].bytes > r[4].bytes); /* more blocks, more scales */
    assert_int_equal(nl_quant_outlier_study(4, 256, 8, 50, 1, r), NL_ERR_INVALID);
}

/* A user's values through a scheme: the names `quant values` takes, and the round trip. */
static void test_quant_values(void **s) {
    (void)s;
    nl_quant_spec spec;
    char name[64];
    assert_int_equal(nl_quant_values_spec("int8", 2, &spec), NL_OK);
    assert_string_equal(nl_quant_spec_name(&spec, name, sizeof name), "int8-b2");
    assert_int_equal(nl_quant_values_spec("int4", 0, &spec), NL_OK);
    assert_string_equal(nl_quant_spec_name(&spec, name, sizeof name), "int4-tensor");
    assert_int_equal(nl_quant_values_spec("affine", 0, &spec), NL_OK);
    assert_int_equal(spec.kind, NL_QUANT_AFFINE);
    assert_int_equal(nl_quant_values_spec("affine", 2, &spec), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "--block needs an absmax scheme"));
    assert_int_equal(nl_quant_values_spec("mxfp4", 2, &spec), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "not 'mxfp4'"));
    assert_int_equal(nl_quant_values_spec("int9x", 0, &spec), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "--scheme int9x: "));
    const float x[4] = {0.3f, -0.5f, 0.12f, 1.5f};
    nl_quant_values v;
    assert_int_equal(nl_quant_values_spec("int8", 0, &spec), NL_OK);
    assert_int_equal(nl_quant_values_run(x, 4, &spec, &v), NL_OK);
    assert_int_equal(v.q.n_scales, 1);
    assert_int_equal(nl_qtensor_code(&v.q, 0, 3), 127); /* the largest value gets the top code */
    double want = 0;
    for (int i = 0; i < 4; i++) want = fmax(want, fabs((double)x[i] - (double)v.back[i]));
    assert_true(v.max_err == want && want > 0 && want <= 1.5 / 127 / 2 * 1.0001);
    nl_quant_values_free(&v);
    assert_null(v.back);
}

static void test_train_log_curve(void **s) {
    (void)s;
    char *dir = tu_tmpdir(), path[1024];
    snprintf(path, sizeof path, "%s/log.csv", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("step,lr,train_loss,val_loss,grad_norm\n1,0.1,3.5,,1\n2,0.1,3.0,2.9,1\n3,0.1,2.5,,1\n", f);
    fclose(f);
    nl_loss_curve c;
    assert_int_equal(nl_train_log_read_curve(path, 0, &c), NL_OK);
    assert_int_equal(c.n, 3);
    assert_true(c.step[2] == 3 && c.loss[2] == 2.5);
    nl_loss_curve_free(&c);
    assert_int_equal(nl_train_log_read_curve(path, 1, &c), NL_OK);
    assert_int_equal(c.n, 1);
    assert_true(c.step[0] == 2 && c.loss[0] == 2.9);
    nl_loss_curve_free(&c);
    f = fopen(path, "w");
    fputs("a,b\n1,2\n", f);
    fclose(f);
    assert_int_equal(nl_train_log_read_curve(path, 0, &c), NL_ERR_FORMAT);
    assert_non_null(strstr(nl_last_error(), "not a training log"));
    nl_loss_curve_free(&c);
    tu_rmdir(dir);
    free(dir);
}

/* The plots of loss curves: several runs' curves by label, and a trainer's own log (training
 * loss every step, validation loss where there is one). */
static void test_loss_plots(void **s) {
    (void)s;
    double st[3] = {1, 2, 3}, la[3] = {3.5, 3.0, 2.5}, lb[2] = {3.4, 2.7};
    nl_loss_curve curves[2] = {{st, la, 3}, {st, lb, 2}};
    const char *labels[2] = {"bf16", "fp8 e4m3"};
    char *dir = tu_tmpdir(), path[1100];
    snprintf(path, sizeof path, "%s/curves.svg", dir);
    assert_int_equal(nl_loss_curves_svg(path, "validation loss", labels, curves, 2, 1), NL_OK);
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "fp8 e4m3"));
    assert_non_null(strstr(svg, "validation loss"));
    free(svg);
    assert_int_equal(nl_loss_curves_svg(path, "x", labels, curves, 0, 1), NL_ERR_INVALID);
    nl_train_log log[3] = {{.step = 1, .loss = 3.5f, .val_loss = NAN},
                           {.step = 2, .loss = 3.0f, .val_loss = 2.9f},
                           {.step = 3, .loss = 2.5f, .val_loss = NAN}};
    nl_trainer t;
    memset(&t, 0, sizeof t);
    t.log = log, t.n_log = 3;
    snprintf(path, sizeof path, "%s/train.svg", dir);
    assert_int_equal(nl_train_log_svg(&t, path), NL_OK);
    svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "NanoLM training"));
    assert_non_null(strstr(svg, "validation loss"));
    free(svg);
    log[1].val_loss = NAN; /* no validation: the training curve alone */
    assert_int_equal(nl_train_log_svg(&t, path), NL_OK);
    svg = tu_read_file(path, NULL);
    assert_null(strstr(svg, "validation loss"));
    free(svg);
    tu_rmdir(dir);
    free(dir);
}

static void test_qc_schemes(void **s) {
    (void)s;
    nl_qc_row rows[4];
    int n = 0;
    assert_int_equal(nl_qc_parse_schemes("fp32,rtn-int4-g32,w8a8", rows, 4, &n), NL_OK);
    assert_int_equal(n, 2); /* fp32 is the baseline, not a row */
    assert_string_equal(rows[1].s.name, "w8a8");
    assert_int_equal(nl_qc_parse_schemes("w8a8,w8a8", rows, 4, &n), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "twice"));
    assert_int_equal(nl_qc_parse_schemes("fp32", rows, 4, &n), NL_ERR_INVALID);
    assert_int_equal(nl_qc_parse_schemes("rtn-int4-g32,rtn-int3-g32", rows, 1, &n), NL_ERR_INVALID);
    assert_int_equal(nl_qc_parse_schemes("bogus", rows, 4, &n), NL_ERR_INVALID);
}

/* 0.1 in E4M3 is 0.1015625 (the neighbours 0.09375 and 0.1015625); a bf16 sum of 0.01 stalls
 * long before 1000 additions, and promoting every 64 additions keeps it near 10. */
static void test_format_cast_and_sum(void **s) {
    (void)s;
    nl_fmt_cast_result c;
    assert_int_equal(nl_fmt_cast(NL_FMT_E4M3, 0.1f, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 1, &c), NL_OK);
    assert_true(c.decoded == 0.1015625);
    assert_true(fabs(c.abs_err - fabs(0.1015625 - (double)0.1f)) < 1e-12);
    assert_true(c.below == 0.09375 && c.above == 0.1015625);
    assert_string_equal(c.hex, "0x1D"); /* 0.1015625 = 1.625 x 2^-4: biased exponent 3, mantissa 101 */
    assert_string_equal(c.binary, "0 | 0011 | 101");
    assert_int_equal(nl_fmt_cast(NL_FMT_BF16, 257, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 1, &c), NL_OK);
    assert_string_equal(c.hex, "0x4380");
    assert_string_equal(c.binary, "0 | 10000111 | 0000000");
    assert_int_equal(nl_fmt_cast(NL_FMT_INT4, -3, NL_ROUND_NEAREST_EVEN, NL_OVERFLOW_DEFAULT, 1, &c), NL_OK);
    assert_string_equal(c.hex, "0xD");
    assert_string_equal(c.binary, "1101"); /* two's complement, no fields */
    nl_fmt_sum_result r;
    assert_int_equal(nl_fmt_repeated_sum(NL_FMT_BF16, 0.01f, 1000, 0, &r), NL_OK);
    assert_true(r.result < 5 && r.last_change < 1000);
    assert_true(r.traj[999] == r.result);
    free(r.traj);
    assert_int_equal(nl_fmt_repeated_sum(NL_FMT_BF16, 0.01f, 1000, 64, &r), NL_OK);
    assert_true(r.result > 9.5 && r.result < 10.5); /* the partial sums stay small enough to count every step */
    free(r.traj);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_study_rows),      cmocka_unit_test(test_fp8_study_sweep),
        cmocka_unit_test(test_quant_demo),          cmocka_unit_test(test_quant_outliers),
        cmocka_unit_test(test_train_log_curve),     cmocka_unit_test(test_qc_schemes),
        cmocka_unit_test(test_format_cast_and_sum), cmocka_unit_test(test_fp8_accs_and_plot),
        cmocka_unit_test(test_loss_plots),          cmocka_unit_test(test_quant_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
