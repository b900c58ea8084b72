/* nanolm scaling sweep: a mini-Chinchilla IsoFLOP study on NanoLM with approach 2 and 3 fits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_opt.h"
#include "nanolm/emergence_set.h"
#include "nanolm/isoflop.h"
#include "nanolm/mup.h"
#include "nanolm/scaling.h"
#include "nanolm/tokenizer.h"
#include "nanolm/sweep_jobs.h"
#include "report.h"
#include "scaling_lab.h"

static void progress(void *user, const char *run, const char *what, const nl_sweep_row *r) {
    (void)user;
    if (r)
        fprintf(stderr, "  %s %s: val loss %.4f, %.1f s\n", run, what, r->val_loss, r->wall_s);
    else
        fprintf(stderr, "  %s %s\n", run, what);
    fflush(stderr);
}

/* The options of scaling sweep, as given. */
typedef struct sweep_args {
    const char *data, *grid, *dir;
    int fit_only, plan, json;
    int64_t boot, jobs;
} sweep_args;

static const char sweep_summary[] =
    "Trains an IsoFLOP grid of NanoLM models on FILE (byte tokens; last 10% = validation): at each\n"
    "budget C every shape gets D = C / (6 N) tokens, N = its NON-EMBEDDING parameters (embedding\n"
    "and classifier excluded), with a cosine schedule over its own steps. One row per finished run\n"
    "in DIR/sweep.csv (N, D, FLOPs, final val loss, wall time); finished runs are skipped and a\n"
    "killed run resumes from DIR/runs/<run>.safetensors. Then fits approach 2 (parabola in ln N per\n"
    "budget, N_opt ~ C^a, bootstrap 95% interval) and approach 3 (L = E + A/N^alpha + B/D^beta),\n"
    "the optimal tokens per parameter per budget, an extrapolation check (fit the smaller budgets,\n"
    "predict the largest budget's best loss) and DIR/isoflop.svg.\n"
    "--jobs J: J worker processes of one thread each share the runs (largest budget first; a run\n"
    "is locked by the worker training it); on 2 cores --jobs 2 beats one 2-thread process.";

