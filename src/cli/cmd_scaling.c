/* nanolm scaling optimal|overtrain|fit: compute-optimal sizes, over-training, fitting the law. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/plan.h"
#include "nanolm/scaling_methods.h"
#include "plan_opts.h"
#include "report.h"
#include "scaling_lab.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: nanolm scaling optimal (--flops C | --params N) [--gpu G] [--mfu 0.4] [--price $/h]\n"
        "                              [--hw FILE.json] [--svg FILE] [--explain] [--json]\n"
        "       nanolm scaling overtrain --params N --tokens D [--ratio 20] [--json]\n"
        "       nanolm scaling fit FILE.csv [--bootstrap 100] [--seed S] [--delta 1e-3] [--json]\n"
        "                          [--n-col NAME] [--d-col NAME] [--flops-col NAME] [--loss-col NAME]\n"
        "       nanolm scaling sweep --data FILE [--grid default|small|tiny] [--out DIR] (see --help)\n"
        "       nanolm scaling lr-transfer --data FILE [--widths 16,32,64] (muP; see --help)\n"
        "       nanolm scaling emergence --data FILE (--ckpt F ... | --sweep DIR) (see --help)\n\n"
        "optimal:   N and D for a budget C = 6*N*D (or the budget that makes N optimal) by the\n"
        "           20 tokens/parameter rule, Chinchilla approaches 1 and 3, and Kaplan et al.\n"
        "overtrain: a model trained past the optimum against the compute-optimal model of the\n"
        "           same predicted loss, and the served tokens at which it pays off.\n"
        "fit:       fits E, A, B, alpha, beta to (N, D or FLOPs, loss) rows (Hoffmann's method); columns are\n"
        "           found by name (N/params, D/tokens, C/FLOPs, loss) or as --*-col names them; others are ignored.\n");
}

typedef nl_scaling_choice row;

typedef struct optimal_args {
    nl_plan_args pa; /* --gpu, --hw */
    double flops, params, mfu, price;
    const char *svg;
    int explain, json;
} optimal_args;

