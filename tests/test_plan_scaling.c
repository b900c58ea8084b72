/* plan/ scaling laws: the course's numbers, Chinchilla's Table 3, over-training, the fit. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/scaling.h"

/* x rounds to v at the course's precision `unit` (half a unit either side). */
#define ROUNDS_TO(x, v, unit) assert_true(fabs((double)(x) - (double)(v)) <= 0.5 * (unit) + 1e-9 * fabs((double)(v)))

static void test_course_1b(void **state) {
    (void)state;
    double n, d;
    /* 1B parameters -> 20B tokens -> 1.2e20 FLOPs -> ~84 H100-hours at 40% MFU. */
    n = 1e9;
    d = 20 * n;
    double c = 6 * n * d;
    ROUNDS_TO(d / 1e9, 20, 1);
    ROUNDS_TO(c / 1e20, 1.2, 0.1);
    ROUNDS_TO(c / (989e12 * 0.4) / 3600, 84, 1);
    /* The rule inverted from the budget gives the same model back. */
    nl_scaling_rule(20, 1.2e20, &n, &d);
    ROUNDS_TO(n / 1e9, 1.0, 0.01);
    ROUNDS_TO(d / 1e9, 20, 0.1);
}

static void test_course_llama3_overtrain(void **state) {
    (void)state;
    nl_chinchilla law;
    nl_scaling_hoffmann(&law);
    nl_overtrain o;
    /* Llama-3-8B (8.03B parameters) on ~15T tokens: ~1900 tokens/param, almost 100x the optimum. */
    assert_int_equal(nl_scaling_overtrain(&law, 8.03e9, 15e12, 20, &o), NL_OK);
    ROUNDS_TO(o.tokens_per_param, 1900, 100);
    assert_true(o.multiple_of_rule > 90 && o.multiple_of_rule < 100);
    /* Same loss, compute-optimal: a bigger model on fewer tokens, cheaper to train. */
    assert_true(o.opt_params > 8.03e9);
    assert_true(o.opt_flops < o.flops);
    assert_true(fabs(nl_scaling_loss(&law, o.opt_params, o.opt_tokens) - o.loss) < 1e-9);
    /* Break-even: the training compute saved pays for (N* - N) * 2 FLOPs per served token. */
    assert_true(fabs(o.breakeven_tokens * 2 * (o.opt_params - 8.03e9) - (o.flops - o.opt_flops)) < 1e-6 * o.flops);
    /* A model at its own optimum needs no extra compute. */
    double n, d;
    nl_scaling_optimal_law(&law, 1e22, &n, &d);
    assert_int_equal(nl_scaling_overtrain(&law, n, d, 20, &o), NL_OK);
    assert_true(fabs(o.extra_flops_frac) < 1e-6);
    /* Bad input names it. */
    assert_int_equal(nl_scaling_overtrain(&law, -1, 1e9, 20, &o), NL_ERR_INVALID);
}

static void test_chinchilla_table3(void **state) {
    (void)state;
    /* Hoffmann et al. 2022 Table 3 (approach 1): 1B -> 1.21e20 FLOPs, 20.2B tokens; 10B ->
     * 1.23e22, 205.1B. The FLOPs are printed to 3 digits, so tokens = C/6N carry +-0.4%. */
    nl_powerlaw pn, pd;
    nl_scaling_approach1(&pn, &pd);
    assert_true(fabs(pn.a - 0.5) < 0.01); /* the paper: a = 0.50 */
    double c1 = pow(1e9 / pn.k, 1 / pn.a), c10 = pow(10e9 / pn.k, 1 / pn.a);
    ROUNDS_TO(c1 / 1e20, 1.21, 0.01);
    ROUNDS_TO(c1 / 6e9 / 1e9, 20.2, 0.1);
    ROUNDS_TO(c10 / 1e22, 1.23, 0.01);
    assert_true(fabs(c10 / 6e10 / 205.1e9 - 1) < 0.005);
    /* Gopher's budget, 5.76e23 FLOPs: the law gives ~67B parameters. (The paper's row also says
     * 1.5T tokens, but 6 * 67e9 * 1.5e12 = 6.03e23, not 5.76e23: that row is not C = 6ND; the
     * law through the other rows gives 1.42T tokens.) */
    double n67 = pn.k * pow(5.76e23, pn.a);
    assert_true(fabs(n67 / 67e9 - 1) < 0.015);
    double d67 = 5.76e23 / (6 * n67);
    assert_true(d67 > 1.35e12 && d67 < 1.5e12);
}

