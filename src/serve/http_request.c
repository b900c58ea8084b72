/* The OpenAI-compatible API as pure functions: request parsing and validation, response and SSE
 * chunk JSON, OpenAI-style errors, stop-string search. See include/nanolm/http_request.h. */
#include "nanolm/http_request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffer ---------------------------------------------------------------------------------- */

nl_status nl_http_buf_append(nl_http_buf *b, const void *s, size_t n) {
    if (n > ((size_t)1 << 40) || b->len + n + 1 < b->len)
        return nl_fail(NL_ERR_NOMEM, "http buffer: %zu bytes is too large", n);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return nl_fail(NL_ERR_NOMEM, "http buffer: cannot grow to %zu bytes", cap);
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return NL_OK;
}

nl_status nl_http_buf_printf(nl_http_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return nl_fail(NL_ERR_INVALID, "http buffer: bad format '%s'", fmt);
    if ((size_t)n < sizeof small) return nl_http_buf_append(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return nl_fail(NL_ERR_NOMEM, "http buffer: %d bytes", n);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    nl_status rc = nl_http_buf_append(b, big, (size_t)n);
    free(big);
    return rc;
}

void nl_http_buf_free(nl_http_buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- errors ---------------------------------------------------------------------------------- */

static const char *error_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return "server_error";
    }
}

void nl_http_error_set(nl_http_error *err, int status, const char *param, const char *fmt, ...) {
    err->status = status;
    err->type = error_type(status);
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

/* Appends a cJSON document printed without spaces, then deletes it. */
static nl_status append_json(cJSON *doc, nl_http_buf *out) {
    if (!doc) return nl_fail(NL_ERR_NOMEM, "http: cannot build a JSON document");
    char *s = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    if (!s) return nl_fail(NL_ERR_NOMEM, "http: cannot print a JSON document");
    nl_status rc = nl_http_buf_append(out, s, strlen(s));
    cJSON_free(s);
    return rc;
}

static cJSON *error_object(const nl_http_error *err) {
    cJSON *doc = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(doc, "error");
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : error_type(err->status));
    if (err->param[0])
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "code", err->status);
    return doc;
}

nl_status nl_http_error_json(const nl_http_error *err, nl_http_buf *out) { return append_json(error_object(err), out); }

nl_status nl_http_sse_error(const nl_http_error *err, nl_http_buf *out) {
    NL_TRY(nl_http_buf_append(out, "data: ", 6));
    NL_TRY(append_json(error_object(err), out));
    return nl_http_buf_append(out, "\n\n", 2);
}

/* ---- request parsing ------------------------------------------------------------------------- */

static const char *type_name(const cJSON *j) {
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "boolean";
    if (cJSON_IsNumber(j)) return "number";
    if (cJSON_IsString(j)) return "string";
    if (cJSON_IsArray(j)) return "array";
    if (cJSON_IsObject(j)) return "object";
    return "invalid";
}

/* A field that is absent or null keeps its default. */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (j && !cJSON_IsNull(j)) ? j : NULL;
}

static int bad(nl_http_error *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(nl_http_error *err, const char *param, const char *fmt, ...) {
    err->status = 400;
    err->type = error_type(400);
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return 1;
}

/* An integer-valued JSON number within [lo, hi]. */
static int get_int(const cJSON *obj, const char *name, int64_t lo, int64_t hi, int64_t *out, nl_http_error *err) {
    const cJSON *j = field(obj, name);
    if (!j) return 0;
    if (!cJSON_IsNumber(j)) return bad(err, name, "'%s' must be an integer, got %s", name, type_name(j));
    double v = j->valuedouble;
    if (!isfinite(v) || v != floor(v)) return bad(err, name, "'%s' must be an integer, got %.17g", name, v);
    if (v < (double)lo || v > (double)hi || v >= 0x1p63) /* (double)INT64_MAX rounds up to 2^63 */
        return bad(err, name, "'%s' must be in [%lld, %lld], got %.17g", name, (long long)lo, (long long)hi, v);
    *out = (int64_t)v;
    return 0;
}

static int get_num(const cJSON *obj, const char *name, double lo, double hi, int lo_open, double *out,
                   nl_http_error *err) {
    const cJSON *j = field(obj, name);
    if (!j) return 0;
    if (!cJSON_IsNumber(j)) return bad(err, name, "'%s' must be a number, got %s", name, type_name(j));
    double v = j->valuedouble;
    if (!isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo))
        return bad(err, name, "'%s' must be in %s%g, %g], got %.17g", name, lo_open ? "(" : "[", lo, hi, v);
    *out = v;
    return 0;
}

