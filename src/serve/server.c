/* The HTTP front end of the serving engine on libmicrohttpd. See include/nanolm/server.h. */
#include "nanolm/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nanolm/driver.h"
#include "nanolm/http_request.h"
#include "nanolm/kv_transfer.h"
#include "nanolm/server_metrics.h"

#define RATE_WINDOW 40 /* samples of the generated-token counter, >= 0.25 s apart: ~10 s */

/* One open connection as the header deadline sees it (its MHD socket context). libmicrohttpd
 * (0.9.75) has only an idle timeout, which every byte resets: a client that trickles its request
 * headers would hold the connection forever. */
typedef struct conn_watch {
    struct conn_watch *prev, *next;
    int fd;
    double since; /* nl_time_s when the connection opened or its last response ended; 0: headers read */
} conn_watch;

struct nl_server {
    nl_engine *eng;
    nl_server_opts o;
    char model[128];
    struct MHD_Daemon *d;
    int port;
    int64_t created;
    nl_driver *driver;
    double last_sample;    /* the driver's last sample of the token counter (driver thread only) */
    atomic_int draining;   /* refuse new requests */
    atomic_int cancel_all; /* drain timed out: cancel what runs */
    atomic_int open_conns; /* connections open now (MHD_OPTION_NOTIFY_CONNECTION) */
    atomic_uint_fast64_t next_id;
    pthread_mutex_t watch_mu; /* guards the list of open connections */
    conn_watch *watched;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t idle;
    int64_t active; /* completions in flight (submitted, response not yet finished) */
    nl_serve_metrics m;
    double rate_t[RATE_WINDOW];
    int64_t rate_tok[RATE_WINDOW];
    int rate_n, rate_head;
    int64_t kv_transfers;    /* decode role: prompts whose KV came from the prefill server */
    int64_t transferring;    /* decode role: requests waiting on the prefill server now (running) */
    int64_t kv_bytes_in;     /* their K/V bytes (2 x layers x kv heads x head dim x bytes x tokens) */
    int64_t kv_msg_bytes_in; /* whole answers: headers, prompt tokens and K/V */
    double kv_transfer_s;    /* summed time from sending a prompt to its KV being imported */
};

void nl_server_opts_default(nl_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->model_name = "nanolm";
    o->max_body_bytes = (size_t)1 << 20;
    o->max_connections = 512;
    o->idle_timeout_s = 30;
    o->header_timeout_s = 10;
    o->drain_timeout_s = 30;
}

const char *nl_server_model_name(const char *ckpt, char *buf, size_t n) {
    const char *base = strrchr(ckpt, '/');
    snprintf(buf, n, "%s", base ? base + 1 : ckpt);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf) *dot = 0;
    return buf;
}

/* ---- responses ------------------------------------------------------------------------------- */

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, const char *type, const char *data,
                                size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, const nl_http_buf *b) {
    return send_buf(c, status, "application/json", b->data ? b->data : "{}", b->data ? b->len : 2);
}

static enum MHD_Result send_error(nl_server *s, struct MHD_Connection *c, const nl_http_error *e) {
    pthread_mutex_lock(&s->mu);
    s->m.requests_rejected++;
    pthread_mutex_unlock(&s->mu);
    nl_http_buf b = {0};
    nl_http_error_json(e, &b);
    enum MHD_Result r = send_json(c, (unsigned)e->status, &b);
    nl_http_buf_free(&b);
    return r;
}

static enum MHD_Result send_errorf(nl_server *s, struct MHD_Connection *c, int status, const char *param,
                                   const char *msg) {
    nl_http_error e;
    nl_http_error_set(&e, status, param, "%s", msg);
    return send_error(s, c, &e);
}

/* 405 with the Allow header naming the methods the endpoint takes (RFC 9110 15.5.6). */
static enum MHD_Result send_method_not_allowed(nl_server *s, struct MHD_Connection *c, const char *allow,
                                               const char *msg) {
    pthread_mutex_lock(&s->mu);
    s->m.requests_rejected++;
    pthread_mutex_unlock(&s->mu);
    nl_http_error e;
    nl_http_error_set(&e, 405, NULL, "%s", msg);
    nl_http_buf b = {0};
    nl_http_error_json(&e, &b);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(b.data ? b.len : 2, b.data ? b.data : "{}", MHD_RESPMEM_MUST_COPY);
    nl_http_buf_free(&b);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Allow", allow);
    enum MHD_Result ret = MHD_queue_response(c, 405, r);
    MHD_destroy_response(r);
    return ret;
}

