/* nanolm tokenize: the ids it prints are the library's encoding of the text, the texts of the
 * tokens add up to the text, the counts agree; a Hugging Face folder, a tokenizer.json, a GGUF
 * file and "byte" load; --special matches "</s>" as one token; bad input is refused clearly. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/tokenizer.h"

static cJSON *run_json(const char *args) {
    char *out = NULL;
    int rc = tu_run_cli(args, &out);
    if (rc != 0) print_message("%s\n-> %d\n%s\n", args, rc, out ? out : "");
    assert_int_equal(rc, 0);
    cJSON *d = cJSON_Parse(strchr(out, '{'));
    assert_non_null(d);
    free(out);
    return d;
}

/* Checks one --json answer against the tokenizer loaded here. */
static void check(cJSON *d, const nl_tokenizer *tok, const char *text, int special) {
    int *ids;
    int64_t n;
    assert_int_equal(nl_tokenizer_encode_special(tok, text, strlen(text), 0, 0, special, &ids, &n), NL_OK);
    cJSON *toks = cJSON_GetObjectItem(d, "tokens");
    assert_int_equal(cJSON_GetArraySize(toks), (int)n);
    assert_int_equal(cJSON_GetObjectItem(d, "n_tokens")->valueint, (int)n);
    assert_int_equal(cJSON_GetObjectItem(d, "n_bytes")->valueint, (int)strlen(text));
    assert_int_equal(cJSON_GetObjectItem(d, "vocab_size")->valueint, tok->vocab_size);
    char joined[4096] = "";
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks) {
        assert_int_equal(cJSON_GetObjectItem(t, "id")->valueint, ids[i]);
        assert_string_equal(cJSON_GetObjectItem(t, "piece")->valuestring, nl_tokenizer_vocab_piece(tok, ids[i]));
        strncat(joined, cJSON_GetObjectItem(t, "text")->valuestring, sizeof joined - strlen(joined) - 1);
        i++;
    }
    assert_string_equal(joined, text); /* no control bytes in these texts: no escapes */
    nl_free(ids);
}

static void test_tokenize(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, "stories260K/stories260K.bin");
    TU_REQUIRE_DATA(tk, "stories260K/tok512.bin");
    char *dir = tu_tmpdir(), args[4096], *out = NULL;
    const char *text = "Once upon a time, Lily saw a cat.";
    /* llama2.c tokenizer.bin */
    nl_tokenizer l2c;
    assert_int_equal(nl_tokenizer_load_llama2c(&l2c, tk, 0), NL_OK);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text '%s' --json", tk, text);
    cJSON *d = run_json(args);
    assert_string_equal(cJSON_GetObjectItem(d, "kind")->valuestring, "llama2c");
    check(d, &l2c, text, 0);
    cJSON_Delete(d);
    nl_tokenizer_free(&l2c);
    /* a Hugging Face folder (exported), by folder and by its tokenizer.json; --special */
    snprintf(args, sizeof args, "export --ckpt '%s' --tokenizer '%s' --to hf '%s/m'", bin, tk, dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    char path[1024];
    snprintf(path, sizeof path, "%s/m/tokenizer.json", dir);
    nl_tokenizer hf;
    assert_int_equal(nl_tokenizer_load_json(&hf, path, 0), NL_OK);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s/m' --text '%s' --json", dir, text);
    d = run_json(args);
    assert_string_equal(cJSON_GetObjectItem(d, "kind")->valuestring, "hf");
    check(d, &hf, text, 0);
    cJSON_Delete(d);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text 'The end.</s>' --special --json", path);
    d = run_json(args);
    check(d, &hf, "The end.</s>", 1);
    cJSON *toks = cJSON_GetObjectItem(d, "tokens");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(toks, cJSON_GetArraySize(toks) - 1), "id")->valueint,
                     hf.eos_id);
    cJSON_Delete(d);
    nl_tokenizer_free(&hf);
    /* byte, counts only */
    snprintf(args, sizeof args, "tokenize --tokenizer byte --text 'caf\xc3\xa9' --count --json");
    d = run_json(args);
    assert_null(cJSON_GetObjectItem(d, "tokens"));
    assert_int_equal(cJSON_GetObjectItem(d, "n_tokens")->valueint, 5);
    assert_int_equal(cJSON_GetObjectItem(d, "n_chars")->valueint, 4);
    cJSON_Delete(d);
    /* a GGUF file (exported): its tokenizer gives the llama2.c tokenizer's ids */
    snprintf(args, sizeof args, "export --ckpt '%s' --tokenizer '%s' --to gguf '%s/m.gguf' --dtype f32", bin, tk, dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    assert_int_equal(nl_tokenizer_load_llama2c(&l2c, tk, 0), NL_OK);
    snprintf(args, sizeof args, "tokenize --tokenizer '%s/m.gguf' --text '%s' --json", dir, text);
    d = run_json(args);
    check(d, &l2c, text, 0);
    cJSON_Delete(d);
    nl_tokenizer_free(&l2c);
    /* refusals */
    assert_int_equal(tu_run_cli("tokenize --tokenizer no-such-model.gguf --text x", &out), 1);
    assert_non_null(strstr(out, "no-such-model.gguf"));
    free(out);
    assert_int_equal(tu_run_cli("tokenize --tokenizer byte", &out), 2);
    assert_non_null(strstr(out, "give --text TEXT or --file FILE"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tokenize)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
