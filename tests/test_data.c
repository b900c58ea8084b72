/* Data loader: the tinyshakespeare split, window layout, determinism, data-parallel slices,
 * evaluation windows, and the bad-input errors. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/data.h"
#include "nanolm/tokenizer.h"

/* Tokens equal to their position, so a window's start can be read off its first input. */
static void positional(nl_data *d, int64_t n) {
    int *t = malloc((size_t)n * sizeof(int));
    for (int64_t i = 0; i < n; i++) t[i] = (int)i;
    assert_int_equal(nl_data_from_tokens(d, "positional", t, n, (int)n), NL_OK);
    free(t);
}

static void test_shakespeare_split(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, "tinyshakespeare/input.txt");
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    nl_data d;
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    /* nanoGPT's prepare.py for this file: train 1,003,854 tokens, val 111,540. */
    assert_int_equal(d.n_tokens, 1115394);
    assert_int_equal(nl_data_split_tokens(&d, NL_DATA_TRAIN), 1003854);
    assert_int_equal(nl_data_split_tokens(&d, NL_DATA_VAL), 111540);
    assert_int_equal(nl_data_split_tokens(&d, NL_DATA_ALL), 1115394);
    assert_int_equal(nl_data_split_begin(&d, NL_DATA_VAL), 1003854);
    assert_int_equal(d.vocab_size, 256);
    assert_string_equal(nl_data_split_name(NL_DATA_VAL), "val");
    assert_int_equal(nl_data_check_window(&d, 64), NL_OK);
    /* The text starts "First Citizen:". */
    assert_int_equal(d.tokens[0], 'F');
    assert_int_equal(d.tokens[6], 'C');
    int in[12 * 64], tg[12 * 64];
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 1337, 0, 0, 1, 12, 64, in, tg), NL_OK);
    for (int b = 0; b < 12; b++)
        for (int t = 0; t + 1 < 64; t++) assert_int_equal(tg[b * 64 + t], in[b * 64 + t + 1]);
    assert_int_equal(nl_data_eval_windows(&d, NL_DATA_VAL, 64), (111540 - 1) / 64);
    nl_data_free(&d);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
}

static void test_windows_and_determinism(void **state) {
    (void)state;
    nl_data d;
    const int64_t N = 10000;
    positional(&d, N);
    assert_int_equal(d.n_train, 9000);
    const int B = 8, T = 16;
    int in[8 * 16], tg[8 * 16], in2[8 * 16], tg2[8 * 16];
    int64_t lo = N, hi = -1;
    double sum = 0;
    int steps = 400;
    for (int step = 0; step < steps; step++) {
        for (int s = NL_DATA_TRAIN; s <= NL_DATA_VAL; s++) {
            assert_int_equal(nl_data_batch(&d, (nl_data_split)s, 42, step, 0, 1, B, T, in, tg), NL_OK);
            for (int b = 0; b < B; b++) {
                int64_t start = in[b * T];
                int64_t begin = s == NL_DATA_VAL ? 9000 : 0, end = s == NL_DATA_VAL ? N : 9000;
                assert_true(start >= begin && start + T + 1 <= end); /* whole window inside the split */
                for (int t = 0; t < T; t++) {
                    assert_int_equal(in[b * T + t], start + t);
                    assert_int_equal(tg[b * T + t], start + t + 1);
                }
                if (s == NL_DATA_TRAIN) {
                    if (start < lo) lo = start;
                    if (start > hi) hi = start;
                    sum += (double)start;
                }
            }
        }
    }
    /* Starts cover the train split: 3200 uniform draws from 0..8983. */
    double mean = sum / (steps * B);
    print_message("train window starts: min %lld, max %lld, mean %.0f (uniform over 0..%d: 4491.5)\n", (long long)lo,
                  (long long)hi, mean, 9000 - T - 1);
    assert_true(lo < 50 && hi > 9000 - T - 1 - 50);
    assert_true(mean > 4300 && mean < 4700);

    /* Same (seed, step) -> same batch; another step or seed -> another batch. */
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 7, 5, 0, 1, B, T, in, tg), NL_OK);
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 7, 5, 0, 1, B, T, in2, tg2), NL_OK);
    assert_memory_equal(in, in2, sizeof in);
    assert_memory_equal(tg, tg2, sizeof tg);
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 7, 6, 0, 1, B, T, in2, tg2), NL_OK);
    assert_true(memcmp(in, in2, sizeof in) != 0);
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 8, 5, 0, 1, B, T, in2, tg2), NL_OK);
    assert_true(memcmp(in, in2, sizeof in) != 0);
    nl_data_free(&d);
}