/* 1 when the client has closed its end (a read would return EOF). */
static int peer_closed(int fd) {
    if (fd < 0) return 0;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- one completion -------------------------------------------------------------------------- */

/* A request in flight, shared by the access handler and (for a stream) the response callbacks. */
typedef struct completion {
    nl_server *s;
    uint64_t id; /* engine request id */
    int fd;      /* the client's socket, to notice when it goes away */
    int stream, include_usage;
    nl_completion_id cid;
    double t_arrival;
    int cancelled, ended;
    char error[256]; /* the engine's message when the request failed (NaN logits, ...) */
    nl_http_buf out; /* stream: bytes not yet handed to MHD; else the whole text */
    size_t out_off;
    int64_t prompt_tokens, completion_tokens;
    const char *finish; /* "stop" / "length" when done */
} completion;

/* Records a finished request's latencies (server clock: from the request's arrival). */
static void record(completion *q, const nl_engine_output *o) {
    nl_server *s = q->s;
    pthread_mutex_lock(&s->mu);
    if (o->finish == NL_FINISH_STOP || o->finish == NL_FINISH_LENGTH) {
        s->m.requests_ok++;
        if (o->t_first_token_s > 0) nl_histogram_observe(&s->m.ttft, o->t_first_token_s - q->t_arrival);
        if (o->t_finish_s > 0) nl_histogram_observe(&s->m.e2e, o->t_finish_s - q->t_arrival);
        if (o->completion_tokens > 1 && o->t_first_token_s > 0 && o->t_finish_s > o->t_first_token_s)
            nl_histogram_observe(&s->m.tpot, (o->t_finish_s - o->t_first_token_s) / (double)(o->completion_tokens - 1));
    } else {
        s->m.requests_aborted++;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Waits for the next output of q (or its end); appends SSE events (stream) or text to q->out.
 * Returns 1 when the request has ended, 0 for more to come, -1 when the client went away. */
static int pump(completion *q) {
    nl_server *s = q->s;
    for (;;) {
        if (atomic_load(&s->cancel_all) && !q->cancelled) {
            nl_engine_cancel(s->eng, q->id);
            q->cancelled = 1;
        }
        /* a client that went away stops its request, streamed or not: a busy request always has
         * output, so this is checked on every round, not only when the wait times out */
        if (peer_closed(q->fd)) return -1;
        int w = nl_engine_wait(s->eng, q->id, 100);
        if (w < 0) return -1;
        if (w == 0) continue;
        nl_engine_output o;
        memset(&o, 0, sizeof o);
        if (nl_engine_read(s->eng, q->id, 0, &o)) return -1;
        int ended = o.finish != NL_FINISH_NONE;
        const char *fin = o.finish == NL_FINISH_STOP ? "stop" : o.finish == NL_FINISH_LENGTH ? "length" : NULL;
        /* A stream gets one chunk per read that brought tokens, as vLLM sends one per step, even
         * when their text is empty (a byte that does not print, text held back for a stop
         * string): a client then sees every token's time, not only the tokens that print. */
        int got = o.n_tokens > 0 || o.text_len > 0;
        int ok = 1;
        if (q->stream) {
            if (got || (ended && fin))
                ok = !nl_http_sse_chunk(&q->cid, o.text, o.text_len, ended ? fin : NULL, &q->out);
            if (ended && !fin) { /* cancelled (shutdown) or a numeric error: say so before [DONE] */
                nl_http_error e;
                if (o.finish == NL_FINISH_ERROR)
                    nl_http_error_set(&e, 500, NULL, "the model failed: %s", o.error);
                else
                    nl_http_error_set(&e, 503, NULL, "the request was cancelled: the server is shutting down");
                ok = ok && !nl_http_sse_error(&e, &q->out);
            }
            if (ended && fin && q->include_usage)
                ok = ok && !nl_http_sse_usage(&q->cid, o.prompt_tokens, o.completion_tokens, &q->out);
            if (ended) ok = ok && !nl_http_sse_done(&q->out);
        } else if (o.text_len) {
            ok = !nl_http_buf_append(&q->out, o.text, o.text_len);
        }
        if (ended) {
            q->ended = 1;
            q->finish = fin;
            if (o.finish == NL_FINISH_ERROR) snprintf(q->error, sizeof q->error, "%s", o.error[0] ? o.error : "error");
            q->prompt_tokens = o.prompt_tokens;
            q->completion_tokens = o.completion_tokens;
            record(q, &o);
        }
        nl_engine_output_free(&o);
        if (!ok) return -1;
        if (ended) return 1;
        if (got) return 0;
    }
}

/* The request is over for the HTTP side: cancel it if it still runs, forget it, count it out. */
static void completion_free(completion *q) {
    nl_server *s = q->s;
    if (!q->ended) {
        nl_engine_cancel(s->eng, q->id);
        pthread_mutex_lock(&s->mu);
        s->m.requests_aborted++;
        pthread_mutex_unlock(&s->mu);
    }
    nl_engine_release(s->eng, q->id);
    nl_http_buf_free(&q->out);
    pthread_mutex_lock(&s->mu);
    s->active--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    free(q);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    completion *q = cls;
    while (q->out_off >= q->out.len) {
        if (q->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        q->out.len = 0;
        q->out_off = 0;
        if (pump(q) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = q->out.len - q->out_off;
    if (n > max) n = max;
    memcpy(buf, q->out.data + q->out_off, n);
    q->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { completion_free(cls); }

/* Decode role: the prompt is prefilled by the prefill server and its KV imported into this
 * engine, which decodes from there. Same errors as nl_engine_submit, plus the transfer's. */
static nl_status remote_submit(nl_server *s, const int32_t *ids, int64_t n, const nl_sampling *sp, uint64_t *id) {
    nl_kvx_shape sh;
    nl_kvx_shape_of(s->eng, &sh);
    nl_engine_kv kv;
    size_t moved = 0;
    double t0 = nl_time_s();
    /* waiting on the transfer is running: counted in /metrics, waited for by the drain, and
     * cancelled when the drain times out */
    pthread_mutex_lock(&s->mu);
    s->transferring++;
    s->active++;
    pthread_mutex_unlock(&s->mu);
    nl_status rc = nl_kvx_remote_prefill_cancel(s->o.prefill_addr, &sh, ids, n, sp, &s->cancel_all, &kv, &moved);
    pthread_mutex_lock(&s->mu);
    s->transferring--;
    s->active--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    if (rc) return rc;
    rc = nl_engine_import_kv(s->eng, &kv, sp, id);
    if (!rc) {
        pthread_mutex_lock(&s->mu);
        s->kv_transfers++;
        s->kv_bytes_in += (int64_t)kv.data_bytes;
        s->kv_msg_bytes_in += (int64_t)moved;
        s->kv_transfer_s += nl_time_s() - t0;
        pthread_mutex_unlock(&s->mu);
    }
    nl_engine_kv_free(&kv);
    return rc;
}

/* A chat request's prompt: the messages through the model's chat template, encoded so that
 * special tokens count only where the template wrote them (not in the users' text). Fills err
 * and returns 1 on failure. */
static int chat_prompt(nl_server *s, const nl_completion_req *req, int32_t **ids, int64_t *n, nl_http_error *err) {
    const nl_tokenizer *tok = nl_engine_tokenizer(s->eng);
    if (!s->o.chat_template) {
        nl_http_error_set(err, 400, "messages",
                          "this model has no chat template (a Hugging Face folder's chat_template.jinja or the "
                          "\"chat_template\" of its tokenizer_config.json, a GGUF file's tokenizer.chat_template; "
                          "`nanolm serve --chat-template FILE` gives one): use /v1/completions");
        return 1;
    }
    if (!tok) {
        nl_http_error_set(err, 400, "messages", "this model has no tokenizer to encode a chat prompt");
        return 1;
    }
    char *text = NULL;
    unsigned char *from_user = NULL;
    size_t bytes = 0;
    if (nl_chat_template_apply_marked(s->o.chat_template, req->messages, req->n_messages, req->add_generation_prompt,
                                      &text, &bytes, &from_user)) {
        nl_http_error_set(err, 400, "messages", "the chat template refused the messages: %s", nl_last_error());
        return 1;
    }
    int *tk = NULL;
    int64_t k = 0;
    nl_status rc = nl_tokenizer_encode_marked(tok, text, bytes, 0, 0, from_user, &tk, &k);
    free(text);
    free(from_user);
    if (rc) {
        nl_http_error_set(err, 400, "messages", "cannot tokenize the chat prompt: %s", nl_last_error());
        return 1;
    }
    *ids = nl_malloc(sizeof(int32_t) * (size_t)(k ? k : 1), "chat prompt tokens");
    if (!*ids) {
        nl_free(tk);
        nl_http_error_set(err, 500, NULL, "out of memory");
        return 1;
    }
    for (int64_t i = 0; i < k; i++) (*ids)[i] = tk[i];
    nl_free(tk);
    *n = k;
    return 0;
}

/* Parses, submits and answers one POST /v1/completions (chat = 0) or /v1/chat/completions. */
static enum MHD_Result completions(nl_server *s, struct MHD_Connection *c, const char *body, size_t bytes,
                                   double t_arrival, int chat) {
    const nl_arch *arch = nl_engine_arch(s->eng);
    nl_completion_req req;
    nl_http_error err;
    if (chat ? nl_http_parse_chat(body, bytes, &req, &err)
             : nl_http_parse_completion(body, bytes, arch->vocab_size, &req, &err))
        return send_error(s, c, &err);
    if (atomic_load(&s->draining)) {
        nl_http_completion_free(&req);
        return send_errorf(s, c, 503, NULL, "the server is shutting down");
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    if (chat) {
        if (chat_prompt(s, &req, &ids, &n, &err)) {
            nl_http_completion_free(&req);
            return send_error(s, c, &err);
        }
    } else if (req.prompt) {
        if (nl_engine_encode(s->eng, req.prompt, req.prompt_bytes, &ids, &n)) {
            nl_http_error_set(&err, 400, "prompt", "cannot tokenize the prompt: %s", nl_last_error());
            nl_http_completion_free(&req);
            return send_error(s, c, &err);
        }
    } else {
        ids = req.prompt_tokens;
        n = req.n_prompt_tokens;
        req.prompt_tokens = NULL;
    }
    enum MHD_Result ret;
    if (n < 1) {
        nl_http_error_set(&err, 400, "prompt", "the prompt is empty (0 tokens)");
        ret = send_error(s, c, &err);
        goto out;
    }
    if (n > arch->seq_len) {
        nl_http_error_set(&err, 400, "prompt",
                          "the prompt is %lld tokens, longer than the model's context of %lld tokens", (long long)n,
                          (long long)arch->seq_len);
        ret = send_error(s, c, &err);
        goto out;
    }
    nl_completion_id cid;
    memset(&cid, 0, sizeof cid);
    snprintf(cid.id, sizeof cid.id, "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)s->created,
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    cid.created = (int64_t)time(NULL);
    cid.model = s->model;
    cid.chat = chat;
    if (req.max_tokens == 0) { /* nothing asked for: usage only */
        nl_http_buf b = {0};
        if (req.stream) {
            if (chat) nl_http_sse_chat_role(&cid, &b);
            nl_http_sse_chunk(&cid, "", 0, "length", &b);
            if (req.include_usage) nl_http_sse_usage(&cid, n, 0, &b);
            nl_http_sse_done(&b);
            ret = send_buf(c, 200, "text/event-stream", b.data, b.len);
        } else {
            nl_http_completion_json(&cid, "", 0, "length", n, 0, &b);
            ret = send_json(c, 200, &b);
        }
        nl_http_buf_free(&b);
        goto out;
    }
    nl_sampling sp;
    nl_sampling_default(&sp);
    sp.temperature = (float)req.temperature;
    sp.top_p = (float)req.top_p;
    sp.top_k = (int)req.top_k;
    sp.seed = req.has_seed ? req.seed : atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull;
    sp.max_tokens = req.max_tokens; /* beyond the context: the engine ends it there with "length" */
    sp.ignore_eos = req.ignore_eos;
    for (int i = 0; i < req.n_stop; i++)
        if (nl_sampling_add_stop(&sp, req.stop[i])) {
            nl_http_error_set(&err, 400, "stop", "%s", nl_last_error());
            ret = send_error(s, c, &err);
            goto out;
        }
    uint64_t id = 0;
    /* a prompt that fills the whole context has no room for a transferred first token: here */
    nl_status rc = s->o.prefill_addr && n < arch->seq_len ? remote_submit(s, ids, n, &sp, &id)
                                                          : nl_engine_submit(s->eng, ids, n, &sp, &id);
    if (rc) {
        int status = rc == NL_ERR_BUSY                        ? 429
                     : rc == NL_ERR_NOMEM                     ? 500
                     : rc == NL_ERR_IO || rc == NL_ERR_FORMAT ? 502
                                                              : 400;
        nl_http_error_set(&err, status, rc == NL_ERR_BUSY ? NULL : "prompt", "%s", nl_last_error());
        ret = send_error(s, c, &err);
        goto out;
    }
    completion *q = calloc(1, sizeof *q);
    if (!q) {
        nl_engine_cancel(s->eng, id);
        nl_engine_release(s->eng, id);
        ret = send_errorf(s, c, 500, NULL, "out of memory");
        goto out;
    }
    q->s = s;
    q->id = id;
    q->fd = conn_fd(c);
    q->stream = req.stream;
    q->include_usage = req.include_usage;
    q->cid = cid;
    q->t_arrival = t_arrival;
    pthread_mutex_lock(&s->mu);
    s->active++;
    pthread_mutex_unlock(&s->mu);
    /* The engine sets the pace now, not the client: a request that waits in the queue longer than
     * the idle timeout must not be cut off (a client that goes away is noticed by pump). The
     * idle timeout comes back when the request is over (on_completed). */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (req.stream) {
        if (chat && nl_http_sse_chat_role(&cid, &q->out)) { /* the first event names the role */
            completion_free(q);
            ret = MHD_NO;
            goto out;
        }
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, q, stream_free);
        if (!r) {
            completion_free(q);
            ret = MHD_NO;
            goto out;
        }
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        goto out;
    }
    int st;
    while ((st = pump(q)) == 0) {}
    if (st < 0) { /* the client went away: nothing to answer */
        completion_free(q);
        ret = MHD_NO;
        goto out;
    }
    nl_http_buf b = {0};
    if (q->finish) {
        nl_http_completion_json(&cid, q->out.data ? q->out.data : "", q->out.len, q->finish, q->prompt_tokens,
                                q->completion_tokens, &b);
        ret = send_json(c, 200, &b);
    } else {
        if (q->error[0])
            nl_http_error_set(&err, 500, NULL, "the model failed: %s", q->error);
        else
            nl_http_error_set(&err, 503, NULL, "the request was cancelled: the server is shutting down");
        nl_http_error_json(&err, &b);
        ret = send_json(c, (unsigned)err.status, &b);
    }
    nl_http_buf_free(&b);
    completion_free(q);
out:
    nl_free(ids);
    nl_http_completion_free(&req);
    return ret;
}

/* ---- GET endpoints ---------------------------------------------------------------------------- */

static enum MHD_Result metrics(nl_server *s, struct MHD_Connection *c) {
    nl_engine_stats st;
    nl_engine_stats_get(s->eng, &st);
    pthread_mutex_lock(&s->mu);
    nl_serve_metrics m = s->m;
    int64_t transferring = s->transferring;
    double rate = 0;
    if (s->rate_n >= 2) {
        int newest = (s->rate_head + RATE_WINDOW - 1) % RATE_WINDOW;
        int oldest = (s->rate_head + RATE_WINDOW - s->rate_n) % RATE_WINDOW;
        double dt = s->rate_t[newest] - s->rate_t[oldest];
        if (dt > 0) rate = (double)(s->rate_tok[newest] - s->rate_tok[oldest]) / dt;
    }
    pthread_mutex_unlock(&s->mu);
    m.running = st.running + transferring;
    m.waiting = st.waiting;
    m.kv_blocks_used = st.kv_blocks_used;
    m.kv_blocks_free = st.kv_blocks_free;
    m.prompt_tokens = st.prompt_tokens_computed;
    m.generation_tokens = st.tokens_generated;
    m.preemptions = st.preemptions;
    m.steps = st.steps;
    m.prefix_cache_queries = st.prefix_cache_queries;
    m.prefix_cache_hits = st.prefix_cache_hits;
    m.spec_drafted = st.spec_drafted;
    m.spec_accepted = st.spec_accepted;
    m.tokens_per_s = rate;
    nl_http_buf b = {0};
    nl_serve_metrics_text(&m, &b);
    if (s->o.prefill_addr) {
        char extra[1024];
        pthread_mutex_lock(&s->mu);
        int k = snprintf(
            extra, sizeof extra,
            "# HELP nanolm_kv_transfers_total Prompts prefilled by the prefill server and imported here.\n"
            "# TYPE nanolm_kv_transfers_total counter\nnanolm_kv_transfers_total %lld\n"
            "# HELP nanolm_kv_transfer_bytes_total K/V bytes received from the prefill server.\n"
            "# TYPE nanolm_kv_transfer_bytes_total counter\nnanolm_kv_transfer_bytes_total %lld\n"
            "# HELP nanolm_kv_transfer_message_bytes_total Bytes of the prefill answers (headers, tokens, K/V).\n"
            "# TYPE nanolm_kv_transfer_message_bytes_total counter\nnanolm_kv_transfer_message_bytes_total %lld\n"
            "# HELP nanolm_kv_transfer_seconds_total Time from sending prompts to their KV imported.\n"
            "# TYPE nanolm_kv_transfer_seconds_total counter\nnanolm_kv_transfer_seconds_total %.17g\n",
            (long long)s->kv_transfers, (long long)s->kv_bytes_in, (long long)s->kv_msg_bytes_in, s->kv_transfer_s);
        pthread_mutex_unlock(&s->mu);
        if (k > 0) nl_http_buf_append(&b, extra, (size_t)k);
    }
    enum MHD_Result r = send_buf(c, 200, "text/plain; version=0.0.4", b.data ? b.data : "", b.len);
    nl_http_buf_free(&b);
    return r;
}

/* Decode role: 1 when the prefill server accepts a connection within 1 s ("HOST:PORT", IPv4). */
static int prefill_reachable(const char *addr) {
    const char *colon = strrchr(addr, ':');
    char host[64];
    if (!colon || (size_t)(colon - addr) >= sizeof host) return 0;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host, &sa.sin_addr) != 1) return 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return 0;
    int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (!ok && errno == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int err = 0;
        socklen_t el = sizeof err;
        ok = poll(&p, 1, 1000) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) && err == 0;
    }
    close(fd);
    return ok;
}

/* ---- the header deadline ------------------------------------------------------------------- */

/* Keeps the list of open connections for the header deadline, and their count. libmicrohttpd
 * calls CLOSED before it closes the socket, so a listed fd is never one reused by another. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    nl_server *s = cls;
    pthread_mutex_lock(&s->watch_mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_watch *w = calloc(1, sizeof *w);
        if (w) { /* without memory the connection just has no header deadline */
            w->fd = conn_fd(c);
            w->since = nl_time_s();
            w->next = s->watched;
            if (w->next) w->next->prev = w;
            s->watched = w;
        }
        *socket_context = w;
        atomic_fetch_add(&s->open_conns, 1);
    } else {
        conn_watch *w = *socket_context;
        if (w) {
            if (w->prev)
                w->prev->next = w->next;
            else
                s->watched = w->next;
            if (w->next) w->next->prev = w->prev;
            free(w);
            *socket_context = NULL;
        }
        atomic_fetch_sub(&s->open_conns, 1);
    }
    pthread_mutex_unlock(&s->watch_mu);
}

/* Starts (since = now) or stops (0) the header deadline of connection c. */
static void watch_headers(nl_server *s, struct MHD_Connection *c, double since) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_watch *w = ci ? ci->socket_context : NULL;
    if (!w) return;
    pthread_mutex_lock(&s->watch_mu);
    w->since = since;
    pthread_mutex_unlock(&s->watch_mu);
}

/* Shuts down the socket of every connection whose request headers are not read whole within
 * header_timeout_s of its opening or of its previous response: its thread then sees the end of
 * the stream and closes it. Called by the driver about every 0.25 s. */
static void reap_slow_headers(nl_server *s, double now) {
    int64_t reaped = 0;
    pthread_mutex_lock(&s->watch_mu);
    for (conn_watch *w = s->watched; w; w = w->next) {
        if (w->since > 0 && now - w->since > s->o.header_timeout_s && w->fd >= 0) {
            shutdown(w->fd, SHUT_RDWR);
            w->since = 0;
            reaped++;
        }
    }
    pthread_mutex_unlock(&s->watch_mu);
    if (!reaped) return;
    pthread_mutex_lock(&s->mu);
    s->m.header_timeouts += reaped;
    pthread_mutex_unlock(&s->mu);
}

/* ---- the access handler ---------------------------------------------------------------------- */

typedef struct conn_state {
    nl_http_buf body;
    int too_large;
    double t_arrival;
} conn_state;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    nl_server *s = cls;
    if (*con_cls == NULL) watch_headers(s, c, 0); /* the first call: the headers are read whole */
    int is_post = !strcmp(method, "POST");
    int chat = !strcmp(url, "/v1/chat/completions");
    if ((chat || !strcmp(url, "/v1/completions")) && is_post) {
        conn_state *cs = *con_cls;
        if (!cs) { /* headers only: refuse a declared oversize body before reading it */
            cs = calloc(1, sizeof *cs);
            if (!cs) return MHD_NO;
            cs->t_arrival = nl_time_s();
            *con_cls = cs;
            if (atomic_load(&s->open_conns) > s->o.max_connections) { /* the reserve is for GETs */
                char msg[160];
                snprintf(msg, sizeof msg, "the server has %d connections open, its limit for completions",
                         s->o.max_connections);
                cs->too_large = 1; /* ignore the body */
                return send_errorf(s, c, 503, NULL, msg);
            }
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes) {
                cs->too_large = 1;
                char msg[160];
                snprintf(msg, sizeof msg, "the request body is %s bytes, more than the limit of %zu", cl,
                         s->o.max_body_bytes);
                return send_errorf(s, c, 413, NULL, msg);
            }
            return MHD_YES;
        }
        if (*upload_data_size) {
            if (nl_time_s() - cs->t_arrival > s->o.idle_timeout_s) return MHD_NO; /* a body too slow */
            if (!cs->too_large) {
                if (cs->body.len + *upload_data_size > s->o.max_body_bytes) {
                    cs->too_large = 1;
                    nl_http_buf_free(&cs->body);
                } else if (nl_http_buf_append(&cs->body, upload_data, *upload_data_size)) {
                    return MHD_NO;
                }
            }
            *upload_data_size = 0;
            return MHD_YES;
        }
        if (cs->too_large) {
            char msg[160];
            snprintf(msg, sizeof msg, "the request body is more than the limit of %zu bytes", s->o.max_body_bytes);
            return send_errorf(s, c, 413, NULL, msg);
        }
        return completions(s, c, cs->body.data, cs->body.len, cs->t_arrival, chat);
    }
    /* Everything else answers on the first call; a body sent with it is ignored. */
    if (*con_cls == NULL) {
        *con_cls = calloc(1, sizeof(conn_state));
        if (!*con_cls) return MHD_NO;
        /* answer on the next call, once the request is read whole: a response queued on the
         * first call makes libmicrohttpd close the connection (no keep-alive for GETs) */
        if (*upload_data_size == 0) return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int known = !strcmp(url, "/v1/completions") || chat || !strcmp(url, "/v1/models") || !strcmp(url, "/health") ||
                !strcmp(url, "/metrics");
    if (!known) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "no such endpoint: %.200s (known: POST /v1/completions, /v1/chat/completions, GET /v1/models, "
                 "/health, /metrics)",
                 url);
        return send_errorf(s, c, 404, NULL, msg);
    }
    if (!is_get || !strcmp(url, "/v1/completions") || chat) {
        char msg[160];
        snprintf(msg, sizeof msg, "method %.20s is not allowed on %s", method, url);
        return send_method_not_allowed(s, c, !strcmp(url, "/v1/completions") || chat ? "POST" : "GET, HEAD", msg);
    }
    if (!strcmp(url, "/health")) {
        if (atomic_load(&s->draining)) return send_buf(c, 503, "application/json", "{\"status\":\"draining\"}", 21);
        if (s->o.prefill_addr && !prefill_reachable(s->o.prefill_addr)) /* decode role: no prefill, no service */
            return send_buf(c, 503, "application/json", "{\"status\":\"prefill server unreachable\"}", 39);
        return send_buf(c, 200, "application/json", "{\"status\":\"ok\"}", 15);
    }
    if (!strcmp(url, "/metrics")) return metrics(s, c);
    nl_http_buf b = {0};
    nl_http_models_json(s->model, s->created, nl_engine_arch(s->eng)->seq_len, nl_engine_arch(s->eng)->vocab_size, &b);
    enum MHD_Result r = send_json(c, 200, &b);
    nl_http_buf_free(&b);
    return r;
}

