/* nanolm formats [cast VALUE --to F | sum --format F --value V --count N [--promote-every K]]:
 * the properties table of every number format, one value through a format, and a running
 * sum rounded to a format after each addition (with optional promotion to fp32). Each
 * subcommand declares one option table (cli_opt.h) and writes its result once (report.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/format_study.h"
#include "report.h"

static int parse_format(const char *opt, const char *s, nl_format *f) {
    if (nl_fmt_from_name(s, f) != NL_OK) return nl_cli_usage_error("%s: %s", opt, nl_last_error());
    return 0;
}

/* ---- table ---- */

static int cmd_table(int argc, char **argv) {
    int json = 0;
    nl_opt opts[] = {NL_OPT_FLAG("json", &json, "print the result as JSON")};
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    char summary[512];
    snprintf(summary, sizeof summary,
             "The properties of every number format. Subcommands:\n"
             "  nanolm formats cast VALUE --to FORMAT   one value through a format (see --help)\n"
             "  nanolm formats sum --format F --value V --count N [--promote-every K]\n"
             "formats: %s",
             nl_fmt_names());
    nl_cmdspec spec = {"formats", "nanolm formats [cast|sum] [--json]", summary, groups, 1, 1};
    const char *sub = NULL;
    int rc = nl_cli_parse(&spec, argc, argv, &sub, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (sub) return nl_cli_usage_error("formats: unknown subcommand '%s' (cast, sum)", sub);
    nl_report *r = nl_report_new("formats");
    nl_report_table(r, "formats", NULL, 16,
                    (const nl_report_col[]){{"name", "format", NULL},
                                            {"description", "", NULL},
                                            {"bits", "bits", "%.0f"},
                                            {"exp_bits", "E", "%.0f"},
                                            {"man_bits", "M", "%.0f"},
                                            {"bias", "bias", "%.0f"},
                                            {"max_finite", "max finite", "%.6g"},
                                            {"min_normal", "min normal", "%.6g"},
                                            {"min_subnormal", "min subnormal", "%.6g"},
                                            {"epsilon", "epsilon", "%.6g"},
                                            {"has_inf", "", NULL},
                                            {"has_nan", "", NULL},
                                            {"inf_encoding", "inf", NULL},
                                            {"nan_encoding", "NaN", NULL},
                                            {"default_overflow", "", NULL},
                                            {NULL, "overflow", NULL}});
    for (int f = 0; f < NL_FMT_COUNT; f++) {
        const nl_format_info *fi = nl_fmt_info((nl_format)f);
        nl_report_cell_str(r, fi->name);
        nl_report_cell_str(r, fi->description);
        nl_report_cell_num(r, fi->bits);
        nl_report_cell_num(r, fi->exp_bits);
        nl_report_cell_num(r, fi->man_bits);
        nl_report_cell_num(r, fi->bias);
        nl_report_cell_num(r, fi->max_finite);
        nl_report_cell_num(r, fi->min_normal);
        nl_report_cell_num(r, fi->min_subnormal);
        nl_report_cell_num(r, fi->epsilon);
        nl_report_cell_bool(r, fi->has_inf);
        nl_report_cell_bool(r, fi->has_nan);
        nl_report_cell_str(r, fi->inf_encoding);
        nl_report_cell_str(r, fi->nan_encoding);
        nl_report_cell_str(r, fi->saturate_by_default ? "saturate" : "ieee");
        nl_report_cell_str(r, fi->saturate_by_default ? "saturate" : "ieee (inf)");
        nl_report_row_end(r);
    }
    return nl_report_print(r, json);
}

/* ---- cast ---- */

typedef nl_fmt_cast_result cast_result;

static int parse_value(const char *s, double *v) {
    if (!strcasecmp(s, "inf") || !strcasecmp(s, "+inf"))
        *v = INFINITY;
    else if (!strcasecmp(s, "-inf"))
        *v = -INFINITY;
    else if (!strcasecmp(s, "nan"))
        *v = NAN;
    else
        return nl_cli_double("cast VALUE", s, v);
    return 0;
}


/* "256" or "none" (no neighbour on that side). */
static const char *neighbour_text(double v, char *buf, size_t n) {
    if (isnan(v))
        snprintf(buf, n, "none");
    else
        snprintf(buf, n, "%.10g", v);
    return buf;
}

static int cast_print(const char *text, double vin, nl_format f, const cast_result *c, int json) {
    const nl_format_info *fi = nl_fmt_info(f);
    char line[256], b1[64], b2[64];
    nl_report *r = nl_report_new("formats cast");
    nl_report_set_gap(r, 1);
    nl_report_str(r, "input", "", text);
    if ((double)c->x != vin && vin == vin)
        snprintf(line, sizeof line, "%s  (as fp32: %.9g)", text, (double)c->x);
    else
        snprintf(line, sizeof line, "%s", text);
    nl_report_str(r, NULL, "input", line);
    nl_report_num(r, "input_fp32", "", c->x, NULL, NULL);
    nl_report_str(r, "format", "", fi->name);
    snprintf(line, sizeof line, "%s (%s)", fi->name, fi->description);
    nl_report_str(r, NULL, "format", line);
    nl_report_int(r, "code", "", c->code, NULL);
    nl_report_str(r, "code_hex", "code", c->hex);
    nl_report_str(r, "code_binary", "", c->binary);
    snprintf(line, sizeof line, "%s%s", c->binary,
             fi->kind == NL_FMT_KIND_INT ? ""
             : fi->has_sign              ? "   (sign | exponent | mantissa)"
                                         : "   (exponent)");
    nl_report_str(r, NULL, "binary", line);
    if (isfinite(c->decoded))
        nl_report_num(r, "decoded", "decoded", c->decoded, "%.10g", NULL);
    else
        nl_report_str(r, "decoded", "decoded", isnan(c->decoded) ? "nan" : c->decoded > 0 ? "inf" : "-inf");
    nl_report_num(r, "abs_error", "abs error", c->abs_err, "%.6g", NULL);
    nl_report_num(r, "rel_error", "rel error", c->rel_err, "%.6g", NULL);
    nl_report_num(r, "below", "", c->below, NULL, NULL);
    nl_report_num(r, "above", "", c->above, NULL, NULL);
    nl_report_num(r, "ulp", "", c->ulp, NULL, NULL);
    snprintf(line, sizeof line, "%s below, %s above (spacing %.6g)", neighbour_text(c->below, b1, sizeof b1),
             neighbour_text(c->above, b2, sizeof b2), c->ulp);
    nl_report_str(r, NULL, "neighbours", line);
    return nl_report_print(r, json);
}

static int cmd_cast(int argc, char **argv) {
    const char *to = NULL, *value = NULL;
    int json = 0, rnd_i = 0, ovf_i = 0;
    int64_t seed = 1;
    /* the rounding names and their long spellings, in nl_rounding order twice */
    static const nl_rounding rnd_of[] = {NL_ROUND_NEAREST_EVEN, NL_ROUND_TOWARD_ZERO,  NL_ROUND_NEAREST_AWAY,
                                         NL_ROUND_STOCHASTIC,   NL_ROUND_NEAREST_EVEN, NL_ROUND_TOWARD_ZERO,
                                         NL_ROUND_NEAREST_AWAY};
    static const nl_overflow ovf_of[] = {NL_OVERFLOW_DEFAULT, NL_OVERFLOW_SATURATE, NL_OVERFLOW_IEEE};
    char to_help[256];
    snprintf(to_help, sizeof to_help, "target format (required): %s", nl_fmt_names());
    nl_opt opts[] = {
        NL_OPT_STR("to", &to, "FORMAT", to_help),
        NL_OPT_CHOICE("rounding", &rnd_i, "rne|rtz|away|stochastic|nearest-even|toward-zero|nearest-away",
                      "rounding (default rne: nearest, ties to even)"),
        NL_OPT_CHOICE("overflow", &ovf_i, "default|saturate|ieee",
                      "beyond the largest finite value (default: the format's own rule)"),
        NL_OPT_INT("seed", &seed, 0, 9.2e18, "N", "seed of stochastic rounding (default 1)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"formats cast",
                       "nanolm formats cast VALUE --to FORMAT [options]",
                       "Rounds VALUE (a number, inf, -inf or nan; first to fp32) to FORMAT and shows the code, its\n"
                       "bits, the decoded value, the error and the format's neighbours of the value.",
                       groups,
                       1,
                       1};
    int npos = 0, rc = nl_cli_parse(&spec, argc, argv, &value, &npos);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (!npos) return nl_cli_usage_error("formats cast: missing VALUE (e.g. nanolm formats cast 257 --to bf16)");
    if (!to) return nl_cli_usage_error("formats cast: missing --to FORMAT (one of: %s)", nl_fmt_names());
    nl_format f;
    double vin;
    if (parse_format("--to", to, &f) || parse_value(value, &vin)) return NL_EXIT_USAGE;
    cast_result c;
    if (nl_fmt_cast(f, (float)vin, rnd_of[rnd_i], ovf_of[ovf_i], (uint64_t)seed, &c))
        return nl_cli_fail("formats cast");
    return cast_print(value, vin, f, &c, json);
}

/* ---- sum ---- */

/* The running sum of `count` copies of `v`, rounded to the format after each addition; with
 * `every` > 0 the partial sum moves into an fp32 accumulator every `every` terms. */
typedef nl_fmt_sum_result sum_result;


static int sum_print(const nl_format_info *fi, double value, float v, int64_t count, int64_t every, const sum_result *s,
                     int json) {
    double exact = (double)v * (double)count;
    int stuck = !every && s->last_change < count;
    nl_report *r = nl_report_new("formats sum");
    nl_report_str(r, "format", "", fi->name);
    nl_report_num(r, "value", "", value, NULL, NULL);
    nl_report_num(r, "value_in_format", "", v, NULL, NULL);
    nl_report_int(r, "count", "", count, NULL);
    nl_report_int(r, "promote_every", "", every, NULL);
    char promo[96] = "";
    if (every) snprintf(promo, sizeof promo, ", partial sums moved to fp32 every %lld terms", (long long)every);
    nl_report_note(r, "sum of %lld x %.10g in %s, rounded to %s after each addition%s", (long long)count, (double)v,
                   fi->name, fi->name, promo);
    if ((double)v != value) nl_report_note(r, "(the value %.10g is %.10g in %s)", value, (double)v, fi->name);
    nl_report_note(r, "step  sum");
    double *traj = malloc((size_t)count * sizeof *traj);
    if (!traj) nl_report_free(r), r = NULL;
    for (int64_t i = 0; traj && i < count; i++) {
        traj[i] = s->traj[i];
        /* print the first 20 steps, every 10th, and the last; note where a step changes nothing */
        if (!(i < 20 || (i + 1) % 10 == 0 || i + 1 == count)) continue;
        char lost[64] = "";
        if (i > 0 && s->traj[i] == s->traj[i - 1]) snprintf(lost, sizeof lost, "   (+%.10g lost)", (double)v);
        nl_report_note(r, "%4lld  %.10g%s", (long long)(i + 1), (double)s->traj[i], lost);
    }
    nl_report_nums(r, "trajectory", "", traj, (int)count, NULL, NULL);
    free(traj);
    nl_report_num(r, "result", "", s->result, NULL, NULL);
    nl_report_num(r, "exact", "", exact, NULL, NULL);
    if (stuck) nl_report_int(r, "stuck_from_step", "", s->last_change, NULL);
    char tail[128] = "";
    if (stuck)
        snprintf(tail, sizeof tail, "; reaches %.10g at step %lld and stays there", (double)s->result,
                 (long long)s->last_change);
    nl_report_note(r, "result %.10g (exact %.10g%s)", (double)s->result, exact, tail);
    return nl_report_print(r, json);
}

static int cmd_sum(int argc, char **argv) {
    const char *format = NULL;
    double value = 0;
    int64_t count = 100, every = 0;
    int json = 0, have_v = 0;
    nl_opt opts[] = {
        NL_OPT_STR("format", &format, "FORMAT", "format every partial sum is rounded to (required)"),
        {"value", NL_OPT_T_DOUBLE, &value, 0, 0, NULL, "V", "the value added each step (required)", NULL, &have_v},
        NL_OPT_INT("count", &count, 1, 100000000, "N", "how many additions (default 100)"),
        {"promote-every", NL_OPT_T_INT, &every, 1, 100000000, NULL, "K",
         "move the partial sum into an fp32 accumulator every K additions (default: never)", "promote", NULL},
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"formats sum",
                       "nanolm formats sum --format FORMAT --value V --count N [--promote-every K]",
                       "Adds V to a running sum N times, rounding the sum to FORMAT after each addition (with\n"
                       "--promote-every K, moving it into an fp32 accumulator every K additions), and shows\n"
                       "where the sum stops growing.",
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (!format) return nl_cli_usage_error("formats sum: missing --format (one of: %s)", nl_fmt_names());
    if (!have_v) return nl_cli_usage_error("formats sum: missing --value");
    nl_format f;
    if (parse_format("--format", format, &f)) return NL_EXIT_USAGE;
    const nl_format_info *fi = nl_fmt_info(f);
    if (fi->kind == NL_FMT_KIND_SCALE)
        return nl_cli_usage_error("formats sum: e8m0 is a scale format (powers of two only); pick an element format");
    float v = nl_fmt_round(f, (float)value);
    sum_result s = {0};
    if (nl_fmt_repeated_sum(f, v, count, every, &s)) return nl_cli_fail("formats sum");
    rc = sum_print(fi, value, v, count, every, &s, json);
    free(s.traj);
    return rc;
}

int nl_cmd_formats(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "cast")) return cmd_cast(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "sum")) return cmd_sum(argc - 1, argv + 1);
    return cmd_table(argc, argv);
}
