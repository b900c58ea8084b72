/* Measures this CPU for the engine's cost model (machine.h, plan_engine.h). */
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

void nl_machine_opts_default(nl_machine_opts *o) {
    memset(o, 0, sizeof *o);
    o->bw_bytes = (size_t)256 << 20;
    o->min_time_s = 0.05;
    o->repeats = 5;
    o->formats = 7;
}

double nl_machine_clock_s(const nl_machine_opts *o) {
    if (!o || !o->thread_cpu_time) return nl_time_s();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
    r->read_bw_1t = median_of(v1, reps);
    r->read_bw_nt = median_of(vn, reps);
    nl_free(buf);
    return NL_OK;
}

/* ---- the engine's linear kernel ------------------------------------------------------------------ */

/* Times fn(ctx) until min_time_s has passed; seconds per call, median of `repeats` timings. */
typedef void (*timed_fn)(void *ctx);
static double time_calls(timed_fn fn, void *ctx, const nl_machine_opts *o) {
    fn(ctx); /* warm-up */
    double v[32];
    int reps = o->repeats < 32 ? o->repeats : 32;
    for (int k = 0; k < reps; k++) {
        int calls = 0;
        double t0 = nl_machine_clock_s(o), dt;
        do {
            fn(ctx);
            calls++;
        } while ((dt = nl_machine_clock_s(o) - t0) < o->min_time_s);
        v[k] = dt / calls;
    }
    return median_of(v, reps);
}

typedef struct lin_ctx {
    nl_mv_weight *w; /* (L, 4) */
    int64_t n_w, m;
    float *x, *y;
    int threads;
} lin_ctx;

static void run_linears(void *p) {
    lin_ctx *c = p;
    for (int64_t i = 0; i < c->n_w; i++) nl_mv_forward(&c->w[i], c->x, c->m, c->y, c->threads);
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
        for (int i = 0; !rc && i < NL_CPU_NM; i++) {
            lin_ctx c = {w, 4 * L, nl_cpu_m[i], x, y, threads};
            r->gemm[f][i] = flops_per_row * (double)nl_cpu_m[i] / time_calls(run_linears, &c, o);
        }
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
    int32_t *table; /* (rows, nb): each row its own sequence, as in a decode batch */
    int64_t rows, pos, NH, hd, nb;
    int shared; /* 1: every row reads row 0's sequence (a prompt chunk) */
    float *q, *out, *scratch;
    int64_t scratch_floats; /* per thread */
    int threads;
} attn_ctx;

/* The engine's attention loop (engine.c forward_rows): (row, head) pairs over the threads, or for
 * a prompt chunk (shared) (tile, head) pairs: the rows are one tile of positions pos - rows + 1 ..
 * pos of row 0's sequence. */
static void run_attention(void *p) {
    attn_ctx *c = p;
    const int64_t pairs = (c->shared ? 1 : c->rows) * c->NH, qkv = c->NH * c->hd;
#pragma omp parallel num_threads(c->threads)
    {
        float *scratch = c->scratch + (int64_t)omp_get_thread_num() * c->scratch_floats;
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < pairs; k++) {
            if (c->shared) {
                nl_kvcache_attend_rows(c->kv, c->table, 0, c->pos - c->rows + 1, c->rows, c->q, qkv, c->NH, k,
                                       c->out + k * c->hd, qkv, scratch);
                continue;
            }
            int64_t i = k / c->NH, h = k % c->NH;
            nl_kvcache_attend_head(c->kv, c->table + (c->shared ? 0 : i) * c->nb, 0, c->pos, c->q + i * c->NH * c->hd,
                                   c->NH, h, c->out + i * c->NH * c->hd + h * c->hd, scratch);
        }
    }
}

/* Seconds per (token, head) of attention over pos + 1 positions (the engine's loop over 8 tokens
 * of 8 sequences, each with its own blocks). */
