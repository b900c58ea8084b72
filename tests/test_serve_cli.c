/* generate through the serving engine, end to end: a quantized checkpoint written by
 * `quant model --out` loads in generate (on the int8 kernels) and in eval; NaN weights make
 * generate fail with a clear message instead of printing blank text; bad --weights; --weights int4
 * in generate and serve. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/checkpoint.h"
#include "nanolm/client.h"

#define BIN "stories260K/stories260K.bin"
#define TOK "stories260K/tok512.bin"

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

static void test_quantized_checkpoint(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    TU_REQUIRE_DATA(txt, "tinystories/tinystories_head.txt");
    char *dir = tu_tmpdir(), args[4096], *out = NULL;
    snprintf(args, sizeof args,
             "quant model --ckpt %s --tokenizer %s --data %s --max-tokens 1024 --scheme int8-channel --out %s/q.st",
             bin, tok, txt, dir);
    assert_int_equal(tu_run_cli(args, &out), 0);
    free(out);
    cJSON *g[3];
    const char *w[3] = {"fp32", "int8", "int8"};
    /* fp32, the int8 checkpoint, and int8 made at load time from the fp32 one */
    const char *ck[3] = {bin, NULL, bin}, *extra[3] = {"", "", " --weights int8"};
    char qpath[1024];
    snprintf(qpath, sizeof qpath, "%s/q.st", dir);
    ck[1] = qpath;
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args,
                 "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 40 --temperature 0 --json%s",
                 ck[i], tok, extra[i]);
        g[i] = run_json(args);
        assert_string_equal(cJSON_GetObjectItem(g[i], "weights")->valuestring, w[i]);
        print_message("%s: %s\n", args, cJSON_GetObjectItem(g[i], "text")->valuestring);
    }
    /* the checkpoint's int8 weights and int8 made at load time from fp32 are the same codes */
    assert_string_equal(cJSON_GetObjectItem(g[1], "text")->valuestring, cJSON_GetObjectItem(g[2], "text")->valuestring);
    /* int8 weights are 1/4 of fp32's (plus scales) */
    double b0 = cJSON_GetObjectItem(g[0], "weight_bytes")->valuedouble,
           b1 = cJSON_GetObjectItem(g[1], "weight_bytes")->valuedouble;
    assert_true(b1 < 0.3 * b0);
    /* the first greedy words agree with fp32 */
    assert_int_equal(
        strncmp(cJSON_GetObjectItem(g[0], "text")->valuestring, cJSON_GetObjectItem(g[1], "text")->valuestring, 40), 0);
    for (int i = 0; i < 3; i++) cJSON_Delete(g[i]);
    /* eval loads it too (the dequantized weights) */
    snprintf(args, sizeof args, "eval --ckpt %s/q.st --tokenizer %s --data %s --max-windows 2 --json", dir, tok, txt);
    cJSON *ev = run_json(args);
    cJSON_Delete(ev);
    tu_rmdir(dir);
    free(dir);
}

static void test_nan_weights(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    nl_model m;
    char kind[64], path[1024], args[4096], *out = NULL;
    assert_int_equal(nl_ckpt_load_model(bin, &m, kind), NL_OK);
    m.w.layers[1].wo[5] = NAN;
    char *dir = tu_tmpdir();
    snprintf(path, sizeof path, "%s/nan.st", dir);
    assert_int_equal(nl_ckpt_save(path, &m, kind, NULL), NL_OK);
    nl_model_free(&m);
    snprintf(args, sizeof args,
             "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 20 --temperature 0", path, tok);
    int rc = tu_run_cli(args, &out);
    print_message("%s", out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "nanolm: generate:"));
    assert_non_null(strstr(out, "NaN"));
    free(out);
    snprintf(args, sizeof args, "generate --ckpt %s --tokenizer %s --prompt x --weights fp4", bin, tok);
    assert_int_equal(tu_run_cli(args, &out), 2);
    assert_non_null(strstr(out, "fp4"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

/* --weights int4 quantizes at load time: the JSON names it, its weights are under a sixth of
 * fp32's (4 bits and an fp16 scale per 32), and greedy text comes out; NaN weights are refused
 * naming the index. */
static void test_int4_weights(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    char args[4096];
    cJSON *g[2];
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args,
                 "generate --ckpt %s --tokenizer %s --prompt 'Once upon a time' --steps 40 --temperature 0 --json%s",
                 bin, tok, i ? " --weights int4" : "");
        g[i] = run_json(args);
        print_message("%s: %s\n", args, cJSON_GetObjectItem(g[i], "text")->valuestring);
    }
    assert_string_equal(cJSON_GetObjectItem(g[1], "weights")->valuestring, "int4");
    double b0 = cJSON_GetObjectItem(g[0], "weight_bytes")->valuedouble,
           b1 = cJSON_GetObjectItem(g[1], "weight_bytes")->valuedouble;
    print_message("int4 weight bytes / fp32: %.4f\n", b1 / b0);
    assert_true(b1 < b0 / 6);
    assert_true(strlen(cJSON_GetObjectItem(g[1], "text")->valuestring) > 40);
    for (int i = 0; i < 2; i++) cJSON_Delete(g[i]);

    nl_model m;
    char kind[64], path[1024], *out = NULL;
    assert_int_equal(nl_ckpt_load_model(bin, &m, kind), NL_OK);
    m.w.layers[0].w2[7] = NAN;
    char *dir = tu_tmpdir();
    snprintf(path, sizeof path, "%s/nan.st", dir);
    assert_int_equal(nl_ckpt_save(path, &m, kind, NULL), NL_OK);
    nl_model_free(&m);
    snprintf(args, sizeof args, "generate --ckpt %s --tokenizer %s --prompt x --steps 5 --weights int4", path, tok);
    int rc = tu_run_cli(args, &out);
    print_message("%s", out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "nanolm: generate:"));
    assert_non_null(strstr(out, "index 7"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

/* serve --weights int4: the server says so when it listens, and a greedy completion comes back
 * (through curl, when it is installed). */
static void test_serve_int4(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    char *dir = tu_tmpdir(), args[4096], *why = NULL, *out = NULL;
    snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s' --weights int4", bin, tok);
    tu_server s;
    if (tu_server_start(&s, dir, "int4", args, &why)) fail_msg("%s", why ? why : "the server did not start");
    /* every check runs before the asserts, so a failure never leaves the server running */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "grep -c 'weights int4' '%s'", s.log);
    int logged = tu_run_shell(cmd, &out) == 0;
    free(out);
    out = NULL;
    int have_curl = system("command -v curl >/dev/null 2>&1") == 0, curl_rc = -1;
    if (have_curl) {
        snprintf(cmd, sizeof cmd,
                 "curl -sS --max-time 60 http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' -d "
                 "'{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 0}'",
                 s.port);
        curl_rc = tu_run_shell(cmd, &out);
    }
    assert_int_equal(tu_server_stop(&s), 0);
    assert_true(logged);
    if (have_curl) {
        assert_int_equal(curl_rc, 0);
        print_message("%s\n", out);
        cJSON *d = cJSON_Parse(out);
        assert_non_null(d);
        cJSON *u = cJSON_GetObjectItem(d, "usage");
        assert_non_null(u);
        assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 12);
        cJSON_Delete(d);
    } else {
        print_message("[  SKIP    ] curl not installed: completion not checked\n");
    }
    free(out);
    tu_rmdir(dir);
    free(dir);
}

