/* Tokenizers: the llama2.c tok512 vocabulary on known prompts, the fast word-wise encoder
 * against a plain transcription of run.c's whole-text loop, decode round trips on real text,
 * byte-level tokens, bad files. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/tokenizer.h"

/* Reference: run.c's encode written out plainly over the whole text (no word splitting, a
 * fresh lookup of every pair on every round). Returns the token count. */
static int64_t ref_encode(const nl_tokenizer *t, const char *text, size_t n, int bos, int *out) {
    int64_t m = 0;
    if (bos) out[m++] = 1;
    if (n) out[m++] = nl_tokenizer_lookup(t, " ");
    char buf[8];
    int sl = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c & 0xC0) != 0x80) sl = 0;
        buf[sl++] = (char)c;
        buf[sl] = 0;
        unsigned char next = i + 1 < n ? (unsigned char)text[i + 1] : 0;
        if ((next & 0xC0) == 0x80 && sl < 4) continue;
        int id = nl_tokenizer_lookup(t, buf);
        if (id != -1)
            out[m++] = id;
        else
            for (int j = 0; j < sl; j++) out[m++] = (unsigned char)buf[j] + 3;
        sl = 0;
    }
    char *cat = malloc(2 * (size_t)t->max_token_length + 2);
    for (;;) {
        float best = -1e10f;
        int64_t best_i = -1;
        int best_id = -1;
        for (int64_t i = 0; i + 1 < m; i++) {
            sprintf(cat, "%s%s", t->pieces[out[i]], t->pieces[out[i + 1]]);
            int id = nl_tokenizer_lookup(t, cat);
            if (id != -1 && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_i == -1) break;
        out[best_i] = best_id;
        for (int64_t i = best_i + 1; i < m - 1; i++) out[i] = out[i + 1];
        m--;
    }
    free(cat);
    return m;
}

