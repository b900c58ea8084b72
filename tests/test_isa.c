/* The instruction-set switch (nanolm/isa.h): names, the cap NANOLM_ISA and nl_isa_set_cap, the
 * CLI's refusal of a bad value, and the promise that the paths the docs call exact give the same
 * bits under every cap this CPU allows: matvec in each weight format (fp32 and bf16: one FMA
 * chain per output on every path; int8 and int4: exact int32 sums), the bulk format
 * conversions and the emulated FP8 GEMM. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "nanolm/engine.h"
#include "nanolm/formats.h"
#include "nanolm/fp8.h"
#include "nanolm/isa.h"
#include "nanolm/matvec.h"
#include "nanolm/model.h"
#include "nanolm/qlinear.h"

static void fill(float *x, size_t n, uint64_t seed) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = (float)nl_rng_normal(&r);
}

/* The caps this CPU allows, widest first; returns how many. */
static int caps(nl_isa *out) {
    int n = 0;
    for (int i = NL_ISA_COUNT - 1; i >= 0; i--) {
        nl_isa_set_cap((nl_isa)i);
        if (nl_isa_active() == (nl_isa)i) out[n++] = (nl_isa)i;
    }
    nl_isa_set_cap(NL_ISA_COUNT);
    return n;
}

static void test_names_and_parse(void **state) {
    (void)state;
    nl_isa v;
    for (int i = 0; i < NL_ISA_COUNT; i++) {
        assert_int_equal(nl_isa_parse(nl_isa_name((nl_isa)i), &v), NL_OK);
        assert_int_equal(v, i);
    }
    assert_int_equal(nl_isa_parse("AVX2", &v), NL_OK);
    assert_int_equal(v, NL_ISA_AVX2);
    assert_int_equal(nl_isa_parse("auto", &v), NL_OK);
    assert_int_equal(v, nl_isa_detected());
    assert_int_not_equal(nl_isa_parse("sse9", &v), NL_OK);
    assert_non_null(strstr(nl_last_error(), "sse9"));
    assert_int_not_equal(nl_isa_parse(NULL, &v), NL_OK);
}

static void test_cap_orders_the_sets(void **state) {
    (void)state;
    const nl_isa det = nl_isa_detected();
    assert_true(nl_isa_has(NL_ISA_SCALAR));
    nl_isa_set_cap(NL_ISA_SCALAR);
    assert_int_equal(nl_isa_active(), NL_ISA_SCALAR);
    assert_false(nl_isa_has(NL_ISA_AVX2));
    assert_false(nl_isa_has(NL_ISA_AVX512));
    assert_false(nl_isa_has(NL_ISA_NEON));
    assert_false(nl_mv_available(NL_MV_AVX2));
    assert_false(nl_qdot_available(NL_QDOT_AVX2));
    assert_int_equal(nl_mv_auto(), NL_MV_PORTABLE);
    assert_int_equal(nl_qdot_auto(), NL_QDOT_PORTABLE);
    assert_int_equal(nl_fmt_kernel_auto(NL_FMT_BF16), NL_FMT_KERNEL_PORTABLE);
    /* a cap above the CPU changes nothing */
    nl_isa_set_cap(NL_ISA_AVX512);
    assert_int_equal(nl_isa_active(), det == NL_ISA_NEON ? NL_ISA_SCALAR : det);
    if (det == NL_ISA_AVX512) {
        nl_isa_set_cap(NL_ISA_AVX2);
        assert_int_equal(nl_isa_active(), NL_ISA_AVX2);
        assert_true(nl_mv_available(NL_MV_AVX2));
        assert_false(nl_mv_available(NL_MV_AVX512));
        assert_false(nl_qdot_available(NL_QDOT_VNNI));
        assert_false(nl_isa_has_ext("avx512vnni"));
    }
    if (det == NL_ISA_NEON) { /* aarch64: the NEON kernels, sdot where the CPU has dotprod */
        nl_isa_set_cap(NL_ISA_NEON);
        assert_int_equal(nl_mv_auto(), NL_MV_NEON);
        assert_true(nl_mv_available(NL_MV_NEON));
        print_message("[  INFO    ] NEON, dotprod %s\n", nl_isa_has_ext("dotprod") ? "yes" : "no");
    } else {
        assert_false(nl_mv_available(NL_MV_NEON));
    }
    nl_isa_set_cap(NL_ISA_COUNT);
    assert_int_equal(nl_isa_check_env(), NL_OK); /* ctest runs this with a valid or no NANOLM_ISA */
}