static int get_bool(const cJSON *obj, const char *name, int *out, nl_http_error *err) {
    const cJSON *j = field(obj, name);
    if (!j) return 0;
    if (!cJSON_IsBool(j)) return bad(err, name, "'%s' must be a boolean, got %s", name, type_name(j));
    *out = cJSON_IsTrue(j);
    return 0;
}

static char *dup_str(const char *s, size_t *len_out) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    if (len_out) *len_out = n;
    return d;
}

static int parse_prompt(const cJSON *doc, int64_t vocab_size, nl_completion_req *req, nl_http_error *err) {
    const cJSON *p = field(doc, "prompt");
    if (!p) return bad(err, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        if (n == 0) return bad(err, "prompt", "'prompt' is an empty array");
        const cJSON *first = cJSON_GetArrayItem(p, 0);
        if (cJSON_IsString(first)) {
            if (n > 1)
                return bad(err, "prompt", "'prompt' holds %d strings; this server takes one prompt per request", n);
            p = first;
        } else {
            req->prompt_tokens = malloc(sizeof(int32_t) * (size_t)n);
            if (!req->prompt_tokens) return bad(err, "prompt", "'prompt': out of memory for %d tokens", n);
            int i = 0;
            const cJSON *t;
            cJSON_ArrayForEach(t, p) {
                double v = cJSON_IsNumber(t) ? t->valuedouble : NAN;
                if (!isfinite(v) || v != floor(v) || v < 0 || v > INT32_MAX)
                    return bad(err, "prompt", "'prompt'[%d] must be a token id (integer >= 0), got %s", i,
                               cJSON_IsNumber(t) ? "a non-integer" : type_name(t));
                if (vocab_size > 0 && v >= (double)vocab_size)
                    return bad(err, "prompt", "'prompt'[%d] = %.0f is not a token id (vocabulary has %lld)", i, v,
                               (long long)vocab_size);
                req->prompt_tokens[i++] = (int32_t)v;
            }
            req->n_prompt_tokens = n;
            return 0;
        }
    }
    if (!cJSON_IsString(p))
        return bad(err, "prompt", "'prompt' must be a string, [string] or [int], got %s", type_name(p));
    req->prompt = dup_str(p->valuestring, &req->prompt_bytes);
    if (!req->prompt) return bad(err, "prompt", "'prompt': out of memory");
    return 0;
}

static int parse_stop(const cJSON *doc, nl_completion_req *req, nl_http_error *err) {
    const cJSON *s = field(doc, "stop");
    if (!s) return 0;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) return bad(err, "stop", "'stop' must not be empty");
        if (strlen(s->valuestring) > NL_HTTP_MAX_STOP_BYTES)
            return bad(err, "stop", "'stop' is %zu bytes, at most %d are allowed", strlen(s->valuestring),
                       NL_HTTP_MAX_STOP_BYTES);
        if (!(req->stop[0] = dup_str(s->valuestring, NULL))) return bad(err, "stop", "'stop': out of memory");
        req->n_stop = 1;
        return 0;
    }
    if (!cJSON_IsArray(s))
        return bad(err, "stop", "'stop' must be a string or an array of strings, got %s", type_name(s));
    int n = cJSON_GetArraySize(s);
    if (n > NL_HTTP_MAX_STOP)
        return bad(err, "stop", "'stop' holds %d strings, at most %d are allowed", n, NL_HTTP_MAX_STOP);
    const cJSON *t;
    cJSON_ArrayForEach(t, s) {
        if (!cJSON_IsString(t))
            return bad(err, "stop", "'stop'[%d] must be a string, got %s", req->n_stop, type_name(t));
        if (!t->valuestring[0]) return bad(err, "stop", "'stop'[%d] must not be empty", req->n_stop);
        if (strlen(t->valuestring) > NL_HTTP_MAX_STOP_BYTES)
            return bad(err, "stop", "'stop'[%d] is %zu bytes, at most %d are allowed", req->n_stop,
                       strlen(t->valuestring), NL_HTTP_MAX_STOP_BYTES);
        if (!(req->stop[req->n_stop] = dup_str(t->valuestring, NULL))) return bad(err, "stop", "'stop': out of memory");
        req->n_stop++;
    }
    return 0;
}

