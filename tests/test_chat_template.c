/* Chat templates (nanolm/chat_template.h): the real templates of Llama 3.2, Qwen2.5, Mistral
 * (7B-Instruct-v0.1 and Nemo-Instruct-2407), SmolLM2 and TinyLlama (the .jinja files of tests/ref/chat) render
 * each conversation byte for byte as transformers' apply_chat_template does
 * (tests/ref/make_chat_fixture.py wrote tests/ref/chat/cases.json with Jinja2 in transformers'
 * environment); the conversations a template refuses fail with its raise_exception message.
 * Then the Jinja semantics the templates lean on, errors that name the line, and loading a
 * Hugging Face folder's template. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/chat_template.h"
#include "nanolm/gguf.h"
#include "nanolm/model_load.h"
#include "nanolm/tokenizer.h"

static cJSON *load_cases(void) {
    size_t n = 0;
    char *text = tu_read_file(tu_src_path("tests/ref/chat/cases.json"), &n);
    assert_non_null(text);
    cJSON *fx = cJSON_ParseWithLength(text, n);
    free(text);
    assert_non_null(fx);
    return fx;
}

/* Renders every case of one template and compares with the fixture. */
static void check_template(const char *name) {
    cJSON *fx = load_cases();
    const cJSON *c;
    int checked = 0, failed = 0;
    nl_chat_template *t = NULL;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "template")->valuestring, name)) continue;
        if (!t) {
            char rel[256];
            snprintf(rel, sizeof rel, "tests/ref/chat/%s", cJSON_GetObjectItem(c, "file")->valuestring);
            size_t n = 0;
            char *src = tu_read_file(tu_src_path(rel), &n);
            assert_non_null(src);
            assert_int_equal(nl_chat_template_parse(&t, src, n, rel), NL_OK);
            free(src);
        }
        const cJSON *bos = cJSON_GetObjectItem(c, "bos_token"), *eos = cJSON_GetObjectItem(c, "eos_token");
        assert_int_equal(nl_chat_template_set_tokens(t, cJSON_IsString(bos) ? bos->valuestring : NULL,
                                                     cJSON_IsString(eos) ? eos->valuestring : NULL),
                         NL_OK);
        cJSON *vars = cJSON_Duplicate(cJSON_GetObjectItem(c, "vars"), 1);
        cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(cJSON_GetObjectItem(c, "messages"), 1));
        cJSON_AddBoolToObject(vars, "add_generation_prompt",
                              cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")));
        char *vj = cJSON_PrintUnformatted(vars);
        cJSON_Delete(vars);
        char *out = NULL;
        size_t out_n = 0;
        nl_status rc = nl_chat_template_render_json(t, vj, strlen(vj), &out, &out_n);
        free(vj);
        const char *conv = cJSON_GetObjectItem(c, "conversation")->valuestring;
        int agp = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        const cJSON *want = cJSON_GetObjectItem(c, "expected"), *err = cJSON_GetObjectItem(c, "error");
        if (want) {
            if (rc != NL_OK) {
                print_error("%s/%s agp=%d: failed: %s\n", name, conv, agp, nl_last_error());
                failed++;
            } else if (out_n != strlen(want->valuestring) || memcmp(out, want->valuestring, out_n)) {
                print_error("%s/%s agp=%d:\n  got  [%s]\n  want [%s]\n", name, conv, agp, out, want->valuestring);
                failed++;
            }
        } else {
            assert_non_null(err);
            if (rc == NL_OK) {
                print_error("%s/%s agp=%d: rendered, but Jinja2 raised \"%s\"\n", name, conv, agp, err->valuestring);
                failed++;
            } else if (!strstr(nl_last_error(), err->valuestring) || !strstr(nl_last_error(), "raise_exception") ||
                       !strstr(nl_last_error(), " line ")) {
                print_error("%s/%s agp=%d: error \"%s\" does not carry \"%s\" and its line\n", name, conv, agp,
                            nl_last_error(), err->valuestring);
                failed++;
            }
        }
        free(out);
        checked++;
    }
    nl_chat_template_free(t);
    cJSON_Delete(fx);
    print_message("[          ] %s: %d conversations, %d differ\n", name, checked, failed);
    assert_true(checked >= 20);
    assert_int_equal(failed, 0);
}