static void test_cli_reports_and_refuses(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_shell("NANOLM_ISA=scalar \"$NANOLM_BIN\" version --json 2>&1", &out), 0);
    assert_non_null(strstr(out, "\"isa\":\t\"scalar\""));
    assert_non_null(strstr(out, "\"isa_detected\""));
    free(out);
    out = NULL;
    assert_int_not_equal(tu_run_shell("NANOLM_ISA=avx1024 \"$NANOLM_BIN\" version 2>&1", &out), 0);
    assert_non_null(strstr(out, "NANOLM_ISA='avx1024'"));
    free(out);
}

/* y of one weight format under cap `cap` (the weight made under that cap, as a program would). */
static void matvec_under(nl_isa cap, nl_wfmt f, const float *w, const float *x, int64_t M, int64_t N, int64_t K,
                         int threads, float *y) {
    nl_isa_set_cap(cap);
    nl_mv_weight wt;
    assert_int_equal(nl_mv_weight_init(&wt, f, w, N, K, 1), NL_OK);
    assert_int_equal(nl_mv_forward(&wt, x, M, y, threads), NL_OK);
    nl_mv_weight_free(&wt);
    nl_isa_set_cap(NL_ISA_COUNT);
}

static void test_matvec_same_bits_under_every_cap(void **state) {
    (void)state;
    nl_isa cs[NL_ISA_COUNT];
    const int nc = caps(cs);
    /* int4's chunks of 16 groups: K = 416 (13 groups, the second 8-group half partial), 768 (24:
     * a chunk and a half), 1504 (47: two chunks and 15 groups) */
    static const int64_t shapes[][3] = {{1, 70, 96},  {5, 97, 130}, {33, 48, 64}, {2, 130, 1001},
                                        {3, 20, 416}, {1, 9, 768},  {5, 11, 1504}};
    static const nl_wfmt fmts[] = {NL_WFMT_FP32, NL_WFMT_BF16, NL_WFMT_INT8, NL_WFMT_INT4};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *w = malloc((size_t)(N * K) * 4), *x = malloc((size_t)(M * K) * 4);
        float *y0 = malloc((size_t)(M * N) * 4), *y = malloc((size_t)(M * N) * 4);
        fill(w, (size_t)(N * K), 11 + si);
        fill(x, (size_t)(M * K), 101 + si);
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
            if (fmts[fi] == NL_WFMT_INT4 && K % 32) continue; /* int4 groups of 32 */
            matvec_under(cs[0], fmts[fi], w, x, M, N, K, 1, y0);
            for (int c = 1; c < nc; c++)
                for (int threads = 1; threads <= 2; threads++) {
                    matvec_under(cs[c], fmts[fi], w, x, M, N, K, threads, y);
                    if (memcmp(y, y0, (size_t)(M * N) * 4)) {
                        fail_msg("matvec %s %lldx%lldx%lld: %s differs from %s", nl_wfmt_name(fmts[fi]), (long long)M,
                                 (long long)N, (long long)K, nl_isa_name(cs[c]), nl_isa_name(cs[0]));
                    }
                }
        }
        free(w), free(x), free(y0), free(y);
    }
}

/* Tokens of 3 requests (greedy, and sampled at temperature 1 with a seed: a last-bit change of a
 * logit can move a draw across a boundary) of 40 tokens each from a small random model in
 * weight format f under cap `cap`, written to out (3 x 40). */
static void generate_under(nl_isa cap, const nl_model *m, nl_wfmt f, int32_t *out) {
    nl_isa_set_cap(cap);
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.weights = f;
    o.threads = 2;
    nl_engine *e;
    assert_int_equal(nl_engine_open_model(&e, m, NULL, &o), NL_OK);
    uint64_t ids[3];
    for (int r = 0; r < 3; r++) {
        int32_t prompt[7];
        for (int j = 0; j < 7; j++) prompt[j] = (int32_t)((r * 53 + j * 11) % 256);
        nl_sampling s;
        nl_sampling_default(&s);
        s.temperature = r == 0 ? 0.0f : 1.0f;
        s.seed = (uint64_t)(r + 1);
        s.max_tokens = 40;
        s.ignore_eos = 1;
        assert_int_equal(nl_engine_submit(e, prompt, 7, &s, &ids[r]), NL_OK);
    }
    while (nl_engine_busy(e)) assert_int_equal(nl_engine_step(e, NULL), NL_OK);
    for (int r = 0; r < 3; r++) {
        nl_engine_output res;
        memset(&res, 0, sizeof res);
        assert_int_equal(nl_engine_read(e, ids[r], 1, &res), NL_OK);
        assert_int_equal(res.n_tokens, 40);
        memcpy(out + r * 40, res.tokens, 40 * sizeof(int32_t));
        nl_engine_output_free(&res);
    }
    nl_engine_close(e);
    nl_isa_set_cap(NL_ISA_COUNT);
}

