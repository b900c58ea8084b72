/* Exact match of the next k tokens against per-token accuracy: on a periodic token stream a
 * trained tiny NanoLM gets every token right (exact match 1 for every k), an untrained one gets
 * exact match ~ p^k ~ 0; exact match never grows with k and k = 1 agrees with the accuracy. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/emergence_set.h"
#include "nanolm/sweep.h"
#include "nanolm/train.h"

static void check_monotone(const nl_emergence *e) {
    for (int k = 2; k <= e->kmax; k++) assert_true(e->exact[k] <= e->exact[k - 1]);
    assert_true(fabs(e->exact[1] - e->accuracy) < 0.05);
}

static void count_row(void *user, const nl_emergence_row *row) {
    assert_true(row->name[0] != 0);
    (*(int *)user)++;
}

/* The set of the trained and the untrained checkpoint, given in that order, comes back ordered
 * by accuracy and named after the files; a missing file is an error naming it. */
static void check_eval_set(const char *dir, const char *text, const char *trained, const char *untrained) {
    const char *paths[2] = {trained, untrained};
    nl_emergence_row rows[2];
    int kmax = NL_EMERGENCE_KMAX, calls = 0;
    assert_int_equal(nl_emergence_eval_set(paths, 2, text, NL_DATA_VAL, 4, &kmax, rows, count_row, &calls), NL_OK);
    assert_int_equal(calls, 2);
    assert_string_equal(rows[0].name, "untrained.safetensors");
    assert_string_equal(rows[1].name, "trained.safetensors");
    assert_true(rows[0].e.accuracy < rows[1].e.accuracy);
    assert_true(kmax >= 1 && kmax <= NL_EMERGENCE_KMAX);
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
    paths[1] = missing;
    assert_int_not_equal(nl_emergence_eval_set(paths, 2, text, NL_DATA_VAL, 4, &kmax, rows, NULL, NULL), NL_OK);
    assert_non_null(strstr(nl_last_error(), "none.safetensors"));
}

static void test_periodic_stream(void **state) {
    (void)state;
    enum { N = 6000, P = 7 };
    int tok[N];
    for (int i = 0; i < N; i++) tok[i] = 'a' + (i % P);
    nl_data d;
    assert_int_equal(nl_data_from_tokens(&d, "periodic", tok, N, 256), NL_OK);
    nl_arch a;
    nl_sweep_arch(32, 1, 40, &a);
    nl_train_opts o;
    nl_train_opts_default(&o);
    o.steps = 60;
    o.batch = 8;
    o.seq = 40;
    o.lr = 1e-2f;
    o.lr_min = 1e-3f;
    o.warmup = 5;
    o.eval_every = 0;
    o.eval_windows = 2;
    nl_trainer t;
    assert_int_equal(nl_trainer_init(&t, &a, &o), NL_OK);
    nl_emergence before, after;
    assert_int_equal(nl_emergence_eval(&t.model, &d, NL_DATA_VAL, 8, 40, 0, 32, &before), NL_OK);
    char *dir = tu_tmpdir(), text[1100], trained[1100], untrained[1100];
    snprintf(text, sizeof text, "%s/periodic.txt", dir);
    snprintf(trained, sizeof trained, "%s/trained.safetensors", dir);
    snprintf(untrained, sizeof untrained, "%s/untrained.safetensors", dir);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < N; i++) fputc(tok[i], f);
    fclose(f);
    assert_int_equal(nl_ckpt_save(untrained, &t.model, "byte", NULL), NL_OK);
    assert_int_equal(nl_trainer_run(&t, &o, &d, NULL, NULL), NL_OK);
    assert_int_equal(nl_ckpt_save(trained, &t.model, "byte", NULL), NL_OK);
    check_eval_set(dir, text, trained, untrained);
    tu_rmdir(dir);
    free(dir);
    assert_int_equal(nl_emergence_eval(&t.model, &d, NL_DATA_VAL, 8, 40, 0, 32, &after), NL_OK);
    print_message("untrained: p %.4f, EM1 %.4f, EM8 %.4f; trained: p %.4f, EM32 %.4f, loss %.4f\n", before.accuracy,
                  before.exact[1], before.exact[8], after.accuracy, after.exact[32], after.mean_loss);
    check_monotone(&before);
    check_monotone(&after);
    assert_true(before.accuracy < 0.3);
    assert_true(before.exact[8] <= pow(before.accuracy, 2)); /* long answers are (nearly) never right */
    /* each token determines the next one, so a trained model gets them all */
    assert_true(after.accuracy > 0.95);
    assert_true(after.exact[32] > 0.8);
    /* q = P(right | previous right): a probability, and exact match of 2 tokens is p q up to the
     * edges of the windows (pairs are counted over whole windows, starts over the first T - 32) */
    print_message("q untrained %.4f, trained %.4f\n", before.p_after_correct, after.p_after_correct);
    assert_true(after.p_after_correct > 0.95 && after.p_after_correct <= 1.0);
    /* untrained, no token is right (p = 0 above), so q is undefined: NaN, not a made-up number */
    if (before.accuracy == 0)
        assert_true(isnan(before.p_after_correct));
    else
        assert_true(before.p_after_correct >= 0 && before.p_after_correct <= 1.0);
    assert_true(fabs(after.exact[2] - after.accuracy * after.p_after_correct) < 0.05);
    assert_int_equal(nl_emergence_eval(&t.model, &d, NL_DATA_VAL, 8, 40, 0, 40, &after), NL_ERR_INVALID);
    nl_trainer_free(&t);
    nl_data_free(&d);
}

/* The exact-match lengths shown, and the three plots of a set: every k up to kmax as points
 * (exact match) and a line (p^k); the relative plot stops at k = 8. */
static void test_plots(void **state) {
    (void)state;
    assert_int_equal(nl_emergence_nks(0), 0);
    assert_int_equal(nl_emergence_nks(1), 1);
    assert_int_equal(nl_emergence_nks(5), 3);
    assert_int_equal(nl_emergence_nks(NL_EMERGENCE_KMAX), NL_EMERGENCE_NKS);
    nl_emergence_row rows[3];
    memset(rows, 0, sizeof rows);
    for (int i = 0; i < 3; i++) {
        snprintf(rows[i].name, sizeof rows[i].name, "run%d", i);
        rows[i].e.accuracy = 0.3 + 0.3 * i;
        rows[i].e.starts = 1000;
        for (int k = 1; k <= NL_EMERGENCE_KMAX; k++) rows[i].e.exact[k] = pow(rows[i].e.accuracy, k);
    }
    char *dir = tu_tmpdir(), path[1100];
    for (int scale = NL_EMERGENCE_LINEAR; scale <= NL_EMERGENCE_RELATIVE; scale++) {
        snprintf(path, sizeof path, "%s/e%d.svg", dir, scale);
        assert_int_equal(nl_emergence_svg(path, (nl_emergence_scale)scale, rows, 3, 16), NL_OK);
        char *svg = tu_read_file(path, NULL);
        assert_non_null(svg);
        assert_non_null(strstr(svg, "exact match k=1"));
        assert_non_null(strstr(svg, "p^8"));
        assert_true((strstr(svg, "p^16") != NULL) == (scale != NL_EMERGENCE_RELATIVE));
        assert_null(strstr(svg, "p^32")); /* beyond kmax */
        free(svg);
    }
    assert_int_equal(nl_emergence_svg(path, NL_EMERGENCE_LINEAR, rows, 0, 16), NL_ERR_INVALID);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_periodic_stream), cmocka_unit_test(test_plots)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
