/* Prefix caching under a closed loop, at the level of engine steps (no HTTP, no other process):
 * where a cached request's time to first token goes when C clients share a 512-token system
 * prompt (bench/bench_prefix_cache.sh's workload: 512 shared + 32 own prompt tokens, 32 output
 * tokens, random weights of its shape: dim 384, 6 layers, vocab 512, fp32).
 *
 * Each client submits its next request one step after its last one finished (the HTTP round trip
 * lands during the next step); a request's TTFT is counted from the middle of the step it arrived
 * in to the end of the step that sampled its first token. Time is each step's CPU time (the
 * process's, both threads), which a loaded machine inflates far less than wall time; the rows per
 * step and the steps a TTFT spans are exact. Prints, for caching on and off and each chunk budget
 * (PREFIX_WAVES_CHUNKS, default "256 128 64"): TTFT p50 (CPU s, and steps), the rows of the steps
 * that TTFT spans, output tokens per CPU second, and the ratios cached / uncached.
 * PREFIX_WAVES_CLIENTS (default 16), PREFIX_WAVES_REQS (requests per client, default 3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "nanolm/engine.h"
#include "nanolm/model.h"

enum { SHARED = 512, OWN = 32, OUT = 32, MAX_CLIENTS = 64 };

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void prompt_of(uint64_t req, int32_t *p) {
    nl_rng shared, own;
    nl_rng_seed(&shared, 0x5eed);
    nl_rng_seed(&own, 1000 + req);
    for (int i = 0; i < SHARED + OWN; i++) p[i] = (int32_t)(3 + nl_rng_below(i < SHARED ? &shared : &own, 509));
}

typedef struct client {
    uint64_t id;      /* 0: none in flight */
    int64_t sent;     /* requests submitted */
    int64_t due_step; /* submit the next one after this step */
    double t_arrive;  /* CPU clock at the middle of its arrival step */
    int64_t s_arrive, rows_arrive;
    int got_first;
} client;

typedef struct result {
    double ttft_p50, ttft_steps_p50, ttft_rows_p50, tok_per_cpu_s, hit_rate;
} result;