static nl_status attention_s(const nl_arch *a, const nl_machine_opts *o, int threads, int64_t pos, int shared,
                             double *out) {
    const int64_t NH = a->n_heads, KVH = a->n_kv_heads, hd = nl_arch_head_dim(a), rows = 8, bs = 16;
    const int64_t nb = (pos + bs) / bs;
    nl_kvcache kv;
    NL_TRY(nl_kvcache_init(&kv, 1, KVH, hd, NL_KV_FP32, bs, rows * nb));
    int32_t *table = nl_malloc((size_t)(rows * nb) * sizeof(int32_t), "attention probe table");
    const int64_t scratch_floats = nl_kvcache_attend_scratch(shared ? rows : 1, pos + 1, hd);
    float *q =
        nl_malloc((size_t)(rows * NH * hd * 2 + (int64_t)threads * scratch_floats + 2 * KVH * hd) * sizeof(float),
                  "attention probe");
    if (!q || !table) {
        nl_free(q);
        nl_free(table);
        nl_kvcache_free(&kv);
        return NL_ERR_NOMEM;
    }
    for (int64_t b = 0; b < rows * nb; b++) table[b] = nl_kvcache_alloc(&kv);
    float *out_h = q + rows * NH * hd, *scratch = out_h + rows * NH * hd,
          *k = scratch + (int64_t)threads * scratch_floats;
    nl_rng g;
    nl_rng_seed(&g, 4);
    for (int64_t i = 0; i < rows * NH * hd; i++) q[i] = nl_rng_float(&g) - 0.5f;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t t = 0; t <= pos; t++) {
            for (int64_t j = 0; j < 2 * KVH * hd; j++) k[j] = nl_rng_float(&g) - 0.5f;
            nl_kvcache_store(&kv, table + i * nb, 0, t, k, k + KVH * hd);
        }
    attn_ctx c = {&kv, table, rows, pos, NH, hd, nb, shared, q, out_h, scratch, scratch_floats, threads};
    *out = time_calls(run_attention, &c, o) / (double)(rows * NH);
    nl_free(q);
    nl_free(table);
    nl_kvcache_free(&kv);
    return NL_OK;
}

/* A line through two contexts: the fixed cost per (token, head) and the FLOP rate beyond it. */
static nl_status measure_attention(const nl_arch *a, const nl_machine_opts *o, int threads, nl_cpu_rates *r) {
    const int64_t p0 = 31, p1 = 511;
    double t0 = 0, t1 = 0;
    NL_TRY(attention_s(a, o, threads, p0, 0, &t0));
    NL_TRY(attention_s(a, o, threads, p1, 0, &t1));
    double flops_per_pos = 4.0 * (double)nl_arch_head_dim(a); /* scores and weighted sum, one head */
    double slope = (t1 - t0) / (double)(p1 - p0);
    if (!(slope > 0)) slope = t1 / (double)(p1 + 1);
    r->attn_flops = flops_per_pos / slope;
    double fixed = t0 - slope * (double)(p0 + 1);
    r->attn_call_s = fixed > 0 ? fixed : 0;
    double th = 0; /* the tokens of a chunk attend as one tile over one sequence's K/V */
    NL_TRY(attention_s(a, o, threads, 255, 1, &th));
    double per = th - r->attn_call_s;
    r->attn_flops_chunk = per > 0 ? flops_per_pos * 256 / per : r->attn_flops;
    return NL_OK;
}

typedef struct row_ctx {
    const nl_model *m;
    nl_kvcache *kv;
    int32_t *table;
    int64_t rows;
    float *x, *xb, *qkv, *h13, *hact, *rstd;
} row_ctx;

