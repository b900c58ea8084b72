/* A few commands under valgrind's memcheck with zero errors: generate, eval, quant model and plan
 * train on the committed stories260K, and three bad files refused (a truncated llama2.c model, a
 * safetensors file whose header is not JSON, a truncated tokenizer). `make memcheck` runs it in a
 * portable build (NANOLM_NATIVE=OFF); in a -march=native build (valgrind dies with SIGILL on
 * instructions it does not know), a sanitizer build or without valgrind it skips, saying why. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int skip_reason(void) {
    const char *native = getenv("NANOLM_NATIVE");
    const char *san = getenv("NANOLM_SANITIZED");
    const char *why = NULL;
    if (native && strcmp(native, "0") != 0)
        why = "a -march=native build (make memcheck runs a portable one)";
    else if (san && strcmp(san, "0") != 0)
        why = "a sanitizer build";
    else if (system("valgrind --version >/dev/null 2>&1") != 0)
        why = "valgrind is not installed (scripts/setup-deps.sh check)";
    if (!why) return 0;
    print_message("[  SKIP    ] %s\n", why);
    return 1;
}

/* Runs `nanolm ARGS` under memcheck. Returns the command's exit status; fails the test on any
 * memcheck error (valgrind exits 99 then and its log says what). */
static int under_memcheck(const char *args, const char *log_dir, int n) {
    const char *bin = getenv("NANOLM_BIN");
    char log[512], outp[512], cmd[4096];
    snprintf(log, sizeof log, "%s/memcheck-%d.log", log_dir, n);
    snprintf(outp, sizeof outp, "%s/output-%d.txt", log_dir, n);
    /* One thread each: valgrind serialises threads anyway, and fewer is faster. Leaks that
     * are definitely lost count as errors; OpenMP's and OpenBLAS's thread pools stay reachable.
     * NANOLM_NO_REEXEC: nanolm never executes itself again (nl_runtime_reexec), which would
     * leave memcheck behind. */
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 NANOLM_NO_REEXEC=1 timeout -k 10 900 valgrind "
             "--tool=memcheck -q "
             "--error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-leak-kinds=definite "
             "--log-file='%s' %s %s >'%s' 2>&1",
             log, bin ? bin : "build/nanolm", args, outp);
    int st = system(cmd);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char *text = tu_read_file(log, NULL), *said = tu_read_file(outp, NULL);
    print_message("memcheck: nanolm %s -> exit %d\n%s%s", args, code, said ? said : "", text ? text : "");
    free(said);
    if (code == 99) fail_msg("memcheck found errors in: nanolm %s", args);
    if (code == 124 || code == 137) fail_msg("nanolm %s hung under valgrind", args);
    free(text);
    return code;
}

static void test_commands_have_no_memcheck_errors(void **state) {
    (void)state;
    if (skip_reason()) {
        skip();
        return;
    }
    const char *ckpt = tu_committed_data("stories260K/stories260K.bin");
    const char *tok = tu_committed_data("stories260K/tok512.bin");
    const char *text = tu_committed_data("tinystories/tinystories_sample.txt");
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char args[2048];
    int n = 0;
    snprintf(args, sizeof args,
             "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 16 --temperature 0", ckpt, tok);
    assert_int_equal(under_memcheck(args, dir, n++), 0);
    snprintf(args, sizeof args, "eval --ckpt %s --tokenizer %s --data %s", ckpt, tok, text);
    assert_int_equal(under_memcheck(args, dir, n++), 0);
    snprintf(args, sizeof args,
             "quant model --ckpt %s --tokenizer %s --data %s --scheme int8-channel --scheme int4-b32 "
             "--gen 4 --seq 64 --max-tokens 300",
             ckpt, tok, text);
    assert_int_equal(under_memcheck(args, dir, n++), 0);
    assert_int_equal(under_memcheck("plan train --model llama-2-7b --gpus 8 --top 2", dir, n++), 0);

    /* Three bad files, refused (exit 1) with no memcheck error. */
    char bad[3][600];
    snprintf(bad[0], sizeof bad[0], "%s/truncated.bin", dir);
    snprintf(bad[1], sizeof bad[1], "%s/badheader.safetensors", dir);
    snprintf(bad[2], sizeof bad[2], "%s/truncated_tok.bin", dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "head -c 5000 '%s' > '%s' && printf '\\040\\000\\000\\000\\000\\000\\000\\000{\"a\": [1, 2' "
             "> '%s' && head -c 3000 '%s' > '%s'",
             ckpt, bad[0], bad[1], tok, bad[2]);
    assert_int_equal(system(cmd), 0);
    snprintf(args, sizeof args, "generate --ckpt %s --tokenizer %s --prompt x --steps 2", bad[0], tok);
    assert_int_equal(under_memcheck(args, dir, n++), 1);
    snprintf(args, sizeof args, "eval --ckpt %s --data %s", bad[1], text);
    assert_int_equal(under_memcheck(args, dir, n++), 1);
    snprintf(args, sizeof args, "generate --ckpt %s --tokenizer %s --prompt x --steps 2", ckpt, bad[2]);
    assert_int_equal(under_memcheck(args, dir, n++), 1);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commands_have_no_memcheck_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
