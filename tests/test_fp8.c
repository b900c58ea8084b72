/* numerics/fp8: the limited accumulator (course example, hand cases, DeepSeek-V3's K = 4096
 * effect), scaling recipes (outlier channel, Transformer Engine's delayed rule and its failure,
 * MX's E8M0 rule), partial blocks, transposes, bad input, and the CLI. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/fp8.h"

/* ---- accumulator -------------------------------------------------------------------------- */

static float acc_sum(int bits, int group, int promote, nl_fp8_acc_round r, const double *t, int64_t n) {
    nl_fp8_acc acc = {bits, group, promote, r};
    float s = -1.0f;
    assert_int_equal(nl_fp8_acc_sum(&acc, t, n, &s), NL_OK);
    return s;
}

/* The course (week 14): in E4M3 the neighbours of 64 are 8 apart, so 64 + 3 = 64; summing 100
 * threes and rounding to E4M3 after every step sticks at 64; promoting to fp32 every 8 terms
 * gives exactly 300. A k = 4 (E4M3's 1 + 3 significand bits) accumulator with round-to-nearest,
 * one term per group, is exactly "round the sum to E4M3 after each step". */
static void test_course_hundred_threes(void **state) {
    (void)state;
    double t[100];
    for (int i = 0; i < 100; i++) t[i] = 3.0;
    assert_true(acc_sum(4, 1, 0, NL_FP8_ACC_NEAREST, t, 100) == 64.0f);
    assert_true(acc_sum(4, 1, 8, NL_FP8_ACC_NEAREST, t, 100) == 300.0f);
    assert_true(acc_sum(0, 1, 0, NL_FP8_ACC_TRUNCATE, t, 100) == 300.0f);
    /* The truncating (tensor-core) model with k = 4 sticks even earlier, by hand: each 3 is
     * exact in its own group (e = 1, unit 1/2: 6 units fit in [-8, 7]); the 4-bit register,
     * truncating toward zero, holds 3 6 9 12 15 18 exactly, then 21 -> 20, 23 -> 22, ...,
     * 31 -> 30, 33 -> 32, and from 32 on (unit 4) 35 -> 32. */
    assert_true(acc_sum(4, 1, 0, NL_FP8_ACC_TRUNCATE, t, 100) == 32.0f);
    /* With promotion every 8 the chunks are 3..18 exact then 21 -> 20, 23 -> 22: 22 per 8 terms:
     * 12 chunks of 22 plus 4 threes (12) = 276. */
    assert_true(acc_sum(4, 1, 8, NL_FP8_ACC_TRUNCATE, t, 100) == 276.0f);
}

/* Hand cases of alignment and truncation (k = 4: a product is kept as a 4-bit two's-complement
 * integer of units 2^(e-2), i.e. in [-8, 7] units; the register keeps 4 significant bits). */
static void test_acc_alignment_by_hand(void **state) {
    (void)state;
    /* group {16, 1}: e = 4, unit 4: 16 -> 4 units, 1 -> floor(0.25) = 0 -> 16; then the group
     * {1}: exact; the register 16 + 1 = 17 = 10001b truncates to 4 bits -> 16. fp32: 18. */
    const double a[3] = {16.0, 1.0, 1.0};
    assert_true(acc_sum(4, 2, 0, NL_FP8_ACC_TRUNCATE, a, 3) == 16.0f);
    /* negative: the sign-filling shift floors -0.25 units to -1 unit = -4, so the first group
     * gives -16 - 4 = -20 (10100b, exact in 4 bits); then -20 - 1 = -21 truncates toward zero
     * to -20. Floor is not symmetric: the positive case gave 16. */
    const double an[3] = {-16.0, -1.0, -1.0};
    assert_true(acc_sum(4, 2, 0, NL_FP8_ACC_TRUNCATE, an, 3) == -20.0f);
    /* all three in one group: 16 + 0 + 0 */
    assert_true(acc_sum(4, 3, 0, NL_FP8_ACC_TRUNCATE, a, 3) == 16.0f);
    /* 7.5 = 111.1b needs 4 magnitude bits + a sign bit: with e = 2 (unit 1) it floors to 7 */
    const double b[2] = {7.5, 0.25};
    assert_true(acc_sum(4, 2, 0, NL_FP8_ACC_TRUNCATE, b, 2) == 7.0f);
    /* k = 24 keeps these exactly */
    assert_true(acc_sum(24, 2, 0, NL_FP8_ACC_TRUNCATE, a, 3) == 18.0f);
    /* 15 and 14 in one group: e = 3, unit 2: 15 -> 7 (floor 7.5), 14 -> 7: 28 */
    const double c[2] = {15.0, 14.0};
    assert_true(acc_sum(4, 2, 0, NL_FP8_ACC_TRUNCATE, c, 2) == 28.0f);
    /* nearest: 29 is a tie between 28 and 30 (29/2 = 14.5) -> even 14 -> 28 */
    assert_true(acc_sum(4, 2, 0, NL_FP8_ACC_NEAREST, c, 2) == 28.0f);
}

