/* nanolm quant demo | outliers | model: the course's quantization walk-through, the damage one
 * outlier row does per tensor vs per channel vs per block, and quantizing a real model. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "nanolm/quant.h"

int nl_cmd_quant_model(int argc, char **argv); /* cmd_quant_model.c */
int nl_cmd_quant_compare(int argc, char **argv); /* cmd_quant_compare.c */


static void usage(FILE *f) {
    fprintf(f,
            "usage: nanolm quant demo [--json]\n"
            "       nanolm quant values X1,X2,... [--scheme int8|int4|affine|NAME] [--block B] [--json]\n"
            "       nanolm quant outliers [--rows N] [--cols N] [--bits B] [--outlier F] [--seed S] [--json]\n"
            "       nanolm quant model --ckpt F --data TEXT [--scheme S ...] [--out Q.safetensors] [--json]\n"
            "       nanolm quant compare --ckpt F --data TEXT --calib TEXT [--schemes LIST] [--json] [--svg F]\n\n"
            "demo:     the course's absmax example: (0.3, -0.5, 0.12, 1.5) in int8, then with an outlier 30,\n"
            "          then with blocks of 2.\n"
            "values:   quantizes your own values and prints the scale, the zero point, the codes and the\n"
            "          dequantized values (int8 = absmax with 8 bits, int4, affine = uint8 with a zero point,\n"
            "          or any scheme name of `quant model`, e.g. int3-b2, mxfp4); --block B: one scale per B values.\n"
            "outliers: a random N(0, 0.02) weight matrix whose row 7 is multiplied by F (default 50);\n"
            "          MSE and SQNR for per tensor, per channel and per block 32/64/128.\n"
            "compare:  RTN vs GPTQ, AWQ, SmoothQuant and LLM.int8() on a checkpoint (see quant compare --help).\n"
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

/* ---- values ---------------------------------------------------------------------------------- */

/* Parses "0.3,-0.5,0.12,1.5" into a malloc'd float array (finite, within fp32's range). */
static int parse_values(const char *list, float **out, int64_t *n) {
    size_t len = strlen(list), cap = 1;
    for (size_t i = 0; i < len; i++) cap += list[i] == ',';
    if (cap > 1 << 20) return nl_cli_usage_error("quant values: at most %d values", 1 << 20);
    char *buf = malloc(len + 1);
    float *x = malloc(cap * sizeof *x);
    if (!buf || !x) {
        free(buf);
        free(x);
        return nl_cli_usage_error("quant values: out of memory for %zu values", cap);
    }
    memcpy(buf, list, len + 1);
    int64_t k = 0;
    int rc = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        double v;
        if ((rc = nl_cli_double("quant values", p, &v))) break;
        if (fabs(v) > FLT_MAX) {
            rc = nl_cli_usage_error("quant values: %s is outside fp32's range (|x| <= %g)", p, (double)FLT_MAX);
            break;
        }
        x[k++] = (float)v;
        if (!comma) break;
        p = comma + 1;
    }
    free(buf);
    if (rc) {
        free(x);
        return rc;
    }
    *out = x;
    *n = k;
    return 0;
}

/* v with the fewest significant digits that read back as the same float (0.3f prints as 0.3). */
static const char *short_float(float v, char *buf, size_t n) {
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, n, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v) break;
    }
    return buf;
}

/* The scheme of `quant values`: int8 / int4 / intB (absmax, per tensor or per block), affine
 * (uint8 with a zero point, per tensor), or any name nl_quant_spec_parse knows. */
static int values_spec(const char *name, int64_t block, nl_quant_spec *spec) {
    char full[64];
    int bits;
    char tail;
    if (!strcmp(name, "affine")) {
        if (block) return nl_cli_usage_error("quant values: --block needs an absmax scheme (int8, int4, ...), not affine");
        snprintf(full, sizeof full, "affine-uint8-tensor");
    } else if (sscanf(name, "int%d%c", &bits, &tail) == 1) {
        if (block) snprintf(full, sizeof full, "int%d-b%lld", bits, (long long)block);
        else snprintf(full, sizeof full, "int%d-tensor", bits);
    } else {
        if (block) return nl_cli_usage_error("quant values: --block goes with int8, int4 or intB, not '%s'", name);
        snprintf(full, sizeof full, "%s", name);
    }
    if (nl_quant_spec_parse(full, spec)) return nl_cli_usage_error("quant values: --scheme %s: %s", name, nl_last_error());
    return 0;
}

