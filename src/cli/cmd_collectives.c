/* nanolm collectives demo|bench: the course's reduce-scatter + all-gather example, and a
 * benchmark of every collective (ours vs native MPI) with nccl-tests' algbw/busbw and an α–β fit.
 * Runs as one rank without mpirun, or as N ranks under `mpirun -np N`. Rank 0 prints. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/comm.h"
#include "nanolm/linfit.h"
#include "report.h"

/* ---- shared option parsing ---------------------------------------------------------------- */

/* Bytes with binary suffixes: 1K = 1024, 16M, 1G. */
static int parse_bytes(const char *opt, const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    double m = 1;
    if (end == s || v <= 0) return nl_cli_usage_error("invalid size '%s' for %s (examples: 1K, 16M, 256M)", s, opt);
    if (*end == 'K' || *end == 'k')
        m = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        m = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        m = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || v * m > 2e9)
        return nl_cli_usage_error("invalid size '%s' for %s (examples: 1K, 16M, 256M; at most 1G)", s, opt);
    *out = (size_t)(v * m);
    return 0;
}

/* Fault injection for the fault tests: this rank leaves without a word at a chosen point. */
typedef struct fault {
    int rank, after;
    const char *how;
} fault;
static int parse_fault(const char *s, fault *f) {
    /* RANK[:exit|_exit|segv|kill] */
    char *end;
    long r = strtol(s, &end, 10);
    if (end == s || r < 0) return nl_cli_usage_error("invalid --inject-fault '%s' (RANK[:exit|_exit|segv|kill])", s);
    f->rank = (int)r;
    f->how = "exit";
    if (*end == ':') {
        if (!strcmp(end + 1, "exit") || !strcmp(end + 1, "_exit") || !strcmp(end + 1, "segv") ||
            !strcmp(end + 1, "kill"))
            f->how = end + 1;
        else
            return nl_cli_usage_error("invalid --inject-fault '%s' (RANK[:exit|_exit|segv|kill])", s);
    } else if (*end) {
        return nl_cli_usage_error("invalid --inject-fault '%s' (RANK[:exit|_exit|segv|kill])", s);
    }
    return 0;
}
static void maybe_fault(const fault *f, int rank) {
    if (f->rank != rank) return;
    if (!strcmp(f->how, "kill")) raise(SIGKILL);
    if (!strcmp(f->how, "segv")) raise(SIGSEGV);
    if (!strcmp(f->how, "_exit")) _exit(3);
    exit(3);
}

static int comm_start(nl_comm **w) {
    if (nl_comm_init(NULL, NULL)) return nl_cli_fail("collectives: MPI");
    *w = nl_comm_world();
    return 0;
}

/* ---- demo ----------------------------------------------------------------------------------- */

static const char demo_summary[] =
    "The course example: rank r holds (r*P+1, ..., r*P+P); reduce-scatter leaves the sum of\n"
    "column r on rank r, all-gather gives everyone the sums; each rank sends 2(P-1) numbers.\n"
    "Runs as one rank without mpirun, or as P ranks under `mpirun -np P`. Rank 0 prints.";

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

/* The demo's table on rank 0: one row per rank, nf values then the n numbers held and the n after
 * the all-gather (row layout of cmd_demo). */
