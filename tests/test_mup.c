/* muP: at the base width it is the standard parametrisation exactly; on a tiny learning-rate
 * grid at 3 widths the best learning rate's index (refined between grid points) moves less with
 * muP than without. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/mup.h"
#include "nanolm/sweep.h"
#include "nanolm/tokenizer.h"
#include "nanolm/train.h"

#define SHAKES "tinyshakespeare/input.txt"

static void test_base_width_is_standard(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, SHAKES);
    nl_tokenizer tok;
    nl_data d;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    int64_t w[1] = {32};
    double lrs[1] = {3e-3}, sp, mu, mu2;
    assert_int_equal(nl_lr_sweep(&d, w, 1, lrs, 1, 1, 12, 4, 32, 4, 0, 3, &sp), NL_OK);
    assert_int_equal(nl_lr_sweep(&d, w, 1, lrs, 1, 1, 12, 4, 32, 4, 32, 3, &mu), NL_OK);
    assert_int_equal(nl_lr_sweep(&d, w, 1, lrs, 1, 1, 12, 4, 32, 4, 16, 3, &mu2), NL_OK);
    print_message("width 32: SP %.6f, muP base 32 %.6f, muP base 16 %.6f\n", sp, mu, mu2);
    assert_true(sp == mu);  /* r = 1: identical computation */
    assert_true(sp != mu2); /* r = 2: a different parametrisation */
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
}

static void test_best_lr_moves_less(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, SHAKES);
    nl_tokenizer tok;
    nl_data d;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    int64_t w[3] = {16, 32, 64};
    double lrs[5] = {1.0 / 1024, 1.0 / 256, 1.0 / 64, 1.0 / 16, 1.0 / 4};
    double sp[15], mu[15];
    assert_int_equal(nl_lr_sweep(&d, w, 3, lrs, 5, 1, 40, 8, 32, 100, 0, 11, sp), NL_OK);
    assert_int_equal(nl_lr_sweep(&d, w, 3, lrs, 5, 1, 40, 8, 32, 100, 16, 11, mu), NL_OK);
    /* the best learning rate per width, refined between grid points (parabola through the
     * best point and its neighbours): its spread across widths */
    double sp_lo = 99, sp_hi = -1, mu_lo = 99, mu_hi = -1;
    for (int i = 0; i < 3; i++) {
        double a = nl_argmin_interp(sp + 5 * i, 5), b = nl_argmin_interp(mu + 5 * i, 5);
        print_message("width %3lld  SP  %.3f %.3f %.3f %.3f %.3f  best %.2f\n", (long long)w[i], sp[5 * i],
                      sp[5 * i + 1], sp[5 * i + 2], sp[5 * i + 3], sp[5 * i + 4], a);
        print_message("width %3lld  muP %.3f %.3f %.3f %.3f %.3f  best %.2f\n", (long long)w[i], mu[5 * i],
                      mu[5 * i + 1], mu[5 * i + 2], mu[5 * i + 3], mu[5 * i + 4], b);
        assert_true(isfinite(a) && isfinite(b));
        sp_lo = fmin(a, sp_lo);
        sp_hi = fmax(a, sp_hi);
        mu_lo = fmin(b, mu_lo);
        mu_hi = fmax(b, mu_hi);
    }
    print_message("best-lr index range across widths: SP %.2f, muP %.2f (grid steps of x4)\n", sp_hi - sp_lo,
                  mu_hi - mu_lo);
    assert_true(mu_hi - mu_lo < sp_hi - sp_lo);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
}

/* The plots of a transfer result: the standard parametrisation at the path given, muP as
 * mup-NAME beside it, one line per width, a diverged run drawn at the top (6). */
static void test_transfer_svg(void **state) {
    (void)state;
    nl_lr_transfer x;
    memset(&x, 0, sizeof x);
    x.n_w = 2, x.n_lr = 3;
    x.widths[0] = 16, x.widths[1] = 32;
    x.lrs[0] = 1e-3, x.lrs[1] = 1e-2, x.lrs[2] = 1e-1;
    const double sp[6] = {3.1, 2.9, INFINITY, 3.0, 2.8, 7.5}, mu[6] = {3.2, 2.7, 2.9, 3.1, 2.6, 2.8};
    memcpy(x.sp, sp, sizeof sp);
    memcpy(x.mu, mu, sizeof mu);
    char *dir = tu_tmpdir(), path[1100], mup[1100];
    snprintf(path, sizeof path, "%s/lr.svg", dir);
    assert_int_equal(nl_lr_transfer_svg(path, &x, mup, sizeof mup), NL_OK);
    char want[1100];
    snprintf(want, sizeof want, "%s/mup-lr.svg", dir);
    assert_string_equal(mup, want);
    char *a = tu_read_file(path, NULL), *b = tu_read_file(mup, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(strstr(a, "standard parametrisation: validation loss vs learning rate"));
    assert_non_null(strstr(b, "muP: validation loss vs learning rate"));
    assert_non_null(strstr(a, "width 16"));
    assert_non_null(strstr(b, "width 32"));
    free(a);
    free(b);
    snprintf(path, sizeof path, "%s/none/lr.svg", dir); /* a folder that is not there */
    assert_int_not_equal(nl_lr_transfer_svg(path, &x, mup, sizeof mup), NL_OK);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base_width_is_standard),
        cmocka_unit_test(test_best_lr_moves_less),
        cmocka_unit_test(test_transfer_svg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