/* The content of a chat message: a string, or text parts [{"type": "text", "text": s}]. */
static int message_content(const cJSON *c, int i, char **out, nl_http_error *err) {
    if (cJSON_IsString(c)) {
        *out = dup_str(c->valuestring, NULL);
        return *out ? 0 : bad(err, "messages", "'messages': out of memory");
    }
    if (!cJSON_IsArray(c))
        return bad(err, "messages", "'messages'[%d].content must be a string or an array of text parts, got %s", i,
                   c ? type_name(c) : "nothing");
    size_t total = 0;
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") ||
            !cJSON_IsString(text))
            return bad(err, "messages",
                       "'messages'[%d].content[%d] must be {\"type\": \"text\", \"text\": string} (this server "
                       "takes text only)",
                       i, k);
        total += strlen(text->valuestring);
        k++;
    }
    char *s = malloc(total + 1);
    if (!s) return bad(err, "messages", "'messages': out of memory");
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n);
        at += n;
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static int parse_messages(const cJSON *doc, nl_completion_req *req, nl_http_error *err) {
    const cJSON *ms = field(doc, "messages");
    if (!ms) return bad(err, "messages", "'messages' is required");
    if (!cJSON_IsArray(ms)) return bad(err, "messages", "'messages' must be an array, got %s", type_name(ms));
    int n = cJSON_GetArraySize(ms);
    if (n == 0) return bad(err, "messages", "'messages' is an empty array (give at least one message)");
    req->messages = calloc((size_t)n, sizeof *req->messages);
    if (!req->messages) return bad(err, "messages", "'messages': out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        if (!cJSON_IsObject(m))
            return bad(err, "messages", "'messages'[%d] must be an object, got %s", i, type_name(m));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return bad(err, "messages", "'messages'[%d].role must be a string, got %s", i,
                       role ? type_name(role) : "nothing");
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            return bad(err, "messages", "'messages'[%d].role must be one of system, user, assistant, got \"%.40s\"", i,
                       r);
        char *content = NULL;
        if (message_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, &content, err)) return 1;
        req->messages[i].content = content;
        req->messages[i].role = dup_str(r, NULL);
        req->n_messages = ++i;
        if (!req->messages[i - 1].role) return bad(err, "messages", "'messages': out of memory");
    }
    return 0;
}

static int parse_fields(const cJSON *doc, int64_t vocab_size, int chat, nl_completion_req *req, nl_http_error *err) {
    if (!cJSON_IsObject(doc)) return bad(err, NULL, "the request body must be a JSON object, got %s", type_name(doc));
    const cJSON *m = field(doc, "model");
    if (m) {
        if (!cJSON_IsString(m)) return bad(err, "model", "'model' must be a string, got %s", type_name(m));
        if (!(req->model = dup_str(m->valuestring, NULL))) return bad(err, "model", "'model': out of memory");
    }
    if (chat) {
        if (parse_messages(doc, req, err)) return 1;
        if (get_bool(doc, "add_generation_prompt", &req->add_generation_prompt, err)) return 1;
        int lp = 0;
        if (get_bool(doc, "logprobs", &lp, err)) return 1;
        if (lp) return bad(err, "logprobs", "'logprobs' is not supported by this server (give false or null)");
        if (get_int(doc, "max_tokens", 0, (int64_t)1 << 40, &req->max_tokens, err)) return 1;
        if (get_int(doc, "max_completion_tokens", 0, (int64_t)1 << 40, &req->max_tokens, err)) return 1;
    } else {
        if (parse_prompt(doc, vocab_size, req, err)) return 1;
        if (get_int(doc, "max_tokens", 0, (int64_t)1 << 40, &req->max_tokens, err)) return 1;
    }
    if (get_num(doc, "temperature", 0, 2, 0, &req->temperature, err)) return 1;
    if (get_num(doc, "top_p", 0, 1, 1, &req->top_p, err)) return 1;
    if (get_int(doc, "top_k", -1, INT32_MAX, &req->top_k, err)) return 1;
    if (req->top_k < 0) req->top_k = 0;
    const cJSON *seed = field(doc, "seed");
    if (seed) {
        int64_t v = 0;
        /* JSON numbers are doubles here: past 2^53 a seed would be silently rounded */
        if (get_int(doc, "seed", -((int64_t)1 << 53) + 1, ((int64_t)1 << 53) - 1, &v, err)) {
            snprintf(err->message, sizeof err->message,
                     "'seed' must be an integer in (-2^53, 2^53) (JSON numbers past 2^53 are not exact), got %.17g",
                     cJSON_GetObjectItemCaseSensitive(doc, "seed")->valuedouble);
            return 1;
        }
        req->has_seed = 1;
        req->seed = (uint64_t)v;
    }
    if (parse_stop(doc, req, err)) return 1;
    if (get_bool(doc, "stream", &req->stream, err)) return 1;
    if (get_bool(doc, "ignore_eos", &req->ignore_eos, err)) return 1;
    const cJSON *so = field(doc, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return bad(err, "stream_options", "'stream_options' must be an object, got %s", type_name(so));
        if (get_bool(so, "include_usage", &req->include_usage, err)) return 1;
    }
    int64_t n = 1, best_of = 1, logprobs = 0;
    int echo = 0;
    if (get_int(doc, "n", 1, 1, &n, err)) {
        snprintf(err->message, sizeof err->message, "'n' must be 1: this server returns one choice per request");
        return 1;
    }
    if (chat) return 0;
    if (get_int(doc, "best_of", 1, 1, &best_of, err)) {
        snprintf(err->message, sizeof err->message, "'best_of' must be 1: this server returns one choice per request");
        return 1;
    }
    if (get_int(doc, "logprobs", 0, 0, &logprobs, err)) {
        snprintf(err->message, sizeof err->message, "'logprobs' is not supported by this server (give null or 0)");
        return 1;
    }
    if (get_bool(doc, "echo", &echo, err)) return 1;
    if (echo) return bad(err, "echo", "'echo' is not supported by this server");
    return 0;
}