/* A request is over: free its state, and the connection's next request headers have
 * header_timeout_s from now (a kept-alive connection left idle is closed then). */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    nl_server *s = cls;
    watch_headers(s, c, nl_time_s());
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) /* kept alive: idle again (completions lift it) */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.idle_timeout_s);
    conn_state *cs = *con_cls;
    if (cs) {
        nl_http_buf_free(&cs->body);
        free(cs);
        *con_cls = NULL;
    }
}

/* ---- driver ---------------------------------------------------------------------------------- */

/* The driver's hook: samples the generated-token counter every 0.25 s for /metrics' rate. */
static int sample_rate(void *arg, int stepped) {
    (void)stepped;
    nl_server *s = arg;
    double now = nl_time_s();
    if (now - s->last_sample < 0.25) return 0;
    nl_engine_stats st;
    nl_engine_stats_get(s->eng, &st);
    pthread_mutex_lock(&s->mu);
    s->rate_t[s->rate_head] = now;
    s->rate_tok[s->rate_head] = st.tokens_generated;
    s->rate_head = (s->rate_head + 1) % RATE_WINDOW;
    if (s->rate_n < RATE_WINDOW) s->rate_n++;
    pthread_mutex_unlock(&s->mu);
    reap_slow_headers(s, now);
    s->last_sample = now;
    return 0;
}

