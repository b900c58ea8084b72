/* nanolm collectives demo|bench: the course's reduce-scatter + all-gather example, and a
 * benchmark of every collective (ours vs native MPI) with nccl-tests' algbw/busbw and an α–β fit.
 * Runs as one rank without mpirun, or as N ranks under `mpirun -np N`. Rank 0 prints. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "nanolm/comm.h"
#include "nanolm/linfit.h"

/* ---- shared option parsing ---------------------------------------------------------------- */

static int parse_impl(const char *s, int *out) {
    if (!strcmp(s, "ours")) *out = 1;
    else if (!strcmp(s, "native")) *out = 2;
    else if (!strcmp(s, "both")) *out = 3;
    else return nl_cli_usage_error("collectives: unknown --impl '%s' (ours, native, both)", s);
    return 0;
}

static int parse_dtype(const char *s, nl_comm_dtype *out) {
    if (!strcmp(s, "f32") || !strcmp(s, "fp32")) *out = NL_COMM_F32;
    else if (!strcmp(s, "bf16")) *out = NL_COMM_BF16;
    else return nl_cli_usage_error("collectives: unknown --dtype '%s' (f32, bf16)", s);
    return 0;
}

/* Bytes with binary suffixes: 1K = 1024, 16M, 1G. */
static int parse_bytes(const char *opt, const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    double m = 1;
    if (end == s || v <= 0) return nl_cli_usage_error("invalid size '%s' for %s (examples: 1K, 16M, 256M)", s, opt);
    if (*end == 'K' || *end == 'k') m = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || v * m > 2e9) return nl_cli_usage_error("invalid size '%s' for %s (examples: 1K, 16M, 256M; at most 1G)", s, opt);
    *out = (size_t)(v * m);
    return 0;
}

/* Fault injection for the fault tests: this rank leaves without a word at a chosen point. */
typedef struct fault { int rank, after; const char *how; } fault;
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
        else return nl_cli_usage_error("invalid --inject-fault '%s' (RANK[:exit|_exit|segv|kill])", s);
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

static void demo_usage(FILE *f) {
    fprintf(f, "usage: [mpirun -np P] nanolm collectives demo [--impl ours|native] [--dtype f32|bf16] [--json]\n"
               "  The course example: rank r holds (r*P+1, ..., r*P+P); reduce-scatter leaves the sum of\n"
               "  column r on rank r, all-gather gives everyone the sums; each rank sends 2(P-1) numbers.\n");
}

