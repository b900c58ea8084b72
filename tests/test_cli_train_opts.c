/* The training option group is one group: `train`, `parallel train` and `moe train` offer the
 * same training options with the same spellings, accept the old spellings as aliases, make the
 * same checks (naming the command), and say their own defaults in --help. (needs MPI: `parallel
 * train` and `moe train` exist only in a build with MPI.) */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const CMDS[] = {"train", "parallel train", "moe train"};
#define N_CMDS 3

/* The help line of option `opt` ("--steps N ...") in help, copied into line; 0 when absent. */
static int help_line(const char *help, const char *opt, char *line, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "  --%s ", opt);
    const char *p = strstr(help, pat);
    if (!p) return 0;
    size_t n = strcspn(p, "\n");
    snprintf(line, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
    return 1;
}

static void test_one_group_in_every_help(void **state) {
    (void)state;
    static const char *const group[] = {"data",   "steps",        "batch",      "seq",  "lr",         "lr-min",
                                        "warmup", "weight-decay", "clip",       "seed", "eval-every", "eval-windows",
                                        "out",    "resume",       "stop-after", "log"};
    char *help[N_CMDS];
    for (int c = 0; c < N_CMDS; c++) {
        char args[64];
        snprintf(args, sizeof args, "%s --help", CMDS[c]);
        assert_int_equal(tu_run_cli(args, &help[c]), 0);
        assert_non_null(help[c]);
    }
    for (size_t i = 0; i < sizeof group / sizeof group[0]; i++)
        for (int c = 0; c < N_CMDS; c++) {
            char line[256];
            if (!help_line(help[c], group[i], line, sizeof line))
                fail_msg("nanolm %s --help does not offer --%s", CMDS[c], group[i]);
        }
    /* each command says its own defaults (README: train runs 2000 steps; moe train 20) */
    char line[256];
    assert_true(help_line(help[0], "steps", line, sizeof line) && strstr(line, "(default 2000)"));
    assert_true(help_line(help[1], "steps", line, sizeof line) && strstr(line, "(default 2000)"));
    assert_true(help_line(help[2], "steps", line, sizeof line) && strstr(line, "(default 20)"));
    /* --svg, --precision and --grad-accum only where the command runs them */
    assert_true(help_line(help[0], "svg", line, sizeof line) && help_line(help[1], "svg", line, sizeof line));
    assert_false(help_line(help[2], "svg", line, sizeof line));
    assert_false(help_line(help[2], "precision", line, sizeof line));
    for (int c = 0; c < N_CMDS; c++) free(help[c]);
}

/* Runs `nanolm args`, expects exit 2 and a message containing want. */
static void expect_usage(const char *args, const char *want) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    assert_non_null(out);
    if (rc != 2 || !strstr(out, want)) fail_msg("nanolm %s: exit %d, wanted 2 and '%s', got: %s", args, rc, want, out);
    free(out);
}

static void test_old_spellings_are_aliases(void **state) {
    (void)state;
    /* the aliases come first; the parse then stops at --steps 0, so nothing runs */
    expect_usage("train --data x --fp8-promote 32 --save-every 3 --steps 0", "--steps must be in [1, 100000000]");
    expect_usage("parallel train --data x --micro 2 --micro-batch 2 --save-every 3 --steps 0",
                 "--steps must be in [1, 100000000]");
    expect_usage("moe train --data x --save-every 3 --steps 0", "--steps must be in [1, 100000000]");
}

static void test_same_checks_name_the_command(void **state) {
    (void)state;
    for (int c = 0; c < N_CMDS; c++) {
        char args[128], want[128];
        snprintf(args, sizeof args, "%s --steps 5", CMDS[c]);
        snprintf(want, sizeof want, "nanolm: %s: --data FILE is required", CMDS[c]);
        expect_usage(args, want);
        snprintf(args, sizeof args, "%s --data x --lr 0.01 --lr-min 0.1", CMDS[c]);
        snprintf(want, sizeof want, "nanolm: %s: --lr-min 0.1 is above --lr 0.01", CMDS[c]);
        expect_usage(args, want);
        snprintf(args, sizeof args, "%s --data x --lr 0", CMDS[c]);
        snprintf(want, sizeof want, "nanolm: %s: --lr must be positive", CMDS[c]);
        expect_usage(args, want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_group_in_every_help),
        cmocka_unit_test(test_old_spellings_are_aliases),
        cmocka_unit_test(test_same_checks_name_the_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
