/* GPTQ against the independent PyTorch implementation in tests/ref/make_gptq_fixture.py,
 * GPTQ vs round-to-nearest on the same grid, the inverse factor, determinism, bad input. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/gptq.h"
#include "nanolm/qgrid.h"

typedef struct fixture {
    int rows, cols, tokens;
    float *x, *w; /* (tokens, cols), (rows, cols) */
    cJSON *meta;
} fixture;

static void *load_bin(const char *name, size_t want) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/ref/gptq/%s", name);
    size_t bytes = 0;
    void *p = tu_read_file(tu_src_path(rel), &bytes);
    if (!p) fail_msg("missing fixture %s (run tests/ref/make_gptq_fixture.py)", rel);
    if (bytes != want) fail_msg("fixture %s has %zu bytes, expected %zu", rel, bytes, want);
    return p;
}

static void fixture_load(fixture *f) {
    char *js = tu_read_file(tu_src_path("tests/ref/gptq/meta.json"), NULL);
    assert_non_null(js);
    f->meta = cJSON_Parse(js);
    free(js);
    assert_non_null(f->meta);
    f->rows = cJSON_GetObjectItem(f->meta, "rows")->valueint;
    f->cols = cJSON_GetObjectItem(f->meta, "cols")->valueint;
    f->tokens = cJSON_GetObjectItem(f->meta, "tokens")->valueint;
    f->x = load_bin("x.f32", (size_t)f->tokens * f->cols * 4);
    f->w = load_bin("w.f32", (size_t)f->rows * f->cols * 4);
}

static void fixture_free(fixture *f) {
    free(f->x);
    free(f->w);
    cJSON_Delete(f->meta);
}

/* ||(W - W^) X^T||^2 over the calibration tokens, in double. */
static double output_sq_error(const float *w, const float *wq, const float *x, int rows, int cols, int tokens) {
    double s = 0;
    for (int t = 0; t < tokens; t++)
        for (int r = 0; r < rows; r++) {
            double y = 0;
            for (int c = 0; c < cols; c++) y += ((double)w[r * cols + c] - wq[r * cols + c]) * x[t * cols + c];
            s += y * y;
        }
    return s;
}

