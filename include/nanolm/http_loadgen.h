/*
 * The load generator behind `nanolm bench serve`: sends streamed /v1/completions requests to an
 * OpenAI-compatible server either closed-loop (C requests in flight at all times) or open-loop
 * (Poisson arrivals at R requests/s, at most C in flight), and measures what a user sees:
 * time to first token (TTFT), time per output token after the first (TPOT), inter-token latency
 * (ITL, the gap between successive streamed chunks), end-to-end latency, throughput, and goodput
 * (requests/s that met the TTFT and TPOT objectives). Prompts are random token ids of a given
 * length and outputs have a fixed length (ignore_eos), so every run does a known amount of work.
 * A share of the clients may go away mid-stream (disconnect_frac), as impatient users do: those
 * requests are counted apart, neither succeeded nor failed.
 */
#ifndef NANOLM_HTTP_LOADGEN_H
#define NANOLM_HTTP_LOADGEN_H

#include <stdint.h>

#include "nanolm/base.h"

typedef struct nl_loadgen_opts {
    const char *host;
    int port;
    const char *path;       /* NULL: "/v1/completions" */
    int64_t requests;       /* how many requests in all */
    int concurrency;        /* most in flight at once (>= 1) */
    double rate_rps;        /* Poisson arrival rate; 0: closed loop (send as soon as a slot frees) */
    int64_t prompt_len;     /* prompt tokens (or the low end when prompt_len_max > prompt_len) */
    int64_t prompt_len_max; /* > prompt_len: uniform in [prompt_len, prompt_len_max] */
    int64_t shared_prefix;  /* every prompt starts with the same this many tokens (a system
                               prompt, the same in every run, whatever seed), then its prompt_len
                               own ones (drawn from seed) */
    int64_t output_len;     /* max_tokens (ignore_eos), or the low end */
    int64_t output_len_max; /* > output_len: uniform in [output_len, output_len_max] */
    int64_t vocab_size;     /* token ids drawn from [3, vocab_size); 0: ask GET /v1/models */
    double temperature;     /* sent as is (0: greedy) */
    uint64_t seed;          /* prompts, lengths and arrivals */
    double slo_ttft_s;      /* goodput objectives (0: none) */
    double slo_tpot_s;
    double timeout_s;       /* per socket read (0: 300 s) */
    double duration_s;      /* > 0: no request starts later than this after the first (requests is then a cap) */
    double disconnect_frac; /* in [0, 1]: this share of the requests (drawn from seed) closes its
                               connection after a random number of streamed tokens, in [1, its
                               output length - 1] (an output of 1 token: after the first) */
} nl_loadgen_opts;

typedef struct nl_latency_summary {
    int64_t n;
    double mean, p50, p90, p99, max; /* seconds */
} nl_latency_summary;

typedef struct nl_loadgen_result {
    int64_t requests, ok, failed, good;   /* requests: those started (fewer than asked when a duration ends the run) */
    int64_t disconnected;                 /* requests whose client went away mid-stream as asked
                                             (disconnect_frac): requests = ok + failed + disconnected */
    int64_t prompt_tokens, output_tokens; /* of the successful requests (usage) */
    int64_t short_outputs;                /* successful requests that stopped before max_tokens (the
                                             model wrote BOS, which ends a llama2.c story) */
    double duration_s;                    /* first send to last response */
    double requests_per_s, output_tokens_per_s, total_tokens_per_s, goodput_rps;
    nl_latency_summary ttft, tpot, itl, e2e;
    char first_error[320]; /* why the first failed request failed ("" if none) */
} nl_loadgen_result;

/* The q-quantile (0..1) of n sorted values by linear interpolation between closest ranks
 * (numpy's default); NaN when n == 0. */
double nl_percentile(const double *sorted, int64_t n, double q);
/* Sorts v[0..n) in place and fills *s. */
void nl_latency_summarize(double *v, int64_t n, nl_latency_summary *s);

/* Runs the load described by *o and fills *r. Failed requests are counted, not fatal: returns
 * NL_OK when the run completed (even with failures), NL_ERR_INVALID on bad options, NL_ERR_IO
 * when GET /v1/models (asked only when vocab_size is 0) cannot be read. */
nl_status nl_loadgen_run(const nl_loadgen_opts *o, nl_loadgen_result *r);

#endif
