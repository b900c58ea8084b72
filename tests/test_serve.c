/* nanolm serve end to end: the server runs as its own process on an ephemeral 127.0.0.1 port
 * (found through --port-file) with stories260K, and is driven with curl and with the project's
 * client (client.h) and load generator (http_loadgen.h). Every test stops the server it started. */
#include "testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nanolm/arch.h"
#include "nanolm/client.h"
#include "nanolm/dummy_engine.h"
#include "nanolm/http_loadgen.h"
#include "nanolm/loadgen_sweep.h"
#include "nanolm/server.h"

typedef struct srv {
    tu_server p; /* the process, its port and its log */
    int port;
    char *dir;
} srv;

/* The server of the running test, killed by the teardown when a failed assertion skipped stop(). */
static tu_server *g_srv;

static int teardown(void **state) {
    (void)state;
    if (g_srv) tu_server_kill(g_srv);
    g_srv = NULL;
    return 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* About 25M parameters, context 1024: seconds per 100 tokens on 2 cores. */
#define SLOW_ARCH                                                                                                      \
    "--dummy-arch '{\"name\":\"rand25M\",\"vocab_size\":512,\"dim\":512,\"n_layers\":8,\"n_heads\":8,"                 \
    "\"n_kv_heads\":8,\"hidden_dim\":1376,\"seq_len\":1024}' "

/* Starts `nanolm serve` with stories260K and extra options; 0 when the data is missing. */
static int start(srv *s, const char *extra) {
    const char *ck = tu_data_path("stories260K/stories260K.bin");
    const char *tk = tu_data_path("stories260K/tok512.bin");
    if (!ck || !tk) return 0;
    s->dir = tu_tmpdir();
    /* A test that needs requests to outlive its polling (a waiting queue, a drain timeout) serves
     * random weights of a larger shape (--dummy-arch SLOW_ARCH), whose decode takes seconds rather
     * than stories260K's milliseconds, so what it checks does not depend on the machine's speed. */
    char args[2048];
    if (extra && strstr(extra, "--dummy-arch"))
        snprintf(args, sizeof args, "--tokenizer '%s' %s", tk, extra);
    else
        snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s' %s", ck, tk, extra ? extra : "");
    char *why = NULL;
    if (tu_server_start(&s->p, s->dir, "server", args, &why)) fail_msg("%s", why ? why : "the server did not start");
    g_srv = &s->p;
    s->port = s->p.port;
    return 1;
}

/* Sends SIGTERM and waits for the exit (SIGKILL after 60 s). Returns the exit status. */
static int stop(srv *s) {
    int st = tu_server_stop(&s->p);
    g_srv = NULL;
    tu_rmdir(s->dir);
    free(s->dir);
    return st;
}

#define START(s, extra)                                                                                                \
    srv s;                                                                                                             \
    if (!start(&s, extra)) {                                                                                           \
        print_message("[  SKIP    ] needs ../shared/data/stories260K (not present)\n");                                \
        skip();                                                                                                        \
        return;                                                                                                        \
    }

static cJSON *post(const srv *s, const char *body, int *status) {
    nl_http_response r;
    assert_int_equal(
        nl_http_request("127.0.0.1", s->port, "POST", "/v1/completions", body, strlen(body), 60, NULL, NULL, &r),
        NL_OK);
    *status = r.status;
    cJSON *doc = r.body.data ? cJSON_Parse(r.body.data) : NULL;
    if (!doc) fail_msg("not JSON (HTTP %d): %s", r.status, r.body.data ? r.body.data : "");
    nl_http_response_free(&r);
    return doc;
}

static const char *choice_str(cJSON *doc, const char *key) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    cJSON *v = cJSON_GetObjectItem(c, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int usage_int(cJSON *doc, const char *key) {
    return (int)cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "usage"), key)->valuedouble;
}

/* Reads one metric's value from /metrics. */
static double metric(const srv *s, const char *name) {
    nl_http_response r;
    assert_int_equal(nl_http_request("127.0.0.1", s->port, "GET", "/metrics", NULL, 0, 30, NULL, NULL, &r), NL_OK);
    assert_int_equal(r.status, 200);
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body.data, key);
    if (!p) fail_msg("no %s in /metrics", name);
    double v = strtod(p + strlen(key), NULL);
    nl_http_response_free(&r);
    return v;
}

/* curl output of a command line (shell), or NULL when curl is not installed. */
static char *curl(const char *args) {
    if (system("command -v curl >/dev/null 2>&1") != 0) return NULL;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "curl -sS --max-time 60 %s", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    nl_http_buf b = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) nl_http_buf_append(&b, buf, n);
    pclose(p);
    if (!b.data) nl_http_buf_append(&b, "", 0);
    return b.data;
}

typedef struct stream_ctx {
    nl_http_buf text;
    int chunks, done, close_after;
    char finish[16];
    char error[256];
    int completion_tokens;
} stream_ctx;