/* k = 14 (DeepSeek-V3's H800): products aligned to the group's largest exponent e become
 * 14-bit two's-complement integers of unit 2^(e-12) by floor (sign-filling right shift);
 * the register keeps 14 significant bits and truncates toward zero. */
static void test_acc14_rounding_semantics(void **state) {
    (void)state;
    const double u = ldexp(1.0, -12); /* the product unit when e = 0 */
    /* a tiny product next to a big one: positive vanishes, negative becomes -1 unit */
    const double t1[2] = {1.0, ldexp(1.0, -20)}, t2[2] = {1.0, -ldexp(1.0, -20)};
    const double t3[2] = {-1.0, -ldexp(1.0, -20)}, t4[2] = {-1.0, ldexp(1.0, -20)};
    assert_true(acc_sum(14, 32, 0, NL_FP8_ACC_TRUNCATE, t1, 2) == 1.0f);
    assert_true(acc_sum(14, 32, 0, NL_FP8_ACC_TRUNCATE, t2, 2) == (float)(1.0 - u));
    assert_true(acc_sum(14, 32, 0, NL_FP8_ACC_TRUNCATE, t3, 2) == (float)(-1.0 - u));
    assert_true(acc_sum(14, 32, 0, NL_FP8_ACC_TRUNCATE, t4, 2) == -1.0f);
    /* a product of -1.25 units floors away from zero to -2 units (toward zero would be -1) */
    const double t5[2] = {1.0, -1.25 * u};
    assert_true(acc_sum(14, 32, 0, NL_FP8_ACC_TRUNCATE, t5, 2) == (float)(1.0 - 2 * u));
    /* the largest product keeps 13 bits below its sign: 2 - 2^-12 is exact, so is 1 + 2^-12 */
    const double t6[2] = {2.0 - u, 1.0 + u};
    assert_true(acc_sum(14, 32, 0, NL_FP8_ACC_TRUNCATE, t6, 2) == (float)(3.0));
    /* the register: 14 significant bits, truncation toward zero when a group sum is added
     * (groups of 1, so every product is exact on its own) */
    const double r1[2] = {1.5, -ldexp(1.0, -20)}, r2[2] = {1.5, ldexp(1.0, -20)};
    const double r3[2] = {-1.5, ldexp(1.0, -20)}, r4[2] = {1.5, -ldexp(1.0, -100)};
    assert_true(acc_sum(14, 1, 0, NL_FP8_ACC_TRUNCATE, r1, 2) == (float)(1.5 - ldexp(1.0, -13))); /* -1 ulp */
    assert_true(acc_sum(14, 1, 0, NL_FP8_ACC_TRUNCATE, r2, 2) == 1.5f);
    assert_true(acc_sum(14, 1, 0, NL_FP8_ACC_TRUNCATE, r3, 2) == (float)(-1.5 + ldexp(1.0, -13)));
    assert_true(acc_sum(14, 1, 0, NL_FP8_ACC_TRUNCATE, r4, 2) == (float)(1.5 - ldexp(1.0, -13)));
    /* at a power of two the step below is the finer ulp of the lower binade */
    const double r5[2] = {2.0, -ldexp(1.0, -30)};
    assert_true(acc_sum(14, 1, 0, NL_FP8_ACC_TRUNCATE, r5, 2) == (float)(2.0 - ldexp(1.0, -13)));
    /* a carry past 14 bits: 16383 * 2^-13 + 2^-13 = 2 exactly; + 3 * 2^-13 truncates */
    const double r6[2] = {16383 * ldexp(1.0, -13), 3 * ldexp(1.0, -13)};
    assert_true(acc_sum(14, 1, 0, NL_FP8_ACC_TRUNCATE, r6, 2) == 2.0f);
    /* promotion every group: the tiny negative product costs 1 unit in its own group only */
    const double p[64] = {[0] = 1.0, [1] = -ldexp(1.0, -20), [32] = 1.0};
    assert_true(acc_sum(14, 32, 32, NL_FP8_ACC_TRUNCATE, p, 64) == (float)(2.0 - u));
}

/* The fast integer kernel against the scalar reference: bit-identical outputs for every
 * scaling, format, group, width and promotion, on operands with zeros, tiny and huge values. */
