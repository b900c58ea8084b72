/* serve/http_request, server_metrics, http_loadgen statistics, client URL parsing: the pure parts of
 * the HTTP server, without sockets. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "nanolm/client.h"
#include "nanolm/http_loadgen.h"
#include "nanolm/http_request.h"
#include "nanolm/server_metrics.h"

#define NL_FUZZ_NO_MAIN
#include "../fuzz/fuzz_http_request.c"

static nl_status parse(const char *body, nl_completion_req *req, nl_http_error *err) {
    return nl_http_parse_completion(body, strlen(body), 512, req, err);
}

/* Every field is read; unknown fields are ignored. */
static void full_request(void **state) {
    (void)state;
    nl_completion_req r;
    nl_http_error e;
    const char *body = "{\"model\":\"m\",\"prompt\":\"Once upon\",\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
                       "\"top_k\":40,\"seed\":-3,\"stop\":[\"\\n\",\"The end\"],\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true},\"ignore_eos\":true,\"n\":1,\"user\":\"x\","
                       "\"frequency_penalty\":0,\"logit_bias\":{}}";
    assert_int_equal(parse(body, &r, &e), NL_OK);
    assert_string_equal(r.model, "m");
    assert_string_equal(r.prompt, "Once upon");
    assert_int_equal(r.prompt_bytes, 9);
    assert_null(r.prompt_tokens);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.5 && r.top_p == 0.9);
    assert_int_equal(r.top_k, 40);
    assert_true(r.has_seed && r.seed == (uint64_t)(int64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_string_equal(r.stop[1], "The end");
    assert_true(r.stream && r.include_usage && r.ignore_eos);
    nl_http_completion_free(&r);
}

static void defaults_and_token_prompts(void **state) {
    (void)state;
    nl_completion_req r;
    nl_http_error e;
    assert_int_equal(parse("{\"prompt\":[1, 2, 511]}", &r, &e), NL_OK);
    assert_null(r.prompt);
    assert_int_equal(r.n_prompt_tokens, 3);
    assert_int_equal(r.prompt_tokens[2], 511);
    assert_int_equal(r.max_tokens, 16);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0 && r.top_k == 0 && !r.has_seed && !r.stream && r.n_stop == 0);
    nl_http_completion_free(&r);
    /* one string in an array; null fields keep their defaults; top_k -1 is off */
    assert_int_equal(parse("{\"prompt\":[\"hi\"],\"max_tokens\":null,\"stop\":\"x\",\"top_k\":-1}", &r, &e), NL_OK);
    assert_string_equal(r.prompt, "hi");
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.n_stop, 1);
    assert_int_equal(r.top_k, 0);
    nl_http_completion_free(&r);
}

