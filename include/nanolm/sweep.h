/*
 * A mini-Chinchilla study on NanoLM: IsoFLOP profiles (Hoffmann et al. 2022, approach 2).
 * For each compute budget C and each model shape, the run gets D = C / (6 N) training tokens
 * where N is the model's real NON-EMBEDDING parameter count (nl_arch_count_params:
 * attention + MLP + norms; the token embedding and classifier are excluded). Runs are
 * resumable: a run listed in the CSV is skipped, a run with a checkpoint resumes from it.
 * Then approach 2 (a parabola of loss in log N per budget, N_opt = k C^a over the minima) and
 * approach 3 (nl_scaling_fit) are fitted to the rows.
 */
#ifndef NANOLM_SWEEP_H
#define NANOLM_SWEEP_H

#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"
#include "nanolm/scaling.h"

#define NL_SWEEP_MAX_BUDGETS 8
#define NL_SWEEP_MAX_SHAPES 8

typedef struct nl_sweep_grid {
    char name[32];
    int n_budgets, n_shapes;
    double budgets_flops[NL_SWEEP_MAX_BUDGETS];
    int64_t dims[NL_SWEEP_MAX_SHAPES], layers[NL_SWEEP_MAX_SHAPES];
    int64_t batch, seq;     /* windows per step, tokens per window */
    double lr;              /* peak of the cosine (lr_min = lr / 10), warmup 5% of the steps */
    int64_t val_windows;    /* final validation: the first windows of the validation split */
    int64_t checkpoints;    /* checkpoints (and quick validations) per run */
} nl_sweep_grid;

/* "default" (the documented ~1 h CPU grid), "small" (a reduced ~4M-token grid) or "tiny"
 * (seconds; tests). NL_ERR_INVALID names
 * an unknown grid. */
nl_status nl_sweep_grid_preset(const char *name, nl_sweep_grid *g);
/* The NanoLM shape of width `dim` and `layers` layers: heads of 16, SwiGLU hidden ~8/3 dim
 * (multiple of 16), byte vocabulary, seq_len = seq, untied classifier. */
void nl_sweep_arch(int64_t dim, int64_t layers, int64_t seq, nl_arch *a);

/* One finished run (a CSV row). */
typedef struct nl_sweep_row {
    char run[32];
    double budget_flops;
    int64_t dim, layers;
    double n_params;        /* non-embedding */
    double n_tokens;        /* trained tokens = steps * batch * seq */
    int64_t steps;
    double flops;           /* 6 * N * D actually trained */
    double val_loss;        /* final, nats/token */
    double wall_s;          /* summed over resumed pieces */
} nl_sweep_row;

typedef struct nl_sweep_progress {
    void (*on_run)(void *user, const char *run, const char *what, const nl_sweep_row *row);
    void *user;
} nl_sweep_progress;

/* Trains every (budget, shape) run of g on the text file `data_path` (byte tokens) that is
 * not yet a row of DIR/sweep.csv, appending a row per finished run (the CSV is rewritten
 * atomically). Checkpoints live in DIR/runs/<run>.safetensors; a killed run resumes from
 * its last one. Errors name the run, file or option. */
nl_status nl_sweep_run(const nl_sweep_grid *g, const char *data_path, const char *dir, const nl_sweep_progress *p);

/* Reads DIR's sweep CSV. *rows is malloc'd (nl_free); a missing file gives 0 rows. */
nl_status nl_sweep_read_csv(const char *path, nl_sweep_row **rows, int *n);

/* ---- approach 2 ---------------------------------------------------------------------------- */
typedef struct nl_isoflop_budget {
    double flops;
    int n_points;
    double c0, c1, c2;      /* loss = c0 + c1 x + c2 x^2, x = ln N */
    double n_opt, loss_opt; /* parabola minimum (NaN when c2 <= 0 or outside the sizes) */
    int outside;            /* the parabola's minimum (n_opt) lies outside the sampled sizes */
} nl_isoflop_budget;

typedef struct nl_isoflop_fit {
    int n_budgets;
    nl_isoflop_budget b[NL_SWEEP_MAX_BUDGETS];
    double a, log_k;        /* N_opt = exp(log_k) * C^a (least squares in log-log) */
    double a_lo, a_hi;      /* 95% bootstrap percentile interval */
    double se_a;            /* bootstrap standard deviation of a */
    int boot_used;          /* resamples that gave a valid fit */
} nl_isoflop_fit;

/* Approach 2 on points (N, C, loss): budgets are the distinct C values (relative tolerance
 * 1e-6); each needs >= 3 points and a minimum
 * inside its range of N (else it is left out of the power law). Bootstrap: resample the points of every budget with
 * replacement (`bootstrap` times, seeded), refit; a resample with fewer than 3 distinct N or
 * no minimum is redrawn. Errors: NL_ERR_INVALID when fewer than 2 budgets have a minimum
 * (message names the budget). */
nl_status nl_isoflop_fit_run(const double *n_params, const double *flops, const double *loss, int n, int bootstrap,
                             uint64_t seed, nl_isoflop_fit *out);

#endif
