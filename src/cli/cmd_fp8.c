/* nanolm fp8 gemm: error of the emulated FP8 GEMM against fp64, per scaling and accumulator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/fp8_study.h"
#include "nanolm/train_log.h"
#include "report.h"

static const char *const dist_names[3] = {"normal", "uniform", "symmetric"};
static const char *const dist_labels[3] = {"N(0,1)", "uniform [0,1)", "uniform [-1,1)"};

static void usage(FILE *f) {
    fprintf(f, "usage: nanolm fp8 gemm --m M --n N --k K [options]   error of an emulated FP8 GEMM (see --help)\n"
               "       nanolm fp8 curves --run LABEL=CSV [--run ...] [--svg FILE] [--train]\n"
               "  Loss curves of several `nanolm train --log` files in one table and SVG.\n");
}

static int parse_scalings(const char *s, int *want) {
    memset(want, 0, sizeof(int) * NL_FP8_SCALE_COUNT);
    char buf[128];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "all")) {
            for (int i = 0; i < NL_FP8_SCALE_COUNT; i++) want[i] = 1;
            continue;
        }
        nl_fp8_scaling sc;
        if (nl_fp8_scaling_from_name(t, &sc)) return nl_cli_usage_error("fp8 gemm: --scaling: %s", nl_last_error());
        want[sc] = 1;
    }
    return 0;
}

/* The options of fp8 gemm, as given. */
typedef struct gemm_args {
    nl_fp8_study_cfg c;
    int want[NL_FP8_SCALE_COUNT], scaling_given;
    int64_t bits, promote, group;
    nl_fp8_acc accs[3]; /* fp32, limited never promoted, limited promoted every `promote` */
    int naccs;
    int json, sweep;
    const char *svg;
} gemm_args;

static const char gemm_summary[] =
    "Emulated FP8 GEMM C = A.B (A: M x K, B: K x N, random operands) against an fp64\n"
    "reference. For each scaling, three accumulators: fp32, the limited one never\n"
    "promoted, and promoted to fp32 every --promote-every products. Limited (Hopper's FP8\n"
    "tensor core as DeepSeek-V3 describes it): each group of --group products is aligned\n"
    "to its largest exponent and every product kept as an acc-bits two's-complement\n"
    "integer (sign included) by floor; the group's exact sum goes into a register of\n"
    "acc-bits significant bits, truncated toward zero.\n"
    "'acc err' compares with fp64 of the FP8 operands (what accumulation loses),\n"
    "'total err' with fp64 of the fp32 operands. max = max|C-R| / max|R|, fro = ||C-R||/||R||.\n"
    "--outlier COL:FACTOR multiplies column COL of A (one input channel) by FACTOR and divides\n"
    "row COL of B by it: the exact product is unchanged, only the representation is stressed.\n"
    "--history H: delayed scaling first records H steps of the same distribution without\n"
    "the outlier (so an outlier beyond the history's max saturates).\n"
    "--sweep-k: error (acc err, max) versus K = 128, 256, ... up to --k; --svg writes the plot.\n"
    "Also: nanolm fp8 curves --run LABEL=CSV (loss curves of training logs; see its --help).";

/* Checks the values that the option table cannot (COL:FACTOR, the scalings, the format). */
static int gemm_check(gemm_args *g, const char *scalings, const char *format, const char *outlier, int64_t seed) {
    nl_fp8_study_cfg *c = &g->c;
    c->seed = (uint64_t)seed;
    if (scalings && parse_scalings(scalings, g->want)) return NL_EXIT_USAGE;
    g->scaling_given = scalings != NULL;
    if (format && nl_fp8_format_from_name(format, &c->fmt))
        return nl_cli_usage_error("fp8 gemm: --format: %s", nl_last_error());
    if (outlier) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", outlier);
        char *colon = strchr(buf, ':');
        if (!colon) return nl_cli_usage_error("fp8 gemm: --outlier '%s': expected COL:FACTOR", outlier);
        *colon = 0;
        if (nl_cli_int("--outlier column", buf, 0, INT64_MAX, &c->outlier_col) ||
            nl_cli_double("--outlier factor", colon + 1, &c->outlier_factor))
            return NL_EXIT_USAGE;
        if (!isfinite(c->outlier_factor) || c->outlier_factor <= 0.0)
            return nl_cli_usage_error("fp8 gemm: --outlier factor must be finite and > 0");
    }
    if (c->outlier_col >= c->K)
        return nl_cli_usage_error("fp8 gemm: --outlier column %lld is outside K = %lld", (long long)c->outlier_col,
                                  (long long)c->K);
    if (g->svg && !g->sweep) return nl_cli_usage_error("fp8 gemm: --svg needs --sweep-k");
    if (g->promote % g->group)
        return nl_cli_usage_error("fp8 gemm: --promote-every %lld is not a multiple of --group %lld",
                                  (long long)g->promote, (long long)g->group);
    g->naccs = nl_fp8_study_accs((int)g->bits, (int)g->group, (int)g->promote, g->accs);
    return 0;
}

