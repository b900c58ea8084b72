/*
 * A mini-Chinchilla study on NanoLM: IsoFLOP profiles (Hoffmann et al. 2022, approach 2).
 * For each compute budget C and each model shape, the run gets D = C / (6 N) training tokens
 * where N is the model's real NON-EMBEDDING parameter count (nl_arch_count_params:
 * attention + MLP + norms; the token embedding and classifier are excluded). Runs are
 * resumable: a run listed in the CSV is skipped, a run with a checkpoint resumes from it.
 * The fits of the rows (approach 2 and 3) are pure arithmetic: nanolm/isoflop.h, in plan/.
 */
#ifndef NANOLM_SWEEP_H
#define NANOLM_SWEEP_H

#include <stdint.h>

#include "nanolm/arch.h"
#include "nanolm/base.h"

#define NL_SWEEP_MAX_BUDGETS 8
#define NL_SWEEP_MAX_SHAPES  12

typedef struct nl_sweep_grid {
    char name[32];
    int n_budgets, n_shapes;
    double budgets_flops[NL_SWEEP_MAX_BUDGETS];
    int64_t dims[NL_SWEEP_MAX_SHAPES], layers[NL_SWEEP_MAX_SHAPES];
    /* Budget b trains the shapes first_shape[b] .. first_shape[b] + budget_shapes[b] - 1 of the
     * list (a window that slides with the budget, as Chinchilla's IsoFLOP sizes do);
     * budget_shapes[b] == 0 means every shape. Run names are c<b>_n<shape index in the list>. */
    int first_shape[NL_SWEEP_MAX_BUDGETS], budget_shapes[NL_SWEEP_MAX_BUDGETS];
    int64_t batch, seq;  /* windows per step, tokens per window */
    double lr;           /* peak of the cosine (lr_min = lr / 10), warmup 5% of the steps */
    int64_t val_windows; /* final validation: the first windows of the validation split */
    int64_t checkpoints; /* checkpoints (and quick validations) per run */
} nl_sweep_grid;

/* "default" (the documented grid: 29.6 min on 2 cores with --jobs 2), "small" (a reduced
 * ~4M-token grid) or "tiny" (seconds; tests). NL_ERR_INVALID names an unknown grid. */
nl_status nl_sweep_grid_preset(const char *name, nl_sweep_grid *g);
/* The shapes of budget b: returns how many and sets *first to the index of the first. */
int nl_sweep_budget_shapes(const nl_sweep_grid *g, int b, int *first);
/* The NanoLM shape of width `dim` and `layers` layers: heads of 16, SwiGLU hidden ~8/3 dim
 * (multiple of 16), byte vocabulary, seq_len = seq, untied classifier. */
void nl_sweep_arch(int64_t dim, int64_t layers, int64_t seq, nl_arch *a);

/* One planned run: its shape, N = non-embedding parameters, D = C / (6 N) tokens, optimizer steps. */
typedef struct nl_sweep_plan_row {
    char run[32];
    double budget_flops;
    int64_t dim, layers;
    double n, d, steps;
} nl_sweep_plan_row;

/* Every run of g, in order, into rows (room for NL_SWEEP_MAX_BUDGETS x NL_SWEEP_MAX_SHAPES);
 * returns the count. */
int nl_sweep_plan(const nl_sweep_grid *g, nl_sweep_plan_row *rows);

/* One finished run (a CSV row). */
typedef struct nl_sweep_row {
    char run[32];
    double budget_flops;
    int64_t dim, layers;
    double n_params; /* non-embedding */
    double n_tokens; /* trained tokens = steps * batch * seq */
    int64_t steps;
    double flops;    /* 6 * N * D actually trained */
    double val_loss; /* final, nats/token */
    double wall_s;   /* summed over resumed pieces */
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
/* nl_sweep_run for one of several workers sharing DIR (separate processes): a run is trained by
 * whoever holds its lock (flock on DIR/runs/<run>.lock, released when the worker dies, so a
 * killed run is resumed by the next worker that reaches it); the others skip it. The CSV is
 * re-read and rewritten under DIR/sweep.lock, sorted by budget and N. largest_first: take the
 * largest budget first (and within a budget the smallest model, which trains the most tokens),
 * so that the long runs start early and the workers finish together. */
nl_status nl_sweep_run_worker(const nl_sweep_grid *g, const char *data_path, const char *dir,
                              const nl_sweep_progress *p, int largest_first);

/* Reads DIR's sweep CSV. *rows is malloc'd (nl_free); a missing file gives 0 rows. */
nl_status nl_sweep_read_csv(const char *path, nl_sweep_row **rows, int *n);

#endif