static void check_tokens(const nl_tokenizer *t, const char *text, const int *want, int n_want) {
    int *tok;
    int64_t n;
    assert_int_equal(nl_tokenizer_encode(t, text, strlen(text), 1, 0, &tok, &n), NL_OK);
    char got[256] = "";
    for (int64_t i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", tok[i]);
    print_message("\"%s\" -> %s\n", text, got);
    assert_int_equal(n, n_want);
    for (int i = 0; i < n_want; i++) assert_int_equal(tok[i], want[i]);
    nl_free(tok);
}

static void test_known_prompts(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, "stories260K/tok512.bin");
    nl_tokenizer t;
    assert_int_equal(nl_tokenizer_load_llama2c(&t, path, 512), NL_OK);
    assert_int_equal(t.vocab_size, 512);
    assert_int_equal(t.words_independent, 1);
    const int once[] = {1, 403, 407, 261, 378}, zoo[] = {1, 410, 469, 347};
    check_tokens(&t, "Once upon a time", once, 5);
    check_tokens(&t, "Zoo", zoo, 4);
    /* With EOS, and an empty prompt (no dummy prefix). */
    int *tok;
    int64_t n;
    assert_int_equal(nl_tokenizer_encode(&t, "Zoo", 3, 1, 1, &tok, &n), NL_OK);
    assert_int_equal(n, 5);
    assert_int_equal(tok[4], 2);
    nl_free(tok);
    assert_int_equal(nl_tokenizer_encode(&t, "", 0, 1, 0, &tok, &n), NL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(tok[0], 1);
    nl_free(tok);
    assert_int_equal(nl_tokenizer_lookup(&t, " Once"), 403);
    assert_int_equal(nl_tokenizer_lookup(&t, "no such piece"), -1);

    /* Decode piece by piece as run.c prints: BOS strips the leading space, <0x0A> is a newline. */
    size_t len;
    const char *p = nl_tokenizer_piece(&t, 1, 403, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(p, "Once", 4);
    p = nl_tokenizer_piece(&t, 403, 407, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(p, " upon", 5);
    p = nl_tokenizer_piece(&t, 403, 3 + '\n', &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], '\n');
    assert_int_equal(nl_tokenizer_piece_printable(p, len), 1);
    p = nl_tokenizer_piece(&t, 403, 3 + 0x01, &len);
    assert_int_equal(nl_tokenizer_piece_printable(p, len), 0); /* raw control byte */
    p = nl_tokenizer_piece(&t, 403, 3, &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 0);
    assert_int_equal(nl_tokenizer_piece_printable(p, len), 0);
    assert_null(nl_tokenizer_piece(&t, 1, 512, &len));
    assert_non_null(strstr(nl_last_error(), "token 512 is outside the vocabulary"));
    int bad[] = {1, 403, -4};
    char *text;
    size_t tb;
    assert_int_equal(nl_tokenizer_decode(&t, bad, 3, &text, &tb), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "token -4 at position 2"));
    nl_tokenizer_free(&t);
    nl_tokenizer_free(&t);
}

/* The word-wise encoder equals the whole-text reference on real and adversarial strings. */
static void test_matches_reference(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, "stories260K/tok512.bin");
    nl_tokenizer t;
    assert_int_equal(nl_tokenizer_load_llama2c(&t, path, 0), NL_OK);
    const char *cases[] = {
        "",
        " ",
        "  ",
        "a",
        " leading",
        "trailing ",
        "two  spaces   three",
        "\n\nnew\nlines \n",
        "caf\xc3\xa9 na\xc3\xafve \xe2\x80\x9cquoted\xe2\x80\x9d \xf0\x9f\x98\x80 emoji",
        "invalid \xff\xfe utf8 \x80\x80\x80\x80\x80 cont",
        "tab\there",
        "<0x41> <unk> <s>",
        "Lily and Ben went to the park. They saw a big dog!",
    };
    int *ref = malloc(4096 * sizeof(int));
    int64_t checked = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = strlen(cases[c]);
        int *tok;
        int64_t m;
        assert_int_equal(nl_tokenizer_encode(&t, cases[c], n, 1, 0, &tok, &m), NL_OK);
        int64_t rm = ref_encode(&t, cases[c], n, 1, ref);
        assert_int_equal(m, rm);
        assert_memory_equal(tok, ref, (size_t)m * sizeof(int));
        nl_free(tok);
        checked++;
    }
    /* Random strings over a small alphabet rich in spaces, multi-byte and invalid sequences. */
    const char *alpha[] = {" ",
                           " ",
                           "  ",
                           "e",
                           "t",
                           "he",
                           "a",
                           "Z",
                           "oo",
                           ".",
                           "\n",
                           "\xc3\xa9",
                           "\xe2\x80\x9c",
                           "\x80",
                           "\xff",
                           "\xf0\x9f\x98\x80",
                           "<",
                           "0x",
                           ">",
                           "A",
                           "\t"};
    nl_rng r;
    nl_rng_seed(&r, 3);
    char s[512];
    for (int trial = 0; trial < 300; trial++) {
        size_t n = 0;
        int parts = 1 + (int)nl_rng_below(&r, 60);
        for (int i = 0; i < parts; i++) {
            const char *a = alpha[nl_rng_below(&r, sizeof alpha / sizeof alpha[0])];
            memcpy(s + n, a, strlen(a));
            n += strlen(a);
        }
        int *tok;
        int64_t m;
        assert_int_equal(nl_tokenizer_encode(&t, s, n, trial & 1, 0, &tok, &m), NL_OK);
        int64_t rm = ref_encode(&t, s, n, trial & 1, ref);
        if (m != rm || memcmp(tok, ref, (size_t)m * sizeof(int)) != 0) fail_msg("random case %d differs", trial);
        nl_free(tok);
        checked++;
    }
    /* Real text: the first 3000 bytes of TinyStories as one sequence. */
    const char *ts = tu_data_path("tinystories/tinystories_head.txt");
    if (ts) {
        size_t n;
        char *text = tu_read_file(ts, &n);
        n = 3000;
        int *tok;
        int64_t m;
        assert_int_equal(nl_tokenizer_encode(&t, text, n, 1, 0, &tok, &m), NL_OK);
        int64_t rm = ref_encode(&t, text, n, 1, ref);
        assert_int_equal(m, rm);
        assert_memory_equal(tok, ref, (size_t)m * sizeof(int));
        print_message("3000 bytes of TinyStories -> %lld tokens, equal to the reference\n", (long long)m);
        nl_free(tok);
        /* The same text with its spaces removed: one long word, many merges. */
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (text[i] != ' ') text[k++] = text[i];
        assert_int_equal(nl_tokenizer_encode(&t, text, k, 1, 0, &tok, &m), NL_OK);
        rm = ref_encode(&t, text, k, 1, ref);
        assert_int_equal(m, rm);
        assert_memory_equal(tok, ref, (size_t)m * sizeof(int));
        print_message("the same without spaces: %zu bytes -> %lld tokens, equal to the reference\n", k, (long long)m);
        nl_free(tok);
        checked++;
        free(text);
        checked++;
    }
    print_message("%lld texts encoded identically by the word-wise and the whole-text encoder\n", (long long)checked);
    free(ref);
    nl_tokenizer_free(&t);
}

/* A vocabulary with pieces that span a space ("e t", "d a"): merges cross word starts, so the
 * encoder must treat the text as one sequence, and still equal the reference. */