static int sweep_parse(int argc, char **argv, sweep_args *a) {
    *a = (sweep_args){.grid = "default", .dir = "sweep", .boot = 100, .jobs = 1};
    nl_opt opts[] = {
        NL_OPT_STR("data", &a->data, "FILE", "training text (required unless --fit-only or --plan)"),
        NL_OPT_STR("grid", &a->grid, "default|small|tiny", "the IsoFLOP grid (default: default)"),
        NL_OPT_STR("out", &a->dir, "DIR", "where sweep.csv, runs/ and isoflop.svg go (default sweep)"),
        NL_OPT_FLAG("plan", &a->plan, "print the grid and exit"),
        NL_OPT_FLAG("fit-only", &a->fit_only, "fit DIR/sweep.csv without training"),
        NL_OPT_INT("jobs", &a->jobs, 1, 16, "J", "worker processes of one thread each (default 1)"),
        NL_OPT_INT("bootstrap", &a->boot, 0, 100000, "B", "bootstrap resamples of the fits (default 100)"),
        NL_OPT_FLAG("json", &a->json, "print the runs and the fits as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"scaling sweep",
                       "nanolm scaling sweep --data FILE [--grid default|small|tiny] [--out DIR] [options]",
                       sweep_summary,
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (!a->data && !a->fit_only && !a->plan)
        return nl_cli_usage_error("scaling sweep: --data FILE is required (or --fit-only / --plan)");
    return 0;
}

/* --plan: every run of the grid with its shape and token budget. */
static int sweep_plan(const nl_sweep_grid *g, int json) {
    nl_report *r = nl_report_new("scaling sweep --plan");
    nl_report_table(r, "runs", NULL, 8,
                    (const nl_report_col[]){{"run", "run", NULL},
                                            {"budget_flops", "budget C", "%-.3g"},
                                            {"dim", "dim", "%-.0f"},
                                            {"layers", "layers", "%-.0f"},
                                            {"N", "N (non-emb.)", "%-.0f"},
                                            {"D", "D tokens", "%-.0f"},
                                            {"tokens_per_param", "D/N", "%-.1f"},
                                            {"steps", "steps", "%-.0f"}});
    nl_sweep_plan_row runs[NL_SWEEP_MAX_BUDGETS * NL_SWEEP_MAX_SHAPES];
    int n = nl_sweep_plan(g, runs);
    double tok = 0;
    for (int i = 0; i < n; i++) {
        const nl_sweep_plan_row *x = &runs[i];
        tok += x->d;
        nl_report_cell_str(r, x->run);
        nl_report_cell_num(r, x->budget_flops);
        nl_report_cell_int(r, x->dim);
        nl_report_cell_int(r, x->layers);
        nl_report_cell_num(r, x->n);
        nl_report_cell_num(r, x->d);
        nl_report_cell_num(r, x->d / x->n);
        nl_report_cell_num(r, x->steps);
        nl_report_row_end(r);
    }
    nl_report_num(r, "total_tokens", "", tok, NULL, NULL);
    nl_report_note(r, "total %.3g training tokens (batch %lld x seq %lld, lr %g)", tok, (long long)g->batch,
                   (long long)g->seq, g->lr);
    return nl_report_print(r, json);
}

/* A worker's failure (worker -1: a fork that failed). */
static void worker_error(void *user, int w, const char *message) {
    (void)user;
    if (w < 0)
        fprintf(stderr, "nanolm: scaling sweep: %s\n", message);
    else
        fprintf(stderr, "nanolm: scaling sweep (worker %d): %s\n", w, message);
}

/* Trains the grid's unfinished runs: in this process (--jobs 1) or in J forked workers. */
static int sweep_train(const nl_sweep_grid *g, const sweep_args *a) {
    int n_runs = 0;
    for (int b = 0, s0; b < g->n_budgets; b++) n_runs += nl_sweep_budget_shapes(g, b, &s0);
    fprintf(stderr, "scaling sweep: grid %s, %d budgets, %d runs, %lld worker%s -> %s/sweep.csv\n", g->name,
            g->n_budgets, n_runs, (long long)a->jobs, a->jobs > 1 ? "s" : "", a->dir);
    nl_sweep_progress p = {progress, NULL};
    double t0 = nl_time_s();
    if (nl_sweep_run_jobs(g, a->data, a->dir, &p, (int)a->jobs, worker_error, NULL)) {
        if (a->jobs == 1) return nl_cli_fail("scaling sweep");
        fprintf(stderr, "nanolm: scaling sweep: %s\n", nl_last_error());
        return NL_EXIT_FAIL;
    }
    fprintf(stderr, "scaling sweep: training took %.1f s wall\n", nl_time_s() - t0);
    return NL_EXIT_OK;
}

static void report_runs(nl_report *r, const nl_sweep_row *rows, int n) {
    nl_report_table(r, "runs", NULL, 8,
                    (const nl_report_col[]){{"run", "run", NULL},
                                            {"budget_flops", "budget C", "%-.3g"},
                                            {"N", "N (non-emb.)", "%-.0f"},
                                            {"D", "D tokens", "%-.0f"},
                                            {NULL, "D/N", "%-.1f"},
                                            {"flops", "6ND", "%-.3g"},
                                            {"val_loss", "val loss", "%-.4f"},
                                            {"wall_s", "wall s", "%-.1f"}});
    for (int i = 0; i < n; i++) {
        nl_report_cell_str(r, rows[i].run);
        nl_report_cell_num(r, rows[i].budget_flops);
        nl_report_cell_num(r, rows[i].n_params);
        nl_report_cell_num(r, rows[i].n_tokens);
        nl_report_cell_num(r, rows[i].n_tokens / rows[i].n_params);
        nl_report_cell_num(r, rows[i].flops);
        nl_report_cell_num(r, rows[i].val_loss);
        nl_report_cell_num(r, rows[i].wall_s);
        nl_report_row_end(r);
    }
}

static void report_approach2(nl_report *r, const nl_isoflop_fit *f2) {
    nl_report_begin_object(r, "approach2", NULL);
    nl_report_num(r, "a", "", f2->a, NULL, NULL);
    nl_report_num(r, "a_lo", "", f2->a_lo, NULL, NULL);
    nl_report_num(r, "a_hi", "", f2->a_hi, NULL, NULL);
    nl_report_table(r, "budgets", "approach 2 (parabola of loss in ln N per budget):", 9,
                    (const nl_report_col[]){{"flops", "budget C", "%-.3g"},
                                            {NULL, "sizes", "%-.0f"},
                                            {"n_opt", "", NULL},
                                            {NULL, "N_opt", NULL},
                                            {NULL, "D_opt = C/6N", NULL},
                                            {"loss_opt", "", NULL},
                                            {"tokens_per_param", "", NULL},
                                            {NULL, "tokens/param", NULL},
                                            {NULL, "best loss", NULL}});
    for (int k = 0; k < f2->n_budgets; k++) {
        const nl_isoflop_budget *b = &f2->b[k];
        int ok = isfinite(b->loss_opt);
        double tpp = b->flops / (6 * b->n_opt * b->n_opt);
        char nopt[32], dopt[32], tp[32], bl[32];
        snprintf(nopt, sizeof nopt, "%.0f", b->n_opt);
        snprintf(dopt, sizeof dopt, "%.0f", b->flops / (6 * b->n_opt));
        snprintf(tp, sizeof tp, "%.1f", tpp);
        snprintf(bl, sizeof bl, "%.4f", b->loss_opt);
        nl_report_cell_num(r, b->flops);
        nl_report_cell_num(r, b->n_points);
        nl_report_cell_num(r, b->n_opt);
        nl_report_cell_str(r, ok ? nopt : b->outside ? "outside the sizes" : "no minimum");
        nl_report_cell_str(r, ok ? dopt : "-");
        nl_report_cell_num(r, b->loss_opt);
        nl_report_cell_num(r, tpp);
        nl_report_cell_str(r, ok ? tp : "-");
        nl_report_cell_str(r, ok ? bl : "-");
        nl_report_row_end(r);
    }
    nl_report_end_object(r);
    nl_report_note(r, "N_opt ~ C^%.3f (95%% bootstrap interval [%.3f, %.3f], %d resamples), D_opt ~ C^%.3f", f2->a,
                   f2->a_lo, f2->a_hi, f2->boot_used, 1 - f2->a);
}

static void report_approach3(nl_report *r, const nl_isoflop_study *f, int64_t boot) {
    const nl_scaling_fit_result *f3 = &f->f3;
    nl_report_begin_object(r, "approach3", NULL);
    nl_report_num(r, "E", "", f3->law.E, NULL, NULL);
    nl_report_num(r, "alpha", "", f3->law.alpha, NULL, NULL);
    nl_report_num(r, "beta", "", f3->law.beta, NULL, NULL);
    nl_report_num(r, "se_alpha", "", f3->se_alpha, NULL, NULL);
    nl_report_num(r, "se_beta", "", f3->se_beta, NULL, NULL);
    nl_report_num(r, "a", "", f->a3, NULL, NULL);
    nl_report_end_object(r);
    char line[2048];
    int len = snprintf(line, sizeof line, "N_opt ~ C^%.3f, D_opt ~ C^%.3f; optimal tokens/param:", f->a3, 1 - f->a3);
    for (int k = 0; k < f->n_opt3 && len < (int)sizeof line - 96; k++)
        len += snprintf(line + len, sizeof line - (size_t)len, "%s %.1f at %.3g (N_opt %.0f)", k ? "," : "",
                        f->opt3_tokens_per_param[k], f->opt3_flops[k], f->opt3_n[k]);
    nl_report_note(
        r, "\napproach 3 (L = E + A/N^alpha + B/D^beta, Huber fit, %lld bootstrap resamples):", (long long)boot);
    nl_report_note(r, "  E %.4f +- %.4f, alpha %.4f +- %.4f, beta %.4f +- %.4f (+- = 1.96 SE)", f3->law.E,
                   1.96 * f3->se_E, f3->law.alpha, 1.96 * f3->se_alpha, f3->law.beta, 1.96 * f3->se_beta);
    nl_report_note(r, "  %s", line);
}

static void report_extrapolation(nl_report *r, const nl_isoflop_study *f) {
    nl_report_begin_object(r, "extrapolation", NULL);
    nl_report_num(r, "largest_budget", "", f->cmax, NULL, NULL);
    nl_report_num(r, "measured_best_loss", "", f->meas_best, NULL, NULL);
    nl_report_num(r, "predicted_approach3", "", f->pred3, NULL, NULL);
    nl_report_num(r, "predicted_approach2", "", f->pred2, NULL, NULL);
    nl_report_end_object(r);
    nl_report_note(r, "\nextrapolation to the largest budget %.3g (fitted on the smaller budgets only):", f->cmax);
    if (!isfinite(f->pred3) && !isfinite(f->pred2)) {
        nl_report_note(r, "  needs >= 3 budgets (approach 3) or >= 3 budgets with a minimum (approach 2)");
        return;
    }
    char parab[64] = "";
    if (isfinite(f->meas_parab)) snprintf(parab, sizeof parab, ", %.4f (parabola minimum)", f->meas_parab);
    nl_report_note(r, "  measured best loss %.4f (best run)%s", f->meas_best, parab);
    if (isfinite(f->pred3))
        nl_report_note(r, "  approach 3 predicts %.4f: error %+.4f (%+.1f%%)", f->pred3, f->pred3 - f->meas_best,
                       100 * (f->pred3 / f->meas_best - 1));
    if (isfinite(f->pred2))
        nl_report_note(r, "  approach 2 (power law of the minima) predicts %.4f: error %+.4f (%+.1f%%)", f->pred2,
                       f->pred2 - f->meas_best, 100 * (f->pred2 / f->meas_best - 1));
}

int nl_cmd_scaling_sweep(int argc, char **argv) {
    sweep_args a;
    int rc = sweep_parse(argc, argv, &a);
    if (rc) return rc == NL_CLI_HELP ? NL_EXIT_OK : rc;
    nl_sweep_grid g;
    if (nl_sweep_grid_preset(a.grid, &g)) return nl_cli_usage_error("scaling sweep: %s", nl_last_error());
    if (a.plan) return sweep_plan(&g, a.json);
    if (!a.fit_only && (rc = sweep_train(&g, &a))) return rc;
    char csv[1024], svg[1024];
    snprintf(csv, sizeof csv, "%s/sweep.csv", a.dir);
    snprintf(svg, sizeof svg, "%s/isoflop.svg", a.dir);
    nl_sweep_row *rows;
    int n;
    if (nl_sweep_read_csv(csv, &rows, &n)) return nl_cli_fail("scaling sweep");
    if (n == 0) {
        nl_free(rows);
        fprintf(stderr, "nanolm: scaling sweep: %s has no finished runs\n", csv);
        return NL_EXIT_FAIL;
    }
    nl_isoflop_study *f = nl_calloc(1, sizeof *f, "sweep fits");
    double *pts = nl_malloc((size_t)n * 4 * sizeof *pts, "sweep points");
    if (!f || !pts) {
        nl_free(f);
        nl_free(pts);
        nl_free(rows);
        return nl_cli_fail("scaling sweep");
    }
    double *N = pts, *D = pts + n, *C = pts + 2 * n, *L = pts + 3 * n;
    for (int i = 0; i < n; i++)
        N[i] = rows[i].n_params, D[i] = rows[i].n_tokens, C[i] = rows[i].budget_flops, L[i] = rows[i].val_loss;
    nl_isoflop_study_run(N, D, C, L, n, (int)a.boot, 1, f);
    if (!f->have2) fprintf(stderr, "nanolm: scaling sweep: %s\n", f->why2);
    if (!f->have3) fprintf(stderr, "nanolm: scaling sweep: approach 3: %s\n", f->why3);
    if (f->have2 && nl_isoflop_svg(svg, N, C, L, f->n, &f->f2))
        fprintf(stderr, "nanolm: scaling sweep: %s\n", nl_last_error());
    nl_report *r = nl_report_new("scaling sweep");
    report_runs(r, rows, f->n);
    if (f->have2) report_approach2(r, &f->f2);
    if (f->have3) report_approach3(r, f, a.boot);
    report_extrapolation(r, f);
    if (f->have2) nl_report_note(r, "\nwrote %s", svg);
    rc = nl_report_print(r, a.json);
    nl_free(f);
    nl_free(pts);
    nl_free(rows);
    return rc;
}

/* Parses "a,b,c" into at most max doubles. Returns the count, or -1 naming the option. */
static int parse_list(const char *opt, const char *s, double *out, int max) {
    int n = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max) {
            nl_cli_usage_error("%s: at most %d values", opt, max);
            return -1;
        }
        if (nl_cli_double_si(opt, tok, &out[n]) || !(out[n] > 0)) {
            if (out[n] <= 0) nl_cli_usage_error("%s: values must be positive, got '%s'", opt, tok);
            return -1;
        }
        n++;
    }
    if (n == 0) {
        nl_cli_usage_error("%s: empty list", opt);
        return -1;
    }
    return n;
}