static int on_event(void *ctx, const char *data, size_t n, double t) {
    (void)t;
    stream_ctx *c = ctx;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        c->done = 1;
        return 0;
    }
    cJSON *doc = cJSON_ParseWithLength(data, n);
    assert_non_null(doc);
    cJSON *err = cJSON_GetObjectItem(doc, "error");
    if (err) {
        snprintf(c->error, sizeof c->error, "%s", cJSON_GetObjectItem(err, "message")->valuestring);
        cJSON_Delete(doc);
        return 0;
    }
    assert_string_equal(cJSON_GetObjectItem(doc, "object")->valuestring, "text_completion");
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "choices"), 0);
    if (ch) {
        const char *tx = cJSON_GetObjectItem(ch, "text")->valuestring;
        nl_http_buf_append(&c->text, tx, strlen(tx));
        cJSON *f = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(f)) snprintf(c->finish, sizeof c->finish, "%s", f->valuestring);
        c->chunks++;
    }
    cJSON *u = cJSON_GetObjectItem(doc, "usage");
    if (u) c->completion_tokens = (int)cJSON_GetObjectItem(u, "completion_tokens")->valuedouble;
    cJSON_Delete(doc);
    return c->close_after && c->chunks >= c->close_after;
}

/* GET endpoints, a completion by curl and the same one streamed through our client: the streamed
 * chunks add up to the same greedy text, the usage counts agree, the stream ends with [DONE]. */
static void completions(void **state) {
    (void)state;
    START(s, NULL);
    char args[512];
    snprintf(args, sizeof args, "http://127.0.0.1:%d/health", s.port);
    char *out = curl(args);
    if (out) assert_string_equal(out, "{\"status\":\"ok\"}");
    free(out);
    snprintf(args, sizeof args, "http://127.0.0.1:%d/v1/models", s.port);
    out = curl(args);
    if (out) {
        cJSON *doc = cJSON_Parse(out);
        cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "data"), 0);
        assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "stories260K");
        assert_int_equal(cJSON_GetObjectItem(m, "max_model_len")->valueint, 512);
        cJSON_Delete(doc);
    }
    free(out);
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":30,\"temperature\":0}";
    snprintf(args, sizeof args, "http://127.0.0.1:%d/v1/completions -H 'Content-Type: application/json' -d '%s'",
             s.port, body);
    out = curl(args);
    int status = 200;
    cJSON *doc = out ? cJSON_Parse(out) : post(&s, body, &status);
    assert_non_null(doc);
    assert_int_equal(status, 200);
    const char *text = choice_str(doc, "text");
    /* llama2.c's reference continuation of this prompt (as in README's generate example) */
    assert_non_null(text);
    assert_memory_equal(text, ", there was a little girl named Lily.", 37);
    assert_string_equal(choice_str(doc, "finish_reason"), "length");
    assert_int_equal(usage_int(doc, "prompt_tokens"), 5);
    assert_int_equal(usage_int(doc, "completion_tokens"), 30);
    assert_int_equal(usage_int(doc, "total_tokens"), 35);
    free(out);

    stream_ctx c = {0};
    const char *sbody = "{\"prompt\":\"Once upon a time\",\"max_tokens\":30,\"temperature\":0,\"stream\":true,"
                        "\"stream_options\":{\"include_usage\":true}}";
    nl_http_response r;
    assert_int_equal(
        nl_http_request("127.0.0.1", s.port, "POST", "/v1/completions", sbody, strlen(sbody), 60, on_event, &c, &r),
        NL_OK);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.content_type, "text/event-stream");
    assert_true(c.done);
    /* one chunk carries whatever text the engine produced since the last read: how many chunks
     * depends on timing, so only that there is at least one */
    assert_true(c.chunks >= 1);
    assert_string_equal(c.text.data, text);
    assert_string_equal(c.finish, "length");
    assert_int_equal(c.completion_tokens, 30);
    /* the raw stream ends with the [DONE] event */
    assert_true(r.body.len > 14 && !strcmp(r.body.data + r.body.len - 14, "data: [DONE]\n\n"));
    nl_http_response_free(&r);
    nl_http_buf_free(&c.text);

    /* a stop string ends the text before it, with finish_reason "stop" */
    doc =
        (cJSON_Delete(doc),
         post(&s, "{\"prompt\":\"Once upon a time\",\"max_tokens\":30,\"temperature\":0,\"stop\":\" Lily\"}", &status));
    assert_int_equal(status, 200);
    assert_string_equal(choice_str(doc, "text"), ", there was a little girl named");
    assert_string_equal(choice_str(doc, "finish_reason"), "stop");
    cJSON_Delete(doc);
    assert_int_equal(stop(&s), 0);
}