static void test_llama32(void **state) {
    (void)state;
    check_template("llama3.2");
}
static void test_qwen25(void **state) {
    (void)state;
    check_template("qwen2.5");
}
static void test_mistral_v01(void **state) {
    (void)state;
    check_template("mistral-v0.1");
}
static void test_mistral_nemo(void **state) {
    (void)state;
    check_template("mistral-nemo");
}
static void test_smollm2(void **state) {
    (void)state;
    check_template("smollm2");
}
static void test_tinyllama(void **state) {
    (void)state;
    check_template("tinyllama");
}

/* Renders `src` with `vars` (JSON) and returns the text (NULL on error). */
static char *render(const char *src, const char *vars) {
    nl_chat_template *t = NULL;
    if (nl_chat_template_parse(&t, src, strlen(src), "inline")) return NULL;
    char *out = NULL;
    nl_status rc = nl_chat_template_render_json(t, vars, strlen(vars), &out, NULL);
    nl_chat_template_free(t);
    return rc ? NULL : out;
}

static void expect(const char *src, const char *vars, const char *want) {
    char *got = render(src, vars);
    if (!got) fail_msg("%s: %s", src, nl_last_error());
    if (strcmp(got, want)) fail_msg("%s:\n  got  [%s]\n  want [%s]", src, got, want);
    free(got);
}

/* Semantics the templates rely on, each checked against what Jinja2 prints for it (values
 * worked out by hand from Jinja2's and Python's rules). */
static void test_semantics(void **state) {
    (void)state;
    /* set inside a loop stays in the loop; namespace() carries values out */
    expect("{% set x = 1 %}{% for i in [1,2] %}{% set x = i %}{% endfor %}{{ x }}", "{}", "1");
    expect("{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}", "{}", "2");
    /* Python printing and operators */
    expect("{{ none }} {{ true }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 1 ~ 'a' }}", "{}",
           "None True 3 -4 2 3.5 1a");
    expect("{{ [1, 'a'] }} {{ {'k': none} }}", "{}", "[1, 'a'] {'k': None}");
    /* loop variables, filters, tests, slices */
    expect("{% for x in 'abc' %}{{ loop.index0 }}{{ x }}{% if loop.last %}!{% endif %}{% endfor %}", "{}", "0a1b2c!");
    expect("{% for k, v in d.items() if k != 'b' %}{{ k }}={{ v }};{% else %}none{% endfor %}",
           "{\"d\": {\"a\": 1, \"b\": 2, \"c\": 3}}", "a=1;c=3;");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", "{}", "empty");
    expect("{{ ' a b '|trim }}|{{ 'abc'[1:] }}|{{ 'abc'[::-1] }}|{{ [1,2,3][-1] }}|{{ 'héllo'|length }}", "{}",
           "a b|bc|cba|3|5");
    expect("{{ x is defined }} {{ y is none }} {{ 'a' in 'cat' }} {{ 2 not in [1] }} {{ m is mapping }}",
           "{\"y\": null, \"m\": {}}", "False True True True True");
    expect("{{ z|default('dflt') }} {{ ''|default('e', true) }} {{ 'x'.upper() }} {{ 'ab'.startswith('a') }}", "{}",
           "dflt e X True");
    expect("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join(',') }}",
           "{\"ms\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"x\", \"c\": 2}, {\"role\": \"user\", \"c\": 3}]}",
           "1,3");
    expect("{{ d|tojson }}|{{ 'é\"\\n'|tojson }}", "{\"d\": {\"a\": [1, 2.5, true, null]}}",
           "{\"a\": [1, 2.5, true, null]}|\"é\\\"\\n\"");
    expect("{% for i in range(3) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}", "{}", "02");
    expect("{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}", "{}", "01");
    expect("{{ 'a' if x else 'b' }}{{ 'c' if true }}", "{}", "bc");
    expect("{% set b %}in{{ 1 + 1 }}{% endset %}[{{ b }}]", "{}", "[in2]");
    /* whitespace control: trim_blocks, lstrip_blocks, {%- -%}, {%+ */
    expect("a\n  {% if true %}\n  b\n  {% endif %}\nc", "{}", "a\n  b\nc");
    expect("a  {%- if true -%}  b  {%- endif %} c", "{}", "ab c");
    expect("x\n    {%+ if true %}y{% endif %}", "{}", "x\n    y");
    expect("{# comment #}\nz", "{}", "z");
    /* strftime_now gives today's date as strftime does */
    char today[64];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(today, sizeof today, "%d %b %Y", &tm);
    char *got = render("{{ strftime_now('%d %b %Y') }}", "{}");
    assert_non_null(got);
    /* a day boundary between the two calls would differ: accept either side */
    if (strcmp(got, today)) {
        now = time(NULL);
        localtime_r(&now, &tm);
        strftime(today, sizeof today, "%d %b %Y", &tm);
    }
    assert_string_equal(got, today);
    free(got);
}

