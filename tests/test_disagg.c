/* Prefill/decode disaggregation (nanolm/kv_transfer.h, the KV export/import of engine.h):
 *  - a prompt prefilled in one engine, its KV moved through the wire format and imported into
 *    another engine (a different block size) decodes the same tokens as colocated serving:
 *    greedy and seeded sampling, fp32 and int8 KV; the bytes moved are exactly
 *    2 x layers x kv_heads x head_dim x bytes x prompt tokens (+ int8's fp16 scales); KV blocks
 *    back to 0 on both sides;
 *  - the same over the socket (the prefill server against nl_kvx_remote_prefill);
 *  - the message parsers refuse every malformed field with a message naming it;
 *  - `nanolm serve --role prefill` + `--role decode` answer the OpenAI API with the text of a
 *    colocated server, and /metrics counts the KV bytes moved. */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "nanolm/client.h"
#include "nanolm/engine.h"
#include "nanolm/kv_transfer.h"
#include "nanolm/kvcache.h"
#include "nanolm/model.h"

/* A byte-vocabulary model with scaled-up weights (greedy choices far apart), GQA 4 heads / 2 kv. */
static void make_model(nl_model *m) {
    nl_arch a = tu_arch("disagg-test", 256, 64, 3, 4, 2, 96, 128);
    a.tied_embeddings = 1;
    tu_model(m, &a, 7);
    for (size_t i = 0; i < m->n_params; i++) m->params[i] *= 25.0f;
    for (int64_t l = 0; l < m->L; l++)
        for (int64_t i = 0; i < m->C; i++) m->w.layers[l].rms_att[i] = m->w.layers[l].rms_ffn[i] = 1.0f;
    for (int64_t i = 0; i < m->C; i++) m->w.rms_final[i] = 1.0f;
}

static void prompt_of(int64_t i, int32_t *p, int64_t n) {
    for (int64_t j = 0; j < n; j++) p[j] = (int32_t)((37 * i + 11 * j + (j * j) % 7) % 256);
}

static nl_engine *open_engine(const nl_model *m, nl_kv_dtype kv, int64_t block_size, int64_t chunk) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.kv = kv;
    o.block_size = block_size;
    o.chunk = chunk;
    o.max_batch = 8;
    o.max_step_tokens = 64;
    o.threads = 1;
    nl_engine *e = NULL;
    assert_int_equal(nl_engine_open_model(&e, m, NULL, &o), NL_OK);
    return e;
}

static void drain(nl_engine *e) {
    int guard = 0;
    while (nl_engine_busy(e)) {
        assert_int_equal(nl_engine_step(e, NULL), NL_OK);
        assert_true(++guard < 100000);
    }
}

/* Completion tokens of a finished request (out must hold them), then releases it. */
static int64_t take(nl_engine *e, uint64_t id, int32_t *out) {
    nl_engine_output o;
    assert_int_equal(nl_engine_read(e, id, 1, &o), NL_OK);
    assert_true(o.finish == NL_FINISH_LENGTH || o.finish == NL_FINISH_STOP);
    memcpy(out, o.tokens, (size_t)o.n_tokens * sizeof(int32_t));
    int64_t n = o.n_tokens;
    nl_engine_output_free(&o);
    nl_engine_release(e, id);
    return n;
}

static int64_t used_blocks(nl_engine *e) {
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    return st.kv_blocks_used;
}

/* The K/V bytes of n prompt tokens of m, from the model's shape alone. */
static size_t expected_bytes(const nl_model *m, nl_kv_dtype dt, int64_t n) {
    size_t elems =
        2 * (size_t)m->arch.n_layers * (size_t)m->arch.n_kv_heads * (size_t)(m->arch.dim / m->arch.n_heads) * (size_t)n;
    if (dt == NL_KV_FP32) return elems * 4;
    /* int8 codes, 1 byte each, plus one fp16 scale per kv head and token for K and for V */
    return elems * 1 + 2 * (size_t)m->arch.n_layers * (size_t)m->arch.n_kv_heads * 2 * (size_t)n;
}

#define N_REQ 6
static const int64_t PLEN[N_REQ] = {1, 7, 16, 17, 40, 90};

