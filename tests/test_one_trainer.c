/* One trainer: `nanolm train` with a parallel layout of size 1 (--dp 1 with every ZeRO level,
 * --tp 1 --pp 1) runs the same loop, schedule, clipping and AdamW as `nanolm train` alone, so its
 * per-step training losses, gradient norms, learning rates and validation losses are
 * bit-identical (compared as the %.9g text of the CSV log, which round-trips a float). The layout
 * refuses what it does not support with a message naming it. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHAKES "tinyshakespeare/input.txt"
#define OPTS "--steps 6 --batch 4 --seq 32 --eval-windows 4 --warmup 2 --eval-every 3"

/* The log without its last column (tokens/s, a wall-clock figure). */
static char *log_without_speed(const char *path) {
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    char *res = calloc(1, strlen(text) + 1), *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *comma = strrchr(line, ',');
        if (comma) *comma = '\0';
        strcat(res, line);
        strcat(res, "\n");
    }
    free(text);
    return res;
}

static void test_layouts_of_size_1_bit_identical(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char *dir = tu_tmpdir(), args[2048], path[512];
    snprintf(args, sizeof args, "train --data %s " OPTS " --log %s/plain.csv", data, dir);
    assert_int_equal(tu_run_cli(args, NULL), 0);
    snprintf(path, sizeof path, "%s/plain.csv", dir);
    char *ref = log_without_speed(path);
    print_message("one process:\n%s", ref);
    assert_non_null(strstr(ref, "\n6,")); /* six steps */
    const char *layouts[] = {"--dp 1", "--dp 1 --zero 1", "--dp 1 --zero 2", "--dp 1 --zero 3", "--tp 1 --pp 1 --dp 1",
                             "--dp 1 --no-overlap"};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        snprintf(args, sizeof args, "train --data %s " OPTS " %s --log %s/layout%zu.csv", data, layouts[i], dir, i);
        char *out = NULL;
        int rc = tu_run_cli(args, &out);
        if (rc) print_message("%s\n", out);
        assert_int_equal(rc, 0);
        free(out);
        snprintf(path, sizeof path, "%s/layout%zu.csv", dir, i);
        char *got = log_without_speed(path);
        if (strcmp(got, ref)) print_message("%s:\n%s", layouts[i], got);
        assert_string_equal(got, ref);
        free(got);
    }
    free(ref);
    tu_rmdir(dir);
    free(dir);
}

static void expect_refused(const char *args, const char *needle) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    print_message("nanolm %s -> %d: %s", args, rc, out ? out : "");
    assert_int_not_equal(rc, 0);
    assert_non_null(out);
    assert_non_null(strstr(out, needle));
    free(out);
}

static void test_layout_refusals_are_named(void **state) {
    (void)state;
    TU_REQUIRE_DATA(data, SHAKES);
    char args[2048];
    snprintf(args, sizeof args, "train --data %s " OPTS " --dp 1 --precision bf16", data);
    expect_refused(args, "does not support a precision other than fp32");
    snprintf(args, sizeof args, "train --data %s " OPTS " --dp 1 --grad-accum 2", data);
    expect_refused(args, "does not support gradient accumulation");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts_of_size_1_bit_identical),
        cmocka_unit_test(test_layout_refusals_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