/* The serving engine generates the same tokens under every cap, in every weight format. */
static void test_generation_same_under_every_cap(void **state) {
    (void)state;
    nl_isa cs[NL_ISA_COUNT];
    const int nc = caps(cs);
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "isa-test");
    a.vocab_size = 256;
    a.dim = 96;
    a.n_layers = 2;
    a.n_heads = 4;
    a.n_kv_heads = 2;
    a.hidden_dim = 160;
    a.seq_len = 64;
    a.rope_theta = 10000;
    a.norm_eps = 1e-5;
    a.tied_embeddings = 1;
    nl_model m;
    assert_int_equal(nl_model_init(&m, &a), NL_OK);
    nl_model_init_random(&m, 7);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] *= 20.0f; /* peaked logits: varied text */
    int32_t t0[120], t1[120];
    for (int f = NL_WFMT_FP32; f < NL_WFMT_COUNT; f++) {
        generate_under(cs[0], &m, (nl_wfmt)f, t0);
        for (int c = 1; c < nc; c++) {
            generate_under(cs[c], &m, (nl_wfmt)f, t1);
            if (memcmp(t0, t1, sizeof t0))
                fail_msg("generation in %s: %s differs from %s", nl_wfmt_name((nl_wfmt)f), nl_isa_name(cs[c]),
                         nl_isa_name(cs[0]));
        }
    }
    nl_model_free(&m);
}

static void test_formats_same_bits_under_every_cap(void **state) {
    (void)state;
    nl_isa cs[NL_ISA_COUNT];
    const int nc = caps(cs);
    enum { n = 4099 };
    float *x = malloc(n * 4);
    fill(x, n, 7);
    for (int i = 0; i < n; i += 97) x[i] *= 1e-39f; /* subnormals */
    x[5] = 1.0f / 0.0f;
    x[6] = -x[5];
    static const nl_format fs[] = {NL_FMT_BF16, NL_FMT_FP16, NL_FMT_E4M3, NL_FMT_E5M2};
    uint32_t *c0 = calloc(n, 4), *c1 = calloc(n, 4);
    for (size_t fi = 0; fi < sizeof fs / sizeof fs[0]; fi++) {
        nl_isa_set_cap(cs[0]);
        nl_status s0 = nl_fmt_encode_array(fs[fi], x, n, c0);
        for (int c = 1; c < nc; c++) {
            nl_isa_set_cap(cs[c]);
            assert_int_equal(nl_fmt_encode_array(fs[fi], x, n, c1), s0);
            if (s0 == NL_OK) assert_memory_equal(c0, c1, n * 4);
        }
        nl_isa_set_cap(NL_ISA_COUNT);
    }
    free(x), free(c0), free(c1);
}

static void test_fp8_gemm_same_bits_under_every_cap(void **state) {
    (void)state;
    nl_isa cs[NL_ISA_COUNT];
    const int nc = caps(cs);
    const int64_t M = 7, N = 37, K = 256;
    float *A = malloc(M * K * 4), *B = malloc(K * N * 4), *C0 = malloc(M * N * 4), *C = malloc(M * N * 4);
    fill(A, M * K, 3);
    fill(B, K * N, 4);
    nl_fp8_gemm_opts o;
    memset(&o, 0, sizeof o);
    o.fmt_a = NL_FMT_E4M3;
    o.fmt_b = NL_FMT_E4M3;
    o.scaling = NL_FP8_SCALE_BLOCK;
    o.acc.bits = 14;
    o.acc.promote = 128;
    nl_isa_set_cap(cs[0]);
    assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C0, NULL), NL_OK);
    for (int c = 1; c < nc; c++) {
        nl_isa_set_cap(cs[c]);
        assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C, NULL), NL_OK);
        assert_memory_equal(C0, C, M * N * 4);
    }
    nl_isa_set_cap(NL_ISA_COUNT);
    free(A), free(B), free(C0), free(C);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_parse),
        cmocka_unit_test(test_cap_orders_the_sets),
        cmocka_unit_test(test_cli_reports_and_refuses),
        cmocka_unit_test(test_matvec_same_bits_under_every_cap),
        cmocka_unit_test(test_generation_same_under_every_cap),
        cmocka_unit_test(test_formats_same_bits_under_every_cap),
        cmocka_unit_test(test_fp8_gemm_same_bits_under_every_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