/* Colocated vs disaggregated (prefill engine -> wire bytes -> decode engine) for one KV type. */
static void check_kv_type(nl_kv_dtype dt) {
    nl_model m;
    make_model(&m);
    nl_engine *colo = open_engine(&m, dt, 16, 256);
    nl_engine *pre = open_engine(&m, dt, 16, 5);  /* chunked prefill on the prefill side */
    nl_engine *dec = open_engine(&m, dt, 8, 256); /* another block size on the decode side */
    nl_kvx_shape sh;
    nl_kvx_shape_of(pre, &sh);
    for (int mode = 0; mode < 2; mode++) { /* greedy, then seeded sampling */
        nl_sampling s;
        nl_sampling_default(&s);
        s.max_tokens = 24;
        s.ignore_eos = 1;
        s.temperature = mode ? 0.9f : 0.0f;
        s.top_k = mode ? 40 : 0;
        int32_t prompt[128], want[64], got[64];
        for (int i = 0; i < N_REQ; i++) {
            prompt_of(i, prompt, PLEN[i]);
            s.seed = 1000 + (uint64_t)i;
            uint64_t id;
            assert_int_equal(nl_engine_submit(colo, prompt, PLEN[i], &s, &id), NL_OK);
            drain(colo);
            int64_t nw = take(colo, id, want);
            assert_int_equal(nw, 24);

            assert_int_equal(nl_engine_submit_prefill(pre, prompt, PLEN[i], &s, &id), NL_OK);
            drain(pre);
            nl_engine_kv kv;
            assert_int_equal(nl_engine_export_kv(pre, id, &kv), NL_OK);
            assert_true(used_blocks(pre) > 0); /* held until released */
            nl_engine_release(pre, id);
            assert_int_equal(used_blocks(pre), 0);
            assert_int_equal(kv.n_tokens, PLEN[i]);
            assert_int_equal(kv.first_token, want[0]);
            assert_int_equal(kv.data_bytes, expected_bytes(&m, dt, PLEN[i]));

            uint8_t *msg = NULL;
            size_t len = 0;
            assert_int_equal(nl_kvx_encode_kv(&sh, &kv, 16, 0, &msg, &len), NL_OK);
            assert_int_equal(len, NL_KVX_KV_HEADER_BYTES + 4 * (size_t)PLEN[i] + expected_bytes(&m, dt, PLEN[i]));
            nl_engine_kv back;
            assert_int_equal(nl_kvx_parse_kv(msg, len, &sh, &back), NL_OK);
            assert_int_equal(back.data_bytes, kv.data_bytes);
            assert_memory_equal(back.data, kv.data, kv.data_bytes);
            nl_free(msg);
            nl_engine_kv_free(&kv);

            assert_int_equal(nl_engine_import_kv(dec, &back, &s, &id), NL_OK);
            nl_engine_kv_free(&back);
            drain(dec);
            int64_t ng = take(dec, id, got);
            assert_int_equal(ng, nw);
            assert_memory_equal(got, want, (size_t)nw * sizeof(int32_t));
        }
    }
    assert_int_equal(used_blocks(colo), 0);
    assert_int_equal(used_blocks(pre), 0);
    assert_int_equal(used_blocks(dec), 0);
    print_message("%s KV: %d prompts, greedy and sampled tokens identical to colocated serving\n",
                  dt == NL_KV_INT8 ? "int8" : "fp32", N_REQ);
    nl_engine_close(colo);
    nl_engine_close(pre);
    nl_engine_close(dec);
    nl_model_free(&m);
}

static void same_tokens_fp32(void **state) {
    (void)state;
    check_kv_type(NL_KV_FP32);
}
static void same_tokens_int8(void **state) {
    (void)state;
    check_kv_type(NL_KV_INT8);
}

/* Many imports waiting at once, some with max_tokens 1 (done at import), one cancelled while it
 * waits holding blocks: every block comes back. */