/* Bad input: the status and an OpenAI error naming the problem; the server keeps serving. */
static void bad_input(void **state) {
    (void)state;
    START(s, "--max-body 100000");
    struct {
        const char *body;
        int status;
        const char *words;
    } cases[] = {
        {"{\"prompt\": \"hi\"", 400, "not valid JSON"},
        {"{\"prompt\": 3}", 400, "'prompt' must be"},
        {"{\"prompt\": \"hi\", \"max_tokens\": \"many\"}", 400, "'max_tokens' must be an integer"},
        {"{\"prompt\": \"hi\", \"temperature\": -1}", 400, "'temperature'"},
        {"{\"prompt\": [1, 999]}", 400, "vocabulary has 512"},
        {"{\"prompt\": \"hi\", \"n\": 3}", 400, "'n' must be 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int status;
        cJSON *doc = post(&s, cases[i].body, &status);
        cJSON *e = cJSON_GetObjectItem(doc, "error");
        const char *msg = e ? cJSON_GetObjectItem(e, "message")->valuestring : "";
        if (status != cases[i].status || !strstr(msg, cases[i].words))
            fail_msg("%s: HTTP %d '%s'", cases[i].body, status, msg);
        assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
        cJSON_Delete(doc);
    }
    /* unknown fields are ignored */
    int status;
    cJSON *doc = post(
        &s, "{\"prompt\":\"hi\",\"max_tokens\":2,\"frequency_penalty\":0.5,\"user\":\"u\",\"whatever\":[1]}", &status);
    assert_int_equal(status, 200);
    assert_int_equal(usage_int(doc, "completion_tokens"), 2);
    cJSON_Delete(doc);
    /* a prompt longer than the context (512 tokens): 400 */
    nl_http_buf b = {0};
    nl_http_buf_append(&b, "{\"prompt\":[1", 12);
    for (int i = 1; i < 513; i++) nl_http_buf_append(&b, ",300", 4);
    nl_http_buf_append(&b, "]}", 2);
    doc = post(&s, b.data, &status);
    assert_int_equal(status, 400);
    assert_non_null(
        strstr(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "error"), "message")->valuestring, "513 tokens"));
    cJSON_Delete(doc);
    /* max_tokens beyond the context: generation stops at the context with finish_reason "length" */
    b.len = 0;
    nl_http_buf_append(&b, "{\"prompt\":[1", 12);
    for (int i = 1; i < 500; i++) nl_http_buf_append(&b, ",300", 4);
    nl_http_buf_append(&b, "],\"max_tokens\":100,\"ignore_eos\":true}", 37);
    doc = post(&s, b.data, &status);
    assert_int_equal(status, 200);
    assert_string_equal(choice_str(doc, "finish_reason"), "length");
    assert_int_equal(usage_int(doc, "prompt_tokens"), 500);
    /* positions 500..511 hold 12 generated tokens; the token sampled at the last position needs none */
    assert_int_equal(usage_int(doc, "completion_tokens"), 512 - 500 + 1);
    cJSON_Delete(doc);
    /* a body over --max-body: 413, declared (Content-Length) or not */
    b.len = 0;
    nl_http_buf_append(&b, "{\"prompt\":\"", 11);
    for (int i = 0; i < 20000; i++) nl_http_buf_append(&b, "abcdefgh", 8);
    nl_http_buf_append(&b, "\"}", 2);
    doc = post(&s, b.data, &status);
    assert_int_equal(status, 413);
    cJSON_Delete(doc);
    char path[512];
    snprintf(path, sizeof path, "%s/big.json", s.dir);
    FILE *f = fopen(path, "w");
    fwrite(b.data, 1, b.len, f);
    fclose(f);
    char args[1024];
    snprintf(args, sizeof args,
             "-o /dev/null -w '%%{http_code}' -H 'Transfer-Encoding: chunked' --data-binary @%s "
             "http://127.0.0.1:%d/v1/completions",
             path, s.port);
    char *out = curl(args);
    if (out) assert_string_equal(out, "413");
    free(out);
    nl_http_buf_free(&b);
    /* unknown path 404, wrong method 405 */
    nl_http_response r;
    assert_int_equal(nl_http_request("127.0.0.1", s.port, "GET", "/v1/chat/nothing", NULL, 0, 30, NULL, NULL, &r),
                     NL_OK);
    assert_int_equal(r.status, 404);
    nl_http_response_free(&r);
    assert_int_equal(nl_http_request("127.0.0.1", s.port, "GET", "/v1/completions", NULL, 0, 30, NULL, NULL, &r),
                     NL_OK);
    assert_int_equal(r.status, 405);
    nl_http_response_free(&r);
    assert_true(metric(&s, "nanolm_requests_total{outcome=\"rejected\"}") >= 10);
    assert_int_equal(stop(&s), 0);
}

/* A client that goes away mid-stream: its sequence and KV blocks are freed (seen in /metrics). */
static void disconnect(void **state) {
    (void)state;
    START(s, NULL);
    stream_ctx c = {0};
    c.close_after = 3;
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"ignore_eos\":true,\"stream\":true}";
    nl_http_response r;
    assert_int_equal(
        nl_http_request("127.0.0.1", s.port, "POST", "/v1/completions", body, strlen(body), 60, on_event, &c, &r),
        NL_OK);
    assert_true(r.closed_early);
    assert_false(c.done);
    nl_http_response_free(&r);
    nl_http_buf_free(&c.text);
    double used = -1, running = -1, aborted = 0;
    for (int i = 0; i < 200; i++) { /* up to 20 s */
        used = metric(&s, "nanolm_kv_blocks_used");
        running = metric(&s, "nanolm_requests_running");
        aborted = metric(&s, "nanolm_requests_total{outcome=\"aborted\"}");
        if (used == 0 && running == 0 && aborted == 1) break;
        sleep_ms(100);
    }
    assert_true(used == 0 && running == 0 && aborted == 1);
    /* the engine did not run the 400 tokens */
    assert_true(metric(&s, "nanolm_generation_tokens_total") < 400);
    assert_int_equal(stop(&s), 0);
}

typedef struct bg {
    const srv *s;
    const char *body;
    int status;
    stream_ctx c;
} bg;

static void *bg_post(void *arg) {
    bg *b = arg;
    nl_http_response r;
    if (nl_http_request("127.0.0.1", b->s->port, "POST", "/v1/completions", b->body, strlen(b->body), 120, on_event,
                        &b->c, &r))
        b->status = -1;
    else
        b->status = r.status;
    nl_http_response_free(&r);
    return NULL;
}

