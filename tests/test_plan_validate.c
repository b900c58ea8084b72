/* plan/ against published runs: the validation set in tests/validation/published.json, priced
 * with the default assumptions. The published figures come from the sources named in each
 * entry, never from the planner. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/plan.h"

static nl_catalog cat;

static const nl_valid_group *group(const nl_valid_result *r, const char *name) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(r->groups[i].group, name)) return &r->groups[i];
    fail_msg("no group %s", name);
    return NULL;
}

/* At least 40 published figures, each with a source and a positive figure; the groups of the
 * issue are present. */
static void test_set_shape(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), &r), NL_OK);
    assert_true(r.n >= 40);
    for (size_t i = 0; i < r.n; i++) {
        assert_true(r.cases[i].published > 0);
        assert_true(strlen(r.cases[i].source) > 10);
        assert_true(isfinite(r.cases[i].predicted) && r.cases[i].predicted > 0);
    }
    assert_true(group(&r, "train")->n >= 20);
    assert_true(group(&r, "memory")->n >= 10);
    assert_true(group(&r, "serve")->n >= 10);
    nl_plan_validate_free(&r);
}

/* The targets on the whole set, one set of defaults for every case. Met: memory cases whose
 * accounting the source spells out within 3%, serving median <= 10%, every published layout
 * fitting. Not met yet (docs/planning.md gives the figures): training throughput median <= 5%
 * and every case <= 15%; those are guarded here at the level reached so that a change that
 * makes the planner worse against published runs fails. */
static void test_targets(void **state) {
    (void)state;
    nl_valid_result r;
    assert_int_equal(nl_plan_validate(&cat, tu_src_path("tests/validation/published.json"), &r), NL_OK);
    const nl_valid_group *m = group(&r, "memory"), *t = group(&r, "train"), *s = group(&r, "serve");
    assert_true(m->n_formula >= 20);
    assert_true(m->worst_formula_abs <= 0.03);
    assert_true(t->median_abs <= 0.07);   /* target 0.05 */
    assert_true(t->worst_abs <= 0.35);    /* target 0.15 */
    assert_true(s->median_abs <= 0.10);
    assert_true(r.n_nofit == 0);
    nl_plan_validate_free(&r);
}

/* Bad input: a missing file, a non-array, an entry without a source, an unknown metric. */
static void test_bad_files(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char path[4096];
    nl_valid_result r;
    snprintf(path, sizeof path, "%s/none.json", dir);
    assert_int_not_equal(nl_plan_validate(&cat, path, &r), NL_OK);
    static const char *bad[] = {
        "{\"id\": \"x\"}",
        "[{\"id\": \"x\", \"group\": \"memory\", \"metric\": \"state_gb\", \"published\": 1, \"params\": 1e9, \"layout\": {}}]",
        "[{\"id\": \"x\", \"group\": \"memory\", \"source\": \"a paper, Table 1\", \"metric\": \"nonsense\", \"published\": 1, \"layout\": {}}]",
        "[{\"id\": \"x\", \"group\": \"train\", \"source\": \"a paper, Table 1\", \"model\": \"no-such-model\", \"metric\": \"mfu\", \"published\": 40}]",
    };
    static const char *want[] = {"JSON array", "source", "unknown memory metric", "unknown model"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad%zu.json", dir, i);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bad[i], f);
        fclose(f);
        assert_int_not_equal(nl_plan_validate(&cat, path, &r), NL_OK);
        assert_non_null(strstr(nl_last_error(), want[i]));
        assert_non_null(strstr(nl_last_error(), path));
    }
    tu_rmdir(dir);
    free(dir);
}

/* The command prints the table, the summary per group, and the same data with --json. */
static void test_cli(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("plan validate", &out), 0);
    assert_non_null(strstr(out, "Summary"));
    assert_non_null(strstr(out, "megatron21-1.7b"));
    free(out);
    assert_int_equal(tu_run_cli("plan validate --json", &out), 0);
    assert_non_null(strstr(out, "\"median_abs_error\""));
    free(out);
}

int main(void) {
    nl_catalog_init(&cat);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_shape),
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
