/* nanolm scaling sweep: a mini-Chinchilla IsoFLOP study on NanoLM with approach 2 and 3 fits. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_model.h"
#include "nanolm/emergence.h"
#include "nanolm/mup.h"
#include "nanolm/scaling.h"
#include "nanolm/tokenizer.h"
#include "nanolm/svg.h"
#include "nanolm/sweep.h"
#include "scaling_lab.h"

static void progress(void *user, const char *run, const char *what, const nl_sweep_row *r) {
    (void)user;
    if (r)
        fprintf(stderr, "  %s %s: val loss %.4f, %.1f s\n", run, what, r->val_loss, r->wall_s);
    else
        fprintf(stderr, "  %s %s\n", run, what);
    fflush(stderr);
}

/* Approach 3 prediction of the best loss at budget C: the law's compute-optimal point. */
static double law_best_loss(const nl_chinchilla *law, double C) {
    double n, d;
    nl_scaling_optimal_law(law, C, &n, &d);
    return nl_scaling_loss(law, n, d);
}

static nl_status isoflop_svg(const char *path, const nl_sweep_row *rows, int n, const nl_isoflop_fit *f2) {
    nl_svg_series s[2 * NL_SWEEP_MAX_BUDGETS + 1];
    double px[NL_SWEEP_MAX_BUDGETS][64], py[NL_SWEEP_MAX_BUDGETS][64], cx[NL_SWEEP_MAX_BUDGETS][64], cy[NL_SWEEP_MAX_BUDGETS][64];
    double fx[NL_SWEEP_MAX_BUDGETS], fy[NL_SWEEP_MAX_BUDGETS];
    char names[NL_SWEEP_MAX_BUDGETS][48];
    size_t ns = 0, nf = 0;
    for (int k = 0; k < f2->n_budgets; k++) {
        const nl_isoflop_budget *b = &f2->b[k];
        size_t m = 0;
        double lo = INFINITY, hi = 0;
        for (int i = 0; i < n && m < 64; i++)
            if (fabs(rows[i].budget_flops / b->flops - 1) < 1e-6) {
                px[k][m] = rows[i].n_params;
                py[k][m] = rows[i].val_loss;
                lo = fmin(lo, px[k][m]);
                hi = fmax(hi, px[k][m]);
                m++;
            }
        snprintf(names[k], sizeof names[k], "C = %.2g FLOPs", b->flops);
        s[ns++] = (nl_svg_series){names[k], px[k], py[k], m, nl_svg_color((size_t)k), 1};
        if (isfinite(b->n_opt)) {
            for (int j = 0; j < 64; j++) {
                double x = log(lo) + (log(hi) - log(lo)) * j / 63.0;
                cx[k][j] = exp(x);
                cy[k][j] = b->c0 + b->c1 * x + b->c2 * x * x;
            }
            s[ns++] = (nl_svg_series){NULL, cx[k], cy[k], 64, nl_svg_color((size_t)k), 0};
            fx[nf] = b->n_opt;
            fy[nf] = b->loss_opt;
            nf++;
        }
    }
    if (nf) s[ns++] = (nl_svg_series){"frontier (parabola minima)", fx, fy, nf, "#000000", 1};
    nl_svg_plot_opts o = {"IsoFLOP profiles of NanoLM (approach 2)", "non-embedding parameters N",
                          "validation loss (nats/token)", 1, 0, 0, 0};
    return nl_svg_plot(path, &o, s, ns);
}