static void test_cross_word_vocab(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, "stories260K/tok512.bin");
    size_t n;
    char *raw = tu_read_file(path, &n);
    char *dir = tu_tmpdir();
    char ext[256];
    snprintf(ext, sizeof ext, "%s/tok514.bin", dir);
    FILE *f = fopen(ext, "wb");
    fwrite(raw, 1, n, f);
    const char *extra[2] = {"e t", "d a"};
    const float score[2] = {-5.0f, 0.5f};
    for (int i = 0; i < 2; i++) {
        int32_t len = 3;
        fwrite(&score[i], 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(extra[i], 1, 3, f);
    }
    fclose(f);
    free(raw);
    nl_tokenizer t;
    assert_int_equal(nl_tokenizer_load_llama2c(&t, ext, 514), NL_OK);
    assert_int_equal(t.words_independent, 0);
    const char *cases[] = {"the tree and a dog", "she ate the cake",
                           "Once upon a time",   "red and blue",
                           "  e  t  d  a  ",     "Lily and Ben went to the park. They saw a big dog!"};
    int ref[256];
    int crossed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int *tok;
        int64_t m;
        size_t len = strlen(cases[c]);
        assert_int_equal(nl_tokenizer_encode(&t, cases[c], len, 1, 0, &tok, &m), NL_OK);
        int64_t rm = ref_encode(&t, cases[c], len, 1, ref);
        assert_int_equal(m, rm);
        assert_memory_equal(tok, ref, (size_t)m * sizeof(int));
        for (int64_t i = 0; i < m; i++) crossed += tok[i] >= 512;
        nl_free(tok);
    }
    print_message("%d tokens of the extra cross-word pieces used; all equal to the reference\n", crossed);
    assert_true(crossed > 0);
    nl_tokenizer_free(&t);
    tu_rmdir(dir);
    free(dir);
}

/* encode -> decode gives the text back, for whole real files. */
static void round_trip_file(const nl_tokenizer *t, const char *path) {
    size_t n;
    char *text = tu_read_file(path, &n);
    assert_non_null(text);
    int *tok;
    int64_t m;
    double t0 = nl_time_s();
    assert_int_equal(nl_tokenizer_encode(t, text, n, 1, 0, &tok, &m), NL_OK);
    double t1 = nl_time_s();
    char *back;
    size_t bn;
    assert_int_equal(nl_tokenizer_decode(t, tok, m, &back, &bn), NL_OK);
    assert_int_equal(bn, n);
    assert_memory_equal(back, text, n);
    print_message("%s: %zu bytes -> %lld tokens (%.2f bytes/token, %.3f s), decodes back exactly\n", path, n,
                  (long long)m, (double)n / (double)m, t1 - t0);
    for (int64_t i = 0; i < m; i++) assert_true(tok[i] >= 0 && tok[i] < t->vocab_size);
    nl_free(back);
    nl_free(tok);
    free(text);
}

static void test_round_trips(void **state) {
    (void)state;
    TU_REQUIRE_DATA(tokp, "stories260K/tok512.bin");
    TU_REQUIRE_DATA(head, "tinystories/tinystories_head.txt");
    nl_tokenizer t;
    assert_int_equal(nl_tokenizer_load_llama2c(&t, tokp, 512), NL_OK);
    round_trip_file(&t, head);
    const char *sample = tu_data_path("tinystories/tinystories_sample.txt"); /* curly quotes */
    if (sample) round_trip_file(&t, sample);
    const char *shakespeare = tu_data_path("tinyshakespeare/input.txt");
    if (shakespeare) round_trip_file(&t, shakespeare);
    nl_tokenizer_free(&t);
}

static void test_byte_tokenizer(void **state) {
    (void)state;
    nl_tokenizer t;
    assert_int_equal(nl_tokenizer_init_byte(&t), NL_OK);
    assert_int_equal(t.vocab_size, 256);
    assert_int_equal(t.bos_id, -1);
    assert_string_equal(nl_tokenizer_kind_name(t.kind), "byte");
    char all[256];
    for (int i = 0; i < 256; i++) all[i] = (char)i;
    int *tok;
    int64_t n;
    assert_int_equal(nl_tokenizer_encode(&t, all, 256, 1, 1, &tok, &n), NL_OK); /* bos/eos ignored */
    assert_int_equal(n, 256);
    for (int i = 0; i < 256; i++) assert_int_equal(tok[i], i);
    char *back;
    size_t bn;
    assert_int_equal(nl_tokenizer_decode(&t, tok, n, &back, &bn), NL_OK);
    assert_int_equal(bn, 256);
    assert_memory_equal(back, all, 256);
    nl_free(back);
    nl_free(tok);
    size_t len;
    const char *p = nl_tokenizer_piece(&t, -1, 'A', &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 'A');
    assert_int_equal(nl_tokenizer_lookup(&t, "A"), 'A');
    assert_int_equal(nl_tokenizer_lookup(&t, "AB"), -1);
    /* A copy of the struct stays usable (pieces are not pointers into the struct). */
    nl_tokenizer copy = t;
    assert_int_equal(copy.pieces['z'][0], 'z');
    nl_tokenizer_free(&t);
}

