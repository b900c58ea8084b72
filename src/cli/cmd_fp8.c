/* nanolm fp8 gemm: error of the emulated FP8 GEMM against fp64, per scaling and accumulator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nanolm/fp8.h"
#include "nanolm/svg.h"

typedef struct gemm_cfg {
    int64_t M, N, K;
    nl_format fmt;
    int uniform;          /* operands: 0 = N(0, 1), 1 = uniform [0, 1), 2 = uniform [-1, 1) */
    int64_t outlier_col;  /* -1 = none */
    double outlier_factor;
    uint64_t seed;
    int history;          /* delayed scaling: previous steps recorded before the measured call */
} gemm_cfg;

typedef struct gemm_row {
    nl_fp8_scaling scaling;
    nl_fp8_acc acc;
    int skipped;          /* the combination is not defined (block scaling without promotion) */
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
    if (with_outlier && c->outlier_col >= 0 && c->outlier_col < K)
    {
        for (int64_t i = 0; i < c->M; i++) A[i * K + c->outlier_col] *= (float)c->outlier_factor;
        for (int64_t j = 0; j < c->N; j++) B[c->outlier_col * c->N + j] /= (float)c->outlier_factor;
    }
}

static const char *acc_label(const nl_fp8_acc *a, char *buf, size_t n) {
    if (a->bits == 0) snprintf(buf, n, "fp32");
    else if (a->promote == 0) snprintf(buf, n, "%d-bit, never promoted", a->bits);
    else snprintf(buf, n, "%d-bit, promote every %d", a->bits, a->promote);
    return buf;
}