/* ---- life cycle ------------------------------------------------------------------------------ */

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    fprintf(stderr, "nanolm: serve: ");
    vfprintf(stderr, fmt, ap);
}

nl_status nl_server_start(nl_server **out, nl_engine *e, const nl_server_opts *opts) {
    *out = NULL;
    nl_server_opts o;
    nl_server_opts_default(&o);
    if (opts) o = *opts;
    if (!o.host) o.host = "127.0.0.1";
    if (!o.model_name) o.model_name = "nanolm";
    if (o.max_body_bytes == 0) o.max_body_bytes = (size_t)1 << 20;
    if (o.max_connections <= 0) o.max_connections = 512;
    if (o.idle_timeout_s <= 0) o.idle_timeout_s = 30;
    if (o.header_timeout_s <= 0) o.header_timeout_s = 10;
    if (o.port < 0 || o.port > 65535)
        return nl_fail(NL_ERR_INVALID, "serve: port must be in [0, 65535], got %d", o.port);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)o.port);
    const char *h = !strcmp(o.host, "localhost") ? "127.0.0.1" : o.host;
    if (inet_pton(AF_INET, h, &addr.sin_addr) != 1)
        return nl_fail(NL_ERR_INVALID, "serve: --host '%s' is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)", o.host);
    nl_server *s = calloc(1, sizeof *s);
    if (!s) return nl_fail(NL_ERR_NOMEM, "serve: out of memory");
    s->eng = e;
    s->o = o;
    snprintf(s->model, sizeof s->model, "%s", o.model_name);
    s->created = (int64_t)time(NULL);
    atomic_init(&s->draining, 0);
    atomic_init(&s->cancel_all, 0);
    atomic_init(&s->open_conns, 0);
    atomic_init(&s->next_id, 1);
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    nl_serve_metrics_init(&s->m);
    nl_drive_opts dopt = {.name = "serve", .after = sample_rate, .user = s};
    if (nl_driver_start(&s->driver, e, &dopt)) {
        pthread_mutex_destroy(&s->watch_mu);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->idle);
        free(s);
        return nl_fail(NL_ERR_NOMEM, "serve: cannot start the engine thread");
    }
    s->d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)(o.max_connections + NL_SERVER_RESERVED_CONNS),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o.idle_timeout_s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!s->d) {
        int err = errno;
        nl_server_stop(s);
        return nl_fail(NL_ERR_IO, "serve: cannot listen on %s:%d: %s", o.host, o.port,
                       err ? strerror(err) : "libmicrohttpd refused");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o.port;
    *out = s;
    return NL_OK;
}