int nl_cmd_scaling_sweep(int argc, char **argv) {
    static const struct option opts[] = {{"data", required_argument, 0, 'd'},   {"grid", required_argument, 0, 'g'},
                                         {"out", required_argument, 0, 'o'},    {"fit-only", no_argument, 0, 'f'},
                                         {"plan", no_argument, 0, 'p'},         {"bootstrap", required_argument, 0, 'b'},
                                         {"json", no_argument, 0, 'j'},         {"help", no_argument, 0, 'h'},
                                         {"jobs", required_argument, 0, 'J'},   {0, 0, 0, 0}};
    const char *data = NULL, *grid = "default", *dir = "sweep";
    int fit_only = 0, plan = 0, json = 0, c;
    int64_t boot = 100, jobs = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'g': grid = optarg; break;
        case 'o': dir = optarg; break;
        case 'f': fit_only = 1; break;
        case 'p': plan = 1; break;
        case 'b': if (nl_cli_int("--bootstrap", optarg, 0, 100000, &boot)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'J': if (nl_cli_int("--jobs", optarg, 1, 16, &jobs)) return NL_EXIT_USAGE; break;
        case 'h':
            printf("usage: nanolm scaling sweep --data FILE [--grid default|small|tiny] [--out DIR] [--plan] [--fit-only]\n"
                   "                            [--jobs 1] [--bootstrap 100] [--json]\n"
                   "  Trains an IsoFLOP grid of NanoLM models on FILE (byte tokens; last 10%% = validation): at each\n"
                   "  budget C every shape gets D = C / (6 N) tokens, N = its NON-EMBEDDING parameters (embedding\n"
                   "  and classifier excluded), with a cosine schedule over its own steps. One row per finished run\n"
                   "  in DIR/sweep.csv (N, D, FLOPs, final val loss, wall time); finished runs are skipped and a\n"
                   "  killed run resumes from DIR/runs/<run>.safetensors. Then fits approach 2 (parabola in ln N per\n"
                   "  budget, N_opt ~ C^a, bootstrap 95%% interval) and approach 3 (L = E + A/N^alpha + B/D^beta),\n"
                   "  the optimal tokens per parameter per budget, an extrapolation check (fit the smaller budgets,\n"
                   "  predict the largest budget's best loss) and DIR/isoflop.svg.\n"
                   "  --plan: print the grid and exit. --fit-only: fit DIR/sweep.csv without training.\n"
                   "  --jobs J: J worker processes of one thread each share the runs (largest budget first; a run\n"
                   "  is locked by the worker training it); on 2 cores --jobs 2 beats one 2-thread process.\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("scaling sweep", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("scaling sweep: unexpected argument '%s'", argv[optind]);
    nl_sweep_grid g;
    if (nl_sweep_grid_preset(grid, &g)) return nl_cli_usage_error("scaling sweep: %s", nl_last_error());
    if (!data && !fit_only && !plan) return nl_cli_usage_error("scaling sweep: --data FILE is required (or --fit-only / --plan)");
    if (plan) {
        const char *hdr[] = {"run", "budget C", "dim", "layers", "N (non-emb.)", "D tokens", "D/N", "steps"};
        nl_table t;
        nl_table_init(&t, 8, hdr);
        double tok = 0;
        for (int b = 0; b < g.n_budgets; b++)
            for (int s0, ns = nl_sweep_budget_shapes(&g, b, &s0), s = s0; s < s0 + ns; s++) {
                nl_arch a;
                nl_sweep_arch(g.dims[s], g.layers[s], g.seq, &a);
                nl_arch_params ap;
                nl_arch_count_params(&a, &ap);
                double N = (double)ap.non_embedding, D = g.budgets_flops[b] / (6 * N);
                tok += D;
                nl_table_rowf(&t, "c%d_n%d|%.3g|%lld|%lld|%.0f|%.0f|%.1f|%.0f", b, s, g.budgets_flops[b], (long long)g.dims[s],
                              (long long)g.layers[s], N, D, D / N, D / (double)(g.batch * g.seq));
            }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
        printf("total %.3g training tokens (batch %lld x seq %lld, lr %g)\n", tok, (long long)g.batch, (long long)g.seq, g.lr);
        return NL_EXIT_OK;
    }
    if (!fit_only) {
        int n_runs = 0;
        for (int b = 0, s0; b < g.n_budgets; b++) n_runs += nl_sweep_budget_shapes(&g, b, &s0);
        fprintf(stderr, "scaling sweep: grid %s, %d budgets, %d runs, %lld worker%s -> %s/sweep.csv\n", g.name, g.n_budgets, n_runs,
                (long long)jobs, jobs > 1 ? "s" : "", dir);
        nl_sweep_progress p = {progress, NULL};
        double t0 = nl_time_s();
        if (jobs == 1) {
            if (nl_sweep_run(&g, data, dir, &p)) return nl_cli_fail("scaling sweep");
        } else {
            /* workers are forked before this process runs any parallel region */
            pid_t pids[16] = {0};
            int failed = 0;
            for (int w = 0; w < jobs; w++) {
                fflush(NULL);
                pids[w] = fork();
                if (pids[w] < 0) {
                    fprintf(stderr, "error: scaling sweep: fork: %s\n", strerror(errno));
                    failed = 1;
                    break;
                }
                if (pids[w] == 0) {
                    nl_set_threads(1);
                    nl_status rc = nl_sweep_run_worker(&g, data, dir, &p, 1);
                    if (rc) fprintf(stderr, "error: scaling sweep (worker %d): %s\n", w, nl_last_error());
                    fflush(NULL);
                    _exit(rc ? NL_EXIT_FAIL : NL_EXIT_OK);
                }
            }
            for (int w = 0; w < jobs; w++) {
                if (pids[w] <= 0) continue;
                int st = 0;
                while (waitpid(pids[w], &st, 0) < 0 && errno == EINTR) {}
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
            }
            if (failed) {
                fprintf(stderr, "error: scaling sweep: a worker failed (finished runs are in %s/sweep.csv; run again to resume)\n", dir);
                return NL_EXIT_FAIL;
            }
        }
        fprintf(stderr, "scaling sweep: training took %.1f s wall\n", nl_time_s() - t0);
    }
    char csv[1024], svg[1024];
    snprintf(csv, sizeof csv, "%s/sweep.csv", dir);
    snprintf(svg, sizeof svg, "%s/isoflop.svg", dir);
    nl_sweep_row *rows;
    int n;
    if (nl_sweep_read_csv(csv, &rows, &n)) return nl_cli_fail("scaling sweep");
    if (n == 0) {
        nl_free(rows);
        fprintf(stderr, "error: scaling sweep: %s has no finished runs\n", csv);
        return NL_EXIT_FAIL;
    }
    int rcode = NL_EXIT_OK;
    double N[256], C[256], L[256], Dt[256];
    nl_scaling_obs obs[256];
    if (n > 256) n = 256;
    for (int i = 0; i < n; i++) {
        N[i] = rows[i].n_params;
        C[i] = rows[i].budget_flops;
        L[i] = rows[i].val_loss;
        Dt[i] = rows[i].n_tokens;
        obs[i] = (nl_scaling_obs){N[i], Dt[i], L[i]};
    }
    nl_isoflop_fit f2;
    int have2 = nl_isoflop_fit_run(N, C, L, n, (int)boot, 1, &f2) == NL_OK;
    if (!have2) fprintf(stderr, "scaling sweep: %s\n", nl_last_error());
    nl_scaling_fit_opts fo = {1e-3, (int)boot, 1};
    nl_scaling_fit_result f3;
    int have3 = n >= 5 && nl_scaling_fit(obs, (size_t)n, &fo, &f3) == NL_OK;
    if (!have3) fprintf(stderr, "scaling sweep: approach 3: %s\n", n >= 5 ? nl_last_error() : "needs >= 5 runs");
    /* extrapolation: fit on all but the largest budget */
    double cmax = 0;
    for (int i = 0; i < n; i++) cmax = fmax(cmax, C[i]);
    double meas_best = INFINITY, pred3 = NAN, pred2 = NAN, meas_parab = NAN;
    int n_small = 0;
    nl_scaling_obs small[256];
    double sN[256], sC[256], sL[256];
    for (int i = 0; i < n; i++) {
        if (fabs(C[i] / cmax - 1) < 1e-6) meas_best = fmin(meas_best, L[i]);
        else { small[n_small] = obs[i]; sN[n_small] = N[i]; sC[n_small] = C[i]; sL[n_small] = L[i]; n_small++; }
    }
    if (have2 && f2.n_budgets >= 3 && isfinite(f2.b[f2.n_budgets - 1].loss_opt)) meas_parab = f2.b[f2.n_budgets - 1].loss_opt;
    nl_scaling_fit_result fs;
    nl_scaling_fit_opts fso = {1e-3, 0, 1};
    int n_budgets = 0;
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int k = 0; k < i; k++) first &= !(fabs(C[k] / C[i] - 1) < 1e-6);
        n_budgets += first;
    }
    if (n_budgets >= 3 && n_small >= 5 && nl_scaling_fit(small, (size_t)n_small, &fso, &fs) == NL_OK)
        pred3 = law_best_loss(&fs.law, cmax);
    nl_isoflop_fit fs2;
    if (have2 && f2.n_budgets >= 3 && nl_isoflop_fit_run(sN, sC, sL, n_small, 0, 1, &fs2) == NL_OK) {
        /* loss of the minima as a power law in C over the smaller budgets */
        double lx[NL_SWEEP_MAX_BUDGETS], ly[NL_SWEEP_MAX_BUDGETS];
        int m = 0;
        for (int k = 0; k < fs2.n_budgets; k++)
            if (isfinite(fs2.b[k].loss_opt)) { lx[m] = log(fs2.b[k].flops); ly[m] = log(fs2.b[k].loss_opt); m++; }
        if (m >= 2) {
            double sl = (ly[m - 1] - ly[0]) / (lx[m - 1] - lx[0]);
            double mx = 0, my = 0, sxx = 0, sxy = 0;
            for (int k = 0; k < m; k++) { mx += lx[k]; my += ly[k]; }
            mx /= m;
            my /= m;
            for (int k = 0; k < m; k++) { sxx += (lx[k] - mx) * (lx[k] - mx); sxy += (lx[k] - mx) * (ly[k] - my); }
            if (sxx > 0) sl = sxy / sxx;
            pred2 = exp(my + sl * (log(cmax) - mx));
        }
    }
    if (have2 && isoflop_svg(svg, rows, n, &f2)) fprintf(stderr, "scaling sweep: %s\n", nl_last_error());
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON *arr = cJSON_AddArrayToObject(j, "runs");
        for (int i = 0; i < n; i++) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "run", rows[i].run);
            cJSON_AddNumberToObject(r, "budget_flops", C[i]);
            cJSON_AddNumberToObject(r, "N", N[i]);
            cJSON_AddNumberToObject(r, "D", Dt[i]);
            cJSON_AddNumberToObject(r, "flops", rows[i].flops);
            cJSON_AddNumberToObject(r, "val_loss", L[i]);
            cJSON_AddNumberToObject(r, "wall_s", rows[i].wall_s);
            cJSON_AddItemToArray(arr, r);
        }
        if (have2) {
            cJSON *a2 = cJSON_AddObjectToObject(j, "approach2");
            cJSON_AddNumberToObject(a2, "a", f2.a);
            cJSON_AddNumberToObject(a2, "a_lo", f2.a_lo);
            cJSON_AddNumberToObject(a2, "a_hi", f2.a_hi);
            cJSON *bs = cJSON_AddArrayToObject(a2, "budgets");
            for (int k = 0; k < f2.n_budgets; k++) {
                cJSON *b = cJSON_CreateObject();
                cJSON_AddNumberToObject(b, "flops", f2.b[k].flops);
                cJSON_AddNumberToObject(b, "n_opt", f2.b[k].n_opt);
                cJSON_AddNumberToObject(b, "loss_opt", f2.b[k].loss_opt);
                cJSON_AddNumberToObject(b, "tokens_per_param", f2.b[k].flops / (6 * f2.b[k].n_opt * f2.b[k].n_opt));
                cJSON_AddItemToArray(bs, b);
            }
        }
        if (have3) {
            cJSON *a3 = cJSON_AddObjectToObject(j, "approach3");
            cJSON_AddNumberToObject(a3, "E", f3.law.E);
            cJSON_AddNumberToObject(a3, "alpha", f3.law.alpha);
            cJSON_AddNumberToObject(a3, "beta", f3.law.beta);
            cJSON_AddNumberToObject(a3, "se_alpha", f3.se_alpha);
            cJSON_AddNumberToObject(a3, "se_beta", f3.se_beta);
            cJSON_AddNumberToObject(a3, "a", f3.law.beta / (f3.law.alpha + f3.law.beta));
        }
        cJSON *ex = cJSON_AddObjectToObject(j, "extrapolation");
        cJSON_AddNumberToObject(ex, "largest_budget", cmax);
        cJSON_AddNumberToObject(ex, "measured_best_loss", meas_best);
        cJSON_AddNumberToObject(ex, "predicted_approach3", pred3);
        cJSON_AddNumberToObject(ex, "predicted_approach2", pred2);
        rcode = nl_cli_print_json(j);
        nl_free(rows);
        return rcode;
    }
    const char *hdr[] = {"run", "budget C", "N (non-emb.)", "D tokens", "D/N", "6ND", "val loss", "wall s"};
    nl_table t;
    nl_table_init(&t, 8, hdr);
    for (int i = 0; i < n; i++)
        nl_table_rowf(&t, "%s|%.3g|%.0f|%.0f|%.1f|%.3g|%.4f|%.1f", rows[i].run, C[i], N[i], Dt[i], Dt[i] / N[i], rows[i].flops,
                      L[i], rows[i].wall_s);
    nl_table_print(&t, stdout);
    nl_table_free(&t);
    if (have2) {
        printf("\napproach 2 (parabola of loss in ln N per budget):\n");
        const char *h2[] = {"budget C", "sizes", "N_opt", "D_opt = C/6N", "tokens/param", "best loss"};
        nl_table_init(&t, 6, h2);
        for (int k = 0; k < f2.n_budgets; k++) {
            const nl_isoflop_budget *b = &f2.b[k];
            if (isfinite(b->loss_opt))
                nl_table_rowf(&t, "%.3g|%d|%.0f|%.0f|%.1f|%.4f", b->flops, b->n_points, b->n_opt, b->flops / (6 * b->n_opt),
                              b->flops / (6 * b->n_opt * b->n_opt), b->loss_opt);
            else
                nl_table_rowf(&t, "%.3g|%d|%s|-|-|-", b->flops, b->n_points, b->outside ? "outside the sizes" : "no minimum");
        }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
        printf("N_opt ~ C^%.3f (95%% bootstrap interval [%.3f, %.3f], %d resamples), D_opt ~ C^%.3f\n", f2.a, f2.a_lo, f2.a_hi,
               f2.boot_used, 1 - f2.a);
    }
    if (have3) {
        double a3 = f3.law.beta / (f3.law.alpha + f3.law.beta);
        printf("\napproach 3 (L = E + A/N^alpha + B/D^beta, Huber fit, %lld bootstrap resamples):\n", (long long)boot);
        printf("  E %.4f +- %.4f, alpha %.4f +- %.4f, beta %.4f +- %.4f (+- = 1.96 SE)\n", f3.law.E, 1.96 * f3.se_E,
               f3.law.alpha, 1.96 * f3.se_alpha, f3.law.beta, 1.96 * f3.se_beta);
        printf("  N_opt ~ C^%.3f, D_opt ~ C^%.3f; optimal tokens/param:", a3, 1 - a3);
        double seen[256];
        int ns = 0;
        for (int i = 0; i < n; i++) {
            int dup = 0;
            for (int k = 0; k < ns; k++) dup |= fabs(C[i] / seen[k] - 1) < 1e-6;
            if (dup) continue;
            seen[ns++] = C[i];
            double nn, dd;
            nl_scaling_optimal_law(&f3.law, C[i], &nn, &dd);
            printf("%s %.1f at %.3g (N_opt %.0f)", ns > 1 ? "," : "", dd / nn, C[i], nn);
        }
        printf("\n");
    }
    printf("\nextrapolation to the largest budget %.3g (fitted on the smaller budgets only):\n", cmax);
    if (isfinite(pred3) || isfinite(pred2)) {
        printf("  measured best loss %.4f (best run)%s", meas_best, isfinite(meas_parab) ? "" : "\n");
        if (isfinite(meas_parab)) printf(", %.4f (parabola minimum)\n", meas_parab);
        if (isfinite(pred3)) printf("  approach 3 predicts %.4f: error %+.4f (%+.1f%%)\n", pred3, pred3 - meas_best, 100 * (pred3 / meas_best - 1));
        if (isfinite(pred2)) printf("  approach 2 (power law of the minima) predicts %.4f: error %+.4f (%+.1f%%)\n", pred2, pred2 - meas_best,
                                    100 * (pred2 / meas_best - 1));
    } else {
        printf("  needs >= 3 budgets (approach 3) or >= 3 budgets with a minimum (approach 2)\n");
    }
    if (have2) printf("\nwrote %s\n", svg);
    nl_free(rows);
    return rcode;
}

