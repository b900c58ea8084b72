/* The measurements behind `nanolm collectives` (nanolm/coll_bench.h): the course's
 * reduce-scatter + all-gather example, every collective timed nccl-tests style, and the
 * alpha-beta fits. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/coll_bench.h"

/* ---- the course example ----------------------------------------------------------------------- */

static void store(void *buf, nl_comm_dtype dt, size_t i, float v) {
    if (dt == NL_COMM_F32)
        ((float *)buf)[i] = v;
    else {
        uint32_t u;
        memcpy(&u, &v, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
    } /* small integers: exact */
}

static float load(const void *buf, nl_comm_dtype dt, size_t i) {
    if (dt == NL_COMM_F32) return ((const float *)buf)[i];
    uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void nl_coll_demo_free(nl_coll_demo *d) {
    nl_free(d->rows);
    d->rows = NULL;
}

/* This rank's row: the value after reduce-scatter, the counters, then the numbers before and after. */
static void demo_row(double *me, size_t n, nl_comm_dtype dt, const char *holds, const char *mine, const char *full,
                     const nl_comm_stats *after_rs, const nl_comm_stats *after_ag) {
    size_t es = nl_comm_dtype_bytes(dt);
    me[0] = load(mine, dt, 0);
    me[1] = (double)after_rs->coll[NL_COMM_OP_REDUCE_SCATTER].sent_bytes / es;
    me[2] = (double)after_ag->coll[NL_COMM_OP_ALL_GATHER].sent_bytes / es;
    me[3] = (double)(after_rs->coll[NL_COMM_OP_REDUCE_SCATTER].recv_bytes +
                     after_ag->coll[NL_COMM_OP_ALL_GATHER].recv_bytes) /
            es;
    me[4] = (double)nl_comm_stats_sent_bytes(after_ag);
    for (size_t i = 0; i < n; i++) {
        me[NL_COLL_DEMO_NF + i] = load(holds, dt, i);
        me[NL_COLL_DEMO_NF + n + i] = load(full, dt, i);
    }
}

nl_status nl_coll_demo_run(nl_comm *w, nl_comm_impl impl, nl_comm_dtype dt, void (*between)(void *), void *user,
                           nl_coll_demo *out) {
    int p = nl_comm_size(w), r = nl_comm_rank(w);
    size_t n = (size_t)p;
    char holds[64], full[64], mine[8];
    if (p > 16) return nl_fail(NL_ERR_INVALID, "collectives demo: at most 16 ranks, got %d", p);
    for (size_t i = 0; i < n; i++) store(holds, dt, i, (float)(r * p + (int)i + 1));
    nl_comm_reset_stats(w);
    NL_TRY(nl_comm_reduce_scatter(w, holds, mine, n, dt, impl));
    nl_comm_stats after_rs, after_ag;
    nl_comm_get_stats(w, &after_rs);
    if (between) between(user);
    NL_TRY(nl_comm_all_gather(w, mine, full, n, dt, impl));
    nl_comm_get_stats(w, &after_ag);
    /* Every rank's row, assembled by sums (native, after the counters above were read). */
    out->p = p;
    out->row_len = NL_COLL_DEMO_NF + 2 * n;
    out->rows = nl_calloc((size_t)p * out->row_len, sizeof(double), "collectives demo report");
    if (!out->rows) return NL_ERR_NOMEM;
    demo_row(out->rows + (size_t)r * out->row_len, n, dt, holds, mine, full, &after_rs, &after_ag);
    for (size_t k = 0; k < (size_t)p * out->row_len; k++) NL_TRY(nl_comm_sum_double(w, &out->rows[k]));
    return NL_OK;
}

/* ---- the benchmark ------------------------------------------------------------------------------ */

const nl_comm_op nl_coll_bench_ops[NL_COLL_BENCH_OPS] = {NL_COMM_OP_ALL_REDUCE, NL_COMM_OP_REDUCE_SCATTER,
                                                         NL_COMM_OP_ALL_GATHER, NL_COMM_OP_BROADCAST,
                                                         NL_COMM_OP_REDUCE,     NL_COMM_OP_ALL_TO_ALL};

nl_status nl_coll_bench_parse_ops(const char *list, nl_coll_bench_opts *o) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < NL_COLL_BENCH_OPS && strcmp(tok, nl_comm_op_name(nl_coll_bench_ops[k]))) k++;
        if (o->nops >= NL_COLL_BENCH_OPS || k == NL_COLL_BENCH_OPS)
            return nl_fail(NL_ERR_INVALID,
                           "unknown --ops entry '%s' (all-reduce, reduce-scatter, all-gather, broadcast, reduce, "
                           "all-to-all)",
                           tok);
        o->ops[o->nops++] = nl_coll_bench_ops[k];
    }
    return NL_OK;
}

