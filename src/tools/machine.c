/* Measures this CPU for the engine's cost model (machine.h, cpu_rates.h). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nanolm/engine.h"
#include "nanolm/kvcache.h"
#include "nanolm/machine.h"
#include "nanolm/matvec.h"
#include "nanolm/model.h"
#include "nanolm/runner.h"

void nl_machine_opts_default(nl_machine_opts *o) {
    memset(o, 0, sizeof *o);
    o->bw_bytes = (size_t)256 << 20;
    o->min_time_s = 0.05;
    o->repeats = 5;
    o->formats = 7;
    o->kv_formats = 3;
}

double nl_machine_clock_s(const nl_machine_opts *o) {
    if (!o || !o->thread_cpu_time) return nl_time_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- streaming read bandwidth ------------------------------------------------------------------ */

/* One streaming read of n floats (n a multiple of 32) with `threads` threads; bytes/s. 32
 * independent sums per thread so that the adds vectorize and the loads, not an add chain, limit it. */
static double read_once(const nl_machine_opts *o, const float *buf, size_t n, int threads) {
    double t0 = nl_machine_clock_s(o), total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        float acc[32] = {0};
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i += 32)
            for (int j = 0; j < 32; j++) acc[j] += buf[i + j];
        for (int j = 0; j < 32; j++) total += acc[j];
    }
    double dt = nl_machine_clock_s(o) - t0;
    volatile double sink = total; /* keeps the loop */
    (void)sink;
    return (double)n * sizeof(float) / dt;
}

static nl_status measure_bw(const nl_machine_opts *o, int threads, nl_cpu_rates *r) {
    size_t n = o->bw_bytes / sizeof(float) / 32 * 32;
    float *buf = nl_malloc(n * sizeof(float), "bandwidth probe buffer");
    if (!buf) return NL_ERR_NOMEM;
        /* first touch with the threads that read it (their pages near them) */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023) * 1e-3f;
    double v1[32], vn[32];
    int reps = o->repeats < 32 ? o->repeats : 32;
    for (int k = 0; k < reps; k++) {
        v1[k] = read_once(o, buf, n, 1);
        vn[k] = read_once(o, buf, n, threads);
    }
    r->read_bw_1t = nl_median(v1, (size_t)reps);
    r->read_bw_nt = nl_median(vn, (size_t)reps);
    nl_free(buf);
    return NL_OK;
}

/* ---- the engine's linear kernel ------------------------------------------------------------------ */

/* Seconds that one reading of o's clock adds to the interval it closes (the thread CPU clock is
 * a system call: about 1.3 us on a virtual machine, as much as a small kernel call); the median
 * of 5 runs of 64 readings. */
static double clock_cost_s(const nl_machine_opts *o) {
    double v[5];
    for (int k = 0; k < 5; k++) {
        double t0 = nl_machine_clock_s(o), t1 = t0;
        for (int i = 0; i < 64; i++) t1 = nl_machine_clock_s(o);
        v[k] = (t1 - t0) / 64;
    }
    return nl_median(v, 5);
}

/* Times fn(ctx) until min_time_s has passed; seconds per call (less the clock's own cost), median
 * of `repeats` timings. */
typedef void (*timed_fn)(void *ctx);
static double time_calls(timed_fn fn, void *ctx, const nl_machine_opts *o) {
    fn(ctx); /* warm-up */
    double v[32], clock_s = clock_cost_s(o);
    int reps = o->repeats < 32 ? o->repeats : 32;
    for (int k = 0; k < reps; k++) {
        int calls = 0;
        double t0 = nl_machine_clock_s(o), dt;
        do {
            fn(ctx);
            calls++;
        } while ((dt = nl_machine_clock_s(o) - t0) < o->min_time_s);
        v[k] = dt / calls - clock_s;
    }
    double t = nl_median(v, (size_t)reps);
    return t > 0 ? t : 0;
}

typedef struct lin_ctx {
    nl_mv_weight *w; /* (L, 4) */
    nl_mv_act *act;  /* the prepared inputs, reused from call to call as the engine reuses them */
    int64_t n_w, m;
    float *x, *y;
    int threads;
} lin_ctx;

static void run_linears(void *p) {
    lin_ctx *c = p;
    for (int64_t i = 0; i < c->n_w; i++) (void)nl_mv_forward_act(&c->w[i], c->act, c->x, c->m, c->y, c->threads);
}