/* Parses "a,b,c" into at most max doubles. Returns the count, or -1 naming the option. */
static int parse_list(const char *opt, const char *s, double *out, int max) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max) { nl_cli_usage_error("%s: at most %d values", opt, max); return -1; }
        if (nl_cli_double_si(opt, tok, &out[n]) || !(out[n] > 0)) {
            if (out[n] <= 0) nl_cli_usage_error("%s: values must be positive, got '%s'", opt, tok);
            return -1;
        }
        n++;
    }
    if (n == 0) { nl_cli_usage_error("%s: empty list", opt); return -1; }
    return n;
}

int nl_cmd_scaling_lr_transfer(int argc, char **argv) {
    static const struct option opts[] = {{"data", required_argument, 0, 'd'},  {"widths", required_argument, 0, 'w'},
                                         {"lrs", required_argument, 0, 'l'},   {"base", required_argument, 0, 'B'},
                                         {"steps", required_argument, 0, 's'}, {"layers", required_argument, 0, 'L'},
                                         {"svg", required_argument, 0, 'o'},   {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    const char *data = NULL, *svg = NULL;
    double wd[8] = {16, 32, 64}, lrs[16] = {1.0 / 1024, 1.0 / 256, 1.0 / 64, 1.0 / 16, 1.0 / 4};
    int n_w = 3, n_lr = 5, json = 0, c;
    int64_t base = 16, steps = 40, layers = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'w': if ((n_w = parse_list("--widths", optarg, wd, 8)) < 0) return NL_EXIT_USAGE; break;
        case 'l': if ((n_lr = parse_list("--lrs", optarg, lrs, 16)) < 0) return NL_EXIT_USAGE; break;
        case 'B': if (nl_cli_int("--base", optarg, 1, 1 << 16, &base)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--steps", optarg, 1, 1 << 24, &steps)) return NL_EXIT_USAGE; break;
        case 'L': if (nl_cli_int("--layers", optarg, 1, 64, &layers)) return NL_EXIT_USAGE; break;
        case 'o': svg = optarg; break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: nanolm scaling lr-transfer --data FILE [--widths 16,32,64] [--lrs 0.001,...] [--base 16]\n"
                   "                                  [--steps 40] [--layers 1] [--svg PLOT] [--json]\n"
                   "  Trains a fresh NanoLM (heads of 16, batch 8 x seq 32, cosine, warmup steps/10) for every width\n"
                   "  and learning rate, once in the standard parametrisation and once with muP (base width --base),\n"
                   "  and prints the validation loss (first 100 windows of the split) with the best learning rate per\n"
                   "  width. Default lrs: 1/1024, 1/256, 1/64, 1/16, 1/4. --svg PLOT writes PLOT (SP) and mup-PLOT.\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("scaling lr-transfer", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("scaling lr-transfer: unexpected argument '%s'", argv[optind]);
    if (!data) return nl_cli_usage_error("scaling lr-transfer: --data FILE is required");
    int64_t widths[8];
    for (int i = 0; i < n_w; i++) {
        widths[i] = (int64_t)wd[i];
        if ((double)widths[i] != wd[i] || widths[i] % 16)
            return nl_cli_usage_error("scaling lr-transfer: --widths: %g is not a multiple of 16 (heads of 16)", wd[i]);
    }
    nl_tokenizer tok;
    nl_data d;
    memset(&d, 0, sizeof d);
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, data, &tok)) return nl_cli_fail("scaling lr-transfer");
    double sp[8 * 16], mu[8 * 16];
    int rcode = NL_EXIT_OK;
    if (nl_lr_sweep(&d, widths, n_w, lrs, n_lr, layers, steps, 8, 32, 100, 0, 11, sp) ||
        nl_lr_sweep(&d, widths, n_w, lrs, n_lr, layers, steps, 8, 32, 100, base, 11, mu)) {
        rcode = nl_cli_fail("scaling lr-transfer");
        goto done;
    }
    int best_sp[8], best_mu[8];
    double fb[2][8], lo[2] = {99, 99}, hi[2] = {-1, -1};
    for (int i = 0; i < n_w; i++) {
        best_sp[i] = nl_argmin(sp + i * n_lr, n_lr);
        best_mu[i] = nl_argmin(mu + i * n_lr, n_lr);
        fb[0][i] = nl_argmin_interp(sp + i * n_lr, n_lr);
        fb[1][i] = nl_argmin_interp(mu + i * n_lr, n_lr);
        for (int k = 0; k < 2; k++) { lo[k] = fmin(lo[k], fb[k][i]); hi[k] = fmax(hi[k], fb[k][i]); }
    }
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "base_width", (double)base);
        cJSON_AddItemToObject(j, "lrs", cJSON_CreateDoubleArray(lrs, n_lr));
        cJSON *arr = cJSON_AddArrayToObject(j, "widths");
        for (int i = 0; i < n_w; i++) {
            cJSON *w = cJSON_CreateObject();
            cJSON_AddNumberToObject(w, "width", (double)widths[i]);
            double a[16], b[16];
            for (int k = 0; k < n_lr; k++) { a[k] = isfinite(sp[i * n_lr + k]) ? sp[i * n_lr + k] : -1; b[k] = isfinite(mu[i * n_lr + k]) ? mu[i * n_lr + k] : -1; }
            cJSON_AddItemToObject(w, "loss_sp", cJSON_CreateDoubleArray(a, n_lr));
            cJSON_AddItemToObject(w, "loss_mup", cJSON_CreateDoubleArray(b, n_lr));
            cJSON_AddNumberToObject(w, "best_lr_sp", best_sp[i] >= 0 ? lrs[best_sp[i]] : -1);
            cJSON_AddNumberToObject(w, "best_lr_mup", best_mu[i] >= 0 ? lrs[best_mu[i]] : -1);
            cJSON_AddItemToArray(arr, w);
        }
        cJSON_AddNumberToObject(j, "best_index_range_sp", hi[0] - lo[0]);
        cJSON_AddNumberToObject(j, "best_index_range_mup", hi[1] - lo[1]);
        cJSON_AddItemToObject(j, "best_index_sp", cJSON_CreateDoubleArray(fb[0], n_w));
        cJSON_AddItemToObject(j, "best_index_mup", cJSON_CreateDoubleArray(fb[1], n_w));
        rcode = nl_cli_print_json(j);
    } else {
        const char *hdr[17] = {"lr"};
        char names[16][32];
        for (int i = 0; i < n_w && 1 + 2 * i + 1 < 17; i++) {
            snprintf(names[2 * i], 32, "SP w=%lld", (long long)widths[i]);
            snprintf(names[2 * i + 1], 32, "muP w=%lld", (long long)widths[i]);
            hdr[1 + 2 * i] = names[2 * i];
            hdr[2 + 2 * i] = names[2 * i + 1];
        }
        nl_table t;
        nl_table_init(&t, 1 + 2 * n_w, hdr);
        for (int k = 0; k < n_lr; k++) {
            char line[1024];
            int len = snprintf(line, sizeof line, "%.5g", lrs[k]);
            for (int i = 0; i < n_w; i++) {
                double a = sp[i * n_lr + k], b = mu[i * n_lr + k];
                char ca[32], cb[32];
                if (isfinite(a)) snprintf(ca, sizeof ca, "%.4f", a); else snprintf(ca, sizeof ca, "diverged");
                if (isfinite(b)) snprintf(cb, sizeof cb, "%.4f", b); else snprintf(cb, sizeof cb, "diverged");
                len += snprintf(line + len, sizeof line - (size_t)len, "|%s%s|%s%s", ca, best_sp[i] == k ? " *" : "", cb,
                                best_mu[i] == k ? " *" : "");
            }
            nl_table_rowf(&t, "%s", line);
        }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
        printf("(* best learning rate per column; validation loss in nats/token after %lld steps, base width %lld)\n",
               (long long)steps, (long long)base);
        printf("best lr (grid index refined by a parabola through the best point and its neighbours):\n");
        for (int i = 0; i < n_w; i++)
            printf("  width %lld: SP %.2f, muP %.2f\n", (long long)widths[i], fb[0][i], fb[1][i]);
        printf("spread across widths: %.2f grid steps without muP, %.2f with muP\n", hi[0] - lo[0], hi[1] - lo[1]);
    }
    if (svg) {
        for (int k = 0; k < 2; k++) {
            nl_svg_series s[8];
            double ys[8][16];
            char nm[8][32];
            for (int i = 0; i < n_w; i++) {
                for (int q = 0; q < n_lr; q++) {
                    double v = (k ? mu : sp)[i * n_lr + q];
                    ys[i][q] = isfinite(v) ? fmin(v, 6.0) : 6.0; /* diverged runs drawn at the top */
                }
                snprintf(nm[i], 32, "width %lld", (long long)widths[i]);
                s[i] = (nl_svg_series){nm[i], lrs, ys[i], (size_t)n_lr, NULL, 1};
            }
            char path[1024];
            const char *slash = strrchr(svg, '/');
            if (k == 0) snprintf(path, sizeof path, "%s", svg);
            else if (slash) snprintf(path, sizeof path, "%.*s/mup-%s", (int)(slash - svg), svg, slash + 1);
            else snprintf(path, sizeof path, "mup-%s", svg);
            nl_svg_plot_opts o = {k ? "muP: validation loss vs learning rate" : "standard parametrisation: validation loss vs learning rate",
                                  "peak learning rate", "validation loss (nats/token; diverged = 6)", 1, 0, 0, 0};
            if (nl_svg_plot(path, &o, s, (size_t)n_w)) { rcode = nl_cli_fail("scaling lr-transfer"); break; }
            if (!json) printf("wrote %s\n", path);
        }
    }