static void test_approach3_constants(void **state) {
    (void)state;
    nl_chinchilla u, r;
    nl_scaling_hoffmann(&u);
    nl_scaling_hoffmann_rounded(&r);
    /* Closed form agrees with a brute-force minimisation along C = 6ND. */
    double c = 1e23, n, d, best = INFINITY, bn = 0;
    nl_scaling_optimal_law(&u, c, &n, &d);
    for (double ln = log(1e8); ln < log(1e12); ln += 1e-4) {
        double nn = exp(ln), l = nl_scaling_loss(&u, nn, c / (6 * nn));
        if (l < best) {
            best = l;
            bn = nn;
        }
    }
    assert_true(fabs(bn / n - 1) < 1e-3);
    assert_true(fabs(nl_scaling_flops_for_params(&u, n) / c - 1) < 1e-9);
    /* The rounded constants put the optimum for 67B parameters ~1.7x further in tokens. */
    double cu = nl_scaling_flops_for_params(&u, 67e9), cr = nl_scaling_flops_for_params(&r, 67e9);
    ROUNDS_TO(cr / cu, 1.7, 0.1);
    /* Kaplan: 1 PF-day -> 1.3B parameters. */
    assert_true(fabs(nl_scaling_kaplan_params(8.64e19) - 1.3e9) < 1);
}

/* Synthetic observations from a known law with multiplicative noise. */
static size_t synth(nl_scaling_obs *o, const nl_chinchilla *law, double sigma, uint64_t seed) {
    nl_rng rng;
    nl_rng_seed(&rng, seed);
    size_t n = 0;
    for (double N = 1e7; N <= 3e10; N *= 2.7)
        for (double r = 2; r <= 400; r *= 2.3) {
            double D = r * N;
            o[n].n_params = N;
            o[n].n_tokens = D;
            o[n].loss = nl_scaling_loss(law, N, D) * exp(sigma * nl_rng_normal(&rng));
            n++;
        }
    return n;
}

/* Approach 3's optimum term by term: the same N and D as nl_scaling_optimal_law, on the budget,
 * with the optimality condition holding. */
static void test_optimum_terms(void **state) {
    (void)state;
    nl_chinchilla law;
    nl_scaling_hoffmann(&law);
    for (double c = 1e18; c <= 1e25; c *= 100) {
        nl_chinchilla_optimum o;
        nl_scaling_optimum(&law, c, &o);
        double n, d;
        nl_scaling_optimal_law(&law, c, &n, &d);
        assert_true(fabs(o.n / n - 1) < 1e-12 && fabs(o.d / d - 1) < 1e-12);
        assert_true(fabs(6 * o.n * o.d / c - 1) < 1e-12);
        assert_true(fabs(o.a + o.b - 1) < 1e-15);
        assert_true(fabs(o.lhs / o.rhs - 1) < 1e-9);
        assert_true(fabs(nl_scaling_flops_for_params(&law, o.n) / c - 1) < 1e-9);
    }
}

static void test_fit_recovers(void **state) {
    (void)state;
    nl_chinchilla truth;
    nl_scaling_hoffmann(&truth);
    nl_scaling_obs obs[128];
    /* Noise-free: the fit finds the generating parameters. */
    size_t n = synth(obs, &truth, 0, 1);
    assert_true(n >= 40);
    nl_scaling_fit_opts fo = {1e-3, 0, 1};
    nl_scaling_fit_result r;
    assert_int_equal(nl_scaling_fit(obs, n, &fo, &r), NL_OK);
    assert_true(fabs(r.law.alpha - truth.alpha) < 2e-3);
    assert_true(fabs(r.law.beta - truth.beta) < 2e-3);
    assert_true(fabs(r.law.E - truth.E) < 5e-3);
    assert_true(fabs(r.log_a - log(truth.A)) < 2e-2);
    assert_true(fabs(r.log_b - log(truth.B)) < 2e-2);
    /* With 1% noise: estimates within 4 bootstrap standard errors, and the SEs are sensible. */
    n = synth(obs, &truth, 0.01, 7);
    fo.bootstrap = 24;
    assert_int_equal(nl_scaling_fit(obs, n, &fo, &r), NL_OK);
    assert_true(r.se_alpha > 0 && r.se_alpha < 0.1);
    assert_true(r.se_beta > 0 && r.se_beta < 0.1);
    assert_true(fabs(r.law.alpha - truth.alpha) < 4 * r.se_alpha + 0.01);
    assert_true(fabs(r.law.beta - truth.beta) < 4 * r.se_beta + 0.01);
    assert_true(fabs(r.law.E - truth.E) < 4 * r.se_E + 0.02);
    /* Too few rows / bad values are refused with the row named. */
    assert_int_equal(nl_scaling_fit(obs, 3, &fo, &r), NL_ERR_INVALID);
    obs[2].loss = -1;
    assert_int_equal(nl_scaling_fit(obs, n, &fo, &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "row 3"));
}

