/* nanolm formats [cast VALUE --to F | sum --format F --value V --count N [--promote-every K]]:
 * the properties table of every number format, one value through a format, and a running
 * sum rounded to a format after each addition (with optional promotion to fp32). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "nanolm/formats.h"

static void fmt_num(char *buf, size_t n, double v) {
    if (isnan(v)) snprintf(buf, n, "none");
    else snprintf(buf, n, "%.10g", v);
}

/* "0 | 10000111 | 0000000" for float formats, plain bits for int formats. */
static void code_binary(const nl_format_info *fi, uint32_t code, char *out, size_t n) {
    size_t k = 0;
    for (int b = fi->bits - 1; b >= 0 && k + 4 < n; b--) {
        out[k++] = (char)('0' + ((code >> b) & 1));
        if (fi->kind != NL_FMT_KIND_INT && b > 0) {
            int sign_end = fi->has_sign && b == fi->bits - 1;
            int exp_end = b == fi->man_bits && fi->man_bits > 0;
            if (sign_end || exp_end) { out[k++] = ' '; out[k++] = '|'; out[k++] = ' '; }
        }
    }
    out[k] = '\0';
}

static int usage(FILE *f) {
    fprintf(f,
            "usage: nanolm formats [--json]\n"
            "       nanolm formats cast VALUE --to FORMAT [--rounding rne|rtz|away|stochastic]\n"
            "                      [--overflow default|saturate|ieee] [--seed N] [--json]\n"
            "       nanolm formats sum --format FORMAT --value V --count N [--promote-every K] [--json]\n"
            "formats: %s\n",
            nl_fmt_names());
    return f == stdout ? NL_EXIT_OK : NL_EXIT_USAGE;
}

static int parse_format(const char *opt, const char *s, nl_format *f) {
    if (nl_fmt_from_name(s, f) != NL_OK) return nl_cli_usage_error("%s: %s", opt, nl_last_error());
    return 0;
}

/* ---- table ---- */

static int cmd_table(int json) {
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (int f = 0; f < NL_FMT_COUNT; f++) {
            const nl_format_info *fi = nl_fmt_info((nl_format)f);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", fi->name);
            cJSON_AddStringToObject(o, "description", fi->description);
            cJSON_AddNumberToObject(o, "bits", fi->bits);
            cJSON_AddNumberToObject(o, "exp_bits", fi->exp_bits);
            cJSON_AddNumberToObject(o, "man_bits", fi->man_bits);
            cJSON_AddNumberToObject(o, "bias", fi->bias);
            cJSON_AddNumberToObject(o, "max_finite", fi->max_finite);
            cJSON_AddNumberToObject(o, "min_normal", fi->min_normal);
            cJSON_AddNumberToObject(o, "min_subnormal", fi->min_subnormal);
            cJSON_AddNumberToObject(o, "epsilon", fi->epsilon);
            cJSON_AddBoolToObject(o, "has_inf", fi->has_inf);
            cJSON_AddBoolToObject(o, "has_nan", fi->has_nan);
            cJSON_AddStringToObject(o, "inf_encoding", fi->inf_encoding);
            cJSON_AddStringToObject(o, "nan_encoding", fi->nan_encoding);
            cJSON_AddStringToObject(o, "default_overflow", fi->saturate_by_default ? "saturate" : "ieee");
            cJSON_AddItemToArray(arr, o);
        }
        cJSON *d = cJSON_CreateObject();
        cJSON_AddItemToObject(d, "formats", arr);
        return nl_cli_print_json(d);
    }
    static const char *const hdr[] = {"format", "bits", "E", "M", "bias", "max finite", "min normal",
                                       "min subnormal", "epsilon", "inf", "NaN", "overflow"};
    nl_table t;
    nl_table_init(&t, 12, hdr);
    for (int c = 1; c <= 8; c++) t.right[c] = 1;
    for (int f = 0; f < NL_FMT_COUNT; f++) {
        const nl_format_info *fi = nl_fmt_info((nl_format)f);
        nl_table_rowf(&t, "%s|%d|%d|%d|%d|%.6g|%.6g|%.6g|%.6g|%s|%s|%s", fi->name, fi->bits, fi->exp_bits,
                      fi->man_bits, fi->bias, fi->max_finite, fi->min_normal, fi->min_subnormal, fi->epsilon,
                      fi->inf_encoding, fi->nan_encoding, fi->saturate_by_default ? "saturate" : "ieee (inf)");
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    return NL_EXIT_OK;
}