/* Each bad body: status 400, the field named in param, a message naming the problem. */
static void bad_requests(void **state) {
    (void)state;
    static const struct {
        const char *body, *param, *words;
    } cases[] = {
        {"{\"prompt\":\"a\",", "", "not valid JSON"},
        {"[1,2]", "", "JSON object"},
        {"{}", "prompt", "required"},
        {"{\"prompt\":5}", "prompt", "must be a string"},
        {"{\"prompt\":[]}", "prompt", "empty"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt", "one prompt"},
        {"{\"prompt\":[1,\"a\"]}", "prompt", "token id"},
        {"{\"prompt\":[1,2.5]}", "prompt", "token id"},
        {"{\"prompt\":[600]}", "prompt", "vocabulary has 512"},
        {"{\"prompt\":\"a\",\"max_tokens\":\"10\"}", "max_tokens", "must be an integer, got string"},
        {"{\"prompt\":\"a\",\"max_tokens\":-1}", "max_tokens", "must be in"},
        {"{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens", "integer"},
        {"{\"prompt\":\"a\",\"temperature\":3}", "temperature", "[0, 2]"},
        {"{\"prompt\":\"a\",\"temperature\":true}", "temperature", "must be a number, got boolean"},
        {"{\"prompt\":\"a\",\"top_p\":0}", "top_p", "(0, 1]"},
        {"{\"prompt\":\"a\",\"top_k\":-2}", "top_k", "must be in"},
        {"{\"prompt\":\"a\",\"seed\":\"1\"}", "seed", "integer"},
        {"{\"prompt\":\"a\",\"seed\":9223372036854775808}", "seed", "(-2^53, 2^53)"},
        {"{\"prompt\":\"a\",\"seed\":9223372036854775807}", "seed", "(-2^53, 2^53)"},
        {"{\"prompt\":\"a\",\"seed\":9007199254740993}", "seed", "not exact"}, /* 2^53 + 1 */
        {"{\"prompt\":\"a\"} {\"prompt\":\"b\"}", "", "data after its JSON value (at byte 15"},
        {"{\"prompt\":\"a\"}x", "", "data after its JSON value"},
        {"{\"prompt\":\"a\\u0000b\"}", "", "\\u0000 (a NUL character) at byte 12"},
        {"{\"prompt\":\"a\", \"stop\":\"\\\\\\u0000\"}", "", "NUL"},
        {"{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "at most 4"},
        {"{\"prompt\":\"a\",\"stop\":[1]}", "stop", "must be a string"},
        {"{\"prompt\":\"a\",\"stop\":\"\"}", "stop", "empty"},
        {"{\"prompt\":\"a\",\"stop\":\"01234567890123456789012345678901234567890123456789012345678901234\"}", "stop",
         "at most 64"},
        {"{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream", "boolean"},
        {"{\"prompt\":\"a\",\"stream_options\":1}", "stream_options", "object"},
        {"{\"prompt\":\"a\",\"n\":2}", "n", "must be 1"},
        {"{\"prompt\":\"a\",\"best_of\":3}", "best_of", "must be 1"},
        {"{\"prompt\":\"a\",\"echo\":true}", "echo", "not supported"},
        {"{\"prompt\":\"a\",\"model\":7}", "model", "string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nl_completion_req r;
        nl_http_error e;
        nl_status rc = parse(cases[i].body, &r, &e);
        if (rc != NL_ERR_INVALID || e.status != 400 || strcmp(e.param, cases[i].param) ||
            !strstr(e.message, cases[i].words))
            fail_msg("body %s: rc %d status %d param '%s' message '%s'", cases[i].body, rc, e.status, e.param,
                     e.message);
        assert_null(r.prompt);
        assert_null(r.prompt_tokens);
        /* the error document parses back with the same fields */
        nl_http_buf b = {0};
        assert_int_equal(nl_http_error_json(&e, &b), NL_OK);
        cJSON *doc = cJSON_Parse(b.data);
        assert_non_null(doc);
        cJSON *err = cJSON_GetObjectItem(doc, "error");
        assert_string_equal(cJSON_GetObjectItem(err, "message")->valuestring, e.message);
        assert_string_equal(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error");
        if (cases[i].param[0])
            assert_string_equal(cJSON_GetObjectItem(err, "param")->valuestring, cases[i].param);
        else
            assert_true(cJSON_IsNull(cJSON_GetObjectItem(err, "param")));
        cJSON_Delete(doc);
        nl_http_buf_free(&b);
    }
    /* empty body and a body cut in the middle of a string (length, not NUL, ends it) */
    nl_completion_req r;
    nl_http_error e;
    assert_int_equal(nl_http_parse_completion("", 0, 0, &r, &e), NL_ERR_INVALID);
    assert_int_equal(e.status, 400);
    assert_int_equal(nl_http_parse_completion("{\"prompt\":\"abc\"}", 12, 0, &r, &e), NL_ERR_INVALID);
    assert_non_null(strstr(e.message, "not valid JSON"));
    /* an escaped backslash before "u0000" is text, not NUL; whitespace after the JSON is fine */
    const char *ok = "{\"prompt\":\"a\\\\u0000b\", \"seed\":9007199254740991}\r\n ";
    assert_int_equal(nl_http_parse_completion(ok, strlen(ok), 0, &r, &e), NL_OK);
    assert_string_equal(r.prompt, "a\\u0000b");
    assert_int_equal(r.seed, 9007199254740991ull);
    nl_http_completion_free(&r);
}

static cJSON *event_json(const char *ev) {
    assert_memory_equal(ev, "data: ", 6);
    size_t n = strlen(ev);
    assert_true(n > 8 && ev[n - 1] == '\n' && ev[n - 2] == '\n');
    cJSON *doc = cJSON_ParseWithLength(ev + 6, n - 8);
    assert_non_null(doc);
    return doc;
}

/* Chunks, the usage chunk, [DONE] and the whole response in OpenAI's shapes. */
static void responses(void **state) {
    (void)state;
    nl_completion_id id = {"cmpl-1", 1700000000, "stories260K", 0};
    nl_http_buf b = {0};
    assert_int_equal(nl_http_sse_chunk(&id, "Lily\"\n", 6, NULL, &b), NL_OK);
    cJSON *doc = event_json(b.data);
    assert_string_equal(cJSON_GetObjectItem(doc, "object")->valuestring, "text_completion");
    assert_string_equal(cJSON_GetObjectItem(doc, "id")->valuestring, "cmpl-1");
    assert_string_equal(cJSON_GetObjectItem(doc, "model")->valuestring, "stories260K");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, "Lily\"\n");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")));
    assert_int_equal(cJSON_GetObjectItem(c, "index")->valueint, 0);
    cJSON_Delete(doc);
    b.len = 0;
    assert_int_equal(nl_http_sse_chunk(&id, "", 0, "length", &b), NL_OK);
    doc = event_json(b.data);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "length");
    cJSON_Delete(doc);
    b.len = 0;
    assert_int_equal(nl_http_sse_usage(&id, 5, 7, &b), NL_OK);
    doc = event_json(b.data);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "usage"), "total_tokens")->valueint, 12);
    cJSON_Delete(doc);
    b.len = 0;
    assert_int_equal(nl_http_sse_done(&b), NL_OK);
    assert_string_equal(b.data, "data: [DONE]\n\n");
    b.len = 0;
    assert_int_equal(nl_http_completion_json(&id, "abc", 2, "stop", 4, 2, &b), NL_OK);
    doc = cJSON_Parse(b.data);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, "ab");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    cJSON *u = cJSON_GetObjectItem(doc, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 6);
    cJSON_Delete(doc);
    b.len = 0;
    assert_int_equal(nl_http_models_json("m", 5, 256, 512, &b), NL_OK);
    doc = cJSON_Parse(b.data);
    cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "data"), 0);
    assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "m");
    assert_int_equal(cJSON_GetObjectItem(m, "max_model_len")->valueint, 256);
    assert_int_equal(cJSON_GetObjectItem(m, "vocab_size")->valueint, 512);
    cJSON_Delete(doc);
    nl_http_buf_free(&b);
}