static int optimal_parse(optimal_args *o, int argc, char **argv) {
    nl_plan_args_init(&o->pa);
    o->flops = o->params = 0;
    o->mfu = 0.4;
    o->price = -1;
    o->svg = NULL;
    o->explain = o->json = 0;
    nl_opt hw[3];
    nl_plan_hw_opts(hw, &o->pa, 0);
    nl_opt opts[] = {
        NL_OPT_SI("flops", &o->flops, 0, INFINITY, "C", "training compute budget in FLOPs (1.2e20)"),
        NL_OPT_SI("params", &o->params, 0, INFINITY, "N", "or the model size (1B): the budget that makes it optimal"),
        NL_OPT_DBL("mfu", &o->mfu, 0.001, 1, "X", "model FLOPs utilisation for GPU-hours (default 0.4)"),
        NL_OPT_DBL("price", &o->price, 0, INFINITY, "$/H", "$ per GPU-hour (default: the GPU's)"),
        NL_OPT_STR("svg", &o->svg, "FILE", "the loss frontier around the budget"),
        NL_OPT_FLAG("explain", &o->explain, "derive approach 3's closed form with the numbers substituted"),
        NL_OPT_FLAG("json", &o->json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{NULL, opts, NL_NOPTS(opts)}, {"hardware", hw, 2}};
    nl_cmdspec spec = {
        "scaling optimal",
        "nanolm scaling optimal (--flops C | --params N) [options]",
        "N and D for a budget C = 6*N*D (or the budget that makes N optimal) by the 20 tokens/parameter\n"
        "rule, Chinchilla approaches 1 and 3, and Kaplan et al.",
        groups,
        NL_NOPTS(groups),
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if ((rc = nl_plan_args_load(&o->pa, "scaling optimal"))) return rc;
    if ((o->flops > 0) == (o->params > 0))
        return nl_cli_usage_error("scaling optimal: give exactly one of --flops and --params (> 0)");
    return 0;
}

/* The five allocations of a budget (flops > 0) or for a model size (params), with the loss the
 * unrounded approach 3 predicts. */

/* The Lagrange-multiplier derivation of approach 3's closed form at budget C, numbers substituted
 * (Hoffmann et al. 2022 appendix D.2). */
static void report_explain(nl_report *r, const nl_chinchilla *law, double C) {
    const double al = law->alpha, be = law->beta, A = law->A, B = law->B;
    nl_chinchilla_optimum o;
    nl_scaling_optimum(law, C, &o);
    nl_report_note(r, "%s", "");
    nl_report_note(r,
                   "Why (Lagrange multipliers, Hoffmann et al. 2022 approach 3):\n"
                   "  minimise L(N, D) = E + A/N^alpha + B/D^beta subject to 6 N D = C\n"
                   "  with E = %.4f, A = %.2f, B = %.2f, alpha = %.4f, beta = %.4f, C = %.4g FLOPs.",
                   law->E, A, B, al, be, C);
    nl_report_note(r, "  Lagrangian: E + A N^-alpha + B D^-beta + lambda (6 N D - C)\n"
                      "  dL/dN = 0:  alpha A N^-alpha = 6 lambda N D\n"
                      "  dL/dD = 0:  beta B D^-beta  = 6 lambda N D\n"
                      "  so alpha A N^-alpha = beta B D^-beta; put D = C/(6N):\n"
                      "  N^(alpha+beta) = (alpha A / (beta B)) (C/6)^beta\n"
                      "  N = G (C/6)^a, D = G^-1 (C/6)^b with G = (alpha A/(beta B))^(1/(alpha+beta)),\n"
                      "  a = beta/(alpha+beta), b = alpha/(alpha+beta).");
    nl_report_note(r,
                   "  Numbers: G = (%.4f x %.2f / (%.4f x %.2f))^(1/%.4f) = %.4f, a = %.4f, b = %.4f,\n"
                   "  C/6 = %.4g, N = %.4f x %.4g^%.4f = %.4g parameters, D = %.4g^%.4f / %.4f = %.4g tokens",
                   al, A, be, B, al + be, o.G, o.a, o.b, C / 6, o.G, C / 6, o.a, o.n, C / 6, o.b, o.G, o.d);
    nl_report_note(r,
                   "  (%.1f tokens per parameter). Check: alpha A N^-alpha = %.4g, beta B D^-beta = %.4g,\n"
                   "  lambda = %.4g per FLOP; 6 N D = %.4g = C.",
                   o.d / o.n, o.lhs, o.rhs, o.lhs / (6 * o.n * o.d), 6 * o.n * o.d);
}

static void report_optimal(nl_report *r, const optimal_args *o, const nl_hw *hw, const row rows[5]) {
    double rate = hw->flops_bf16 * o->mfu;
    nl_report_str(r, "gpu", "", hw->name);
    nl_report_num(r, "mfu", "", o->mfu, NULL, NULL);
    nl_report_note(r,
                   "Compute-optimal allocation, C = 6*N*D; loss from Chinchilla approach 3 (unrounded);\n"
                   "GPU-hours on %s at %.0f%% MFU (%.0f TFLOP/s peak), $%.2f per GPU-hour.",
                   hw->name, 100 * o->mfu, hw->flops_bf16 / 1e12, hw->price_per_hour);
    nl_chinchilla law;
    nl_scaling_hoffmann(&law);
    if (o->explain) report_explain(r, &law, rows[2].c);
    nl_report_table(r, "methods", NULL, 10,
                    (const nl_report_col[]){{"method", "method", NULL},
                                            {NULL, "params", NULL},
                                            {"params", "", NULL},
                                            {NULL, "tokens", NULL},
                                            {"tokens", "", NULL},
                                            {"tokens_per_param", "tok/param", "%-.1f"},
                                            {"flops", "FLOPs", "%-.3g"},
                                            {"predicted_loss", "loss", "%-.3f"},
                                            {"gpu_hours", "GPU-hours", "%-.4g"},
                                            {"cost", "cost $", "%-.4g"}});
    for (int i = 0; i < 5; i++) {
        char n[32], d[32];
        double hours = rows[i].c / rate / 3600;
        nl_report_cell_str(r, rows[i].method);
        nl_report_cell_str(r, nl_fmt_count(rows[i].n, n, sizeof n));
        nl_report_cell_num(r, rows[i].n);
        nl_report_cell_str(r, nl_fmt_count(rows[i].d, d, sizeof d));
        nl_report_cell_num(r, rows[i].d);
        nl_report_cell_num(r, rows[i].d / rows[i].n);
        nl_report_cell_num(r, rows[i].c);
        nl_report_cell_num(r, rows[i].loss);
        nl_report_cell_num(r, hours);
        nl_report_cell_num(r, hours * hw->price_per_hour);
        nl_report_row_end(r);
    }
    nl_powerlaw a1n, a1d;
    nl_scaling_approach1(&a1n, &a1d);
    nl_report_note(r, "%s", "");
    nl_report_note(r, "Approach 1: N = %.4g * C^%.4f (log-log fit to Hoffmann et al. 2022 Table 3), D = C / 6N.", a1n.k,
                   a1n.a);
}

static int cmd_optimal(int argc, char **argv) {
    optimal_args o;
    int rc = optimal_parse(&o, argc, argv);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_hw hw;
    if (nl_catalog_find_hw(&o.pa.cat, o.pa.gpu, &hw))
        return nl_cli_usage_error("scaling optimal: --gpu: %s", nl_last_error());
    if (o.price >= 0) hw.price_per_hour = o.price;
    row r[5];
    nl_scaling_methods(o.flops, o.params, r);
    if (o.svg) {
        nl_chinchilla law;
        nl_scaling_hoffmann(&law);
        double mark = o.flops > 0 ? o.flops : r[2].c;
        if (nl_scaling_svg_frontier(o.svg, &law, mark / 1e3, mark * 1e3, mark)) return nl_cli_fail("--svg");
    }
    nl_report *rep = nl_report_new("scaling optimal");
    report_optimal(rep, &o, &hw, r);
    return nl_report_print(rep, o.json);
}

static void report_overtrain(nl_report *r, double n, double d, double ratio, const nl_overtrain *o) {
    char a[32], b[32], e[32], f[32];
    nl_report_num(r, "params", "", n, NULL, NULL);
    nl_report_num(r, "tokens", "", d, NULL, NULL);
    nl_report_num(r, "tokens_per_param", "", o->tokens_per_param, NULL, NULL);
    nl_report_num(r, "multiple_of_rule", "", o->multiple_of_rule, NULL, NULL);
    nl_report_num(r, "flops", "", o->flops, NULL, NULL);
    nl_report_num(r, "predicted_loss", "", o->loss, NULL, NULL);
    nl_report_num(r, "optimal_params", "", o->opt_params, NULL, NULL);
    nl_report_num(r, "optimal_tokens", "", o->opt_tokens, NULL, NULL);
    nl_report_num(r, "optimal_flops", "", o->opt_flops, NULL, NULL);
    nl_report_num(r, "extra_flops_frac", "", o->extra_flops_frac, NULL, NULL);
    nl_report_num(r, "breakeven_tokens", "", o->breakeven_tokens, NULL, NULL); /* null when never */
    nl_report_note(r, "model:            %s parameters on %s tokens = %.3g FLOPs", nl_fmt_count(n, a, sizeof a),
                   nl_fmt_count(d, b, sizeof b), o->flops);
    nl_report_note(r, "tokens/parameter: %.0f, %.1fx the %.0f-tokens rule", o->tokens_per_param, o->multiple_of_rule,
                   ratio);
    nl_report_note(r, "predicted loss:   %.4f (Chinchilla approach 3)", o->loss);
    nl_report_note(r, "same loss, compute-optimal: %s parameters on %s tokens = %.3g FLOPs",
                   nl_fmt_count(o->opt_params, e, sizeof e), nl_fmt_count(o->opt_tokens, f, sizeof f), o->opt_flops);
    nl_report_note(r, "extra training compute: %+.0f%%", 100 * o->extra_flops_frac);
    if (isfinite(o->breakeven_tokens))
        nl_report_note(r,
                       "break-even: after %s served tokens (2N FLOPs each) the smaller model has paid for its extra "
                       "training",
                       nl_fmt_count(o->breakeven_tokens, a, sizeof a));
    else
        nl_report_note(r, "break-even: never (this model is larger than the compute-optimal one of the same loss)");
}

static int cmd_overtrain(int argc, char **argv) {
    double n = 0, d = 0, ratio = 20;
    int json = 0;
    nl_opt opts[] = {
        NL_OPT_SI("params", &n, 0, INFINITY, "N", "parameters of the model (8B; required)"),
        NL_OPT_SI("tokens", &d, 0, INFINITY, "D", "training tokens (15T; required)"),
        NL_OPT_DBL("ratio", &ratio, 0, INFINITY, "R", "tokens per parameter of the rule (default 20)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{NULL, opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"scaling overtrain",
                       "nanolm scaling overtrain --params N --tokens D [options]",
                       "A model trained past the optimum against the compute-optimal model of the same predicted\n"
                       "loss, and the served tokens at which it pays off.",
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (!(n > 0) || !(d > 0)) return nl_cli_usage_error("scaling overtrain: --params and --tokens are required (> 0)");
    if (!(ratio > 0)) return nl_cli_usage_error("scaling overtrain: --ratio must be > 0");
    nl_chinchilla law;
    nl_scaling_hoffmann(&law);
    nl_overtrain o;
    if (nl_scaling_overtrain(&law, n, d, ratio, &o)) return nl_cli_fail("scaling overtrain");
    nl_report *r = nl_report_new("scaling overtrain");
    report_overtrain(r, n, d, ratio, &o);
    return nl_report_print(r, json);
}

static void report_fit(nl_report *r, const nl_scaling_fit_result *f, double delta, int64_t boot) {
    const struct {
        const char *label, *se_key;
        double v, se;
    } p[] = {{"E", "se_E", f->law.E, f->se_E},
             {"log A", "se_log_A", f->log_a, f->se_log_a},
             {"log B", "se_log_B", f->log_b, f->se_log_b},
             {"alpha", "se_alpha", f->law.alpha, f->se_alpha},
             {"beta", "se_beta", f->law.beta, f->se_beta}};
    nl_report_int(r, "n_obs", "", f->n_obs, NULL);
    nl_report_num(r, "E", "", f->law.E, NULL, NULL);
    nl_report_num(r, "A", "", f->law.A, NULL, NULL);
    nl_report_num(r, "B", "", f->law.B, NULL, NULL);
    nl_report_num(r, "alpha", "", f->law.alpha, NULL, NULL);
    nl_report_num(r, "beta", "", f->law.beta, NULL, NULL);
    for (int i = 0; i < 5; i++) nl_report_num(r, p[i].se_key, "", p[i].se, NULL, NULL);
    nl_report_num(r, "objective", "", f->objective, NULL, NULL);
    nl_report_note(r,
                   "L(N, D) = E + A/N^alpha + B/D^beta fitted to %d rows (Huber delta %g on log loss, L-BFGS from the\n"
                   "best %d of 4500 grid starts; standard errors from %lld bootstrap resamples):",
                   f->n_obs, delta, f->n_starts, (long long)boot);
    nl_report_table(
        r, NULL, NULL, 3,
        (const nl_report_col[]){{NULL, "parameter", NULL}, {NULL, "estimate", "%-.4f"}, {NULL, "std. error", "%-.4f"}});
    for (int i = 0; i < 5; i++) {
        nl_report_cell_str(r, p[i].label);
        nl_report_cell_num(r, p[i].v);
        nl_report_cell_num(r, p[i].se);
        nl_report_row_end(r);
    }
    double a = f->law.beta / (f->law.alpha + f->law.beta);
    nl_report_note(r, "%s", "");
    nl_report_note(r, "compute-optimal N ~ C^%.3f, D ~ C^%.3f", a, 1 - a);
}

static int cmd_fit(int argc, char **argv) {
    nl_scaling_cols names = {NULL, NULL, NULL, NULL};
    int64_t boot = 100, seed = 1;
    double delta = 1e-3;
    int json = 0, npos = 0;
    nl_opt opts[] = {
        NL_OPT_INT("bootstrap", &boot, 0, 100000, "K", "resamples for the standard errors (default 100; 0: none)"),
        NL_OPT_INT("seed", &seed, 0, INT64_MAX, "S", "seed of the resampling (default 1)"),
        NL_OPT_DBL("delta", &delta, 0, INFINITY, "X", "Huber delta on log loss (default 1e-3)"),
        NL_OPT_STR("n-col", &names.n, "NAME", "column of parameter counts (default N or params)"),
        NL_OPT_STR("d-col", &names.d, "NAME", "column of training tokens (default D or tokens)"),
        NL_OPT_STR("flops-col", &names.flops, "NAME", "column of training FLOPs (default C or FLOPs; D = C / 6N)"),
        NL_OPT_STR("loss-col", &names.loss, "NAME", "column of losses (default loss)"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{NULL, opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"scaling fit",
                       "nanolm scaling fit FILE.csv [options]",
                       "Fits E, A, B, alpha, beta to (N, D or FLOPs, loss) rows (Hoffmann's method); columns are\n"
                       "found by name (N/params, D/tokens, C/FLOPs, loss) or as --*-col names them; others are "
                       "ignored.",
                       groups,
                       1,
                       1};
    const char *file = NULL;
    int rc = nl_cli_parse(&spec, argc, argv, &file, &npos);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    if (npos != 1) return nl_cli_usage_error("scaling fit: give one CSV file (columns N, D or FLOPs, loss)");
    if (!(delta > 0)) return nl_cli_usage_error("scaling fit: --delta must be > 0");
    nl_scaling_obs *obs;
    size_t n;
    if (nl_scaling_read_csv_cols(file, &names, &obs, &n)) return nl_cli_fail("scaling fit");
    nl_scaling_fit_opts fo = {delta, (int)boot, (uint64_t)seed};
    nl_scaling_fit_result r;
    nl_status st = nl_scaling_fit(obs, n, &fo, &r);
    nl_free(obs);
    if (st) return nl_cli_fail("scaling fit");
    nl_report *rep = nl_report_new("scaling fit");
    report_fit(rep, &r, delta, boot);
    return nl_report_print(rep, json);
}

int nl_cmd_scaling(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? NL_EXIT_USAGE : NL_EXIT_OK;
    }
    const char *sub = argv[1];
    nl_cli_getopt_reset();
    if (!strcmp(sub, "optimal")) return cmd_optimal(argc - 1, argv + 1);
    if (!strcmp(sub, "overtrain")) return cmd_overtrain(argc - 1, argv + 1);
    if (!strcmp(sub, "fit")) return cmd_fit(argc - 1, argv + 1);
    if (!strcmp(sub, "sweep")) return nl_cmd_scaling_sweep(argc - 1, argv + 1);
    if (!strcmp(sub, "lr-transfer")) return nl_cmd_scaling_lr_transfer(argc - 1, argv + 1);
    if (!strcmp(sub, "emergence")) return nl_cmd_scaling_emergence(argc - 1, argv + 1);
    return nl_cli_usage_error(
        "scaling: unknown subcommand '%s' (optimal, overtrain, fit, sweep, lr-transfer, emergence)", sub);
}
