/* nanolm scaling optimal|overtrain|fit: compute-optimal sizes, over-training, fitting the law. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nanolm/plan.h"
#include "nanolm/scaling.h"
#include "plan_opts.h"
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

typedef struct row {
    const char *method;
    double n, d, c, loss;
} row;

static int cmd_optimal(int argc, char **argv) {
    static const struct option opts[] = {{"flops", required_argument, 0, 'c'},
                                         {"params", required_argument, 0, 'n'},
                                         {"gpu", required_argument, 0, 'g'},
                                         {"mfu", required_argument, 0, 'm'},
                                         {"price", required_argument, 0, 'p'},
                                         {"hw", required_argument, 0, 'H'},
                                         {"svg", required_argument, 0, 's'},
                                         {"json", no_argument, 0, 'j'},
                                         {"explain", no_argument, 0, 'x'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    double flops = 0, params = 0, mfu = 0.4, price = -1;
    int explain = 0;
    const char *gpu = "h100", *svg = NULL;
    int json = 0, c;
    nl_catalog cat;
    nl_catalog_init(&cat);
    while ((c = getopt_long(argc, argv, "c:n:g:m:p:H:s:jxh", opts, NULL)) != -1) {
        switch (c) {
        case 'x': explain = 1; break;
        case 'c':
            if (nl_cli_double_si("--flops", optarg, &flops)) return NL_EXIT_USAGE;
            break;
        case 'n':
            if (nl_cli_double_si("--params", optarg, &params)) return NL_EXIT_USAGE;
            break;
        case 'g': gpu = optarg; break;
        case 'm':
            if (nl_cli_double("--mfu", optarg, &mfu)) return NL_EXIT_USAGE;
            break;
        case 'p':
            if (nl_cli_double("--price", optarg, &price)) return NL_EXIT_USAGE;
            break;
        case 'H':
            if (nl_catalog_load_hw(&cat, optarg)) return nl_cli_fail("--hw");
            break;
        case 's': svg = optarg; break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("scaling optimal", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("scaling optimal: unexpected argument '%s'", argv[optind]);
    if ((flops > 0) == (params > 0))
        return nl_cli_usage_error("scaling optimal: give exactly one of --flops and --params (> 0)");
    if (!(mfu > 0 && mfu <= 1)) return nl_cli_usage_error("scaling optimal: --mfu must be in (0, 1], got %g", mfu);
    nl_hw hw;
    if (nl_catalog_find_hw(&cat, gpu, &hw)) return nl_cli_usage_error("scaling optimal: --gpu: %s", nl_last_error());
    if (price >= 0) hw.price_per_hour = price;

    nl_chinchilla law, rounded;
    nl_scaling_hoffmann(&law);
    nl_scaling_hoffmann_rounded(&rounded);
    nl_powerlaw a1n, a1d;
    nl_scaling_approach1(&a1n, &a1d);
    row r[5];
    if (flops > 0) {
        double n, d;
        nl_scaling_rule(20, flops, &n, &d);
        r[0] = (row){"20 tokens/param", n, d, flops, 0};
        n = a1n.k * pow(flops, a1n.a);
        r[1] = (row){"Chinchilla approach 1", n, flops / (6 * n), flops, 0};
        nl_scaling_optimal_law(&law, flops, &n, &d);
        r[2] = (row){"Chinchilla approach 3", n, d, flops, 0};
        nl_scaling_optimal_law(&rounded, flops, &n, &d);
        r[3] = (row){"approach 3, rounded consts", n, d, flops, 0};
        n = nl_scaling_kaplan_params(flops);
        r[4] = (row){"Kaplan 2020 (N ~ C^0.73)", n, flops / (6 * n), flops, 0};
    } else {
        double n = params;
        r[0] = (row){"20 tokens/param", n, 20 * n, 6 * n * 20 * n, 0};
        double c1 = pow(n / a1n.k, 1 / a1n.a);
        r[1] = (row){"Chinchilla approach 1", n, c1 / (6 * n), c1, 0};
        double c3 = nl_scaling_flops_for_params(&law, n);
        r[2] = (row){"Chinchilla approach 3", n, c3 / (6 * n), c3, 0};
        double cr = nl_scaling_flops_for_params(&rounded, n);
        r[3] = (row){"approach 3, rounded consts", n, cr / (6 * n), cr, 0};
        double ck = 8.64e19 * pow(n / 1.3e9, 1 / 0.73);
        r[4] = (row){"Kaplan 2020 (N ~ C^0.73)", n, ck / (6 * n), ck, 0};
    }
    for (int i = 0; i < 5; i++) r[i].loss = nl_scaling_loss(&law, r[i].n, r[i].d);
    double rate = hw.flops_bf16 * mfu;
    if (svg) {
        double mark = flops > 0 ? flops : r[2].c;
        if (nl_scaling_svg_frontier(svg, &law, mark / 1e3, mark * 1e3, mark)) return nl_cli_fail("--svg");
    }
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "gpu", hw.name);
        cJSON_AddNumberToObject(d, "mfu", mfu);
        cJSON *arr = cJSON_AddArrayToObject(d, "methods");
        for (int i = 0; i < 5; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "method", r[i].method);
            cJSON_AddNumberToObject(o, "params", r[i].n);
            cJSON_AddNumberToObject(o, "tokens", r[i].d);
            cJSON_AddNumberToObject(o, "tokens_per_param", r[i].d / r[i].n);
            cJSON_AddNumberToObject(o, "flops", r[i].c);
            cJSON_AddNumberToObject(o, "predicted_loss", r[i].loss);
            cJSON_AddNumberToObject(o, "gpu_hours", r[i].c / rate / 3600);
            cJSON_AddNumberToObject(o, "cost", r[i].c / rate / 3600 * hw.price_per_hour);
            cJSON_AddItemToArray(arr, o);
        }
        return nl_cli_print_json(d);
    }
    static const char *hdr[] = {"method", "params", "tokens", "tok/param", "FLOPs", "loss", "GPU-hours", "cost $"};
    nl_table t;
    nl_table_init(&t, 8, hdr);
    for (int i = 0; i < 5; i++) {
        char n[32], d[32];
        nl_table_rowf(&t, "%s|%s|%s|%.1f|%.3g|%.3f|%.4g|%.4g", r[i].method, nl_fmt_count(r[i].n, n, sizeof n),
                      nl_fmt_count(r[i].d, d, sizeof d), r[i].d / r[i].n, r[i].c, r[i].loss, r[i].c / rate / 3600,
                      r[i].c / rate / 3600 * hw.price_per_hour);
    }
    printf("Compute-optimal allocation, C = 6*N*D; loss from Chinchilla approach 3 (unrounded);\n"
           "GPU-hours on %s at %.0f%% MFU (%.0f TFLOP/s peak), $%.2f per GPU-hour.\n\n",
           hw.name, 100 * mfu, hw.flops_bf16 / 1e12, hw.price_per_hour);
    if (explain) {
        /* The Lagrange-multiplier derivation of approach 3's closed form, numbers substituted
         * (Hoffmann et al. 2022 appendix D.2). */
        double al = law.alpha, be = law.beta, A = law.A, B = law.B, C = r[2].c;
        double G = pow(al * A / (be * B), 1 / (al + be)), a = be / (al + be), b = al / (al + be);
        double N = G * pow(C / 6, a), D = pow(C / 6, b) / G;
        double lhs = al * A * pow(N, -al), rhs = be * B * pow(D, -be);
        printf("Why (Lagrange multipliers, Hoffmann et al. 2022 approach 3):\n"
               "  minimise L(N, D) = E + A/N^alpha + B/D^beta subject to 6 N D = C\n"
               "  with E = %.4f, A = %.2f, B = %.2f, alpha = %.4f, beta = %.4f, C = %.4g FLOPs.\n"
               "  Lagrangian: E + A N^-alpha + B D^-beta + lambda (6 N D - C)\n"
               "  dL/dN = 0:  alpha A N^-alpha = 6 lambda N D\n"
               "  dL/dD = 0:  beta B D^-beta  = 6 lambda N D\n"
               "  so alpha A N^-alpha = beta B D^-beta; put D = C/(6N):\n"
               "  N^(alpha+beta) = (alpha A / (beta B)) (C/6)^beta\n"
               "  N = G (C/6)^a, D = G^-1 (C/6)^b with G = (alpha A/(beta B))^(1/(alpha+beta)),\n"
               "  a = beta/(alpha+beta), b = alpha/(alpha+beta).\n"
               "  Numbers: G = (%.4f x %.2f / (%.4f x %.2f))^(1/%.4f) = %.4f, a = %.4f, b = %.4f,\n"
               "  C/6 = %.4g, N = %.4f x %.4g^%.4f = %.4g parameters, D = %.4g^%.4f / %.4f = %.4g tokens\n"
               "  (%.1f tokens per parameter). Check: alpha A N^-alpha = %.4g, beta B D^-beta = %.4g,\n"
               "  lambda = %.4g per FLOP; 6 N D = %.4g = C.\n\n",
               law.E, A, B, al, be, C, al, A, be, B, al + be, G, a, b, C / 6, G, C / 6, a, N, C / 6, b, G, D, D / N,
               lhs, rhs, lhs / (6 * N * D), 6 * N * D);
    }
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    printf("\nApproach 1: N = %.4g * C^%.4f (log-log fit to Hoffmann et al. 2022 Table 3), D = C / 6N.\n", a1n.k,
           a1n.a);
    return NL_EXIT_OK;
}

