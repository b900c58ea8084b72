/* POST /v1/chat/completions end to end: `nanolm serve` on an ephemeral 127.0.0.1 port with a
 * Hugging Face folder made from stories260K (`nanolm export --to hf`) whose tokenizer_config.json
 * carries TinyLlama's chat template. The greedy reply equals /v1/completions on the token ids of
 * the rendered prompt (encoded here with the folder's tokenizer); the stream is OpenAI's chat
 * chunk shape and adds up to the same text; "</s>" typed by a user is text, not the special
 * token; bad requests get 400s that name the field; a model without a template gets a clear 400;
 * a template's raise_exception becomes a 400 with its message. Every test stops its server. */
#include "testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/chat_template.h"
#include "nanolm/client.h"
#include "nanolm/tokenizer.h"

static tu_server *g_srv;

static int teardown(void **state) {
    (void)state;
    if (g_srv) tu_server_kill(g_srv);
    g_srv = NULL;
    return 0;
}

#define BIN "stories260K/stories260K.bin"
#define TOK "stories260K/tok512.bin"

/* The Zephyr template TinyLlama-1.1B-Chat-v1.0 ships (tests/ref/chat/tinyllama.jinja) */
static char *tinyllama_template(void) {
    size_t n = 0;
    char *t = tu_read_file(tu_src_path("tests/ref/chat/tinyllama.jinja"), &n);
    assert_non_null(t);
    return t;
}

/* DIR/m: stories260K as a Hugging Face folder with the template in tokenizer_config.json. */
static void make_folder(const char *dir, const char *bin, const char *tok) {
    char args[4096], *out = NULL;
    snprintf(args, sizeof args, "export --ckpt '%s' --tokenizer '%s' --to hf '%s/m' --dtype f32", bin, tok, dir);
    int rc = tu_run_cli(args, &out);
    if (rc) print_message("%s\n", out ? out : "");
    assert_int_equal(rc, 0);
    free(out);
    cJSON *cfg = cJSON_CreateObject();
    char *tmpl = tinyllama_template();
    cJSON_AddStringToObject(cfg, "chat_template", tmpl);
    cJSON_AddStringToObject(cfg, "bos_token", "<s>");
    cJSON *eos = cJSON_AddObjectToObject(cfg, "eos_token");
    cJSON_AddStringToObject(eos, "content", "</s>");
    free(tmpl);
    char *text = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    char path[1024];
    snprintf(path, sizeof path, "%s/m/tokenizer_config.json", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
}

static void start(tu_server *s, const char *dir, const char *name, const char *args) {
    char *why = NULL;
    if (tu_server_start(s, dir, name, args, &why)) fail_msg("%s", why ? why : "the server did not start");
    g_srv = s;
}

static void stop(tu_server *s) {
    assert_int_equal(tu_server_stop(s), 0);
    g_srv = NULL;
}

static cJSON *post(int port, const char *path, const char *body, int *status) {
    nl_http_response r;
    assert_int_equal(nl_http_request("127.0.0.1", port, "POST", path, body, strlen(body), 60, NULL, NULL, &r), NL_OK);
    *status = r.status;
    cJSON *doc = r.body.data ? cJSON_Parse(r.body.data) : NULL;
    if (!doc) fail_msg("not JSON (HTTP %d): %s", r.status, r.body.data ? r.body.data : "");
    nl_http_response_free(&r);
    return doc;
}

static int usage(cJSON *doc, const char *key) {
    return (int)cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "usage"), key)->valuedouble;
}

static const char *message_content(cJSON *doc) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    cJSON *m = cJSON_GetObjectItem(c, "message");
    assert_string_equal(cJSON_GetObjectItem(m, "role")->valuestring, "assistant");
    return cJSON_GetObjectItem(m, "content")->valuestring;
}

typedef struct chunks {
    nl_http_buf text;
    int n, role_first, done, bad;
    char finish[16];
} chunks;