static void test_fast_kernel_matches_reference(void **state) {
    (void)state;
    const int64_t M = 7, N = 37, K = 300; /* N not a multiple of 16, K not of 32 or 128 */
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
    nl_rng r;
    nl_rng_seed(&r, 99);
    const nl_fp8_acc accs[] = {{14, 32, 0, NL_FP8_ACC_TRUNCATE},   {14, 32, 128, NL_FP8_ACC_TRUNCATE},
                               {14, 32, 32, NL_FP8_ACC_TRUNCATE},  {4, 8, 64, NL_FP8_ACC_TRUNCATE},
                               {24, 64, 128, NL_FP8_ACC_TRUNCATE}, {9, 1, 0, NL_FP8_ACC_TRUNCATE},
                               {2, 16, 16, NL_FP8_ACC_TRUNCATE}};
    const nl_format fmts[2] = {NL_FMT_E4M3, NL_FMT_E5M2};
    int compared = 0;
    for (int dist = 0; dist < 4; dist++) {
        for (int64_t i = 0; i < M * K; i++) {
            double v = dist == 1 ? nl_rng_float(&r) : nl_rng_normal(&r);
            if (dist == 2 && nl_rng_below(&r, 4) == 0) v = 0.0;             /* zeros */
            if (dist == 3) v *= ldexp(1.0, (int)nl_rng_below(&r, 60) - 30); /* 2^-30 .. 2^30 */
            A[i] = (float)v;
        }
        for (int64_t i = 0; i < K * N; i++) {
            double v = dist == 1 ? nl_rng_float(&r) - 0.5 : nl_rng_normal(&r);
            if (dist == 3) v *= ldexp(1.0, (int)nl_rng_below(&r, 60) - 30);
            B[i] = (float)v;
        }
        for (int sc = 0; sc < NL_FP8_SCALE_COUNT; sc++) {
            if (sc == NL_FP8_SCALE_DELAYED) continue;
            for (size_t a = 0; a < sizeof accs / sizeof accs[0]; a++) {
                if (sc == NL_FP8_SCALE_BLOCK && (accs[a].promote == 0 || NL_FP8_BLOCK % accs[a].promote)) continue;
                nl_fp8_gemm_opts o;
                nl_fp8_gemm_opts_default(&o);
                o.scaling = (nl_fp8_scaling)sc;
                o.acc = accs[a];
                o.fmt_a = fmts[a % 2];
                o.fmt_b = fmts[(a / 2) % 2];
                o.reference = 1;
                assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C2, NULL), NL_OK);
                for (int kernel = 0; kernel <= 2; kernel += 2) { /* fastest built, portable */
                    o.reference = kernel;
                    assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C1, NULL), NL_OK);
                    for (int64_t i = 0; i < M * N; i++)
                        if (memcmp(&C1[i], &C2[i], sizeof(float))) {
                            print_message("dist %d scaling %d acc %zu kernel %d: C[%lld] fast %.9g reference %.9g\n",
                                          dist, sc, a, kernel, (long long)i, C1[i], C2[i]);
                            fail();
                        }
                    compared++;
                }
            }
        }
    }
    assert_true(compared > 50);
    /* hand-made: MX blocks of 32 with very different scales; row 0 of A holds 32 ones and then
     * 32 values 2^-40 times larger and negative; B is all ones. With promote 0 the second
     * group's sum (one tiny negative number) reaches the register: the exact sum lies just
     * below 32, and truncation toward zero gives the next 14-bit value below 32. */
    const int64_t k2 = 64, n2 = 16;
    float *A2 = calloc((size_t)k2, sizeof(float)), *B2 = malloc(sizeof(float) * k2 * n2), c2[16], c3[16];
    for (int64_t k = 0; k < k2; k++) A2[k] = k < 32 ? 1.0f : -ldexpf(1.0f, -40);
    for (int64_t i = 0; i < k2 * n2; i++) B2[i] = 1.0f;
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    o.scaling = NL_FP8_SCALE_MX;
    o.acc = (nl_fp8_acc){14, 32, 0, NL_FP8_ACC_TRUNCATE};
    for (int kernel = 0; kernel <= 2; kernel++) {
        o.reference = kernel;
        assert_int_equal(nl_fp8_gemm(&o, 1, n2, k2, A2, B2, kernel ? c3 : c2, NULL), NL_OK);
        for (int w = 0; w < 16; w++) {
            assert_true(c2[w] == 32.0f - ldexpf(1.0f, -9)); /* 14 bits below 32: ulp 2^(4-13) */
            if (kernel) assert_true(c3[w] == c2[w]);
        }
    }
    free(A2);
    free(B2);
    free(A);
    free(B);
    free(C1);
    free(C2);
}

/* Runs the GEMM and returns the errors against fp64 of the FP8 operands (acc) and of the fp32
 * operands (total), as max|C-R|/max|R|. */
typedef struct errs {
    double acc_max, acc_fro, tot_max, tot_fro;
    nl_fp8_stats st;
} errs;