int nl_server_port(const nl_server *s) { return s->port; }

nl_status nl_server_add_connection(nl_server *s, int fd) {
    struct sockaddr_in peer;
    memset(&peer, 0, sizeof peer);
    peer.sin_family = AF_INET;
    peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (MHD_add_connection(s->d, fd, (const struct sockaddr *)&peer, sizeof peer) != MHD_YES)
        return nl_fail(NL_ERR_IO, "serve: cannot add a connection (limit reached or closed)");
    return NL_OK;
}

/* Waits until no completion is in flight or `until` (nl_time_s) passes; returns what is left. */
static int64_t wait_idle(nl_server *s, double until) {
    pthread_mutex_lock(&s->mu);
    while (s->active > 0 && nl_time_s() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->idle, &s->mu, &ts);
    }
    int64_t left = s->active;
    pthread_mutex_unlock(&s->mu);
    return left;
}

void nl_server_stop(nl_server *s) {
    if (!s) return;
    atomic_store(&s->draining, 1);
    if (s->d) {
        /* new clients are still accepted while draining, and answered 503 (draining is set), rather
         * than left waiting in the listen backlog */
        if (wait_idle(s, nl_time_s() + s->o.drain_timeout_s) > 0) {
            atomic_store(&s->cancel_all, 1); /* every waiting handler cancels its request */
            wait_idle(s, nl_time_s() + 30);
        }
        MHD_stop_daemon(s->d);
    }
    nl_driver_stop(s->driver);
    pthread_mutex_destroy(&s->watch_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
}