/* A bounded queue: with one running sequence and one waiting place, a third request gets 429. */
static void queue_full(void **state) {
    (void)state;
    START(s, SLOW_ARCH "--max-batch 1 --max-waiting 1 --drain-timeout 300");
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":100,\"ignore_eos\":true,\"stream\":true}";
    bg b[2];
    memset(b, 0, sizeof b);
    b[0].s = b[1].s = &s;
    b[0].body = b[1].body = body;
    pthread_t th[2];
    pthread_create(&th[0], NULL, bg_post, &b[0]);
    for (int i = 0; i < 200 && metric(&s, "nanolm_requests_running") < 1; i++) sleep_ms(50);
    pthread_create(&th[1], NULL, bg_post, &b[1]);
    for (int i = 0; i < 200 && metric(&s, "nanolm_requests_waiting") < 1; i++) sleep_ms(50);
    assert_true(metric(&s, "nanolm_requests_waiting") == 1);
    int status;
    cJSON *doc = post(&s, "{\"prompt\":\"Once\",\"max_tokens\":5}", &status);
    assert_int_equal(status, 429);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "error"), "type")->valuestring,
                        "rate_limit_error");
    cJSON_Delete(doc);
    /* SIGTERM with requests in flight: both finish (drain), then exit 0 */
    assert_int_equal(stop(&s), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(b[i].status, 200);
        assert_true(b[i].c.done);
        /* "stop" if the model wrote BOS (stories260K's end of story, which ignore_eos does not skip) */
        if (strcmp(b[i].c.finish, "length") && strcmp(b[i].c.finish, "stop"))
            fail_msg("request %d: finish '%s', error '%s'", i, b[i].c.finish, b[i].c.error);
        nl_http_buf_free(&b[i].c.text);
    }
}

/* A request that waits in the queue longer than --idle-timeout is not cut off (the idle timeout is
 * for clients, not for the engine's pace): with one running sequence and an idle timeout of 1 s, a
 * streamed and a plain request queued behind a long one (seconds of decode) both finish whole. */
static void queued_past_idle_timeout(void **state) {
    (void)state;
    START(s, SLOW_ARCH "--max-batch 1 --idle-timeout 1 --drain-timeout 300");
    bg b[2];
    memset(b, 0, sizeof b);
    b[0].s = b[1].s = &s;
    b[0].body = "{\"prompt\":\"Once\",\"max_tokens\":150,\"ignore_eos\":true,\"stream\":true}";
    b[1].body = "{\"prompt\":\"Once\",\"max_tokens\":20,\"ignore_eos\":true,\"stream\":true}";
    pthread_t th[2];
    pthread_create(&th[0], NULL, bg_post, &b[0]);
    for (int i = 0; i < 200 && metric(&s, "nanolm_requests_running") < 1; i++) sleep_ms(50);
    pthread_create(&th[1], NULL, bg_post, &b[1]);
    int status;
    cJSON *doc = post(&s, "{\"prompt\":\"Once\",\"max_tokens\":20,\"ignore_eos\":true}", &status);
    assert_int_equal(status, 200);
    assert_true(usage_int(doc, "completion_tokens") >= 1);
    cJSON_Delete(doc);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(b[i].status, 200);
        if (!b[i].c.done) fail_msg("request %d: the stream was cut off (error '%s')", i, b[i].c.error);
        if (strcmp(b[i].c.finish, "length") && strcmp(b[i].c.finish, "stop"))
            fail_msg("request %d: finish '%s', error '%s'", i, b[i].c.finish, b[i].c.error);
        nl_http_buf_free(&b[i].c.text);
    }
    assert_true(metric(&s, "nanolm_requests_total{outcome=\"aborted\"}") == 0);
    assert_int_equal(stop(&s), 0);
}

/* SIGTERM when requests cannot finish in --drain-timeout: they are cancelled (an error event, then
 * [DONE]) and the server still exits 0. */
static void shutdown_cancels(void **state) {
    (void)state;
    START(s, SLOW_ARCH "--drain-timeout 0.5");
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":100000,\"ignore_eos\":true,\"stream\":true}";
    bg b;
    memset(&b, 0, sizeof b);
    b.s = &s;
    b.body = body;
    pthread_t th;
    pthread_create(&th, NULL, bg_post, &b);
    for (int i = 0; i < 200 && metric(&s, "nanolm_requests_running") < 1; i++) sleep_ms(50);
    assert_int_equal(stop(&s), 0);
    pthread_join(th, NULL);
    assert_int_equal(b.status, 200);
    assert_true(b.c.done);
    assert_string_equal(b.c.finish, "");
    assert_non_null(strstr(b.c.error, "shutting down"));
    nl_http_buf_free(&b.c.text);
}