static void import_edge_cases(void **state) {
    (void)state;
    nl_model m;
    make_model(&m);
    nl_engine *pre = open_engine(&m, NL_KV_FP32, 16, 256);
    nl_engine *dec = open_engine(&m, NL_KV_FP32, 16, 256);
    int32_t prompt[64];
    prompt_of(3, prompt, 30);
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    s.ignore_eos = 1;
    uint64_t id;
    assert_int_equal(nl_engine_submit_prefill(pre, prompt, 30, &s, &id), NL_OK);
    /* not finished yet: nothing to export */
    assert_int_equal(nl_engine_export_kv(pre, id, &(nl_engine_kv){0}), NL_ERR_INVALID);
    drain(pre);
    nl_engine_kv kv;
    assert_int_equal(nl_engine_export_kv(pre, id, &kv), NL_OK);
    nl_engine_release(pre, id);
    uint64_t ids[6];
    for (int i = 0; i < 6; i++) {
        s.max_tokens = i == 0 ? 1 : 10;
        assert_int_equal(nl_engine_import_kv(dec, &kv, &s, &ids[i]), NL_OK);
    }
    assert_int_equal(nl_engine_cancel(dec, ids[5]), NL_OK);
    drain(dec);
    int32_t out[16];
    assert_int_equal(take(dec, ids[0], out), 1);
    assert_int_equal(out[0], kv.first_token);
    for (int i = 1; i < 5; i++) assert_int_equal(take(dec, ids[i], out), 10);
    nl_engine_release(dec, ids[5]);
    assert_int_equal(used_blocks(dec), 0);
    /* a KV of another format or size is refused, naming it */
    kv.dtype = NL_KV_INT8;
    assert_int_equal(nl_engine_import_kv(dec, &kv, &s, &id), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "int8"));
    kv.dtype = NL_KV_FP32;
    kv.data_bytes--;
    assert_int_equal(nl_engine_import_kv(dec, &kv, &s, &id), NL_ERR_INVALID);
    assert_non_null(strstr(nl_last_error(), "bytes"));
    kv.data_bytes++;
    assert_int_equal(used_blocks(dec), 0);
    nl_engine_kv_free(&kv);
    nl_engine_close(pre);
    nl_engine_close(dec);
    nl_model_free(&m);
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Copies msg, writes v at offset, parses, and expects NL_ERR_FORMAT with `needle` in the message. */
static void expect_refused(const uint8_t *msg, size_t len, size_t off, uint32_t v, const nl_kvx_shape *sh, int request,
                           const char *needle) {
    uint8_t *b = malloc(len);
    memcpy(b, msg, len);
    if (off < len) put32(b + off, v);
    nl_status rc;
    if (request) {
        nl_kvx_request rq;
        rc = nl_kvx_parse_request(b, len, sh, &rq);
        assert_null(rq.tokens);
    } else {
        nl_engine_kv kv;
        rc = nl_kvx_parse_kv(b, len, sh, &kv);
        assert_null(kv.data);
    }
    if (rc != NL_ERR_FORMAT || !strstr(nl_last_error(), needle))
        fail_msg("offset %zu = %u: status %d, message '%s' (expected one naming '%s')", off, v, (int)rc,
                 nl_last_error(), needle);
    free(b);
}

static void parser_refuses_bad_input(void **state) {
    (void)state;
    nl_kvx_shape sh = {3, 4, 2, 16, 256, 128, NL_KV_FP32};
    int32_t prompt[10];
    prompt_of(1, prompt, 10);
    nl_sampling s;
    nl_sampling_default(&s);
    uint8_t *rq = NULL;
    size_t rql = 0;
    assert_int_equal(nl_kvx_encode_request(&sh, prompt, 10, &s, 0xabcd1234u, &rq, &rql), NL_OK);
    nl_kvx_request r;
    assert_int_equal(nl_kvx_parse_request(rq, rql, &sh, &r), NL_OK);
    assert_int_equal(r.n_tokens, 10);
    assert_int_equal(r.id, 0xabcd1234u);
    assert_memory_equal(r.tokens, prompt, sizeof prompt);
    nl_free(r.tokens);
    expect_refused(rq, rql, 0, 0x58585858, &sh, 1, "magic");
    expect_refused(rq, rql, 4, 2, &sh, 1, "version");
    expect_refused(rq, rql, 8, 4, &sh, 1, "n_layers");
    expect_refused(rq, rql, 16, 1, &sh, 1, "kv_heads");
    expect_refused(rq, rql, 32, 1, &sh, 1, "KV format");
    expect_refused(rq, rql, 36, 0, &sh, 1, "n_tokens");
    expect_refused(rq, rql, 36, 11, &sh, 1, "header says");
    expect_refused(rq, rql, 36, 0xffffffffu, &sh, 1, "n_tokens");
    expect_refused(rq, rql, 64, 256, &sh, 1, "vocabulary");
    expect_refused(rq, rql - 1, rql, 0, &sh, 1, "header says");
    expect_refused(rq, 10, rql, 0, &sh, 1, "shorter");
    expect_refused(rq, rql, 44, 0x40000000u /* top_p 2.0 */, &sh, 1, "top_p");
    nl_free(rq);

    nl_engine_kv kv;
    memset(&kv, 0, sizeof kv);
    kv.n_layers = 3;
    kv.kv_heads = 2;
    kv.head_dim = 16;
    kv.dtype = NL_KV_FP32;
    kv.n_tokens = 10;
    kv.tokens = prompt;
    kv.first_token = 65;
    kv.data_bytes = nl_kvcache_seq_bytes(3, 2, 16, NL_KV_FP32, 10);
    assert_int_equal(kv.data_bytes, 2 * 3 * 2 * 16 * 4 * 10);
    kv.data = calloc(1, kv.data_bytes);
    uint8_t *m = NULL;
    size_t ml = 0;
    assert_int_equal(nl_kvx_encode_kv(&sh, &kv, 4, 0, &m, &ml), NL_OK);
    nl_engine_kv back;
    assert_int_equal(nl_kvx_parse_kv(m, ml, &sh, &back), NL_OK);
    assert_int_equal(back.first_token, 65);
    nl_engine_kv_free(&back);
    expect_refused(m, ml, 0, 0, &sh, 0, "magic");
    expect_refused(m, ml, 4, 9, &sh, 0, "version");
    expect_refused(m, ml, 24, 17, &sh, 0, "head_dim");
    expect_refused(m, ml, 32, 4096, &sh, 0, "seq_len");
    expect_refused(m, ml, 36, 1, &sh, 0, "KV format");
    expect_refused(m, ml, 40, 0, &sh, 0, "block_size");
    expect_refused(m, ml, 44, 2, &sh, 0, "n_blocks");
    expect_refused(m, ml, 48, 0, &sh, 0, "n_tokens");
    expect_refused(m, ml, 48, 128, &sh, 0, "n_tokens");
    expect_refused(m, ml, 48, 13, &sh, 0, "n_blocks");
    expect_refused(m, ml, 52, 256, &sh, 0, "first_token");
    expect_refused(m, ml, 88, (uint32_t)kv.data_bytes + 1, &sh, 0, "kv_bytes");
    expect_refused(m, ml, 92, 1, &sh, 0, "kv_bytes");
    expect_refused(m, ml, NL_KVX_KV_HEADER_BYTES + 8, 300, &sh, 0, "vocabulary");
    expect_refused(m, ml - 1, ml, 0, &sh, 0, "header says");
    expect_refused(m, 50, ml, 0, &sh, 0, "shorter");
    nl_free(m);
    /* an error answer carries the other side's message */
    assert_int_equal(nl_kvx_encode_error(&sh, NL_ERR_BUSY, "queue full", &m, &ml), NL_OK);
    assert_int_equal(nl_kvx_parse_kv(m, ml, &sh, &back), NL_ERR_BUSY);
    assert_non_null(strstr(nl_last_error(), "prefill server: queue full"));
    expect_refused(m, ml, 96, NL_KVX_MAX_TEXT + 1, &sh, 0, "error text");
    nl_free(m);
    free(kv.data);
}