static nl_status measure_gemm(const nl_arch *a, const nl_machine_opts *o, int threads, nl_cpu_rates *r) {
    const int64_t C = a->dim, hd = nl_arch_head_dim(a), QKV = (a->n_heads + 2 * a->n_kv_heads) * hd,
                  ATT = a->n_heads * hd;
    const int64_t H = a->hidden_dim, L = a->n_layers;
    const int64_t shp[4][2] = {{QKV, C}, {C, ATT}, {2 * H, C}, {C, H}};
    int64_t maxk = C > H ? C : H, maxk2 = maxk > ATT ? maxk : ATT, maxn = QKV > 2 * H ? QKV : 2 * H;
    maxn = maxn > C ? maxn : C;
    int64_t M = nl_cpu_m[NL_CPU_NM - 1];
    size_t per_layer = 0;
    for (int j = 0; j < 4; j++) per_layer += (size_t)(shp[j][0] * shp[j][1]);
    float *wf = nl_malloc(per_layer * (size_t)L * sizeof(float), "kernel probe weights");
    float *x = nl_malloc((size_t)(M * maxk2) * sizeof(float), "kernel probe input");
    float *y = nl_malloc((size_t)(M * maxn) * sizeof(float), "kernel probe output");
    nl_mv_weight *w = nl_calloc((size_t)(4 * L), sizeof *w, "kernel probe weight table");
    nl_status rc = (!wf || !x || !y || !w) ? NL_ERR_NOMEM : NL_OK;
    nl_rng g;
    nl_rng_seed(&g, 3);
    for (size_t i = 0; !rc && i < per_layer * (size_t)L; i++) wf[i] = (nl_rng_float(&g) - 0.5f) * 0.1f;
    for (int64_t i = 0; !rc && i < M * maxk2; i++) x[i] = nl_rng_float(&g) - 0.5f;
    double flops_per_row = 2.0 * (double)per_layer * (double)L;
    for (int f = 0; !rc && f < 3; f++) {
        if (!(o->formats & (1 << f))) continue;
        float *p = wf;
        for (int64_t l = 0; !rc && l < L; l++)
            for (int j = 0; !rc && j < 4; j++) {
                rc = nl_mv_weight_init(&w[4 * l + j], (nl_wfmt)f, p, shp[j][0], shp[j][1], 0);
                p += shp[j][0] * shp[j][1];
            }
        nl_mv_act act;
        memset(&act, 0, sizeof act);
        for (int i = 0; !rc && i < NL_CPU_NM; i++) {
            lin_ctx c = {w, &act, 4 * L, nl_cpu_m[i], x, y, threads};
            r->gemm[f][i] = flops_per_row * (double)nl_cpu_m[i] / time_calls(run_linears, &c, o);
        }
        nl_mv_act_free(&act);
        for (int64_t k = 0; k < 4 * L; k++) nl_mv_weight_free(&w[k]);
        memset(w, 0, (size_t)(4 * L) * sizeof *w);
    }
    nl_free(wf);
    nl_free(x);
    nl_free(y);
    nl_free(w);
    return rc;
}

/* ---- attention and the per-row work of a layer ------------------------------------------------- */

typedef struct attn_ctx {
    nl_kvcache *kv;
    int32_t *table; /* (nb): one sequence */
    int64_t rows, pos, NH, hd;
    float *q, *out, *scratch;
    int64_t scratch_floats; /* per thread */
    int threads;
} attn_ctx;

/* The engine's attention loop (engine.c forward_rows) for one prompt chunk: (tile, head) pairs
 * over the threads; the rows are one tile of positions pos - rows + 1 .. pos of one sequence. */
static void run_chunk_attention(void *p) {
    attn_ctx *c = p;
    const int64_t qkv = c->NH * c->hd;
#pragma omp parallel num_threads(c->threads)
    {
        float *scratch = c->scratch + (int64_t)omp_get_thread_num() * c->scratch_floats;
#pragma omp for schedule(dynamic, 1)
        for (int64_t h = 0; h < c->NH; h++)
            nl_paged_attend_rows(c->kv, c->table, 0, c->pos - c->rows + 1, c->rows, c->q, qkv, c->NH, h,
                                 c->out + h * c->hd, qkv, scratch);
    }
}

