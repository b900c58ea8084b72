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
#include "nanolm/coll_bench.h"
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

/* The fault as a callback of the library: this rank fails at the at-th call. */
typedef struct fault_at {
    const fault *f;
    int rank, calls, at;
} fault_at;
static void fault_now(void *u) {
    fault_at *x = u;
    if (++x->calls == x->at) maybe_fault(x->f, x->rank);
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
    fault_at at = {&flt, nl_comm_rank(w), 0, 1};
    nl_coll_demo d = {0};
    if (nl_coll_demo_run(w, impl, dt, flt.rank >= 0 ? fault_now : NULL, &at, &d))
        rc = nl_cli_fail("collectives demo");
    else if (nl_comm_rank(w) == 0)
        rc = demo_print(d.rows, d.row_len, NL_COLL_DEMO_NF, d.p, (size_t)d.p, impl, dt, json);
    nl_coll_demo_free(&d);
    nl_comm_finalize();
    return rc;
}

/* ---- bench ---------------------------------------------------------------------------------- */

static const char bench_summary[] =
    "Times every collective (ours and MPI's native), nccl-tests style, and fits t = alpha + beta x.\n"
    "Size S is the nccl-tests size: the array of all-reduce/broadcast/reduce, the full array of\n"
    "all-gather and reduce-scatter, the whole send buffer of all-to-all. time is the median over\n"
    "repetitions of the slowest rank; algbw = S/time; busbw = algbw x factor (2(p-1)/p all-reduce,\n"
    "(p-1)/p reduce-scatter, all-gather, all-to-all; 1 broadcast, reduce). The JSON's \"link\" is\n"
    "the measured alpha and bandwidth of all-reduce (native first).";

/* The constrained parameter of an alpha-beta fit, "-" when the free fit held. */
static const char *clamp_name(int clamped) { return clamped == 1 ? "beta = 0" : clamped == 2 ? "alpha = 0" : "-"; }

typedef nl_coll_bench_row bench_row;

/* The options of collectives bench, after parsing. */
typedef struct bench_args {
    nl_coll_bench_opts o;
    int json;
    int64_t reps;
    fault flt;
} bench_args;

/* Splits --sizes, a ','-separated list, into the sizes. */
static int bench_sizes(bench_args *g, const char *sizes) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", sizes);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (g->o.nsizes >= 64) return nl_cli_usage_error("collectives bench: too many --sizes (at most 64)");
        if (parse_bytes("--sizes", tok, &g->o.sizes[g->o.nsizes])) return NL_EXIT_USAGE;
        g->o.nsizes++;
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
    g->o.impl_mask = impl_i + 1; /* ours 1, native 2, both 3 */
    g->o.dt = dtype_i == 2 ? NL_COMM_BF16 : NL_COMM_F32;
    if (ops && nl_coll_bench_parse_ops(ops, &g->o)) return nl_cli_usage_error("collectives bench: %s", nl_last_error());
    if (sizes && (rc = bench_sizes(g, sizes))) return rc;
    if (min_b > max_b) return nl_cli_usage_error("collectives bench: --min-bytes is larger than --max-bytes");
    nl_coll_bench_defaults(&g->o, min_b, max_b, (size_t)step);
    g->o.reps = (int)g->reps;
    return 0;
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
        double ratio = nl_coll_bench_ratio(rows, nrows, k);
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
    nl_coll_fit fits[2 * NL_COLL_BENCH_OPS];
    int link = -1, clamped = 0, nf = nl_coll_bench_fits(&g->o, rows, nrows, p, fits, &link);
    for (int i = 0; i < nf; i++) {
        const nl_linfit f = fits[i].f;
        clamped += f.clamped != 0;
        char al[32];
        snprintf(al, sizeof al, "%.1f us", f.intercept * 1e6);
        nl_report_cell_str(r, nl_comm_op_name(fits[i].op));
        nl_report_cell_str(r, nl_comm_impl_name(fits[i].impl));
        nl_report_cell_num(r, f.intercept);
        nl_report_cell_str(r, al);
        nl_report_cell_num(r, f.slope);
        nl_report_cell_num(r, f.slope > 0 ? 1.0 / f.slope : 0);
        nl_report_cell_num(r, f.slope > 0 ? 1e-9 / f.slope : 0.0);
        nl_report_cell_num(r, f.r2);
        nl_report_cell_str(r, clamp_name(f.clamped));
        nl_report_row_end(r);
    }
    if (link >= 0) {
        const nl_linfit *lk = &fits[link].f;
        nl_report_begin_object(r, "link", NULL);
        nl_report_str(r, "source", "", fits[link].impl == NL_COMM_NATIVE ? "all-reduce native" : "all-reduce ours");
        nl_report_int(r, "ranks", "", p, NULL);
        nl_report_num(r, "alpha_s", "", lk->intercept, NULL, NULL);
        nl_report_num(r, "bandwidth_bytes_per_s", "", lk->slope > 0 ? 1.0 / lk->slope : 0, NULL, NULL);
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
    int p = nl_comm_size(w), r = nl_comm_rank(w), nrows = 0;
    fault_at at = {&g.flt, r, 0, 3};
    if (g.flt.rank >= 0) g.o.before_rep = fault_now, g.o.user = &at;
    bench_row *rows = NULL;
    if (nl_coll_bench_run(w, &g.o, &rows, &nrows)) {
        rc = nl_cli_fail("collectives bench");
        goto out;
    }
    if (r == 0) {
        nl_report *rep = nl_report_new("collectives bench");
        nl_report_int(rep, "ranks", "", p, NULL);
        nl_report_str(rep, "dtype", "", nl_comm_dtype_name(g.o.dt));
        bench_report_rows(rep, rows, nrows, p, g.o.dt);
        bench_report_fits(rep, &g, rows, nrows, p);
        rc = nl_report_print(rep, g.json);
    }
out:
    nl_free(rows);
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