void nl_coll_bench_defaults(nl_coll_bench_opts *o, size_t min_bytes, size_t max_bytes, size_t step) {
    if (!o->nops)
        for (int k = 0; k < NL_COLL_BENCH_OPS; k++) o->ops[o->nops++] = nl_coll_bench_ops[k];
    if (!o->nsizes)
        for (size_t sz = min_bytes; sz <= max_bytes && o->nsizes < NL_COLL_BENCH_SIZES; sz *= step)
            o->sizes[o->nsizes++] = sz;
}

/* nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md of nccl-tests). */
static double busbw_factor(nl_comm_op k, int p) {
    switch (k) {
    case NL_COMM_OP_ALL_REDUCE: return 2.0 * (p - 1) / p;
    case NL_COMM_OP_REDUCE_SCATTER:
    case NL_COMM_OP_ALL_GATHER:
    case NL_COMM_OP_ALL_TO_ALL: return (double)(p - 1) / p;
    default: return 1.0;
    }
}

static nl_status run_op(nl_comm *w, nl_comm_op k, char *a, char *b, size_t n, nl_comm_dtype dt, nl_comm_impl impl) {
    int p = nl_comm_size(w), r = nl_comm_rank(w);
    size_t es = nl_comm_dtype_bytes(dt);
    switch (k) {
    case NL_COMM_OP_ALL_REDUCE: return nl_comm_all_reduce(w, a, n, dt, impl);
    case NL_COMM_OP_REDUCE_SCATTER: return nl_comm_reduce_scatter(w, a, b, n, dt, impl);
    case NL_COMM_OP_ALL_GATHER: return nl_comm_all_gather(w, a + nl_comm_chunk_offset(n, p, r) * es, a, n, dt, impl);
    case NL_COMM_OP_BROADCAST: return nl_comm_broadcast(w, a, n, dt, 0, impl);
    case NL_COMM_OP_REDUCE: return nl_comm_reduce(w, a, b, n, dt, 0, impl);
    case NL_COMM_OP_ALL_TO_ALL: return nl_comm_all_to_all(w, a, b, n / (size_t)p, dt, impl);
    default: return nl_fail(NL_ERR_INVALID, "bench: no such collective");
    }
}

/* Times one (op, size, impl): a warm-up that sizes the repetitions (same count on every rank),
 * then the median over repetitions of the slowest rank. */
static nl_status bench_one(nl_comm *w, const nl_coll_bench_opts *o, nl_comm_op op, size_t n, nl_comm_impl impl, char *a,
                           char *b, nl_coll_bench_row *row) {
    double times[1000];
    double t0 = nl_time_s();
    NL_TRY(run_op(w, op, a, b, n, o->dt, impl));
    double tw = nl_time_s() - t0;
    NL_TRY(nl_comm_max_double(w, &tw));
    int reps = o->reps ? o->reps : (int)fmin(20, fmax(3, ceil(0.3 / fmax(tw, 1e-9))));
    if (reps > 1000) reps = 1000;
    for (int k = 0; k < reps; k++) {
        if (o->before_rep) o->before_rep(o->user);
        NL_TRY(nl_comm_barrier(w));
        t0 = nl_time_s();
        NL_TRY(run_op(w, op, a, b, n, o->dt, impl));
        times[k] = nl_time_s() - t0;
        NL_TRY(nl_comm_max_double(w, &times[k]));
    }
    *row = (nl_coll_bench_row){.op = op, .impl = impl, .bytes = n * nl_comm_dtype_bytes(o->dt), .reps = reps};
    row->time_s = nl_median(times, (size_t)reps);
    row->algbw = (double)row->bytes / row->time_s;
    row->busbw = row->algbw * busbw_factor(op, nl_comm_size(w));
    return NL_OK;
}

/* Small values: sums stay finite over all repetitions. */
static void bench_fill(char *a, size_t n, nl_comm_dtype dt, int rank) {
    for (size_t i = 0; i < n; i++) {
        if (dt == NL_COMM_F32)
            ((float *)a)[i] = 1e-6f * (float)((i + (size_t)rank) % 7);
        else
            ((uint16_t *)a)[i] = 0x3400; /* bf16 1.2e-7 */
    }
}