done:
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    return rcode;
}

typedef struct emg_row { char name[256]; nl_emergence e; } emg_row;

static int cmp_emg(const void *a, const void *b) {
    double x = ((const emg_row *)a)->e.accuracy, y = ((const emg_row *)b)->e.accuracy;
    return (x > y) - (x < y);
}

int nl_cmd_scaling_emergence(int argc, char **argv) {
    static const struct option opts[] = {{"data", required_argument, 0, 'd'}, {"ckpt", required_argument, 0, 'c'},
                                         {"sweep", required_argument, 0, 'S'}, {"windows", required_argument, 0, 'w'},
                                         {"svg", required_argument, 0, 'o'},   {"json", no_argument, 0, 'j'},
                                         {"help", no_argument, 0, 'h'},        {"svg-log", required_argument, 0, 'L'},
                                         {"split", required_argument, 0, 's'},
                                         {"svg-rel", required_argument, 0, 'R'}, {0, 0, 0, 0}};
    const char *data = NULL, *svg = NULL, *svg_log = NULL, *svg_rel = NULL, *sweep = NULL, *ckpts[64];
    int n_ck = 0, json = 0, c;
    nl_data_split split = NL_DATA_VAL;
    int64_t windows = 100;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': data = optarg; break;
        case 'c':
            if (n_ck == 64) return nl_cli_usage_error("scaling emergence: at most 64 --ckpt");
            ckpts[n_ck++] = optarg;
            break;
        case 'S': sweep = optarg; break;
        case 'w': if (nl_cli_int("--windows", optarg, 1, 1 << 24, &windows)) return NL_EXIT_USAGE; break;
        case 'o': svg = optarg; break;
        case 'L': svg_log = optarg; break;
        case 'R': svg_rel = optarg; break;
        case 's':
            if (!strcmp(optarg, "val")) split = NL_DATA_VAL;
            else if (!strcmp(optarg, "train")) split = NL_DATA_TRAIN;
            else return nl_cli_usage_error("scaling emergence: --split must be val or train, got '%s'", optarg);
            break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: nanolm scaling emergence --data FILE [--ckpt F ...] [--sweep DIR] [--windows 100] [--svg PLOT]\n"
                   "                                [--svg-log PLOT] [--svg-rel PLOT] [--split val|train] [--json]\n"
                   "  For each checkpoint (and every run of a sweep): per-token loss and accuracy p (argmax = next\n"
                   "  token) on the first --windows windows of the validation split, and exact match of the next k\n"
                   "  tokens (k = 1..32; all k argmax-correct = greedy decoding reproduces them) against p^k.\n"
                   "  Rows are sorted by p. --svg: exact match (points) and p^k (lines) against p; --svg-log: the\n"
                   "  same on a log scale; --svg-rel: k = 1, 2, 4, 8, each relative to its largest value over the\n"
                   "  checkpoints (the shape of each curve on one linear scale). q = P(right | previous token right): errors come in runs when q > p,\n"
                   "  and p q^(k-1) (a first-order chain) is printed next to p^k. --split train: the training text.\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("scaling emergence", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("scaling emergence: unexpected argument '%s'", argv[optind]);
    if (!data || (n_ck == 0 && sweep == NULL))
        return nl_cli_usage_error("scaling emergence: --data FILE and --ckpt F (repeatable) and/or --sweep DIR are required");
    static char sweep_paths[64][1100];
    if (sweep) {
        char csv[1024];
        snprintf(csv, sizeof csv, "%s/sweep.csv", sweep);
        nl_sweep_row *rows;
        int n;
        if (nl_sweep_read_csv(csv, &rows, &n)) return nl_cli_fail("scaling emergence");
        for (int i = 0; i < n && n_ck < 64; i++) {
            snprintf(sweep_paths[n_ck], sizeof sweep_paths[n_ck], "%s/runs/%s.safetensors", sweep, rows[i].run);
            ckpts[n_ck] = sweep_paths[n_ck];
            n_ck++;
        }
        nl_free(rows);
        if (n_ck == 0) return nl_cli_usage_error("scaling emergence: %s has no finished runs", csv);
    }
    emg_row *r = nl_calloc((size_t)n_ck, sizeof *r, "emergence rows");
    if (!r) return nl_cli_fail("scaling emergence");
    int rcode = NL_EXIT_OK, kmax = NL_EMERGENCE_KMAX;
    for (int i = 0; i < n_ck; i++) {
        nl_model m;
        nl_tokenizer tok;
        nl_data d;
        memset(&d, 0, sizeof d);
        if (nl_cli_load_model(ckpts[i], NULL, &m, &tok)) { rcode = nl_cli_fail("scaling emergence"); break; }
        int64_t T = m.arch.seq_len;
        int k = (int)(T - 1 < NL_EMERGENCE_KMAX ? T - 1 : NL_EMERGENCE_KMAX);
        kmax = k < kmax ? k : kmax;
        nl_status st = nl_data_open(&d, data, &tok);
        if (!st) st = nl_model_alloc_acts(&m, 8, T);
        if (!st) st = nl_emergence_eval(&m, &d, split, 8, T, windows, k, &r[i].e);
        nl_data_free(&d);
        nl_tokenizer_free(&tok);
        nl_model_free(&m);
        if (st) { rcode = nl_cli_fail("scaling emergence"); break; }
        const char *base = strrchr(ckpts[i], '/');
        snprintf(r[i].name, sizeof r[i].name, "%s", base ? base + 1 : ckpts[i]);
        fprintf(stderr, "  %s: loss %.4f, accuracy %.4f\n", r[i].name, r[i].e.mean_loss, r[i].e.accuracy);
    }
    if (rcode) { nl_free(r); return rcode; }
    qsort(r, (size_t)n_ck, sizeof *r, cmp_emg);
    static const int ks[] = {1, 2, 4, 8, 16, 32};
    int nks = 0;
    while (nks < 6 && ks[nks] <= kmax) nks++;
    if (json) {
        cJSON *j = cJSON_CreateArray();
        for (int i = 0; i < n_ck; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "checkpoint", r[i].name);
            cJSON_AddNumberToObject(o, "loss", r[i].e.mean_loss);
            cJSON_AddNumberToObject(o, "accuracy", r[i].e.accuracy);
            cJSON_AddNumberToObject(o, "p_after_correct", r[i].e.p_after_correct);
            cJSON_AddNumberToObject(o, "starts", (double)r[i].e.starts);
            cJSON_AddItemToObject(o, "exact_match", cJSON_CreateDoubleArray(r[i].e.exact + 1, kmax));
            cJSON_AddItemToArray(j, o);
        }
        rcode = nl_cli_print_json(j);
    } else {
        const char *hdr[3 + 12] = {"checkpoint", "loss", "p"};
        char names[12][24];
        for (int q = 0; q < nks; q++) {
            snprintf(names[2 * q], 24, "EM k=%d", ks[q]);
            snprintf(names[2 * q + 1], 24, "p^%d", ks[q]);
            hdr[3 + 2 * q] = names[2 * q];
            hdr[4 + 2 * q] = names[2 * q + 1];
        }
        nl_table t;
        nl_table_init(&t, 3 + 2 * nks, hdr);
        for (int i = 0; i < n_ck; i++) {
            char line[1024];
            int len = snprintf(line, sizeof line, "%s|%.4f|%.4f", r[i].name, r[i].e.mean_loss, r[i].e.accuracy);
            for (int q = 0; q < nks; q++)
                len += snprintf(line + len, sizeof line - (size_t)len, "|%.2e|%.2e", r[i].e.exact[ks[q]], pow(r[i].e.accuracy, ks[q]));
            nl_table_rowf(&t, "%s", line);
        }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
        printf("(%s split, %lld tokens scored; EM k = all of the next k tokens argmax-correct, %lld start positions)\n",
               nl_data_split_name(split), (long long)r[0].e.tokens, (long long)r[0].e.starts);
        /* runs of errors: a first-order chain with q = P(right | previous right) */
        static const int kr[] = {4, 8, 16, 32};
        int nkr = 0;
        while (nkr < 4 && kr[nkr] <= kmax) nkr++;
        const char *h2[2 + 3 + 12] = {"checkpoint", "p", "q"};
        char n2[12][24];
        for (int q = 0; q < nkr; q++) {
            snprintf(n2[3 * q], 24, "EM k=%d", kr[q]);
            snprintf(n2[3 * q + 1], 24, "p^%d", kr[q]);
            snprintf(n2[3 * q + 2], 24, "p q^%d", kr[q] - 1);
            for (int z = 0; z < 3; z++) h2[3 + 3 * q + z] = n2[3 * q + z];
        }
        printf("\n");
        nl_table_init(&t, 3 + 3 * nkr, h2);
        for (int i = 0; i < n_ck; i++) {
            char line[1024];
            double p = r[i].e.accuracy, qq = r[i].e.p_after_correct;
            int len = snprintf(line, sizeof line, "%s|%.4f|%.4f", r[i].name, p, qq);
            for (int q = 0; q < nkr; q++)
                len += snprintf(line + len, sizeof line - (size_t)len, "|%.2e|%.2e|%.2e", r[i].e.exact[kr[q]], pow(p, kr[q]),
                                p * pow(qq, kr[q] - 1));
            nl_table_rowf(&t, "%s", line);
        }
        nl_table_print(&t, stdout);
        nl_table_free(&t);
        printf("(q = P(token right | previous token right); p q^(k-1): exact match if right answers came in runs of a\n"
               " first-order chain; one hit among the start positions is %.1e)\n", 1.0 / (double)r[0].e.starts);
    }
    for (int lg = 0; lg < 3; lg++) { /* 0 linear, 1 log, 2 relative to the largest value */
        const char *path = lg == 0 ? svg : lg == 1 ? svg_log : svg_rel;
        if (!path) continue;
        nl_svg_series s[12];
        double px[64], ey[6][64], py[6][64];
        char nm[12][32];
        for (int i = 0; i < n_ck; i++) px[i] = r[i].e.accuracy;
        int ns = 0;
        for (int q = 0; q < nks; q++) {
            for (int i = 0; i < n_ck; i++) {
                ey[q][i] = r[i].e.exact[ks[q]];
                py[q][i] = pow(r[i].e.accuracy, ks[q]);
                /* log scale: p^k far below one hit among the start positions would only stretch the axis */
                if (lg == 1 && py[q][i] < 0.1 / (double)r[i].e.starts) py[q][i] = NAN;
            }
            if (lg == 2) {
                if (ks[q] > 8) break; /* longer answers have a handful of hits at most here: noise */
                double me = 0, mp = 0;
                for (int i = 0; i < n_ck; i++) { me = fmax(me, ey[q][i]); mp = fmax(mp, py[q][i]); }
                for (int i = 0; i < n_ck; i++) {
                    ey[q][i] = me > 0 ? ey[q][i] / me : NAN;
                    py[q][i] = mp > 0 ? py[q][i] / mp : NAN;
                }
            }
            snprintf(nm[2 * q], 32, "exact match k=%d", ks[q]);
            snprintf(nm[2 * q + 1], 32, "p^%d", ks[q]);
            s[ns++] = (nl_svg_series){nm[2 * q], px, ey[q], (size_t)n_ck, nl_svg_color((size_t)q), 1};
            s[ns++] = (nl_svg_series){nm[2 * q + 1], px, py[q], (size_t)n_ck, nl_svg_color((size_t)q), 0};
        }
        nl_svg_plot_opts o = {"Per-token accuracy is smooth; exact match of k tokens jumps", "per-token accuracy p",
                              lg == 2 ? "exact match (points) and p^k (lines) / their largest value" : "exact match of the next k tokens",
                              0, lg == 1, 0, 0};
        if (nl_svg_plot(path, &o, s, (size_t)ns)) rcode = nl_cli_fail("scaling emergence");
        else if (!json) printf("wrote %s\n", path);
    }
    nl_free(r);
    return rcode;
}
