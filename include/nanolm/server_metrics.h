/*
 * What `nanolm serve` reports on GET /metrics, in the Prometheus text exposition format
 * (version 0.0.4): gauges for the requests running and waiting and the KV blocks used and free,
 * counters of requests, tokens and errors, the recent generation rate, and histograms of time to
 * first token, time per output token and end-to-end latency (cumulative buckets, _sum, _count).
 * The struct is plain data: the server guards it with its own lock.
 */
#ifndef NANOLM_SERVER_METRICS_H
#define NANOLM_SERVER_METRICS_H

#include <stdint.h>

#include "nanolm/http_request.h"

#define NL_HIST_MAX_BOUNDS 24

/* A Prometheus histogram: counts[i] observations <= bounds[i] (not cumulative here; the text
 * writer accumulates), counts[n_bounds] those above the last bound (+Inf). */
typedef struct nl_histogram {
    int n_bounds;
    double bounds[NL_HIST_MAX_BOUNDS]; /* increasing, seconds */
    uint64_t counts[NL_HIST_MAX_BOUNDS + 1];
    uint64_t count;
    double sum;
} nl_histogram;

/* Initialises with n increasing bounds (n <= NL_HIST_MAX_BOUNDS; more are dropped). */
void nl_histogram_init(nl_histogram *h, const double *bounds, int n);
void nl_histogram_observe(nl_histogram *h, double v);

typedef struct nl_serve_metrics {
    int64_t running, waiting; /* sequences in the engine / queued for admission */
    int64_t kv_blocks_used, kv_blocks_free;
    int64_t requests_ok, requests_aborted, requests_rejected; /* finished, cancelled, refused (4xx/5xx) */
    int64_t prompt_tokens, generation_tokens;                 /* totals */
    int64_t preemptions, steps;
    int64_t prefix_cache_queries, prefix_cache_hits; /* prompt tokens looked up / found cached */
    int64_t spec_drafted, spec_accepted;             /* speculative tokens proposed / accepted */
    int64_t header_timeouts;      /* connections closed because their request headers were too slow */
    double tokens_per_s;          /* generated tokens per second over the recent window */
    nl_histogram ttft, tpot, e2e; /* seconds */
} nl_serve_metrics;

/* Zeroes *m and sets the histograms' default bounds (1 ms .. 60 s). */
void nl_serve_metrics_init(nl_serve_metrics *m);
/* Appends the Prometheus text of *m (every metric named nanolm_*) to out. */
nl_status nl_serve_metrics_text(const nl_serve_metrics *m, nl_http_buf *out);

#endif