static errs gemm_errors(nl_fp8_scaling sc, nl_fp8_acc acc, int64_t M, int64_t N, int64_t K, const float *A,
                        const float *B) {
    errs e;
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    o.scaling = sc;
    o.acc = acc;
    float *C = malloc(sizeof(float) * (size_t)(M * N));
    float *Ad = malloc(sizeof(float) * (size_t)(M * K)), *Bd = malloc(sizeof(float) * (size_t)(K * N));
    double *ref = malloc(sizeof(double) * (size_t)(M * N)), *refq = malloc(sizeof(double) * (size_t)(M * N));
    assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C, &e.st), NL_OK);
    assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, sc, NULL, M, K, 1, A, Ad, NULL), NL_OK);
    assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, sc, NULL, K, N, 0, B, Bd, NULL), NL_OK);
    nl_fp8_gemm_ref_f64(M, N, K, A, B, ref);
    nl_fp8_gemm_ref_f64(M, N, K, Ad, Bd, refq);
    nl_fp8_rel_error(M * N, C, refq, &e.acc_max, &e.acc_fro);
    nl_fp8_rel_error(M * N, C, ref, &e.tot_max, &e.tot_fro);
    free(C);
    free(Ad);
    free(Bd);
    free(ref);
    free(refq);
    return e;
}

/* dist: 0 = N(0,1), 1 = uniform [0,1), 2 = uniform [-1,1) */
static void random_operands(float *A, float *B, int64_t M, int64_t N, int64_t K, int dist, uint64_t seed) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    for (int64_t i = 0; i < M * K + K * N; i++) {
        const float v = dist == 2 ? 2.0f * nl_rng_float(&r) - 1.0f : dist ? nl_rng_float(&r) : (float)nl_rng_normal(&r);
        if (i < M * K)
            A[i] = v;
        else
            B[i - M * K] = v;
    }
}

/* DeepSeek-V3 §3.3.2: K = 4096, ~14-bit accumulation without promotion -> error of ~2%;
 * promotion every N_C = 128 restores it. What our model of that hardware gives, on three
 * operand distributions. Without promotion the register (14 significant bits, truncated
 * toward zero at each of the K/32 group additions) loses on average about half an ulp,
 * ~2^-14.5 of the partial sum, per addition: ~0.3 % at K = 4096 for every distribution, growing
 * linearly in K. Products of FP8 values have only 8 significant bits, so their own floor to 14
 * bits below the group's largest exponent touches only products < 1/32 of it. */
static void test_deepseek_k4096(void **state) {
    (void)state;
    const int64_t M = 64, N = 64, K = 4096;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    const nl_fp8_acc fp32 = {0, 32, 0, NL_FP8_ACC_TRUNCATE}, never = {14, 32, 0, NL_FP8_ACC_TRUNCATE},
                     prom = {14, 32, 128, NL_FP8_ACC_TRUNCATE};
    const char *names[3] = {"N(0,1)", "uniform[0,1)", "uniform[-1,1)"};
    for (int dist = 0; dist < 3; dist++) {
        random_operands(A, B, M, N, K, dist, 7);
        errs f = gemm_errors(NL_FP8_SCALE_TENSOR, fp32, M, N, K, A, B);
        errs n = gemm_errors(NL_FP8_SCALE_TENSOR, never, M, N, K, A, B);
        errs p = gemm_errors(NL_FP8_SCALE_TENSOR, prom, M, N, K, A, B);
        print_message("%s operands, K=4096: acc err max fp32 %.2e | 14-bit never %.2e | 14-bit every 128 %.2e;"
                      " total err max %.3e | %.3e | %.3e\n",
                      names[dist], f.acc_max, n.acc_max, p.acc_max, f.tot_max, n.tot_max, p.tot_max);
        /* fp32 accumulation of exact FP8 products: fp32 rounding only */
        assert_true(f.acc_max < 2e-6);
        /* never promoted: a few tenths of a percent (the estimate above), far above fp32 */
        assert_true(n.acc_max > 1e-3 && n.acc_max < 1e-2);
        /* promotion every 128: the accumulator error falls by more than 5x ... */
        assert_true(p.acc_max * 5.0 < n.acc_max);
        /* ... and the total error is within 2x of fp32 accumulation */
        assert_true(p.tot_max <= 2.0 * f.tot_max);
        assert_true(p.tot_fro <= 2.0 * f.tot_fro);
    }
    /* the unpromoted error grows ~linearly in K (x8 in K: more than x4 in error); promoted
     * every 128 it stays at the level of one chunk (less than x2) */
    const int64_t Ks = 1024, Kl = 8192;
    float *A2 = malloc(sizeof(float) * M * Kl), *B2 = malloc(sizeof(float) * Kl * N);
    random_operands(A2, B2, M, N, Kl, 1, 8);
    for (int64_t i = 0; i < M; i++) memcpy(A + i * Ks, A2 + i * Kl, sizeof(float) * Ks); /* first Ks columns */
    errs ns = gemm_errors(NL_FP8_SCALE_TENSOR, never, M, N, Ks, A, B2);
    errs nl = gemm_errors(NL_FP8_SCALE_TENSOR, never, M, N, Kl, A2, B2);
    errs ps = gemm_errors(NL_FP8_SCALE_TENSOR, prom, M, N, Ks, A, B2);
    errs pl = gemm_errors(NL_FP8_SCALE_TENSOR, prom, M, N, Kl, A2, B2);
    print_message("uniform[0,1): never promoted K=1024 %.2e, K=8192 %.2e; every 128: %.2e, %.2e\n", ns.acc_max,
                  nl.acc_max, ps.acc_max, pl.acc_max);
    assert_true(nl.acc_max > 4.0 * ns.acc_max);
    assert_true(pl.acc_max < 2.0 * ps.acc_max);
    free(A2);
    free(B2);
    free(A);
    free(B);
}

