/* The speed work on training keeps its results: the fused forward (a block of rows carried from
 * one attention to the next in one parallel region) gives the bits of the unfused forward, at 1
 * and 2 threads; the 8-lane exps give nl_vexpf's bits on every input class; the attention tiles,
 * their transpose and the prefix softmax agree with double-precision sums, and the tiled
 * attention with the OpenBLAS one (forward and backward, GQA included); and the MFU pieces
 * (the FMA peak, the sgemm rate, the model FLOPs per token, the step profile) refuse bad input
 * by name and add up. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/isa.h"
#include "numerics/tile_gemm.h"
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
    int64_t B = m->train->B, T = m->train->T;
    int32_t *x = malloc((size_t)(B * T) * sizeof(int32_t)), *y = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) {
        x[i] = (int32_t)((i * 37 + 11) % 256);
        y[i] = (int32_t)((i * 53 + 5) % 256);
    }
    nl_model_zero_grad(m);
    assert_int_equal(nl_model_forward(m, x, y, B, T, mean), NL_OK);
    memcpy(logits, m->train->a.logits, (size_t)(B * T * m->V) * sizeof(float));
    memcpy(losses, m->train->a.losses, (size_t)(B * T) * sizeof(float));
    assert_int_equal(nl_model_backward(m), NL_OK);
    memcpy(grads, m->train->grads, m->n_params * sizeof(float));
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

/* nl_tile_gemm (1 to 6 rows, strided A, alpha, acc) and nl_tile_transpose against double sums. */
static void test_tile_gemm_sums(void **state) {
    (void)state;
    enum { K = 40, N = 32, LD = 48 };
    static float a[6 * K * 7], b[K * LD], c[6 * LD], c0[6 * LD], xt[N * 8];
    for (int i = 0; i < 6 * K * 7; i++) a[i] = (float)((i * 37 % 101) - 50) * 0.02f;
    for (int i = 0; i < K * LD; i++) b[i] = (float)((i * 53 % 97) - 48) * 0.03f;
    for (int i = 0; i < 6 * LD; i++) c0[i] = (float)(i % 13) - 6.0f;
    for (int tr = 0; tr < 2; tr++)
        for (int acc = 0; acc < 2; acc++)
            for (int m = 1; m <= 6; m++) {
                int64_t ars = tr ? 1 : K, acs = tr ? 7 : 1; /* tr: A read down columns of a wider matrix */
                memcpy(c, c0, sizeof c);
                nl_tile_gemm(c, LD, m, a, ars, acs, b, LD, N, K, 0.5f, acc);
                for (int i = 0; i < 6; i++)
                    for (int j = 0; j < LD; j++) {
                        double s = 0;
                        for (int k = 0; k < K; k++) s += (double)a[i * ars + k * acs] * b[k * LD + j];
                        double want = j < N && i < m ? 0.5 * s + (acc ? c0[i * LD + j] : 0.0) : c0[i * LD + j];
                        if (fabs(c[i * LD + j] - want) > 1e-5 * (1.0 + fabs(want)))
                            fail_msg("tile (m %d tr %d acc %d) [%d][%d]: %g, want %g", m, tr, acc, i, j, c[i * LD + j],
                                     want);
                    }
            }
    for (int rows = 8; rows <= 16; rows += 3) { /* 8: 8 x 8 blocks; 11, 14: the other loop */
        nl_tile_transpose(xt, b, rows, 8, LD);
        for (int t = 0; t < rows; t++)
            for (int d = 0; d < 8; d++) assert_true(xt[d * rows + t] == b[t * LD + d]);
    }
}

/* nl_vsoftmax_prefix: every prefix length of a 24-wide row against a double softmax; zeros after. */
static void test_softmax_prefix(void **state) {
    (void)state;
    enum { LEN = 24 };
    float a[LEN];
    for (int n = 1; n <= LEN; n++) {
        for (int i = 0; i < LEN; i++) a[i] = (float)((i * 29 % 23) - 11) * (i >= n ? 50.0f : 0.7f);
        double mx = -INFINITY, sum = 0, e[LEN];
        for (int i = 0; i < n; i++) mx = a[i] > mx ? a[i] : mx;
        for (int i = 0; i < n; i++) sum += e[i] = exp(a[i] - mx);
        nl_vsoftmax_prefix(a, n, LEN);
        for (int i = 0; i < LEN; i++) {
            double want = i < n ? e[i] / sum : 0.0;
            if (fabs(a[i] - want) > 1e-6) fail_msg("softmax prefix %d [%d]: %g, want %g", n, i, a[i], want);
        }
    }
}

