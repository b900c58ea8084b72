/* Replays the fuzzers' findings (every file under fuzz/regress/TARGET) and their seed
 * corpora (fuzz/corpus/TARGET) through the same entry points the libFuzzer targets use, in the
 * normal build: a regression of a fixed crash shows up as a failed (or crashed) test here, and
 * under `make check` the sanitizers see the same inputs. Each target function aborts when a
 * loader breaks an invariant (accepts a file it must refuse, fails without a message, hands out
 * a token outside the vocabulary...). */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_targets.h"
#include "nanolm/llama2c.h"

typedef int (*fuzz_fn)(const uint8_t *, size_t);

/* Runs every file of `dir` (relative to the source root) through fn; returns how many. */
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

static void test_safetensors(void **s) {
    (void)s;
    replay("safetensors", nl_fuzz_safetensors, 3);
}
static void test_gguf(void **s) {
    (void)s;
    replay("gguf", nl_fuzz_gguf, 3);
}
static void test_llama2c(void **s) {
    (void)s;
    replay("llama2c", nl_fuzz_llama2c, 2);
}
static void test_tokenizer(void **s) {
    (void)s;
    replay("tokenizer", nl_fuzz_tokenizer, 2);
}
static void test_checkpoint(void **s) {
    (void)s;
    replay("checkpoint", nl_fuzz_checkpoint, 3);
}
static void test_data(void **s) {
    (void)s;
    replay("data", nl_fuzz_data, 2);
}
static void test_catalog(void **s) {
    (void)s;
    replay("catalog", nl_fuzz_catalog, 4);
}
static void test_scaling_csv(void **s) {
    (void)s;
    replay("scaling_csv", nl_fuzz_scaling_csv, 3);
}
/* Replays with stdout and stderr sent to /dev/null: the CLI targets print their one-line errors
 * and results, which would bury the test's own output. */
static void replay_quiet(const char *target, fuzz_fn fn, int min_seeds) {
    fflush(stdout);
    fflush(stderr);
    int out = dup(1), err = dup(2), null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
        dup2(null_fd, 1);
        dup2(null_fd, 2);
    }
    replay(target, fn, min_seeds);
    fflush(stdout);
    fflush(stderr);
    if (out >= 0) {
        dup2(out, 1);
        close(out);
    }
    if (err >= 0) {
        dup2(err, 2);
        close(err);
    }
    if (null_fd >= 0) close(null_fd);
}

static void test_cli_numbers(void **s) {
    (void)s;
    replay_quiet("cli_numbers", nl_fuzz_cli_numbers, 5);
}
static void test_names(void **s) {
    (void)s;
    replay("names", nl_fuzz_names, 5);
}
static void test_formats_cli(void **s) {
    (void)s;
    replay_quiet("formats_cli", nl_fuzz_formats_cli, 3);
}
static void test_train_state(void **s) {
    (void)s;
    replay_quiet("train_state", nl_fuzz_train_state, 5);
}
static void test_http_request(void **s) {
    (void)s;
    replay_quiet("http_request", nl_fuzz_http_request, 3);
}
static void test_chat_template(void **s) {
    (void)s;
    replay("chat_template", nl_fuzz_chat_template, 4);
}
static void test_kv_transfer(void **s) {
    (void)s;
    replay("kv_transfer", nl_fuzz_kv_transfer, 5);
}

static void test_tokenizer_json(void **s) {
    (void)s;
    replay("tokenizer_json", nl_fuzz_tokenizer_json, 4);
}
static void test_prefill_answer(void **s) {
    (void)s;
    replay("prefill_answer", nl_fuzz_prefill_answer, 5);
}
static void test_http_server(void **s) {
    (void)s;
    replay("http_server", nl_fuzz_http_server, 5);
}

/* The first finding, pinned by its exact outcome: a 33-byte header whose fields multiply past
 * int64 (dim*hidden_dim*n_layers overflowed in the layout) must be refused as a format error
 * that names the file, before any size arithmetic can overflow (since nl_arch_validate bounds
 * every shape's parameter count, by that check). */
static void test_llama2c_header_overflow(void **s) {
    (void)s;
    const char *path = tu_src_path("fuzz/regress/llama2c/header-products-overflow-int64.bin");
    nl_llama2c m;
    assert_int_equal(nl_llama2c_read(&m, path), NL_ERR_FORMAT);
    print_message("refused: %s\n", nl_last_error());
    assert_non_null(strstr(nl_last_error(), "header-products-overflow-int64.bin"));
    assert_non_null(strstr(nl_last_error(), "multiplies past 2^53")); /* nl_arch_validate's bound */
    assert_null(m.weights);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors),    cmocka_unit_test(test_llama2c),
        cmocka_unit_test(test_gguf),           cmocka_unit_test(test_chat_template),
        cmocka_unit_test(test_tokenizer),      cmocka_unit_test(test_data),
        cmocka_unit_test(test_checkpoint),     cmocka_unit_test(test_catalog),
        cmocka_unit_test(test_scaling_csv),    cmocka_unit_test(test_train_state),
        cmocka_unit_test(test_cli_numbers),    cmocka_unit_test(test_names),
        cmocka_unit_test(test_formats_cli),    cmocka_unit_test(test_http_request),
        cmocka_unit_test(test_kv_transfer),    cmocka_unit_test(test_llama2c_header_overflow),
        cmocka_unit_test(test_tokenizer_json), cmocka_unit_test(test_prefill_answer),
        cmocka_unit_test(test_http_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