/* The prefill server over a real socket, and the decode side's import. */
static void over_socket(void **state) {
    (void)state;
    nl_model m;
    make_model(&m);
    nl_engine *colo = open_engine(&m, NL_KV_INT8, 16, 256);
    nl_engine *pre = open_engine(&m, NL_KV_INT8, 16, 8);
    nl_engine *dec = open_engine(&m, NL_KV_INT8, 16, 256);
    nl_kvx_server *ps = NULL;
    assert_int_equal(nl_kvx_server_start(&ps, pre, "127.0.0.1", 0), NL_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", nl_kvx_server_port(ps));
    nl_kvx_shape sh;
    nl_kvx_shape_of(dec, &sh);
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = 20;
    s.ignore_eos = 1;
    int32_t prompt[64], want[32], got[32];
    size_t total = 0;
    for (int i = 0; i < 3; i++) {
        prompt_of(10 + i, prompt, 33 + i);
        uint64_t id;
        assert_int_equal(nl_engine_submit(colo, prompt, 33 + i, &s, &id), NL_OK);
        drain(colo);
        int64_t nw = take(colo, id, want);
        nl_engine_kv kv;
        size_t moved = 0;
        assert_int_equal(nl_kvx_remote_prefill(addr, &sh, prompt, 33 + i, &s, &kv, &moved), NL_OK);
        assert_int_equal(kv.data_bytes, expected_bytes(&m, NL_KV_INT8, 33 + i));
        assert_int_equal(moved, NL_KVX_KV_HEADER_BYTES + 4 * (size_t)(33 + i) + kv.data_bytes);
        total += kv.data_bytes;
        assert_int_equal(nl_engine_import_kv(dec, &kv, &s, &id), NL_OK);
        nl_engine_kv_free(&kv);
        drain(dec);
        assert_int_equal(take(dec, id, got), nw);
        assert_memory_equal(got, want, (size_t)nw * sizeof(int32_t));
    }
    /* a shape the server does not serve is refused by it, with its reason */
    nl_kvx_shape other = sh;
    other.n_layers = 5;
    nl_engine_kv kv;
    assert_int_not_equal(nl_kvx_remote_prefill(addr, &other, prompt, 4, &s, &kv, NULL), NL_OK);
    assert_non_null(strstr(nl_last_error(), "n_layers"));
    /* a prefill server that is not there */
    assert_int_equal(nl_kvx_remote_prefill("127.0.0.1:1", &sh, prompt, 4, &s, &kv, NULL), NL_ERR_IO);
    assert_non_null(strstr(nl_last_error(), "127.0.0.1:1"));
    nl_kvx_stats st;
    nl_kvx_server_stats(ps, &st);
    assert_int_equal(st.requests_ok, 3);
    assert_int_equal((size_t)st.kv_bytes_sent, total);
    nl_kvx_server_stop(ps);
    assert_int_equal(used_blocks(pre), 0);
    assert_int_equal(used_blocks(dec), 0);
    nl_engine_close(colo);
    nl_engine_close(pre);
    nl_engine_close(dec);
    nl_model_free(&m);
}

/* ---- the CLI: three `nanolm serve` processes ------------------------------------------------- */

static tu_server g_procs[4];
static int g_nprocs;

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < g_nprocs; i++) tu_server_kill(&g_procs[i]);
    g_nprocs = 0;
    return 0;
}