/* The load generator against the server: every request succeeds with exactly the asked tokens. */
static void loadgen(void **state) {
    (void)state;
    START(s, NULL);
    nl_loadgen_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = s.port;
    o.requests = 12;
    o.concurrency = 4;
    o.prompt_len = 16;
    o.prompt_len_max = 48;
    o.output_len = 8;
    o.output_len_max = 16;
    o.seed = 3;
    nl_loadgen_result r;
    assert_int_equal(nl_loadgen_run(&o, &r), NL_OK);
    if (r.failed) fail_msg("%lld failed: %s", (long long)r.failed, r.first_error);
    assert_int_equal(r.ok, 12);
    assert_true(r.output_tokens <= 12 * 16);
    assert_true(r.output_tokens >= 12 * 8 || r.short_outputs > 0);
    assert_true(r.prompt_tokens >= 12 * 16 && r.prompt_tokens <= 12 * 48);
    assert_int_equal(r.ttft.n, 12);
    print_message("12 requests: %lld output tokens, %lld inter-token gaps, %lld short\n", (long long)r.output_tokens,
                  (long long)r.itl.n, (long long)r.short_outputs);
    /* one gap per streamed chunk after the first; the server sends a chunk per read that brought
     * tokens (empty text included), and one read may bring several, so there may be fewer */
    assert_true(r.itl.n > 0 && r.itl.n <= r.output_tokens - 12);
    assert_true(r.ttft.p50 > 0 && r.ttft.p50 <= r.ttft.p99 && r.e2e.p50 >= r.ttft.p50);
    assert_true(r.output_tokens_per_s > 0 && r.requests_per_s > 0);
    /* Poisson arrivals */
    o.rate_rps = 50;
    o.requests = 6;
    assert_int_equal(nl_loadgen_run(&o, &r), NL_OK);
    assert_int_equal(r.ok, 6);
    assert_true(metric(&s, "nanolm_kv_blocks_used") == 0);
    assert_true(metric(&s, "nanolm_time_to_first_token_seconds_count") == 18);
    /* a duration ends the run: of 100000 arrivals at 20/s only those of the first 0.3 s start
     * (the first at 0 always does), and every one that started is counted and succeeds */
    o.rate_rps = 20;
    o.requests = 100000;
    o.duration_s = 0.3;
    assert_int_equal(nl_loadgen_run(&o, &r), NL_OK);
    print_message("duration 0.3 s at 20/s: %lld requests started\n", (long long)r.requests);
    assert_true(r.requests >= 1 && r.requests < 100000);
    assert_int_equal(r.ok, r.requests);
    assert_int_equal(r.failed, 0);
    assert_true(metric(&s, "nanolm_kv_blocks_used") == 0);
    o.duration_s = -1;
    assert_int_equal(nl_loadgen_run(&o, &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "duration"));
    /* half the clients leave mid-stream: counted apart (neither ok nor failed), and the server
     * gives their KV blocks back */
    o.duration_s = 0;
    o.rate_rps = 0;
    o.requests = 16;
    o.output_len = 16;
    o.output_len_max = 32;
    o.disconnect_frac = 0.5;
    assert_int_equal(nl_loadgen_run(&o, &r), NL_OK);
    print_message("16 requests, half to leave: %lld ok, %lld left, %lld failed\n", (long long)r.ok,
                  (long long)r.disconnected, (long long)r.failed);
    if (r.failed) fail_msg("%lld failed: %s", (long long)r.failed, r.first_error);
    assert_int_equal(r.ok + r.disconnected, 16);
    assert_true(r.disconnected > 0 && r.ok > 0);
    assert_int_equal(r.ttft.n, r.ok);
    double used = -1;
    for (int i = 0; i < 50 && (used = metric(&s, "nanolm_kv_blocks_used")) != 0; i++) sleep_ms(100);
    assert_true(used == 0);
    o.disconnect_frac = 1.5;
    assert_int_equal(nl_loadgen_run(&o, &r), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "disconnecting share"));
    /* a shared prefix is the same system prompt whatever the seed; the seed draws what follows:
     * 32 shared + 32 own tokens, one request a run; the prefix cache (blocks of 16, the last
     * prompt token always computed) finds 48 tokens of a prompt seen before, 32 of a new one */
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = s.port;
    o.requests = o.concurrency = 1;
    o.shared_prefix = o.prompt_len = 32;
    o.output_len = 2;
    const double hits0 = metric(&s, "nanolm_prefix_cache_hits_total");
    const uint64_t seeds[3] = {7, 7, 8};
    const double want_hits[3] = {0, 48, 32};
    for (int i = 0; i < 3; i++) {
        o.seed = seeds[i];
        const double before = metric(&s, "nanolm_prefix_cache_hits_total");
        assert_int_equal(nl_loadgen_run(&o, &r), NL_OK);
        assert_int_equal(r.ok, 1);
        if (i == 0) continue; /* an earlier test may have left blocks of this system prompt */
        assert_true(metric(&s, "nanolm_prefix_cache_hits_total") - before == want_hits[i]);
    }
    assert_true(metric(&s, "nanolm_prefix_cache_hits_total") - hits0 >= 80);
    assert_int_equal(stop(&s), 0);
}

/* Reads one HTTP response (headers and a Content-Length body) from fd into buf; its length, or
 * -1 when the connection closed or timed out first. */
static int read_response(int fd, char *buf, int cap) {
    int n = 0;
    for (;;) {
        buf[n] = 0;
        char *eoh = strstr(buf, "\r\n\r\n");
        if (eoh) {
            const char *cl = strstr(buf, "Content-Length: ");
            if (!cl) cl = strstr(buf, "content-length: ");
            int want = (int)(eoh + 4 - buf) + (cl ? atoi(cl + 16) : 0);
            if (n >= want) return n;
        }
        if (n >= cap - 1) return -1;
        ssize_t r = recv(fd, buf + n, (size_t)(cap - 1 - n), 0);
        if (r <= 0) return -1;
        n += (int)r;
    }
}

/* GET endpoints keep the connection open (HTTP/1.1 keep-alive: three requests on one socket;
 * they used to close it after each answer), and 405 names the allowed methods in Allow. */