/* What engine.c's forward does per row and layer besides the linears and attention. */
static void run_rows(void *p) {
    row_ctx *c = p;
    const nl_model *m = c->m;
    const int64_t C = m->C, n = c->rows, half = m->hd / 2;
    const nl_layer_weights *lw = &m->w.layers[0];
    nl_rmsnorm_forward(c->xb, c->rstd, c->x, lw->rms_att, n, C, 1e-5f);
    for (int64_t i = 0; i < n; i++) {
        float *q = c->qkv + i * m->QKV;
        nl_rope_apply(q, m->rope_cos + i * half, m->rope_sin + i * half, 1, 1, m->NH + m->KVH, m->hd, m->QKV, 0);
        nl_kvcache_store(c->kv, c->table, 0, i, q + m->NH * m->hd, q + (m->NH + m->KVH) * m->hd);
    }
    for (int64_t i = 0; i < n * C; i++) c->x[i] += c->xb[i];
    nl_rmsnorm_forward(c->xb, c->rstd, c->x, lw->rms_ffn, n, C, 1e-5f);
    nl_swiglu_forward(c->hact, c->h13, n, m->H);
    for (int64_t i = 0; i < n * C; i++) c->x[i] += c->xb[i] * 1e-3f;
}

static nl_status measure_rows(const nl_model *m, const nl_machine_opts *o, nl_cpu_rates *r) {
    const int64_t rows = 64, bs = 16;
    nl_kvcache kv;
    NL_TRY(nl_kvcache_init(&kv, 1, m->KVH, m->hd, NL_KV_FP32, bs, rows / bs));
    int32_t table[64];
    for (int64_t b = 0; b < rows / bs; b++) table[b] = nl_kvcache_alloc(&kv);
    size_t floats = (size_t)(rows * (2 * m->C + m->QKV + 3 * m->H + 1));
    float *buf = nl_calloc(floats, sizeof(float), "row probe buffers");
    if (!buf) {
        nl_kvcache_free(&kv);
        return NL_ERR_NOMEM;
    }
    row_ctx c = {m, &kv, table, rows, buf, buf + rows * m->C, buf + 2 * rows * m->C, NULL, NULL, NULL};
    c.h13 = c.qkv + rows * m->QKV;
    c.hact = c.h13 + rows * 2 * m->H;
    c.rstd = c.hact + rows * m->H;
    for (int64_t i = 0; i < rows * m->C; i++) c.x[i] = (float)((i % 13) - 6) * 0.1f;
    r->row_layer_s = time_calls(run_rows, &c, o) / (double)rows;
    nl_free(buf);
    nl_kvcache_free(&kv);
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
    if (!rc) *out = median_of(v + 4, n - 4); /* the first steps warm the caches */
    return rc;
}

/* The engine's residual at batch 1 beyond the linears, attention and per-row work the rates
 * above predict, on 1- and 3-layer models of arch's dims: per layer (the slope) and per step
 * (the rest). Clamped at 0 (noise). */
static nl_status measure_overheads(const nl_arch *a, int threads, const nl_machine_opts *o, nl_cpu_rates *r) {
    double t1 = 0, t3 = 0;
    NL_TRY(engine_step_s(a, 1, threads, o, &t1));
    NL_TRY(engine_step_s(a, 3, threads, o, &t3));
    nl_engine_plan_req q;
    nl_engine_plan_req_default(&q);
    q.arch = *a;
    q.arch.n_layers = 1;
    nl_cpu_rates z = *r;
    z.step_overhead_s = z.layer_overhead_s = 0;
    double ctx = 64; /* the probe's mean context */
    double p1 = nl_plan_engine_step_s(&q, &z, 1, 1, ctx, 0);
    q.arch.n_layers = 3;
    double p3 = nl_plan_engine_step_s(&q, &z, 1, 1, ctx, 0);
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
    NL_TRY(measure_attention(arch, &o, threads, out));
    nl_arch one = *arch;
    one.n_layers = 1;
    if (one.seq_len < 128) one.seq_len = 128;
    nl_model m;
    NL_TRY(nl_model_init(&m, &one));
    nl_model_init_random(&m, 6);
    nl_status rc = measure_rows(&m, &o, out);
    nl_model_free(&m);
    NL_TRY(rc);
    if (!(o.formats & 1)) /* the overhead probe runs fp32 weights */
        return nl_fail(NL_ERR_INVALID, "bench machine: fp32 must be measured (the engine probe runs fp32 weights)");
    return measure_overheads(arch, threads, &o, out);
}