static int cmd_overtrain(int argc, char **argv) {
    static const struct option opts[] = {{"params", required_argument, 0, 'n'}, {"tokens", required_argument, 0, 'd'},
                                         {"ratio", required_argument, 0, 'r'},  {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    double n = 0, d = 0, ratio = 20;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "n:d:r:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (nl_cli_double_si("--params", optarg, &n)) return NL_EXIT_USAGE;
            break;
        case 'd':
            if (nl_cli_double_si("--tokens", optarg, &d)) return NL_EXIT_USAGE;
            break;
        case 'r':
            if (nl_cli_double("--ratio", optarg, &ratio)) return NL_EXIT_USAGE;
            break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("scaling overtrain", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("scaling overtrain: unexpected argument '%s'", argv[optind]);
    if (!(n > 0) || !(d > 0)) return nl_cli_usage_error("scaling overtrain: --params and --tokens are required (> 0)");
    if (!(ratio > 0)) return nl_cli_usage_error("scaling overtrain: --ratio must be > 0");
    nl_chinchilla law;
    nl_scaling_hoffmann(&law);
    nl_overtrain o;
    if (nl_scaling_overtrain(&law, n, d, ratio, &o)) return nl_cli_fail("scaling overtrain");
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "params", n);
        cJSON_AddNumberToObject(j, "tokens", d);
        cJSON_AddNumberToObject(j, "tokens_per_param", o.tokens_per_param);
        cJSON_AddNumberToObject(j, "multiple_of_rule", o.multiple_of_rule);
        cJSON_AddNumberToObject(j, "flops", o.flops);
        cJSON_AddNumberToObject(j, "predicted_loss", o.loss);
        cJSON_AddNumberToObject(j, "optimal_params", o.opt_params);
        cJSON_AddNumberToObject(j, "optimal_tokens", o.opt_tokens);
        cJSON_AddNumberToObject(j, "optimal_flops", o.opt_flops);
        cJSON_AddNumberToObject(j, "extra_flops_frac", o.extra_flops_frac);
        if (isfinite(o.breakeven_tokens))
            cJSON_AddNumberToObject(j, "breakeven_tokens", o.breakeven_tokens);
        else
            cJSON_AddNullToObject(j, "breakeven_tokens");
        return nl_cli_print_json(j);
    }
    char a[32], b[32], e[32], f[32];
    printf("model:            %s parameters on %s tokens = %.3g FLOPs\n", nl_fmt_count(n, a, sizeof a),
           nl_fmt_count(d, b, sizeof b), o.flops);
    printf("tokens/parameter: %.0f, %.1fx the %.0f-tokens rule\n", o.tokens_per_param, o.multiple_of_rule, ratio);
    printf("predicted loss:   %.4f (Chinchilla approach 3)\n", o.loss);
    printf("same loss, compute-optimal: %s parameters on %s tokens = %.3g FLOPs\n",
           nl_fmt_count(o.opt_params, e, sizeof e), nl_fmt_count(o.opt_tokens, f, sizeof f), o.opt_flops);
    printf("extra training compute: %+.0f%%\n", 100 * o.extra_flops_frac);
    if (isfinite(o.breakeven_tokens))
        printf("break-even: after %s served tokens (2N FLOPs each) the smaller model has paid for its extra training\n",
               nl_fmt_count(o.breakeven_tokens, a, sizeof a));
    else
        printf("break-even: never (this model is larger than the compute-optimal one of the same loss)\n");
    return NL_EXIT_OK;
}

static int cmd_fit(int argc, char **argv) {
    static const struct option opts[] = {{"bootstrap", required_argument, 0, 'b'},
                                         {"seed", required_argument, 0, 's'},
                                         {"delta", required_argument, 0, 'd'},
                                         {"json", no_argument, 0, 'j'},
                                         {"n-col", required_argument, 0, 'N'},
                                         {"d-col", required_argument, 0, 'D'},
                                         {"flops-col", required_argument, 0, 'C'},
                                         {"loss-col", required_argument, 0, 'L'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    nl_scaling_cols names = {NULL, NULL, NULL, NULL};
    int64_t boot = 100, seed = 1;
    double delta = 1e-3;
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "b:s:d:jN:D:C:L:h", opts, NULL)) != -1) {
        switch (c) {
        case 'N': names.n = optarg; break;
        case 'D': names.d = optarg; break;
        case 'C': names.flops = optarg; break;
        case 'L': names.loss = optarg; break;
        case 'b':
            if (nl_cli_int("--bootstrap", optarg, 0, 100000, &boot)) return NL_EXIT_USAGE;
            break;
        case 's':
            if (nl_cli_int("--seed", optarg, 0, INT64_MAX, &seed)) return NL_EXIT_USAGE;
            break;
        case 'd':
            if (nl_cli_double("--delta", optarg, &delta)) return NL_EXIT_USAGE;
            break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return NL_EXIT_OK;
        default: return nl_cli_bad_option("scaling fit", argv);
        }
    }
    if (optind != argc - 1) return nl_cli_usage_error("scaling fit: give one CSV file (columns N, D or FLOPs, loss)");
    if (!(delta > 0)) return nl_cli_usage_error("scaling fit: --delta must be > 0");
    nl_scaling_obs *obs;
    size_t n;
    if (nl_scaling_read_csv_cols(argv[optind], &names, &obs, &n)) return nl_cli_fail("scaling fit");
    nl_scaling_fit_opts fo = {delta, (int)boot, (uint64_t)seed};
    nl_scaling_fit_result r;
    nl_status rc = nl_scaling_fit(obs, n, &fo, &r);
    nl_free(obs);
    if (rc) return nl_cli_fail("scaling fit");
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "n_obs", r.n_obs);
        cJSON_AddNumberToObject(j, "E", r.law.E);
        cJSON_AddNumberToObject(j, "A", r.law.A);
        cJSON_AddNumberToObject(j, "B", r.law.B);
        cJSON_AddNumberToObject(j, "alpha", r.law.alpha);
        cJSON_AddNumberToObject(j, "beta", r.law.beta);
        cJSON_AddNumberToObject(j, "se_E", r.se_E);
        cJSON_AddNumberToObject(j, "se_log_A", r.se_log_a);
        cJSON_AddNumberToObject(j, "se_log_B", r.se_log_b);
        cJSON_AddNumberToObject(j, "se_alpha", r.se_alpha);
        cJSON_AddNumberToObject(j, "se_beta", r.se_beta);
        cJSON_AddNumberToObject(j, "objective", r.objective);
        return nl_cli_print_json(j);
    }
    printf("L(N, D) = E + A/N^alpha + B/D^beta fitted to %d rows (Huber delta %g on log loss, L-BFGS from the\n"
           "best %d of 4500 grid starts; standard errors from %lld bootstrap resamples):\n\n",
           r.n_obs, delta, r.n_starts, (long long)boot);
    static const char *hdr[] = {"parameter", "estimate", "std. error"};
    nl_table t;
    nl_table_init(&t, 3, hdr);
    nl_table_rowf(&t, "E|%.4f|%.4f", r.law.E, r.se_E);
    nl_table_rowf(&t, "log A|%.4f|%.4f", r.log_a, r.se_log_a);
    nl_table_rowf(&t, "log B|%.4f|%.4f", r.log_b, r.se_log_b);
    nl_table_rowf(&t, "alpha|%.4f|%.4f", r.law.alpha, r.se_alpha);
    nl_table_rowf(&t, "beta|%.4f|%.4f", r.law.beta, r.se_beta);
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    double a = r.law.beta / (r.law.alpha + r.law.beta);
    printf("\ncompute-optimal N ~ C^%.3f, D ~ C^%.3f\n", a, 1 - a);
    return NL_EXIT_OK;
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