static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("scaling optimal --params 1B --json", &out), 0);
    assert_non_null(strstr(out, "\"tokens\":\t20000000000"));
    free(out);
    assert_int_equal(tu_run_cli("scaling optimal --flops 1.2e20", &out), 0);
    assert_non_null(strstr(out, "84.26")); /* GPU-hours of the 20-tokens row at 40% MFU */
    free(out);
    /* --explain: the Lagrange derivation with the numbers substituted; its N is approach 3's. */
    assert_int_equal(tu_run_cli("scaling optimal --flops 1e23 --explain", &out), 0);
    assert_non_null(strstr(out, "Lagrangian"));
    assert_non_null(strstr(out, "alpha A N^-alpha = beta B D^-beta"));
    {
        nl_chinchilla law;
        nl_scaling_hoffmann(&law);
        double n3, d3;
        nl_scaling_optimal_law(&law, 1e23, &n3, &d3);
        char want[64];
        snprintf(want, sizeof want, "= %.4g parameters", n3);
        assert_non_null(strstr(out, want));
    }
    free(out);
    /* A CSV written from a known law is fitted back through the command. */
    char *dir = tu_tmpdir();
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/runs.csv", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    nl_chinchilla truth;
    nl_scaling_hoffmann(&truth);
    nl_scaling_obs obs[128];
    size_t n = synth(obs, &truth, 0, 3);
    fprintf(f, "N,FLOPs,loss\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%.17g,%.17g,%.17g\n", obs[i].n_params, 6 * obs[i].n_params * obs[i].n_tokens, obs[i].loss);
    fclose(f);
    snprintf(args, sizeof args, "scaling fit %s --bootstrap 0 --json", path);
    assert_int_equal(tu_run_cli(args, &out), 0);
    char *p = strstr(out, "\"alpha\":");
    assert_non_null(p);
    assert_true(fabs(strtod(p + 8, NULL) - truth.alpha) < 2e-3);
    free(out);
    /* Columns named by the user, extra columns (text included) ignored (issue 16). */
    f = fopen(path, "w");
    fprintf(f, "run,model_params,train_tokens,val_loss,notes\n");
    for (size_t i = 0; i < n; i++)
        fprintf(f, "r%zu,%.17g,%.17g,%.17g,seed %zu\n", i, obs[i].n_params, obs[i].n_tokens, obs[i].loss, i);
    fclose(f);
    snprintf(args, sizeof args, "scaling fit %s --bootstrap 0", path);
    assert_int_equal(tu_run_cli(args, &out), 1);
    assert_non_null(strstr(out, "--n-col"));
    free(out);
    snprintf(args, sizeof args,
             "scaling fit %s --bootstrap 0 --json --n-col model_params --d-col train_tokens --loss-col val_loss", path);
    assert_int_equal(tu_run_cli(args, &out), 0);
    p = strstr(out, "\"alpha\":");
    assert_non_null(p);
    assert_true(fabs(strtod(p + 8, NULL) - truth.alpha) < 2e-3);
    free(out);
    /* Bad CSV: the line is named. */
    f = fopen(path, "w");
    fprintf(f, "N,D,loss\n1e9,2e10,2.5\n1e9,abc,2.4\n");
    fclose(f);
    snprintf(args, sizeof args, "scaling fit %s", path);
    assert_int_equal(tu_run_cli(args, &out), 1);
    assert_non_null(strstr(out, ":3:"));
    free(out);
    tu_rmdir(dir);
    free(dir);
    assert_int_equal(tu_run_cli("scaling optimal --flops 1e20 --params 1e9", &out), 2);
    free(out);
    assert_int_equal(tu_run_cli("scaling optimal --flops banana", &out), 2);
    assert_non_null(strstr(out, "--flops"));
    free(out);
    assert_int_equal(tu_run_cli("scaling optimal --flops 1e20 --gpu z80", &out), 2);
    assert_non_null(strstr(out, "h100")); /* lists the known GPUs */
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_course_1b),         cmocka_unit_test(test_course_llama3_overtrain),
        cmocka_unit_test(test_chinchilla_table3), cmocka_unit_test(test_approach3_constants),
        cmocka_unit_test(test_fit_recovers),      cmocka_unit_test(test_cli),
        cmocka_unit_test(test_optimum_terms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