/* `nanolm serve ARGS` on an ephemeral port, its log in dir/name.log. */
static tu_server *spawn(const char *dir, const char *name, const char *args) {
    tu_server *p = &g_procs[g_nprocs++];
    char *why = NULL;
    if (tu_server_start(p, dir, name, args, &why)) fail_msg("%s", why ? why : "the server did not start");
    return p;
}

static cJSON *post(int port, const char *body) {
    nl_http_response r;
    assert_int_equal(
        nl_http_request("127.0.0.1", port, "POST", "/v1/completions", body, strlen(body), 300, NULL, NULL, &r), NL_OK);
    if (r.status != 200) fail_msg("HTTP %d: %s", r.status, r.body.data ? r.body.data : "");
    cJSON *doc = cJSON_Parse(r.body.data);
    assert_non_null(doc);
    nl_http_response_free(&r);
    return doc;
}

/* A counter or gauge of /metrics at port, or -1 when the server does not answer or has no such
 * line (every nanolm metric is >= 0). */
static double metric_of(int port, const char *name) {
    nl_http_response r;
    if (nl_http_request("127.0.0.1", port, "GET", "/metrics", NULL, 0, 30, NULL, NULL, &r)) return -1;
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = r.body.data ? strstr(r.body.data, key) : NULL;
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    nl_http_response_free(&r);
    return v;
}

static double metric(int port, const char *name) {
    const double v = metric_of(port, name);
    if (v < 0) fail_msg("no %s in /metrics", name);
    return v;
}

static void cli_roles(void **state) {
    (void)state;
    const char *ck = tu_data_path("stories260K/stories260K.bin");
    const char *tk = tu_data_path("stories260K/tok512.bin");
    if (!ck || !tk) {
        print_message("[  SKIP    ] needs ../shared/data/stories260K (not present)\n");
        skip();
        return;
    }
    /* the model's shape, for the bytes the transfer must move */
    nl_engine *e = NULL;
    assert_int_equal(nl_engine_open(&e, ck, tk, NULL), NL_OK);
    const nl_arch *a = nl_engine_arch(e);
    const int64_t per_token_fp32 = 2 * a->n_layers * a->n_kv_heads * nl_arch_head_dim(a) * 4;
    nl_engine_close(e);
    char *dir = tu_tmpdir();
    char model[1200], args[2048];
    snprintf(model, sizeof model, "--ckpt '%s' --tokenizer '%s' --threads 1", ck, tk);
    tu_server *colo = spawn(dir, "colocated", model);
    snprintf(args, sizeof args, "%s --role prefill --chunk 16", model);
    tu_server *pre = spawn(dir, "prefill", args);
    snprintf(args, sizeof args, "%s --role decode --prefill 127.0.0.1:%d", model, pre->port);
    tu_server *dec = spawn(dir, "decode", args);
    snprintf(args, sizeof args, "%s --role disagg --chunk 16", model);
    tu_server *both = spawn(dir, "disagg", args); /* one command, two processes */
    const char *bodies[3] = {
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}",
        "{\"prompt\":\"The little dog was sad because\",\"max_tokens\":30,\"temperature\":0}",
        "{\"prompt\":\"Lily\",\"max_tokens\":50,\"temperature\":0.8,\"seed\":5}",
    };
    int64_t prompt_tokens = 0;
    for (int i = 0; i < 3; i++) {
        cJSON *c = post(colo->port, bodies[i]), *d = post(dec->port, bodies[i]), *b = post(both->port, bodies[i]);
        cJSON *cc = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0);
        cJSON *dc = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "choices"), 0);
        cJSON *bc = cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0);
        const char *ct = cJSON_GetObjectItem(cc, "text")->valuestring,
                   *dt = cJSON_GetObjectItem(dc, "text")->valuestring;
        assert_true(strlen(ct) > 10);
        assert_string_equal(dt, ct);
        assert_string_equal(cJSON_GetObjectItem(bc, "text")->valuestring, ct);
        cJSON_Delete(b);
        assert_string_equal(cJSON_GetObjectItem(dc, "finish_reason")->valuestring,
                            cJSON_GetObjectItem(cc, "finish_reason")->valuestring);
        prompt_tokens += (int64_t)cJSON_GetObjectItem(cJSON_GetObjectItem(d, "usage"), "prompt_tokens")->valuedouble;
        if (i == 0) print_message("colocated and disaggregated: \"%s\"\n", dt);
        cJSON_Delete(c);
        cJSON_Delete(d);
    }
    assert_int_equal((int64_t)metric(dec->port, "nanolm_kv_transfers_total"), 3);
    assert_int_equal((int64_t)metric(dec->port, "nanolm_kv_transfer_bytes_total"), per_token_fp32 * prompt_tokens);
    assert_int_equal((int64_t)metric(dec->port, "nanolm_kv_blocks_used"), 0);
    print_message("%lld prompt tokens, %lld KV bytes moved (%lld per token)\n", (long long)prompt_tokens,
                  (long long)(per_token_fp32 * prompt_tokens), (long long)per_token_fp32);
    assert_int_equal((int64_t)metric(both->port, "nanolm_kv_transfer_bytes_total"), per_token_fp32 * prompt_tokens);
    assert_int_equal(tu_server_stop(both), 0); /* stops its prefill process too */
    char *both_log = tu_read_file(g_procs[3].log, NULL);
    assert_non_null(both_log);
    if (!strstr(both_log, "prefill server stopped (3 prompts sent, 0 failed"))
        fail_msg("--role disagg did not stop its prefill process: %s", both_log);
    free(both_log);
    assert_int_equal(tu_server_stop(dec), 0);
    assert_int_equal(tu_server_stop(pre), 0);
    assert_int_equal(tu_server_stop(colo), 0);
    char *log = tu_read_file(g_procs[1].log, NULL);
    assert_non_null(log);
    char want[128];
    snprintf(want, sizeof want, "3 prompts sent, 0 failed, %lld KV bytes", (long long)(per_token_fp32 * prompt_tokens));
    if (!strstr(log, want)) fail_msg("prefill log lacks '%s': %s", want, log);
    free(log);
    g_nprocs = 0;
    /* a decode role without its prefill server is a usage error */
    char *out = NULL;
    assert_int_not_equal(tu_run_cli("serve --dummy-arch '{\"vocab_size\":256,\"dim\":32,\"n_layers\":1,\"n_heads\":2,"
                                    "\"hidden_dim\":64,\"seq_len\":32}' --role decode",
                                    &out),
                         0);
    assert_non_null(strstr(out, "--prefill"));
    free(out);
    tu_rmdir(dir);
    free(dir);
}

