/* nanolm quant demo | outliers | model: the course's quantization walk-through, the damage one
 * outlier row does per tensor vs per channel vs per block, and quantizing a real model. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/quant_study.h"
#include "report.h"

int nl_cmd_quant_model(int argc, char **argv);   /* cmd_quant_model.c */
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
            "compare:  RTN vs GPTQ, AWQ, SmoothQuant and LLM.int8() on a checkpoint (see quant compare --help).\n");
}

/* ---- demo ------------------------------------------------------------------------------------ */

typedef nl_quant_demo_step demo_step;

/* The floats as doubles, for the report's lists (at most 4 here). */
static void f2d(const float *v, int n, double *out) {
    for (int i = 0; i < n; i++) out[i] = v[i];
}

static void fmt_vec(char *buf, size_t n, const float *v, int k, const char *fmt) {
    size_t o = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < k && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, fmt, (double)v[i]),
            o += (size_t)snprintf(buf + o, n - o, i + 1 < k ? ", " : ")");
}

/* One step of the demo in the text form: x, the scale, the codes and q * scale. */
static void demo_text(nl_report *r, const demo_step *st, int s) {
    char b1[128], b2[128], b3[128];
    nl_report_note(r, "step %d: %s", s + 1, st->name);
    fmt_vec(b1, sizeof b1, st->x, 4, "%g");
    nl_report_note(r, "  x            = %s", b1);
    if (st->block) {
        fmt_vec(b2, sizeof b2, st->q.scales, (int)st->q.n_scales, "%.6f");
        nl_report_note(r, "  scale/block  = max|block| / 127 = %s", b2);
    } else {
        nl_report_note(r, "  scale        = max|x| / 127 = %g / 127 = %.6f", (double)(st->q.scales[0] * 127.0f),
                       (double)st->q.scales[0]);
    }
    float qf[4];
    for (int i = 0; i < 4; i++) qf[i] = (float)nl_qtensor_code(&st->q, 0, i);
    fmt_vec(b2, sizeof b2, qf, 4, "%g");
    fmt_vec(b3, sizeof b3, st->back, 4, "%.3f");
    nl_report_note(r, "  q = round(x / scale) = %s", b2);
    nl_report_note(r, "  q * scale    = %s", b3);
}

