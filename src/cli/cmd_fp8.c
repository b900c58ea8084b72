/* nanolm fp8 gemm: error of the emulated FP8 GEMM against fp64, per scaling and accumulator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/fp8.h"
#include "nanolm/svg.h"
#include "report.h"

typedef struct gemm_cfg {
    int64_t M, N, K;
    nl_format fmt;
    int uniform;         /* operands: 0 = N(0, 1), 1 = uniform [0, 1), 2 = uniform [-1, 1) */
    int64_t outlier_col; /* -1 = none */
    double outlier_factor;
    uint64_t seed;
    int history; /* delayed scaling: previous steps recorded before the measured call */
} gemm_cfg;

typedef struct gemm_row {
    nl_fp8_scaling scaling;
    nl_fp8_acc acc;
    int skipped; /* the combination is not defined (block scaling without promotion) */
    double acc_max, acc_fro, tot_max, tot_fro;
    nl_fp8_stats st;
} gemm_row;

static const char *const dist_names[3] = {"normal", "uniform", "symmetric"};
static const char *const dist_labels[3] = {"N(0,1)", "uniform [0,1)", "uniform [-1,1)"};

static void fill(float *x, int64_t n, int uniform, nl_rng *r) {
    for (int64_t i = 0; i < n; i++)
        x[i] = uniform == 2 ? 2.0f * nl_rng_float(r) - 1.0f : uniform ? nl_rng_float(r) : (float)nl_rng_normal(r);
}

/* A (M, K) and B (K, N) for a seed. The outlier multiplies column `col` of A (one input
 * channel) by the factor and divides row `col` of B by it, so the exact product is unchanged
 * (trained LLMs pair outlier activation channels with small weights, SmoothQuant §3) and the
 * errors measure only what quantization and accumulation lose. */
static void make_operands(const gemm_cfg *c, int64_t K, uint64_t seed, int with_outlier, float *A, float *B) {
    nl_rng r;
    nl_rng_seed(&r, seed);
    fill(A, c->M * K, c->uniform, &r);
    fill(B, K * c->N, c->uniform, &r);
    if (with_outlier && c->outlier_col >= 0 && c->outlier_col < K) {
        for (int64_t i = 0; i < c->M; i++) A[i * K + c->outlier_col] *= (float)c->outlier_factor;
        for (int64_t j = 0; j < c->N; j++) B[c->outlier_col * c->N + j] /= (float)c->outlier_factor;
    }
}

static const char *acc_label(const nl_fp8_acc *a, char *buf, size_t n) {
    if (a->bits == 0)
        snprintf(buf, n, "fp32");
    else if (a->promote == 0)
        snprintf(buf, n, "%d-bit, never promoted", a->bits);
    else
        snprintf(buf, n, "%d-bit, promote every %d", a->bits, a->promote);
    return buf;
}