static void run(const nl_model *m, int cache, int64_t chunk, int clients, int reqs, result *res) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.threads = 2;
    o.max_batch = 32;
    o.chunk = chunk;
    o.prefix_cache = cache;
    nl_engine *e;
    if (nl_engine_open_model(&e, m, NULL, &o)) exit(1);
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = OUT;
    s.ignore_eos = 1;
    int32_t p[SHARED + OWN];
    { /* the system prompt computed once before (the untimed pass of bench_prefix_cache.sh) */
        uint64_t id;
        prompt_of(999999, p);
        if (nl_engine_submit(e, p, SHARED + OWN, &s, &id)) exit(1);
        while (nl_engine_busy(e))
            if (nl_engine_step(e, NULL)) exit(1);
        nl_engine_release(e, id);
    }
    client c[MAX_CLIENTS];
    memset(c, 0, sizeof c);
    double *ttft = calloc((size_t)(clients * reqs), sizeof *ttft), *tsteps = calloc((size_t)(clients * reqs), 8),
           *trows = calloc((size_t)(clients * reqs), 8);
    int64_t n_ttft = 0, step = 0, rows_total = 0, out_tokens = 0, left = (int64_t)clients * reqs;
    double cpu = 0, t_step_mid = 0;
    uint64_t next_req = 0;
    while (left > 0) {
        for (int i = 0; i < clients; i++)
            if (!c[i].id && c[i].sent < reqs && c[i].due_step <= step) {
                prompt_of(next_req++, p);
                if (nl_engine_submit(e, p, SHARED + OWN, &s, &c[i].id)) exit(1);
                c[i].sent++;
                c[i].got_first = 0;
                c[i].t_arrive = step ? t_step_mid : cpu;
                c[i].s_arrive = step;
                c[i].rows_arrive = rows_total;
            }
        double t0 = cpu_s();
        int64_t rows = 0;
        if (nl_engine_step(e, &rows)) exit(1);
        double dt = cpu_s() - t0;
        t_step_mid = cpu + dt / 2;
        cpu += dt;
        rows_total += rows;
        step++;
        for (int i = 0; i < clients; i++) {
            if (!c[i].id) continue;
            nl_engine_output out;
            if (nl_engine_read(e, c[i].id, 0, &out)) exit(1);
            if (!c[i].got_first && out.n_tokens > 0) {
                c[i].got_first = 1;
                ttft[n_ttft] = cpu - c[i].t_arrive;
                tsteps[n_ttft] = (double)(step - c[i].s_arrive);
                trows[n_ttft++] = (double)(rows_total - c[i].rows_arrive);
            }
            out_tokens += out.n_tokens;
            if (out.finish != NL_FINISH_NONE) {
                nl_engine_release(e, c[i].id);
                c[i].id = 0;
                c[i].due_step = step + 1; /* its next request lands during the next step */
                left--;
            }
            nl_engine_output_free(&out);
        }
    }
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    res->hit_rate = st.prefix_cache_queries ? (double)st.prefix_cache_hits / (double)st.prefix_cache_queries : 0;
    res->ttft_p50 = median(ttft, (int)n_ttft);
    res->ttft_steps_p50 = median(tsteps, (int)n_ttft);
    res->ttft_rows_p50 = median(trows, (int)n_ttft);
    res->tok_per_cpu_s = (double)out_tokens / cpu;
    free(ttft);
    free(tsteps);
    free(trows);
    nl_engine_close(e);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const int clients = env_int("PREFIX_WAVES_CLIENTS", 16), reqs = env_int("PREFIX_WAVES_REQS", 3);
    if (clients < 1 || clients > MAX_CLIENTS || reqs < 1) {
        fprintf(stderr, "bench_prefix_waves: PREFIX_WAVES_CLIENTS must be in [1, %d], REQS >= 1\n", MAX_CLIENTS);
        return 2;
    }
    const char *chunks = getenv("PREFIX_WAVES_CHUNKS");
    char buf[128];
    snprintf(buf, sizeof buf, "%s", chunks && *chunks ? chunks : "256 128 64");
    nl_model m;
    if (bench_random_model(&m, "rand11M", 384, 6, 1024)) return 1;
    printf("bench_prefix_waves: %d clients x %d requests, %d shared + %d own prompt tokens, %d output tokens\n",
           clients, reqs, SHARED, OWN, OUT);
    printf("%-6s %-6s %12s %11s %10s %12s %8s\n", "chunk", "cache", "TTFT p50 cpu", "TTFT steps", "TTFT rows",
           "out tok/cpu-s", "hit");
    for (char *save = NULL, *w = strtok_r(buf, " ,", &save); w; w = strtok_r(NULL, " ,", &save)) {
        int64_t chunk = atoll(w);
        result r[2];
        for (int cache = 1; cache >= 0; cache--) {
            run(&m, cache, chunk, clients, reqs, &r[cache]);
            printf("%-6lld %-6s %12.3f %11.1f %10.0f %12.1f %8.3f\n", (long long)chunk, cache ? "on" : "off",
                   r[cache].ttft_p50, r[cache].ttft_steps_p50, r[cache].ttft_rows_p50, r[cache].tok_per_cpu_s,
                   r[cache].hit_rate);
        }
        printf("chunk %lld: TTFT p50 cached/uncached %.3fx (CPU time), %.3fx (rows); out tok/cpu-s %.2fx\n",
               (long long)chunk, r[1].ttft_p50 / r[0].ttft_p50, r[1].ttft_rows_p50 / r[0].ttft_rows_p50,
               r[1].tok_per_cpu_s / r[0].tok_per_cpu_s);
    }
    nl_model_free(&m);
    return 0;
}