/* Cumulative buckets, +Inf = count, sum; every gauge present. */
static void metrics_text(void **state) {
    (void)state;
    nl_serve_metrics m;
    nl_serve_metrics_init(&m);
    m.running = 3;
    m.waiting = 2;
    m.kv_blocks_used = 10;
    m.kv_blocks_free = 54;
    double obs[] = {0.0005, 0.003, 0.003, 0.2, 100};
    for (int i = 0; i < 5; i++) nl_histogram_observe(&m.ttft, obs[i]);
    nl_http_buf b = {0};
    assert_int_equal(nl_serve_metrics_text(&m, &b), NL_OK);
    const char *want[] = {"nanolm_requests_running 3\n",
                          "nanolm_requests_waiting 2\n",
                          "nanolm_kv_blocks_used 10\n",
                          "nanolm_kv_blocks_free 54\n",
                          "# TYPE nanolm_time_to_first_token_seconds histogram\n",
                          "nanolm_time_to_first_token_seconds_bucket{le=\"0.001\"} 1\n",
                          "nanolm_time_to_first_token_seconds_bucket{le=\"0.0025\"} 1\n",
                          "nanolm_time_to_first_token_seconds_bucket{le=\"0.005\"} 3\n",
                          "nanolm_time_to_first_token_seconds_bucket{le=\"0.25\"} 4\n",
                          "nanolm_time_to_first_token_seconds_bucket{le=\"60\"} 4\n",
                          "nanolm_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n",
                          "nanolm_time_to_first_token_seconds_count 5\n",
                          "nanolm_time_per_output_token_seconds_count 0\n",
                          "nanolm_e2e_request_latency_seconds_sum 0\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(b.data, want[i])) fail_msg("missing '%s' in:\n%s", want[i], b.data);
    const char *sum = strstr(b.data, "nanolm_time_to_first_token_seconds_sum ");
    assert_non_null(sum);
    assert_true(fabs(strtod(sum + 39, NULL) - 100.2065) < 1e-9);
    nl_http_buf_free(&b);
}

static void percentiles(void **state) {
    (void)state;
    double v[] = {4, 1, 3, 2};
    nl_latency_summary s;
    nl_latency_summarize(v, 4, &s);
    /* numpy.percentile([1,2,3,4], [50, 90, 99]) = 2.5, 3.7, 3.97 */
    assert_true(fabs(s.p50 - 2.5) < 1e-12 && fabs(s.p90 - 3.7) < 1e-12 && fabs(s.p99 - 3.97) < 1e-12);
    assert_true(s.mean == 2.5 && s.max == 4 && s.n == 4);
    nl_latency_summarize(v, 0, &s);
    assert_true(isnan(s.p50) && s.n == 0);
    double one = 7;
    assert_true(nl_percentile(&one, 1, 0.99) == 7);
}

static void urls(void **state) {
    (void)state;
    nl_http_url u;
    assert_int_equal(nl_http_parse_url("http://127.0.0.1:8080/v1/completions", &u), NL_OK);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8080);
    assert_string_equal(u.path, "/v1/completions");
    assert_int_equal(nl_http_parse_url("localhost", &u), NL_OK);
    assert_int_equal(u.port, 80);
    assert_string_equal(u.path, "");
    assert_int_equal(nl_http_parse_url("http://[::1]:9/", &u), NL_OK);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9);
    assert_int_equal(nl_http_parse_url("https://x", &u), NL_ERR_INVALID);
    assert_int_equal(nl_http_parse_url("http://x:0", &u), NL_ERR_INVALID);
    assert_int_equal(nl_http_parse_url("http://x:80abc", &u), NL_ERR_INVALID);
    assert_int_equal(nl_http_parse_url("", &u), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "empty"));
}

/* The fuzz target's seeds and any findings, replayed in the normal build (and under make check). */
static void fuzz_replay(void **state) {
    (void)state;
    const char *dirs[] = {"fuzz/corpus/http_request", "fuzz/regress/http_request"};
    int n = 0;
    for (int d = 0; d < 2; d++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null", tu_src_path(dirs[d]));
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        char name[256];
        while (fgets(name, sizeof name, p)) {
            name[strcspn(name, "\n")] = 0;
            char rel[512];
            snprintf(rel, sizeof rel, "%s/%s", dirs[d], name);
            size_t bytes = 0;
            char *buf = tu_read_file(tu_src_path(rel), &bytes);
            assert_non_null(buf);
            nl_fuzz_http_request((const uint8_t *)buf, bytes);
            free(buf);
            n++;
        }
        pclose(p);
    }
    assert_true(n >= 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_request), cmocka_unit_test(defaults_and_token_prompts),
        cmocka_unit_test(bad_requests), cmocka_unit_test(responses),
        cmocka_unit_test(metrics_text), cmocka_unit_test(percentiles),
        cmocka_unit_test(urls),         cmocka_unit_test(fuzz_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
