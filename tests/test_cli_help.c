/* nanolm --help: every command is listed exactly once, and each one answers --help.
 * (The command table in src/cli/main.c is merged line by line from parallel branches; a line
 * added twice showed up as a duplicate entry in the help text.) */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMANDS 64

/* Command names from the "commands:" block of the top-level help. */
static int list_commands(char names[][32]) {
    char *out = NULL;
    int rc = tu_run_cli("--help", &out);
    assert_int_equal(rc, 0);
    char *block = strstr(out, "commands:\n");
    assert_non_null(block);
    int n = 0;
    /* one indented line per command, until the first line that is not indented */
    for (char *line = strchr(block, '\n') + 1; *line == ' '; line = strchr(line, '\n') + 1) {
        assert_true(n < MAX_COMMANDS);
        assert_int_equal(sscanf(line, " %31s", names[n]), 1);
        n++;
    }
    free(out);
    return n;
}

static void test_each_command_once(void **state) {
    (void)state;
    char names[MAX_COMMANDS][32];
    int n = list_commands(names);
    assert_true(n >= 10);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strcmp(names[i], names[j])) fail_msg("command '%s' is listed twice in nanolm --help", names[i]);
}

static void test_each_command_has_help(void **state) {
    (void)state;
    char names[MAX_COMMANDS][32];
    int n = list_commands(names);
    for (int i = 0; i < n; i++) {
        char args[80], *out = NULL;
        snprintf(args, sizeof args, "%.31s --help", names[i]);
        int rc = tu_run_cli(args, &out);
        if (rc != 0) fail_msg("nanolm %s exited %d: %s", args, rc, out ? out : "");
        if (!out || !strstr(out, "usage")) fail_msg("nanolm %s printed no usage line: %s", args, out ? out : "");
        free(out);
    }
}

/* JSON numbers parse back to the double the command computed: 2.2224427084438503e-05 rounds to
 * the fp16 subnormal 373 x 2^-24 = 2.2232532501220703e-05, which 15 significant digits
 * (2.22325325012207e-05) do not give back. */
static void test_json_numbers_round_trip(void **state) {
    (void)state;
    char *out = NULL;
    assert_int_equal(tu_run_cli("formats cast 2.2224427084438503e-05 --to fp16 --json", &out), 0);
    cJSON *d = cJSON_Parse(out);
    assert_non_null(d);
    assert_int_equal(cJSON_GetObjectItem(d, "code")->valueint, 373);
    assert_true(cJSON_GetObjectItem(d, "decoded")->valuedouble == ldexp(373.0, -24));
    assert_true(cJSON_GetObjectItem(d, "ulp")->valuedouble == ldexp(1.0, -24));
    cJSON_Delete(d);
    free(out);
}

/* OpenBLAS runs kernels for this CPU's vector width: on a CPU with AVX2 and FMA never its
 * Prescott (SSE3) fallback, which Debian 12's OpenBLAS chooses for CPUs newer than it
 * (nl_runtime_reexec names the kernels then and runs nanolm again). */
static void test_blas_kernels_fit_the_cpu(void **state) {
    (void)state;
    __builtin_cpu_init();
    if (getenv("OPENBLAS_CORETYPE") || getenv("NANOLM_NO_REEXEC") || getenv("NANOLM_SANITIZED") ||
        !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        print_message(
            "[  SKIP    ] OPENBLAS_CORETYPE or NANOLM_NO_REEXEC set, a sanitized build, or no AVX2 and FMA\n");
        return;
    }
    char *out = NULL;
    assert_int_equal(tu_run_cli("version --json", &out), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    const cJSON *b = cJSON_GetObjectItem(j, "blas_kernels");
    assert_true(cJSON_IsString(b));
    print_message("OpenBLAS kernels: %s\n", b->valuestring);
    assert_string_not_equal(b->valuestring, "Prescott");
    cJSON_Delete(j);
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_command_once),
        cmocka_unit_test(test_each_command_has_help),
        cmocka_unit_test(test_json_numbers_round_trip),
        cmocka_unit_test(test_blas_kernels_fit_the_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