static void test_matches_pytorch_reference(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f);
    nl_gptq_hessian hs;
    assert_int_equal(nl_gptq_hessian_init(&hs, f.cols), NL_OK);
    /* Two batches, to exercise the running mean. */
    assert_int_equal(nl_gptq_hessian_add(&hs, f.x, 200), NL_OK);
    assert_int_equal(nl_gptq_hessian_add(&hs, f.x + 200 * f.cols, f.tokens - 200), NL_OK);
    assert_true(hs.n_tokens == f.tokens);
    int n = f.rows * f.cols;
    uint8_t *codes = malloc(n);
    float *wq = malloc(n * sizeof(float)), *wr = malloc(n * sizeof(float));
    cJSON *cfg;
    cJSON_ArrayForEach(cfg, cJSON_GetObjectItem(f.meta, "configs")) {
        const char *name = cJSON_GetObjectItem(cfg, "name")->valuestring;
        nl_gptq_opts o = nl_gptq_defaults();
        o.bits = cJSON_GetObjectItem(cfg, "bits")->valueint;
        o.group_size = cJSON_GetObjectItem(cfg, "group")->valueint;
        o.symmetric = cJSON_IsTrue(cJSON_GetObjectItem(cfg, "symmetric"));
        int ng = (int)nl_qgrid_n_groups(f.cols, o.group_size);
        float *sc = malloc(f.rows * ng * sizeof(float)), *zp = malloc(f.rows * ng * sizeof(float));
        double loss = 0;
        assert_int_equal(nl_gptq_quantize(f.w, f.rows, f.cols, hs.h, &o, codes, sc, zp, wq, &loss), NL_OK);
        char fn[128];
        snprintf(fn, sizeof fn, "%s.codes.u8", name);
        uint8_t *ref_codes = load_bin(fn, n);
        snprintf(fn, sizeof fn, "%s.scales.f32", name);
        float *ref_sc = load_bin(fn, f.rows * ng * 4);
        snprintf(fn, sizeof fn, "%s.zeros.f32", name);
        float *ref_zp = load_bin(fn, f.rows * ng * 4);
        int mismatches = 0, max_diff = 0;
        for (int i = 0; i < n; i++) {
            int d = abs((int)codes[i] - (int)ref_codes[i]);
            if (d) mismatches++;
            if (d > max_diff) max_diff = d;
        }
        int scale_bad = 0, zero_bad = 0;
        for (int i = 0; i < f.rows * ng; i++) {
            if (fabsf(sc[i] - ref_sc[i]) > 1e-6f * fabsf(ref_sc[i])) scale_bad++;
            if (zp[i] != ref_zp[i]) zero_bad++;
        }
        double ref_loss = cJSON_GetObjectItem(cfg, "loss")->valuedouble;
        double ref_err = cJSON_GetObjectItem(cfg, "output_sq_error")->valuedouble;
        double err = output_sq_error(f.w, wq, f.x, f.rows, f.cols, f.tokens);
        assert_int_equal(nl_qgrid_rtn(f.w, f.rows, f.cols, o.bits, o.group_size, o.symmetric, NULL, NULL, NULL, wr),
                         NL_OK);
        double rtn_err = output_sq_error(f.w, wr, f.x, f.rows, f.cols, f.tokens);
        print_message("  %-13s codes %d/%d differ, scales %d, zeros %d; loss %.6f (ref %.6f); "
                      "||(W-Wq)X||^2 gptq %.3f (ref %.3f) rtn %.3f\n",
                      name, mismatches, n, scale_bad, zero_bad, loss, ref_loss, err, ref_err, rtn_err);
        /* Exact agreement in codes, scales and zero points. */
        assert_int_equal(mismatches, 0);
        assert_int_equal(scale_bad, 0);
        assert_int_equal(zero_bad, 0);
        assert_true(fabs(loss - ref_loss) <= 1e-6 * ref_loss);
        assert_true(fabs(err - ref_err) <= 1e-4 * ref_err);
        /* GPTQ's layer output error is below round-to-nearest's on the same grid. */
        assert_true(err < rtn_err);
        /* The dead input features (40 and 200) are zeroed, so they sit on the zero point. */
        for (int r = 0; r < f.rows; r++) {
            int gi40 = o.group_size ? 40 / o.group_size : 0, gi200 = o.group_size ? 200 / o.group_size : 0;
            assert_int_equal(codes[r * f.cols + 40], (int)zp[r * ng + gi40]);
            assert_int_equal(codes[r * f.cols + 200], (int)zp[r * ng + gi200]);
        }
        free(ref_codes);
        free(ref_sc);
        free(ref_zp);
        free(sc);
        free(zp);
    }
    free(codes);
    free(wq);
    free(wr);
    nl_gptq_hessian_free(&hs);
    fixture_free(&f);
}