static void expect_error(const char *src, const char *vars, const char *needle) {
    nl_chat_template *t = NULL;
    nl_status rc = nl_chat_template_parse(&t, src, strlen(src), "inline");
    if (rc == NL_OK) {
        char *out = NULL;
        rc = nl_chat_template_render_json(t, vars, strlen(vars), &out, NULL);
        free(out);
        nl_chat_template_free(t);
    }
    assert_int_not_equal(rc, NL_OK);
    if (!strstr(nl_last_error(), needle)) fail_msg("error \"%s\" lacks \"%s\"", nl_last_error(), needle);
}

static void test_errors_name_the_place(void **state) {
    (void)state;
    expect_error("ok\n{% if x %}never closed", "{}",
                 "chat template inline line 2 col 4: 'if' opened here is never closed");
    expect_error("{{ 1 +  }}", "{}", "line 1 col 9: expected an expression");
    expect_error("{% endfor %}", "{}", "'endfor' without a matching opening tag");
    expect_error("{% macro m() %}{% endmacro %}", "{}", "unsupported statement 'macro'");
    expect_error("a\nb {{ x|nosuch }}", "{}", "line 2 col 8: unknown filter 'nosuch'");
    expect_error("{{ 'a' + 1 }}", "{}", "unsupported operand types for +: string and int");
    expect_error("{{ u.x }}", "{}", "'u' is undefined");
    expect_error("{{ raise_exception('no system role') }}", "{}", "line 1 col 19: raise_exception: no system role");
    expect_error("{{ 'unterminated }}", "{}", "unterminated string literal");
    expect_error("{% set ns = {} %}{% set ns.a = 1 %}", "{}", "only of a namespace()");
    expect_error("{{ x }}", "[1]", "not a JSON object");
    /* a runaway template stops at the step or memory budget instead of hanging the server */
    expect_error("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", "{}",
                 "chat template inline");
    assert_true(strstr(nl_last_error(), "ran more than 2000000 statements") ||
                strstr(nl_last_error(), "rendering took more than 256 MiB"));
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_hf(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    nl_chat_template *t = NULL;
    /* no template at all */
    write_file(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    assert_int_equal(nl_chat_template_load_hf(&t, dir), NL_ERR_UNSUPPORTED);
    assert_non_null(strstr(nl_last_error(), "has no chat template"));
    /* tokenizer_config.json: the template, and bos/eos as a string and as an object */
    write_file(
        dir, "tokenizer_config.json",
        "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\", \"lstrip\": false},"
        " \"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\"}");
    assert_int_equal(nl_chat_template_load_hf(&t, dir), NL_OK);
    nl_chat_message msgs[2] = {{"user", "hi"}, {"assistant", "yo"}};
    char *out = NULL;
    assert_int_equal(nl_chat_template_apply(t, msgs, 2, 1, &out, NULL), NL_OK);
    assert_string_equal(out, "<s>hi</s>yo</s>");
    free(out);
    nl_chat_template_free(t);
    /* chat_template.jinja wins over tokenizer_config.json */
    write_file(dir, "chat_template.jinja", "J{{ messages|length }}{% if add_generation_prompt %}+{% endif %}");
    assert_int_equal(nl_chat_template_load_hf(&t, dir), NL_OK);
    assert_int_equal(nl_chat_template_apply(t, msgs, 2, 1, &out, NULL), NL_OK);
    assert_string_equal(out, "J2+");
    free(out);
    nl_chat_template_free(t);
    /* a syntax error names the file */
    write_file(dir, "chat_template.jinja", "{% for %}");
    assert_int_not_equal(nl_chat_template_load_hf(&t, dir), NL_OK);
    assert_non_null(strstr(nl_last_error(), "chat_template.jinja line 1"));
    tu_rmdir(dir);
    free(dir);
}

/* The template `serve` uses for a model: the folder's own, none for a plain file, a --chat-template
 * file taking bos/eos from the folder's tokenizer_config.json, or from the byte tokenizer (none). */
static void test_for_model(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), file[1100], tmpl[1100];
    nl_chat_template *t = (nl_chat_template *)1;
    nl_chat_message msgs[1] = {{"user", "hi"}};
    char *out = NULL;
    write_file(dir, "tokenizer_config.json",
               "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"chat_template\": \"F{{ bos_token }}\"}");
    assert_int_equal(nl_model_load_chat_template(&t, dir, NULL, NULL), NL_OK);
    assert_non_null(t);
    assert_int_equal(nl_chat_template_apply(t, msgs, 1, 0, &out, NULL), NL_OK);
    assert_string_equal(out, "F<s>");
    free(out);
    nl_chat_template_free(t);
    write_file(dir, "mine.jinja", "M{{ bos_token }}{{ messages[0].content }}{{ eos_token }}");
    snprintf(tmpl, sizeof tmpl, "%s/mine.jinja", dir);
    assert_int_equal(nl_model_load_chat_template(&t, dir, tmpl, NULL), NL_OK);
    assert_int_equal(nl_chat_template_apply(t, msgs, 1, 0, &out, NULL), NL_OK);
    assert_string_equal(out, "M<s>hi</s>"); /* bos/eos of the folder's template */
    free(out);
    nl_chat_template_free(t);
    snprintf(file, sizeof file, "%s/tokenizer_config.json", dir); /* a file, not a model folder */
    assert_int_equal(nl_model_load_chat_template(&t, file, NULL, NULL), NL_OK);
    assert_null(t);
    nl_tokenizer byte;
    assert_int_equal(nl_tokenizer_init_byte(&byte), NL_OK);
    assert_int_equal(nl_model_load_chat_template(&t, file, tmpl, &byte), NL_OK);
    assert_int_equal(nl_chat_template_apply(t, msgs, 1, 0, &out, NULL), NL_OK);
    assert_string_equal(out, "Mhi"); /* no BOS / EOS pieces to take */
    free(out);
    nl_chat_template_free(t);
    nl_tokenizer_free(&byte);
    write_file(dir, "bad.jinja", "{% for %}");
    snprintf(tmpl, sizeof tmpl, "%s/bad.jinja", dir);
    assert_int_not_equal(nl_model_load_chat_template(&t, dir, tmpl, NULL), NL_OK);
    assert_null(t);
    assert_non_null(strstr(nl_last_error(), "bad.jinja"));
    write_file(dir, "chat_template.jinja", "{% for %}"); /* the folder's own is broken: an error without a file */
    assert_int_not_equal(nl_model_load_chat_template(&t, dir, NULL, NULL), NL_OK);
    assert_null(t);
    tu_rmdir(dir);
    free(dir);
}

/* The marks of apply_marked follow the user's bytes through concatenation and trim; encoding with
 * them matches "</s>" as the special token only where the template wrote it. */
static void test_marked_encoding(void **state) {
    (void)state;
    const char *src = "{% for m in messages %}{{ '[' + m.role + ']' + m.content|trim + eos_token }}{% endfor %}";
    nl_chat_template *t = NULL;
    assert_int_equal(nl_chat_template_parse(&t, src, strlen(src), "marks"), NL_OK);
    assert_int_equal(nl_chat_template_set_tokens(t, "<s>", "</s>"), NL_OK);
    nl_chat_message msgs[1] = {{"user", "  a</s>b "}};
    char *out = NULL;
    unsigned char *from_data = NULL;
    size_t n = 0;
    assert_int_equal(nl_chat_template_apply_marked(t, msgs, 1, 0, &out, &n, &from_data), NL_OK);
    assert_string_equal(out, "[user]a</s>b</s>");
    /* "[" and "]" and the final "</s>" are the template's; "user" and "a</s>b" are data */
    const char *want = "0111101111110000";
    assert_int_equal(n, strlen(want));
    for (size_t i = 0; i < n; i++)
        if (from_data[i] != want[i] - '0')
            fail_msg("byte %zu ('%c'): mark %d, want %c", i, out[i], from_data[i], want[i]);
    /* a SentencePiece-style tokenizer.json with <s> and </s> as special tokens (tok512, exported) */
    const char *tok_bin = tu_data_path("stories260K/tok512.bin");
    if (tok_bin) {
        nl_tokenizer tk, hf;
        assert_int_equal(nl_tokenizer_load_llama2c(&tk, tok_bin, 0), NL_OK);
        char *dir = tu_tmpdir(), path[1024];
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        assert_int_equal(nl_tokenizer_save_json(&tk, path), NL_OK);
        assert_int_equal(nl_tokenizer_load_json(&hf, path, 0), NL_OK);
        int *ids = NULL, *all = NULL;
        int64_t k = 0, k_all = 0;
        assert_int_equal(nl_tokenizer_encode_marked(&hf, out, n, 0, 0, from_data, &ids, &k), NL_OK);
        assert_int_equal(nl_tokenizer_encode_special(&hf, out, n, 0, 0, 1, &all, &k_all), NL_OK);
        int eos_marked = 0, eos_all = 0;
        for (int64_t i = 0; i < k; i++) eos_marked += ids[i] == hf.eos_id;
        for (int64_t i = 0; i < k_all; i++) eos_all += all[i] == hf.eos_id;
        assert_int_equal(eos_marked, 1); /* only the template's */
        assert_int_equal(ids[k - 1], hf.eos_id);
        assert_int_equal(eos_all, 2); /* without marks the user's "</s>" would be one too */
        char *back = NULL;
        size_t back_n = 0;
        assert_int_equal(nl_tokenizer_decode(&hf, ids, k - 1, &back, &back_n), NL_OK);
        assert_string_equal(back, "[user]a</s>b"); /* the user's "</s>" comes back as text */
        nl_free(back);
        nl_free(ids);
        nl_free(all);
        nl_tokenizer_free(&hf);
        nl_tokenizer_free(&tk);
        tu_rmdir(dir);
        free(dir);
    } else {
        print_message("[  SKIP    ] tokenizer part: needs stories260K/tok512.bin\n");
    }
    free(out);
    free(from_data);
    nl_chat_template_free(t);
}

/* A GGUF file's tokenizer.chat_template, with bos/eos from tokenizer.ggml.tokens. */
static void test_load_gguf(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[1024];
    const char *toks[] = {"<unk>", "<s>", "</s>", "a"};
    nl_gguf_writer w;
    nl_gguf_writer_init(&w);
    assert_int_equal(nl_gguf_writer_arr_str(&w, "tokenizer.ggml.tokens", 4, toks, NULL), NL_OK);
    assert_int_equal(nl_gguf_writer_u32(&w, "tokenizer.ggml.bos_token_id", 1), NL_OK);
    assert_int_equal(nl_gguf_writer_u32(&w, "tokenizer.ggml.eos_token_id", 2), NL_OK);
    snprintf(path, sizeof path, "%s/none.gguf", dir);
    assert_int_equal(nl_gguf_writer_write(&w, path), NL_OK);
    nl_chat_template *t = NULL;
    assert_int_equal(nl_chat_template_load_gguf(&t, path), NL_ERR_UNSUPPORTED);
    assert_non_null(strstr(nl_last_error(), "has no chat template"));
    assert_int_equal(
        nl_gguf_writer_str(&w, "tokenizer.chat_template",
                           "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{{ eos_token }}{% endfor %}"),
        NL_OK);
    snprintf(path, sizeof path, "%s/chat.gguf", dir);
    assert_int_equal(nl_gguf_writer_write(&w, path), NL_OK);
    nl_gguf_writer_free(&w);
    assert_int_equal(nl_chat_template_load_gguf(&t, path), NL_OK);
    nl_chat_message msgs[1] = {{"user", "hi"}};
    char *out = NULL;
    assert_int_equal(nl_chat_template_apply(t, msgs, 1, 1, &out, NULL), NL_OK);
    assert_string_equal(out, "<s>[hi]</s>");
    free(out);
    nl_chat_template_free(t);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama32),     cmocka_unit_test(test_qwen25),
        cmocka_unit_test(test_mistral_v01), cmocka_unit_test(test_mistral_nemo),
        cmocka_unit_test(test_smollm2),     cmocka_unit_test(test_tinyllama),
        cmocka_unit_test(test_semantics),   cmocka_unit_test(test_errors_name_the_place),
        cmocka_unit_test(test_load_hf),     cmocka_unit_test(test_marked_encoding),
        cmocka_unit_test(test_load_gguf),   cmocka_unit_test(test_for_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
