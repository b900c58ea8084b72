/*
 * Fits of an IsoFLOP study (Hoffmann et al. 2022): approach 2 (a parabola of loss in ln N per
 * compute budget, N_opt = k C^a over the minima, bootstrap interval) and the whole study of a
 * sweep's runs -- approach 2, approach 3 (nl_scaling_fit), the optimal tokens per parameter, and
 * an extrapolation check (fit the smaller budgets, predict the largest one's best loss). Pure
 * arithmetic on (N, D, C, loss) points: train/sweep.c makes the points, the CLI prints the fits.
 */
#ifndef NANOLM_ISOFLOP_H
#define NANOLM_ISOFLOP_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/scaling.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NL_ISOFLOP_MAX_BUDGETS 8

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
    nl_isoflop_budget b[NL_ISOFLOP_MAX_BUDGETS];
    double a, log_k;   /* N_opt = exp(log_k) * C^a (least squares in log-log) */
    double a_lo, a_hi; /* 95% bootstrap percentile interval */
    double se_a;       /* bootstrap standard deviation of a */
    int boot_used;     /* resamples that gave a valid fit */
} nl_isoflop_fit;

/* Approach 2 on points (N, C, loss): budgets are the distinct C values (relative tolerance
 * 1e-6); each needs >= 3 points and a minimum
 * inside its range of N (else it is left out of the power law). Bootstrap: resample the points of every budget with
 * replacement (`bootstrap` times, seeded), refit; a resample with fewer than 3 distinct N or
 * no minimum is redrawn. Errors: NL_ERR_INVALID when fewer than 2 budgets have a minimum
 * (message names the budget). */
nl_status nl_isoflop_fit_run(const double *n_params, const double *flops, const double *loss, int n, int bootstrap,
                             uint64_t seed, nl_isoflop_fit *out);

/* ---- the study of a sweep ------------------------------------------------------------------ */
#define NL_ISOFLOP_STUDY_MAX_RUNS 256

typedef struct nl_isoflop_study {
    int n;                     /* runs used (the first NL_ISOFLOP_STUDY_MAX_RUNS) */
    int have2, have3;          /* which fits succeeded */
    char why2[256], why3[256]; /* why a fit failed (nl_last_error's message) */
    nl_isoflop_fit f2;         /* approach 2 */
    nl_scaling_fit_result f3;  /* approach 3 */
    double a3;                 /* approach 3's N_opt ~ C^a3, a3 = beta / (alpha + beta) */
    /* approach 3's compute-optimal model at each distinct budget, in the order of the runs */
    int n_opt3;
    double opt3_flops[NL_ISOFLOP_STUDY_MAX_RUNS], opt3_n[NL_ISOFLOP_STUDY_MAX_RUNS],
        opt3_tokens_per_param[NL_ISOFLOP_STUDY_MAX_RUNS];
    /* the extrapolation to the largest budget cmax from the smaller budgets (NaN: no fit) */
    double cmax;       /* the largest budget */
    double meas_best;  /* the best run's loss at cmax */
    double meas_parab; /* approach 2's parabola minimum at cmax (>= 3 budgets) */
    double pred3;      /* approach 3 fitted to the smaller budgets (>= 3 budgets, >= 5 runs there) */
    double pred2;      /* the smaller budgets' parabola minima as a power law in C, at cmax */
} nl_isoflop_study;

/* The study of n runs (N non-embedding parameters, D tokens, C = budget FLOPs, final loss),
 * approach 2 and 3 with `bootstrap` resamples from `seed`. A fit that fails leaves have2/have3 at
 * 0 with the reason in why2/why3; the call fails only when n < 1 (NL_ERR_INVALID) or memory
 * runs out. */
nl_status nl_isoflop_study_run(const double *n_params, const double *n_tokens, const double *flops, const double *loss,
                               int n, int bootstrap, uint64_t seed, nl_isoflop_study *out);

/* The IsoFLOP profiles as an SVG: the runs' (N, loss) per budget, each budget's parabola and the
 * frontier of the minima. */
nl_status nl_isoflop_svg(const char *path, const double *n_params, const double *flops, const double *loss, int n,
                         const nl_isoflop_fit *f2);

#ifdef __cplusplus
}
#endif
#endif