static int on_chunk(void *ctx, const char *data, size_t n, double t) {
    (void)t;
    chunks *c = ctx;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        c->done = 1;
        return 0;
    }
    cJSON *doc = cJSON_ParseWithLength(data, n);
    if (!doc || strcmp(cJSON_GetObjectItem(doc, "object")->valuestring, "chat.completion.chunk") ||
        strncmp(cJSON_GetObjectItem(doc, "id")->valuestring, "chatcmpl-", 9)) {
        c->bad++;
        cJSON_Delete(doc);
        return 0;
    }
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    if (ch) {
        cJSON *delta = cJSON_GetObjectItem(ch, "delta");
        cJSON *role = cJSON_GetObjectItem(delta, "role"), *content = cJSON_GetObjectItem(delta, "content");
        if (c->n == 0)
            c->role_first = cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
        else if (role)
            c->bad++;
        if (cJSON_IsString(content)) nl_http_buf_append(&c->text, content->valuestring, strlen(content->valuestring));
        cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(c->finish, sizeof c->finish, "%s", f->valuestring);
        c->n++;
    }
    cJSON_Delete(doc);
    return 0;
}

/* The rendered prompt's token ids as a JSON array, through the folder's own tokenizer.json. */
static char *prompt_ids_json(const char *dir, const nl_chat_message *msgs, int n) {
    char *tmpl = tinyllama_template();
    nl_chat_template *t = NULL;
    assert_int_equal(nl_chat_template_parse(&t, tmpl, strlen(tmpl), "tinyllama"), NL_OK);
    free(tmpl);
    assert_int_equal(nl_chat_template_set_tokens(t, "<s>", "</s>"), NL_OK);
    char *text = NULL;
    size_t bytes = 0;
    assert_int_equal(nl_chat_template_apply(t, msgs, n, 1, &text, &bytes), NL_OK);
    nl_chat_template_free(t);
    char path[1024];
    snprintf(path, sizeof path, "%s/m/tokenizer.json", dir);
    nl_tokenizer tok;
    assert_int_equal(nl_tokenizer_load_json(&tok, path, 0), NL_OK);
    int *ids = NULL;
    int64_t k = 0;
    /* no special-token text in these messages: matching specials everywhere is the same */
    assert_int_equal(nl_tokenizer_encode_special(&tok, text, bytes, 0, 0, 1, &ids, &k), NL_OK);
    nl_tokenizer_free(&tok);
    free(text);
    cJSON *arr = cJSON_CreateArray();
    for (int64_t i = 0; i < k; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    nl_free(ids);
    char *s = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    return s;
}

static void chat_completions(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    char *dir = tu_tmpdir(), args[2048], body[4096];
    make_folder(dir, bin, tok);
    snprintf(args, sizeof args, "--ckpt '%s/m' --model-name stories-chat", dir);
    tu_server s;
    start(&s, dir, "chat", args);

    /* greedy chat reply == /v1/completions on the rendered prompt's ids */
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"You tell stories.\"},"
                       "{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":20,\"temperature\":0}";
    int status = 0;
    cJSON *doc = post(s.port, "/v1/chat/completions", chat, &status);
    assert_int_equal(status, 200);
    assert_string_equal(cJSON_GetObjectItem(doc, "object")->valuestring, "chat.completion");
    assert_string_equal(cJSON_GetObjectItem(doc, "model")->valuestring, "stories-chat");
    const char *reply = message_content(doc);
    nl_chat_message msgs[2] = {{"system", "You tell stories."}, {"user", "Once upon a time"}};
    char *ids = prompt_ids_json(dir, msgs, 2);
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":20,\"temperature\":0}", ids);
    cJSON *ref = post(s.port, "/v1/completions", body, &status);
    assert_int_equal(status, 200);
    const char *ref_text =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(ref, "choices"), 0), "text")->valuestring;
    print_message("[          ] chat reply: \"%s\"\n", reply);
    assert_string_equal(reply, ref_text);
    assert_int_equal(usage(doc, "prompt_tokens"), usage(ref, "prompt_tokens"));
    assert_int_equal(usage(doc, "completion_tokens"), usage(ref, "completion_tokens"));
    cJSON_Delete(ref);
    free(ids);

    /* streamed: a role delta first, content deltas adding up to the same text, a finish_reason, [DONE] */
    const char *schat = "{\"messages\":[{\"role\":\"system\",\"content\":\"You tell stories.\"},"
                        "{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":20,\"temperature\":0,"
                        "\"stream\":true}";
    chunks c = {0};
    nl_http_response r;
    assert_int_equal(nl_http_request("127.0.0.1", s.port, "POST", "/v1/chat/completions", schat, strlen(schat), 60,
                                     on_chunk, &c, &r),
                     NL_OK);
    assert_int_equal(r.status, 200);
    nl_http_response_free(&r);
    assert_int_equal(c.bad, 0);
    assert_true(c.role_first);
    assert_true(c.done);
    assert_string_equal(c.text.data ? c.text.data : "", reply);
    assert_string_equal(c.finish, "length");
    nl_http_buf_free(&c.text);
    cJSON_Delete(doc);

    /* "</s>" typed by the user stays text (several tokens); the template's "</s>" is one token */
    int plain_status = 0, special_status = 0;
    cJSON *a = post(s.port, "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"AB\"}],\"max_tokens\":1}", &plain_status);
    cJSON *b = post(s.port, "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"A</s>B\"}],\"max_tokens\":1}", &special_status);
    assert_int_equal(plain_status, 200);
    assert_int_equal(special_status, 200);
    int grown = usage(b, "prompt_tokens") - usage(a, "prompt_tokens");
    print_message("[          ] \"</s>\" in user text adds %d prompt tokens\n", grown);
    assert_true(grown >= 3); /* '<' '/' 's' '>' pieces (tok512 has no "</s>" merge), not the one id 2 */
    cJSON_Delete(a);
    cJSON_Delete(b);

    /* bad requests: 400 naming the field */
    struct {
        const char *body, *param, *words;
    } bad[] = {
        {"{\"max_tokens\":1}", "messages", "'messages' is required"},
        {"{\"messages\":[]}", "messages", "empty array"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages",
         "'messages'[0].role must be one of system, user, assistant, got \"tool\""},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages", "'messages'[0].content must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", "n", "'n' must be 1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", "temperature", "'temperature'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true}", "logprobs", "not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *e = post(s.port, "/v1/chat/completions", bad[i].body, &status);
        cJSON *err = cJSON_GetObjectItem(e, "error");
        const char *msg = cJSON_GetObjectItem(err, "message")->valuestring;
        cJSON *param = cJSON_GetObjectItem(err, "param");
        if (status != 400 || !strstr(msg, bad[i].words) || !cJSON_IsString(param) ||
            strcmp(param->valuestring, bad[i].param))
            fail_msg("%s -> %d %s", bad[i].body, status, msg);
        cJSON_Delete(e);
    }
    /* text parts are joined */
    doc = post(s.port, "/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Once upon\"},"
               "{\"type\":\"text\",\"text\":\" a time\"}]}],\"max_tokens\":2}",
               &status);
    assert_int_equal(status, 200);
    cJSON_Delete(doc);
    stop(&s);
    tu_rmdir(dir);
    free(dir);
}

