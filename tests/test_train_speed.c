/* The speed work on training keeps its results: the fused forward (a block of rows carried from
 * one attention to the next in one parallel region) gives the bits of the unfused forward, at 1
 * and 2 threads; the 8-lane exps give nl_vexpf's bits on every input class; and the MFU pieces
 * (the FMA peak, the sgemm rate, the model FLOPs per token, the step profile) refuse bad input
 * by name and add up. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/vexp.h"
#include "numerics/vexp_simd.h"
#include "nanolm/model.h"
#include "nanolm/peak.h"
#include "nanolm/step_prof.h"
#include "nanolm/train.h"

#define ARCH                                                                                                           \
    "{\"name\":\"t\",\"vocab_size\":256,\"dim\":64,\"n_layers\":2,\"n_heads\":4,\"n_kv_heads\":4,"                     \
    "\"hidden_dim\":96,\"seq_len\":32}"

/* The default linears, called through linear_ops: the forward then takes the unfused path. */
static void fwd_default(void *user, const nl_linear_site *site, float *out, const float *in, const float *w, int64_t n,
                        int64_t in_dim, int64_t out_dim) {
    nl_linear_forward_default(user, site, out, in, w, n, in_dim, out_dim);
}
static void bwd_default(void *user, const nl_linear_site *site, float *din, float *dw, const float *dout,
                        const float *in, const float *w, int64_t n, int64_t in_dim, int64_t out_dim) {
    nl_linear_backward_default(user, site, din, dw, dout, in, w, n, in_dim, out_dim);
}

/* logits, losses and gradients of one forward + backward on a fixed batch */
static void run(nl_model *m, int unfused, float *logits, float *losses, float *grads, float *mean) {
    nl_linear_ops ops = {fwd_default, bwd_default, m};
    m->linear_ops = unfused ? &ops : NULL;
    int64_t B = m->B, T = m->T;
    int32_t *x = malloc((size_t)(B * T) * sizeof(int32_t)), *y = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) {
        x[i] = (int32_t)((i * 37 + 11) % 256);
        y[i] = (int32_t)((i * 53 + 5) % 256);
    }
    nl_model_zero_grad(m);
    assert_int_equal(nl_model_forward(m, x, y, B, T, mean), NL_OK);
    memcpy(logits, m->a.logits, (size_t)(B * T * m->V) * sizeof(float));
    memcpy(losses, m->a.losses, (size_t)(B * T) * sizeof(float));
    assert_int_equal(nl_model_backward(m), NL_OK);
    memcpy(grads, m->grads, m->n_params * sizeof(float));
    m->linear_ops = NULL;
    free(x);
    free(y);
}

static void test_fused_forward_same_bits(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_arch_from_json("test", ARCH, &a), NL_OK);
    int saved = nl_threads();
    for (int threads = 1; threads <= 2; threads++) {
        nl_set_threads(threads);
        nl_model m;
        assert_int_equal(nl_model_init(&m, &a), NL_OK);
        nl_model_init_random(&m, 7);
        assert_int_equal(nl_model_alloc_grads(&m), NL_OK);
        assert_int_equal(nl_model_alloc_acts(&m, 4, 32), NL_OK);
        size_t nl = (size_t)(4 * 32 * m.V), nt = 4 * 32;
        float *l0 = malloc(nl * sizeof(float)), *l1 = malloc(nl * sizeof(float));
        float *s0 = malloc(nt * sizeof(float)), *s1 = malloc(nt * sizeof(float));
        float *g0 = malloc(m.n_params * sizeof(float)), *g1 = malloc(m.n_params * sizeof(float));
        float mean0, mean1;
        run(&m, 1, l0, s0, g0, &mean0);
        run(&m, 0, l1, s1, g1, &mean1);
        assert_memory_equal(l0, l1, nl * sizeof(float));
        assert_memory_equal(s0, s1, nt * sizeof(float));
        assert_memory_equal(g0, g1, m.n_params * sizeof(float));
        assert_memory_equal(&mean0, &mean1, sizeof(float));
        assert_true(isfinite(mean0) && mean0 > 0);
        free(l0), free(l1), free(s0), free(s1), free(g0), free(g1);
        nl_model_free(&m);
    }
    nl_set_threads(saved);
}