static int demo_print(const double *row, size_t rl, int nf, int p, size_t n, nl_comm_impl impl, nl_comm_dtype dt,
                      int json) {
    double frac = 2.0 * (p - 1) / p;
    char title[128];
    snprintf(title, sizeof title, "all-reduce = reduce-scatter + all-gather on %d ranks (%s, %s)", p,
             nl_comm_impl_name(impl), nl_comm_dtype_name(dt));
    nl_report *r = nl_report_new("collectives demo");
    nl_report_int(r, "ranks", "", p, NULL);
    nl_report_str(r, "impl", "", nl_comm_impl_name(impl));
    nl_report_str(r, "dtype", "", nl_comm_dtype_name(dt));
    nl_report_int(r, "array_numbers", "", (long long)n, NULL);
    nl_report_num(r, "formula_sent_fraction", "", frac, NULL, NULL);
    nl_report_table(r, "per_rank", title, 11,
                    (const nl_report_col[]){{"rank", "rank", "%-.0f"},
                                            {"holds", "holds", "%g"},
                                            {"after_reduce_scatter", "after reduce-scatter", "%-g"},
                                            {"after_all_gather", "after all-gather", "%g"},
                                            {"sent_numbers_reduce_scatter", "", NULL},
                                            {"sent_numbers_all_gather", "", NULL},
                                            {"sent_numbers", "", NULL},
                                            {NULL, "sent (RS+AG)", NULL},
                                            {"received_numbers", "received", "%-g"},
                                            {"sent_bytes", "", NULL},
                                            {"sent_fraction", "", NULL}});
    for (int q = 0; q < p; q++) {
        const double *x = row + (size_t)q * rl;
        char ss[96];
        snprintf(ss, sizeof ss, "%g + %g = %g", x[1], x[2], x[1] + x[2]);
        nl_report_cell_int(r, q);
        nl_report_cell_nums(r, x + nf, (int)n);
        nl_report_cell_num(r, x[0]);
        nl_report_cell_nums(r, x + nf + n, (int)n);
        nl_report_cell_num(r, x[1]);
        nl_report_cell_num(r, x[2]);
        nl_report_cell_num(r, x[1] + x[2]);
        nl_report_cell_str(r, ss);
        nl_report_cell_num(r, x[3]);
        nl_report_cell_num(r, x[4]);
        nl_report_cell_num(r, (x[1] + x[2]) / (double)n);
        nl_report_row_end(r);
    }
    double s0 = row[1] + row[2];
    nl_report_note(r, "each rank sent %g numbers for an array of %zu: %.3g of the array; formula 2(p-1)/p = %.3g", s0,
                   n, s0 / (double)n, frac);
    return nl_report_print(r, json);
}

