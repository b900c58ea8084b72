/*
 * Scaling laws: C = 6*N*D, compute-optimal allocation (20 tokens per parameter; Hoffmann et al.
 * 2022 approaches 1 and 3; Kaplan et al. 2020), over-training economics, and fitting
 * L(N, D) = E + A/N^alpha + B/D^beta with Hoffmann's method (Huber on log loss, L-BFGS from a
 * grid of starts) with bootstrap standard errors. Pure arithmetic.
 */
#ifndef NANOLM_SCALING_H
#define NANOLM_SCALING_H

#include <stddef.h>
#include "nanolm/base.h"

/* L(N, D) = E + A / N^alpha + B / D^beta. */
typedef struct nl_chinchilla {
    double E, A, B, alpha, beta;
} nl_chinchilla;

/* Hoffmann et al. 2022 approach 3 with the unrounded constants (log A = 6.0073404,
 * log B = 6.0179186, log E = 0.5267228, alpha = 0.33917084, beta = 0.2849083). */
void nl_scaling_hoffmann(nl_chinchilla *law);
/* The rounded constants printed in the paper (A = 406.4, B = 410.7, E = 1.69, alpha = 0.34,
 * beta = 0.28). */
void nl_scaling_hoffmann_rounded(nl_chinchilla *law);
double nl_scaling_loss(const nl_chinchilla *law, double n_params, double n_tokens);

/* Compute-optimal N and D for C = 6*N*D under `law` (minimise L subject to the budget):
 * N = G * (C/6)^(beta/(alpha+beta)), G = (alpha*A/(beta*B))^(1/(alpha+beta)). */
void nl_scaling_optimal_law(const nl_chinchilla *law, double flops, double *n_params, double *n_tokens);
/* The same optimum term by term, as approach 3's Lagrange derivation writes it (Hoffmann et al.
 * 2022 appendix D.2): N = G (C/6)^a, D = (C/6)^b / G with G = (alpha A / (beta B))^(1/(alpha+beta)),
 * a = beta/(alpha+beta), b = alpha/(alpha+beta); lhs = alpha A N^-alpha and rhs = beta B D^-beta,
 * equal at the optimum (both 6 lambda N D). */
typedef struct nl_chinchilla_optimum {
    double G, a, b, n, d, lhs, rhs;
} nl_chinchilla_optimum;
void nl_scaling_optimum(const nl_chinchilla *law, double flops, nl_chinchilla_optimum *o);
/* The compute that makes `n_params` compute-optimal under `law` (inverse of the above). */
double nl_scaling_flops_for_params(const nl_chinchilla *law, double n_params);

/* Approach 1 of Hoffmann et al. 2022: N_opt = kN * C^a and D_opt = kD * C^b, least-squares fits
 * in log space to the paper's Table 3 projections (which come from approach 1). */
typedef struct nl_powerlaw {
    double k, a;
} nl_powerlaw;
void nl_scaling_approach1(nl_powerlaw *n_of_c, nl_powerlaw *d_of_c);
/* Kaplan et al. 2020 eq. (6.1): N_opt = 1.3e9 * C_pfdays^0.73 (non-embedding parameters). */
double nl_scaling_kaplan_params(double flops);

/* The tokens-per-parameter rule: D = ratio * N, C = 6 N D. */
void nl_scaling_rule(double ratio, double flops, double *n_params, double *n_tokens);

/* Over-training: a model of n_params trained on n_tokens against the compute-optimal model
 * (under `law`) that reaches the same loss. */
typedef struct nl_overtrain {
    double tokens_per_param, multiple_of_rule; /* vs `rule_ratio` tokens per parameter */
    double loss, flops;
    double opt_params, opt_tokens, opt_flops; /* compute-optimal model with the same loss */
    double extra_flops_frac;                  /* flops / opt_flops - 1 */
    double breakeven_tokens;                  /* served tokens at which the small model pays */
} nl_overtrain;
/* NL_ERR_INVALID when the loss is unreachable (at or below E). */
nl_status nl_scaling_overtrain(const nl_chinchilla *law, double n_params, double n_tokens, double rule_ratio,
                               nl_overtrain *out);

/* One observation for the fit. */
typedef struct nl_scaling_obs {
    double n_params, n_tokens, loss;
} nl_scaling_obs;

typedef struct nl_scaling_fit_opts {
    double huber_delta; /* 1e-3 */
    int bootstrap;      /* resamples for standard errors (0: none) */
    uint64_t seed;
} nl_scaling_fit_opts;

typedef struct nl_scaling_fit_result {
    nl_chinchilla law;
    double log_a, log_b, log_e; /* the fitted parameters (A = exp(log_a), ...) */
    double se_log_a, se_log_b, se_log_e, se_alpha, se_beta, se_E, se_A, se_B;
    double objective; /* Huber sum at the optimum */
    int n_starts, n_obs;
} nl_scaling_fit_result;
/* Fits the law to `n` observations: minimises sum Huber_delta(LSE(a - alpha log N,
 * b - beta log D, e) - log L) over (a, b, e, alpha, beta) with L-BFGS from Hoffmann's grid of
 * starts; bootstrap SEs from `opts->bootstrap` resamples. NL_ERR_INVALID when n < 5 or a value
 * is not positive and finite (message names the row). */
nl_status nl_scaling_fit(const nl_scaling_obs *obs, size_t n, const nl_scaling_fit_opts *opts,
                         nl_scaling_fit_result *out);
/* Reads a CSV with a header naming columns N (or params), D (or tokens) or FLOPs (C, then
 * D = C / 6N), and loss. Returns a malloc'd array (nl_free). NL_ERR_FORMAT naming file and line. */
nl_status nl_scaling_read_csv(const char *path, nl_scaling_obs **obs, size_t *n);
/* Column names for nl_scaling_read_csv_cols: any left NULL keeps its usual names (N/params,
 * D/tokens, C/FLOPs, loss/L) unless another is named, then only the named ones are read.
 * Columns the fit does not use are ignored, whatever they hold. */
typedef struct nl_scaling_cols {
    const char *n, *d, *flops, *loss;
} nl_scaling_cols;
nl_status nl_scaling_read_csv_cols(const char *path, const nl_scaling_cols *names, nl_scaling_obs **obs, size_t *n);

/* The compute-optimal frontier (loss vs compute) under `law` and the 20-tokens rule as an SVG. */
nl_status nl_scaling_svg_frontier(const char *path, const nl_chinchilla *law, double flops_lo, double flops_hi,
                                  double mark_flops);

#endif