/* The FLOP rate of a prompt chunk's attention: 16 tokens (one tile) at positions 240..255 of one
 * sequence, whose K/V the chunk has just stored (in cache). */
static nl_status measure_chunk_attention(const nl_arch *a, const nl_machine_opts *o, int threads, nl_cpu_rates *r) {
    const int64_t NH = a->n_heads, KVH = a->n_kv_heads, hd = nl_arch_head_dim(a), rows = NL_KV_QTILE, pos = 255;
    const int64_t bs = 16, nb = (pos + bs) / bs;
    nl_kvcache kv;
    NL_TRY(nl_kvcache_init(&kv, 1, KVH, hd, NL_KV_FP32, bs, nb));
    int32_t table[64];
    const int64_t scratch_floats = nl_paged_attend_scratch(rows, pos + 1, hd);
    float *q =
        nl_malloc((size_t)(rows * NH * hd * 2 + (int64_t)threads * scratch_floats + 2 * KVH * hd) * sizeof(float),
                  "attention probe");
    if (!q) {
        nl_kvcache_free(&kv);
        return NL_ERR_NOMEM;
    }
    for (int64_t b = 0; b < nb; b++) table[b] = (int32_t)b;
    float *out_h = q + rows * NH * hd, *scratch = out_h + rows * NH * hd,
          *k = scratch + (int64_t)threads * scratch_floats;
    nl_rng g;
    nl_rng_seed(&g, 4);
    for (int64_t i = 0; i < rows * NH * hd; i++) q[i] = nl_rng_float(&g) - 0.5f;
    for (int64_t t = 0; t <= pos; t++) {
        for (int64_t j = 0; j < 2 * KVH * hd; j++) k[j] = nl_rng_float(&g) - 0.5f;
        nl_kvcache_store(&kv, table, 0, t, k, k + KVH * hd);
    }
    attn_ctx c = {&kv, table, rows, pos, NH, hd, q, out_h, scratch, scratch_floats, threads};
    double per = time_calls(run_chunk_attention, &c, o) / (double)(rows * NH); /* per (token, head) */
    double positions = (double)pos + 1 - (double)(rows - 1) / 2;               /* mean attended */
    r->attn_flops_chunk = 4.0 * (double)hd * positions / per;
    nl_free(q);
    nl_kvcache_free(&kv);
    return NL_OK;
}

/* ---- the decode rows of a step, where the step finds their data ---------------------------------- */

/* A pool of the model's L layers holding D sequences of n_pos positions each (the decode rows of
 * one step), and a buffer of the weights' footprint that is read between layers, as the step's
 * linears read the weights: what the step's attention and KV stores find in the caches. */
typedef struct dec_ctx {
    const nl_model *m; /* RoPE tables (seq_len > n_pos) and shapes (one layer of them) */
    int64_t L;         /* layers of the pool (the measured model's) */
    nl_kvcache kv;
    nl_runner run;  /* its rows, q/k/v and attention outputs: D rows, no weights */
    int32_t *table; /* (D, nb) */
    int64_t D, nb, pos;
    float *fill;          /* (2 KVH hd) one token's K/V while filling */
    const float *weights; /* (weight_floats) the footprint of the linears */
    size_t weight_floats;
    int threads;
    int chunk;      /* 1: the D rows are one prompt chunk, positions pos .. pos + D - 1 of sequence 0 */
    double clock_s; /* what one clock reading adds to an interval (clock_cost_s) */
} dec_ctx;

