/* Load generator for OpenAI-compatible servers. See include/nanolm/http_loadgen.h. */
#include "nanolm/http_loadgen.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/client.h"
#include "nanolm/http_request.h"

double nl_percentile(const double *sorted, int64_t n, double q) {
    if (n <= 0) return NAN;
    if (q <= 0) return sorted[0];
    if (q >= 1) return sorted[n - 1];
    double pos = q * (double)(n - 1);
    int64_t i = (int64_t)floor(pos);
    double f = pos - (double)i;
    return i + 1 < n ? sorted[i] + f * (sorted[i + 1] - sorted[i]) : sorted[i];
}

void nl_latency_summarize(double *v, int64_t n, nl_latency_summary *s) {
    memset(s, 0, sizeof *s);
    s->n = n;
    if (n <= 0) {
        s->mean = s->p50 = s->p90 = s->p99 = s->max = NAN;
        return;
    }
    nl_sort_doubles(v, (size_t)n);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += v[i];
    s->mean = sum / (double)n;
    s->p50 = nl_percentile(v, n, 0.50);
    s->p90 = nl_percentile(v, n, 0.90);
    s->p99 = nl_percentile(v, n, 0.99);
    s->max = v[n - 1];
}

/* A growable array of doubles. */
typedef struct dvec {
    double *v;
    int64_t n, cap;
} dvec;

static int dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 64;
        double *v = realloc(d->v, sizeof(double) * (size_t)cap);
        if (!v) return -1;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

/* What one streamed request saw. */
typedef struct req_state {
    double t_first, t_last;
    int64_t chunks, completion_tokens, prompt_tokens;
    int64_t leave_after; /* > 0: close the connection after this many token events */
    int done, error, left;
    char error_msg[256];
    dvec itl;
} req_state;

static int on_event(void *ctx, const char *data, size_t n, double t_s) {
    req_state *s = ctx;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = 1;
        return 0;
    }
    cJSON *doc = cJSON_ParseWithLength(data, n);
    if (!doc) {
        s->error = 1;
        snprintf(s->error_msg, sizeof s->error_msg, "an event is not JSON: %.80s", data);
        return 1;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    if (err) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        s->error = 1;
        snprintf(s->error_msg, sizeof s->error_msg, "error event: %s", cJSON_IsString(m) ? m->valuestring : "?");
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(doc, "choices");
    const cJSON *c0 = cJSON_GetArrayItem(choices, 0);
    const cJSON *text = c0 ? cJSON_GetObjectItemCaseSensitive(c0, "text") : NULL;
    const cJSON *fin = c0 ? cJSON_GetObjectItemCaseSensitive(c0, "finish_reason") : NULL;
    /* Every chunk with a choice is a token event (vLLM's benchmark counts them the same way),
     * whether its text prints or not, except a bare end marker: empty text with a finish reason. */
    int token_event = cJSON_IsString(text) && (text->valuestring[0] || !cJSON_IsString(fin));
    if (token_event) {
        if (s->chunks == 0)
            s->t_first = t_s;
        else
            dvec_push(&s->itl, t_s - s->t_last);
        s->t_last = t_s;
        s->chunks++;
    }
    if (s->leave_after > 0 && s->chunks >= s->leave_after && !s->error) { /* a client that goes away */
        s->left = 1;
        cJSON_Delete(doc);
        return 1;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(doc, "usage");
    if (cJSON_IsObject(usage)) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        if (cJSON_IsNumber(ct)) s->completion_tokens = (int64_t)ct->valuedouble;
        if (cJSON_IsNumber(pt)) s->prompt_tokens = (int64_t)pt->valuedouble;
    }
    cJSON_Delete(doc);
    return s->error;
}

typedef struct shared {
    const nl_loadgen_opts *o;
    const char *path;
    double t0;
    double *arrival_s;    /* (requests,) offsets from t0 */
    int64_t *plen, *olen; /* (requests,) */
    uint64_t *pseed;      /* (requests,) seed of each prompt */
    int64_t *leave;       /* (requests,) token events after which the client leaves; 0: it stays */
    pthread_mutex_t mu;
    int64_t next, started; /* next request to take; requests sent */
    dvec ttft, tpot, itl, e2e;
    int64_t ok, failed, good, prompt_tokens, output_tokens, short_outputs, disconnected;
    double t_end;
    char first_error[320];
} shared;

