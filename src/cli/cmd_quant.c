/* nanolm quant demo | outliers | model: the course's quantization walk-through, the damage one
 * outlier row does per tensor vs per channel vs per block, and quantizing a real model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nanolm/quant.h"


static void usage(FILE *f) {
    fprintf(f,
            "usage: nanolm quant demo [--json]\n"
            "       nanolm quant outliers [--rows N] [--cols N] [--bits B] [--outlier F] [--seed S] [--json]\n"
            "\n"
            "demo:     the course's absmax example: (0.3, -0.5, 0.12, 1.5) in int8, then with an outlier 30,\n"
            "          then with blocks of 2.\n"
            "outliers: a random N(0, 0.02) weight matrix whose row 7 is multiplied by F (default 50);\n"
            "          MSE and SQNR for per tensor, per channel and per block 32/64/128.\n"
);
}

/* ---- demo ------------------------------------------------------------------------------------ */

typedef struct demo_step {
    const char *name;
    float x[4];
    int64_t block; /* 0 = per tensor */
    nl_qtensor q;
    float back[4];
} demo_step;

static cJSON *farr(const float *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static void fmt_vec(char *buf, size_t n, const float *v, int k, const char *fmt) {
    size_t o = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < k && o < n; i++) o += (size_t)snprintf(buf + o, n - o, fmt, (double)v[i]), o += (size_t)snprintf(buf + o, n - o, i + 1 < k ? ", " : ")");
}

static int cmd_demo(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("quant demo", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("quant demo: unexpected argument '%s'", argv[optind]);
    demo_step st[3] = {
        {"int8 absmax per tensor", {0.3f, -0.5f, 0.12f, 1.5f}, 0, {.spec = {0}}, {0}},
        {"outlier 30 instead of 1.5", {0.3f, -0.5f, 0.12f, 30.0f}, 0, {.spec = {0}}, {0}},
        {"blocks of 2, one scale each", {0.3f, -0.5f, 0.12f, 30.0f}, 2, {.spec = {0}}, {0}},
    };
    for (int s = 0; s < 3; s++) {
        nl_status rc = st[s].block ? nl_quant_blockwise(st[s].x, 1, 4, 8, st[s].block, &st[s].q)
                                   : nl_quant_symmetric(st[s].x, 1, 4, 8, 0, &st[s].q);
        if (!rc) rc = nl_quant_dequantize(&st[s].q, st[s].back);
        if (rc) {
            for (int k = 0; k < s; k++) nl_qtensor_free(&st[k].q);
            return nl_cli_fail("quant demo");
        }
    }
    /* How many of the 255 codes land within |x| <= 0.5 once the outlier sets the step. */
    int levels = 0, lo = 0, hi = 0;
    for (int q = -127; q <= 127; q++)
        if (fabsf((float)q * st[1].q.scales[0]) <= 0.5f) {
            if (!levels) lo = q;
            hi = q;
            levels++;
        }
    if (json) {
        cJSON *d = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(d, "steps");
        for (int s = 0; s < 3; s++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "step", st[s].name);
            cJSON_AddNumberToObject(o, "bits", 8);
            cJSON_AddNumberToObject(o, "block", (double)st[s].block);
            cJSON_AddItemToObject(o, "x", farr(st[s].x, 4));
            cJSON_AddItemToObject(o, "scales", farr(st[s].q.scales, (int)st[s].q.n_scales));
            cJSON *qa = cJSON_AddArrayToObject(o, "q");
            for (int i = 0; i < 4; i++) cJSON_AddItemToArray(qa, cJSON_CreateNumber(nl_qtensor_code(&st[s].q, 0, i)));
            cJSON_AddItemToObject(o, "dequantized", farr(st[s].back, 4));
            cJSON_AddItemToArray(arr, o);
        }
        cJSON_AddNumberToObject(d, "levels_within_0_5", levels);
        cJSON_AddNumberToObject(d, "levels_lo", lo);
        cJSON_AddNumberToObject(d, "levels_hi", hi);
        cJSON_AddNumberToObject(d, "levels_total", 255);
        for (int s = 0; s < 3; s++) nl_qtensor_free(&st[s].q);
        return nl_cli_print_json(d);
    }
    char b1[128], b2[128], b3[128];
    for (int s = 0; s < 3; s++) {
        printf("step %d: %s\n", s + 1, st[s].name);
        fmt_vec(b1, sizeof b1, st[s].x, 4, "%g");
        printf("  x            = %s\n", b1);
        if (st[s].block) {
            fmt_vec(b2, sizeof b2, st[s].q.scales, (int)st[s].q.n_scales, "%.6f");
            printf("  scale/block  = max|block| / 127 = %s\n", b2);
        } else {
            printf("  scale        = max|x| / 127 = %g / 127 = %.6f\n", (double)(st[s].q.scales[0] * 127.0f),
                   (double)st[s].q.scales[0]);
        }
        float qf[4];
        for (int i = 0; i < 4; i++) qf[i] = (float)nl_qtensor_code(&st[s].q, 0, i);
        fmt_vec(b2, sizeof b2, qf, 4, "%g");
        fmt_vec(b3, sizeof b3, st[s].back, 4, "%.3f");
        printf("  q = round(x / scale) = %s\n", b2);
        printf("  q * scale    = %s\n", b3);
        if (s == 1)
            printf("  0.3 and 0.12 both became %d; values with |x| <= 0.5 get %d levels (%d..%d) of 255\n",
                   nl_qtensor_code(&st[1].q, 0, 0), levels, lo, hi);
        if (s == 2) printf("  the outlier spoils only its own block: the first pair keeps 255 levels\n");
        if (s < 2) printf("\n");
    }
    for (int s = 0; s < 3; s++) nl_qtensor_free(&st[s].q);
    return NL_EXIT_OK;
}

