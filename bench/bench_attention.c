/* Decode attention of the paged KV cache (nl_paged_attend_rows, one query row) against the
 * machine's read bandwidth, measured in the same run on one thread. For each shape: D sequences
 * of `ctx` positions in a pool of L layers (blocks of 16 in a shuffled order, as a pool that has
 * served requests hands them out); every layer first reads its share of a buffer the size of the
 * model's fp32 weights (what the step's linears read, untimed), then attends every (sequence,
 * head). Prints microseconds per (token, head), the K/V bytes it reads per second, and that rate
 * as a share of the streaming read of a 1 GiB buffer: how far the walk over the blocks is from
 * the memory's speed (shapes whose K/V and weights fit in the last-level cache can pass 1). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/kvcache.h"
#include "bench_util.h"

/* Bytes/s of one streaming read of n floats (best of 5), after one write pass. */
static double read_bw(size_t n) {
    float *b = nl_malloc(n * sizeof(float), "bandwidth buffer");
    if (!b) exit(1);
    for (size_t i = 0; i < n; i++) b[i] = (float)(i & 1023);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        float acc[16] = {0};
        double t0 = nl_time_s();
        for (size_t i = 0; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++) acc[j] += b[i + j];
        double dt = nl_time_s() - t0;
        volatile float sink = acc[0] + acc[15];
        (void)sink;
        double bw = (double)(n * sizeof(float)) / dt;
        if (bw > best) best = bw;
    }
    nl_free(b);
    return best;
}

typedef struct shape {
    const char *name;
    int64_t L, KVH, NH, hd, D, ctx;
    double weight_mb; /* fp32 weights of the model's L layers */
} shape;

/* Median seconds per (token, head) over `reps` steps; *kv_bytes the K/V bytes one (token, head)
 * reads. */
static double attend(const shape *s, int reps, double *kv_bytes) {
    const int64_t bs = 16, nb = (s->ctx + bs - 1) / bs, kvd = s->KVH * s->hd;
    nl_kvcache c;
    if (nl_kvcache_init(&c, s->L, s->KVH, s->hd, NL_KV_FP32, bs, s->D * nb)) exit(1);
    int32_t *table = nl_malloc((size_t)(s->D * nb) * sizeof(int32_t), "block tables");
    float *q = nl_malloc((size_t)(s->D * s->NH * s->hd + kvd) * sizeof(float), "queries");
    float *out = nl_malloc((size_t)(s->D * s->NH * s->hd) * sizeof(float), "outputs");
    float *scratch = nl_malloc((size_t)nl_paged_attend_scratch(1, s->ctx, s->hd) * sizeof(float), "scratch");
    size_t wf = (size_t)(s->weight_mb * 1e6 / sizeof(float));
    float *w = nl_malloc(wf * sizeof(float), "weight footprint");
    if (!table || !q || !out || !scratch || !w) exit(1);
    uint64_t rng = 7;
    for (int64_t b = 0; b < s->D * nb; b++) table[b] = (int32_t)b;
    for (int64_t b = s->D * nb - 1; b > 0; b--) { /* shuffled */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int64_t j = (int64_t)((rng >> 33) % (uint64_t)(b + 1));
        int32_t t = table[b];
        table[b] = table[j], table[j] = t;
    }
    float *kv = q + s->D * s->NH * s->hd;
    for (int64_t i = 0; i < s->D * s->NH * s->hd + kvd; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        q[i] = (float)((rng >> 40) % 1000) * 1e-3f - 0.5f;
    }
    for (int64_t d = 0; d < s->D; d++)
        for (int64_t l = 0; l < s->L; l++)
            for (int64_t t = 0; t < s->ctx; t++) {
                kv[(d + l + t) % kvd] += 0.01f;
                nl_kvcache_store(&c, table + d * nb, l, t, kv, kv);
            }
    for (size_t i = 0; i < wf; i++) w[i] = (float)(i & 255) * 1e-3f;
    double v[64];
    volatile float sink = 0;
    for (int r = 0; r < reps; r++) {
        double tot = 0;
        for (int64_t l = 0; l < s->L; l++) {
            float acc = 0;
            for (size_t i = wf * (size_t)l / (size_t)s->L; i < wf * (size_t)(l + 1) / (size_t)s->L; i += 16)
                acc += w[i];
            sink += acc;
            double t0 = nl_time_s();
            for (int64_t d = 0; d < s->D; d++)
                for (int64_t h = 0; h < s->NH; h++)
                    nl_paged_attend_rows(&c, table + d * nb, l, s->ctx - 1, 1, q + d * s->NH * s->hd, 0, s->NH, h,
                                         out + (d * s->NH + h) * s->hd, 0, scratch);
            tot += nl_time_s() - t0;
        }
        v[r] = tot / (double)(s->L * s->D * s->NH);
    }
    (void)sink;
    *kv_bytes = 2.0 * (double)s->ctx * (double)s->hd * sizeof(float);
    nl_free(w);
    nl_free(scratch);
    nl_free(out);
    nl_free(q);
    nl_free(table);
    nl_kvcache_free(&c);
    return median(v, reps);
}

int main(void) {
    const double bw = read_bw((size_t)1 << 28);
    printf("read bandwidth (1 GiB, 1 thread, best of 5): %.1f GB/s\n", bw / 1e9);
    printf("decode attention, fp32 KV, 1 thread, medians of 31 steps\n");
    printf("%-34s %12s %10s %8s\n", "shape", "us/tok-head", "KV GB/s", "share");
    static const shape shapes[] = {
        {"dim 256 (hd 32, GQA 2), 8 x 96", 4, 4, 8, 32, 8, 96, 11.6},
        {"85M (hd 64), 8 x 96", 12, 12, 12, 64, 8, 96, 340.0},
        {"85M (hd 64), 32 x 200", 12, 12, 12, 64, 32, 200, 340.0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double kvb = 0, t = attend(&shapes[i], 31, &kvb);
        printf("%-34s %12.2f %10.2f %8.2f\n", shapes[i].name, t * 1e6, kvb / t / 1e9, kvb / t / bw);
    }
    return 0;
}