static void sleep_until(double t) {
    for (;;) {
        double now = nl_time_s();
        if (now >= t) return;
        double d = t - now;
        struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static char *make_body(const nl_loadgen_opts *o, int64_t plen, int64_t olen, uint64_t seed) {
    nl_rng rng;
    nl_rng_seed(&rng, seed);
    nl_http_buf b = {0};
    nl_rng shared; /* the system prompt: the same whatever --seed (the one of seed 1 before) */
    nl_rng_seed(&shared, 1 ^ 0x5eedULL);
    int fail = nl_http_buf_append(&b, "{\"prompt\":[", 11) != NL_OK;
    for (int64_t i = 0; i < o->shared_prefix + plen && !fail; i++) {
        nl_rng *g = i < o->shared_prefix ? &shared : &rng;
        uint64_t id = 3 + nl_rng_below(g, (uint64_t)(o->vocab_size - 3));
        fail = nl_http_buf_printf(&b, i ? ",%llu" : "%llu", (unsigned long long)id) != NL_OK;
    }
    if (!fail)
        fail = nl_http_buf_printf(&b,
                                  "],\"max_tokens\":%lld,\"temperature\":%.17g,\"seed\":%llu,\"ignore_eos\":true,"
                                  "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                                  (long long)olen, o->temperature,
                                  (unsigned long long)(seed >> 11)) != NL_OK; /* exact: < 2^53 */
    if (fail) {
        nl_http_buf_free(&b);
        return NULL;
    }
    return b.data;
}

/* Why a request failed, into why ("" when it succeeded): the exchange's error, a status other
 * than 200, an error event, a stream without [DONE], or a token count off what was asked. */
static void request_error(nl_status rc, const nl_http_response *resp, const req_state *st, int64_t olen, char *why,
                          size_t cap) {
    why[0] = 0;
    if (rc)
        snprintf(why, cap, "%s", nl_last_error());
    else if (resp->status != 200)
        snprintf(why, cap, "HTTP %d: %.200s", resp->status, resp->body.data ? resp->body.data : "");
    else if (st->error)
        snprintf(why, cap, "%s", st->error_msg);
    else if (!st->done)
        snprintf(why, cap, "the stream ended without data: [DONE]");
    else if (st->completion_tokens > olen || st->completion_tokens < 1)
        snprintf(why, cap, "asked for %lld tokens, got %lld", (long long)olen, (long long)st->completion_tokens);
}

static void *worker(void *arg) {
    shared *sh = arg;
    const nl_loadgen_opts *o = sh->o;
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        int64_t i = sh->next < o->requests ? sh->next++ : -1;
        pthread_mutex_unlock(&sh->mu);
        if (i < 0) break;
        sleep_until(sh->t0 + sh->arrival_s[i]);
        if (o->duration_s > 0 && nl_time_s() > sh->t0 + o->duration_s) break; /* the run's time is up */
        pthread_mutex_lock(&sh->mu);
        sh->started++;
        pthread_mutex_unlock(&sh->mu);
        req_state st = {0};
        st.leave_after = sh->leave[i];
        char *body = make_body(o, sh->plen[i], sh->olen[i], sh->pseed[i]);
        nl_http_response resp;
        nl_status rc = NL_ERR_NOMEM;
        double t_send = nl_time_s();
        if (body)
            rc = nl_http_request(o->host, o->port, "POST", sh->path, body, strlen(body), o->timeout_s, on_event, &st,
                                 &resp);
        double t_done = nl_time_s();
        free(body);
        int left = !rc && resp.status == 200 && st.left && resp.closed_early; /* went away as asked */
        char why[320] = "";
        if (!left) request_error(rc, &resp, &st, sh->olen[i], why, sizeof why);
        if (!rc) nl_http_response_free(&resp);
        pthread_mutex_lock(&sh->mu);
        if (t_done > sh->t_end) sh->t_end = t_done;
        if (left) {
            sh->disconnected++;
        } else if (why[0]) {
            sh->failed++;
            if (!sh->first_error[0])
                snprintf(sh->first_error, sizeof sh->first_error, "request %lld: %.280s", (long long)i, why);
        } else {
            sh->ok++;
            double ttft = st.chunks ? st.t_first - t_send : t_done - t_send;
            double e2e = t_done - t_send;
            dvec_push(&sh->ttft, ttft);
            dvec_push(&sh->e2e, e2e);
            double tpot = NAN;
            if (st.completion_tokens > 1 && st.chunks) {
                tpot = (st.t_last - st.t_first) / (double)(st.completion_tokens - 1);
                dvec_push(&sh->tpot, tpot);
            }
            for (int64_t k = 0; k < st.itl.n; k++) dvec_push(&sh->itl, st.itl.v[k]);
            sh->prompt_tokens += st.prompt_tokens;
            sh->short_outputs += st.completion_tokens < sh->olen[i];
            sh->output_tokens += st.completion_tokens;
            int good = (o->slo_ttft_s <= 0 || ttft <= o->slo_ttft_s) &&
                       (o->slo_tpot_s <= 0 || isnan(tpot) || tpot <= o->slo_tpot_s);
            sh->good += good;
        }
        pthread_mutex_unlock(&sh->mu);
        free(st.itl.v);
    }
    return NULL;
}

/* Reads vocab_size from GET /v1/models. */
static nl_status ask_vocab(const nl_loadgen_opts *o, int64_t *vocab) {
    nl_http_response resp;
    NL_TRY(nl_http_request(o->host, o->port, "GET", "/v1/models", NULL, 0, o->timeout_s, NULL, NULL, &resp));
    nl_status rc = NL_OK;
    cJSON *doc = resp.status == 200 && resp.body.data ? cJSON_Parse(resp.body.data) : NULL;
    const cJSON *m = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "data"), 0);
    const cJSON *v = m ? cJSON_GetObjectItemCaseSensitive(m, "vocab_size") : NULL;
    if (cJSON_IsNumber(v) && v->valuedouble >= 4)
        *vocab = (int64_t)v->valuedouble;
    else
        rc = nl_fail(NL_ERR_IO, "GET /v1/models on %s:%d gave no vocab_size (HTTP %d); give --vocab", o->host, o->port,
                     resp.status);
    cJSON_Delete(doc);
    nl_http_response_free(&resp);
    return rc;
}