/* ---- a fake prefill server that answers for another request ---- */

typedef struct fake_prefill {
    int lfd, mode; /* 0: a right answer, 1: for another prompt, 2: another request id */
    nl_kvx_shape sh;
} fake_prefill;

static int read_n(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void *fake_prefill_main(void *arg) {
    fake_prefill *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t hdr[NL_KVX_REQ_HEADER_BYTES];
    size_t body = 0;
    if (read_n(fd, hdr, sizeof hdr) || nl_kvx_request_header(hdr, &f->sh, &body)) {
        close(fd);
        return NULL;
    }
    uint8_t *msg = malloc(sizeof hdr + body);
    memcpy(msg, hdr, sizeof hdr);
    nl_kvx_request rq;
    if (read_n(fd, msg + sizeof hdr, body) || nl_kvx_parse_request(msg, sizeof hdr + body, &f->sh, &rq)) {
        free(msg);
        close(fd);
        return NULL;
    }
    free(msg);
    nl_engine_kv kv;
    memset(&kv, 0, sizeof kv);
    kv.n_layers = f->sh.n_layers;
    kv.kv_heads = f->sh.kv_heads;
    kv.head_dim = f->sh.head_dim;
    kv.dtype = f->sh.dtype;
    kv.n_tokens = rq.n_tokens;
    kv.tokens = rq.tokens;
    if (f->mode == 1) rq.tokens[rq.n_tokens - 1] ^= 1;
    kv.data_bytes = nl_kvcache_seq_bytes(kv.n_layers, kv.kv_heads, kv.head_dim, kv.dtype, kv.n_tokens);
    kv.data = calloc(1, kv.data_bytes);
    uint8_t *ans = NULL;
    size_t n = 0;
    if (!nl_kvx_encode_kv(&f->sh, &kv, 4, f->mode == 2 ? rq.id + 1 : rq.id, &ans, &n)) send(fd, ans, n, MSG_NOSIGNAL);
    nl_free(ans);
    free(kv.data);
    nl_free(rq.tokens);
    close(fd);
    return NULL;
}

/* The decode side takes only an answer to its own request: an answer for another prompt or with
 * another request id is refused with a message saying so (it used to be imported and decoded). */
static void answer_for_another_request(void **state) {
    (void)state;
    static const char *const want[] = {NULL, "answered for another prompt", "answered request id"};
    for (int mode = 0; mode < 3; mode++) {
        fake_prefill f = {.mode = mode, .sh = {3, 4, 2, 16, 256, 128, NL_KV_FP32}};
        f.lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        assert_int_equal(bind(f.lfd, (struct sockaddr *)&a, sizeof a), 0);
        assert_int_equal(listen(f.lfd, 1), 0);
        socklen_t al = sizeof a;
        getsockname(f.lfd, (struct sockaddr *)&a, &al);
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, fake_prefill_main, &f), 0);
        int32_t prompt[10];
        prompt_of(3, prompt, 10);
        nl_sampling s;
        nl_sampling_default(&s);
        nl_engine_kv kv;
        nl_status rc = nl_kvx_remote_prefill(addr, &f.sh, prompt, 10, &s, &kv, NULL);
        pthread_join(th, NULL);
        close(f.lfd);
        if (!want[mode]) {
            assert_int_equal(rc, NL_OK);
            assert_memory_equal(kv.tokens, prompt, sizeof prompt);
            nl_engine_kv_free(&kv);
        } else if (rc != NL_ERR_FORMAT || !strstr(nl_last_error(), want[mode])) {
            fail_msg("mode %d: status %d, '%s' (expected '%s')", mode, rc, nl_last_error(), want[mode]);
        }
    }
}