/* An outlier input channel: column c of A x F, row c of B / F (the exact product unchanged).
 * E4M3 spans ~18 binades: a 100x or 1000x outlier leaves the other values in the normal range
 * under a per-tensor scale (only the smallest values are flushed), so the error barely moves and
 * per-tensor is not reliably worse than per-block there (measured over seeds 1-6: either one
 * wins by ~1-3 %, docs/fp8.md); only the count of flushed values separates them. At 1e4 the
 * bulk reaches E4M3's subnormals (over seeds 1-6 per-tensor's error is 1.18-1.31x per-block's:
 * asserted with margin 1.1), at 1e5 per-tensor loses far more (5-7x: asserted > 3x). */
static void test_outlier_channel(void **state) {
    (void)state;
    const int64_t M = 64, N = 64, K = 1024;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    const nl_fp8_acc prom = {14, 32, 128, NL_FP8_ACC_TRUNCATE};
    random_operands(A, B, M, N, K, 0, 3);
    errs base = gemm_errors(NL_FP8_SCALE_TENSOR, prom, M, N, K, A, B);
    const double factors[4] = {100.0, 1e3, 1e4, 1e5};
    double prev = 1.0;
    for (int f = 0; f < 4; f++) {
        const double F = factors[f] / prev;
        prev = factors[f];
        for (int64_t i = 0; i < M; i++) A[i * K + 5] *= (float)F;
        for (int64_t j = 0; j < N; j++) B[5 * N + j] /= (float)F;
        errs t = gemm_errors(NL_FP8_SCALE_TENSOR, prom, M, N, K, A, B);
        errs b = gemm_errors(NL_FP8_SCALE_BLOCK, prom, M, N, K, A, B);
        print_message("outlier x%g: total err fro tensor %.3e (flushed %lld) | block %.3e (flushed %lld);"
                      " no outlier tensor %.3e\n",
                      factors[f], t.tot_fro, (long long)t.st.a.flushed, b.tot_fro, (long long)b.st.a.flushed,
                      base.tot_fro);
        /* per-tensor loses more values than per-block at every factor */
        assert_true(t.st.a.flushed > 4 * b.st.a.flushed);
        if (f <= 1) {
            assert_true(t.tot_fro < 1.2 * base.tot_fro); /* 100x, 1000x: hardly any effect */
        } else if (f == 2) {
            assert_true(t.tot_fro > 1.1 * b.tot_fro);
        } else {
            assert_true(t.tot_fro > 3.0 * b.tot_fro);
        }
    }
    free(A);
    free(B);
}

/* ---- delayed scaling ------------------------------------------------------------------------- */

/* Transformer Engine's rule, by hand: H = 2, margin 0, E4M3 (448), amaxes 1, 4, 2, 0.5, 0.5:
 * after each step scale = 448 / max(last 2 amaxes): 448, 112, 112, 224, 896; an amax of 0
 * keeps the scale; margin 1 halves it. */
static void test_delayed_te_rule(void **state) {
    (void)state;
    nl_fp8_delayed d;
    assert_int_equal(nl_fp8_delayed_init(&d, 2, 0), NL_OK);
    assert_true(d.scale == 1.0f);
    const float amax[5] = {1.0f, 4.0f, 2.0f, 0.5f, 0.5f};
    const float want[5] = {448.0f, 112.0f, 112.0f, 224.0f, 896.0f};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(nl_fp8_delayed_update(&d, amax[i], 448.0), NL_OK);
        assert_true(d.scale == want[i]);
    }
    nl_fp8_delayed z;
    nl_fp8_delayed_init(&z, 4, 0);
    nl_fp8_delayed_update(&z, 0.0f, 448.0);
    assert_true(z.scale == 1.0f);
    nl_fp8_delayed m;
    nl_fp8_delayed_init(&m, 4, 1);
    nl_fp8_delayed_update(&m, 2.0f, 448.0);
    assert_true(m.scale == 112.0f);
    assert_int_equal(nl_fp8_delayed_update(&m, NAN, 448.0), NL_ERR_INVALID);
    assert_int_equal(nl_fp8_delayed_init(&m, 0, 0), NL_ERR_INVALID);

    /* The same rule through quantization: tensors whose amax follows the script; the scale a
     * call uses is the one the previous calls left (1 for the first). */
    nl_fp8_delayed q;
    nl_fp8_delayed_init(&q, 2, 0);
    const double used[5] = {1.0, 448.0, 112.0, 112.0, 224.0};
    for (int i = 0; i < 5; i++) {
        float x[4] = {0.1f, -amax[i], 0.0f, amax[i] / 2}, out[4];
        nl_fp8_operand_stats st;
        assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_DELAYED, &q, 1, 4, 1, x, out, &st), NL_OK);
        assert_true(st.scale_min == used[i] && st.scale_max == used[i]);
        assert_true(st.amax == amax[i]);
    }
    assert_true(q.scale == 896.0f);
}

