/* nl_linfit_fit / nl_linfit_nonneg: the one least-squares line of the library (scaling-law
 * log-log lines, IsoFLOP approach 2, the collectives' alpha-beta model). */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "nanolm/linfit.h"

static void test_exact_line(void **s) {
    (void)s;
    const double x[] = {1, 2, 4, 8, 16}, y[] = {5, 7, 11, 19, 35}; /* y = 3 + 2x */
    nl_linfit f;
    assert_int_equal(nl_linfit_fit(x, y, NULL, 5, &f), NL_OK);
    assert_true(fabs(f.slope - 2) < 1e-12);
    assert_true(fabs(f.intercept - 3) < 1e-12);
    assert_true(fabs(f.r2 - 1) < 1e-12);
    assert_int_equal(f.clamped, 0);
}

/* A fit done by hand: x = 1..4, y = 1, 3, 2, 5: mean x 2.5, mean y 2.75, Sxy = 5.5, Sxx = 5,
 * so slope 1.1 and intercept 2.75 - 1.1 * 2.5 = 0. */
static void test_known_fit(void **s) {
    (void)s;
    const double x[] = {1, 2, 3, 4}, y[] = {1, 3, 2, 5};
    nl_linfit f;
    assert_int_equal(nl_linfit_fit(x, y, NULL, 4, &f), NL_OK);
    assert_true(fabs(f.slope - 1.1) < 1e-12);
    assert_true(fabs(f.intercept - 0.0) < 1e-12);
    /* residuals -0.1, 0.8, -1.3, 0.6; deviations from the mean -1.75, 0.25, -0.75, 2.25 */
    double ss_res = 0.01 + 0.64 + 1.69 + 0.36, ss_tot = 3.0625 + 0.0625 + 0.5625 + 5.0625;
    assert_true(fabs(f.r2 - (1 - ss_res / ss_tot)) < 1e-12);
}

/* A point of weight 0 does not move the line; weights equal to 2 count a point twice. */
static void test_weights(void **s) {
    (void)s;
    const double x[] = {0, 1, 2, 3}, y[] = {1, 2, 3, 100}, w[] = {1, 1, 1, 0};
    nl_linfit f;
    assert_int_equal(nl_linfit_fit(x, y, w, 4, &f), NL_OK);
    assert_true(fabs(f.slope - 1) < 1e-12 && fabs(f.intercept - 1) < 1e-12);
    const double x2[] = {0, 1, 2}, y2[] = {0, 1, 5}, w2[] = {1, 2, 1};
    const double x3[] = {0, 1, 1, 2}, y3[] = {0, 1, 1, 5};
    nl_linfit a, b;
    assert_int_equal(nl_linfit_fit(x2, y2, w2, 3, &a), NL_OK);
    assert_int_equal(nl_linfit_fit(x3, y3, NULL, 4, &b), NL_OK);
    assert_true(fabs(a.slope - b.slope) < 1e-12 && fabs(a.intercept - b.intercept) < 1e-12);
}

static void test_bad_input(void **s) {
    (void)s;
    const double x[] = {2, 2, 2}, y[] = {1, 2, 3}, wneg[] = {1, -1, 1};
    nl_linfit f = {.slope = 42};
    assert_int_equal(nl_linfit_fit(x, y, NULL, 1, &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "at least 2 points"));
    assert_int_equal(nl_linfit_fit(x, y, NULL, 3, &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "do not spread"));
    const double x2[] = {1, 2, 3};
    assert_int_equal(nl_linfit_fit(x2, y, wneg, 3, &f), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "weight 1"));
    assert_true(f.slope == 42); /* untouched on error */
}

/* Times that grow slower than linearly from a small base: the free fit's intercept is negative
 * (what `collectives bench` printed as a latency of -2419.6 us); the constrained fit passes
 * through the origin with the least-squares slope sum(xy)/sum(xx). */
static void test_nonneg_intercept(void **s) {
    (void)s;
    const double x[] = {10, 20, 30}, y[] = {5, 15, 25}; /* y = -5 + x */
    nl_linfit free_fit, f;
    assert_int_equal(nl_linfit_fit(x, y, NULL, 3, &free_fit), NL_OK);
    assert_true(free_fit.intercept < 0);
    assert_int_equal(nl_linfit_nonneg(x, y, NULL, 3, &f), NL_OK);
    assert_int_equal(f.clamped, 2);
    assert_true(f.intercept == 0);
    double sxy = 10 * 5 + 20 * 15 + 30 * 25, sxx = 100 + 400 + 900;
    assert_true(fabs(f.slope - sxy / sxx) < 1e-12);
    assert_true(f.r2 < 1 && f.r2 > 0.9);
}

static void test_nonneg_slope(void **s) {
    (void)s;
    const double x[] = {1, 2, 3, 4}, y[] = {8, 6, 4, 2}; /* falling: time per byte < 0 */
    nl_linfit f;
    assert_int_equal(nl_linfit_nonneg(x, y, NULL, 4, &f), NL_OK);
    assert_int_equal(f.clamped, 1);
    assert_true(f.slope == 0);
    assert_true(fabs(f.intercept - 5) < 1e-12); /* the mean */
    assert_true(fabs(f.r2) < 1e-12);
}

static void test_nonneg_keeps_good_fit(void **s) {
    (void)s;
    const double x[] = {1, 2, 4, 8, 16}, y[] = {5, 7, 11, 19, 35};
    nl_linfit a, b;
    assert_int_equal(nl_linfit_fit(x, y, NULL, 5, &a), NL_OK);
    assert_int_equal(nl_linfit_nonneg(x, y, NULL, 5, &b), NL_OK);
    assert_int_equal(b.clamped, 0);
    assert_true(a.slope == b.slope && a.intercept == b.intercept);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_line),
        cmocka_unit_test(test_known_fit),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_nonneg_intercept),
        cmocka_unit_test(test_nonneg_slope),
        cmocka_unit_test(test_nonneg_keeps_good_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