/* A checkpoint without a template: 400 that says so; --chat-template with Mistral's template:
 * its raise_exception for a system message is a 400 carrying its message. */
static void no_template_and_raise(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    char *dir = tu_tmpdir(), args[2048];
    snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s'", bin, tok);
    tu_server s;
    start(&s, dir, "plain", args);
    int status = 0;
    cJSON *e = post(s.port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &status);
    const char *msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring;
    print_message("[          ] %d %s\n", status, msg);
    assert_int_equal(status, 400);
    assert_non_null(strstr(msg, "this model has no chat template"));
    cJSON_Delete(e);
    stop(&s);

    snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s' --chat-template '%s'", bin, tok,
             tu_src_path("tests/ref/chat/mistral-v0.1.jinja"));
    start(&s, dir, "mistral", args);
    e = post(s.port, "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"hi\"}]}",
             &status);
    msg = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message")->valuestring;
    print_message("[          ] %d %s\n", status, msg);
    assert_int_equal(status, 400);
    assert_non_null(
        strstr(msg, "raise_exception: Conversation roles must alternate user/assistant/user/assistant/..."));
    cJSON_Delete(e);
    e = post(s.port, "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":3}", &status);
    assert_int_equal(status, 200);
    cJSON_Delete(e);
    stop(&s);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(chat_completions, teardown),
        cmocka_unit_test_teardown(no_template_and_raise, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