/* Parses fp8 gemm's options into g (one table; --help generated from it). */
static int gemm_parse(int argc, char **argv, gemm_args *g) {
    *g = (gemm_args){.c = {.M = 128,
                           .N = 128,
                           .K = 4096,
                           .fmt = NL_FMT_E4M3,
                           .outlier_col = -1,
                           .outlier_factor = 1.0,
                           .seed = 1,
                           .history = 16},
                     .want = {1, 1, 1, 1},
                     .bits = 14,
                     .promote = 128,
                     .group = 32};
    const char *scalings = NULL, *format = NULL, *outlier = NULL;
    int64_t seed = 1;
    nl_opt opts[] = {
        NL_OPT_INT("m", &g->c.M, 1, 1 << 16, "M", "rows of A and C (default 128)"),
        NL_OPT_INT("n", &g->c.N, 1, 1 << 16, "N", "columns of B and C (default 128)"),
        NL_OPT_INT("k", &g->c.K, 1, 1 << 20, "K", "inner dimension (default 4096)"),
        NL_OPT_STR("scaling", &scalings, "S[,S..]", "tensor|delayed|block|mx|all, ','-separated (default all)"),
        NL_OPT_STR("format", &format, "F", "FP8 format of the operands: e4m3|e5m2 (default e4m3)"),
        NL_OPT_INT("acc-bits", &g->bits, 2, 24, "B", "bits of the limited accumulator (default 14)"),
        {"promote-every", NL_OPT_T_INT, &g->promote, 0, 1 << 20, NULL, "N",
         "promote to fp32 every N products (default 128; 0: only the never-promoted row)", "promote", NULL},
        NL_OPT_INT("group", &g->group, 1, 1 << 20, "G", "products aligned together (default 32)"),
        NL_OPT_STR("outlier", &outlier, "COL:FACTOR", "scale column COL of A up and row COL of B down by FACTOR"),
        NL_OPT_CHOICE("dist", &g->c.dist, "normal|uniform|symmetric",
                      "operands: N(0,1), U[0,1) or U[-1,1) (default normal)"),
        NL_OPT_INT32("history", &g->c.history, 1, NL_FP8_HISTORY_MAX, "H",
                     "delayed scaling: steps recorded first (default 16)"),
        NL_OPT_INT("seed", &seed, 0, 9.2e18, "S", "seed of the operands (default 1)"),
        NL_OPT_FLAG("sweep-k", &g->sweep, "error versus K = 128, 256, ... up to --k (one --scaling)"),
        NL_OPT_STR("svg", &g->svg, "FILE", "with --sweep-k: write the plot"),
        NL_OPT_FLAG("json", &g->json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"fp8 gemm", "nanolm fp8 gemm --m M --n N --k K [options]", gemm_summary, groups, 1, 0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    return gemm_check(g, scalings, format, outlier, seed);
}

/* --sweep-k: acc err (max) of each accumulator for K = 128, 256, ... up to --k, one scaling. */
static int gemm_sweep(const gemm_args *g) {
    const nl_fp8_study_cfg *c = &g->c;
    nl_fp8_scaling sc = NL_FP8_SCALE_TENSOR;
    if (g->scaling_given) {
        int nw = 0;
        for (int i = 0; i < NL_FP8_SCALE_COUNT; i++)
            if (g->want[i]) sc = (nl_fp8_scaling)i, nw++;
        if (nw != 1) return nl_cli_usage_error("fp8 gemm: --sweep-k takes one --scaling");
    }
    if (c->K < 128) return nl_cli_usage_error("fp8 gemm: --sweep-k needs --k >= 128");
    nl_fp8_k_sweep sw;
    if (nl_fp8_study_sweep_k(c, sc, g->accs, g->naccs, &sw)) return nl_cli_fail("fp8 gemm");
    const int nk = sw.nk;
    double *xs = sw.k, (*ys)[32] = sw.err;
    const int *skipped = sw.skipped;
    char h[3][64];
    nl_report *r = nl_report_new("fp8 gemm --sweep-k");
    nl_report_str(r, "scaling", "", nl_fp8_scaling_name(sc));
    nl_report_str(r, "format", "", nl_fmt_name(c->fmt));
    nl_report_int(r, "m", "", c->M, NULL);
    nl_report_int(r, "n", "", c->N, NULL);
    char title[160];
    snprintf(title, sizeof title,
             "acc err (max|C-R|/max|R|, R = fp64 of the FP8 operands) vs K: %s scaling, %s, M=%lld N=%lld",
             nl_fp8_scaling_name(sc), nl_fmt_name(c->fmt), (long long)c->M, (long long)c->N);
    nl_report_col cols[4] = {{NULL, "K", "%-.0f"}};
    for (int a = 0; a < g->naccs; a++)
        cols[1 + a] = (nl_report_col){NULL, nl_fp8_acc_name(&g->accs[a], h[a], 64), "%-.3e"};
    nl_report_table(r, NULL, title, 1 + g->naccs, cols);
    for (int ki = 0; ki < nk; ki++) {
        nl_report_cell_num(r, xs[ki]);
        for (int a = 0; a < g->naccs; a++) nl_report_cell_num(r, ys[a][ki]);
        nl_report_row_end(r);
    }
    nl_report_table(r, "series", NULL, 5,
                    (const nl_report_col[]){{"accumulator", "", NULL},
                                            {"acc_bits", "", NULL},
                                            {"promote", "", NULL},
                                            {"k", "", NULL},
                                            {"acc_err_max", "", NULL}});
    for (int a = 0; a < g->naccs; a++) {
        if (skipped[a]) continue;
        nl_report_cell_str(r, h[a]);
        nl_report_cell_int(r, g->accs[a].bits);
        nl_report_cell_int(r, g->accs[a].promote);
        nl_report_cell_nums(r, xs, nk);
        nl_report_cell_nums(r, ys[a], nk);
        nl_report_row_end(r);
    }
    if (g->svg) {
        if (nl_fp8_study_sweep_svg(g->svg, c, sc, g->accs, g->naccs, &sw)) {
            nl_report_free(r);
            return nl_cli_fail("fp8 gemm --svg");
        }
        nl_report_str(r, "svg", "", g->svg);
        nl_report_note(r, "wrote %s", g->svg);
    }
    return nl_report_print(r, g->json);
}

/* One row per scaling and accumulator: the errors and the saturated / flushed operand counts. */
static int gemm_table(const gemm_args *g) {
    const nl_fp8_study_cfg *c = &g->c;
    nl_fp8_study_row rows[NL_FP8_SCALE_COUNT * 3];
    int nrows = 0;
    for (int s = 0; s < NL_FP8_SCALE_COUNT; s++)
        for (int a = 0; g->want[s] && a < g->naccs; a++)
            rows[nrows++] = (nl_fp8_study_row){.scaling = (nl_fp8_scaling)s, .acc = g->accs[a]};
    if (nl_fp8_study_run(c, c->K, rows, nrows)) return nl_cli_fail("fp8 gemm");
    nl_report *r = nl_report_new("fp8 gemm");
    nl_report_int(r, "m", "", c->M, NULL);
    nl_report_int(r, "n", "", c->N, NULL);
    nl_report_int(r, "k", "", c->K, NULL);
    nl_report_str(r, "format", "", nl_fmt_name(c->fmt));
    nl_report_str(r, "dist", "", dist_names[c->dist]);
    nl_report_int(r, "seed", "", (long long)c->seed, NULL);
    char outl[96] = "";
    if (c->outlier_col >= 0) {
        nl_report_int(r, "outlier_col", "", c->outlier_col, NULL);
        nl_report_num(r, "outlier_factor", "", c->outlier_factor, NULL, NULL);
        snprintf(outl, sizeof outl, ", column %lld of A x %g", (long long)c->outlier_col, c->outlier_factor);
    }
    char title[256];
    snprintf(title, sizeof title, "FP8 GEMM %lld x %lld x %lld, %s, %s operands%s", (long long)c->M, (long long)c->N,
             (long long)c->K, nl_fmt_name(c->fmt), dist_labels[c->dist], outl);
    nl_report_table(r, "rows", title, 16,
                    (const nl_report_col[]){{"scaling", "scaling", NULL},
                                            {NULL, "accumulator", NULL},
                                            {"acc_bits", "", NULL},
                                            {"promote", "", NULL},
                                            {"group", "", NULL},
                                            {"skipped", "", NULL},
                                            {"acc_err_max", "acc err max", "%-.3e"},
                                            {"acc_err_fro", "acc err fro", "%-.3e"},
                                            {"total_err_max", "total err max", "%-.3e"},
                                            {"total_err_fro", "total err fro", "%-.3e"},
                                            {"saturated_a", "", NULL},
                                            {"saturated_b", "", NULL},
                                            {"flushed_a", "", NULL},
                                            {"flushed_b", "", NULL},
                                            {NULL, "saturated", NULL},
                                            {NULL, "flushed to 0", NULL}});
    for (int i = 0; i < nrows; i++) {
        const nl_fp8_study_row *row = &rows[i];
        char lab[64], sat[32], fl[32];
        const double nan = NAN;
        nl_report_cell_str(r, nl_fp8_scaling_name(row->scaling));
        nl_report_cell_str(r, nl_fp8_acc_name(&row->acc, lab, sizeof lab));
        nl_report_cell_int(r, row->acc.bits);
        nl_report_cell_int(r, row->acc.promote);
        nl_report_cell_int(r, row->acc.group);
        nl_report_cell_str(r,
                           row->skipped ? "block scales are applied at promotion; needs promote dividing 128" : NULL);
        nl_report_cell_num(r, row->skipped ? nan : row->acc_max);
        nl_report_cell_num(r, row->skipped ? nan : row->acc_fro);
        nl_report_cell_num(r, row->skipped ? nan : row->tot_max);
        nl_report_cell_num(r, row->skipped ? nan : row->tot_fro);
        nl_report_cell_int(r, row->st.a.saturated);
        nl_report_cell_int(r, row->st.b.saturated);
        nl_report_cell_int(r, row->st.a.flushed);
        nl_report_cell_int(r, row->st.b.flushed);
        snprintf(sat, sizeof sat, "%lld", (long long)(row->st.a.saturated + row->st.b.saturated));
        snprintf(fl, sizeof fl, "%lld", (long long)(row->st.a.flushed + row->st.b.flushed));
        nl_report_cell_str(r, row->skipped ? "-" : sat);
        nl_report_cell_str(r, row->skipped ? "-" : fl);
        nl_report_row_end(r);
    }
    nl_report_note(r, "acc err: vs fp64 of the FP8 operands; total err: vs fp64 of the fp32 operands;\n"
                      "max = max|C-R| / max|R|, fro = ||C-R|| / ||R||. n/a: block scales are applied at promotion.");
    return nl_report_print(r, g->json);
}

static int gemm_cmd(int argc, char **argv) {
    gemm_args g;
    int rc = gemm_parse(argc, argv, &g);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    return g.sweep ? gemm_sweep(&g) : gemm_table(&g);
}

/* ---- fp8 curves: loss curves of several training logs (train --log CSV) in one SVG ---------- */

/* The table (and JSON) of the curves: per run its points, or the summary row in the text form. */
static int curves_print(const nl_loss_curve *runs, char (*labels)[128], int nrun, int val, const char *svg, int json) {
    nl_report *r = nl_report_new("fp8 curves");
    nl_report_table(r, "runs", NULL, 7,
                    (const nl_report_col[]){{"label", "run", NULL},
                                            {"step", "", NULL},
                                            {val ? "val_loss" : "train_loss", "", NULL},
                                            {NULL, "points", "%-.0f"},
                                            {NULL, "last step", "%-.0f"},
                                            {NULL, "last loss", "%-.4f"},
                                            {NULL, "min loss", "%-.4f"}});
    for (int i = 0; i < nrun; i++) {
        double mn = runs[i].loss[0];
        for (size_t k = 1; k < runs[i].n; k++) mn = fmin(mn, runs[i].loss[k]);
        nl_report_cell_str(r, labels[i]);
        nl_report_cell_nums(r, runs[i].step, (int)runs[i].n);
        nl_report_cell_nums(r, runs[i].loss, (int)runs[i].n);
        nl_report_cell_num(r, (double)runs[i].n);
        nl_report_cell_num(r, runs[i].step[runs[i].n - 1]);
        nl_report_cell_num(r, runs[i].loss[runs[i].n - 1]);
        nl_report_cell_num(r, mn);
        nl_report_row_end(r);
    }
    if (svg) nl_report_note(r, "wrote %s", svg);
    return nl_report_print(r, json);
}

static int curves_cmd(int argc, char **argv) {
    nl_opt_list run_args = {{0}, 0};
    int train = 0, json = 0;
    const char *svg = NULL, *title = NULL;
    nl_opt opts[] = {
        NL_OPT_LIST("run", &run_args, "LABEL=CSV", "a `nanolm train --log` file and its label (repeat, up to 8)"),
        NL_OPT_STR("svg", &svg, "FILE", "write the curves as one SVG plot"),
        NL_OPT_FLAG("train", &train, "training loss instead of validation loss"),
        NL_OPT_STR("title", &title, "T", "title of the plot (default: validation loss / training loss)"),
        NL_OPT_FLAG("json", &json, "print the curves as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "fp8 curves",
        "nanolm fp8 curves --run LABEL=CSV [--run ...] [--svg FILE] [--train] [--title T] [--json]",
        "Validation (or --train: training) loss of several `nanolm train --log` files, as a table and in\n"
        "one SVG.",
        groups,
        1,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    const int val = !train;
    if (!title) title = val ? "validation loss" : "training loss";
    if (run_args.n == 0) return nl_cli_usage_error("fp8 curves: give at least one --run LABEL=CSV");
    if (run_args.n > 8) return nl_cli_usage_error("fp8 curves: at most 8 --run");
    nl_loss_curve runs[8];
    char labels[8][128];
    int nrun = 0;
    memset(runs, 0, sizeof runs);
    for (int i = 0; i < run_args.n; i++) {
        const char *eq = strchr(run_args.v[i], '=');
        size_t nlab = eq ? (size_t)(eq - run_args.v[i]) : 0;
        if (!eq || nlab == 0 || !eq[1] || nlab >= sizeof labels[i]) {
            rc = nl_cli_usage_error("fp8 curves: --run '%s': expected LABEL=CSV", run_args.v[i]);
            goto done;
        }
        memcpy(labels[i], run_args.v[i], nlab);
        labels[i][nlab] = 0;
        nrun++;
        if (nl_train_log_read_curve(eq + 1, val, &runs[i])) {
            rc = nl_cli_fail("fp8 curves");
            goto done;
        }
    }
    const char *names[8];
    for (int i = 0; i < nrun; i++) names[i] = labels[i];
    if (svg && nl_loss_curves_svg(svg, title, names, runs, nrun, val)) {
        rc = nl_cli_fail("fp8 curves --svg");
        goto done;
    }
    rc = curves_print(runs, labels, nrun, val, svg, json);
done:
    for (int i = 0; i < nrun; i++) { nl_loss_curve_free(&runs[i]); }
    return rc;
}

int nl_cmd_fp8(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    if (!strcmp(argv[1], "gemm")) return gemm_cmd(argc - 1, argv + 1);
    if (!strcmp(argv[1], "curves")) return curves_cmd(argc - 1, argv + 1);
    return nl_cli_usage_error("fp8: unknown subcommand '%s' (valid: gemm, curves)", argv[1]);
}