/* ---- cast ---- */

static int parse_value(const char *s, double *v) {
    if (!strcasecmp(s, "inf") || !strcasecmp(s, "+inf")) { *v = INFINITY; return 0; }
    if (!strcasecmp(s, "-inf")) { *v = -INFINITY; return 0; }
    if (!strcasecmp(s, "nan")) { *v = NAN; return 0; }
    return nl_cli_double("cast VALUE", s, v);
}

static int cmd_cast(int argc, char **argv) {
    static const struct option opts[] = {
        {"to", required_argument, 0, 't'},       {"rounding", required_argument, 0, 'r'},
        {"overflow", required_argument, 0, 'o'}, {"seed", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},           {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int json = 0, c, have_to = 0;
    nl_format f = NL_FMT_BF16;
    nl_rounding rnd = NL_ROUND_NEAREST_EVEN;
    nl_overflow ovf = NL_OVERFLOW_DEFAULT;
    int64_t seed = 1;
    /* A negative VALUE ("-1.5", "-inf") would look like an option to getopt: take it out first. */
    const char *neg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *prev = argv[i - 1];
        int prev_takes_value = i > 1 && (!strcmp(prev, "--to") || !strcmp(prev, "-t") || !strcmp(prev, "--rounding") ||
                                         !strcmp(prev, "-r") || !strcmp(prev, "--overflow") || !strcmp(prev, "-o") ||
                                         !strcmp(prev, "--seed") || !strcmp(prev, "-s"));
        if (a[0] == '-' && (a[1] == '.' || (a[1] >= '0' && a[1] <= '9') || !strcasecmp(a, "-inf")) && !prev_takes_value) {
            if (neg) return nl_cli_usage_error("formats cast: unexpected argument '%s'", a);
            neg = a;
            for (int j = i; j + 1 < argc; j++) argv[j] = argv[j + 1];
            argc--;
            i--;
        }
    }
    while ((c = getopt_long(argc, argv, "t:r:o:s:jh", opts, NULL)) != -1) {
        switch (c) {
        case 't': if (parse_format("--to", optarg, &f)) return NL_EXIT_USAGE; have_to = 1; break;
        case 'r':
            if (!strcmp(optarg, "rne") || !strcmp(optarg, "nearest-even")) rnd = NL_ROUND_NEAREST_EVEN;
            else if (!strcmp(optarg, "rtz") || !strcmp(optarg, "toward-zero")) rnd = NL_ROUND_TOWARD_ZERO;
            else if (!strcmp(optarg, "away") || !strcmp(optarg, "nearest-away")) rnd = NL_ROUND_NEAREST_AWAY;
            else if (!strcmp(optarg, "stochastic")) rnd = NL_ROUND_STOCHASTIC;
            else return nl_cli_usage_error("formats cast: unknown --rounding '%s' (rne, rtz, away, stochastic)", optarg);
            break;
        case 'o':
            if (!strcmp(optarg, "default")) ovf = NL_OVERFLOW_DEFAULT;
            else if (!strcmp(optarg, "saturate")) ovf = NL_OVERFLOW_SATURATE;
            else if (!strcmp(optarg, "ieee")) ovf = NL_OVERFLOW_IEEE;
            else return nl_cli_usage_error("formats cast: unknown --overflow '%s' (default, saturate, ieee)", optarg);
            break;
        case 's': if (nl_cli_int("--seed", optarg, 0, INT64_MAX, &seed)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': return usage(stdout);
        default: return nl_cli_bad_option("formats cast", argv);
        }
    }
    if (optind >= argc && !neg) return nl_cli_usage_error("formats cast: missing VALUE (e.g. nanolm formats cast 257 --to bf16)");
    if (optind + (neg ? 0 : 1) < argc) return nl_cli_usage_error("formats cast: unexpected argument '%s'", argv[optind + (neg ? 0 : 1)]);
    if (!have_to) return nl_cli_usage_error("formats cast: missing --to FORMAT (one of: %s)", nl_fmt_names());
    const char *text = neg ? neg : argv[optind];
    double vin;
    if (parse_value(text, &vin)) return NL_EXIT_USAGE;
    float x = (float)vin;
    nl_rng rng;
    nl_rng_seed(&rng, (uint64_t)seed);
    uint32_t code;
    if (nl_fmt_encode(f, x, rnd, ovf, nl_rng_u32(&rng), &code) != NL_OK) return nl_cli_fail("formats cast");
    const nl_format_info *fi = nl_fmt_info(f);
    double dec = nl_fmt_decode(f, code);
    double abs_err = fabs(dec - (double)x);
    double rel_err = x != 0 ? abs_err / fabs((double)x) : (dec == 0 ? 0 : INFINITY);
    if (isnan(dec) || isinf(dec) || isinf(x)) {
        abs_err = (dec == (double)x) ? 0 : (isnan(dec) || x != x) ? NAN : INFINITY;
        rel_err = abs_err;
    }
    double below = NAN, above = NAN;
    if (x == x) nl_fmt_neighbors(f, x, &below, &above);
    char bin[128], hex[16];
    code_binary(fi, code, bin, sizeof bin);
    snprintf(hex, sizeof hex, "0x%0*X", (fi->bits + 3) / 4, code);
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", text);
        cJSON_AddNumberToObject(d, "input_fp32", x);
        cJSON_AddStringToObject(d, "format", fi->name);
        cJSON_AddNumberToObject(d, "code", code);
        cJSON_AddStringToObject(d, "code_hex", hex);
        cJSON_AddStringToObject(d, "code_binary", bin);
        if (isnan(dec)) cJSON_AddStringToObject(d, "decoded", "nan");
        else if (isinf(dec)) cJSON_AddStringToObject(d, "decoded", dec > 0 ? "inf" : "-inf");
        else cJSON_AddNumberToObject(d, "decoded", dec);
        if (isfinite(abs_err)) cJSON_AddNumberToObject(d, "abs_error", abs_err); else cJSON_AddNullToObject(d, "abs_error");
        if (isfinite(rel_err)) cJSON_AddNumberToObject(d, "rel_error", rel_err); else cJSON_AddNullToObject(d, "rel_error");
        if (isfinite(below)) cJSON_AddNumberToObject(d, "below", below); else cJSON_AddNullToObject(d, "below");
        if (isfinite(above)) cJSON_AddNumberToObject(d, "above", above); else cJSON_AddNullToObject(d, "above");
        cJSON_AddNumberToObject(d, "ulp", nl_fmt_ulp(f, x));
        return nl_cli_print_json(d);
    }
    char b1[64], b2[64];
    printf("input      %s", text);
    if ((double)x != vin && vin == vin) printf("  (as fp32: %.9g)", (double)x);
    printf("\nformat     %s (%s)\n", fi->name, fi->description);
    printf("code       %s\n", hex);
    printf("binary     %s%s\n", bin,
           fi->kind == NL_FMT_KIND_INT ? "" : fi->has_sign ? "   (sign | exponent | mantissa)" : "   (exponent)");
    printf("decoded    %.10g\n", dec);
    printf("abs error  %.6g\n", abs_err);
    printf("rel error  %.6g\n", rel_err);
    fmt_num(b1, sizeof b1, below);
    fmt_num(b2, sizeof b2, above);
    printf("neighbours %s below, %s above (spacing %.6g)\n", b1, b2, nl_fmt_ulp(f, x));
    return NL_EXIT_OK;
}

/* ---- sum ---- */

static int cmd_sum(int argc, char **argv) {
    static const struct option opts[] = {
        {"format", required_argument, 0, 'f'}, {"value", required_argument, 0, 'v'},
        {"count", required_argument, 0, 'n'},  {"promote-every", required_argument, 0, 'p'},
        {"json", no_argument, 0, 'j'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int json = 0, c, have_f = 0, have_v = 0;
    nl_format f = NL_FMT_E4M3;
    double value = 0;
    int64_t count = 100, every = 0;
    while ((c = getopt_long(argc, argv, "f:v:n:p:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'f': if (parse_format("--format", optarg, &f)) return NL_EXIT_USAGE; have_f = 1; break;
        case 'v': if (nl_cli_double("--value", optarg, &value)) return NL_EXIT_USAGE; have_v = 1; break;
        case 'n': if (nl_cli_int("--count", optarg, 1, 100000000, &count)) return NL_EXIT_USAGE; break;
        case 'p': if (nl_cli_int("--promote-every", optarg, 1, 100000000, &every)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'h': return usage(stdout);
        default: return nl_cli_bad_option("formats sum", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("formats sum: unexpected argument '%s'", argv[optind]);
    if (!have_f) return nl_cli_usage_error("formats sum: missing --format (one of: %s)", nl_fmt_names());
    if (!have_v) return nl_cli_usage_error("formats sum: missing --value");
    const nl_format_info *fi = nl_fmt_info(f);
    if (fi->kind == NL_FMT_KIND_SCALE)
        return nl_cli_usage_error("formats sum: e8m0 is a scale format (powers of two only); pick an element format");
    float v = nl_fmt_round(f, (float)value);
    /* Running sum: partial in the format, promoted into an fp32 accumulator every K terms. */
    float *traj = malloc((size_t)count * sizeof *traj);
    if (!traj) return nl_cli_usage_error("formats sum: --count %lld is too large", (long long)count);
    float partial = 0, acc = 0;
    int64_t last_change = 0; /* last step at which the (unpromoted) sum changed */
    for (int64_t i = 1; i <= count; i++) {
        float before = partial;
        partial = nl_fmt_round(f, partial + v);
        if (partial != before) last_change = i;
        if (every && (i % every == 0 || i == count)) {
            acc += partial;
            partial = 0;
        }
        traj[i - 1] = every ? acc + partial : partial;
    }
    float result = every ? acc : partial;
    double exact = (double)v * (double)count;
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "format", fi->name);
        cJSON_AddNumberToObject(d, "value", value);
        cJSON_AddNumberToObject(d, "value_in_format", v);
        cJSON_AddNumberToObject(d, "count", (double)count);
        cJSON_AddNumberToObject(d, "promote_every", (double)every);
        cJSON *t = cJSON_CreateArray();
        for (int64_t i = 0; i < count; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(traj[i]));
        cJSON_AddItemToObject(d, "trajectory", t);
        cJSON_AddNumberToObject(d, "result", result);
        cJSON_AddNumberToObject(d, "exact", exact);
        if (!every && last_change < count) cJSON_AddNumberToObject(d, "stuck_from_step", (double)last_change);
        free(traj);
        return nl_cli_print_json(d);
    }
    printf("sum of %lld x %.10g in %s, rounded to %s after each addition", (long long)count, (double)v, fi->name, fi->name);
    if (every) printf(", partial sums moved to fp32 every %lld terms", (long long)every);
    printf("\n");
    if ((double)v != value) printf("(the value %.10g is %.10g in %s)\n", value, (double)v, fi->name);
    printf("step  sum\n");
    for (int64_t i = 0; i < count; i++) {
        /* print the first 20 steps, every 10th, and the last; note where a step changes nothing */
        int show = i < 20 || (i + 1) % 10 == 0 || i + 1 == count;
        if (!show) continue;
        printf("%4lld  %.10g", (long long)(i + 1), (double)traj[i]);
        if (i > 0 && traj[i] == traj[i - 1]) printf("   (+%.10g lost)", (double)v);
        printf("\n");
    }
    printf("result %.10g (exact %.10g", (double)result, exact);
    if (!every && last_change < count)
        printf("; reaches %.10g at step %lld and stays there", (double)result, (long long)last_change);
    printf(")\n");
    free(traj);
    return NL_EXIT_OK;
}

int nl_cmd_formats(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "cast")) return cmd_cast(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "sum")) return cmd_sum(argc - 1, argv + 1);
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': return usage(stdout);
        default: return nl_cli_bad_option("formats", argv);
        }
    }
    if (optind < argc)
        return nl_cli_usage_error("formats: unknown subcommand '%s' (cast, sum)", argv[optind]);
    return cmd_table(json);
}
