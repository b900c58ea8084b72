/* Under an address-space limit (ulimit -v) nanolm either runs or exits with a clear message; it
 * never hangs. OpenBLAS 0.3 retries a failed mmap of its 128 MiB GEMM buffer forever, which hung
 * `train` (the shakespeare-char model) and stories260K `generate` at 100% CPU between about
 * 100,000 and 300,000 KiB, and at 50,000 KiB even `--help` died in OpenBLAS's thread start.
 * Each command runs under several limits with OpenBLAS and OpenMP left to their defaults; the
 * timeout only detects a hang (the runs take seconds). Skipped in a sanitizer build, whose
 * shadow memory needs terabytes of address space. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const long LIMITS_KIB[] = {30000, 50000, 100000, 150000, 200000, 250000, 300000, 400000};

/* Runs `nanolm args` under `ulimit -v kib`; returns the exit status (124 after a hang) and the
 * combined output in *out. */
static int run_limited(long kib, const char *args, char **out) {
    const char *bin = getenv("NANOLM_BIN");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS timeout -k 5 120 sh -c 'ulimit -v %ld && exec %s %s' 2>&1",
             kib, bin ? bin : "build/nanolm", args);
    char *buf = NULL;
    int st = tu_run_shell(cmd, &buf);
    assert_non_null(buf);
    *out = buf;
    return st;
}

static int sanitized(void) {
    const char *s = getenv("NANOLM_SANITIZED");
    if (s && strcmp(s, "0") != 0) {
        print_message("[  SKIP    ] a sanitizer build cannot run under ulimit -v\n");
        return 1;
    }
    return 0;
}

/* Every limit: exit 0, or exit 1 with one "nanolm:" message; never a hang or a signal. */
static void check_command(const char *what, const char *args, int must_succeed_above_kib) {
    for (size_t i = 0; i < sizeof LIMITS_KIB / sizeof LIMITS_KIB[0]; i++) {
        char *out = NULL;
        int code = run_limited(LIMITS_KIB[i], args, &out);
        const char *last = out + strlen(out);
        while (last > out && last[-1] == '\n') last--;
        const char *line = last;
        while (line > out && line[-1] != '\n') line--;
        print_message("%s under ulimit -v %ld: exit %d: %.*s\n", what, LIMITS_KIB[i], code, (int)(last - line), line);
        if (code == 124 || code == 137) fail_msg("%s hung under ulimit -v %ld", what, LIMITS_KIB[i]);
        /* Below about 40,000 KiB the dynamic loader cannot map libopenblas: it says so, exit 127. */
        if (code == 127 && strstr(out, "error while loading shared libraries")) {
            free(out);
            continue;
        }
        if (code != 0 && code != 1) fail_msg("%s under ulimit -v %ld: exit %d\n%s", what, LIMITS_KIB[i], code, out);
        if (code == 1) {
            assert_non_null(strstr(out, "nanolm:"));
            assert_null(strstr(out, "blas_thread_init")); /* OpenBLAS's own start-up failure */
            assert_null(strstr(out, "libgomp"));
        }
        if (LIMITS_KIB[i] >= must_succeed_above_kib && code != 0)
            fail_msg("%s should run under ulimit -v %ld\n%s", what, LIMITS_KIB[i], out);
        free(out);
    }
}

static void test_help_under_limits(void **state) {
    (void)state;
    if (sanitized()) {
        skip();
        return;
    }
    check_command("--help", "--help", 0);
    check_command("train --help", "train --help", 0);
}

static void test_generate_under_limits(void **state) {
    (void)state;
    if (sanitized()) {
        skip();
        return;
    }
    char args[2048];
    snprintf(args, sizeof args, "generate --ckpt %s --tokenizer %s --prompt Once --steps 8 --temperature 0",
             tu_committed_data("stories260K/stories260K.bin"), tu_committed_data("stories260K/tok512.bin"));
    check_command("generate", args, 300000);
}

static void test_train_under_limits(void **state) {
    (void)state;
    if (sanitized()) {
        skip();
        return;
    }
    char args[2048];
    snprintf(args, sizeof args, "train --data %s --steps 3 --eval-every 0",
             tu_committed_data("tinyshakespeare/input.txt"));
    check_command("train", args, 400000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_under_limits),
        cmocka_unit_test(test_generate_under_limits),
        cmocka_unit_test(test_train_under_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