/* The options of scaling lr-transfer, as given. */
typedef struct lrt_args {
    const char *data, *svg;
    double wd[8], lrs[16];
    int n_w, n_lr, json;
    int64_t base, steps, layers, widths[8];
} lrt_args;

static int lrt_parse(int argc, char **argv, lrt_args *a) {
    *a = (lrt_args){.wd = {16, 32, 64},
                    .lrs = {1.0 / 1024, 1.0 / 256, 1.0 / 64, 1.0 / 16, 1.0 / 4},
                    .n_w = 3,
                    .n_lr = 5,
                    .base = 16,
                    .steps = 40,
                    .layers = 1};
    const char *widths = NULL, *lrs = NULL;
    nl_opt opts[] = {
        NL_OPT_STR("data", &a->data, "FILE", "training text (required)"),
        NL_OPT_STR("widths", &widths, "16,32,64", "model widths, multiples of 16 (default 16,32,64)"),
        NL_OPT_STR("lrs", &lrs, "LR,...", "peak learning rates (default 1/1024, 1/256, 1/64, 1/16, 1/4)"),
        NL_OPT_INT("base", &a->base, 1, 1 << 16, "W", "muP base width (default 16)"),
        NL_OPT_INT("steps", &a->steps, 1, 1 << 24, "N", "optimizer steps per run (default 40)"),
        NL_OPT_INT("layers", &a->layers, 1, 64, "L", "layers (default 1)"),
        NL_OPT_STR("svg", &a->svg, "PLOT", "write PLOT (standard parametrisation) and mup-PLOT"),
        NL_OPT_FLAG("json", &a->json, "print the losses as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "scaling lr-transfer",
        "nanolm scaling lr-transfer --data FILE [--widths 16,32,64] [options]",
        "Trains a fresh NanoLM (heads of 16, batch 8 x seq 32, cosine, warmup steps/10) for every width\n"
        "and learning rate, once in the standard parametrisation and once with muP (base width --base),\n"
        "and prints the validation loss (first 100 windows of the split) with the best learning rate per\n"
        "width.",
        groups,
        1,
        0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (widths && (a->n_w = parse_list("--widths", widths, a->wd, 8)) < 0) return NL_EXIT_USAGE;
    if (lrs && (a->n_lr = parse_list("--lrs", lrs, a->lrs, 16)) < 0) return NL_EXIT_USAGE;
    if (!a->data) return nl_cli_usage_error("scaling lr-transfer: --data FILE is required");
    for (int i = 0; i < a->n_w; i++) {
        a->widths[i] = (int64_t)a->wd[i];
        if ((double)a->widths[i] != a->wd[i] || a->widths[i] % 16)
            return nl_cli_usage_error("scaling lr-transfer: --widths: %g is not a multiple of 16 (heads of 16)",
                                      a->wd[i]);
    }
    return 0;
}

typedef nl_lr_transfer lrt_result;

/* Text: one row per learning rate, two columns per width. JSON: one row per width. */
static void lrt_report_tables(nl_report *r, const lrt_args *a, const lrt_result *x) {
    nl_report_col cols[17] = {{NULL, "lr", NULL}};
    char names[16][32];
    for (int i = 0; i < a->n_w; i++) {
        snprintf(names[2 * i], 32, "SP w=%lld", (long long)a->widths[i]);
        snprintf(names[2 * i + 1], 32, "muP w=%lld", (long long)a->widths[i]);
        cols[1 + 2 * i] = (nl_report_col){NULL, names[2 * i], NULL};
        cols[2 + 2 * i] = (nl_report_col){NULL, names[2 * i + 1], NULL};
    }
    nl_report_table(r, NULL, NULL, 1 + 2 * a->n_w, cols);
    for (int k = 0; k < a->n_lr; k++) {
        char c[64];
        snprintf(c, sizeof c, "%.5g", a->lrs[k]);
        nl_report_cell_str(r, c);
        for (int i = 0; i < a->n_w; i++)
            for (int m = 0; m < 2; m++) {
                double v = (m ? x->mu : x->sp)[i * a->n_lr + k];
                int best = (m ? x->best_mu : x->best_sp)[i] == k;
                if (isfinite(v))
                    snprintf(c, sizeof c, "%.4f%s", v, best ? " *" : "");
                else
                    snprintf(c, sizeof c, "diverged%s", best ? " *" : "");
                nl_report_cell_str(r, c);
            }
        nl_report_row_end(r);
    }
    nl_report_table(r, "widths", NULL, 5,
                    (const nl_report_col[]){{"width", "", NULL},
                                            {"loss_sp", "", NULL},
                                            {"loss_mup", "", NULL},
                                            {"best_lr_sp", "", NULL},
                                            {"best_lr_mup", "", NULL}});
    for (int i = 0; i < a->n_w; i++) {
        double la[16], lb[16]; /* diverged runs as -1 */
        for (int k = 0; k < a->n_lr; k++) {
            la[k] = isfinite(x->sp[i * a->n_lr + k]) ? x->sp[i * a->n_lr + k] : -1;
            lb[k] = isfinite(x->mu[i * a->n_lr + k]) ? x->mu[i * a->n_lr + k] : -1;
        }
        nl_report_cell_int(r, a->widths[i]);
        nl_report_cell_nums(r, la, a->n_lr);
        nl_report_cell_nums(r, lb, a->n_lr);
        nl_report_cell_num(r, x->best_sp[i] >= 0 ? a->lrs[x->best_sp[i]] : -1);
        nl_report_cell_num(r, x->best_mu[i] >= 0 ? a->lrs[x->best_mu[i]] : -1);
        nl_report_row_end(r);
    }
}

int nl_cmd_scaling_lr_transfer(int argc, char **argv) {
    lrt_args a;
    int rcode = lrt_parse(argc, argv, &a);
    if (rcode) return rcode == NL_CLI_HELP ? NL_EXIT_OK : rcode;
    nl_tokenizer tok;
    nl_data d;
    memset(&d, 0, sizeof d);
    if (nl_tokenizer_init_byte(&tok) || nl_data_open(&d, a.data, &tok)) return nl_cli_fail("scaling lr-transfer");
    lrt_result *x = nl_calloc(1, sizeof *x, "lr-transfer losses");
    if (!x || nl_lr_transfer_run(&d, a.widths, a.n_w, a.lrs, a.n_lr, a.layers, a.steps, a.base, x)) {
        rcode = nl_cli_fail("scaling lr-transfer");
        goto done;
    }
    nl_report *r = nl_report_new("scaling lr-transfer");
    nl_report_int(r, "base_width", "", a.base, NULL);
    nl_report_nums(r, "lrs", "", a.lrs, a.n_lr, NULL, NULL);
    lrt_report_tables(r, &a, x);
    nl_report_num(r, "best_index_range_sp", "", x->hi[0] - x->lo[0], NULL, NULL);
    nl_report_num(r, "best_index_range_mup", "", x->hi[1] - x->lo[1], NULL, NULL);
    nl_report_nums(r, "best_index_sp", "", x->fb[0], a.n_w, NULL, NULL);
    nl_report_nums(r, "best_index_mup", "", x->fb[1], a.n_w, NULL, NULL);
    nl_report_note(r,
                   "(* best learning rate per column; validation loss in nats/token after %lld steps, base width %lld)",
                   (long long)a.steps, (long long)a.base);
    nl_report_note(r, "best lr (grid index refined by a parabola through the best point and its neighbours):");
    for (int i = 0; i < a.n_w; i++)
        nl_report_note(r, "  width %lld: SP %.2f, muP %.2f", (long long)a.widths[i], x->fb[0][i], x->fb[1][i]);
    nl_report_note(r, "spread across widths: %.2f grid steps without muP, %.2f with muP", x->hi[0] - x->lo[0],
                   x->hi[1] - x->lo[1]);
    char mup_svg[1100];
    if (a.svg && nl_lr_transfer_svg(a.svg, x, mup_svg, sizeof mup_svg)) {
        nl_report_free(r);
        rcode = nl_cli_fail("scaling lr-transfer");
        goto done;
    }
    if (a.svg) {
        nl_report_note(r, "wrote %s", a.svg);
        nl_report_note(r, "wrote %s", mup_svg);
    }
    rcode = nl_report_print(r, a.json);
done:
    nl_free(x);
    nl_data_free(&d);
    nl_tokenizer_free(&tok);
    return rcode;
}

/* The options of scaling emergence, as given. */
typedef struct emg_args {
    const char *data, *svg[3], *sweep; /* svg: linear, log, relative */
    nl_opt_list ckpt;
    int split, json;
    int64_t windows;
} emg_args;

static const char emg_summary[] =
    "For each checkpoint (and every run of a sweep): per-token loss and accuracy p (argmax = next\n"
    "token) on the first --windows windows of the validation split, and exact match of the next k\n"
    "tokens (k = 1..32; all k argmax-correct = greedy decoding reproduces them) against p^k.\n"
    "Rows are sorted by p. q = P(right | previous token right): errors come in runs when q > p,\n"
    "and p q^(k-1) (a first-order chain) is printed next to p^k.";

static int emg_parse(int argc, char **argv, emg_args *a) {
    *a = (emg_args){.windows = 100};
    nl_opt opts[] = {
        NL_OPT_STR("data", &a->data, "FILE", "text to score (required)"),
        NL_OPT_LIST("ckpt", &a->ckpt, "F", "a checkpoint (repeat; with --sweep or alone)"),
        NL_OPT_STR("sweep", &a->sweep, "DIR", "every finished run of a scaling sweep's DIR"),
        NL_OPT_INT("windows", &a->windows, 1, 1 << 24, "N", "windows scored (default 100)"),
        NL_OPT_CHOICE("split", &a->split, "val|train", "the validation split or the training text (default val)"),
        NL_OPT_STR("svg", &a->svg[0], "PLOT", "exact match (points) and p^k (lines) against p"),
        NL_OPT_STR("svg-log", &a->svg[1], "PLOT", "the same on a log scale"),
        NL_OPT_STR("svg-rel", &a->svg[2], "PLOT",
                   "k = 1, 2, 4, 8, each relative to its largest value over the checkpoints"),
        NL_OPT_FLAG("json", &a->json, "print the rows as JSON"),
    };
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {"scaling emergence",
                       "nanolm scaling emergence --data FILE [--ckpt F ...] [--sweep DIR] [options]",
                       emg_summary,
                       groups,
                       1,
                       0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (!a->data || (a->ckpt.n == 0 && a->sweep == NULL))
        return nl_cli_usage_error(
            "scaling emergence: --data FILE and --ckpt F (repeatable) and/or --sweep DIR are required");
    return 0;
}

/* The checkpoints to score: --ckpt, then the sweep's runs (at most 64 in all). */
static int emg_paths(const emg_args *a, char (*paths)[1100], int *n_ck) {
    *n_ck = 0;
    for (int i = 0; i < a->ckpt.n; i++) snprintf(paths[(*n_ck)++], 1100, "%s", a->ckpt.v[i]);
    if (!a->sweep) return 0;
    char csv[1024];
    snprintf(csv, sizeof csv, "%s/sweep.csv", a->sweep);
    nl_sweep_row *rows;
    int n;
    if (nl_sweep_read_csv(csv, &rows, &n)) return nl_cli_fail("scaling emergence");
    for (int i = 0; i < n && *n_ck < 64; i++)
        snprintf(paths[(*n_ck)++], 1100, "%s/runs/%s.safetensors", a->sweep, rows[i].run);
    nl_free(rows);
    if (*n_ck == 0) return nl_cli_usage_error("scaling emergence: %s has no finished runs", csv);
    return 0;
}

static void emg_progress(void *user, const nl_emergence_row *row) {
    (void)user;
    fprintf(stderr, "  %s: loss %.4f, accuracy %.4f\n", row->name, row->e.mean_loss, row->e.accuracy);
}

/* Table 1 (and the JSON rows): loss, p, exact match and p^k for k = 1, 2, 4, ... */
static void emg_report_main(nl_report *r, const nl_emergence_row *x, int n, int kmax) {
    const int nks = nl_emergence_nks(kmax);
    nl_report_col cols[6 + 12] = {
        {"checkpoint", "checkpoint", NULL}, {"loss", "loss", "%-.4f"}, {"accuracy", "p", "%-.4f"},
        {"p_after_correct", "", NULL},      {"starts", "", NULL},      {"exact_match", "", NULL}};
    char names[12][24];
    for (int q = 0; q < nks; q++) {
        snprintf(names[2 * q], 24, "EM k=%d", nl_emergence_ks[q]);
        snprintf(names[2 * q + 1], 24, "p^%d", nl_emergence_ks[q]);
        cols[6 + 2 * q] = (nl_report_col){NULL, names[2 * q], "%-.2e"};
        cols[7 + 2 * q] = (nl_report_col){NULL, names[2 * q + 1], "%-.2e"};
    }
    nl_report_table(r, "checkpoints", NULL, 6 + 2 * nks, cols);
    for (int i = 0; i < n; i++) {
        nl_report_cell_str(r, x[i].name);
        nl_report_cell_num(r, x[i].e.mean_loss);
        nl_report_cell_num(r, x[i].e.accuracy);
        nl_report_cell_num(r, x[i].e.p_after_correct);
        nl_report_cell_int(r, (long long)x[i].e.starts);
        nl_report_cell_nums(r, x[i].e.exact + 1, kmax);
        for (int q = 0; q < nks; q++) {
            nl_report_cell_num(r, x[i].e.exact[nl_emergence_ks[q]]);
            nl_report_cell_num(r, pow(x[i].e.accuracy, nl_emergence_ks[q]));
        }
        nl_report_row_end(r);
    }
}

/* Table 2 (text only): runs of errors, a first-order chain with q = P(right | previous right). */
static void emg_report_chain(nl_report *r, const nl_emergence_row *x, int n, int kmax) {
    static const int kr[] = {4, 8, 16, 32};
    int nkr = 0;
    while (nkr < 4 && kr[nkr] <= kmax) nkr++;
    nl_report_col cols[3 + 12] = {{NULL, "checkpoint", NULL}, {NULL, "p", "%-.4f"}, {NULL, "q", "%-.4f"}};
    char names[12][24];
    for (int q = 0; q < nkr; q++) {
        snprintf(names[3 * q], 24, "EM k=%d", kr[q]);
        snprintf(names[3 * q + 1], 24, "p^%d", kr[q]);
        snprintf(names[3 * q + 2], 24, "p q^%d", kr[q] - 1);
        for (int z = 0; z < 3; z++) cols[3 + 3 * q + z] = (nl_report_col){NULL, names[3 * q + z], "%-.2e"};
    }
    nl_report_table(r, NULL, NULL, 3 + 3 * nkr, cols);
    for (int i = 0; i < n; i++) {
        double p = x[i].e.accuracy, qq = x[i].e.p_after_correct;
        nl_report_cell_str(r, x[i].name);
        nl_report_cell_num(r, p);
        nl_report_cell_num(r, qq);
        for (int q = 0; q < nkr; q++) {
            nl_report_cell_num(r, x[i].e.exact[kr[q]]);
            nl_report_cell_num(r, pow(p, kr[q]));
            nl_report_cell_num(r, p * pow(qq, kr[q] - 1));
        }
        nl_report_row_end(r);
    }
}

int nl_cmd_scaling_emergence(int argc, char **argv) {
    emg_args a;
    int rcode = emg_parse(argc, argv, &a);
    if (rcode) return rcode == NL_CLI_HELP ? NL_EXIT_OK : rcode;
    static char paths[64][1100];
    int n_ck = 0;
    if ((rcode = emg_paths(&a, paths, &n_ck))) return rcode;
    nl_emergence_row *x = nl_calloc((size_t)n_ck, sizeof *x, "emergence rows");
    if (!x) return nl_cli_fail("scaling emergence");
    int kmax = NL_EMERGENCE_KMAX;
    const char *path_of[64];
    for (int i = 0; i < n_ck; i++) path_of[i] = paths[i];
    if (nl_emergence_eval_set(path_of, n_ck, a.data, a.split ? NL_DATA_TRAIN : NL_DATA_VAL, a.windows, &kmax, x,
                              emg_progress, NULL)) {
        nl_free(x);
        return nl_cli_fail("scaling emergence");
    }
    nl_report *r = nl_report_new("scaling emergence");
    emg_report_main(r, x, n_ck, kmax);
    nl_report_note(
        r, "(%s split, %lld tokens scored; EM k = all of the next k tokens argmax-correct, %lld start positions)",
        nl_data_split_name(a.split ? NL_DATA_TRAIN : NL_DATA_VAL), (long long)x[0].e.tokens, (long long)x[0].e.starts);
    emg_report_chain(r, x, n_ck, kmax);
    nl_report_note(
        r,
        "(q = P(token right | previous token right); p q^(k-1): exact match if right answers came in runs of a\n"
        " first-order chain; one hit among the start positions is %.1e)",
        1.0 / (double)x[0].e.starts);
    for (int lg = 0; lg < 3; lg++)
        if (a.svg[lg]) {
            if (nl_emergence_svg(a.svg[lg], (nl_emergence_scale)lg, x, n_ck, kmax)) {
                rcode = nl_cli_fail("scaling emergence");
                break;
            }
            nl_report_note(r, "wrote %s", a.svg[lg]);
        }
    if (!rcode)
        rcode = nl_report_print(r, a.json);
    else
        nl_report_free(r);
    nl_free(x);
    return rcode;
}
