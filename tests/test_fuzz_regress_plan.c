/* Replays the planner fuzzers' seeds and findings (fuzz/corpus/TARGET, fuzz/regress/TARGET for
 * catalog and scaling_csv) through the libFuzzer entry points, as test_fuzz_regress.c does for
 * the other loaders (a separate file: plan.h and model.h both define an nl_model type). */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NL_FUZZ_NO_MAIN
#include "../fuzz/fuzz_catalog.c"
#include "../fuzz/fuzz_scaling_csv.c"

typedef int (*fuzz_fn)(const uint8_t *, size_t);

static int replay_dir(const char *dir, fuzz_fn fn) {
    DIR *d = opendir(tu_src_path(dir));
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char rel[512];
        snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
        size_t bytes = 0;
        char *buf = tu_read_file(tu_src_path(rel), &bytes);
        assert_non_null(buf);
        fn((const uint8_t *)buf, bytes);
        free(buf);
        n++;
    }
    closedir(d);
    return n;
}

static void replay(const char *target, fuzz_fn fn, int min_seeds) {
    char dir[128];
    snprintf(dir, sizeof dir, "fuzz/corpus/%s", target);
    int seeds = replay_dir(dir, fn);
    snprintf(dir, sizeof dir, "fuzz/regress/%s", target);
    int found = replay_dir(dir, fn);
    print_message("%s: %d seeds, %d regression inputs replayed\n", target, seeds, found);
    assert_true(seeds >= min_seeds);
}

static void test_catalog(void **s) { (void)s; replay("catalog", nl_fuzz_catalog, 4); }
static void test_scaling_csv(void **s) { (void)s; replay("scaling_csv", nl_fuzz_scaling_csv, 3); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_catalog),
        cmocka_unit_test(test_scaling_csv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