static void keep_alive_and_allow(void **state) {
    (void)state;
    START(s, NULL);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static const char *const reqs[] = {"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
                                       "GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
                                       "GET /v1/completions HTTP/1.1\r\nHost: t\r\n\r\n"};
    static const char *const want[] = {"HTTP/1.1 200", "HTTP/1.1 200", "HTTP/1.1 405"};
    char buf[8192];
    int answered = 0;
    for (int i = 0; i < 3; i++) {
        if (send(fd, reqs[i], strlen(reqs[i]), MSG_NOSIGNAL) < 0 || read_response(fd, buf, sizeof buf) < 0) break;
        if (strncmp(buf, want[i], strlen(want[i]))) fail_msg("request %d: %.80s", i, buf);
        answered++;
    }
    close(fd);
    int allow = answered == 3 && strstr(buf, "\r\nAllow: POST\r\n") != NULL;
    assert_int_equal(stop(&s), 0);
    if (answered != 3) fail_msg("the connection closed after %d answers", answered);
    if (!allow) fail_msg("405 without \"Allow: POST\": %.300s", buf);
}

/* A client that sends a non-streamed request and goes away: the request is aborted at once (it
 * used to run to the end of the context, counted as a success: a model fast enough that the
 * engine's wait never times out); a bounded wait of 5 s, far beyond the per-round check. */
static void disconnect_non_streamed(void **state) {
    (void)state;
    START(s, NULL);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":100000,\"ignore_eos\":true}";
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    for (int i = 0; i < 200 && metric(&s, "nanolm_requests_running") < 1; i++) sleep_ms(50);
    assert_true(metric(&s, "nanolm_requests_running") == 1);
    close(fd);
    double running = 1, aborted = 0;
    for (int i = 0; i < 50; i++) { /* up to 5 s */
        running = metric(&s, "nanolm_requests_running");
        aborted = metric(&s, "nanolm_requests_total{outcome=\"aborted\"}");
        if (running == 0 && aborted == 1) break;
        sleep_ms(100);
    }
    double generated = metric(&s, "nanolm_generation_tokens_total");
    assert_int_equal(stop(&s), 0);
    if (running != 0 || aborted != 1 || generated >= 400) /* the context (512) holds ~505 more */
        fail_msg("5 s after the client left: running %g, aborted %g, %g tokens generated", running, aborted, generated);
}

/* During drain (SIGTERM with a request running) a new client gets the documented 503 at once (it
 * used to wait in the listen backlog until the server closed). */