nl_status nl_loadgen_run(const nl_loadgen_opts *oin, nl_loadgen_result *r) {
    memset(r, 0, sizeof *r);
    nl_loadgen_opts o = *oin;
    if (!o.host || o.port < 1 || o.port > 65535)
        return nl_fail(NL_ERR_INVALID, "load generator: no host:port to send to");
    if (o.requests < 1)
        return nl_fail(NL_ERR_INVALID, "load generator: requests must be >= 1, got %lld", (long long)o.requests);
    if (o.concurrency < 1 || o.concurrency > 4096)
        return nl_fail(NL_ERR_INVALID, "load generator: concurrency must be in [1, 4096], got %d", o.concurrency);
    if (!(o.duration_s >= 0) || !isfinite(o.duration_s))
        return nl_fail(NL_ERR_INVALID, "load generator: duration must be a finite number >= 0, got %g", o.duration_s);
    if (!(o.rate_rps >= 0) || !isfinite(o.rate_rps))
        return nl_fail(NL_ERR_INVALID, "load generator: rate must be a finite number >= 0, got %g", o.rate_rps);
    if (o.prompt_len < 1 || o.output_len < 1)
        return nl_fail(NL_ERR_INVALID, "load generator: prompt and output lengths must be >= 1 (got %lld, %lld)",
                       (long long)o.prompt_len, (long long)o.output_len);
    if (!(o.disconnect_frac >= 0 && o.disconnect_frac <= 1))
        return nl_fail(NL_ERR_INVALID, "load generator: the disconnecting share must be in [0, 1], got %g",
                       o.disconnect_frac);
    if (o.prompt_len_max < o.prompt_len) o.prompt_len_max = o.prompt_len;
    if (o.output_len_max < o.output_len) o.output_len_max = o.output_len;
    if (o.timeout_s <= 0) o.timeout_s = 300;
    if (o.vocab_size == 0) NL_TRY(ask_vocab(&o, &o.vocab_size));
    if (o.vocab_size < 4)
        return nl_fail(NL_ERR_INVALID, "load generator: vocab_size must be >= 4, got %lld", (long long)o.vocab_size);
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.o = &o;
    sh.path = o.path ? o.path : "/v1/completions";
    size_t n = (size_t)o.requests;
    sh.arrival_s = calloc(n, sizeof(double));
    sh.plen = calloc(n, sizeof(int64_t));
    sh.olen = calloc(n, sizeof(int64_t));
    sh.pseed = calloc(n, sizeof(uint64_t));
    sh.leave = calloc(n, sizeof(int64_t));
    nl_status rc = NL_OK;
    if (!sh.arrival_s || !sh.plen || !sh.olen || !sh.pseed || !sh.leave) {
        rc = nl_fail(NL_ERR_NOMEM, "load generator: %lld requests", (long long)o.requests);
        goto done;
    }
    nl_rng rng;
    nl_rng_seed(&rng, o.seed);
    double t = 0;
    for (size_t i = 0; i < n; i++) {
        if (o.rate_rps > 0) {
            if (i) t += -log(1.0 - nl_rng_double(&rng)) / o.rate_rps; /* exponential gaps: Poisson arrivals */
            sh.arrival_s[i] = t;
        }
        sh.plen[i] = o.prompt_len + (int64_t)nl_rng_below(&rng, (uint64_t)(o.prompt_len_max - o.prompt_len + 1));
        sh.olen[i] = o.output_len + (int64_t)nl_rng_below(&rng, (uint64_t)(o.output_len_max - o.output_len + 1));
        sh.pseed[i] = nl_rng_u64(&rng);
    }
    nl_rng leave_rng; /* a stream of its own: the same seed gives the same prompts with or without leavers */
    nl_rng_seed(&leave_rng, o.seed ^ 0x1ea7eULL);
    for (size_t i = 0; i < n && o.disconnect_frac > 0; i++)
        if (nl_rng_double(&leave_rng) < o.disconnect_frac)
            sh.leave[i] = sh.olen[i] > 1 ? 1 + (int64_t)nl_rng_below(&leave_rng, (uint64_t)(sh.olen[i] - 1)) : 1;
    pthread_mutex_init(&sh.mu, NULL);
    int nthreads = o.concurrency < o.requests ? o.concurrency : (int)o.requests;
    pthread_t *th = calloc((size_t)nthreads, sizeof(pthread_t));
    if (!th) {
        pthread_mutex_destroy(&sh.mu);
        rc = nl_fail(NL_ERR_NOMEM, "load generator: %d threads", nthreads);
        goto done;
    }
    sh.t0 = nl_time_s() + 0.01;
    sh.t_end = sh.t0;
    int started = 0;
    for (; started < nthreads; started++) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        int e = pthread_create(&th[started], &attr, worker, &sh);
        pthread_attr_destroy(&attr);
        if (e) break;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_destroy(&sh.mu);
    if (started == 0) {
        rc = nl_fail(NL_ERR_NOMEM, "load generator: cannot start a thread");
        goto done;
    }
    r->requests = sh.started;
    r->ok = sh.ok;
    r->failed = sh.started - sh.ok - sh.disconnected;
    r->disconnected = sh.disconnected;
    r->good = sh.good;
    r->prompt_tokens = sh.prompt_tokens;
    r->output_tokens = sh.output_tokens;
    r->short_outputs = sh.short_outputs;
    r->duration_s = sh.t_end - sh.t0;
    if (r->duration_s > 0) {
        r->requests_per_s = (double)sh.ok / r->duration_s;
        r->output_tokens_per_s = (double)sh.output_tokens / r->duration_s;
        r->total_tokens_per_s = (double)(sh.output_tokens + sh.prompt_tokens) / r->duration_s;
        r->goodput_rps = (double)sh.good / r->duration_s;
    }
    nl_latency_summarize(sh.ttft.v, sh.ttft.n, &r->ttft);
    nl_latency_summarize(sh.tpot.v, sh.tpot.n, &r->tpot);
    nl_latency_summarize(sh.itl.v, sh.itl.n, &r->itl);
    nl_latency_summarize(sh.e2e.v, sh.e2e.n, &r->e2e);
    snprintf(r->first_error, sizeof r->first_error, "%s", sh.first_error);
done:
    free(sh.arrival_s);
    free(sh.plen);
    free(sh.olen);
    free(sh.pseed);
    free(sh.leave);
    free(sh.ttft.v);
    free(sh.tpot.v);
    free(sh.itl.v);
    free(sh.e2e.v);
    return rc;
}