/* The attention on the AVX2 tiles against the OpenBLAS path (NANOLM_ISA capped at scalar): out,
 * the probabilities and d qkv, for MHA at head size 32 and GQA at 16. Under a scalar cap both
 * runs take the OpenBLAS path. */
static void attention_pair(int64_t B, int64_t T, int64_t NH, int64_t KVH, int64_t hd) {
    int64_t QKV = (NH + 2 * KVH) * hd, nq = B * T * QKV, no = B * T * NH * hd, na = B * NH * T * T;
    float *qkv = malloc((size_t)nq * sizeof(float)), *dout = malloc((size_t)no * sizeof(float));
    float *out[2], *att[2], *dq[2], *datt = malloc((size_t)na * sizeof(float));
    for (int64_t i = 0; i < nq; i++) qkv[i] = (float)((i * 7919 % 2003) - 1001) * 0.002f;
    for (int64_t i = 0; i < no; i++) dout[i] = (float)((i * 4099 % 1009) - 504) * 0.004f;
    for (int r = 0; r < 2; r++) {
        out[r] = malloc((size_t)no * sizeof(float)), att[r] = malloc((size_t)na * sizeof(float));
        dq[r] = malloc((size_t)nq * sizeof(float));
        nl_isa_set_cap(r ? NL_ISA_SCALAR : NL_ISA_COUNT);
        nl_attention_forward(out[r], att[r], qkv, B, T, NH, KVH, hd);
        nl_attention_backward(dq[r], datt, dout, att[r], qkv, B, T, NH, KVH, hd);
    }
    nl_isa_set_cap(NL_ISA_COUNT);
    struct {
        const char *name;
        float **x;
        int64_t n;
    } cmp[] = {{"out", out, no}, {"att", att, na}, {"dqkv", dq, nq}};
    for (int c = 0; c < 3; c++) {
        double mx = 0;
        for (int64_t i = 0; i < cmp[c].n; i++) mx = fmax(mx, fabs(cmp[c].x[1][i]));
        for (int64_t i = 0; i < cmp[c].n; i++)
            if (fabs(cmp[c].x[0][i] - cmp[c].x[1][i]) > 1e-5 * mx + 1e-7)
                fail_msg("attention T %lld hd %lld %s[%lld]: tiles %g, OpenBLAS %g", (long long)T, (long long)hd,
                         cmp[c].name, (long long)i, cmp[c].x[0][i], cmp[c].x[1][i]);
    }
    for (int r = 0; r < 2; r++) free(out[r]), free(att[r]), free(dq[r]);
    free(qkv), free(dout), free(datt);
}

static void test_tiled_attention_matches(void **state) {
    (void)state;
    attention_pair(2, 64, 4, 4, 32);
    attention_pair(3, 48, 4, 2, 16);
    attention_pair(1, 20, 2, 1, 16); /* T not a multiple of 16: both take the OpenBLAS path */
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
    /* bench machine's ceilings: the widest path's FMA peak and sgemm, on one thread and on two */
    nl_peak_ceilings c;
    assert_int_equal(nl_peak_ceilings_measure(2, 1e-3, 1, &c), NL_OK);
    assert_int_equal(c.path, nl_peak_auto());
    assert_true(c.fma_1t > 0 && c.fma_nt > 0 && c.sgemm_1t > 0 && c.sgemm_nt > 0);
    assert_int_equal(nl_peak_ceilings_measure(2, 0, 1, &c), NL_ERR_INVALID); /* nl_peak_fma's own check */
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
        cmocka_unit_test(test_step_prof_adds_up),       cmocka_unit_test(test_tile_gemm_sums),
        cmocka_unit_test(test_softmax_prefix),          cmocka_unit_test(test_tiled_attention_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