/* The failure delayed scaling invites: the history saw amax 1, the new tensor has 100.
 * The scale (448) maps 100 to 44800: it saturates to 448 and comes back as 1.0.
 * Online block scaling of the same tensor keeps it (to E4M3 precision). */
static void test_delayed_outlier_saturates(void **state) {
    (void)state;
    nl_fp8_delayed d;
    nl_fp8_delayed_init(&d, 16, 0);
    float x[256], out[256];
    for (int step = 0; step < 16; step++) {
        for (int i = 0; i < 256; i++) x[i] = (float)(i % 17) / 16.0f - 0.5f; /* amax 0.5 */
        x[3] = 1.0f;                                                         /* amax 1 */
        assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_DELAYED, &d, 2, 128, 1, x, out, NULL), NL_OK);
    }
    assert_true(d.scale == 448.0f);
    x[200] = 100.0f;
    nl_fp8_operand_stats st;
    assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_DELAYED, &d, 2, 128, 1, x, out, &st), NL_OK);
    assert_int_equal(st.saturated, 1);
    assert_true(out[200] == 1.0f);
    assert_true(d.scale == 4.48f); /* the next step has learned */
    assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_BLOCK, NULL, 2, 128, 1, x, out, &st), NL_OK);
    assert_int_equal(st.saturated, 0);
    assert_true(out[200] == 100.0f);
    assert_true(fabsf(out[3] - 1.0f) <= 1.0f / 16); /* E4M3 relative step 2^-3, half = 1/16 */
}

/* ---- MX: E8M0 scales by the OCP rule ---------------------------------------------------------- */
static void test_mx_scale_rule(void **state) {
    (void)state;
    /* one block of 32, amax 1.0: X = floor(log2 1) - 8 = -8, elements x * 256 */
    float x[64], out[64];
    for (int i = 0; i < 64; i++) x[i] = 0.01f * (float)(i % 32) - 0.15f;
    x[7] = 1.0f;  /* block 0 amax 1.0 */
    x[40] = 1.9f; /* block 1 amax 1.9: X = 0 - 8, 1.9 * 256 = 486.4 > 448: saturates */
    nl_fp8_operand_stats st;
    assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_MX, NULL, 1, 64, 1, x, out, &st), NL_OK);
    assert_int_equal(st.saturated, 1);
    assert_true(out[40] == 448.0f / 256.0f);
    assert_true(st.scale_min == 256.0 && st.scale_max == 256.0);
    for (int i = 0; i < 64; i++)
        if (i != 40) assert_true(out[i] == nl_fmt_round(NL_FMT_E4M3, x[i] * 256.0f) / 256.0f);
    /* a second block of 16 (partial, K = 48) gets its own scale */
    float y[48], yo[48];
    for (int i = 0; i < 48; i++) y[i] = i < 32 ? 1.0f : 0.001f;
    assert_int_equal(nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_MX, NULL, 1, 48, 1, y, yo, &st), NL_OK);
    assert_true(st.scale_min == 256.0 && st.scale_max == ldexp(1.0, 18)); /* floor(log2 .001) = -10 */
    assert_true(yo[40] == nl_fmt_round(NL_FMT_E4M3, 0.001f * 262144.0f) / 262144.0f);
}