static void store(void *buf, nl_comm_dtype dt, size_t i, float v) {
    if (dt == NL_COMM_F32) ((float *)buf)[i] = v;
    else { uint32_t u; memcpy(&u, &v, 4); ((uint16_t *)buf)[i] = (uint16_t)(u >> 16); } /* small integers: exact */
}
static float load(const void *buf, nl_comm_dtype dt, size_t i) {
    if (dt == NL_COMM_F32) return ((const float *)buf)[i];
    uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int cmd_demo(int argc, char **argv) {
    static const struct option opts[] = {{"impl", required_argument, 0, 'i'}, {"dtype", required_argument, 0, 'd'},
                                         {"inject-fault", required_argument, 0, 'F'}, {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int impl_mask = 1, json = 0, c;
    nl_comm_dtype dt = NL_COMM_F32;
    fault flt = {-1, 0, "exit"};
    while ((c = getopt_long(argc, argv, "i:d:F:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'i': if (parse_impl(optarg, &impl_mask)) return NL_EXIT_USAGE; break;
        case 'd': if (parse_dtype(optarg, &dt)) return NL_EXIT_USAGE; break;
        case 'F': if (parse_fault(optarg, &flt)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': demo_usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("collectives demo", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("collectives demo: unexpected argument '%s'", argv[optind]);
    if (impl_mask == 3) return nl_cli_usage_error("collectives demo: --impl must be ours or native");
    nl_comm_impl impl = impl_mask == 2 ? NL_COMM_NATIVE : NL_COMM_OURS;
    nl_comm *w = NULL;
    if (comm_start(&w)) return NL_EXIT_FAIL;
    int p = nl_comm_size(w), r = nl_comm_rank(w);
    size_t n = (size_t)p, es = nl_comm_dtype_bytes(dt);
    char holds[64], full[64], mine[8];
    for (size_t i = 0; i < n; i++) store(holds, dt, i, (float)(r * p + (int)i + 1));
    nl_comm_reset_stats(w);
    int rc = NL_EXIT_OK;
    if (nl_comm_reduce_scatter(w, holds, mine, n, dt, impl)) { rc = nl_cli_fail("reduce-scatter"); goto out; }
    nl_comm_stats after_rs, after_ag;
    nl_comm_get_stats(w, &after_rs);
    if (flt.rank >= 0) maybe_fault(&flt, r);
    if (nl_comm_all_gather(w, mine, full, n, dt, impl)) { rc = nl_cli_fail("all-gather"); goto out; }
    nl_comm_get_stats(w, &after_ag);
    /* Collect every rank's row on rank 0 (through the native all-gather of the report, which the
     * counters shown below do not include: they were read before). */
    enum { NF = 5 };
    double *row = nl_calloc((size_t)p * (NF + 2 * (size_t)p), sizeof(double), "collectives demo report");
    if (!row) { rc = nl_cli_fail("collectives demo"); goto out; }
    size_t rl = NF + 2 * (size_t)p;
    double *me = row + (size_t)r * rl;
    me[0] = load(mine, dt, 0);
    me[1] = (double)after_rs.coll[NL_COMM_OP_REDUCE_SCATTER].sent_bytes / es;
    me[2] = (double)after_ag.coll[NL_COMM_OP_ALL_GATHER].sent_bytes / es;
    me[3] = (double)(after_rs.coll[NL_COMM_OP_REDUCE_SCATTER].recv_bytes + after_ag.coll[NL_COMM_OP_ALL_GATHER].recv_bytes) / es;
    me[4] = (double)nl_comm_stats_sent_bytes(&after_ag);
    for (size_t i = 0; i < n; i++) {
        me[NF + i] = load(holds, dt, i);
        me[NF + n + i] = load(full, dt, i);
    }
    for (int q = 0; q < p; q++) /* everyone contributes its row; the sum assembles the table */
        for (size_t k = 0; k < rl; k++) {
            double v = row[(size_t)q * rl + k];
            if (nl_comm_sum_double(w, &v)) { free(row); rc = nl_cli_fail("report"); goto out; }
            row[(size_t)q * rl + k] = v;
        }
    if (r == 0) {
        double frac = 2.0 * (p - 1) / p;
        if (json) {
            cJSON *d = cJSON_CreateObject(), *ranks = cJSON_AddArrayToObject(d, "per_rank");
            cJSON_AddNumberToObject(d, "ranks", p);
            cJSON_AddStringToObject(d, "impl", nl_comm_impl_name(impl));
            cJSON_AddStringToObject(d, "dtype", nl_comm_dtype_name(dt));
            cJSON_AddNumberToObject(d, "array_numbers", (double)n);
            cJSON_AddNumberToObject(d, "formula_sent_fraction", frac);
            for (int q = 0; q < p; q++) {
                double *x = row + (size_t)q * rl;
                cJSON *o = cJSON_CreateObject();
                cJSON_AddNumberToObject(o, "rank", q);
                cJSON *h = cJSON_AddArrayToObject(o, "holds"), *g = cJSON_AddArrayToObject(o, "after_all_gather");
                for (size_t i = 0; i < n; i++) {
                    cJSON_AddItemToArray(h, cJSON_CreateNumber(x[NF + i]));
                    cJSON_AddItemToArray(g, cJSON_CreateNumber(x[NF + n + i]));
                }
                cJSON_AddNumberToObject(o, "after_reduce_scatter", x[0]);
                cJSON_AddNumberToObject(o, "sent_numbers_reduce_scatter", x[1]);
                cJSON_AddNumberToObject(o, "sent_numbers_all_gather", x[2]);
                cJSON_AddNumberToObject(o, "sent_numbers", x[1] + x[2]);
                cJSON_AddNumberToObject(o, "received_numbers", x[3]);
                cJSON_AddNumberToObject(o, "sent_bytes", x[4]);
                cJSON_AddNumberToObject(o, "sent_fraction", (x[1] + x[2]) / (double)n);
                cJSON_AddItemToArray(ranks, o);
            }
            nl_cli_print_json(d);
        } else {
            printf("all-reduce = reduce-scatter + all-gather on %d ranks (%s, %s)\n", p, nl_comm_impl_name(impl),
                   nl_comm_dtype_name(dt));
            const char *hdr[] = {"rank", "holds", "after reduce-scatter", "after all-gather", "sent (RS+AG)", "received"};
            nl_table t;
            nl_table_init(&t, 6, hdr);
            for (int q = 0; q < p; q++) {
                double *x = row + (size_t)q * rl;
                char hs[256] = "", gs[256] = "", cell[32], ss[64], rs[32], vs[32];
                for (size_t i = 0; i < n && strlen(hs) < 200; i++) {
                    snprintf(cell, sizeof cell, "%s%g", i ? " " : "", x[NF + i]);
                    strcat(hs, cell);
                    snprintf(cell, sizeof cell, "%s%g", i ? " " : "", x[NF + n + i]);
                    strcat(gs, cell);
                }
                snprintf(ss, sizeof ss, "%g + %g = %g", x[1], x[2], x[1] + x[2]);
                snprintf(rs, sizeof rs, "%g", x[3]);
                snprintf(vs, sizeof vs, "%g", x[0]);
                char qs[16];
                snprintf(qs, sizeof qs, "%d", q);
                nl_table_row(&t, qs, hs, vs, gs, ss, rs);
            }
            nl_table_print(&t, stdout);
            nl_table_free(&t);
            double s0 = row[1] + row[2];
            printf("each rank sent %g numbers for an array of %zu: %.3g of the array; formula 2(p-1)/p = %.3g\n", s0, n,
                   s0 / (double)n, frac);
        }
    }
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

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: [mpirun -np P] nanolm collectives bench [options]\n"
            "  --ops LIST        all-reduce,reduce-scatter,all-gather,broadcast,reduce,all-to-all (default all)\n"
            "  --impl I          ours, native or both (default both)\n"
            "  --min-bytes S     smallest size (default 1K)    --max-bytes S  largest (default 256M)\n"
            "  --step F          size factor between rows (default 4)\n"
            "  --sizes LIST      explicit sizes, e.g. 1M,16M,128M (instead of min/max/step)\n"
            "  --dtype f32|bf16  element type (default f32)\n"
            "  --reps N          timed repetitions per row (default: 3..20, about 0.3 s per row)\n"
            "  --json            machine-readable output (its \"link\" is a measured alpha/bandwidth)\n"
            "Size S is the nccl-tests size: the array of all-reduce/broadcast/reduce, the full array of\n"
            "all-gather and reduce-scatter, the whole send buffer of all-to-all. time is the median over\n"
            "repetitions of the slowest rank; algbw = S/time; busbw = algbw x factor (2(p-1)/p all-reduce,\n"
            "(p-1)/p reduce-scatter, all-gather, all-to-all; 1 broadcast, reduce).\n");
}

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
    case NL_COMM_OP_ALL_GATHER:
        return nl_comm_all_gather(w, a + nl_comm_chunk_offset(n, p, r) * es, a, n, dt, impl);
    case NL_COMM_OP_BROADCAST: return nl_comm_broadcast(w, a, n, dt, 0, impl);
    case NL_COMM_OP_REDUCE: return nl_comm_reduce(w, a, b, n, dt, 0, impl);
    case NL_COMM_OP_ALL_TO_ALL: return nl_comm_all_to_all(w, a, b, n / (size_t)p, dt, impl);
    default: return nl_fail(NL_ERR_INVALID, "bench: no such collective");
    }
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The constrained parameter of an alpha-beta fit, "-" when the free fit held. */
static const char *clamp_name(int clamped) { return clamped == 1 ? "beta = 0" : clamped == 2 ? "alpha = 0" : "-"; }

typedef struct bench_row { nl_comm_op op; nl_comm_impl impl; size_t bytes; double time_s, algbw, busbw; int reps; } bench_row;

/* Weighted least squares t = alpha + beta * x with weights 1/t^2 (relative errors), x = bus bytes,
 * constrained to alpha >= 0 and beta >= 0 (nl_linfit_nonneg: a negative latency would say that
 * the small messages were not resolved, so the fit says so instead of printing it). With one
 * size only, alpha is that time and beta 0 (clamped). */
static void fit_alpha_beta(const double *x, const double *t, int m, nl_linfit *f) {
    double w[64];
    for (int i = 0; i < m; i++) w[i] = 1.0 / (t[i] * t[i]);
    if (m < 2 || nl_linfit_nonneg(x, t, w, (size_t)m, f)) *f = (nl_linfit){.intercept = m ? t[0] : 0, .r2 = 0, .clamped = 1};
}

static int cmd_bench(int argc, char **argv) {
    static const struct option opts[] = {
        {"ops", required_argument, 0, 'o'},       {"impl", required_argument, 0, 'i'},
        {"min-bytes", required_argument, 0, 'a'}, {"max-bytes", required_argument, 0, 'b'},
        {"step", required_argument, 0, 's'},      {"sizes", required_argument, 0, 'S'},
        {"dtype", required_argument, 0, 'd'},     {"reps", required_argument, 0, 'r'},
        {"inject-fault", required_argument, 0, 'F'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    int impl_mask = 3, json = 0, c, nops = 0, nsizes = 0;
    nl_comm_op ops[NOPS];
    size_t min_b = 1024, max_b = 256u << 20, sizes[64];
    int64_t step = 4, reps_opt = 0;
    nl_comm_dtype dt = NL_COMM_F32;
    fault flt = {-1, 0, "exit"};
    while ((c = getopt_long(argc, argv, "o:i:a:b:s:S:d:r:F:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'o': {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", optarg);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (nops >= (int)NOPS || op_from_name(tok, &ops[nops]))
                    return nl_cli_usage_error("collectives bench: unknown --ops entry '%s' (all-reduce, reduce-scatter, "
                                              "all-gather, broadcast, reduce, all-to-all)", tok);
                nops++;
            }
            break;
        }
        case 'i': if (parse_impl(optarg, &impl_mask)) return NL_EXIT_USAGE; break;
        case 'a': if (parse_bytes("--min-bytes", optarg, &min_b)) return NL_EXIT_USAGE; break;
        case 'b': if (parse_bytes("--max-bytes", optarg, &max_b)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--step", optarg, 2, 1024, &step)) return NL_EXIT_USAGE; break;
        case 'S': {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", optarg);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (nsizes >= 64) return nl_cli_usage_error("collectives bench: too many --sizes (at most 64)");
                if (parse_bytes("--sizes", tok, &sizes[nsizes])) return NL_EXIT_USAGE;
                nsizes++;
            }
            break;
        }
        case 'd': if (parse_dtype(optarg, &dt)) return NL_EXIT_USAGE; break;
        case 'r': if (nl_cli_int("--reps", optarg, 1, 1000, &reps_opt)) return NL_EXIT_USAGE; break;
        case 'F': if (parse_fault(optarg, &flt)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': bench_usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("collectives bench", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("collectives bench: unexpected argument '%s'", argv[optind]);
    if (min_b > max_b) return nl_cli_usage_error("collectives bench: --min-bytes is larger than --max-bytes");
    if (!nops)
        for (size_t k = 0; k < NOPS; k++) ops[nops++] = bench_ops[k];
    if (!nsizes)
        for (size_t s = min_b; s <= max_b && nsizes < 64; s *= (size_t)step) sizes[nsizes++] = s;

    nl_comm *w = NULL;
    if (comm_start(&w)) return NL_EXIT_FAIL;
    int p = nl_comm_size(w), r = nl_comm_rank(w), rc = NL_EXIT_OK, calls = 0;
    size_t es = nl_comm_dtype_bytes(dt);
    size_t maxn = 0;
    for (int s = 0; s < nsizes; s++) maxn = sizes[s] / es > maxn ? sizes[s] / es : maxn;
    char *a = nl_malloc(maxn * es + 64, "bench buffer"), *b = nl_malloc(maxn * es + 64, "bench buffer");
    bench_row *rows = nl_calloc((size_t)nops * nsizes * 2, sizeof *rows, "bench rows");
    int nrows = 0;
    if (!a || !b || !rows) { rc = nl_cli_fail("collectives bench"); goto out; }
    for (size_t i = 0; i < maxn; i++) { /* small values: sums stay finite over all repetitions */
        if (dt == NL_COMM_F32) ((float *)a)[i] = 1e-6f * (float)((i + (size_t)r) % 7);
        else ((uint16_t *)a)[i] = 0x3400; /* bf16 1.2e-7 */
    }
    memcpy(b, a, maxn * es);
    for (int oi = 0; oi < nops; oi++)
        for (int si = 0; si < nsizes; si++)
            for (int ii = 0; ii < 2; ii++) {
                if (!(impl_mask & (1 << ii))) continue;
                nl_comm_impl impl = ii ? NL_COMM_NATIVE : NL_COMM_OURS;
                size_t n = sizes[si] / es;
                if (ops[oi] == NL_COMM_OP_ALL_TO_ALL) n -= n % (size_t)p;
                if (n == 0) continue;
                double times[1000];
                /* warm-up, which also sizes the repetitions (same count on every rank) */
                double t0 = nl_time_s();
                if (run_op(w, ops[oi], a, b, n, dt, impl)) { rc = nl_cli_fail("collectives bench"); goto out; }
                double tw = nl_time_s() - t0;
                if (nl_comm_max_double(w, &tw)) { rc = nl_cli_fail("collectives bench"); goto out; }
                int reps = reps_opt ? (int)reps_opt : (int)fmin(20, fmax(3, ceil(0.3 / fmax(tw, 1e-9))));
                for (int k = 0; k < reps; k++) {
                    if (flt.rank >= 0 && ++calls == 3) maybe_fault(&flt, r);
                    if (nl_comm_barrier(w)) { rc = nl_cli_fail("collectives bench"); goto out; }
                    t0 = nl_time_s();
                    if (run_op(w, ops[oi], a, b, n, dt, impl)) { rc = nl_cli_fail("collectives bench"); goto out; }
                    times[k] = nl_time_s() - t0;
                    if (nl_comm_max_double(w, &times[k])) { rc = nl_cli_fail("collectives bench"); goto out; }
                }
                qsort(times, (size_t)reps, sizeof(double), cmp_double);
                bench_row *row = &rows[nrows++];
                row->op = ops[oi];
                row->impl = impl;
                row->bytes = n * es;
                row->reps = reps;
                row->time_s = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
                row->algbw = (double)row->bytes / row->time_s;
                row->busbw = row->algbw * busbw_factor(ops[oi], p);
            }
    if (r == 0) {
        /* α–β fit per (op, impl): t = alpha + beta * (busbw factor * S) */
        nl_linfit fit[NOPS][2];
        int clamped = 0;
        int has[NOPS][2] = {{0}};
        for (int oi = 0; oi < nops; oi++)
            for (int ii = 0; ii < 2; ii++) {
                double x[64], t[64];
                int m = 0;
                for (int k = 0; k < nrows; k++)
                    if (rows[k].op == ops[oi] && (int)rows[k].impl == ii) {
                        x[m] = busbw_factor(ops[oi], p) * (double)rows[k].bytes;
                        t[m++] = rows[k].time_s;
                    }
                if (m) {
                    fit_alpha_beta(x, t, m, &fit[oi][ii]);
                    clamped += fit[oi][ii].clamped != 0;
                    has[oi][ii] = 1;
                }
            }
        if (json) {
            cJSON *d = cJSON_CreateObject();
            cJSON_AddNumberToObject(d, "ranks", p);
            cJSON_AddStringToObject(d, "dtype", nl_comm_dtype_name(dt));
            cJSON *res = cJSON_AddArrayToObject(d, "results");
            for (int k = 0; k < nrows; k++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "op", nl_comm_op_name(rows[k].op));
                cJSON_AddStringToObject(o, "impl", nl_comm_impl_name(rows[k].impl));
                cJSON_AddNumberToObject(o, "bytes", (double)rows[k].bytes);
                cJSON_AddNumberToObject(o, "time_s", rows[k].time_s);
                cJSON_AddNumberToObject(o, "algbw_bytes_per_s", rows[k].algbw);
                cJSON_AddNumberToObject(o, "busbw_bytes_per_s", rows[k].busbw);
                cJSON_AddNumberToObject(o, "reps", rows[k].reps);
                for (int j = 0; j < nrows; j++) /* ratio against native at the same op and size */
                    if (rows[k].impl == NL_COMM_OURS && rows[j].impl == NL_COMM_NATIVE && rows[j].op == rows[k].op &&
                        rows[j].bytes == rows[k].bytes)
                        cJSON_AddNumberToObject(o, "busbw_ratio_vs_native", rows[k].busbw / rows[j].busbw);
                cJSON_AddItemToArray(res, o);
            }
            cJSON *fits = cJSON_AddArrayToObject(d, "fits");
            cJSON *link = NULL;
            for (int oi = 0; oi < nops; oi++)
                for (int ii = 1; ii >= 0; ii--) {
                    if (!has[oi][ii]) continue;
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddStringToObject(o, "op", nl_comm_op_name(ops[oi]));
                    cJSON_AddStringToObject(o, "impl", ii ? "native" : "ours");
                    cJSON_AddNumberToObject(o, "alpha_s", fit[oi][ii].intercept);
                    cJSON_AddNumberToObject(o, "beta_s_per_byte", fit[oi][ii].slope);
                    cJSON_AddNumberToObject(o, "bandwidth_bytes_per_s", fit[oi][ii].slope > 0 ? 1.0 / fit[oi][ii].slope : 0);
                    cJSON_AddNumberToObject(o, "r2", fit[oi][ii].r2);
                    cJSON_AddStringToObject(o, "clamped", clamp_name(fit[oi][ii].clamped));
                    cJSON_AddItemToArray(fits, o);
                    if (!link && ops[oi] == NL_COMM_OP_ALL_REDUCE) { /* the measured link: all-reduce, native first */
                        link = cJSON_CreateObject();
                        cJSON_AddStringToObject(link, "source", ii ? "all-reduce native" : "all-reduce ours");
                        cJSON_AddNumberToObject(link, "ranks", p);
                        cJSON_AddNumberToObject(link, "alpha_s", fit[oi][ii].intercept);
                        cJSON_AddNumberToObject(link, "bandwidth_bytes_per_s", fit[oi][ii].slope > 0 ? 1.0 / fit[oi][ii].slope : 0);
                    }
                }
            if (link) cJSON_AddItemToObject(d, "link", link);
            nl_cli_print_json(d);
        } else {
            printf("collectives on %d ranks, %s; time = median of the slowest rank; busbw per nccl-tests\n", p,
                   nl_comm_dtype_name(dt));
            const char *hdr[] = {"op", "bytes", "impl", "time", "algbw GB/s", "busbw GB/s", "ours/native"};
            nl_table t;
            nl_table_init(&t, 7, hdr);
            for (int k = 0; k < nrows; k++) {
                char ratio[32] = "";
                for (int j = 0; j < nrows; j++)
                    if (rows[k].impl == NL_COMM_OURS && rows[j].impl == NL_COMM_NATIVE && rows[j].op == rows[k].op &&
                        rows[j].bytes == rows[k].bytes)
                        snprintf(ratio, sizeof ratio, "%.2fx", rows[k].busbw / rows[j].busbw);
                char bytes[32], tm[32];
                size_t B = rows[k].bytes;
                if (B >= (1u << 20) && B % (1u << 20) == 0) snprintf(bytes, sizeof bytes, "%zuM", B >> 20);
                else if (B >= 1024 && B % 1024 == 0) snprintf(bytes, sizeof bytes, "%zuK", B >> 10);
                else snprintf(bytes, sizeof bytes, "%zu", B);
                double ts = rows[k].time_s;
                if (ts < 1e-3) snprintf(tm, sizeof tm, "%.1f us", ts * 1e6);
                else snprintf(tm, sizeof tm, "%.2f ms", ts * 1e3);
                nl_table_rowf(&t, "%s|%s|%s|%s|%.3f|%.3f|%s", nl_comm_op_name(rows[k].op), bytes,
                              nl_comm_impl_name(rows[k].impl), tm, rows[k].algbw / 1e9, rows[k].busbw / 1e9, ratio);
            }
            nl_table_print(&t, stdout);
            nl_table_free(&t);
            printf("\nalpha-beta fit, t = alpha + (busbw factor x S) / bandwidth:\n");
            const char *fh[] = {"op", "impl", "alpha", "bandwidth GB/s", "R^2", "constrained"};
            nl_table_init(&t, 6, fh);
            for (int oi = 0; oi < nops; oi++)
                for (int ii = 0; ii < 2; ii++)
                    if (has[oi][ii])
                        nl_table_rowf(&t, "%s|%s|%.1f us|%.3f|%.3f|%s", nl_comm_op_name(ops[oi]), ii ? "native" : "ours",
                                      fit[oi][ii].intercept * 1e6, fit[oi][ii].slope > 0 ? 1e-9 / fit[oi][ii].slope : 0.0,
                                      fit[oi][ii].r2, clamp_name(fit[oi][ii].clamped));
            nl_table_print(&t, stdout);
            nl_table_free(&t);
            if (clamped)
                printf("\n%d fit(s) constrained: the free fit gave a negative latency or time per byte, so the\n"
                       "times do not follow t = alpha + beta x over these sizes (noise, or too few sizes below\n"
                       "the latency); the constrained line is shown, read its R^2 before trusting it.\n",
                       clamped);
        }
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
        fprintf(f, "usage: nanolm collectives demo|bench [options]   (under mpirun -np P for P ranks)\n");
        demo_usage(f);
        bench_usage(f);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (!strcmp(argv[1], "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    return nl_cli_usage_error("collectives: unknown subcommand '%s' (demo, bench)", argv[1]);
}
