/* Checkpoint metadata that must be refused (not silently accepted): a non-finite or string
 * norm_eps in the arch, an unknown quant.mode, int codes outside the scheme's range, int4 data
 * relabelled as int2. Each case rewrites a valid checkpoint with one field changed. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/model.h"
#include "nanolm/quantize_model.h"
#include "nanolm/safetensors.h"
#include "quant_check.h"

static void tiny_arch(nl_arch *a) { *a = tu_arch("tiny", 64, 32, 1, 4, 2, 64, 16); }

/* Copies src to dst with metadata key `mkey` set to `mval` (NULL: unchanged), and, when
 * `tname` is given, byte `at` of that tensor replaced by `byte`. */
static void rewrite(const char *src, const char *dst, const char *mkey, const char *mval, const char *tname, size_t at,
                    uint8_t byte) {
    nl_st_file f;
    QOK(nl_st_open(&f, src));
    nl_st_writer w;
    nl_st_writer_init(&w);
    for (int i = 0; i < f.n_meta; i++)
        QOK(nl_st_writer_meta(&w, f.meta_keys[i], mkey && !strcmp(mkey, f.meta_keys[i]) ? mval : f.meta_values[i]));
    for (int i = 0; i < f.n_tensors; i++) {
        const nl_st_tensor *t = &f.tensors[i];
        size_t n = (size_t)(t->end - t->begin);
        uint8_t *copy = nl_malloc(n ? n : 1, "copy");
        assert_non_null(copy);
        memcpy(copy, t->data, n);
        if (tname && !strcmp(tname, t->name)) {
            assert_true(at < n);
            copy[at] = byte;
        }
        QOK(nl_st_writer_add_owned(&w, t->name, t->dtype, t->ndim, t->shape, copy));
    }
    QOK(nl_st_writer_write(&w, dst));
    nl_st_writer_free(&w);
    nl_st_close(&f);
}

static void expect_refused(nl_status rc, const char *want1, const char *want2) {
    if (rc == NL_OK) fail_msg("accepted; expected an error containing \"%s\"", want1);
    if (!strstr(nl_last_error(), want1) || (want2 && !strstr(nl_last_error(), want2)))
        fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", nl_last_error(), want1, want2 ? want2 : "");
}

static void test_arch_reals(void **state) {
    (void)state;
    nl_arch a;
    tiny_arch(&a);
    char *js = nl_arch_to_json(&a);
    assert_non_null(js);
    nl_arch b;
    QOK(nl_arch_from_json("x.st", js, &b));
    assert_true(b.norm_eps == 1e-5);
    /* norm_eps as infinity (cJSON reads 1e999 as inf), as a string, as zero, negative */
    static const char *const bad[] = {"1e999", "\"1e-5\"", "0", "-1e-5", "null"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char buf[1024];
        const char *p = strstr(js, "\"norm_eps\":");
        assert_non_null(p);
        const char *e = strchr(p, ',');
        snprintf(buf, sizeof buf, "%.*s\"norm_eps\":%s%s", (int)(p - js), js, bad[k], e);
        expect_refused(nl_arch_from_json("x.st", buf, &b), "x.st: arch field 'norm_eps'", NULL);
    }
    /* the same through a checkpoint file, and rope_theta too */
    char *dir = tu_tmpdir(), good[512], badp[512];
    snprintf(good, sizeof good, "%s/good.st", dir);
    snprintf(badp, sizeof badp, "%s/bad.st", dir);
    nl_model m;
    QOK(nl_model_init(&m, &a));
    nl_model_init_random(&m, 1);
    QOK(nl_ckpt_save(good, &m, "byte", NULL));
    nl_model_free(&m);
    const char *cases[][2] = {{"\"norm_eps\":", "1e999"}, {"\"norm_eps\":", "\"tiny\""}, {"\"rope_theta\":", "1e400"}};
    for (int k = 0; k < 3; k++) {
        char buf[1024];
        const char *p = strstr(js, cases[k][0]);
        const char *e = strchr(p, ',');
        snprintf(buf, sizeof buf, "%.*s%s%s%s", (int)(p - js), js, cases[k][0], cases[k][1], e);
        rewrite(good, badp, "nanolm.arch", buf, NULL, 0, 0);
        char want[64];
        snprintf(want, sizeof want, "arch field '%.*s'", (int)(strlen(cases[k][0]) - 3), cases[k][0] + 1);
        expect_refused(nl_ckpt_load_model(badp, &m, NULL), badp, want);
    }
    /* nl_model_init refuses an infinite eps given directly */
    a.norm_eps = INFINITY;
    expect_refused(nl_model_init(&m, &a), "norm_eps", NULL);
    free(js);
    tu_rmdir(dir);
    free(dir);
}

/* Saves an int4-b32 quantized tiny model; returns the directory (path in out). */
static char *quantized(char *out, size_t out_bytes, const char *scheme) {
    nl_arch a;
    tiny_arch(&a);
    nl_model m;
    QOK(nl_model_init(&m, &a));
    nl_model_init_random(&m, 2);
    nl_quant_spec spec;
    QOK(nl_quant_spec_parse(scheme, &spec));
    nl_qmodel qm;
    QOK(nl_qmodel_quantize(&qm, &m, &spec, NL_QLINEAR_WEIGHT_ONLY));
    char *dir = tu_tmpdir();
    snprintf(out, out_bytes, "%s/q.st", dir);
    QOK(nl_qmodel_save(&qm, out, "byte"));
    nl_qmodel_free(&qm);
    nl_model_free(&m);
    return dir;
}

static void test_quant_mode_and_codes(void **state) {
    (void)state;
    char good[512], badp[600];
    char *dir = quantized(good, sizeof good, "int4-b32");
    snprintf(badp, sizeof badp, "%s/bad.st", dir);
    nl_model m;
    nl_qmodel q;
    QOK(nl_qmodel_load(good, &m, &q, NULL));
    nl_qmodel_free(&q);
    nl_model_free(&m);
    /* unknown mode */
    rewrite(good, badp, "nanolm.quant.mode", "w4a4", NULL, 0, 0);
    expect_refused(nl_qmodel_load(badp, &m, &q, NULL), "unknown nanolm.quant.mode \"w4a4\"", badp);
    /* a nibble of 8 (-8) is outside symmetric int4's [-7, 7] */
    const char *qc = "model.layers.0.self_attn.q_proj.weight.qcodes";
    rewrite(good, badp, NULL, NULL, qc, 3, 0x80);
    expect_refused(nl_qmodel_load(badp, &m, &q, NULL), "is outside the 4-bit code range [-7, 7]", qc);
    /* int4 data relabelled as int2: same nibble layout, codes beyond [-1, 1] */
    rewrite(good, badp, "nanolm.quant.scheme", "int2-b32", NULL, 0, 0);
    expect_refused(nl_qmodel_load(badp, &m, &q, NULL), "is outside the 2-bit code range [-1, 1]", badp);
    tu_rmdir(dir);
    free(dir);
    /* affine unsigned 8-bit accepts every byte; int8 symmetric refuses -128 */
    dir = quantized(good, sizeof good, "int8-channel");
    snprintf(badp, sizeof badp, "%s/bad.st", dir);
    rewrite(good, badp, NULL, NULL, qc, 0, 0x80);
    expect_refused(nl_qmodel_load(badp, &m, &q, NULL), "= -128 is outside the 8-bit code range [-127, 127]", NULL);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arch_reals),
        cmocka_unit_test(test_quant_mode_and_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