/* ---- shapes: partial blocks, transposes, accumulate, kernel vs the accumulator API ---------- */
static void test_partial_blocks_and_layouts(void **state) {
    (void)state;
    const int64_t M = 5, N = 130, K = 200; /* K and N are not multiples of 128 */
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *At = malloc(sizeof(float) * M * K), *Bt = malloc(sizeof(float) * K * N);
    float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
    random_operands(A, B, M, N, K, 0, 11);
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++) At[k * M + i] = A[i * K + k];
    for (int64_t k = 0; k < K; k++)
        for (int64_t j = 0; j < N; j++) Bt[j * K + k] = B[k * N + j];
    for (int sc = 0; sc < NL_FP8_SCALE_COUNT; sc++) {
        if (sc == NL_FP8_SCALE_DELAYED) continue;
        nl_fp8_gemm_opts o;
        nl_fp8_gemm_opts_default(&o);
        o.scaling = (nl_fp8_scaling)sc;
        o.acc.bits = 24; /* wide: equals the fp64 reference of the FP8 operands closely */
        assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C1, NULL), NL_OK);
        o.trans_a = o.trans_b = 1;
        assert_int_equal(nl_fp8_gemm(&o, M, N, K, At, Bt, C2, NULL), NL_OK);
        assert_memory_equal(C1, C2, sizeof(float) * M * N);
        o.trans_a = o.trans_b = 0;
        o.accumulate = 1;
        assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C2, NULL), NL_OK);
        for (int64_t i = 0; i < M * N; i++) assert_true(C2[i] == C1[i] + C1[i]);
        /* against fp64 of the dequantized operands (partial blocks have their own scales) */
        float *Ad = malloc(sizeof(float) * M * K), *Bd = malloc(sizeof(float) * K * N);
        double *ref = malloc(sizeof(double) * M * N);
        nl_fp8_quantize(NL_FMT_E4M3, o.scaling, NULL, M, K, 1, A, Ad, NULL);
        nl_fp8_quantize(NL_FMT_E4M3, o.scaling, NULL, K, N, 0, B, Bd, NULL);
        nl_fp8_gemm_ref_f64(M, N, K, Ad, Bd, ref);
        double emax, efro;
        nl_fp8_rel_error(M * N, C1, ref, &emax, &efro);
        assert_true(emax < 1e-5);
        free(Ad);
        free(Bd);
        free(ref);
    }
    /* one output of the MX GEMM (power-of-two scales: products of dequantized values are the
     * kernel's terms) equals the accumulator API on the same products */
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    o.scaling = NL_FP8_SCALE_MX;
    o.acc = (nl_fp8_acc){10, 8, 64, NL_FP8_ACC_TRUNCATE};
    assert_int_equal(nl_fp8_gemm(&o, M, N, K, A, B, C1, NULL), NL_OK);
    float *Ad = malloc(sizeof(float) * M * K), *Bd = malloc(sizeof(float) * K * N);
    nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_MX, NULL, M, K, 1, A, Ad, NULL);
    nl_fp8_quantize(NL_FMT_E4M3, NL_FP8_SCALE_MX, NULL, K, N, 0, B, Bd, NULL);
    double terms[200];
    for (int64_t k = 0; k < K; k++) terms[k] = (double)Ad[2 * K + k] * (double)Bd[k * N + 129];
    float s;
    assert_int_equal(nl_fp8_acc_sum(&o.acc, terms, K, &s), NL_OK);
    assert_true(s == C1[2 * N + 129]);
    free(Ad);
    free(Bd);
    free(A);
    free(B);
    free(At);
    free(Bt);
    free(C1);
    free(C2);
}

/* ---- bad input ---------------------------------------------------------------------------------- */
static void test_bad_input(void **state) {
    (void)state;
    nl_fp8_scaling sc;
    nl_format f;
    assert_int_equal(nl_fp8_scaling_from_name("rowwise", &sc), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "rowwise"));
    assert_int_equal(nl_fp8_scaling_from_name("MX", &sc), NL_OK);
    assert_int_equal(sc, NL_FP8_SCALE_MX);
    assert_int_equal(nl_fp8_format_from_name("bf16", &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bf16"));
    assert_int_equal(nl_fp8_format_from_name("e5m2", &f), NL_OK);

    float A[8 * 4] = {0}, B[4 * 8] = {0}, C[64] = {0};
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 0, A, B, C, NULL), NL_ERR_INVALID);
    o.fmt_b = NL_FMT_BF16;
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bf16"));
    nl_fp8_gemm_opts_default(&o);
    o.acc.promote = 0; /* block scales need promotion */
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "promote"));
    o.acc.promote = 48; /* multiple of group 16 but does not divide 128 */
    o.acc.group = 16;
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    nl_fp8_gemm_opts_default(&o);
    o.acc.promote = 100; /* not a multiple of the group of 32 */
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "group"));
    nl_fp8_gemm_opts_default(&o);
    o.acc.bits = 30;
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    nl_fp8_gemm_opts_default(&o);
    o.scaling = NL_FP8_SCALE_DELAYED; /* no state */
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    nl_fp8_gemm_opts_default(&o);
    o.scaling = (nl_fp8_scaling)17;
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    nl_fp8_gemm_opts_default(&o);
    A[1 * 4 + 2] = NAN;
    C[0] = 5.0f;
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "A[1][2]"));
    assert_true(C[0] == 5.0f); /* untouched */
    A[1 * 4 + 2] = 0.0f;
    B[3 * 8 + 7] = INFINITY;
    assert_int_equal(nl_fp8_gemm(&o, 8, 8, 4, A, B, C, NULL), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "B[3][7]"));
    const double t[2] = {1.0, NAN};
    float s;
    nl_fp8_acc acc = {14, 32, 0, NL_FP8_ACC_TRUNCATE};
    assert_int_equal(nl_fp8_acc_sum(&acc, t, 2, &s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "term 1"));
}

