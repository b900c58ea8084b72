/* libFuzzer target: the body of POST /v1/completions and /v1/chat/completions through the server's
 * parsers and validators (nl_http_parse_completion, nl_http_parse_chat) and the JSON it answers with. Invariants: an accepted request is
 * within every documented range; a refused one has status 400, a message and an error document
 * that parses back; the response and chunk built from whatever text was accepted are valid JSON. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/http_request.h"

#include "fuzz_targets.h"

static void check_json(const nl_http_buf *b, int sse) {
    const char *s = b->data;
    size_t n = b->len;
    if (sse) {
        if (n < 8 || memcmp(s, "data: ", 6) || s[n - 1] != '\n' || s[n - 2] != '\n') abort();
        s += 6;
        n -= 8;
    }
    cJSON *doc = cJSON_ParseWithLength(s, n);
    if (!doc) abort();
    cJSON_Delete(doc);
}

int nl_fuzz_http_request(const uint8_t *data, size_t size) {
    nl_completion_req req;
    nl_http_error err;
    nl_http_buf b = {0};
    nl_status rc = nl_http_parse_completion((const char *)data, size, 512, &req, &err);
    if (rc == NL_OK) {
        if (req.max_tokens < 0 || !(req.temperature >= 0 && req.temperature <= 2) ||
            !(req.top_p > 0 && req.top_p <= 1) || req.top_k < 0 || req.n_stop < 0 || req.n_stop > NL_HTTP_MAX_STOP)
            abort();
        if (!req.prompt == !req.prompt_tokens) abort();
        for (int64_t i = 0; i < req.n_prompt_tokens; i++)
            if (req.prompt_tokens[i] < 0 || req.prompt_tokens[i] >= 512) abort();
        for (int i = 0; i < req.n_stop; i++)
            if (!req.stop[i] || !req.stop[i][0] || strlen(req.stop[i]) > NL_HTTP_MAX_STOP_BYTES) abort();
        const char *text = req.prompt ? req.prompt : "";
        size_t tn = req.prompt ? req.prompt_bytes : 0;
        nl_completion_id id = {"cmpl-fuzz", 1, req.model, 0};
        if (nl_http_completion_json(&id, text, tn, "length", req.n_prompt_tokens, req.max_tokens, &b) == NL_OK)
            check_json(&b, 0);
        b.len = 0;
        if (nl_http_sse_chunk(&id, text, tn, NULL, &b) == NL_OK) check_json(&b, 1);
        nl_http_completion_free(&req);
    } else {
        if (rc != NL_ERR_INVALID || err.status != 400 || !err.message[0] || req.prompt || req.prompt_tokens) abort();
        if (nl_http_error_json(&err, &b) == NL_OK) check_json(&b, 0);
    }
    b.len = 0;
    /* the same bytes as a /v1/chat/completions body */
    rc = nl_http_parse_chat((const char *)data, size, &req, &err);
    if (rc == NL_OK) {
        if (req.n_messages < 1 || req.prompt || req.prompt_tokens || req.max_tokens < 0) abort();
        for (int i = 0; i < req.n_messages; i++) {
            const char *r = req.messages[i].role;
            if (!r || !req.messages[i].content || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
                abort();
        }
        nl_completion_id id = {"chatcmpl-fuzz", 1, req.model, 1};
        const char *text = req.messages[0].content;
        if (nl_http_completion_json(&id, text, strlen(text), "stop", 1, 1, &b) == NL_OK) check_json(&b, 0);
        b.len = 0;
        if (nl_http_sse_chunk(&id, text, strlen(text), NULL, &b) == NL_OK) check_json(&b, 1);
        b.len = 0;
        if (nl_http_sse_chat_role(&id, &b) == NL_OK) check_json(&b, 1);
        nl_http_completion_free(&req);
    } else {
        if (rc != NL_ERR_INVALID || err.status != 400 || !err.message[0] || req.messages) abort();
    }
    nl_http_buf_free(&b);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_http_request(data, size); }
#endif