/* Offset of the first \u0000 escape in body (an odd run of backslashes before "u0000"), or n.
 * cJSON would cut the string there, silently. */
static size_t escaped_nul(const char *body, size_t n) {
    for (size_t i = 0; i + 6 <= n; i++) {
        if (body[i] != '\\') continue;
        size_t j = i;
        while (j < n && body[j] == '\\') j++;
        if ((j - i) % 2 == 1 && j + 5 <= n && !memcmp(body + j, "u0000", 5)) return j - 1;
        i = j - 1;
    }
    return n;
}

static nl_status parse_request(const char *body, size_t bytes, int64_t vocab_size, int chat, nl_completion_req *req,
                               nl_http_error *err) {
    memset(req, 0, sizeof *req);
    req->add_generation_prompt = 1;
    req->max_tokens = NL_HTTP_DEFAULT_MAX_TOKENS;
    req->temperature = 1.0;
    req->top_p = 1.0;
    memset(err, 0, sizeof *err);
    if (!body || bytes == 0) {
        bad(err, NULL, "the request body is empty (expected a JSON object)");
        return nl_fail(NL_ERR_INVALID, "%s", err->message);
    }
    size_t nul = escaped_nul(body, bytes);
    if (nul < bytes) {
        bad(err, NULL, "the request body holds \\u0000 (a NUL character) at byte %zu; text with NUL is not accepted",
            nul);
        return nl_fail(NL_ERR_INVALID, "%s", err->message);
    }
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(body, bytes, &end, 0);
    if (!doc) {
        size_t at = end && end >= body && end <= body + bytes ? (size_t)(end - body) : 0;
        bad(err, NULL, "the request body is not valid JSON (error near byte %zu of %zu)", at, bytes);
        return nl_fail(NL_ERR_INVALID, "%s", err->message);
    }
    size_t after = end && end >= body && end <= body + bytes ? (size_t)(end - body) : bytes;
    while (after < bytes && strchr(" \t\r\n", body[after]) && body[after]) after++;
    if (after < bytes) {
        cJSON_Delete(doc);
        bad(err, NULL, "the request body has data after its JSON value (at byte %zu of %zu)", after, bytes);
        return nl_fail(NL_ERR_INVALID, "%s", err->message);
    }
    int failed = parse_fields(doc, vocab_size, chat, req, err);
    cJSON_Delete(doc);
    if (failed) {
        nl_http_completion_free(req);
        return nl_fail(NL_ERR_INVALID, "%s", err->message);
    }
    return NL_OK;
}

nl_status nl_http_parse_completion(const char *body, size_t bytes, int64_t vocab_size, nl_completion_req *req,
                                   nl_http_error *err) {
    return parse_request(body, bytes, vocab_size, 0, req, err);
}

nl_status nl_http_parse_chat(const char *body, size_t bytes, nl_completion_req *req, nl_http_error *err) {
    return parse_request(body, bytes, 0, 1, req, err);
}

void nl_http_completion_free(nl_completion_req *req) {
    for (int i = 0; i < req->n_messages; i++) {
        free((char *)req->messages[i].role);
        free((char *)req->messages[i].content);
    }
    free(req->messages);
    free(req->model);
    free(req->prompt);
    free(req->prompt_tokens);
    for (int i = 0; i < req->n_stop; i++) free(req->stop[i]);
    memset(req, 0, sizeof *req);
}