static void test_inverse_factor(void **state) {
    (void)state;
    /* U^T U (H + damp) = I for a random SPD H with a dead column. */
    int n = 37;
    nl_rng rng;
    nl_rng_seed(&rng, 5);
    float *x = malloc(100 * n * sizeof(float));
    for (int i = 0; i < 100 * n; i++) x[i] = (float)nl_rng_normal(&rng);
    for (int t = 0; t < 100; t++) x[t * n + 3] = 0;
    nl_gptq_hessian hs;
    assert_int_equal(nl_gptq_hessian_init(&hs, n), NL_OK);
    assert_int_equal(nl_gptq_hessian_add(&hs, x, 100), NL_OK);
    double *u = malloc(n * n * sizeof(double));
    uint8_t dead[37];
    assert_int_equal(nl_gptq_inverse_factor(hs.h, n, 0.01, u, dead), NL_OK);
    assert_int_equal(dead[3], 1);
    assert_int_equal(dead[4], 0);
    double *a = malloc(n * n * sizeof(double));
    double md = 0;
    for (int i = 0; i < n; i++) md += (i == 3) ? 1.0 : hs.h[i * n + i];
    md /= n;
    for (int i = 0; i < n * n; i++) a[i] = hs.h[i];
    a[3 * n + 3] = 1.0;
    for (int i = 0; i < n; i++) a[i * n + i] += 0.01 * md;
    double maxerr = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++) assert_true(u[i * n + j] == 0.0); /* upper */
        assert_true(u[i * n + i] > 0);
        for (int j = 0; j < n; j++) {
            double s = 0; /* (U^T U A)_ij */
            for (int k = 0; k < n; k++) {
                double utu = 0;
                for (int p = 0; p < n; p++) utu += u[p * n + i] * u[p * n + k];
                s += utu * a[k * n + j];
            }
            double e = fabs(s - (i == j));
            if (e > maxerr) maxerr = e;
        }
    }
    assert_true(maxerr < 1e-9);
    free(a);
    free(u);
    free(x);
    nl_gptq_hessian_free(&hs);
}

static void test_thread_count_does_not_matter(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f);
    nl_gptq_hessian hs;
    assert_int_equal(nl_gptq_hessian_init(&hs, f.cols), NL_OK);
    assert_int_equal(nl_gptq_hessian_add(&hs, f.x, f.tokens), NL_OK);
    int n = f.rows * f.cols;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    nl_gptq_opts o = nl_gptq_defaults();
    o.group_size = 32;
    o.block_size = 64; /* other block sizes give the same math up to rounding */
    int saved = nl_threads();
    nl_set_threads(1);
    assert_int_equal(nl_gptq_quantize(f.w, f.rows, f.cols, hs.h, &o, NULL, NULL, NULL, a, NULL), NL_OK);
    nl_set_threads(2);
    assert_int_equal(nl_gptq_quantize(f.w, f.rows, f.cols, hs.h, &o, NULL, NULL, NULL, b, NULL), NL_OK);
    nl_set_threads(saved);
    assert_memory_equal(a, b, n * sizeof(float));
    free(a);
    free(b);
    nl_gptq_hessian_free(&hs);
    fixture_free(&f);
}

static void test_bad_input(void **state) {
    (void)state;
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double h[16] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
    nl_gptq_opts o = nl_gptq_defaults();
    o.bits = 9;
    assert_int_equal(nl_gptq_quantize(w, 2, 4, h, &o, NULL, NULL, NULL, NULL, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bits"));
    o = nl_gptq_defaults();
    w[6] = NAN;
    assert_int_equal(nl_gptq_quantize(w, 2, 4, h, &o, NULL, NULL, NULL, NULL, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "row 1 col 2"));
    w[6] = 7;
    double neg[16] = {-1, 0, 0, 0, 0, -1, 0, 0, 0, 0, -1, 0, 0, 0, 0, -1};
    assert_int_equal(nl_gptq_quantize(w, 2, 4, neg, &o, NULL, NULL, NULL, NULL, NULL), NL_ERR_NUMERIC);
    assert_non_null(strstr(nl_last_error(), "positive definite"));
    nl_gptq_hessian hs;
    assert_int_equal(nl_gptq_hessian_init(&hs, 4), NL_OK);
    float x[8] = {0, 1, 2, 3, 4, INFINITY, 6, 7};
    assert_int_equal(nl_gptq_hessian_add(&hs, x, 2), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "token 1 feature 1"));
    nl_gptq_hessian_free(&hs);
    assert_int_equal(nl_gptq_hessian_init(&hs, 0), NL_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_pytorch_reference),
        cmocka_unit_test(test_inverse_factor),
        cmocka_unit_test(test_thread_count_does_not_matter),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