static void write_bytes(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static void expect_load_fail(const char *path, int vocab, nl_status code, const char *want) {
    nl_tokenizer t;
    nl_status rc = nl_tokenizer_load_llama2c(&t, path, vocab);
    if (rc != code || !strstr(nl_last_error(), want))
        fail_msg("expected rc %d with \"%s\", got rc %d: %s", code, want, rc, nl_last_error());
    assert_null(t.pieces);
}

static void test_bad_files(void **state) {
    (void)state;
    TU_REQUIRE_DATA(path, "stories260K/tok512.bin");
    expect_load_fail("/nonexistent/tok.bin", 0, NL_ERR_IO, "/nonexistent/tok.bin");
    size_t n;
    char *raw = tu_read_file(path, &n);
    char *dir = tu_tmpdir();
    char bad[256];
    snprintf(bad, sizeof bad, "%s/tok.bin", dir);
    /* Truncated anywhere: the message names the byte (and for the model's vocab, the token). */
    size_t cuts[] = {0, 3, 4, 10, 2000, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_bytes(bad, raw, cuts[i]);
        char want[64];
        snprintf(want, sizeof want, "truncated at byte %zu", cuts[i]);
        expect_load_fail(bad, 512, NL_ERR_FORMAT, want);
    }
    /* Without a vocab size a cut inside the byte fallbacks is still caught. */
    write_bytes(bad, raw, 1000);
    expect_load_fail(bad, 0, NL_ERR_FORMAT, "truncated at byte 1000");
    /* The model's vocab size must match the file. */
    expect_load_fail(path, 500, NL_ERR_FORMAT, "more tokens than the model's vocab_size 500");
    expect_load_fail(path, 600, NL_ERR_FORMAT, "token 512 needs 8 bytes");
    /* Corrupt fields. */
    char *c = malloc(n);
    memcpy(c, raw, n);
    int32_t v = -5;
    memcpy(c, &v, 4);
    write_bytes(bad, c, n);
    expect_load_fail(bad, 512, NL_ERR_FORMAT, "max_token_length -5 is out of range");
    memcpy(c, raw, n);
    v = 1000; /* length of token 0 */
    memcpy(c + 8, &v, 4);
    write_bytes(bad, c, n);
    expect_load_fail(bad, 512, NL_ERR_FORMAT, "token 0 has length 1000");
    memcpy(c, raw, n);
    {
        size_t p = 4;
        for (int i = 0; i < 3; i++) {
            int32_t l;
            memcpy(&l, c + p + 4, 4);
            p += 8 + (size_t)l;
        }
        c[p + 8 + 4] = 'G'; /* "<0x00>" -> "<0x0G>" */
    }
    write_bytes(bad, c, n);
    expect_load_fail(bad, 512, NL_ERR_FORMAT, "token 3 is \"<0x0G>\", expected the byte fallback <0x00>");
    free(c);
    free(raw);
    tu_rmdir(dir);
    free(dir);
}

/* A piece shown as one line: UTF-8 kept, control bytes, backslashes and stray bytes escaped. */
static void test_escape(void **state) {
    (void)state;
    const char in[] = "h\xc3\xa9\tl\\o\n\x01\xff\xe2\x82 \x7f\r";
    char *e = nl_tokenizer_escape(in, sizeof in - 1);
    assert_non_null(e);
    assert_string_equal(e, "h\xc3\xa9\\tl\\\\o\\n\\x01\\xff\\xe2\\x82 \\x7f\\r");
    nl_free(e);
    const char overlong[] = "\xc0\xaf\xed\xa0\x80\xf0\x9f\x98\x80"; /* overlong, surrogate, then an emoji */
    e = nl_tokenizer_escape(overlong, sizeof overlong - 1);
    assert_string_equal(e, "\\xc0\\xaf\\xed\\xa0\\x80\xf0\x9f\x98\x80");
    nl_free(e);
    e = nl_tokenizer_escape("", 0);
    assert_string_equal(e, "");
    nl_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_prompts),    cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_cross_word_vocab), cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_byte_tokenizer),   cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