/* Runs one setting on A, B (K inner) against the fp64 reference `ref` (M, N). */
static int run_setting(const gemm_cfg *c, int64_t K, const float *A, const float *B, const double *ref,
                       gemm_row *row) {
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
    fprintf(f,
            "usage: nanolm fp8 gemm --m M --n N --k K [--scaling tensor|delayed|block|mx|all[,..]]\n"
            "                       [--format e4m3|e5m2] [--acc-bits 14] [--promote 128] [--group 32]\n"
            "                       [--outlier COL:FACTOR] [--dist normal|uniform|symmetric] [--history 16]\n"
            "                       [--seed S] [--json] [--sweep-k [--svg FILE]]\n"
            "  Emulated FP8 GEMM C = A.B (A: M x K, B: K x N, random operands) against an fp64\n"
            "  reference. For each scaling, three accumulators: fp32, the limited one never\n"
            "  promoted, and promoted to fp32 every --promote products. Limited (Hopper's FP8\n"
            "  tensor core as DeepSeek-V3 describes it): each group of --group products is aligned\n"
            "  to its largest exponent and every product kept as an acc-bits two's-complement\n"
            "  integer (sign included) by floor; the group's exact sum goes into a register of\n"
            "  acc-bits significant bits, truncated toward zero.\n"
            "  --dist: normal = N(0,1), uniform = U[0,1), symmetric = U[-1,1).\n"
            "  'acc err' compares with fp64 of the FP8 operands (what accumulation loses),\n"
            "  'total err' with fp64 of the fp32 operands. max = max|C-R| / max|R|, fro = ||C-R||/||R||.\n"
            "  --outlier COL:FACTOR multiplies column COL of A (one input channel) by FACTOR and divides\n"
            "  row COL of B by it: the exact product is unchanged, only the representation is stressed.\n"
            "  --history H: delayed scaling first records H steps of the same distribution without\n"
            "  the outlier (so an outlier beyond the history's max saturates).\n"
            "  --sweep-k: error (acc err, max) versus K = 128, 256, ... up to --k; --svg writes the plot.\n"
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

static cJSON *row_json(const gemm_row *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "scaling", nl_fp8_scaling_name(r->scaling));
    cJSON_AddNumberToObject(o, "acc_bits", r->acc.bits);
    cJSON_AddNumberToObject(o, "promote", r->acc.promote);
    cJSON_AddNumberToObject(o, "group", r->acc.group);
    if (r->skipped) {
        cJSON_AddStringToObject(o, "skipped", "block scales are applied at promotion; needs promote dividing 128");
        return o;
    }
    cJSON_AddNumberToObject(o, "acc_err_max", r->acc_max);
    cJSON_AddNumberToObject(o, "acc_err_fro", r->acc_fro);
    cJSON_AddNumberToObject(o, "total_err_max", r->tot_max);
    cJSON_AddNumberToObject(o, "total_err_fro", r->tot_fro);
    cJSON_AddNumberToObject(o, "saturated_a", (double)r->st.a.saturated);
    cJSON_AddNumberToObject(o, "saturated_b", (double)r->st.b.saturated);
    cJSON_AddNumberToObject(o, "flushed_a", (double)r->st.a.flushed);
    cJSON_AddNumberToObject(o, "flushed_b", (double)r->st.b.flushed);
    return o;
}

static int gemm_cmd(int argc, char **argv) {
    enum { O_M = 1000, O_N, O_K, O_SCALING, O_FORMAT, O_BITS, O_PROMOTE, O_GROUP, O_OUTLIER, O_SEED,
           O_JSON, O_SWEEP, O_SVG, O_DIST, O_HISTORY, O_HELP };
    static const struct option opts[] = {
        {"m", required_argument, 0, O_M}, {"n", required_argument, 0, O_N}, {"k", required_argument, 0, O_K},
        {"scaling", required_argument, 0, O_SCALING}, {"format", required_argument, 0, O_FORMAT},
        {"acc-bits", required_argument, 0, O_BITS}, {"promote", required_argument, 0, O_PROMOTE},
        {"group", required_argument, 0, O_GROUP}, {"outlier", required_argument, 0, O_OUTLIER},
        {"seed", required_argument, 0, O_SEED}, {"json", no_argument, 0, O_JSON},
        {"sweep-k", no_argument, 0, O_SWEEP}, {"svg", required_argument, 0, O_SVG},
        {"dist", required_argument, 0, O_DIST}, {"history", required_argument, 0, O_HISTORY},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    gemm_cfg c = {.M = 128, .N = 128, .K = 4096, .fmt = NL_FMT_E4M3, .outlier_col = -1,
                  .outlier_factor = 1.0, .seed = 1, .history = 16};
    int want[NL_FP8_SCALE_COUNT] = {1, 1, 1, 1}, scaling_given = 0;
    int64_t bits = 14, promote = 128, group = 32, v;
    int json = 0, sweep = 0, ch;
    const char *svg = NULL;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case O_M: if (nl_cli_int("--m", optarg, 1, 1 << 16, &c.M)) return NL_EXIT_USAGE; break;
        case O_N: if (nl_cli_int("--n", optarg, 1, 1 << 16, &c.N)) return NL_EXIT_USAGE; break;
        case O_K: if (nl_cli_int("--k", optarg, 1, 1 << 20, &c.K)) return NL_EXIT_USAGE; break;
        case O_SCALING: if (parse_scalings(optarg, want)) return NL_EXIT_USAGE; scaling_given = 1; break;
        case O_FORMAT:
            if (nl_fp8_format_from_name(optarg, &c.fmt)) return nl_cli_usage_error("fp8 gemm: --format: %s", nl_last_error());
            break;
        case O_BITS: if (nl_cli_int("--acc-bits", optarg, 2, 24, &bits)) return NL_EXIT_USAGE; break;
        case O_PROMOTE: if (nl_cli_int("--promote", optarg, 0, 1 << 20, &promote)) return NL_EXIT_USAGE; break;
        case O_GROUP: if (nl_cli_int("--group", optarg, 1, 1 << 20, &group)) return NL_EXIT_USAGE; break;
        case O_OUTLIER: {
            char *colon = strchr(optarg, ':');
            if (!colon) return nl_cli_usage_error("fp8 gemm: --outlier '%s': expected COL:FACTOR", optarg);
            *colon = 0;
            if (nl_cli_int("--outlier column", optarg, 0, INT64_MAX, &c.outlier_col) ||
                nl_cli_double("--outlier factor", colon + 1, &c.outlier_factor))
                return NL_EXIT_USAGE;
            if (!isfinite(c.outlier_factor) || c.outlier_factor <= 0.0)
                return nl_cli_usage_error("fp8 gemm: --outlier factor must be finite and > 0");
            break;
        }
        case O_SEED: if (nl_cli_int("--seed", optarg, 0, INT64_MAX, &v)) return NL_EXIT_USAGE; c.seed = (uint64_t)v; break;
        case O_JSON: json = 1; break;
        case O_SWEEP: sweep = 1; break;
        case O_SVG: svg = optarg; break;
        case O_DIST:
            if (!strcmp(optarg, "normal")) c.uniform = 0;
            else if (!strcmp(optarg, "uniform")) c.uniform = 1;
            else if (!strcmp(optarg, "symmetric")) c.uniform = 2;
            else return nl_cli_usage_error("fp8 gemm: --dist '%s' (valid: normal, uniform, symmetric)", optarg);
            break;
        case O_HISTORY: if (nl_cli_int("--history", optarg, 1, NL_FP8_HISTORY_MAX, &v)) return NL_EXIT_USAGE; c.history = (int)v; break;
        case O_HELP: usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("fp8 gemm", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("fp8 gemm: unexpected argument '%s'", argv[optind]);
    if (c.outlier_col >= c.K)
        return nl_cli_usage_error("fp8 gemm: --outlier column %lld is outside K = %lld", (long long)c.outlier_col, (long long)c.K);
    if (svg && !sweep) return nl_cli_usage_error("fp8 gemm: --svg needs --sweep-k");
    if (promote % group)
        return nl_cli_usage_error("fp8 gemm: --promote %lld is not a multiple of --group %lld", (long long)promote, (long long)group);
    nl_fp8_acc accs[3] = {{0, (int)group, 0, NL_FP8_ACC_TRUNCATE},
                          {(int)bits, (int)group, 0, NL_FP8_ACC_TRUNCATE},
                          {(int)bits, (int)group, (int)promote, NL_FP8_ACC_TRUNCATE}};
    const int naccs = promote > 0 ? 3 : 2;
    char lab[64];

    if (sweep) {
        nl_fp8_scaling sc = NL_FP8_SCALE_TENSOR;
        if (scaling_given) {
            int nw = 0;
            for (int i = 0; i < NL_FP8_SCALE_COUNT; i++)
                if (want[i]) { sc = (nl_fp8_scaling)i; nw++; }
            if (nw != 1) return nl_cli_usage_error("fp8 gemm: --sweep-k takes one --scaling");
        }
        int64_t Ks[32];
        int nk = 0;
        for (int64_t k = 128; k <= c.K && nk < 32; k *= 2) Ks[nk++] = k;
        if (nk == 0) return nl_cli_usage_error("fp8 gemm: --sweep-k needs --k >= 128");
        double xs[32], ys[3][32];
        int skipped[3] = {0, 0, 0};
        for (int ki = 0; ki < nk; ki++) {
            const int64_t K = Ks[ki];
            float *A = nl_malloc((size_t)(c.M * K) * sizeof(float), "A");
            float *B = nl_malloc((size_t)(K * c.N) * sizeof(float), "B");
            double *ref = nl_malloc((size_t)(c.M * c.N) * sizeof(double), "reference");
            if (!A || !B || !ref) return nl_cli_fail("fp8 gemm");
            make_operands(&c, K, c.seed, 1, A, B);
            nl_fp8_gemm_ref_f64(c.M, c.N, K, A, B, ref);
            xs[ki] = (double)K;
            for (int a = 0; a < naccs; a++) {
                gemm_row row = {.scaling = sc, .acc = accs[a]};
                int rc = run_setting(&c, K, A, B, ref, &row);
                if (rc) return rc;
                skipped[a] = row.skipped;
                ys[a][ki] = row.acc_max;
            }
            nl_free(A);
            nl_free(B);
            nl_free(ref);
        }
        cJSON *d = NULL;
        if (json) {
            d = cJSON_CreateObject();
            cJSON_AddStringToObject(d, "scaling", nl_fp8_scaling_name(sc));
            cJSON_AddStringToObject(d, "format", nl_fmt_name(c.fmt));
            cJSON_AddNumberToObject(d, "m", (double)c.M);
            cJSON_AddNumberToObject(d, "n", (double)c.N);
            cJSON *arr = cJSON_AddArrayToObject(d, "series");
            for (int a = 0; a < naccs; a++) {
                if (skipped[a]) continue;
                cJSON *s = cJSON_CreateObject();
                cJSON_AddStringToObject(s, "accumulator", acc_label(&accs[a], lab, sizeof lab));
                cJSON_AddNumberToObject(s, "acc_bits", accs[a].bits);
                cJSON_AddNumberToObject(s, "promote", accs[a].promote);
                cJSON_AddItemToObject(s, "k", cJSON_CreateDoubleArray(xs, nk));
                cJSON_AddItemToObject(s, "acc_err_max", cJSON_CreateDoubleArray(ys[a], nk));
                cJSON_AddItemToArray(arr, s);
            }
            if (svg) cJSON_AddStringToObject(d, "svg", svg);
        } else {
            printf("acc err (max|C-R|/max|R|, R = fp64 of the FP8 operands) vs K: %s scaling, %s, M=%lld N=%lld\n",
                   nl_fp8_scaling_name(sc), nl_fmt_name(c.fmt), (long long)c.M, (long long)c.N);
        }
        nl_table t;
        const char *hdr[4] = {"K", "", "", ""};
        char h[3][64];
        for (int a = 0; a < naccs; a++) hdr[1 + a] = acc_label(&accs[a], h[a], sizeof h[a]);
        nl_table_init(&t, 1 + naccs, hdr);
        for (int ki = 0; ki < nk; ki++) {
            char cell[4][32];
            snprintf(cell[0], 32, "%lld", (long long)Ks[ki]);
            for (int a = 0; a < naccs; a++) {
                if (skipped[a]) snprintf(cell[1 + a], 32, "n/a");
                else snprintf(cell[1 + a], 32, "%.3e", ys[a][ki]);
            }
            if (naccs == 3) nl_table_row(&t, cell[0], cell[1], cell[2], cell[3]);
            else nl_table_row(&t, cell[0], cell[1], cell[2]);
        }
        if (!json) nl_table_print(&t, stdout);
        nl_table_free(&t);
        if (svg) {
            nl_svg_series ser[3];
            int ns = 0;
            for (int a = 0; a < naccs; a++) {
                if (skipped[a]) continue;
                ser[ns] = (nl_svg_series){.name = hdr[1 + a], .x = xs, .y = ys[a], .n = (size_t)nk, .markers = 1};
                ns++;
            }
            char title[160];
            snprintf(title, sizeof title, "FP8 GEMM accumulation error vs K (%s, %s scaling, %lldx%lld)",
                     nl_fmt_name(c.fmt), nl_fp8_scaling_name(sc), (long long)c.M, (long long)c.N);
            nl_svg_plot_opts po = {.title = title, .xlabel = "K (products per output)",
                                   .ylabel = "max |C - R| / max |R|", .logx = 1, .logy = 1};
            if (nl_svg_plot(svg, &po, ser, (size_t)ns)) return nl_cli_fail("fp8 gemm --svg");
            if (!json) printf("wrote %s\n", svg);
        }
        return json ? nl_cli_print_json(d) : NL_EXIT_OK;
    }

    const int64_t M = c.M, N = c.N, K = c.K;
    float *A = nl_malloc((size_t)(M * K) * sizeof(float), "A");
    float *B = nl_malloc((size_t)(K * N) * sizeof(float), "B");
    double *ref = nl_malloc((size_t)(M * N) * sizeof(double), "reference");
    if (!A || !B || !ref) return nl_cli_fail("fp8 gemm");
    make_operands(&c, K, c.seed, 1, A, B);
    nl_fp8_gemm_ref_f64(M, N, K, A, B, ref);
    gemm_row rows[NL_FP8_SCALE_COUNT * 3];
    int nrows = 0;
    for (int s = 0; s < NL_FP8_SCALE_COUNT; s++) {
        if (!want[s]) continue;
        for (int a = 0; a < naccs; a++) {
            gemm_row *r = &rows[nrows++];
            memset(r, 0, sizeof *r);
            r->scaling = (nl_fp8_scaling)s;
            r->acc = accs[a];
            int rc = run_setting(&c, K, A, B, ref, r);
            if (rc) return rc;
        }
    }
    nl_free(A);
    nl_free(B);
    nl_free(ref);
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "m", (double)M);
        cJSON_AddNumberToObject(d, "n", (double)N);
        cJSON_AddNumberToObject(d, "k", (double)K);
        cJSON_AddStringToObject(d, "format", nl_fmt_name(c.fmt));
        cJSON_AddStringToObject(d, "dist", dist_names[c.uniform]);
        cJSON_AddNumberToObject(d, "seed", (double)c.seed);
        if (c.outlier_col >= 0) {
            cJSON_AddNumberToObject(d, "outlier_col", (double)c.outlier_col);
            cJSON_AddNumberToObject(d, "outlier_factor", c.outlier_factor);
        }
        cJSON *arr = cJSON_AddArrayToObject(d, "rows");
        for (int i = 0; i < nrows; i++) cJSON_AddItemToArray(arr, row_json(&rows[i]));
        return nl_cli_print_json(d);
    }
    printf("FP8 GEMM %lld x %lld x %lld, %s, %s operands%s", (long long)M, (long long)N, (long long)K,
           nl_fmt_name(c.fmt), dist_labels[c.uniform], c.outlier_col >= 0 ? "" : "\n");
    if (c.outlier_col >= 0) printf(", column %lld of A x %g\n", (long long)c.outlier_col, c.outlier_factor);
    static const char *const hdr[] = {"scaling", "accumulator", "acc err max", "acc err fro",
                                      "total err max", "total err fro", "saturated", "flushed to 0"};
    nl_table t;
    nl_table_init(&t, 8, hdr);
    for (int i = 0; i < nrows; i++) {
        const gemm_row *r = &rows[i];
        acc_label(&r->acc, lab, sizeof lab);
        if (r->skipped)
            nl_table_rowf(&t, "%s|%s|n/a|n/a|n/a|n/a|-|-", nl_fp8_scaling_name(r->scaling), lab);
        else
            nl_table_rowf(&t, "%s|%s|%.3e|%.3e|%.3e|%.3e|%lld|%lld", nl_fp8_scaling_name(r->scaling), lab,
                          r->acc_max, r->acc_fro, r->tot_max, r->tot_fro,
                          (long long)(r->st.a.saturated + r->st.b.saturated),
                          (long long)(r->st.a.flushed + r->st.b.flushed));
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    printf("acc err: vs fp64 of the FP8 operands; total err: vs fp64 of the fp32 operands;\n"
           "max = max|C-R| / max|R|, fro = ||C-R|| / ||R||. n/a: block scales are applied at promotion.\n");
    return NL_EXIT_OK;
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
            if (comma) { *comma = 0; f[k] = comma + 1; }
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

static int curves_cmd(int argc, char **argv) {
    static const struct option opts[] = {{"run", required_argument, 0, 'r'}, {"svg", required_argument, 0, 's'},
                                         {"train", no_argument, 0, 't'}, {"title", required_argument, 0, 'T'},
                                         {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    curve runs[8];
    int nrun = 0, val = 1, json = 0, ch;
    const char *svg = NULL, *title = "validation loss";
    char *paths[8];
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'r': {
            if (nrun == 8) return nl_cli_usage_error("fp8 curves: at most 8 --run");
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || !eq[1]) return nl_cli_usage_error("fp8 curves: --run '%s': expected LABEL=CSV", optarg);
            *eq = 0;
            runs[nrun].label = optarg;
            paths[nrun++] = eq + 1;
            break;
        }
        case 's': svg = optarg; break;
        case 't': val = 0; title = "training loss"; break;
        case 'T': title = optarg; break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: nanolm fp8 curves --run LABEL=CSV [--run ...] [--svg FILE] [--train] [--title T] [--json]\n"
                   "  Validation (or --train: training) loss of several `nanolm train --log` files, as a table and in\n"
                   "  one SVG.\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("fp8 curves", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("fp8 curves: unexpected argument '%s'", argv[optind]);
    if (nrun == 0) return nl_cli_usage_error("fp8 curves: give at least one --run LABEL=CSV");
    for (int i = 0; i < nrun; i++)
        if (read_curve(paths[i], val, &runs[i])) return nl_cli_fail("fp8 curves");
    int rc = NL_EXIT_OK;
    if (json) {
        cJSON *d = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(d, "runs");
        for (int i = 0; i < nrun; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "label", runs[i].label);
            cJSON_AddItemToObject(o, "step", cJSON_CreateDoubleArray(runs[i].step, (int)runs[i].n));
            cJSON_AddItemToObject(o, val ? "val_loss" : "train_loss", cJSON_CreateDoubleArray(runs[i].loss, (int)runs[i].n));
            cJSON_AddItemToArray(arr, o);
        }
        rc = nl_cli_print_json(d);
    } else {
        static const char *const hdr[] = {"run", "points", "last step", "last loss", "min loss"};
        nl_table t;
        nl_table_init(&t, 5, hdr);
        for (int i = 0; i < nrun; i++) {
            double mn = runs[i].loss[0];
            for (size_t k = 1; k < runs[i].n; k++) mn = fmin(mn, runs[i].loss[k]);
            nl_table_rowf(&t, "%s|%zu|%.0f|%.4f|%.4f", runs[i].label, runs[i].n, runs[i].step[runs[i].n - 1],
                          runs[i].loss[runs[i].n - 1], mn);
        }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
    }
    if (svg) {
        nl_svg_series ser[8];
        for (int i = 0; i < nrun; i++)
            ser[i] = (nl_svg_series){.name = runs[i].label, .x = runs[i].step, .y = runs[i].loss, .n = runs[i].n,
                                     .markers = val};
        nl_svg_plot_opts po = {.title = title, .xlabel = "step", .ylabel = "loss (nats/token)"};
        if (nl_svg_plot(svg, &po, ser, (size_t)nrun)) rc = nl_cli_fail("fp8 curves --svg");
        else if (!json) printf("wrote %s\n", svg);
    }
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