/* Runs one setting on A, B (K inner) against the fp64 reference `ref` (M, N). */
static int run_setting(const gemm_cfg *c, int64_t K, const float *A, const float *B, const double *ref, gemm_row *row) {
    const int64_t M = c->M, N = c->N;
    row->skipped = 0;
    if (row->scaling == NL_FP8_SCALE_BLOCK && row->acc.bits &&
        (row->acc.promote == 0 || NL_FP8_BLOCK % row->acc.promote)) {
        row->skipped = 1;
        return NL_EXIT_OK;
    }
    nl_fp8_gemm_opts o;
    nl_fp8_gemm_opts_default(&o);
    o.fmt_a = o.fmt_b = c->fmt;
    o.scaling = row->scaling;
    o.acc = row->acc;
    nl_fp8_delayed da, db, da2, db2;
    float *Ad = nl_malloc((size_t)(M * K) * sizeof(float), "dequantized A");
    float *Bd = nl_malloc((size_t)(K * N) * sizeof(float), "dequantized B");
    float *C = nl_malloc((size_t)(M * N) * sizeof(float), "C");
    double *refq = nl_malloc((size_t)(M * N) * sizeof(double), "reference of the FP8 operands");
    int rc = NL_EXIT_OK;
    if (!Ad || !Bd || !C || !refq) {
        rc = nl_cli_fail("fp8 gemm");
        goto out;
    }
    if (row->scaling == NL_FP8_SCALE_DELAYED) {
        /* the history: previous steps of the same distribution, without the outlier */
        if (nl_fp8_delayed_init(&da, c->history, 0) || nl_fp8_delayed_init(&db, c->history, 0)) {
            rc = nl_cli_fail("fp8 gemm");
            goto out;
        }
        for (int h = 0; h < c->history; h++) {
            make_operands(c, K, c->seed + 1000 + (uint64_t)h, 0, Ad, Bd);
            if (nl_fp8_quantize(c->fmt, NL_FP8_SCALE_DELAYED, &da, M, K, 1, Ad, Ad, NULL) ||
                nl_fp8_quantize(c->fmt, NL_FP8_SCALE_DELAYED, &db, K, N, 0, Bd, Bd, NULL)) {
                rc = nl_cli_fail("fp8 gemm");
                goto out;
            }
        }
        da2 = da;
        db2 = db;
        o.delayed_a = &da;
        o.delayed_b = &db;
    }
    if (nl_fp8_quantize(c->fmt, row->scaling, &da2, M, K, 1, A, Ad, NULL) ||
        nl_fp8_quantize(c->fmt, row->scaling, &db2, K, N, 0, B, Bd, NULL) ||
        nl_fp8_gemm(&o, M, N, K, A, B, C, &row->st)) {
        rc = nl_cli_fail("fp8 gemm");
        goto out;
    }
    nl_fp8_gemm_ref_f64(M, N, K, Ad, Bd, refq);
    nl_fp8_rel_error(M * N, C, refq, &row->acc_max, &row->acc_fro);
    nl_fp8_rel_error(M * N, C, ref, &row->tot_max, &row->tot_fro);
out:
    nl_free(Ad);
    nl_free(Bd);
    nl_free(C);
    nl_free(refq);
    return rc;
}

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
    gemm_cfg c;
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
    gemm_cfg *c = &g->c;
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
    nl_fp8_acc accs[3] = {{0, (int)g->group, 0, NL_FP8_ACC_TRUNCATE},
                          {(int)g->bits, (int)g->group, 0, NL_FP8_ACC_TRUNCATE},
                          {(int)g->bits, (int)g->group, (int)g->promote, NL_FP8_ACC_TRUNCATE}};
    memcpy(g->accs, accs, sizeof accs);
    g->naccs = g->promote > 0 ? 3 : 2;
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
        NL_OPT_CHOICE("dist", &g->c.uniform, "normal|uniform|symmetric",
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

/* Operands A (M, K), B (K, N) and their fp64 product ref (M, N) for the seed; NULL when out of memory. */
typedef struct gemm_operands {
    float *A, *B;
    double *ref;
} gemm_operands;

static void operands_free(gemm_operands *o) {
    nl_free(o->A);
    nl_free(o->B);
    nl_free(o->ref);
}

static nl_status operands_make(const gemm_cfg *c, int64_t K, gemm_operands *o) {
    o->A = nl_malloc((size_t)(c->M * K) * sizeof(float), "A");
    o->B = nl_malloc((size_t)(K * c->N) * sizeof(float), "B");
    o->ref = nl_malloc((size_t)(c->M * c->N) * sizeof(double), "reference");
    if (!o->A || !o->B || !o->ref) {
        operands_free(o);
        return NL_ERR_NOMEM;
    }
    make_operands(c, K, c->seed, 1, o->A, o->B);
    nl_fp8_gemm_ref_f64(c->M, c->N, K, o->A, o->B, o->ref);
    return NL_OK;
}

/* --sweep-k: acc err (max) of each accumulator for K = 128, 256, ... up to --k, one scaling. */
static int gemm_sweep(const gemm_args *g) {
    const gemm_cfg *c = &g->c;
    nl_fp8_scaling sc = NL_FP8_SCALE_TENSOR;
    if (g->scaling_given) {
        int nw = 0;
        for (int i = 0; i < NL_FP8_SCALE_COUNT; i++)
            if (g->want[i]) sc = (nl_fp8_scaling)i, nw++;
        if (nw != 1) return nl_cli_usage_error("fp8 gemm: --sweep-k takes one --scaling");
    }
    int64_t Ks[32];
    int nk = 0;
    for (int64_t k = 128; k <= c->K && nk < 32; k *= 2) Ks[nk++] = k;
    if (nk == 0) return nl_cli_usage_error("fp8 gemm: --sweep-k needs --k >= 128");
    double xs[32], ys[3][32];
    int skipped[3] = {0, 0, 0};
    for (int ki = 0; ki < nk; ki++) {
        gemm_operands o;
        if (operands_make(c, Ks[ki], &o)) return nl_cli_fail("fp8 gemm");
        xs[ki] = (double)Ks[ki];
        for (int a = 0; a < g->naccs; a++) {
            gemm_row row = {.scaling = sc, .acc = g->accs[a]};
            int rc = run_setting(c, Ks[ki], o.A, o.B, o.ref, &row);
            if (rc) {
                operands_free(&o);
                return rc;
            }
            skipped[a] = row.skipped;
            ys[a][ki] = row.skipped ? NAN : row.acc_max;
        }
        operands_free(&o);
    }
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
    for (int a = 0; a < g->naccs; a++) cols[1 + a] = (nl_report_col){NULL, acc_label(&g->accs[a], h[a], 64), "%-.3e"};
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
        nl_svg_series ser[3];
        int ns = 0;
        for (int a = 0; a < g->naccs; a++)
            if (!skipped[a])
                ser[ns++] = (nl_svg_series){.name = h[a], .x = xs, .y = ys[a], .n = (size_t)nk, .markers = 1};
        snprintf(title, sizeof title, "FP8 GEMM accumulation error vs K (%s, %s scaling, %lldx%lld)",
                 nl_fmt_name(c->fmt), nl_fp8_scaling_name(sc), (long long)c->M, (long long)c->N);
        nl_svg_plot_opts po = {.title = title,
                               .xlabel = "K (products per output)",
                               .ylabel = "max |C - R| / max |R|",
                               .logx = 1,
                               .logy = 1};
        if (nl_svg_plot(g->svg, &po, ser, (size_t)ns)) {
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
    const gemm_cfg *c = &g->c;
    gemm_operands o;
    if (operands_make(c, c->K, &o)) return nl_cli_fail("fp8 gemm");
    gemm_row rows[NL_FP8_SCALE_COUNT * 3];
    int nrows = 0;
    for (int s = 0; s < NL_FP8_SCALE_COUNT; s++)
        for (int a = 0; g->want[s] && a < g->naccs; a++) {
            gemm_row *row = &rows[nrows++];
            *row = (gemm_row){.scaling = (nl_fp8_scaling)s, .acc = g->accs[a]};
            int rc = run_setting(c, c->K, o.A, o.B, o.ref, row);
            if (rc) {
                operands_free(&o);
                return rc;
            }
        }
    operands_free(&o);
    nl_report *r = nl_report_new("fp8 gemm");
    nl_report_int(r, "m", "", c->M, NULL);
    nl_report_int(r, "n", "", c->N, NULL);
    nl_report_int(r, "k", "", c->K, NULL);
    nl_report_str(r, "format", "", nl_fmt_name(c->fmt));
    nl_report_str(r, "dist", "", dist_names[c->uniform]);
    nl_report_int(r, "seed", "", (long long)c->seed, NULL);
    char outl[96] = "";
    if (c->outlier_col >= 0) {
        nl_report_int(r, "outlier_col", "", c->outlier_col, NULL);
        nl_report_num(r, "outlier_factor", "", c->outlier_factor, NULL, NULL);
        snprintf(outl, sizeof outl, ", column %lld of A x %g", (long long)c->outlier_col, c->outlier_factor);
    }
    char title[256];
    snprintf(title, sizeof title, "FP8 GEMM %lld x %lld x %lld, %s, %s operands%s", (long long)c->M, (long long)c->N,
             (long long)c->K, nl_fmt_name(c->fmt), dist_labels[c->uniform], outl);
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
        const gemm_row *row = &rows[i];
        char lab[64], sat[32], fl[32];
        const double nan = NAN;
        nl_report_cell_str(r, nl_fp8_scaling_name(row->scaling));
        nl_report_cell_str(r, acc_label(&row->acc, lab, sizeof lab));
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

typedef struct curve {
    const char *label;
    double *step, *loss;
    size_t n;
} curve;

/* Reads step and train_loss or val_loss (the CSV of nanolm train --log). */
static nl_status read_curve(const char *path, int val, curve *c) {
    char *text;
    size_t bytes;
    NL_TRY(nl_read_file(path, &text, &bytes));
    size_t lines = 0;
    for (size_t i = 0; i < bytes; i++) lines += text[i] == '\n';
    c->step = nl_malloc((lines + 1) * sizeof(double), "curve");
    c->loss = nl_malloc((lines + 1) * sizeof(double), "curve");
    c->n = 0;
    if (!c->step || !c->loss) {
        nl_free(text);
        return NL_ERR_NOMEM;
    }
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strncmp(line, "step,lr,train_loss,val_loss", 27)) {
        nl_free(text);
        return nl_fail(NL_ERR_FORMAT, "%s: not a training log (expected the header of nanolm train --log)", path);
    }
    while ((line = strtok_r(NULL, "\n", &save))) {
        /* step,lr,train_loss,val_loss,... ; val_loss may be empty */
        char *f[4] = {line, NULL, NULL, NULL};
        for (int k = 1; k < 4; k++) {
            char *comma = f[k - 1] ? strchr(f[k - 1], ',') : NULL;
            if (comma) {
                *comma = 0;
                f[k] = comma + 1;
            }
        }
        if (!f[3]) continue;
        const char *v = val ? f[3] : f[2];
        if (!*v || *v == ',') continue;
        c->step[c->n] = atof(f[0]);
        c->loss[c->n] = atof(v);
        c->n++;
    }
    nl_free(text);
    if (c->n == 0) return nl_fail(NL_ERR_FORMAT, "%s: no %s loss values", path, val ? "validation" : "training");
    return NL_OK;
}

/* The table (and JSON) of the curves: per run its points, or the summary row in the text form. */
static int curves_print(const curve *runs, int nrun, int val, const char *svg, int json) {
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
        nl_report_cell_str(r, runs[i].label);
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
    curve runs[8];
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
        runs[i].label = labels[i];
        nrun++;
        if (read_curve(eq + 1, val, &runs[i])) {
            rc = nl_cli_fail("fp8 curves");
            goto done;
        }
    }
    if (svg) {
        nl_svg_series ser[8];
        for (int i = 0; i < nrun; i++)
            ser[i] = (nl_svg_series){
                .name = runs[i].label, .x = runs[i].step, .y = runs[i].loss, .n = runs[i].n, .markers = val};
        nl_svg_plot_opts po = {.title = title, .xlabel = "step", .ylabel = "loss (nats/token)"};
        if (nl_svg_plot(svg, &po, ser, (size_t)nrun)) {
            rc = nl_cli_fail("fp8 curves --svg");
            goto done;
        }
    }
    rc = curves_print(runs, nrun, val, svg, json);
done:
    for (int i = 0; i < nrun; i++) {
        nl_free(runs[i].step);
        nl_free(runs[i].loss);
    }
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