static int cmd_demo(int argc, char **argv) {
    int json = 0;
    nl_opt opts[] = {NL_OPT_FLAG("json", &json, "print the steps as JSON")};
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"quant demo",
                       "nanolm quant demo [--json]",
                       "The course's absmax example: (0.3, -0.5, 0.12, 1.5) in int8, then with an outlier 30,\n"
                       "then with blocks of 2.",
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_quant_demo d;
    if (nl_quant_demo_run(&d)) return nl_cli_fail("quant demo");
    const demo_step *st = d.st;
    const int levels = d.levels, lo = d.lo, hi = d.hi;
    nl_report *r = nl_report_new("quant demo");
    nl_report_table(r, "steps", NULL, 7,
                    (const nl_report_col[]){{"step", "", NULL},
                                            {"bits", "", NULL},
                                            {"block", "", NULL},
                                            {"x", "", NULL},
                                            {"scales", "", NULL},
                                            {"q", "", NULL},
                                            {"dequantized", "", NULL}});
    for (int s = 0; s < 3; s++) {
        double x[4], sc[4], q[4], back[4];
        f2d(st[s].x, 4, x);
        f2d(st[s].q.scales, (int)st[s].q.n_scales, sc);
        f2d(st[s].back, 4, back);
        for (int i = 0; i < 4; i++) q[i] = nl_qtensor_code(&st[s].q, 0, i);
        nl_report_cell_str(r, st[s].name);
        nl_report_cell_int(r, 8);
        nl_report_cell_int(r, st[s].block);
        nl_report_cell_nums(r, x, 4);
        nl_report_cell_nums(r, sc, (int)st[s].q.n_scales);
        nl_report_cell_nums(r, q, 4);
        nl_report_cell_nums(r, back, 4);
        nl_report_row_end(r);
    }
    nl_report_int(r, "levels_within_0_5", "", levels, NULL);
    nl_report_int(r, "levels_lo", "", lo, NULL);
    nl_report_int(r, "levels_hi", "", hi, NULL);
    nl_report_int(r, "levels_total", "", 255, NULL);
    for (int s = 0; s < 3; s++) {
        demo_text(r, &st[s], s);
        if (s == 1)
            nl_report_note(r, "  0.3 and 0.12 both became %d; values with |x| <= 0.5 get %d levels (%d..%d) of 255",
                           nl_qtensor_code(&st[1].q, 0, 0), levels, lo, hi);
        if (s == 2) nl_report_note(r, "  the outlier spoils only its own block: the first pair keeps 255 levels");
        if (s < 2) nl_report_note(r, "%s", "");
    }
    nl_quant_demo_free(&d);
    return nl_report_print(r, json);
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

/* The text form of one group (block) of `quant values`: how the scale and the zero point come out,
 * then x, the codes and the dequantized values. */
static void values_text_group(nl_report *r, const nl_quant_spec *spec, const nl_qtensor *q, const float *x,
                              const float *back, int64_t n, int64_t g) {
    int qmax = (1 << (spec->bits - 1)) - 1;
    char b1[32], b2[32], b3[32], line[4096];
    int64_t a = g * q->group_cols, b = a + q->group_cols < n ? a + q->group_cols : n;
    if (q->n_scales > 1)
        nl_report_note(r, "block %lld (values %lld..%lld):", (long long)g + 1, (long long)a + 1, (long long)b);
    float amax = 0, lo = 0, hi = 0;
    for (int64_t i = a; i < b; i++) amax = fmaxf(amax, fabsf(x[i])), lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
    short_float(q->scales[g], b3, sizeof b3);
    if (spec->kind == NL_QUANT_SYMMETRIC)
        nl_report_note(r, "  scale        = max|x| / %d = %s / %d = %s\n  zero point   = 0 (symmetric)", qmax,
                       short_float(amax, b1, sizeof b1), qmax, b3);
    else if (spec->kind == NL_QUANT_AFFINE)
        nl_report_note(r,
                       "  scale        = (max - min) / %d = (%s - (%s)) / %d = %s\n"
                       "  zero point   = qmin - round(min / scale) = %d (the code of 0.0)",
                       (1 << spec->bits) - 1, short_float(hi, b1, sizeof b1), short_float(lo, b2, sizeof b2),
                       (1 << spec->bits) - 1, b3, q->zero_points[g]);
    else
        nl_report_note(r, "  scale        = 2^(floor(log2 max|x|) - emax) = %s (shared E8M0 exponent)", b3);
    int len = snprintf(line, sizeof line, "  x            =");
    for (int64_t i = a; i < b && len < (int)sizeof line - 40; i++)
        len += snprintf(line + len, sizeof line - (size_t)len, " %s", short_float(x[i], b1, sizeof b1));
    nl_report_note(r, "%s", line);
    len = snprintf(line, sizeof line, "  q            =");
    for (int64_t i = a; i < b && len < (int)sizeof line - 80; i++)
        len += snprintf(line + len, sizeof line - (size_t)len, " %d", nl_qtensor_code(q, 0, i));
    nl_report_note(r, "%s   (%s)", line,
                   spec->kind == NL_QUANT_SYMMETRIC ? "round(x / scale)"
                   : spec->kind == NL_QUANT_AFFINE  ? "round(x / scale) + zero point"
                                                    : "element codes");
    len = snprintf(line, sizeof line, "  dequantized  =");
    for (int64_t i = a; i < b && len < (int)sizeof line - 80; i++)
        len += snprintf(line + len, sizeof line - (size_t)len, " %s", short_float(back[i], b1, sizeof b1));
    nl_report_note(r, "%s   (%s)", line,
                   spec->kind == NL_QUANT_AFFINE ? "(q - zero point) * scale"
                   : spec->kind == NL_QUANT_MX   ? "element value * scale"
                                                 : "q * scale");
}

/* The result of `quant values`: the JSON values and groups, and the text derivation. */
static int values_print(const nl_quant_spec *spec, const nl_quant_values *v, const float *x, int64_t n, int json) {
    const nl_qtensor *q = &v->q;
    const float *back = v->back;
    const double max_err = v->max_err;
    char name[64];
    nl_quant_spec_name(spec, name, sizeof name);
    double *dx = malloc((size_t)n * 3 * sizeof *dx);
    if (!dx) return nl_cli_usage_error("quant values: out of memory for %lld values", (long long)n);
    double *dq = dx + n, *db = dq + n;
    for (int64_t i = 0; i < n; i++) dx[i] = x[i], dq[i] = nl_qtensor_code(q, 0, i), db[i] = back[i];
    nl_report *r = nl_report_new("quant values");
    nl_report_str(r, "scheme", "", name);
    nl_report_str(r, "kind", "",
                  spec->kind == NL_QUANT_AFFINE ? "affine"
                  : spec->kind == NL_QUANT_MX   ? "mx"
                                                : "absmax");
    nl_report_int(r, "bits", "", spec->bits, NULL);
    nl_report_int(r, "values_per_scale", "", q->group_cols, NULL);
    nl_report_note(r, "%s on %lld values: %lld scale%s, one per %lld values", name, (long long)n,
                   (long long)q->n_scales, q->n_scales == 1 ? "" : "s", (long long)q->group_cols);
    nl_report_table(r, "groups", NULL, 4,
                    (const nl_report_col[]){
                        {"first", "", NULL}, {"count", "", NULL}, {"scale", "", NULL}, {"zero_point", "", NULL}});
    for (int64_t g = 0; g < q->n_scales; g++) {
        int64_t a = g * q->group_cols, b = a + q->group_cols < n ? a + q->group_cols : n;
        nl_report_cell_int(r, a);
        nl_report_cell_int(r, b - a);
        nl_report_cell_num(r, q->scales[g]);
        nl_report_cell_int(r, q->zero_points ? q->zero_points[g] : 0);
        nl_report_row_end(r);
    }
    for (int64_t g = 0; g < q->n_scales; g++) values_text_group(r, spec, q, x, back, n, g);
    nl_report_nums(r, "x", "", dx, (int)n, NULL, NULL);
    nl_report_nums(r, "codes", "", dq, (int)n, NULL, NULL);
    nl_report_nums(r, "dequantized", "", db, (int)n, NULL, NULL);
    nl_report_num(r, "max_abs_error", "", max_err, NULL, NULL);
    nl_report_int(r, "bytes", "", (long long)nl_qtensor_bytes(q), NULL);
    nl_report_note(r, "largest error |x - dequantized| = %.9g; %zu bytes stored (fp32: %lld)", max_err,
                   nl_qtensor_bytes(q), (long long)n * 4);
    free(dx);
    return nl_report_print(r, json);
}

static int cmd_values(int argc, char **argv) {
    const char *scheme = "int8", *list = NULL;
    int64_t block = 0;
    int json = 0, rc;
    nl_opt opts[] = {
        NL_OPT_STR("scheme", &scheme, "int8|int4|affine|NAME",
                   "int8 = absmax with 8 bits, int4, affine = uint8 with a zero point, or a quant model scheme"),
        NL_OPT_INT("block", &block, 1, 1 << 20, "B", "one scale per B values (default: one for all)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec_cmd = {"quant values",
                           "nanolm quant values X1,X2,... [--scheme int8|int4|affine|NAME] [--block B] [--json]",
                           "Quantizes your own values and prints the scale, the zero point, the codes and the\n"
                           "dequantized values (any scheme name of `quant model` works too, e.g. int3-b2, mxfp4).",
                           groups,
                           1,
                           1};
    int npos = 0;
    if ((rc = nl_cli_parse(&spec_cmd, argc, argv, &list, &npos))) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (!npos) return nl_cli_usage_error("quant values: give the values, e.g. nanolm quant values 0.3,-0.5,0.12,1.5");
    nl_quant_spec spec;
    if (nl_quant_values_spec(scheme, block, &spec)) return nl_cli_usage_error("quant values: %s", nl_last_error());
    float *x = NULL;
    int64_t n = 0;
    if ((rc = parse_values(list, &x, &n))) return rc;
    nl_quant_values v;
    rc = nl_quant_values_run(x, n, &spec, &v) ? nl_cli_fail("quant values") : values_print(&spec, &v, x, n, json);
    free(x);
    nl_quant_values_free(&v);
    return rc;
}

/* ---- outliers -------------------------------------------------------------------------------- */

static int cmd_outliers(int argc, char **argv) {
    int64_t rows = 256, cols = 1024, bits = 8, seed = 1;
    double outlier = 50.0;
    int json = 0, rc;
    nl_opt opts[] = {
        NL_OPT_INT("rows", &rows, 8, 1 << 16, "N", "rows of the matrix (default 256)"),
        NL_OPT_INT("cols", &cols, 1, 1 << 20, "N", "columns (default 1024)"),
        NL_OPT_INT("bits", &bits, 2, 8, "B", "bits of the absmax quantizer (default 8)"),
        NL_OPT_DBL("outlier", &outlier, 1e-300, INFINITY, "F", "factor of row 7 (default 50)"),
        NL_OPT_INT("seed", &seed, 0, 9.2e18, "S", "seed of the matrix (default 1)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "quant outliers",
        "nanolm quant outliers [--rows N] [--cols N] [--bits B] [--outlier F] [--seed S] [--json]",
        "A random N(0, 0.02) weight matrix whose row 7 is multiplied by F; MSE and SQNR for per tensor,\n"
        "per channel and per block 32/64/128.",
        groups,
        1,
        0};
    if ((rc = nl_cli_parse(&spec, argc, argv, NULL, NULL))) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    size_t n = (size_t)(rows * cols);
    const int64_t orow = NL_QUANT_OUTLIER_ROW;
    nl_quant_outlier_row sch[NL_QUANT_OUTLIER_SCHEMES];
    if (nl_quant_outlier_study(rows, cols, (int)bits, outlier, (uint64_t)seed, sch))
        return nl_cli_fail("quant outliers");
    nl_report *rep = nl_report_new("quant outliers");
    nl_report_int(rep, "rows", "", rows, NULL);
    nl_report_int(rep, "cols", "", cols, NULL);
    nl_report_int(rep, "bits", "", bits, NULL);
    nl_report_int(rep, "outlier_row", "", orow, NULL);
    nl_report_num(rep, "outlier_factor", "", outlier, NULL, NULL);
    nl_report_int(rep, "fp32_bytes", "", (long long)(n * 4), NULL);
    nl_report_note(rep, "int%lld absmax on a (%lld, %lld) N(0, 0.02) matrix; row %lld multiplied by %g",
                   (long long)bits, (long long)rows, (long long)cols, (long long)orow, outlier);
    nl_report_table(rep, "schemes", NULL, 6,
                    (const nl_report_col[]){{"scheme", "scheme", NULL},
                                            {"block", "", NULL},
                                            {"bytes", "bytes", "%-.0f"},
                                            {"mse", "MSE", "%-.3e"},
                                            {"mse_other_rows", "MSE other rows", "%-.3e"},
                                            {"sqnr_db", "SQNR dB", "%-.2f"}});
    for (int s = 0; s < 5; s++) {
        nl_report_cell_str(rep, sch[s].name);
        nl_report_cell_int(rep, sch[s].block);
        nl_report_cell_int(rep, (long long)sch[s].bytes);
        nl_report_cell_num(rep, sch[s].mse);
        nl_report_cell_num(rep, sch[s].mse_rest);
        nl_report_cell_num(rep, sch[s].sqnr);
        nl_report_row_end(rep);
    }
    nl_report_note(rep, "\nfp32: %zu bytes. Per tensor, the outlier row sets one step for everyone.", n * 4);
    return nl_report_print(rep, json);
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