/* ---- CLI ---------------------------------------------------------------------------------------- */
static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    int rc = tu_run_cli("fp8 gemm --m 16 --n 16 --k 256 --json", &out);
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    cJSON *rows = cJSON_GetObjectItem(d, "rows");
    assert_int_equal(cJSON_GetArraySize(rows), 12);
    int skipped = 0;
    cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        /* every row has the same keys (one table): "skipped" is a reason on the skipped row, null elsewhere */
        if (cJSON_IsString(cJSON_GetObjectItem(r, "skipped"))) {
            skipped++;
            continue;
        }
        const double e = cJSON_GetObjectItem(r, "total_err_fro")->valuedouble;
        assert_true(e > 0.0 && e < 0.1);
    }
    assert_int_equal(skipped, 1); /* block scaling without promotion */
    cJSON_Delete(d);
    free(out);

    char *dir = tu_tmpdir(), args[1024], path[300];
    snprintf(path, sizeof path, "%s/sweep.svg", dir);
    snprintf(args, sizeof args, "fp8 gemm --m 8 --n 8 --k 512 --sweep-k --svg %s", path);
    rc = tu_run_cli(args, &out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "14-bit, never promoted"));
    free(out);
    size_t bytes;
    char *svg = tu_read_file(path, &bytes);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "<svg"));
    free(svg);
    /* curves of two training logs (the CSV of nanolm train --log) */
    char csv[300], csv2[300];
    snprintf(csv, sizeof csv, "%s/a.csv", dir);
    snprintf(csv2, sizeof csv2, "%s/b.csv", dir);
    const char *log_a = "step,lr,train_loss,val_loss,grad_norm,loss_scale,skipped,tokens_per_s\n"
                        "1,1e-4,4.5,4.4,1,1,0,100\n2,1e-4,4.0,,1,1,0,100\n3,1e-4,3.5,3.25,1,1,0,100\n";
    assert_int_equal(nl_write_file_atomic(csv, log_a, strlen(log_a)), NL_OK);
    assert_int_equal(nl_write_file_atomic(csv2, "step,lr\n1,2\n", 12), NL_OK);
    snprintf(path, sizeof path, "%s/curves.svg", dir);
    snprintf(args, sizeof args, "fp8 curves --run first=%s --svg %s --json", csv, path);
    rc = tu_run_cli(args, &out);
    assert_int_equal(rc, 0);
    d = cJSON_Parse(out);
    assert_non_null(d);
    cJSON *run0 = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "runs"), 0);
    cJSON *vl = cJSON_GetObjectItem(run0, "val_loss");
    assert_int_equal(cJSON_GetArraySize(vl), 2); /* step 2 has no validation */
    assert_true(cJSON_GetArrayItem(vl, 1)->valuedouble == 3.25);
    cJSON_Delete(d);
    free(out);
    snprintf(args, sizeof args, "fp8 curves --run x=%s", csv2);
    rc = tu_run_cli(args, &out);
    assert_int_equal(rc, 1); /* not a training log: the work failed, one line naming the file */
    assert_non_null(strstr(out, "b.csv"));
    free(out);
    tu_rmdir(dir);
    free(dir);

    const char *bad[] = {"fp8 gemm --scaling rowwise",
                         "fp8 gemm --format bf16",
                         "fp8 gemm --k 128 --outlier 200:10",
                         "fp8 gemm --outlier 3",
                         "fp8 gemm --promote 100",
                         "fp8 gemm --bogus",
                         "fp8 transpose",
                         "fp8 gemm --acc-bits 40",
                         "fp8 curves",
                         "fp8 curves --run nolabel"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = tu_run_cli(bad[i], &out);
        if (rc != 2) print_message("'%s' -> %d: %s\n", bad[i], rc, out);
        assert_int_equal(rc, 2);
        int lines = 0; /* one line that names the problem */
        for (const char *p = out; *p; p++) lines += *p == '\n';
        assert_int_equal(lines, 1);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_course_hundred_threes),
        cmocka_unit_test(test_acc_alignment_by_hand),
        cmocka_unit_test(test_acc14_rounding_semantics),
        cmocka_unit_test(test_fast_kernel_matches_reference),
        cmocka_unit_test(test_deepseek_k4096),
        cmocka_unit_test(test_outlier_channel),
        cmocka_unit_test(test_delayed_te_rule),
        cmocka_unit_test(test_delayed_outlier_saturates),
        cmocka_unit_test(test_mx_scale_rule),
        cmocka_unit_test(test_partial_blocks_and_layouts),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