static void test_vexp_lanes_same_bits(void **state) {
    (void)state;
    enum { N = 4099 }; /* not a multiple of 8: the tail goes through nl_vexpf */
    float *x = malloc(N * sizeof(float)), *e = malloc(N * sizeof(float)), *f = malloc(N * sizeof(float));
    const float special[] = {0.0f,    -0.0f,    1.0f,      -1.0f, 88.7f,  88.8f,   100.0f, -87.3f, -87.4f,
                             -200.0f, INFINITY, -INFINITY, NAN,   1e-30f, -1e-30f, 0.5f,   -0.5f,  3.4e38f};
    size_t ns = sizeof special / sizeof special[0];
    for (int i = 0; i < N; i++) x[i] = i < (int)ns ? special[i] : (float)((i * 7919 % 20011) - 10005) * 0.01f;
    for (float c = -3.0f; c <= 3.0f; c += 1.5f) {
        nl_vexp_shift(e, x, c, N);
        for (int i = 0; i < N; i++) {
            float want = nl_vexpf(x[i] - c);
            if (memcmp(&e[i], &want, sizeof want))
                fail_msg("vexp_shift(%g - %g): %a, nl_vexpf %a", x[i], c, e[i], want);
        }
    }
    nl_vexp_neg(f, x, N);
    for (int i = 0; i < N; i++) {
        float want = nl_vexpf(-x[i]);
        if (memcmp(&f[i], &want, sizeof want)) fail_msg("vexp_neg(%g): %a, nl_vexpf %a", x[i], f[i], want);
    }
    free(x), free(e), free(f);
}

static void test_peak_rates_and_refusals(void **state) {
    (void)state;
    double f = 0;
    for (int p = NL_PEAK_SCALAR; p <= NL_PEAK_AVX512; p++) {
        if (!nl_peak_available((nl_peak_path)p)) {
            assert_int_equal(nl_peak_fma((nl_peak_path)p, 1, 1e-3, 1, &f), NL_ERR_INVALID);
            assert_non_null(strstr(nl_last_error(), nl_peak_path_name((nl_peak_path)p)));
            continue;
        }
        double one = 0, two = 0;
        assert_int_equal(nl_peak_fma((nl_peak_path)p, 1, 2e-3, 1, &one), NL_OK);
        assert_int_equal(nl_peak_fma((nl_peak_path)p, 2, 2e-3, 1, &two), NL_OK);
        assert_true(one > 0 && two > 0);
        /* the kernel is deterministic: the same iterations give the same value */
        assert_true(nl_peak_fma_kernel((nl_peak_path)p, 1000) == nl_peak_fma_kernel((nl_peak_path)p, 1000));
    }
    assert_int_equal(nl_peak_fma(NL_PEAK_AUTO, 1, 0, 1, &f), NL_ERR_INVALID);
    assert_int_equal(nl_peak_fma(NL_PEAK_AUTO, 1, 1e-3, 0, &f), NL_ERR_INVALID);
    assert_int_equal(nl_peak_sgemm(8, 1, 1e-3, 1, &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "size 8"));
    assert_int_equal(nl_peak_sgemm(64, 1, 1e-3, 1, &f), NL_OK);
    assert_true(f > 0);
}

static void test_flops_per_token(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_arch_from_json("test", ARCH, &a), NL_OK);
    nl_model m;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    /* per layer: q, k, v, o (64 x 64 each), gate, up, down (96 x 64 each), two norms (64);
     * final norm (64) and classifier (256 x 64); the embedding (256 x 64) does not count */
    double n = 2.0 * (4 * 64 * 64 + 3 * 96 * 64 + 2 * 64) + 64 + 256 * 64;
    assert_true(fabs(nl_train_flops_per_token(&m, 32) - (6 * n + 12.0 * 2 * 64 * 32)) < 0.5);
    nl_model_free(&m);
}

static void test_step_prof_adds_up(void **state) {
    (void)state;
    nl_step_prof p;
    nl_step_prof_init(&p, 2);
    nl_step_prof_begin(&p);
    double sink = 0;
    for (int i = 0; i < 200000; i++) sink += sqrt((double)i);
    nl_step_prof_mark(&p, NL_PROF_GEMM);
    nl_step_prof_mark(&p, NL_PROF_COUNT); /* out of range: ignored */
    nl_step_prof_mark(NULL, NL_PROF_GEMM);
    p.steps = 1;
    assert_true(sink > 0 && p.wall[NL_PROF_GEMM] > 0 && p.cpu[NL_PROF_GEMM] > 0);
    for (int i = 1; i < NL_PROF_COUNT; i++) assert_true(p.wall[i] == 0);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    nl_step_prof_print(&p, f, "profile");
    fclose(f);
    for (int i = 0; i < NL_PROF_COUNT; i++) assert_non_null(strstr(buf, nl_prof_phase_name((nl_prof_phase)i)));
    assert_non_null(strstr(buf, "threads waiting"));
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_forward_same_bits), cmocka_unit_test(test_vexp_lanes_same_bits),
        cmocka_unit_test(test_peak_rates_and_refusals), cmocka_unit_test(test_flops_per_token),
        cmocka_unit_test(test_step_prof_adds_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