/* R ranks of batch B together see exactly the batch of one process with B*R. */
static void test_data_parallel_slices(void **state) {
    (void)state;
    nl_data d;
    positional(&d, 50000);
    const int B = 3, T = 8;
    for (int R = 1; R <= 4; R++) {
        for (int64_t step = 0; step < 20; step++) {
            int *global_in = malloc((size_t)B * R * T * sizeof(int)),
                *global_tg = malloc((size_t)B * R * T * sizeof(int));
            assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 99, step, 0, 1, B * R, T, global_in, global_tg), NL_OK);
            for (int r = 0; r < R; r++) {
                int in[3 * 8], tg[3 * 8];
                assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 99, step, r, R, B, T, in, tg), NL_OK);
                assert_memory_equal(in, global_in + (size_t)r * B * T, sizeof in);
                assert_memory_equal(tg, global_tg + (size_t)r * B * T, sizeof tg);
            }
            if (R > 1) /* ranks draw different windows (45000 starts: equal first rows are a fluke) */
                assert_true(global_in[0] != global_in[B * T]);
            free(global_in);
            free(global_tg);
        }
    }
    int in[24], tg[24];
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 1, 0, 2, 2, B, T, in, tg), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "rank 2 is outside 0..world-1 (world 2)"));
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 1, 0, 0, 1, 0, T, in, tg), NL_ERR_INVALID);
    nl_data_free(&d);
}

static void test_eval_windows(void **state) {
    (void)state;
    nl_data d;
    positional(&d, 1000); /* val = tokens 900..999, 100 tokens */
    const int T = 16;
    int64_t nw = nl_data_eval_windows(&d, NL_DATA_VAL, T);
    assert_int_equal(nw, 99 / 16); /* 6 windows: targets 901..996 */
    int in[4 * 16], tg[4 * 16], k;
    assert_int_equal(nl_data_eval_batch(&d, NL_DATA_VAL, 0, 4, T, in, tg, &k), NL_OK);
    assert_int_equal(k, 4);
    for (int w = 0; w < 4; w++)
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[w * T + t], 900 + w * T + t);
            assert_int_equal(tg[w * T + t], 901 + w * T + t);
        }
    assert_int_equal(nl_data_eval_batch(&d, NL_DATA_VAL, 4, 4, T, in, tg, &k), NL_OK);
    assert_int_equal(k, 2); /* partial last batch */
    assert_int_equal(tg[2 * T - 1], 900 + 6 * T);
    assert_int_equal(nl_data_eval_batch(&d, NL_DATA_VAL, 6, 4, T, in, tg, &k), NL_OK);
    assert_int_equal(k, 0);
    /* Every target of the split, counted over all windows, appears exactly once. */
    int64_t all = nl_data_eval_windows(&d, NL_DATA_ALL, T);
    assert_int_equal(all, 999 / 16);
    char *seen = calloc(1000, 1);
    for (int64_t w = 0; w < all; w += 4) {
        assert_int_equal(nl_data_eval_batch(&d, NL_DATA_ALL, w, 4, T, in, tg, &k), NL_OK);
        for (int i = 0; i < k * T; i++) seen[tg[i]]++;
    }
    for (int i = 1; i <= all * T; i++) assert_int_equal(seen[i], 1);
    assert_int_equal(seen[0], 0);
    free(seen);
    assert_int_equal(nl_data_eval_batch(&d, NL_DATA_VAL, -1, 4, T, in, tg, &k), NL_ERR_INVALID);
    nl_data_free(&d);
}