static int cmd_demo(int argc, char **argv) {
    int impl_i = 0, dtype_i = 0, json = 0;
    const char *fault_s = NULL;
    nl_opt opts[] = {
        NL_OPT_CHOICE("impl", &impl_i, "ours|native", "ring algorithms on point-to-point, or MPI's own (default ours)"),
        NL_OPT_CHOICE("dtype", &dtype_i, "f32|fp32|bf16", "element type (default f32)"),
        NL_OPT_STR("inject-fault", &fault_s, "RANK[:exit|_exit|segv|kill]",
                   "(testing) that rank fails between the two steps"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"collectives demo",
                       "[mpirun -np P] nanolm collectives demo [--impl ours|native] [--dtype f32|bf16] [--json]",
                       demo_summary,
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_comm_dtype dt = dtype_i == 2 ? NL_COMM_BF16 : NL_COMM_F32;
    fault flt = {-1, 0, "exit"};
    if (fault_s && parse_fault(fault_s, &flt)) return NL_EXIT_USAGE;
    nl_comm_impl impl = impl_i == 1 ? NL_COMM_NATIVE : NL_COMM_OURS;
    nl_comm *w = NULL;
    if (comm_start(&w)) return NL_EXIT_FAIL;
    int p = nl_comm_size(w), r = nl_comm_rank(w);
    size_t n = (size_t)p, es = nl_comm_dtype_bytes(dt);
    char holds[64], full[64], mine[8];
    for (size_t i = 0; i < n; i++) store(holds, dt, i, (float)(r * p + (int)i + 1));
    nl_comm_reset_stats(w);
    if (nl_comm_reduce_scatter(w, holds, mine, n, dt, impl)) {
        rc = nl_cli_fail("reduce-scatter");
        goto out;
    }
    nl_comm_stats after_rs, after_ag;
    nl_comm_get_stats(w, &after_rs);
    if (flt.rank >= 0) maybe_fault(&flt, r);
    if (nl_comm_all_gather(w, mine, full, n, dt, impl)) {
        rc = nl_cli_fail("all-gather");
        goto out;
    }
    nl_comm_get_stats(w, &after_ag);
    /* Collect every rank's row on rank 0 (through the native all-gather of the report, which the
     * counters shown below do not include: they were read before). */
    enum { NF = 5 };
    double *row = nl_calloc((size_t)p * (NF + 2 * (size_t)p), sizeof(double), "collectives demo report");
    if (!row) {
        rc = nl_cli_fail("collectives demo");
        goto out;
    }
    size_t rl = NF + 2 * (size_t)p;
    double *me = row + (size_t)r * rl;
    me[0] = load(mine, dt, 0);
    me[1] = (double)after_rs.coll[NL_COMM_OP_REDUCE_SCATTER].sent_bytes / es;
    me[2] = (double)after_ag.coll[NL_COMM_OP_ALL_GATHER].sent_bytes / es;
    me[3] = (double)(after_rs.coll[NL_COMM_OP_REDUCE_SCATTER].recv_bytes +
                     after_ag.coll[NL_COMM_OP_ALL_GATHER].recv_bytes) /
            es;
    me[4] = (double)nl_comm_stats_sent_bytes(&after_ag);
    for (size_t i = 0; i < n; i++) {
        me[NF + i] = load(holds, dt, i);
        me[NF + n + i] = load(full, dt, i);
    }
    for (int q = 0; q < p; q++) /* everyone contributes its row; the sum assembles the table */
        for (size_t k = 0; k < rl; k++) {
            double v = row[(size_t)q * rl + k];
            if (nl_comm_sum_double(w, &v)) {
                free(row);
                rc = nl_cli_fail("report");
                goto out;
            }
            row[(size_t)q * rl + k] = v;
        }
    if (r == 0) rc = demo_print(row, rl, NF, p, n, impl, dt, json);
    free(row);
out:
    nl_comm_finalize();
    return rc;
}

/* ---- bench ---------------------------------------------------------------------------------- */

static const nl_comm_op bench_ops[] = {NL_COMM_OP_ALL_REDUCE, NL_COMM_OP_REDUCE_SCATTER, NL_COMM_OP_ALL_GATHER,
                                       NL_COMM_OP_BROADCAST,  NL_COMM_OP_REDUCE,         NL_COMM_OP_ALL_TO_ALL};
#define NOPS (sizeof bench_ops / sizeof bench_ops[0])

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

static const char bench_summary[] =
    "Times every collective (ours and MPI's native), nccl-tests style, and fits t = alpha + beta x.\n"
    "Size S is the nccl-tests size: the array of all-reduce/broadcast/reduce, the full array of\n"
    "all-gather and reduce-scatter, the whole send buffer of all-to-all. time is the median over\n"
    "repetitions of the slowest rank; algbw = S/time; busbw = algbw x factor (2(p-1)/p all-reduce,\n"
    "(p-1)/p reduce-scatter, all-gather, all-to-all; 1 broadcast, reduce). The JSON's \"link\" is\n"
    "the measured alpha and bandwidth of all-reduce (native first).";

static int op_from_name(const char *s, nl_comm_op *out) {
    for (size_t k = 0; k < NOPS; k++)
        if (!strcmp(s, nl_comm_op_name(bench_ops[k]))) {
            *out = bench_ops[k];
            return 0;
        }
    return -1;
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

/* The constrained parameter of an alpha-beta fit, "-" when the free fit held. */
static const char *clamp_name(int clamped) { return clamped == 1 ? "beta = 0" : clamped == 2 ? "alpha = 0" : "-"; }

typedef struct bench_row {
    nl_comm_op op;
    nl_comm_impl impl;
    size_t bytes;
    double time_s, algbw, busbw;
    int reps;
} bench_row;

/* Weighted least squares t = alpha + beta * x with weights 1/t^2 (relative errors), x = bus bytes,
 * constrained to alpha >= 0 and beta >= 0 (nl_linfit_nonneg: a negative latency would say that
 * the small messages were not resolved, so the fit says so instead of printing it). With one
 * size only, alpha is that time and beta 0 (clamped). */
static void fit_alpha_beta(const double *x, const double *t, int m, nl_linfit *f) {
    double w[64];
    for (int i = 0; i < m; i++) w[i] = 1.0 / (t[i] * t[i]);
    if (m < 2 || nl_linfit_nonneg(x, t, w, (size_t)m, f))
        *f = (nl_linfit){.intercept = m ? t[0] : 0, .r2 = 0, .clamped = 1};
}

/* The options of collectives bench, after parsing. */
typedef struct bench_args {
    int impl_mask, json, nops, nsizes;
    nl_comm_op ops[NOPS];
    size_t sizes[64];
    int64_t reps;
    nl_comm_dtype dt;
    fault flt;
} bench_args;

/* Splits a ','-separated list into the ops or the sizes. */
static int bench_lists(bench_args *g, const char *ops, const char *sizes) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", ops ? ops : "");
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); ops && tok; tok = strtok_r(NULL, ",", &save)) {
        if (g->nops >= (int)NOPS || op_from_name(tok, &g->ops[g->nops]))
            return nl_cli_usage_error("collectives bench: unknown --ops entry '%s' (all-reduce, reduce-scatter, "
                                      "all-gather, broadcast, reduce, all-to-all)",
                                      tok);
        g->nops++;
    }
    snprintf(buf, sizeof buf, "%s", sizes ? sizes : "");
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); sizes && tok; tok = strtok_r(NULL, ",", &save)) {
        if (g->nsizes >= 64) return nl_cli_usage_error("collectives bench: too many --sizes (at most 64)");
        if (parse_bytes("--sizes", tok, &g->sizes[g->nsizes])) return NL_EXIT_USAGE;
        g->nsizes++;
    }
    return 0;
}