static void drain_answers_503(void **state) {
    (void)state;
    START(s, SLOW_ARCH "--drain-timeout 3");
    bg b;
    memset(&b, 0, sizeof b);
    b.s = &s;
    b.body = "{\"prompt\":\"Once\",\"max_tokens\":100000,\"ignore_eos\":true,\"stream\":true}";
    pthread_t th;
    pthread_create(&th, NULL, bg_post, &b);
    for (int i = 0; i < 200 && metric(&s, "nanolm_requests_running") < 1; i++) sleep_ms(50);
    kill(s.p.pid, SIGTERM);
    sleep_ms(300);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":2}";
    nl_http_response r;
    nl_status rc =
        nl_http_request("127.0.0.1", s.port, "POST", "/v1/completions", body, strlen(body), 2, NULL, NULL, &r);
    int status = rc ? -1 : r.status;
    if (!rc) nl_http_response_free(&r);
    rc = nl_http_request("127.0.0.1", s.port, "GET", "/health", NULL, 0, 2, NULL, NULL, &r);
    int health = rc ? -1 : r.status;
    if (!rc) nl_http_response_free(&r);
    int st = -1; /* the drain ends by itself (a second SIGTERM would end it at once) */
    for (int i = 0; i < 600 && waitpid(s.p.pid, &st, WNOHANG) != s.p.pid; i++) sleep_ms(100);
    s.p.pid = -1;
    g_srv = NULL;
    tu_rmdir(s.dir);
    free(s.dir);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pthread_join(th, NULL);
    nl_http_buf_free(&b.c.text);
    if (status != 503 || health != 503) fail_msg("during drain: POST got %d, /health %d (want 503)", status, health);
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Slow clients (half a request line, then nothing) up to and past --max-connections: /health
 * still answers (connections are kept for it), a completion past the limit gets 503 at once, and
 * the idle ones are closed after --idle-timeout (it used to be 600 s). Bounded: about 5 s. */
static void slow_clients(void **state) {
    (void)state;
    START(s, "--max-connections 4 --idle-timeout 2");
    enum { SLOW = 8 };
    int fds[SLOW];
    for (int i = 0; i < SLOW; i++) {
        fds[i] = connect_to(s.port);
        send(fds[i], "POST /v1/comp", 13, MSG_NOSIGNAL);
    }
    sleep_ms(200);
    nl_http_response r;
    nl_status rc = nl_http_request("127.0.0.1", s.port, "GET", "/health", NULL, 0, 2, NULL, NULL, &r);
    int health = rc ? -1 : r.status;
    if (!rc) nl_http_response_free(&r);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":2}";
    rc = nl_http_request("127.0.0.1", s.port, "POST", "/v1/completions", body, strlen(body), 2, NULL, NULL, &r);
    int post_status = rc ? -1 : r.status;
    if (!rc) nl_http_response_free(&r);
    int closed = 0;
    for (int i = 0; i < SLOW; i++) { /* the server closes each within its idle timeout (+ 2 s slack) */
        struct timeval tv = {4, 0};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char ch;
        if (recv(fds[i], &ch, 1, 0) == 0 || errno == ECONNRESET) closed++;
        close(fds[i]);
    }
    rc = nl_http_request("127.0.0.1", s.port, "POST", "/v1/completions", body, strlen(body), 30, NULL, NULL, &r);
    int after = rc ? -1 : r.status;
    if (!rc) nl_http_response_free(&r);
    assert_int_equal(stop(&s), 0);
    if (health != 200 || post_status != 503 || closed != SLOW || after != 200)
        fail_msg("/health %d, POST past the limit %d, idle closed %d of %d, POST after %d", health, post_status, closed,
                 SLOW, after);
}

/* Sends one byte of a request head that never ends to fd; 1 when the server has closed the
 * connection (the send fails, or a read finds the end of the stream). */
static int trickle(int fd, int *sent) {
    static const char head[] = "GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ";
    char ch = *sent < (int)sizeof head - 1 ? head[*sent] : 'a';
    if (send(fd, &ch, 1, MSG_NOSIGNAL) != 1) return 1;
    ++*sent;
    char r;
    ssize_t n = recv(fd, &r, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* Clients that trickle their request headers (a byte every 200 ms, never the blank line) are
 * closed at --header-timeout although never idle: one on a fresh connection, one on a kept-alive
 * connection after its first answer. /health answers meanwhile and /metrics counts both. Without
 * the header deadline they stayed open as long as they trickled. Bounded: 10 s of trickling. */
static void header_deadline(void **state) {
    (void)state;
    START(s, "--header-timeout 1 --idle-timeout 30");
    int fds[2] = {connect_to(s.port), connect_to(s.port)};
    struct timeval tv = {10, 0};
    setsockopt(fds[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *get = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    char buf[4096];
    int first_ok = send(fds[1], get, strlen(get), MSG_NOSIGNAL) > 0 && read_response(fds[1], buf, sizeof buf) > 0 &&
                   !strncmp(buf, "HTTP/1.1 200", 12);
    int sent[2] = {0, 0}, closed[2] = {0, 0}, health = -1;
    for (int t = 0; t < 50 && !(closed[0] && closed[1]); t++) {
        for (int i = 0; i < 2; i++)
            if (!closed[i]) closed[i] = trickle(fds[i], &sent[i]);
        if (t == 2) {
            nl_http_response r;
            nl_status rc = nl_http_request("127.0.0.1", s.port, "GET", "/health", NULL, 0, 5, NULL, NULL, &r);
            health = rc ? -1 : r.status;
            if (!rc) nl_http_response_free(&r);
        }
        sleep_ms(200);
    }
    close(fds[0]);
    close(fds[1]);
    double counted = metric(&s, "nanolm_header_timeouts_total");
    assert_int_equal(stop(&s), 0);
    if (!first_ok || !closed[0] || !closed[1] || health != 200 || counted != 2)
        fail_msg("kept-alive first answer %d; closed fresh %d (%d bytes), kept-alive %d (%d bytes); /health %d; "
                 "header timeouts counted %g",
                 first_ok, closed[0], sent[0], closed[1], sent[1], health, counted);
}

/* A storm of streamed requests whose clients leave after the first chunk: every sequence and KV
 * block comes back (seen in /metrics), and the server still answers. */
static void disconnect_storm(void **state) {
    (void)state;
    START(s, NULL);
    enum { STORM = 40 };
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true}";
    for (int i = 0; i < STORM; i++) {
        stream_ctx c = {0};
        c.close_after = 1 + i % 3;
        nl_http_response r;
        assert_int_equal(
            nl_http_request("127.0.0.1", s.port, "POST", "/v1/completions", body, strlen(body), 30, on_event, &c, &r),
            NL_OK);
        nl_http_response_free(&r);
        nl_http_buf_free(&c.text);
    }
    double used = -1, running = -1, aborted = 0;
    for (int i = 0; i < 100; i++) { /* up to 10 s */
        used = metric(&s, "nanolm_kv_blocks_used");
        running = metric(&s, "nanolm_requests_running");
        aborted = metric(&s, "nanolm_requests_total{outcome=\"aborted\"}");
        if (used == 0 && running == 0 && aborted == STORM) break;
        sleep_ms(100);
    }
    int status;
    cJSON *doc = post(&s, "{\"prompt\":\"Once\",\"max_tokens\":3}", &status);
    cJSON_Delete(doc);
    assert_int_equal(stop(&s), 0);
    if (used != 0 || running != 0 || aborted != STORM || status != 200)
        fail_msg("after %d disconnects: KV blocks used %g, running %g, aborted %g, then HTTP %d", STORM, used, running,
                 aborted, status);
}

static void count_runs(void *ctx, int i, double rate, const nl_loadgen_result *r) {
    int *seen = ctx;
    assert_int_equal(i, *seen);
    assert_true(rate == (i ? 40 : 20));
    assert_int_equal(r->ok, 3);
    (*seen)++;
}

/* A rate sweep: the rate list (its errors), a run per rate with the callback after each, the
 * count of runs with failures and the plot of the runs. */
static void loadgen_sweep(void **state) {
    (void)state;
    double rates[NL_LOADGEN_MAX_SWEEP];
    assert_int_equal(nl_loadgen_parse_rates("20,40", rates), 2);
    assert_true(rates[0] == 20 && rates[1] == 40);
    assert_int_equal(nl_loadgen_parse_rates("1.5,2,", rates), 2); /* a trailing comma ends the list */
    assert_true(rates[0] == 1.5);
    assert_int_equal(nl_loadgen_parse_rates("", rates), -1);
    assert_string_equal(nl_last_error(), "is empty");
    const char *bad[] = {"x", "1,0", "1,-2", "1;2", "inf"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(nl_loadgen_parse_rates(bad[i], rates), -1);
        assert_non_null(strstr(nl_last_error(), bad[i]));
    }
    char many[160] = "1";
    for (int i = 0; i < NL_LOADGEN_MAX_SWEEP; i++) strcat(many, ",1");
    assert_int_equal(nl_loadgen_parse_rates(many, rates), -1);
    assert_non_null(strstr(nl_last_error(), "up to 32 rates"));
    START(s, NULL);
    nl_loadgen_opts o;
    memset(&o, 0, sizeof o);
    o.host = "127.0.0.1";
    o.port = s.port;
    o.requests = 3;
    o.concurrency = 4;
    o.prompt_len = 8;
    o.output_len = 4;
    o.seed = 5;
    nl_loadgen_result res[2];
    int seen = 0;
    assert_int_equal(nl_loadgen_parse_rates("20,40", rates), 2);
    assert_int_equal(nl_loadgen_sweep(&o, rates, 2, res, count_runs, &seen), NL_OK);
    assert_int_equal(seen, 2);
    assert_true(o.rate_rps == 40);
    assert_int_equal(nl_loadgen_sweep_failed(res, 2), 0);
    res[1].failed = 2;
    assert_int_equal(nl_loadgen_sweep_failed(res, 2), 1);
    char path[] = "/tmp/test_serve_sweep_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(nl_loadgen_sweep_svg(path, res, 2), NL_OK);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(path);
    assert_non_null(strstr(buf, "<svg"));
    assert_non_null(strstr(buf, "TTFT p99"));
    assert_non_null(strstr(buf, "TPOT p50"));
    assert_int_equal(nl_loadgen_sweep_svg(path, res, 0), NL_ERR_INVALID);
    /* a run that cannot start stops the sweep before any callback */
    o.duration_s = -1;
    seen = 0;
    assert_int_equal(nl_loadgen_sweep(&o, rates, 2, res, count_runs, &seen), NL_ERR_INVALID);
    assert_int_equal(seen, 0);
    assert_int_equal(stop(&s), 0);
}

/* Random weights of a shape: named "dummy" when the shape has no name, bytes for 256 tokens,
 * the errors of another vocabulary without a tokenizer and of a shape the model cannot take. */
static void dummy_engine(void **state) {
    (void)state;
    nl_arch a;
    assert_int_equal(nl_arch_from_json("shape",
                                       "{\"vocab_size\":256,\"dim\":64,\"n_layers\":2,\"n_heads\":4,"
                                       "\"n_kv_heads\":4,\"hidden_dim\":128,\"seq_len\":64}",
                                       &a),
                     NL_OK);
    nl_engine_opts eo;
    nl_engine_opts_default(&eo);
    nl_dummy_engine d;
    assert_int_equal(nl_dummy_engine_open(&d, &a, NULL, &eo), NL_OK);
    assert_non_null(d.e);
    assert_string_equal(d.name, "dummy");
    assert_int_equal(nl_engine_arch(d.e)->dim, 64);
    assert_null(d.m.train); /* the serving model has no training state */
    nl_dummy_engine_close(&d);
    assert_null(d.e);
    a.vocab_size = 512;
    assert_int_equal(nl_dummy_engine_open(&d, &a, NULL, &eo), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "vocab_size 512 needs --tokenizer"));
    a.vocab_size = 256;
    a.n_kv_heads = 3;
    assert_int_not_equal(nl_dummy_engine_open(&d, &a, NULL, &eo), NL_OK);
    assert_true(strncmp(nl_last_error(), "--dummy-arch: ", 14) == 0);
}

/* The name a checkpoint is served under by default: its file name without folder and extension. */
static void model_name(void **state) {
    (void)state;
    char b[128];
    assert_string_equal(nl_server_model_name("models/stories260K.bin", b, sizeof b), "stories260K");
    assert_string_equal(nl_server_model_name("q.int8.safetensors", b, sizeof b), "q.int8");
    assert_string_equal(nl_server_model_name("/a/.hidden", b, sizeof b), ".hidden");
    assert_string_equal(nl_server_model_name("dir/SmolLM2-135M", b, sizeof b), "SmolLM2-135M");
    char small[4];
    assert_string_equal(nl_server_model_name("x/abcdef.bin", small, sizeof small), "abc");
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(keep_alive_and_allow, teardown),
        cmocka_unit_test_teardown(disconnect_non_streamed, teardown),
        cmocka_unit_test_teardown(drain_answers_503, teardown),
        cmocka_unit_test_teardown(slow_clients, teardown),
        cmocka_unit_test_teardown(header_deadline, teardown),
        cmocka_unit_test_teardown(disconnect_storm, teardown),
        cmocka_unit_test_teardown(completions, teardown),
        cmocka_unit_test_teardown(bad_input, teardown),
        cmocka_unit_test_teardown(disconnect, teardown),
        cmocka_unit_test_teardown(queue_full, teardown),
        cmocka_unit_test_teardown(shutdown_cancels, teardown),
        cmocka_unit_test_teardown(loadgen, teardown),
        cmocka_unit_test_teardown(loadgen_sweep, teardown),
        cmocka_unit_test(dummy_engine),
        cmocka_unit_test(model_name),
        cmocka_unit_test_teardown(queued_past_idle_timeout, teardown),
    };
    if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