static void test_llama2c_tokens(void **state) {
    (void)state;
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(path, "tinystories/tinystories_head.txt");
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_load_llama2c(&tok, tokp, 512), NL_OK);
    nl_data d;
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    assert_int_equal(d.tokens[0], 1); /* one BOS at the start of the file */
    assert_int_equal(d.vocab_size, 512);
    int64_t bos = 0;
    for (int64_t i = 0; i < d.n_tokens; i++) {
        assert_true(d.tokens[i] >= 0 && d.tokens[i] < 512);
        bos += d.tokens[i] == 1;
    }
    assert_int_equal(bos, 1);
    print_message("%s: %lld bytes -> %lld tokens, %lld eval windows of 512 over the whole file\n", path,
                  (long long)d.text_bytes, (long long)d.n_tokens,
                  (long long)nl_data_eval_windows(&d, NL_DATA_ALL, 512));
    /* Decoding the whole token stream gives the file back. */
    char *text;
    size_t n;
    assert_int_equal(nl_tokenizer_decode(&tok, d.tokens, d.n_tokens, &text, &n), NL_OK);
    assert_int_equal((int64_t)n, d.text_bytes);
    nl_free(text);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
}

static void test_bad_input(void **state) {
    (void)state;
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_init_byte(&tok), NL_OK);
    nl_data d;
    assert_int_equal(nl_data_open(&d, "/nonexistent/input.txt", &tok), NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "/nonexistent/input.txt"));
    assert_null(d.tokens);
    char *dir = tu_tmpdir();
    char path[256];
    snprintf(path, sizeof path, "%s/empty.txt", dir);
    assert_int_equal(nl_write_file_atomic(path, "", 0), NL_OK);
    assert_int_equal(nl_data_open(&d, path, &tok), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "empty.txt is empty"));
    /* 120 bytes: train 108, val 12 tokens; T = 64 needs 65. */
    snprintf(path, sizeof path, "%s/short.txt", dir);
    char text[120];
    memset(text, 'a', sizeof text);
    assert_int_equal(nl_write_file_atomic(path, text, sizeof text), NL_OK);
    assert_int_equal(nl_data_open(&d, path, &tok), NL_OK);
    assert_int_equal(nl_data_check_window(&d, 64), NL_ERR_INVALID);
    print_message("%s\n", nl_last_error());
    assert_non_null(strstr(nl_last_error(), "short.txt: 120 tokens; the validation split (last 10%, 12 tokens) is "
                                            "shorter than one window of T+1 = 65 tokens"));
    assert_int_equal(nl_data_check_window(&d, 200), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "the training split (first 90%, 108 tokens)"));
    int in[64], tg[64];
    assert_int_equal(nl_data_batch(&d, NL_DATA_VAL, 1, 0, 0, 1, 1, 64, in, tg), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "short.txt"));
    assert_int_equal(nl_data_batch(&d, NL_DATA_TRAIN, 1, 0, 0, 1, 1, 64, in, tg), NL_OK);
    assert_int_equal(nl_data_check_window(&d, 11), NL_OK);
    nl_data_free(&d);
    int bad[3] = {1, 300, 2};
    assert_int_equal(nl_data_from_tokens(&d, "mem", bad, 3, 256), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "token 300 at position 1"));
    tu_rmdir(dir);
    free(dir);
    nl_tokenizer_free(&tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shakespeare_split),    cmocka_unit_test(test_windows_and_determinism),
        cmocka_unit_test(test_data_parallel_slices), cmocka_unit_test(test_eval_windows),
        cmocka_unit_test(test_llama2c_tokens),       cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