typedef struct stopper {
    nl_kvx_server *ps;
    volatile int done;
} stopper;

static void *stop_main(void *arg) {
    stopper *st = arg;
    nl_kvx_server_stop(st->ps);
    st->done = 1;
    return NULL;
}

/* The prefill server under idle clients: connections past NL_KVX_MAX_CONNS get a BUSY answer at
 * once (it used to start a thread for each of any number), and stopping it returns while idle
 * clients are still connected (it used to wait for their 600 s timeout): bounded waits, 5 s. */
static void prefill_server_bounded(void **state) {
    (void)state;
    nl_model m;
    make_model(&m);
    nl_engine *e = open_engine(&m, NL_KV_FP32, 16, 0);
    nl_kvx_server *ps = NULL;
    assert_int_equal(nl_kvx_server_start(&ps, e, "127.0.0.1", 0), NL_OK);
    enum { N = NL_KVX_MAX_CONNS + 8 };
    int fds[N], busy = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)nl_kvx_server_port(ps))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&a, sizeof a), 0);
        usleep(2000); /* in order: the first NL_KVX_MAX_CONNS take the slots */
    }
    for (int i = NL_KVX_MAX_CONNS; i < N; i++) { /* the ones past the limit: a BUSY answer */
        struct timeval tv = {5, 0};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        uint8_t h[NL_KVX_KV_HEADER_BYTES];
        if (read_n(fds[i], h, sizeof h) == 0 && h[8] == (uint8_t)NL_ERR_BUSY) busy++;
    }
    stopper st = {ps, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stop_main, &st), 0);
    for (int i = 0; i < 50 && !st.done; i++) usleep(100 * 1000);
    int stopped = st.done;
    for (int i = 0; i < N; i++) close(fds[i]); /* lets a hung stop finish, so the test ends */
    pthread_join(th, NULL);
    nl_engine_close(e);
    nl_model_free(&m);
    assert_int_equal(busy, N - NL_KVX_MAX_CONNS);
    assert_true(stopped);
}

typedef struct bg_req {
    int port, status;
} bg_req;

static void *bg_request(void *arg) {
    bg_req *b = arg;
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}";
    nl_http_response r;
    b->status =
        nl_http_request("127.0.0.1", b->port, "POST", "/v1/completions", body, strlen(body), 120, NULL, NULL, &r)
            ? -1
            : r.status;
    if (b->status >= 0) nl_http_response_free(&r);
    return NULL;
}


/* The decode role with a prefill server that never answers: the request waiting on the transfer
 * is counted as running, and SIGTERM with --drain-timeout 1 cancels it and exits 0 (it used to
 * show 0 running and outlive SIGTERM by the 600 s socket timeout); with no prefill server
 * listening, /health says so (503). Bounded: the exit is waited for 20 s. */