static int bench_parse(int argc, char **argv, bench_args *g) {
    memset(g, 0, sizeof *g);
    g->flt = (fault){-1, 0, "exit"};
    int impl_i = 2, dtype_i = 0;
    int64_t step = 4;
    const char *ops = NULL, *sizes = NULL, *min_s = "1K", *max_s = "256M", *fault_s = NULL;
    nl_opt opts[] = {
        NL_OPT_STR("ops", &ops, "LIST",
                   "all-reduce,reduce-scatter,all-gather,broadcast,reduce,all-to-all (default all)"),
        NL_OPT_CHOICE("impl", &impl_i, "ours|native|both", "which implementation (default both)"),
        NL_OPT_STR("min-bytes", &min_s, "S", "smallest size (default 1K)"),
        NL_OPT_STR("max-bytes", &max_s, "S", "largest size (default 256M)"),
        NL_OPT_INT("step", &step, 2, 1024, "F", "size factor between rows (default 4)"),
        NL_OPT_STR("sizes", &sizes, "LIST", "explicit sizes, e.g. 1M,16M,128M (instead of min/max/step)"),
        NL_OPT_CHOICE("dtype", &dtype_i, "f32|fp32|bf16", "element type (default f32)"),
        NL_OPT_INT("reps", &g->reps, 1, 1000, "N", "timed repetitions per row (default: 3..20, about 0.3 s per row)"),
        NL_OPT_STR("inject-fault", &fault_s, "RANK[:exit|_exit|segv|kill]",
                   "(testing) that rank fails in the middle of the run"),
        NL_OPT_FLAG("json", &g->json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "collectives bench", "[mpirun -np P] nanolm collectives bench [options]", bench_summary, groups, 1, 0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    size_t min_b, max_b;
    if (parse_bytes("--min-bytes", min_s, &min_b) || parse_bytes("--max-bytes", max_s, &max_b)) return NL_EXIT_USAGE;
    if (fault_s && parse_fault(fault_s, &g->flt)) return NL_EXIT_USAGE;
    g->impl_mask = impl_i + 1; /* ours 1, native 2, both 3 */
    g->dt = dtype_i == 2 ? NL_COMM_BF16 : NL_COMM_F32;
    if ((rc = bench_lists(g, ops, sizes))) return rc;
    if (min_b > max_b) return nl_cli_usage_error("collectives bench: --min-bytes is larger than --max-bytes");
    if (!g->nops)
        for (size_t k = 0; k < NOPS; k++) g->ops[g->nops++] = bench_ops[k];
    if (!g->nsizes)
        for (size_t sz = min_b; sz <= max_b && g->nsizes < 64; sz *= (size_t)step) g->sizes[g->nsizes++] = sz;
    return 0;
}

/* Times one (op, size, impl): a warm-up that sizes the repetitions (same count on every rank),
 * then the median over repetitions of the slowest rank. */
static nl_status bench_one(nl_comm *w, const bench_args *g, nl_comm_op op, size_t n, nl_comm_impl impl, char *a,
                           char *b, int *calls, bench_row *row) {
    double times[1000];
    double t0 = nl_time_s();
    NL_TRY(run_op(w, op, a, b, n, g->dt, impl));
    double tw = nl_time_s() - t0;
    NL_TRY(nl_comm_max_double(w, &tw));
    int reps = g->reps ? (int)g->reps : (int)fmin(20, fmax(3, ceil(0.3 / fmax(tw, 1e-9))));
    for (int k = 0; k < reps; k++) {
        if (g->flt.rank >= 0 && ++*calls == 3) maybe_fault(&g->flt, nl_comm_rank(w));
        NL_TRY(nl_comm_barrier(w));
        t0 = nl_time_s();
        NL_TRY(run_op(w, op, a, b, n, g->dt, impl));
        times[k] = nl_time_s() - t0;
        NL_TRY(nl_comm_max_double(w, &times[k]));
    }
    *row = (bench_row){.op = op, .impl = impl, .bytes = n * nl_comm_dtype_bytes(g->dt), .reps = reps};
    row->time_s = nl_median(times, (size_t)reps);
    row->algbw = (double)row->bytes / row->time_s;
    row->busbw = row->algbw * busbw_factor(op, nl_comm_size(w));
    return NL_OK;
}

/* busbw of `ours` over native at the same op and size, or NaN (no such pair). */
static double ratio_vs_native(const bench_row *rows, int nrows, int k) {
    for (int j = 0; j < nrows; j++)
        if (rows[k].impl == NL_COMM_OURS && rows[j].impl == NL_COMM_NATIVE && rows[j].op == rows[k].op &&
            rows[j].bytes == rows[k].bytes)
            return rows[k].busbw / rows[j].busbw;
    return NAN;
}

/* The measured rows: op, size, implementation, median time and bandwidths. */
static void bench_report_rows(nl_report *r, const bench_row *rows, int nrows, int p, nl_comm_dtype dt) {
    char title[160];
    snprintf(title, sizeof title,
             "collectives on %d ranks, %s; time = median of the slowest rank; busbw per nccl-tests", p,
             nl_comm_dtype_name(dt));
    nl_report_table(r, "results", title, 13,
                    (const nl_report_col[]){{"op", "op", NULL},
                                            {"bytes", "", NULL},
                                            {NULL, "bytes", NULL},
                                            {"impl", "impl", NULL},
                                            {"time_s", "", NULL},
                                            {NULL, "time", NULL},
                                            {"algbw_bytes_per_s", "", NULL},
                                            {NULL, "algbw GB/s", "%-.3f"},
                                            {"busbw_bytes_per_s", "", NULL},
                                            {NULL, "busbw GB/s", "%-.3f"},
                                            {"reps", "", NULL},
                                            {"busbw_ratio_vs_native", "", NULL},
                                            {NULL, "ours/native", NULL}});
    for (int k = 0; k < nrows; k++) {
        double ratio = ratio_vs_native(rows, nrows, k);
        char bytes[32], tm[32], rs[32] = "";
        size_t B = rows[k].bytes;
        if (B >= (1u << 20) && B % (1u << 20) == 0)
            snprintf(bytes, sizeof bytes, "%zuM", B >> 20);
        else if (B >= 1024 && B % 1024 == 0)
            snprintf(bytes, sizeof bytes, "%zuK", B >> 10);
        else
            snprintf(bytes, sizeof bytes, "%zu", B);
        double ts = rows[k].time_s;
        if (ts < 1e-3)
            snprintf(tm, sizeof tm, "%.1f us", ts * 1e6);
        else
            snprintf(tm, sizeof tm, "%.2f ms", ts * 1e3);
        if (!isnan(ratio)) snprintf(rs, sizeof rs, "%.2fx", ratio);
        nl_report_cell_str(r, nl_comm_op_name(rows[k].op));
        nl_report_cell_int(r, (long long)B);
        nl_report_cell_str(r, bytes);
        nl_report_cell_str(r, nl_comm_impl_name(rows[k].impl));
        nl_report_cell_num(r, ts);
        nl_report_cell_str(r, tm);
        nl_report_cell_num(r, rows[k].algbw);
        nl_report_cell_num(r, rows[k].algbw / 1e9);
        nl_report_cell_num(r, rows[k].busbw);
        nl_report_cell_num(r, rows[k].busbw / 1e9);
        nl_report_cell_int(r, rows[k].reps);
        if (isnan(ratio))
            nl_report_cell_str(r, NULL);
        else
            nl_report_cell_num(r, ratio);
        nl_report_cell_str(r, rs);
        nl_report_row_end(r);
    }
}

/* The α–β fit per (op, impl), t = alpha + beta * (busbw factor * S), and the measured link. */
static void bench_report_fits(nl_report *r, const bench_args *g, const bench_row *rows, int nrows, int p) {
    nl_report_table(r, "fits", "alpha-beta fit, t = alpha + (busbw factor x S) / bandwidth:", 9,
                    (const nl_report_col[]){{"op", "op", NULL},
                                            {"impl", "impl", NULL},
                                            {"alpha_s", "", NULL},
                                            {NULL, "alpha", NULL},
                                            {"beta_s_per_byte", "", NULL},
                                            {"bandwidth_bytes_per_s", "", NULL},
                                            {NULL, "bandwidth GB/s", "%-.3f"},
                                            {"r2", "R^2", "%-.3f"},
                                            {"clamped", "constrained", NULL}});
    int clamped = 0, have_link = 0;
    nl_linfit link;
    const char *link_src = NULL;
    for (int oi = 0; oi < g->nops; oi++)
        for (int ii = 0; ii < 2; ii++) {
            double x[64], t[64];
            int m = 0;
            for (int k = 0; k < nrows && m < 64; k++)
                if (rows[k].op == g->ops[oi] && (int)rows[k].impl == ii) {
                    x[m] = busbw_factor(g->ops[oi], p) * (double)rows[k].bytes;
                    t[m++] = rows[k].time_s;
                }
            if (!m) continue;
            nl_linfit f;
            fit_alpha_beta(x, t, m, &f);
            clamped += f.clamped != 0;
            char al[32];
            snprintf(al, sizeof al, "%.1f us", f.intercept * 1e6);
            nl_report_cell_str(r, nl_comm_op_name(g->ops[oi]));
            nl_report_cell_str(r, ii ? "native" : "ours");
            nl_report_cell_num(r, f.intercept);
            nl_report_cell_str(r, al);
            nl_report_cell_num(r, f.slope);
            nl_report_cell_num(r, f.slope > 0 ? 1.0 / f.slope : 0);
            nl_report_cell_num(r, f.slope > 0 ? 1e-9 / f.slope : 0.0);
            nl_report_cell_num(r, f.r2);
            nl_report_cell_str(r, clamp_name(f.clamped));
            nl_report_row_end(r);
            if (g->ops[oi] == NL_COMM_OP_ALL_REDUCE && (!have_link || ii == 1)) { /* native first */
                link = f;
                link_src = ii ? "all-reduce native" : "all-reduce ours";
                have_link = 1;
            }
        }
    if (have_link) {
        nl_report_begin_object(r, "link", NULL);
        nl_report_str(r, "source", "", link_src);
        nl_report_int(r, "ranks", "", p, NULL);
        nl_report_num(r, "alpha_s", "", link.intercept, NULL, NULL);
        nl_report_num(r, "bandwidth_bytes_per_s", "", link.slope > 0 ? 1.0 / link.slope : 0, NULL, NULL);
        nl_report_end_object(r);
    }
    if (clamped)
        nl_report_note(r,
                       "\n%d fit(s) constrained: the free fit gave a negative latency or time per byte, so the\n"
                       "times do not follow t = alpha + beta x over these sizes (noise, or too few sizes below\n"
                       "the latency); the constrained line is shown, read its R^2 before trusting it.",
                       clamped);
}

static int cmd_bench(int argc, char **argv) {
    bench_args g;
    int rc = bench_parse(argc, argv, &g);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_comm *w = NULL;
    if (comm_start(&w)) return NL_EXIT_FAIL;
    int p = nl_comm_size(w), r = nl_comm_rank(w), calls = 0, nrows = 0;
    size_t es = nl_comm_dtype_bytes(g.dt), maxn = 0;
    for (int s = 0; s < g.nsizes; s++) maxn = g.sizes[s] / es > maxn ? g.sizes[s] / es : maxn;
    char *a = nl_malloc(maxn * es + 64, "bench buffer"), *b = nl_malloc(maxn * es + 64, "bench buffer");
    bench_row *rows = nl_calloc((size_t)g.nops * g.nsizes * 2, sizeof *rows, "bench rows");
    if (!a || !b || !rows) {
        rc = nl_cli_fail("collectives bench");
        goto out;
    }
    for (size_t i = 0; i < maxn; i++) { /* small values: sums stay finite over all repetitions */
        if (g.dt == NL_COMM_F32)
            ((float *)a)[i] = 1e-6f * (float)((i + (size_t)r) % 7);
        else
            ((uint16_t *)a)[i] = 0x3400; /* bf16 1.2e-7 */
    }
    memcpy(b, a, maxn * es);
    for (int oi = 0; oi < g.nops; oi++)
        for (int si = 0; si < g.nsizes; si++)
            for (int ii = 0; ii < 2; ii++) {
                if (!(g.impl_mask & (1 << ii))) continue;
                size_t n = g.sizes[si] / es;
                if (g.ops[oi] == NL_COMM_OP_ALL_TO_ALL) n -= n % (size_t)p;
                if (n == 0) continue;
                if (bench_one(w, &g, g.ops[oi], n, ii ? NL_COMM_NATIVE : NL_COMM_OURS, a, b, &calls, &rows[nrows])) {
                    rc = nl_cli_fail("collectives bench");
                    goto out;
                }
                nrows++;
            }
    if (r == 0) {
        nl_report *rep = nl_report_new("collectives bench");
        nl_report_int(rep, "ranks", "", p, NULL);
        nl_report_str(rep, "dtype", "", nl_comm_dtype_name(g.dt));
        bench_report_rows(rep, rows, nrows, p, g.dt);
        bench_report_fits(rep, &g, rows, nrows, p);
        rc = nl_report_print(rep, g.json);
    }
out:
    nl_free(a);
    nl_free(b);
    free(rows);
    nl_comm_finalize();
    return rc;
}

/* ---- dispatch -------------------------------------------------------------------------------- */

int nl_cmd_collectives(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: nanolm collectives demo|bench [options]   (under mpirun -np P for P ranks)\n"
                   "  nanolm collectives demo   the course's reduce-scatter + all-gather example (see its --help)\n"
                   "  nanolm collectives bench  every collective timed, ours vs native, with an alpha-beta fit\n");
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (!strcmp(argv[1], "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    return nl_cli_usage_error("collectives: unknown subcommand '%s' (demo, bench)", argv[1]);
}
