/* A FIFO (or a directory) named where a file is expected must be refused at once, never waited
 * on: open() of a FIFO with no writer blocks forever, so every loader opens through
 * nl_file_open_read (non-blocking open, then fstat). Each loader runs in a forked child with an
 * alarm as a hang detector; each CLI flag runs under timeout(1). Neither asserts on wall time
 * beyond "it did not hang for 60 s". */
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nanolm/base.h"
#include "nanolm/checkpoint.h"
#include "nanolm/data.h"
#include "nanolm/llama2c.h"
#include "nanolm/model.h"
#include "nanolm/plan.h"
#include "nanolm/safetensors.h"
#include "nanolm/scaling.h"
#include "nanolm/sweep.h"
#include "nanolm/tokenizer.h"

#define HANG_S 60

static char dir[128], fifo[256];

static int setup(void **state) {
    (void)state;
    char *d = tu_tmpdir();
    if (!d) return -1;
    snprintf(dir, sizeof dir, "%s", d);
    free(d);
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    return mkfifo(fifo, 0644);
}

static int teardown(void **state) {
    (void)state;
    tu_rmdir(dir);
    return 0;
}

enum {
    L_READ_FILE,
    L_ST_OPEN,
    L_LLAMA2C,
    L_CKPT_MODEL,
    L_TOKENIZER,
    L_DATA,
    L_HW,
    L_MODEL_FILE,
    L_SCALING_CSV,
    L_SWEEP_CSV,
    L_OPEN_STDIO,
    L_COUNT
};
static const char *const LOADER_NAMES[L_COUNT] = {"nl_read_file",
                                                  "nl_st_open",
                                                  "nl_llama2c_read",
                                                  "nl_ckpt_load_model",
                                                  "nl_tokenizer_load_llama2c",
                                                  "nl_data_open",
                                                  "nl_catalog_load_hw",
                                                  "nl_catalog_load_model",
                                                  "nl_scaling_read_csv",
                                                  "nl_sweep_read_csv",
                                                  "nl_file_open_read_stdio"};

/* Runs loader `which` on `path` in this (child) process; the status it returned. */
static nl_status run_loader(int which, const char *path) {
    switch (which) {
    case L_READ_FILE: {
        char *b;
        size_t n;
        return nl_read_file(path, &b, &n);
    }
    case L_ST_OPEN: {
        nl_st_file f;
        return nl_st_open(&f, path);
    }
    case L_LLAMA2C: {
        nl_llama2c m;
        return nl_llama2c_read(&m, path);
    }
    case L_CKPT_MODEL: {
        nl_model m;
        char tok[64];
        return nl_ckpt_load_model(path, &m, tok);
    }
    case L_TOKENIZER: {
        nl_tokenizer t;
        return nl_tokenizer_load_llama2c(&t, path, 512);
    }
    case L_DATA: {
        nl_tokenizer t;
        nl_data d;
        if (nl_tokenizer_init_byte(&t)) return NL_OK; /* reported as "not refused" */
        return nl_data_open(&d, path, &t);
    }
    case L_HW:
    case L_MODEL_FILE: {
        nl_catalog c;
        nl_catalog_init(&c);
        return which == L_HW ? nl_catalog_load_hw(&c, path) : nl_catalog_load_model(&c, path);
    }
    case L_SCALING_CSV: {
        nl_scaling_obs *o;
        size_t n;
        return nl_scaling_read_csv(path, &o, &n);
    }
    case L_SWEEP_CSV: {
        nl_sweep_row *r;
        int n;
        return nl_sweep_read_csv(path, &r, &n);
    }
    default: {
        FILE *f;
        return nl_file_open_read_stdio(path, &f);
    }
    }
}

/* Forks, runs the loader with an alarm; the child exits 0 when the loader refused `path` with a
 * message containing `want`. */
static void expect_refused(int which, const char *path, const char *want) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(HANG_S);
        nl_status rc = run_loader(which, path);
        int ok = rc != NL_OK && strstr(nl_last_error(), want) != NULL;
        fprintf(stderr, "%s(%s): %s\n", LOADER_NAMES[which], ok ? "refused" : "NOT refused as expected",
                rc ? nl_last_error() : "ok");
        _exit(ok ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) fail_msg("%s hung on %s", LOADER_NAMES[which], path);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s did not refuse %s with \"%s\"", LOADER_NAMES[which], path, want);
}

static void test_every_loader_refuses_a_fifo(void **state) {
    (void)state;
    for (int i = 0; i < L_COUNT; i++) expect_refused(i, fifo, "is a FIFO, not a regular file");
}

static void test_every_loader_refuses_a_directory(void **state) {
    (void)state;
    for (int i = 0; i < L_COUNT; i++) expect_refused(i, dir, "is a directory, not a regular file");
}

/* The helper still opens regular files, and says when one is missing. */
static void test_regular_and_missing_files(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/plain.txt", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("hello", f);
    fclose(f);
    char *b = NULL;
    size_t n = 0;
    assert_int_equal(nl_read_file(path, &b, &n), NL_OK);
    assert_int_equal(n, 5);
    assert_string_equal(b, "hello");
    nl_free(b);
    snprintf(path, sizeof path, "%s/missing.txt", dir);
    assert_int_equal(nl_read_file(path, &b, &n), NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "missing.txt"));
}

/* Every user-facing flag that names an input file, given the FIFO: a clear error, not a hang. */
static void test_cli_flags_refuse_a_fifo(void **state) {
    (void)state;
    const char *shk = tu_committed_data("tinyshakespeare/input.txt");
    const char *ckpt = tu_committed_data("stories260K/stories260K.bin");
    const char *tok = tu_committed_data("stories260K/tok512.bin");
    char cmds[9][1024];
    int k = 0;
    snprintf(cmds[k++], 1024, "train --data %s --steps 1", fifo);
    snprintf(cmds[k++], 1024, "train --data %s --steps 1 --resume %s", shk, fifo);
    snprintf(cmds[k++], 1024, "generate --ckpt %s --prompt x --steps 1", fifo);
    snprintf(cmds[k++], 1024, "generate --ckpt %s --tokenizer %s --prompt x --steps 1", ckpt, fifo);
    snprintf(cmds[k++], 1024, "eval --ckpt %s --tokenizer %s --data %s", ckpt, tok, fifo);
    snprintf(cmds[k++], 1024, "plan train --model llama-2-7b --gpus 8 --hw %s", fifo);
    snprintf(cmds[k++], 1024, "plan catalog --model-file %s", fifo);
    snprintf(cmds[k++], 1024, "scaling fit %s", fifo);
    for (int i = 0; i < k; i++) {
        /* timeout is only a hang detector: the refusal takes milliseconds. */
        const tu_run_opts o = {.timeout_s = HANG_S};
        char *out = NULL;
        int code = tu_run_cli_ex(&o, cmds[i], &out, NULL);
        assert_non_null(out);
        print_message("nanolm %s -> exit %d: %s", cmds[i], code, out);
        if (code == 124 || code == 137) fail_msg("nanolm %s hung on the FIFO", cmds[i]);
        assert_true(code == 1 || code == 2);
        assert_non_null(strstr(out, "nanolm:"));
        assert_non_null(strstr(out, "is a FIFO, not a regular file"));
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_loader_refuses_a_fifo),
        cmocka_unit_test(test_every_loader_refuses_a_directory),
        cmocka_unit_test(test_regular_and_missing_files),
        cmocka_unit_test(test_cli_flags_refuse_a_fifo),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
