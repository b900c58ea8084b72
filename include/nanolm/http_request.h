/*
 * The OpenAI-compatible HTTP API of `nanolm serve`, as pure functions with no sockets:
 * a request body becomes a validated nl_completion_req or an OpenAI-style error with its HTTP
 * status; responses, server-sent-event chunks and errors become JSON text. The server
 * (server.c), the fuzz target and the tests all go through these functions, so what is tested
 * without a network is what the server does.
 *
 * Request fields (POST /v1/completions), as OpenAI documents them:
 *   prompt       string, [string] (one), or [int] (token ids)         required
 *   max_tokens   integer >= 0 (default 16; 0 = only usage)          beyond the context: clamped,
 *                                                                   finish_reason "length"
 *   temperature  number in [0, 2] (default 1; 0 = greedy)
 *   top_p        number in (0, 1] (default 1)
 *   top_k        integer, -1 or 0 = off (vLLM's extension)
 *   seed         integer (default: a per-request seed)
 *   stop         string or [string] (at most 4, each 1..64 bytes: the engine's limits)
 *   stream       bool; stream_options.include_usage bool
 *   ignore_eos   bool (vLLM's extension; the load generator uses it to fix output lengths)
 *   n            1 only; best_of 1 only
 *   model        string (any: the server serves one model)
 * Unknown fields are ignored, as OpenAI does; a known field of the wrong type is a 400 that
 * names the field in `param`.
 *
 * POST /v1/chat/completions takes the same fields except prompt, echo and best_of, plus:
 *   messages     [{"role": "system"|"user"|"assistant", "content": string or
 *                 [{"type": "text", "text": string}]}], at least one          required
 *   max_completion_tokens   integer >= 0 (OpenAI's newer name of max_tokens; wins when both)
 *   logprobs     false only
 *   add_generation_prompt   bool (default true; vLLM's extension)
 * and answers with "chat.completion" objects ({"message": {"role": "assistant", "content"}})
 * or "chat.completion.chunk" events: a first delta {"role": "assistant", "content": ""}, then
 * {"content": text} deltas, then an empty delta with the finish_reason.
 */
#ifndef NANOLM_HTTP_REQUEST_H
#define NANOLM_HTTP_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/chat_template.h"

#define NL_HTTP_MAX_STOP           4  /* stop strings per request (OpenAI's limit) */
#define NL_HTTP_MAX_STOP_BYTES     64 /* bytes of one stop string */
#define NL_HTTP_DEFAULT_MAX_TOKENS 16

/* A growable byte buffer, always NUL-terminated when len > 0. */
typedef struct nl_http_buf {
    char *data;
    size_t len, cap;
} nl_http_buf;

/* Appends n bytes; returns NL_OK or NL_ERR_NOMEM (the buffer keeps what it had). */
nl_status nl_http_buf_append(nl_http_buf *b, const void *s, size_t n);
/* Appends printf-style text. */
nl_status nl_http_buf_printf(nl_http_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nl_http_buf_free(nl_http_buf *b);

typedef struct nl_completion_req {
    char *model;  /* as given, or NULL */
    char *prompt; /* text prompt (NUL-terminated), or NULL when prompt_tokens is set */
    size_t prompt_bytes;
    int32_t *prompt_tokens; /* (n_prompt_tokens,) token ids when the prompt was [int] */
    int64_t n_prompt_tokens;
    int64_t max_tokens; /* >= 0 */
    double temperature; /* [0, 2] */
    double top_p;       /* (0, 1] */
    int64_t top_k;      /* 0 = off */
    int has_seed;
    uint64_t seed;
    char *stop[NL_HTTP_MAX_STOP];
    int n_stop;
    int stream;
    int include_usage; /* stream_options.include_usage */
    int ignore_eos;
    nl_chat_message *messages; /* chat: (n_messages,) role and content (NUL-terminated copies) */
    int n_messages;
    int add_generation_prompt; /* chat: 1 unless the request says false */
} nl_completion_req;

/* An OpenAI-style error: {"error":{"message","type","param","code"}} sent with `status`. */
typedef struct nl_http_error {
    int status;       /* 400, 404, 405, 413, 429, 500, 503 */
    const char *type; /* "invalid_request_error", "not_found_error", ... (static string) */
    char param[32];   /* the offending field, "" if none */
    char message[320];
} nl_http_error;

/* Fills err (status, type by status, message printf-style, param may be NULL). */
void nl_http_error_set(nl_http_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Parses and validates a /v1/completions body of `bytes` bytes (need not be NUL-terminated).
 * On success fills *req (free with nl_http_completion_free) and returns NL_OK. On bad input
 * returns NL_ERR_INVALID with *err filled (status 400, the field in param) and *req empty.
 * Token ids in a [int] prompt are checked against vocab_size when vocab_size > 0. */
nl_status nl_http_parse_completion(const char *body, size_t bytes, int64_t vocab_size, nl_completion_req *req,
                                   nl_http_error *err);
/* Parses and validates a /v1/chat/completions body, as nl_http_parse_completion (prompt is NULL,
 * messages set). Errors name the message: "'messages'[2].role must be one of system, user,
 * assistant, got \"tool\"" (param "messages"). */
nl_status nl_http_parse_chat(const char *body, size_t bytes, nl_completion_req *req, nl_http_error *err);
void nl_http_completion_free(nl_completion_req *req);

/* Appends the error's JSON document to out. */
nl_status nl_http_error_json(const nl_http_error *err, nl_http_buf *out);

/* The identity shared by a response and all its chunks. */
typedef struct nl_completion_id {
    char id[40];     /* "cmpl-<hex>" */
    int64_t created; /* unix seconds */
    const char *model;
    int chat; /* 1: chat.completion objects and chunks ("chatcmpl-<hex>") */
} nl_completion_id;

/* Appends the non-streamed response:
 * {"id","object":"text_completion","created","model","choices":[{"text","index":0,
 *  "logprobs":null,"finish_reason"}],"usage":{"prompt_tokens","completion_tokens","total_tokens"}} */
nl_status nl_http_completion_json(const nl_completion_id *id, const char *text, size_t text_bytes, const char *finish,
                                  int64_t prompt_tokens, int64_t completion_tokens, nl_http_buf *out);

/* Appends one server-sent event "data: {chunk}\n\n" in OpenAI's streaming format: the text delta
 * with finish_reason null (finish == NULL) or the reason ("stop", "length") on the last chunk. */
nl_status nl_http_sse_chunk(const nl_completion_id *id, const char *text, size_t text_bytes, const char *finish,
                            nl_http_buf *out);
/* Chat streams: the first event, a delta {"role": "assistant", "content": ""}. */
nl_status nl_http_sse_chat_role(const nl_completion_id *id, nl_http_buf *out);
/* Appends the usage chunk (choices empty) sent before [DONE] when stream_options.include_usage. */
nl_status nl_http_sse_usage(const nl_completion_id *id, int64_t prompt_tokens, int64_t completion_tokens,
                            nl_http_buf *out);
/* Appends "data: [DONE]\n\n". */
nl_status nl_http_sse_done(nl_http_buf *out);
/* Appends an error as an event "data: {error}\n\n" (a stream that fails after its headers). */
nl_status nl_http_sse_error(const nl_http_error *err, nl_http_buf *out);

/* Appends GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"nanolm",
 * "max_model_len","vocab_size"}]}; vocab_size is an extension that lets a load generator send token ids. */
nl_status nl_http_models_json(const char *model, int64_t created, int64_t max_model_len, int64_t vocab_size,
                              nl_http_buf *out);

#endif
