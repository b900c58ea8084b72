/* A real pretrained model: llama2.c's stories260K (data/stories260K) loaded from its
 * legacy .bin, with its tok512 tokenizer. Greedy generation must print exactly the text in
 * data/README.md; the KV-cache path must agree with the batch forward; the mean loss on
 * TinyStories text must be in the expected range. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/tokenizer.h"
#include "nanolm/train.h"

#define BIN "stories260K/stories260K.bin"
#define TOK "stories260K/tok512.bin"

static void test_greedy_text(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    char args[2048], *out = NULL;
    snprintf(args, sizeof args,
             "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 64 --temperature 0", bin, tok);
    assert_int_equal(tu_run_cli(args, &out), 0);
    const char *want = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                       "One day, she saw a "
                       "big, red ball. She wanted to play with it, but it was too high.\nLily\n";
    print_message("%s", out);
    assert_int_equal(strncmp(out, want, strlen(want)), 0);
    free(out);
    /* the prompt's tokens, through --json */
    snprintf(args, sizeof args,
             "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 5 --temperature 0 --json", bin,
             tok);
    assert_int_equal(tu_run_cli(args, &out), 0);
    char *p = strstr(out, "\"prompt_tokens\":");
    assert_non_null(p);
    int ids[5], n = 0;
    for (p = strchr(p, '['); n < 5 && p && *p != ']'; n++) {
        p++;
        ids[n] = (int)strtol(p, &p, 10);
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    }
    int want_ids[5] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want_ids, sizeof ids);
    free(out);
}

/* Token-by-token inference with the KV cache gives the same logits as the batch forward. */
static void test_kv_cache_matches_forward(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tokp, TOK);
    nl_model m;
    char kind[64];
    assert_int_equal(nl_ckpt_load_model(bin, &m, kind), NL_OK);
    assert_string_equal(kind, "tok512");
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_load_llama2c(&tok, tokp, 512), NL_OK);
    const char *text =
        "Once upon a time, there was a big dog named Max. Max liked to run in the park with his friend Sue.";
    int *ids;
    int64_t n;
    assert_int_equal(nl_tokenizer_encode(&tok, text, strlen(text), 1, 0, &ids, &n), NL_OK);
    int64_t T = n - 1;
    assert_int_equal(nl_model_alloc_acts(&m, 1, T), NL_OK);
    nl_decode_state st;
    assert_int_equal(nl_decode_state_init(&st, &m, NL_KV_FP32), NL_OK);
    float loss;
    assert_int_equal(nl_model_forward(&m, ids, ids + 1, 1, T, &loss), NL_OK);
    double md = 0, mx = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *lg = nl_model_step(&m, &st, ids[t], t);
        assert_non_null(lg);
        for (int64_t v = 0; v < m.V; v++) {
            double d = fabs(lg[v] - m.train->a.logits[t * m.V + v]);
            if (d > md) md = d;
            if (fabs(lg[v]) > mx) mx = fabs(lg[v]);
        }
    }
    print_message("%lld positions: max |step - forward| = %.3g (max |logit| %.3g), loss %.4f\n", (long long)T, md, mx,
                  loss);
    assert_true(md <= 1e-4 * mx);
    nl_free(ids);
    nl_tokenizer_free(&tok);
    nl_decode_state_free(&st);
    nl_model_free(&m);
}

/* Mean loss on data/tinystories/tinystories_head.txt (tokenized once with BOS, windows
 * of seq_len 512). The issue expects 1.2..1.8; this file measures 1.836 because its later
 * stories contain 195 mis-decoded UTF-8 sequences ("â€™" for ’), rare in the model's training
 * text and expensive (1.639 with them mapped back; see docs/nanolm.md), so the bound checked
 * here is 1.9. The first 32 windows (clean text) are checked against 1.2..1.8. */
static void test_tinystories_loss(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    TU_REQUIRE_DATA(txt, "tinystories/tinystories_head.txt");
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "eval --ckpt %s --tokenizer %s --data %s --json", bin, tok, txt);
    assert_int_equal(tu_run_cli(args, &out), 0);
    char *p = strstr(out, "\"mean_loss\":");
    assert_non_null(p);
    double loss = atof(p + 12);
    p = strstr(out, "\"tokens\":");
    assert_non_null(p);
    long tokens = atol(p + 9);
    print_message("whole file: mean loss %.4f nats/token over %ld tokens\n", loss, tokens);
    assert_true(tokens > 90000);
    assert_true(loss >= 1.2 && loss <= 1.9);
    /* The non-ASCII byte-fallback split of the same mean: it must add up, and the mis-encoded
     * bytes are the surprising ones. */
    p = strstr(out, "\"non_ascii_byte_tokens\":");
    assert_non_null(p);
    long n_fb = atol(p + 24);
    p = strstr(out, "\"non_ascii_byte_mean_loss\":");
    assert_non_null(p);
    double fb = atof(p + 27);
    p = strstr(out, "\"other_tokens_mean_loss\":");
    assert_non_null(p);
    double rest = atof(p + 25);
    print_message("non-ASCII byte-fallback targets %ld, mean loss %.4f; others %.4f\n", n_fb, fb, rest);
    assert_true(n_fb > 0 && n_fb < tokens);
    assert_true(fabs((n_fb * fb + (tokens - n_fb) * rest) / tokens - loss) < 1e-3);
    assert_true(fb > rest);
    free(out);
    /* the clean head of the file: the first 32 windows of 512 tokens */
    nl_model m;
    assert_int_equal(nl_ckpt_load_model(bin, &m, NULL), NL_OK);
    nl_tokenizer tk;
    assert_int_equal(nl_tokenizer_load_llama2c(&tk, tok, 512), NL_OK);
    nl_data d;
    assert_int_equal(nl_data_open(&d, txt, &tk), NL_OK);
    assert_int_equal(nl_model_alloc_acts(&m, 4, 512), NL_OK);
    double head;
    int64_t scored;
    assert_int_equal(nl_eval_loss(&m, &d, NL_DATA_ALL, 4, 512, 32, &head, &scored), NL_OK);
    print_message("first %lld tokens: mean loss %.4f\n", (long long)scored, head);
    assert_int_equal(scored, 32 * 512);
    assert_true(head >= 1.2 && head <= 1.8);
    nl_data_free(&d);
    nl_tokenizer_free(&tk);
    nl_model_free(&m);
}

int main(void) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_text),
        cmocka_unit_test(test_kv_cache_matches_forward),
        cmocka_unit_test(test_tinystories_loss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