/* Reads floats [f0, f1) of the weight footprint (not timed): what the linears of a layer read. */
static void read_weights(const dec_ctx *c, size_t f0, size_t f1) {
    float acc[16] = {0};
    for (size_t i = f0; i + 16 <= f1; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += c->weights[i + j];
    volatile float sink = acc[0] + acc[15];
    (void)sink;
}

/* One step of the D decode rows at position c->pos through the runner's own layer pieces
 * (runner.h), layer by layer as nl_runner_forward runs them: the weights of the layer read, then
 * (timed) RoPE + KV store over the rows, then (timed) attention, one unit of work per (row, head).
 * Adds the seconds to *rope_s, *attn_s. */
static void dec_step(dec_ctx *c, const nl_machine_opts *o, double *rope_s, double *attn_s) {
    nl_runner *run = &c->run;
    for (int64_t i = 0; i < c->D; i++) {
        int64_t seq = c->chunk ? 0 : i;
        run->pos[i] = c->chunk ? c->pos + i : c->pos;
        run->table[i] = c->table + seq * c->nb;
    }
    const int64_t n_tiles = nl_runner_tiles(run, c->D);
    for (int64_t l = 0; l < c->L; l++) {
        read_weights(c, c->weight_floats * (size_t)l / (size_t)c->L, c->weight_floats * (size_t)(l + 1) / (size_t)c->L);
        double t0 = nl_machine_clock_s(o);
        nl_runner_rope_store(run, &c->kv, l, c->D);
        double t1 = nl_machine_clock_s(o);
        *rope_s += t1 - t0 - c->clock_s;
        if (c->chunk) continue; /* the chunk's attention: measure_chunk_attention */
        nl_runner_attention(run, &c->kv, l, n_tiles);
        *attn_s += nl_machine_clock_s(o) - t1 - c->clock_s;
    }
}

/* Seconds per (token, head) of attention and per (token, layer) of RoPE + KV store of D decode
 * rows at position pos (medians of o->repeats timings of at least min_time_s each). */
static void dec_time(dec_ctx *c, const nl_machine_opts *o, int64_t pos, double *attn, double *rope) {
    double va[32], vr[32];
    int reps = o->repeats < 32 ? o->repeats : 32;
    double rs = 0, as = 0;
    c->pos = pos;
    dec_step(c, o, &rs, &as); /* warm-up */
    for (int k = 0; k < reps; k++) {
        int steps = 0;
        rs = as = 0;
        do {
            dec_step(c, o, &rs, &as);
            steps++;
        } while (rs + as < o->min_time_s && steps < 100000);
        va[k] = c->chunk ? 0 : as / ((double)steps * (double)(c->L * c->D * c->m->NH));
        vr[k] = rs / ((double)steps * (double)(c->L * c->D));
    }
    *attn = nl_median(va, (size_t)reps);
    *rope = nl_median(vr, (size_t)reps);
    *attn = *attn > 0 ? *attn : 0;
    *rope = *rope > 0 ? *rope : 0;
}

/* Fills the K/V of positions [0, n_pos) of every sequence and layer with random values. */
static void dec_fill(dec_ctx *c, int64_t n_pos, float *kvrow) {
    const nl_model *m = c->m;
    const int64_t kvd = m->KVH * m->hd;
    nl_rng g;
    nl_rng_seed(&g, 8);
    for (int64_t j = 0; j < 2 * kvd; j++) kvrow[j] = nl_rng_float(&g) - 0.5f;
    for (int64_t i = 0; i < c->D; i++)
        for (int64_t l = 0; l < c->L; l++)
            for (int64_t t = 0; t < n_pos; t++) {
                kvrow[(i + l + t) % (2 * kvd)] = nl_rng_float(&g) - 0.5f; /* no two rows alike */
                nl_kvcache_store(&c->kv, c->table + i * c->nb, l, t, kvrow, kvrow + kvd);
            }
}

enum { DEC_POS0 = 32, DEC_POS1 = 160 };
#define DEC_POOL_BYTES ((double)(256 << 20)) /* the most K/V a probe holds */

/* Opens c for D rows over n_seq sequences of n_pos positions (K/V filled) in an L-layer pool of
 * K/V format dt. */
static nl_status dec_open(dec_ctx *c, const nl_model *m, int64_t L, nl_kv_dtype dt, int64_t D, int64_t n_seq,
                          int64_t n_pos, const float *weights, size_t weight_floats, const nl_machine_opts *o,
                          int threads) {
    const int64_t bs = 16, kvd = m->KVH * m->hd;
    memset(c, 0, sizeof *c);
    c->m = m;
    c->L = L;
    c->D = D;
    c->nb = (n_pos + bs - 1) / bs;
    c->weights = weights;
    c->weight_floats = weight_floats;
    c->threads = threads;
    c->clock_s = clock_cost_s(o);
    NL_TRY(nl_kvcache_init(&c->kv, L, m->KVH, m->hd, dt, bs, n_seq * c->nb));
    NL_TRY(nl_runner_init(&c->run, m, D, threads));
    c->table = nl_malloc((size_t)(n_seq * c->nb) * sizeof(int32_t), "decode probe block tables");
    c->fill = nl_malloc((size_t)(2 * kvd) * sizeof(float), "decode probe buffers");
    if (!c->table || !c->fill) return NL_ERR_NOMEM;
    /* blocks in a shuffled order: a pool that has served requests hands out blocks in the order
     * they came back (block_pool.c frees a finished sequence's blocks onto its free queue), which
     * mixes the blocks of sequences that started and finished at different times */
    for (int64_t b = 0; b < n_seq * c->nb; b++) c->table[b] = (int32_t)b;
    nl_rng g;
    nl_rng_seed(&g, 9);
    for (int64_t b = n_seq * c->nb - 1; b > 0; b--) {
        int64_t j = (int64_t)(nl_rng_float(&g) * (float)(b + 1)) % (b + 1);
        int32_t t = c->table[b];
        c->table[b] = c->table[j], c->table[j] = t;
    }
    for (int64_t i = 0; i < D * m->QKV; i++) c->run.qkv[i] = nl_rng_float(&g) - 0.5f;
    c->D = n_seq; /* every sequence's K/V */
    dec_fill(c, n_pos, c->fill);
    c->D = D;
    return NL_OK;
}

static void dec_close(dec_ctx *c) {
    nl_free(c->table);
    nl_free(c->fill);
    nl_runner_free(&c->run);
    nl_kvcache_free(&c->kv);
}

/* The decode-row rates at D rows, from steps at positions p0 and p1: a line through the two
 * (the fixed part per (token, head) and the cost per position attended). */
static nl_status measure_decode_d(const nl_model *m, int64_t L, const float *weights, size_t weight_floats,
                                  const nl_machine_opts *o, int threads, int kv, int di, nl_cpu_rates *r) {
    const int64_t D = nl_cpu_m[di], bs = 16;
    const nl_kv_dtype dt = kv ? NL_KV_INT8 : NL_KV_FP32;
    double per_pos = (double)nl_kvcache_block_bytes(L, m->KVH, m->hd, dt, bs) / (double)bs;
    int64_t p1 = (int64_t)(DEC_POOL_BYTES / (per_pos * (double)D)) - bs;
    p1 = p1 > DEC_POS1 ? DEC_POS1 : p1;
    if (p1 > m->arch.seq_len - 1) p1 = m->arch.seq_len - 1;
    const int64_t p0 = DEC_POS0 < p1 / 2 ? DEC_POS0 : p1 / 2;
    if (p0 < 1)
        return nl_fail(NL_ERR_INVALID, "bench machine: model '%s' is too large for the decode probe", m->arch.name);
    dec_ctx c;
    nl_status rc = dec_open(&c, m, L, dt, D, D, p1 + 1, weights, weight_floats, o, threads);
    if (!rc) {
        double a0, a1, r0, r1;
        dec_time(&c, o, p0, &a0, &r0);
        dec_time(&c, o, p1, &a1, &r1);
        double slope = (a1 - a0) / (double)(p1 - p0);
        if (!(slope > 0)) slope = a1 / (double)(p1 + 1);
        double fixed = a0 - slope * (double)(p0 + 1);
        r->attn_pos_s[kv][di] = slope;
        r->attn_row_s[kv][di] = fixed > 0 ? fixed : 0;
        r->rope_kv_s[kv][di] = 0.5 * (r0 + r1);
    }
    dec_close(&c);
    return rc;
}

/* RoPE + KV store per token and layer of a prompt chunk: 64 consecutive positions of one
 * sequence, stored into blocks the weights' footprint has been read over since. */
static nl_status measure_chunk_rows(const nl_model *m, int64_t L, const float *weights, size_t weight_floats,
                                    const nl_machine_opts *o, int threads, nl_cpu_rates *r) {
    const int64_t rows = 64;
    dec_ctx c;
    nl_status rc = dec_open(&c, m, L, NL_KV_FP32, rows, 1, rows, weights, weight_floats, o, threads);
    if (!rc) {
        double a = 0;
        c.chunk = 1;
        dec_time(&c, o, 0, &a, &r->rope_kv_chunk_s);
    }
    dec_close(&c);
    return rc;
}

/* The decode-row rates at D = 1, 8, 32 (for each KV format of o->kv_formats) and a chunk's RoPE +
 * KV store for L layers of m's shape,
 * with a buffer the size of the fp32 weights of L layers (at most DEC_POOL_BYTES) read between
 * layers. */
static nl_status measure_decode_rows(const nl_model *m, int64_t L, const nl_machine_opts *o, int threads,
                                     nl_cpu_rates *r) {
    double wb = 4.0 * (double)L * (double)(m->QKV * m->C + m->C * m->NH * m->hd + 3 * m->H * m->C);
    size_t wf = (size_t)((wb < DEC_POOL_BYTES ? wb : DEC_POOL_BYTES) / sizeof(float));
    float *w = nl_malloc(wf * sizeof(float), "decode probe weight footprint");
    if (!w) return NL_ERR_NOMEM;
    for (size_t i = 0; i < wf; i++) w[i] = (float)(i & 255) * 1e-3f;
    nl_status rc = NL_OK;
    for (int kv = 0; kv < 2; kv++)
        for (int di = 0; !rc && (o->kv_formats & (1 << kv)) && di < NL_CPU_NB; di++)
            rc = measure_decode_d(m, L, w, wf, o, threads, kv, di, r);
    if (!rc) rc = measure_chunk_rows(m, L, w, wf, o, threads, r);
    nl_free(w);
    return rc;
}

typedef struct row_ctx {
    const nl_model *m;
    int64_t rows;
    float *x, *xb, *h13, *hact, *rstd;
} row_ctx;

/* What engine.c's forward does per row and layer besides the linears, attention, RoPE and the
 * KV store: norms, residuals, SwiGLU. */
static void run_rows(void *p) {
    row_ctx *c = p;
    const nl_model *m = c->m;
    const int64_t C = m->C, n = c->rows;
    const nl_layer_weights *lw = &m->w.layers[0];
    nl_rmsnorm_forward(c->xb, c->rstd, c->x, lw->rms_att, n, C, 1e-5f);
    for (int64_t i = 0; i < n * C; i++) c->x[i] += c->xb[i];
    nl_rmsnorm_forward(c->xb, c->rstd, c->x, lw->rms_ffn, n, C, 1e-5f);
    nl_swiglu_forward(c->hact, c->h13, n, m->H);
    for (int64_t i = 0; i < n * C; i++) c->x[i] += c->xb[i] * 1e-3f;
}

static nl_status measure_rows(const nl_model *m, const nl_machine_opts *o, nl_cpu_rates *r) {
    const int64_t rows = 64;
    size_t floats = (size_t)(rows * (2 * m->C + 3 * m->H + 1));
    float *buf = nl_calloc(floats, sizeof(float), "row probe buffers");
    if (!buf) return NL_ERR_NOMEM;
    row_ctx c = {m, rows, buf, buf + rows * m->C, NULL, NULL, NULL};
    c.h13 = c.xb + rows * m->C;
    c.hact = c.h13 + rows * 2 * m->H;
    c.rstd = c.hact + rows * m->H;
    for (int64_t i = 0; i < rows * m->C; i++) c.x[i] = (float)((i % 13) - 6) * 0.1f;
    r->row_layer_s = time_calls(run_rows, &c, o) / (double)rows;
    nl_free(buf);
    return NL_OK;
}

/* ---- the engine's own overheads ------------------------------------------------------------------ */

/* Median seconds of a batch-1 decode step of the engine on a random model of arch with
 * `layers` layers (context 32 to 96: attention is small). */
static nl_status engine_step_s(const nl_arch *a, int64_t layers, int threads, const nl_machine_opts *o, double *out) {
    nl_arch s = *a;
    s.n_layers = layers;
    if (s.seq_len < 128) s.seq_len = 128;
    nl_model m;
    NL_TRY(nl_model_init(&m, &s));
    nl_model_init_random(&m, 5);
    nl_engine_opts eo;
    nl_engine_opts_default(&eo);
    eo.threads = threads;
    eo.max_batch = 1;
    eo.max_step_tokens = 64;
    eo.kv_blocks = 16;
    nl_engine *e = NULL;
    nl_status rc = nl_engine_open_model(&e, &m, NULL, &eo);
    double v[128];
    int n = 0;
    if (!rc) {
        int32_t prompt[32];
        for (int i = 0; i < 32; i++) prompt[i] = i % (int)s.vocab_size;
        nl_sampling sp;
        nl_sampling_default(&sp);
        sp.temperature = 0;
        sp.ignore_eos = 1;
        sp.max_tokens = 64;
        uint64_t id;
        rc = nl_engine_submit(e, prompt, 32, &sp, &id);
        int64_t rows = 0;
        if (!rc) rc = nl_engine_step(e, &rows); /* the prefill */
        while (!rc && nl_engine_busy(e) && n < 63) {
            double t0 = nl_machine_clock_s(o);
            rc = nl_engine_step(e, &rows);
            v[n++] = nl_machine_clock_s(o) - t0;
        }
    }
    nl_engine_close(e);
    nl_model_free(&m);
    if (!rc && n < 8) rc = nl_fail(NL_ERR_INVALID, "bench machine: the engine probe ran only %d steps", n);
    if (!rc) *out = nl_median(v + 4, (size_t)(n - 4)); /* the first steps warm the caches */
    return rc;
}

/* The engine's residual at batch 1 beyond the linears, attention and per-row work the rates
 * above predict, on 1- and 3-layer models of arch's dims: per layer (the slope) and per step
 * (the rest). The two models run in turn three times and each step time is the median of its
 * three: a residual is a small difference of large times, and one run slowed by another process
 * would otherwise pass whole into every prediction. Clamped at 0 (noise). */
static nl_status measure_overheads(const nl_arch *a, int threads, const nl_machine_opts *o, nl_cpu_rates *r) {
    double v1[3], v3[3];
    for (int k = 0; k < 3; k++) {
        NL_TRY(engine_step_s(a, 1, threads, o, &v1[k]));
        NL_TRY(engine_step_s(a, 3, threads, o, &v3[k]));
    }
    double t1 = nl_median(v1, 3), t3 = nl_median(v3, 3);
    if (!o->predict_step_s) return NL_OK;
    nl_arch a1 = *a, a3 = *a;
    a1.n_layers = 1;
    a3.n_layers = 3;
    nl_cpu_rates z = *r;
    z.step_overhead_s = z.layer_overhead_s = 0;
    double ctx = 64; /* the probe's mean context */
    double p1 = o->predict_step_s(&a1, &z, ctx);
    double p3 = o->predict_step_s(&a3, &z, ctx);
    double layer = ((t3 - t1) - (p3 - p1)) / 2;
    r->layer_overhead_s = layer > 0 ? layer : 0;
    double step = t1 - p1 - r->layer_overhead_s;
    r->step_overhead_s = step > 0 ? step : 0;
    return NL_OK;
}

nl_status nl_machine_measure(const nl_arch *arch, const nl_machine_opts *opts, nl_cpu_rates *out) {
    memset(out, 0, sizeof *out);
    nl_machine_opts o;
    if (opts)
        o = *opts;
    else
        nl_machine_opts_default(&o);
    if (o.repeats < 1) o.repeats = 1;
    if (o.bw_bytes < ((size_t)1 << 20)) o.bw_bytes = (size_t)1 << 20;
    if (arch->dim < 1 || arch->n_layers < 1 || arch->n_heads < 1 || arch->n_kv_heads < 1 || arch->hidden_dim < 1 ||
        arch->vocab_size < 1 || arch->n_experts > 0)
        return nl_fail(NL_ERR_INVALID, "bench machine: model '%s' is not a dense transformer shape", arch->name);
    int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
    if (o.thread_cpu_time && threads != 1)
        return nl_fail(NL_ERR_INVALID, "bench machine: the thread CPU clock needs 1 thread, not %d", threads);
    out->threads = threads;
    snprintf(out->name, sizeof out->name, "cpu-%dt", threads);
    NL_TRY(measure_bw(&o, threads, out));
    NL_TRY(measure_gemm(arch, &o, threads, out));
    NL_TRY(measure_chunk_attention(arch, &o, threads, out));
    nl_arch one = *arch; /* one layer: the shapes and RoPE tables (reaching the decode probe's positions) */
    one.n_layers = 1;
    if (one.seq_len < DEC_POS1 + 1) one.seq_len = DEC_POS1 + 1;
    nl_model m;
    NL_TRY(nl_model_init(&m, &one));
    nl_model_init_random(&m, 6);
    nl_status rc = measure_rows(&m, &o, out);
    if (!rc) rc = measure_decode_rows(&m, arch->n_layers, &o, threads, out);
    nl_model_free(&m);
    NL_TRY(rc);
    if (!(o.formats & 1)) /* the overhead probe runs fp32 weights */
        return nl_fail(NL_ERR_INVALID, "bench machine: fp32 must be measured (the engine probe runs fp32 weights)");
    return measure_overheads(arch, threads, &o, out);
}