static void decode_waits_on_prefill(void **state) {
    (void)state;
    const char *ck = tu_data_path("stories260K/stories260K.bin");
    const char *tk = tu_data_path("stories260K/tok512.bin");
    if (!ck || !tk) {
        print_message("[  SKIP    ] needs stories260K\n");
        skip();
        return;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0); /* listens, never accepts: connect and send succeed */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 16), 0);
    socklen_t al = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &al);
    char *dir = tu_tmpdir(), args[2048];
    snprintf(args, sizeof args,
             "--ckpt '%s' --tokenizer '%s' --threads 1 --role decode --prefill 127.0.0.1:%d --drain-timeout 1", ck, tk,
             ntohs(a.sin_port));
    tu_server *p = spawn(dir, "decode-stuck", args);
    bg_req b = {p->port, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bg_request, &b), 0);
    double running = 0;
    for (int i = 0; i < 100 && (running = metric_of(p->port, "nanolm_requests_running")) < 1; i++) usleep(50000);
    kill(p->pid, SIGTERM);
    int st = -1, exited = 0;
    for (int i = 0; i < 200 && !(exited = waitpid(p->pid, &st, WNOHANG) == p->pid); i++) usleep(100000);
    if (exited) p->pid = -1;
    tu_server_kill(p);
    close(lfd); /* the fake's backlog goes; a request still waiting on it ends */
    pthread_join(th, NULL);
    /* no prefill server at all: /health says so */
    snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s' --threads 1 --role decode --prefill 127.0.0.1:%d", ck, tk,
             ntohs(a.sin_port));
    tu_server *q = spawn(dir, "decode-alone", args);
    nl_http_response r;
    int health = nl_http_request("127.0.0.1", q->port, "GET", "/health", NULL, 0, 10, NULL, NULL, &r) ? -1 : r.status;
    if (health >= 0) nl_http_response_free(&r);
    tu_server_kill(q);
    tu_rmdir(dir);
    free(dir);
    /* the cancelled request gets a 5xx or, when the daemon closes first, a closed connection */
    if (running != 1 || !exited || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || (b.status >= 0 && b.status < 500) ||
        health != 503)
        fail_msg("running %g while waiting; exited %d (status %d); the request got %d; /health alone %d", running,
                 exited, st, b.status, health);
}

/* The first child process of pid (from /proc), or -1. */
static int first_child(int pid) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
    FILE *f = fopen(path, "r");
    int c = -1;
    if (f) {
        if (fscanf(f, "%d", &c) != 1) c = -1;
        fclose(f);
    }
    return c;
}

/* 1 while pid runs (not gone, not a zombie). */
static int alive(int pid) {
    char path[64], st[256] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(st, 1, sizeof st - 1, f);
    fclose(f);
    st[n] = 0;
    const char *p = strrchr(st, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* --role disagg: a stopped and continued prefill child is not a dead one (the server used to shut
 * down on any SIGCHLD), and the child dies with its parent, even of SIGKILL (it used to stay
 * listening). */
static void disagg_child_signals(void **state) {
    (void)state;
    const char *ck = tu_data_path("stories260K/stories260K.bin");
    const char *tk = tu_data_path("stories260K/tok512.bin");
    if (!ck || !tk) {
        print_message("[  SKIP    ] needs stories260K\n");
        skip();
        return;
    }
    char *dir = tu_tmpdir(), args[2048];
    snprintf(args, sizeof args, "--ckpt '%s' --tokenizer '%s' --threads 1 --role disagg", ck, tk);
    tu_server *p = spawn(dir, "disagg-signals", args);
    int child = first_child(p->pid);
    assert_true(child > 0);
    kill(child, SIGSTOP);
    usleep(300 * 1000);
    kill(child, SIGCONT);
    usleep(500 * 1000);
    nl_http_response r;
    int health = nl_http_request("127.0.0.1", p->port, "GET", "/health", NULL, 0, 10, NULL, NULL, &r) ? -1 : r.status;
    if (health >= 0) nl_http_response_free(&r);
    int still = 0;
    if (health == 200) { /* and an answer through the continued child */
        const char *body = "{\"prompt\":\"Once\",\"max_tokens\":4}";
        still =
            !nl_http_request("127.0.0.1", p->port, "POST", "/v1/completions", body, strlen(body), 60, NULL, NULL, &r) &&
            r.status == 200;
        nl_http_response_free(&r);
    }
    tu_server_kill(p); /* SIGKILL of the parent */
    int gone = 0;
    for (int i = 0; i < 100 && !(gone = !alive(child)); i++) usleep(100 * 1000);
    if (!gone) kill(child, SIGKILL);
    tu_rmdir(dir);
    free(dir);
    assert_int_equal(health, 200);
    assert_true(still);
    assert_true(gone);
}

int main(void) {
    /* correctness, not speed: every kernel on this thread (a loaded machine makes nested
     * thread teams wait on descheduled threads) */
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_tokens_fp32),
        cmocka_unit_test(same_tokens_int8),
        cmocka_unit_test(import_edge_cases),
        cmocka_unit_test(parser_refuses_bad_input),
        cmocka_unit_test(over_socket),
        cmocka_unit_test(answer_for_another_request),
        cmocka_unit_test_teardown(cli_roles, teardown),
        cmocka_unit_test_teardown(disagg_child_signals, teardown),
        cmocka_unit_test(prefill_server_bounded),
        cmocka_unit_test_teardown(decode_waits_on_prefill, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
