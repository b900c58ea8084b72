/* Helpers shared by the benchmarks: medians of repeated timings, random models of the serving
 * benchmarks' shapes. */
#ifndef NANOLM_BENCH_UTIL_H
#define NANOLM_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/model.h"

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v in place). */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A model of random weights (seed 1): vocab 512 (stories260K's tokenizer), heads of 64, seq_len
 * 1024, RoPE theta 10000. The 11M shape of bench_prefix_cache.sh is (384, 6, 1024), the 85M one
 * of bench_serve.sh (768, 12, 2048). */
static inline nl_status bench_random_model(nl_model *m, const char *name, int64_t dim, int64_t layers, int64_t hidden) {
    nl_arch a;
    memset(&a, 0, sizeof a);
    snprintf(a.name, sizeof a.name, "%s", name);
    a.vocab_size = 512, a.dim = dim, a.n_layers = layers, a.n_heads = dim / 64, a.n_kv_heads = dim / 64;
    a.hidden_dim = hidden, a.seq_len = 1024, a.rope_theta = 10000, a.norm_eps = 1e-5;
    NL_TRY(nl_model_init(m, &a));
    nl_model_init_random(m, 1);
    return NL_OK;
}

#endif
