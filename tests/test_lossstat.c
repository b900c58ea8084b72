/* Batch-means standard error of a mean loss: coverage of the 95% interval on synthetic AR(1)
 * loss streams with a known mean, variance and autocorrelation; the i.i.d. interval must
 * under-cover there, and the batch-means variance must match the known long-run variance. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/lossstat.h"

/* x_t = mu + e_t, e_t = phi e_{t-1} + sqrt(1 - phi^2) sigma z_t (stationary: var sigma^2,
 * long-run variance sigma^2 (1 + phi) / (1 - phi)). */
static void ar1(nl_rng *rng, float *x, int64_t n, double mu, double sigma, double phi) {
    double e = nl_rng_normal(rng) * sigma;
    double s = sqrt(1 - phi * phi) * sigma;
    for (int64_t i = 0; i < n; i++) {
        x[i] = (float)(mu + e);
        e = phi * e + s * nl_rng_normal(rng);
    }
}

static void coverage(double phi, int64_t n, int reps, double *cover_bm, double *cover_iid, double *lrv_ratio) {
    const double mu = 1.5, sigma = 0.8;
    float *x = malloc((size_t)n * sizeof(float));
    nl_rng rng;
    nl_rng_seed(&rng, 42 + (uint64_t)(phi * 1000));
    int hit = 0, hit_iid = 0;
    double lrv = 0;
    for (int r = 0; r < reps; r++) {
        ar1(&rng, x, n, mu, sigma, phi);
        nl_loss_stats s;
        assert_int_equal(nl_loss_stats_compute(x, n, 0, &s), NL_OK);
        hit += s.ci_lo <= mu && mu <= s.ci_hi;
        double t = nl_student_t975((double)(s.n_batches - 1));
        hit_iid += fabs(s.mean - mu) <= t * s.se_iid;
        lrv += s.se * s.se * (double)s.n;
    }
    free(x);
    *cover_bm = (double)hit / reps;
    *cover_iid = (double)hit_iid / reps;
    *lrv_ratio = lrv / reps / (sigma * sigma * (1 + phi) / (1 - phi));
}

static void test_ar1_coverage(void **state) {
    (void)state;
    double cov, cov_iid, ratio;
    /* strongly correlated: correlation length ~ (1+phi)/(1-phi) = 9 tokens */
    coverage(0.8, 20000, 1000, &cov, &cov_iid, &ratio);
    print_message("phi 0.8: batch-means coverage %.3f, iid coverage %.3f, long-run variance ratio %.3f\n", cov, cov_iid,
                  ratio);
    assert_true(cov >= 0.92 && cov <= 0.98);
    assert_true(cov_iid < 0.60);
    assert_true(ratio > 0.85 && ratio < 1.10);
    /* independent tokens: both intervals are right */
    coverage(0.0, 20000, 1000, &cov, &cov_iid, &ratio);
    print_message("phi 0.0: batch-means coverage %.3f, iid coverage %.3f, long-run variance ratio %.3f\n", cov, cov_iid,
                  ratio);
    assert_true(cov >= 0.92 && cov <= 0.975);
    assert_true(cov_iid >= 0.92 && cov_iid <= 0.975);
    assert_true(ratio > 0.9 && ratio < 1.1);
}

static void test_tokens_for_se(void **state) {
    (void)state;
    /* the tokens needed for a target SE, predicted from a short stream, give that SE on a long one */
    nl_rng rng;
    nl_rng_seed(&rng, 7);
    int64_t n0 = 10000;
    float *x = malloc(400000 * sizeof(float));
    ar1(&rng, x, n0, 2.0, 1.0, 0.6);
    nl_loss_stats s;
    assert_int_equal(nl_loss_stats_compute(x, n0, 0, &s), NL_OK);
    double need = nl_loss_stats_tokens_for_se(&s, s.se / 4);
    print_message("n %lld se %.5f -> %.0f tokens for se/4\n", (long long)n0, s.se, need);
    assert_true(need > 12 * n0 && need < 20 * n0);
    /* the true SE at `need` tokens: sqrt(lrv / need), lrv = (1 + 0.6) / (1 - 0.6) = 4 */
    double true_se = sqrt(4.0 / need);
    assert_true(fabs(true_se / (s.se / 4) - 1) < 0.25);
    assert_true(isnan(nl_loss_stats_tokens_for_se(&s, 0)));
    free(x);
}

static void test_t_quantile_and_errors(void **state) {
    (void)state;
    /* tabulated t(0.975): df 10 -> 2.2281, df 30 -> 2.0423, df 100 -> 1.9840 */
    assert_true(fabs(nl_student_t975(10) - 2.2281) < 2e-3);
    assert_true(fabs(nl_student_t975(30) - 2.0423) < 1e-3);
    assert_true(fabs(nl_student_t975(100) - 1.9840) < 1e-3);
    float x[5] = {1, 2, 3, 4, 5};
    nl_loss_stats s;
    assert_int_equal(nl_loss_stats_compute(x, 5, 3, &s), NL_ERR_INVALID);
    x[1] = NAN;
    assert_int_equal(nl_loss_stats_compute(x, 5, 2, &s), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "token 1"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ar1_coverage),
        cmocka_unit_test(test_tokens_for_se),
        cmocka_unit_test(test_t_quantile_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
