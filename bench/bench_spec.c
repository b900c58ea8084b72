/* Speculative decoding with prompt-lookup drafts, single stream, measured in one run, on two
 * workloads with the same prompt (a TinyStories story, then its first sentence again: "retell
 * it"), greedy:
 *   stories  the stories260K checkpoint (data/stories260K), 1 thread, 256 tokens: a real model,
 *            whose retelling repeats some of the story;
 *   rand85M  random weights of the 85M shape of bench_serve.sh (dim 768, 12 layers, vocab 512;
 *            340 MB of fp32 weights), 1 thread, the prompt's first 64 tokens, 64 tokens: decode
 *            bound by reading the weights, and a greedy text that falls into a loop (what prompt
 *            lookup drafts best: the ceiling of the method).
 * Rounds alternate the engine without drafting and with K drafted tokens per step (K = 4;
 * SPEC_BENCH_K), each decoding the same request. Prints every round's decode tokens/s
 * (completion tokens after the first over the time from the first token to the last), then the
 * medians, the median of the rounds' ratios (target >= 1.5) and the acceptance rate. The tokens
 * of both are compared: greedy speculative decoding must give the same text. SPEC_BENCH_ROUNDS
 * (default 5), SPEC_BENCH_TOKENS (default 256; rand85M: a quarter of it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "nanolm/engine.h"
#include "nanolm/model.h"

static const char *STORY =
    "Once upon a time there was a little boy named Ben. Ben loved to explore the world around him. He saw many "
    "amazing things, like beautiful vases that were on display in a store. One day, Ben was walking through the "
    "store when he came across a very special vase. When Ben saw it he was amazed!\n"
    "He said, \"Wow, that is a really amazing vase! Can I buy it?\"\n"
    "The shopkeeper smiled and said, \"Of course you can. You can take it home and show all your friends how "
    "amazing it is!\"\n"
    "So Ben took the vase home and he was so proud of it! He called his friends over and showed them the amazing "
    "vase. All his friends thought the vase was beautiful and couldn't believe how lucky Ben was.\n"
    "And that's how Ben found an amazing vase in the store!\n"
    "Once upon a time there was a little boy named Ben.";

static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

static int32_t *g_prompt;
static int64_t g_n_prompt;

/* One request through an engine with spec_k drafts (on model m, or the stories260K checkpoint
 * when m is NULL): decode tokens/s; tokens to out. */
static double run_once(const nl_model *m, int threads, int spec_k, int64_t n_tok, int32_t *out, int64_t *n_out,
                       double *accept) {
    nl_engine_opts o;
    nl_engine_opts_default(&o);
    o.threads = threads;
    o.spec_k = spec_k;
    nl_engine *e;
    nl_status rc = m ? nl_engine_open_model(&e, m, NULL, &o)
                     : nl_engine_open(&e, "data/stories260K/stories260K.bin", "data/stories260K/tok512.bin", &o);
    if (rc) {
        fprintf(stderr, "bench_spec: %s\n", nl_last_error());
        exit(1);
    }
    if (!g_prompt && nl_engine_encode(e, STORY, strlen(STORY), &g_prompt, &g_n_prompt)) exit(1);
    const int32_t *p = g_prompt;
    int64_t n = g_n_prompt;
    nl_sampling s;
    nl_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = n_tok;
    s.ignore_eos = 1;
    uint64_t id;
    if (nl_engine_submit(e, p, n, &s, &id)) exit(1);
    while (nl_engine_busy(e))
        if (nl_engine_step(e, NULL)) exit(1);
    nl_engine_output r;
    if (nl_engine_read(e, id, 1, &r)) exit(1);
    memcpy(out, r.tokens, sizeof(int32_t) * (size_t)r.n_tokens);
    *n_out = r.n_tokens;
    double tps = (double)(r.n_tokens - 1) / (r.t_finish_s - r.t_first_token_s);
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    *accept = st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0;
    nl_engine_output_free(&r);
    nl_engine_close(e);
    return tps;
}

/* Alternated rounds on one workload; returns 0 when the greedy tokens agree. */
static int workload(const char *name, const nl_model *m, int threads, int rounds, int k, int64_t n_tok) {
    int32_t *a = malloc(sizeof(int32_t) * (size_t)(n_tok + 1)), *b = malloc(sizeof(int32_t) * (size_t)(n_tok + 1));
    double off[64], on[64], ratio[64], acc = 0, acc_off;
    int64_t na = 0, nb = 0;
    run_once(m, threads, 0, n_tok, a, &na, &acc_off); /* warm-up: pages in the weights */
    printf("%s: greedy, %lld tokens, %d thread(s); prompt lookup k = %d\n", name, (long long)n_tok, threads, k);
    printf("%-6s %16s %16s %8s %10s\n", "round", "off tok/s", "spec tok/s", "ratio", "accepted");
    int same = 1, n = rounds < 64 ? rounds : 64;
    for (int i = 0; i < n; i++) {
        off[i] = run_once(m, threads, 0, n_tok, a, &na, &acc_off);
        on[i] = run_once(m, threads, k, n_tok, b, &nb, &acc);
        ratio[i] = on[i] / off[i];
        same &= na == nb && !memcmp(a, b, sizeof(int32_t) * (size_t)na);
        printf("%-6d %16.1f %16.1f %7.2fx %9.1f%%\n", i + 1, off[i], on[i], ratio[i], 100 * acc);
    }
    printf("%s medians: off %.1f tok/s, speculative %.1f tok/s, ratio %.2fx (target >= 1.5), acceptance %.1f%%; "
           "greedy tokens %s\n",
           name, median(off, n), median(on, n), median(ratio, n), 100 * acc, same ? "identical" : "DIFFER");
    free(a);
    free(b);
    return !same;
}

int main(void) {
    FILE *f = fopen("data/stories260K/stories260K.bin", "rb");
    if (!f) {
        printf("bench_spec: needs data/stories260K (run from the repository root); skipped\n");
        return 0;
    }
    fclose(f);
    setvbuf(stdout, NULL, _IOLBF, 0); /* a round at a time, when piped */
    const int rounds = env_int("SPEC_BENCH_ROUNDS", 5), k = env_int("SPEC_BENCH_K", 4);
    const int64_t n_tok = env_int("SPEC_BENCH_TOKENS", 256);
    int rc = workload("stories", NULL, 1, rounds, k, n_tok);
    nl_model m;
    if (bench_random_model(&m, "rand85M", 768, 12, 2048)) return 1;
    if (g_n_prompt > 64) g_n_prompt = 64;
    rc |= workload("rand85M", &m, 1, rounds, k, n_tok / 4);
    nl_model_free(&m);
    nl_free(g_prompt);
    return rc;
}