static nl_status bench_all(nl_comm *w, const nl_coll_bench_opts *o, char *a, char *b, nl_coll_bench_row *rows,
                           int *nrows) {
    size_t es = nl_comm_dtype_bytes(o->dt);
    int p = nl_comm_size(w);
    for (int oi = 0; oi < o->nops; oi++)
        for (int si = 0; si < o->nsizes; si++)
            for (int ii = 0; ii < 2; ii++) {
                if (!(o->impl_mask & (1 << ii))) continue;
                size_t n = o->sizes[si] / es;
                if (o->ops[oi] == NL_COMM_OP_ALL_TO_ALL) n -= n % (size_t)p;
                if (n == 0) continue;
                NL_TRY(bench_one(w, o, o->ops[oi], n, ii ? NL_COMM_NATIVE : NL_COMM_OURS, a, b, &rows[*nrows]));
                (*nrows)++;
            }
    return NL_OK;
}

nl_status nl_coll_bench_run(nl_comm *w, const nl_coll_bench_opts *o, nl_coll_bench_row **rows, int *nrows) {
    size_t es = nl_comm_dtype_bytes(o->dt), maxn = 0;
    for (int s = 0; s < o->nsizes; s++) maxn = o->sizes[s] / es > maxn ? o->sizes[s] / es : maxn;
    char *a = nl_malloc(maxn * es + 64, "bench buffer"), *b = nl_malloc(maxn * es + 64, "bench buffer");
    *rows = nl_calloc((size_t)o->nops * (size_t)o->nsizes * 2 + 1, sizeof **rows, "bench rows");
    *nrows = 0;
    nl_status st = a && b && *rows ? NL_OK : NL_ERR_NOMEM;
    if (!st) {
        bench_fill(a, maxn, o->dt, nl_comm_rank(w));
        memcpy(b, a, maxn * es);
        st = bench_all(w, o, a, b, *rows, nrows);
    }
    nl_free(a);
    nl_free(b);
    return st;
}

double nl_coll_bench_ratio(const nl_coll_bench_row *rows, int nrows, int k) {
    for (int j = 0; j < nrows; j++)
        if (rows[k].impl == NL_COMM_OURS && rows[j].impl == NL_COMM_NATIVE && rows[j].op == rows[k].op &&
            rows[j].bytes == rows[k].bytes)
            return rows[k].busbw / rows[j].busbw;
    return NAN;
}

/* Weighted least squares t = alpha + beta * x with weights 1/t^2 (relative errors), constrained
 * to alpha >= 0 and beta >= 0 (a negative latency would say that the small messages were not
 * resolved, so the fit says so instead of printing it). */
static void fit_alpha_beta(const double *x, const double *t, int m, nl_linfit *f) {
    double w[64];
    for (int i = 0; i < m; i++) w[i] = 1.0 / (t[i] * t[i]);
    if (m < 2 || nl_linfit_nonneg(x, t, w, (size_t)m, f))
        *f = (nl_linfit){.intercept = m ? t[0] : 0, .r2 = 0, .clamped = 1};
}

int nl_coll_bench_fits(const nl_coll_bench_opts *o, const nl_coll_bench_row *rows, int nrows, int p, nl_coll_fit *fits,
                       int *link) {
    int nf = 0;
    *link = -1;
    for (int oi = 0; oi < o->nops; oi++)
        for (int ii = 0; ii < 2; ii++) {
            double x[64], t[64];
            int m = 0;
            for (int k = 0; k < nrows && m < 64; k++)
                if (rows[k].op == o->ops[oi] && (int)rows[k].impl == ii) {
                    x[m] = busbw_factor(o->ops[oi], p) * (double)rows[k].bytes;
                    t[m++] = rows[k].time_s;
                }
            if (!m) continue;
            fits[nf] = (nl_coll_fit){.op = o->ops[oi], .impl = ii ? NL_COMM_NATIVE : NL_COMM_OURS};
            fit_alpha_beta(x, t, m, &fits[nf].f);
            if (o->ops[oi] == NL_COMM_OP_ALL_REDUCE && (*link < 0 || ii == 1)) *link = nf; /* native first */
            nf++;
        }
    return nf;
}