/* ---- outliers -------------------------------------------------------------------------------- */

static int cmd_outliers(int argc, char **argv) {
    static const struct option opts[] = {{"rows", required_argument, 0, 'r'}, {"cols", required_argument, 0, 'c'},
                                         {"bits", required_argument, 0, 'b'}, {"outlier", required_argument, 0, 'o'},
                                         {"seed", required_argument, 0, 's'}, {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},       {0, 0, 0, 0}};
    int64_t rows = 256, cols = 1024, bits = 8, seed = 1;
    double outlier = 50.0;
    int json = 0, c, rc;
    while ((c = getopt_long(argc, argv, "r:c:b:o:s:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'r': if ((rc = nl_cli_int("--rows", optarg, 8, 1 << 16, &rows))) return rc; break;
        case 'c': if ((rc = nl_cli_int("--cols", optarg, 1, 1 << 20, &cols))) return rc; break;
        case 'b': if ((rc = nl_cli_int("--bits", optarg, 2, 8, &bits))) return rc; break;
        case 'o': if ((rc = nl_cli_double("--outlier", optarg, &outlier))) return rc;
            if (!(outlier > 0) || !isfinite(outlier)) return nl_cli_usage_error("quant outliers: --outlier must be a positive number, got '%s'", optarg);
            break;
        case 's': if ((rc = nl_cli_int("--seed", optarg, 0, INT64_MAX, &seed))) return rc; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("quant outliers", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("quant outliers: unexpected argument '%s'", argv[optind]);
    size_t n = (size_t)(rows * cols);
    float *w = nl_malloc(n * sizeof(float), "weight matrix"), *y = nl_malloc(n * sizeof(float), "reconstruction");
    if (!w || !y) { nl_free(w); nl_free(y); return nl_cli_fail("quant outliers"); }
    nl_rng r;
    nl_rng_seed(&r, (uint64_t)seed);
    for (size_t i = 0; i < n; i++) w[i] = (float)(0.02 * nl_rng_normal(&r));
    const int64_t orow = 7;
    for (int64_t j = 0; j < cols; j++) w[orow * cols + j] *= (float)outlier;
    struct { const char *name; nl_quant_granularity g; int64_t block; } sch[] = {
        {"per tensor", NL_QUANT_PER_TENSOR, 0}, {"per channel", NL_QUANT_PER_CHANNEL, 0},
        {"per block 32", NL_QUANT_PER_BLOCK, 32}, {"per block 64", NL_QUANT_PER_BLOCK, 64},
        {"per block 128", NL_QUANT_PER_BLOCK, 128}};
    const int ns = 5;
    double mse[5], sqnr[5], mse_rest[5];
    size_t bytes[5];
    for (int s = 0; s < ns; s++) {
        nl_qtensor q;
        nl_status st = sch[s].g == NL_QUANT_PER_BLOCK ? nl_quant_blockwise(w, rows, cols, (int)bits, sch[s].block, &q)
                                                      : nl_quant_symmetric(w, rows, cols, (int)bits, sch[s].g == NL_QUANT_PER_CHANNEL, &q);
        if (!st) st = nl_quant_dequantize(&q, y);
        if (st) { nl_free(w); nl_free(y); return nl_cli_fail("quant outliers"); }
        mse[s] = nl_quant_mse(w, y, n);
        sqnr[s] = nl_quant_sqnr_db(w, y, n);
        /* Error on the ordinary rows only: what the outlier did to its neighbours. */
        double e = 0;
        for (int64_t i = 0; i < rows; i++) {
            if (i == orow) continue;
            e += nl_quant_mse(w + i * cols, y + i * cols, (size_t)cols) * (double)cols;
        }
        mse_rest[s] = e / (double)((rows - 1) * cols);
        bytes[s] = nl_qtensor_bytes(&q);
        nl_qtensor_free(&q);
    }
    nl_free(w);
    nl_free(y);
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, "rows", (double)rows);
        cJSON_AddNumberToObject(d, "cols", (double)cols);
        cJSON_AddNumberToObject(d, "bits", (double)bits);
        cJSON_AddNumberToObject(d, "outlier_row", (double)orow);
        cJSON_AddNumberToObject(d, "outlier_factor", outlier);
        cJSON_AddNumberToObject(d, "fp32_bytes", (double)(n * 4));
        cJSON *a = cJSON_AddArrayToObject(d, "schemes");
        for (int s = 0; s < ns; s++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "scheme", sch[s].name);
            cJSON_AddNumberToObject(o, "block", (double)sch[s].block);
            cJSON_AddNumberToObject(o, "bytes", (double)bytes[s]);
            cJSON_AddNumberToObject(o, "mse", mse[s]);
            cJSON_AddNumberToObject(o, "mse_other_rows", mse_rest[s]);
            cJSON_AddNumberToObject(o, "sqnr_db", sqnr[s]);
            cJSON_AddItemToArray(a, o);
        }
        return nl_cli_print_json(d);
    }
    printf("int%lld absmax on a (%lld, %lld) N(0, 0.02) matrix; row %lld multiplied by %g\n\n", (long long)bits,
           (long long)rows, (long long)cols, (long long)orow, outlier);
    static const char *const hdr[] = {"scheme", "bytes", "MSE", "MSE other rows", "SQNR dB"};
    nl_table t;
    nl_table_init(&t, 5, hdr);
    for (int s = 0; s < ns; s++)
        nl_table_rowf(&t, "%s|%zu|%.3e|%.3e|%.2f", sch[s].name, bytes[s], mse[s], mse_rest[s], sqnr[s]);
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    printf("\nfp32: %zu bytes. Per tensor, the outlier row sets one step for everyone.\n", n * 4);
    return NL_EXIT_OK;
}

int nl_cmd_quant(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return NL_EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
        usage(stdout);
        return NL_EXIT_OK;
    }
    if (!strcmp(sub, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(sub, "outliers")) return cmd_outliers(argc - 1, argv + 1);
    return nl_cli_usage_error("quant: unknown subcommand '%s' (demo, outliers)", sub);
}