/* ---- responses ------------------------------------------------------------------------------- */

/* cJSON strings must be NUL-terminated: copy text[0..n). */
static cJSON *string_n(const char *text, size_t n) {
    char small[256];
    char *s = n < sizeof small ? small : malloc(n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, text, n);
    s[n] = 0;
    cJSON *j = cJSON_CreateString(s);
    if (s != small) free(s);
    return j;
}

static cJSON *head(const nl_completion_id *id, int chunk) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "id", id->id);
    cJSON_AddStringToObject(doc, "object",
                            !id->chat ? "text_completion"
                            : chunk   ? "chat.completion.chunk"
                                      : "chat.completion");
    cJSON_AddNumberToObject(doc, "created", (double)id->created);
    cJSON_AddStringToObject(doc, "model", id->model ? id->model : "");
    return doc;
}

/* chat: 0 text completion; 1 chat message; 2 chat delta with content; 3 empty chat delta;
 * 4 chat delta with the role */
static void add_choice(cJSON *doc, const char *text, size_t n, const char *finish, int chat) {
    cJSON *choices = cJSON_AddArrayToObject(doc, "choices");
    cJSON *c = cJSON_CreateObject();
    if (chat == 0) {
        cJSON_AddItemToObject(c, "text", string_n(text, n));
    } else {
        cJSON *msg = cJSON_AddObjectToObject(c, chat == 1 ? "message" : "delta");
        if (chat == 1 || chat == 4) cJSON_AddStringToObject(msg, "role", "assistant");
        if (chat != 3) cJSON_AddItemToObject(msg, "content", string_n(text, n));
    }
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
}

static void add_usage(cJSON *doc, int64_t prompt_tokens, int64_t completion_tokens) {
    cJSON *u = cJSON_AddObjectToObject(doc, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
}

nl_status nl_http_completion_json(const nl_completion_id *id, const char *text, size_t text_bytes, const char *finish,
                                  int64_t prompt_tokens, int64_t completion_tokens, nl_http_buf *out) {
    cJSON *doc = head(id, 0);
    add_choice(doc, text, text_bytes, finish, id->chat ? 1 : 0);
    add_usage(doc, prompt_tokens, completion_tokens);
    return append_json(doc, out);
}

static nl_status sse_event(const nl_completion_id *id, const char *text, size_t text_bytes, const char *finish,
                           int chat, nl_http_buf *out) {
    cJSON *doc = head(id, 1);
    add_choice(doc, text, text_bytes, finish, chat);
    NL_TRY(nl_http_buf_append(out, "data: ", 6));
    NL_TRY(append_json(doc, out));
    return nl_http_buf_append(out, "\n\n", 2);
}

nl_status nl_http_sse_chunk(const nl_completion_id *id, const char *text, size_t text_bytes, const char *finish,
                            nl_http_buf *out) {
    if (!id->chat) return sse_event(id, text, text_bytes, finish, 0, out);
    /* chat: the text as a content delta, then the finish_reason with an empty delta (OpenAI's shape) */
    if (text_bytes || !finish) NL_TRY(sse_event(id, text, text_bytes, NULL, 2, out));
    if (finish) NL_TRY(sse_event(id, "", 0, finish, 3, out));
    return NL_OK;
}

nl_status nl_http_sse_chat_role(const nl_completion_id *id, nl_http_buf *out) {
    return sse_event(id, "", 0, NULL, 4, out);
}

nl_status nl_http_sse_usage(const nl_completion_id *id, int64_t prompt_tokens, int64_t completion_tokens,
                            nl_http_buf *out) {
    cJSON *doc = head(id, 1);
    cJSON_AddArrayToObject(doc, "choices");
    add_usage(doc, prompt_tokens, completion_tokens);
    NL_TRY(nl_http_buf_append(out, "data: ", 6));
    NL_TRY(append_json(doc, out));
    return nl_http_buf_append(out, "\n\n", 2);
}

nl_status nl_http_sse_done(nl_http_buf *out) { return nl_http_buf_append(out, "data: [DONE]\n\n", 14); }

nl_status nl_http_models_json(const char *model, int64_t created, int64_t max_model_len, int64_t vocab_size,
                              nl_http_buf *out) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(doc, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", model ? model : "");
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "nanolm");
    cJSON_AddNumberToObject(m, "max_model_len", (double)max_model_len);
    cJSON_AddNumberToObject(m, "vocab_size", (double)vocab_size);
    cJSON_AddItemToArray(data, m);
    return append_json(doc, out);
}
