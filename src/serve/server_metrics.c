/* Prometheus text for GET /metrics. See include/nanolm/server_metrics.h. */
#include "nanolm/server_metrics.h"

#include <string.h>

void nl_histogram_init(nl_histogram *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    if (n > NL_HIST_MAX_BOUNDS) n = NL_HIST_MAX_BOUNDS;
    h->n_bounds = n;
    memcpy(h->bounds, bounds, sizeof(double) * (size_t)n);
}

void nl_histogram_observe(nl_histogram *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

void nl_serve_metrics_init(nl_serve_metrics *m) {
    /* vLLM's buckets, trimmed: a CPU engine spans a few ms per token to tens of seconds per request. */
    static const double latency_s[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,
                                       0.5,   0.75,   1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 60.0};
    memset(m, 0, sizeof *m);
    int n = (int)(sizeof latency_s / sizeof latency_s[0]);
    nl_histogram_init(&m->ttft, latency_s, n);
    nl_histogram_init(&m->tpot, latency_s, n);
    nl_histogram_init(&m->e2e, latency_s, n);
}

static nl_status gauge(nl_http_buf *out, const char *type, const char *name, const char *help, double v) {
    return nl_http_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static nl_status histogram(nl_http_buf *out, const char *name, const char *help, const nl_histogram *h) {
    NL_TRY(nl_http_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name));
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        NL_TRY(nl_http_buf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum));
    }
    cum += h->counts[h->n_bounds];
    NL_TRY(nl_http_buf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum));
    NL_TRY(nl_http_buf_printf(out, "%s_sum %.17g\n", name, h->sum));
    return nl_http_buf_printf(out, "%s_count %llu\n", name, (unsigned long long)h->count);
}

nl_status nl_serve_metrics_text(const nl_serve_metrics *m, nl_http_buf *out) {
    NL_TRY(
        gauge(out, "gauge", "nanolm_requests_running", "Sequences in the engine's running batch.", (double)m->running));
    NL_TRY(gauge(out, "gauge", "nanolm_requests_waiting", "Requests queued for admission to the engine.",
                 (double)m->waiting));
    NL_TRY(
        gauge(out, "gauge", "nanolm_kv_blocks_used", "KV cache blocks held by sequences.", (double)m->kv_blocks_used));
    NL_TRY(
        gauge(out, "gauge", "nanolm_kv_blocks_free", "KV cache blocks free in the pool.", (double)m->kv_blocks_free));
    NL_TRY(gauge(out, "gauge", "nanolm_generation_tokens_per_second",
                 "Generated tokens per second over the last seconds.", m->tokens_per_s));
    NL_TRY(
        nl_http_buf_printf(out,
                           "# HELP nanolm_requests_total Requests by outcome.\n# TYPE nanolm_requests_total counter\n"
                           "nanolm_requests_total{outcome=\"ok\"} %lld\n"
                           "nanolm_requests_total{outcome=\"aborted\"} %lld\n"
                           "nanolm_requests_total{outcome=\"rejected\"} %lld\n",
                           (long long)m->requests_ok, (long long)m->requests_aborted, (long long)m->requests_rejected));
    NL_TRY(gauge(out, "counter", "nanolm_prompt_tokens_total", "Prompt tokens prefilled.", (double)m->prompt_tokens));
    NL_TRY(gauge(out, "counter", "nanolm_generation_tokens_total", "Tokens generated.", (double)m->generation_tokens));
    NL_TRY(gauge(out, "counter", "nanolm_preemptions_total", "Sequences preempted when the KV pool ran out.",
                 (double)m->preemptions));
    NL_TRY(gauge(out, "counter", "nanolm_engine_steps_total", "Engine steps (one batched forward each).",
                 (double)m->steps));
    NL_TRY(gauge(out, "counter", "nanolm_prefix_cache_queries_total",
                 "Prompt tokens looked up in the prefix cache at admission.", (double)m->prefix_cache_queries));
    NL_TRY(gauge(out, "counter", "nanolm_prefix_cache_hits_total",
                 "Prompt tokens found in the prefix cache (their KV not computed).", (double)m->prefix_cache_hits));
    NL_TRY(gauge(out, "gauge", "nanolm_prefix_cache_hit_rate", "Prefix cache hits over queries, in tokens.",
                 m->prefix_cache_queries ? (double)m->prefix_cache_hits / (double)m->prefix_cache_queries : 0.0));
    NL_TRY(gauge(out, "counter", "nanolm_spec_draft_tokens_total", "Speculative tokens drafted and verified.",
                 (double)m->spec_drafted));
    NL_TRY(gauge(out, "counter", "nanolm_spec_accepted_tokens_total", "Drafted tokens the target accepted.",
                 (double)m->spec_accepted));
    NL_TRY(gauge(out, "gauge", "nanolm_spec_acceptance_rate", "Accepted over drafted speculative tokens.",
                 m->spec_drafted ? (double)m->spec_accepted / (double)m->spec_drafted : 0.0));
    NL_TRY(gauge(out, "counter", "nanolm_header_timeouts_total",
                 "Connections closed because their request headers did not arrive within the header timeout.",
                 (double)m->header_timeouts));
    NL_TRY(histogram(out, "nanolm_time_to_first_token_seconds", "Time from request arrival to its first token.",
                     &m->ttft));
    NL_TRY(histogram(out, "nanolm_time_per_output_token_seconds", "Mean time between output tokens of a request.",
                     &m->tpot));
    return histogram(out, "nanolm_e2e_request_latency_seconds", "Time from request arrival to its last token.",
                     &m->e2e);
}
