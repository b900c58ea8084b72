/* numerics/quant against PyTorch: codes of torch.quantize_per_tensor / quantize_per_channel
 * (qint8, quint8) for given scales and zero points on 100,000 values that include exact .5
 * ties, and MinMaxObserver / PerChannelMinMaxObserver (affine, quint8) parameters.
 * Fixture: tests/ref/make_quant_fixture.py (Debian python3-torch 1.13). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/quant.h"
#include "quant_check.h"

static cJSON *meta;
static char *bin;
static size_t bin_bytes;
static int64_t N, ROWS, COLS;

static int setup(void **state) {
    (void)state;
    size_t n;
    char *js = tu_read_file(tu_src_path("tests/ref/quant_fixture.json"), &n);
    bin = tu_read_file(tu_src_path("tests/ref/quant_fixture.bin"), &bin_bytes);
    if (!js || !bin) return -1;
    meta = cJSON_Parse(js);
    free(js);
    if (!meta) return -1;
    N = (int64_t)cJSON_GetObjectItem(meta, "n")->valuedouble;
    ROWS = (int64_t)cJSON_GetObjectItem(meta, "rows")->valuedouble;
    COLS = (int64_t)cJSON_GetObjectItem(meta, "cols")->valuedouble;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cJSON_Delete(meta);
    free(bin);
    return 0;
}

static const float *values(void) { return (const float *)bin; }

static void test_codes_match_torch(void **state) {
    (void)state;
    const float *x = values();
    cJSON *cases = cJSON_GetObjectItem(meta, "cases");
    int ncases = cJSON_GetArraySize(cases);
    assert_int_equal(bin_bytes, (size_t)N * 4 + (size_t)ncases * (size_t)N);
    int32_t *q = malloc(sizeof(int32_t) * (size_t)N);
    int ties = 0;
    for (int i = 0; i < N; i++) {
        float t = x[i] * 32.0f;
        ties += t - floorf(t) == 0.5f;
    }
    assert_true(ties >= 25000); /* the data really holds exact ties */
    for (int ci = 0; ci < ncases; ci++) {
        cJSON *c = cJSON_GetArrayItem(cases, ci);
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        int is_u8 = !strcmp(cJSON_GetObjectItem(c, "dtype")->valuestring, "quint8");
        int qmin = is_u8 ? 0 : -128, qmax = is_u8 ? 255 : 127;
        const uint8_t *want = (const uint8_t *)bin + (size_t)N * 4 + (size_t)ci * (size_t)N;
        if (!strcmp(cJSON_GetObjectItem(c, "kind")->valuestring, "per_tensor")) {
            float s = (float)cJSON_GetObjectItem(c, "scale")->valuedouble;
            int32_t zp = (int32_t)cJSON_GetObjectItem(c, "zero_point")->valuedouble;
            QOK(nl_quant_affine_codes(x, (size_t)N, s, zp, qmin, qmax, q));
        } else {
            cJSON *sc = cJSON_GetObjectItem(c, "scales"), *zc = cJSON_GetObjectItem(c, "zero_points");
            for (int64_t r = 0; r < ROWS; r++)
                QOK(nl_quant_affine_codes(
                    x + r * COLS, (size_t)COLS, (float)cJSON_GetArrayItem(sc, (int)r)->valuedouble,
                    (int32_t)cJSON_GetArrayItem(zc, (int)r)->valuedouble, qmin, qmax, q + r * COLS));
        }
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < N; i++) {
            int32_t w = is_u8 ? (int32_t)want[i] : (int32_t)(int8_t)want[i];
            if (w != q[i]) {
                bad++;
                if (first < 0) first = i;
            }
        }
        if (bad)
            fail_msg("%s: %lld codes differ from torch (first at %lld: x=%.9g ours %d torch %d)", name, (long long)bad,
                     (long long)first, (double)x[first], q[first], is_u8 ? want[first] : (int8_t)want[first]);
    }
    free(q);
}

/* Symmetric per-channel int8 uses the same rounding: with zero point 0 its codes equal
 * torch's qint8 codes for the same scales (restricted to +-127, which torch's clamp to -128
 * never reaches when the scale comes from absmax). */
static void test_symmetric_uses_torch_rounding(void **state) {
    (void)state;
    const float *x = values();
    nl_qtensor q;
    QOK(nl_quant_symmetric(x, ROWS, COLS, 8, 1, &q));
    int32_t *ref = malloc(sizeof(int32_t) * (size_t)COLS);
    for (int64_t r = 0; r < ROWS; r++) {
        QOK(nl_quant_affine_codes(x + r * COLS, (size_t)COLS, q.scales[r], 0, -128, 127, ref));
        for (int64_t c = 0; c < COLS; c++) assert_int_equal(nl_qtensor_code(&q, r, c), ref[c]);
    }
    free(ref);
    nl_qtensor_free(&q);
}

static void test_observer_params(void **state) {
    (void)state;
    const float *x = values();
    cJSON *o = cJSON_GetObjectItem(meta, "observer");
    nl_qtensor q;
    QOK(nl_quant_affine(x, 1, N, 8, 1, 0, &q));
    assert_true(q.scales[0] == (float)cJSON_GetObjectItem(o, "scale")->valuedouble);
    assert_int_equal(q.zero_points[0], (int32_t)cJSON_GetObjectItem(o, "zero_point")->valuedouble);
    nl_qtensor_free(&q);
    /* Per channel on the shifted copy (odd rows all positive, so widened to include 0). */
    float *xc = malloc(sizeof(float) * (size_t)N);
    memcpy(xc, x, sizeof(float) * (size_t)N);
    for (int64_t r = 1; r < ROWS; r += 2)
        for (int64_t c = 0; c < COLS; c++) xc[r * COLS + c] = fabsf(xc[r * COLS + c]) + 0.25f;
    cJSON *pc = cJSON_GetObjectItem(meta, "observer_per_channel");
    cJSON *sc = cJSON_GetObjectItem(pc, "scales"), *zc = cJSON_GetObjectItem(pc, "zero_points");
    QOK(nl_quant_affine(xc, ROWS, COLS, 8, 1, 1, &q));
    for (int64_t r = 0; r < ROWS; r++) {
        assert_true(q.scales[r] == (float)cJSON_GetArrayItem(sc, (int)r)->valuedouble);
        assert_int_equal(q.zero_points[r], (int32_t)cJSON_GetArrayItem(zc, (int)r)->valuedouble);
    }
    assert_int_equal(q.zero_points[1], 0); /* an all-positive row: zero point 0 */
    nl_qtensor_free(&q);
    free(xc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_match_torch),
        cmocka_unit_test(test_symmetric_uses_torch_rounding),
        cmocka_unit_test(test_observer_params),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