static int cmd_values(int argc, char **argv) {
    static const struct option opts[] = {{"scheme", required_argument, 0, 's'}, {"block", required_argument, 0, 'b'},
                                         {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *scheme = "int8", *list = NULL;
    int64_t block = 0;
    int json = 0, c, rc;
    /* the list may start with a minus sign: take it before getopt sees it as an option */
    if (argc > 1 && strncmp(argv[1], "--", 2) != 0) {
        list = argv[1];
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': scheme = optarg; break;
        case 'b': if ((rc = nl_cli_int("--block", optarg, 1, 1 << 20, &block))) return rc; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("quant values", argv);
        }
    }
    if (optind < argc) {
        if (list) return nl_cli_usage_error("quant values: unexpected argument '%s'", argv[optind]);
        list = argv[optind++];
        if (optind < argc) return nl_cli_usage_error("quant values: unexpected argument '%s'", argv[optind]);
    }
    if (!list) return nl_cli_usage_error("quant values: give the values, e.g. nanolm quant values 0.3,-0.5,0.12,1.5");
    nl_quant_spec spec;
    if ((rc = values_spec(scheme, block, &spec))) return rc;
    float *x = NULL, *back = NULL;
    int64_t n = 0;
    if ((rc = parse_values(list, &x, &n))) return rc;
    nl_qtensor q;
    memset(&q, 0, sizeof q);
    back = malloc((size_t)n * sizeof *back);
    if (!back) {
        free(x);
        return nl_cli_usage_error("quant values: out of memory for %lld values", (long long)n);
    }
    if (nl_quant_tensor(x, 1, n, &spec, &q) || nl_quant_dequantize(&q, back)) {
        free(x);
        free(back);
        nl_qtensor_free(&q);
        return nl_cli_fail("quant values");
    }
    char name[64];
    nl_quant_spec_name(&spec, name, sizeof name);
    double max_err = 0;
    for (int64_t i = 0; i < n; i++) max_err = fmax(max_err, fabs((double)x[i] - (double)back[i]));
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "scheme", name);
        cJSON_AddStringToObject(d, "kind", spec.kind == NL_QUANT_AFFINE ? "affine" : spec.kind == NL_QUANT_MX ? "mx" : "absmax");
        cJSON_AddNumberToObject(d, "bits", spec.bits);
        cJSON_AddNumberToObject(d, "values_per_scale", (double)q.group_cols);
        cJSON *groups = cJSON_AddArrayToObject(d, "groups");
        for (int64_t g = 0; g < q.n_scales; g++) {
            cJSON *o = cJSON_CreateObject();
            int64_t a = g * q.group_cols, b = a + q.group_cols < n ? a + q.group_cols : n;
            cJSON_AddNumberToObject(o, "first", (double)a);
            cJSON_AddNumberToObject(o, "count", (double)(b - a));
            cJSON_AddNumberToObject(o, "scale", q.scales[g]);
            cJSON_AddNumberToObject(o, "zero_point", q.zero_points ? q.zero_points[g] : 0);
            cJSON_AddItemToArray(groups, o);
        }
        cJSON_AddItemToObject(d, "x", farr(x, (int)n));
        cJSON *qa = cJSON_AddArrayToObject(d, "codes");
        for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(qa, cJSON_CreateNumber(nl_qtensor_code(&q, 0, i)));
        cJSON_AddItemToObject(d, "dequantized", farr(back, (int)n));
        cJSON_AddNumberToObject(d, "max_abs_error", max_err);
        cJSON_AddNumberToObject(d, "bytes", (double)nl_qtensor_bytes(&q));
        rc = nl_cli_print_json(d);
    } else {
        int qmax = (1 << (spec.bits - 1)) - 1;
        char b1[32], b2[32], b3[32];
        printf("%s on %lld values: %lld scale%s, one per %lld values\n", name, (long long)n, (long long)q.n_scales,
               q.n_scales == 1 ? "" : "s", (long long)q.group_cols);
        for (int64_t g = 0; g < q.n_scales; g++) {
            int64_t a = g * q.group_cols, b = a + q.group_cols < n ? a + q.group_cols : n;
            if (q.n_scales > 1) printf("block %lld (values %lld..%lld):\n", (long long)g + 1, (long long)a + 1, (long long)b);
            float amax = 0, lo = 0, hi = 0;
            for (int64_t i = a; i < b; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
                lo = fminf(lo, x[i]);
                hi = fmaxf(hi, x[i]);
            }
            short_float(q.scales[g], b3, sizeof b3);
            if (spec.kind == NL_QUANT_SYMMETRIC)
                printf("  scale        = max|x| / %d = %s / %d = %s\n  zero point   = 0 (symmetric)\n", qmax,
                       short_float(amax, b1, sizeof b1), qmax, b3);
            else if (spec.kind == NL_QUANT_AFFINE)
                printf("  scale        = (max - min) / %d = (%s - (%s)) / %d = %s\n"
                       "  zero point   = qmin - round(min / scale) = %d (the code of 0.0)\n",
                       (1 << spec.bits) - 1, short_float(hi, b1, sizeof b1), short_float(lo, b2, sizeof b2),
                       (1 << spec.bits) - 1, b3, q.zero_points[g]);
            else
                printf("  scale        = 2^(floor(log2 max|x|) - emax) = %s (shared E8M0 exponent)\n", b3);
            printf("  x            =");
            for (int64_t i = a; i < b; i++) printf(" %s", short_float(x[i], b1, sizeof b1));
            printf("\n  q            =");
            for (int64_t i = a; i < b; i++) printf(" %d", nl_qtensor_code(&q, 0, i));
            printf("   (%s)\n  dequantized  =", spec.kind == NL_QUANT_SYMMETRIC ? "round(x / scale)"
                                                 : spec.kind == NL_QUANT_AFFINE ? "round(x / scale) + zero point"
                                                                                : "element codes");
            for (int64_t i = a; i < b; i++) printf(" %s", short_float(back[i], b1, sizeof b1));
            printf("   (%s)\n", spec.kind == NL_QUANT_AFFINE ? "(q - zero point) * scale"
                                : spec.kind == NL_QUANT_MX ? "element value * scale" : "q * scale");
        }
        printf("largest error |x - dequantized| = %.9g; %zu bytes stored (fp32: %lld)\n", max_err, nl_qtensor_bytes(&q),
               (long long)n * 4);
    }
    free(x);
    free(back);
    nl_qtensor_free(&q);
    return rc;
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
    if (!strcmp(sub, "values")) return cmd_values(argc - 1, argv + 1);
    if (!strcmp(sub, "outliers")) return cmd_outliers(argc - 1, argv + 1);
    if (!strcmp(sub, "model")) return nl_cmd_quant_model(argc - 1, argv + 1);
    if (!strcmp(sub, "compare")) return nl_cmd_quant_compare(argc - 1, argv + 1);
    return nl_cli_usage_error("quant: unknown subcommand '%s' (demo, values, outliers, model, compare)", sub);
}