/* --dummy-arch sizes whose products wrap size_t (or overflow int64) are refused with a message
 * instead of allocating a wrapped (tiny) parameter array and writing past it. */
static void test_dummy_arch_overflow(void **state) {
    (void)state;
    static const char *const shapes[] = {
        "{\"vocab_size\":1099511627776,\"dim\":1099511627776,\"n_layers\":1,\"n_heads\":2,\"n_kv_heads\":2,"
        "\"hidden_dim\":64,\"seq_len\":64}",
        "{\"vocab_size\":256,\"dim\":4294967296,\"n_layers\":4294967296,\"n_heads\":2,\"n_kv_heads\":2,"
        "\"hidden_dim\":4294967296,\"seq_len\":64}",
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        char args[600], *out = NULL;
        snprintf(args, sizeof args, "serve --dummy-arch '%s' --port 0", shapes[k]);
        int rc = tu_run_cli(args, &out);
        if (rc != 2 || !strstr(out, "multiplies past 2^53")) fail_msg("shape %zu: exit %d, \"%s\"", k, rc, out);
        free(out);
    }
}

/* NaN logits in a non-streamed request: HTTP 500 naming the model's failure (it used to be 503
 * "the server is shutting down", while the streamed request got 500). */
static void test_serve_nan_is_500(void **state) {
    (void)state;
    TU_REQUIRE_DATA(bin, BIN);
    TU_REQUIRE_DATA(tok, TOK);
    nl_model m;
    char kind[64], path[1024], args[2048];
    assert_int_equal(nl_ckpt_load_model(bin, &m, kind), NL_OK);
    m.w.layers[1].wo[5] = NAN;
    char *dir = tu_tmpdir();
    snprintf(path, sizeof path, "%s/nan.st", dir);
    assert_int_equal(nl_ckpt_save(path, &m, kind, NULL), NL_OK);
    nl_model_free(&m);
    snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s' --threads 1", path, tok);
    tu_server srv;
    char *why = NULL;
    if (tu_server_start(&srv, dir, "nan", args, &why)) fail_msg("%s", why ? why : "the server did not start");
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8}";
    nl_http_response r;
    nl_status rc =
        nl_http_request("127.0.0.1", srv.port, "POST", "/v1/completions", body, strlen(body), 60, NULL, NULL, &r);
    int status = rc ? -1 : r.status;
    char text[512];
    snprintf(text, sizeof text, "%s", !rc && r.body.data ? r.body.data : "");
    if (!rc) nl_http_response_free(&r);
    assert_int_equal(tu_server_stop(&srv), 0);
    if (status != 500 || !strstr(text, "the model failed")) fail_msg("HTTP %d: %s", status, text);
    tu_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dummy_arch_overflow),  cmocka_unit_test(test_serve_nan_is_500),
        cmocka_unit_test(test_quantized_checkpoint), cmocka_unit_test(test_nan_weights),
        cmocka_unit_test(test_int4_weights),         cmocka_unit_test(test_serve_int4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
