/* Scaling laws: compute-optimal allocation, over-training, the Chinchilla frontier picture. */
#include "nanolm/scaling.h"
#include "nanolm/linfit.h"
#include "nanolm/svg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Hoffmann et al. 2022, approach 3, with the fit's unrounded constants. The rounded ones printed
 * in the paper's eq. (10) move the compute-optimal point noticeably (see the tests). */
void nl_scaling_hoffmann(nl_chinchilla *l) {
    l->A = exp(6.0073404);
    l->B = exp(6.0179186);
    l->E = exp(0.5267228);
    l->alpha = 0.33917084;
    l->beta = 0.2849083;
}

/* Hoffmann et al. 2022 eq. (10) as printed. */
void nl_scaling_hoffmann_rounded(nl_chinchilla *l) {
    l->A = 406.4;
    l->B = 410.7;
    l->E = 1.69;
    l->alpha = 0.34;
    l->beta = 0.28;
}

double nl_scaling_loss(const nl_chinchilla *l, double n, double d) {
    return l->E + l->A / pow(n, l->alpha) + l->B / pow(d, l->beta);
}

/* G of the optimum N = G (C/6)^(beta/(alpha+beta)): (alpha A / (beta B))^(1/(alpha+beta)). */
static double optimum_g(const nl_chinchilla *l) {
    return pow(l->alpha * l->A / (l->beta * l->B), 1.0 / (l->alpha + l->beta));
}

/* Minimising E + A N^-alpha + B D^-beta with N D = C/6 (Hoffmann et al. 2022 eq. (4)). */
void nl_scaling_optimal_law(const nl_chinchilla *l, double flops, double *n, double *d) {
    *n = optimum_g(l) * pow(flops / 6.0, l->beta / (l->alpha + l->beta));
    *d = flops / 6.0 / *n;
}

void nl_scaling_optimum(const nl_chinchilla *l, double flops, nl_chinchilla_optimum *o) {
    const double al = l->alpha, be = l->beta;
    o->G = optimum_g(l), o->a = be / (al + be), o->b = al / (al + be);
    o->n = o->G * pow(flops / 6, o->a), o->d = pow(flops / 6, o->b) / o->G;
    o->lhs = al * l->A * pow(o->n, -al), o->rhs = be * l->B * pow(o->d, -be);
}

double nl_scaling_flops_for_params(const nl_chinchilla *l, double n) {
    return 6.0 * pow(n / optimum_g(l), (l->alpha + l->beta) / l->beta);
}

/* Hoffmann et al. 2022 Table 3: approach-1 projections (params, FLOPs, tokens). */
static const double table3[][3] = {
    {400e6, 1.92e19, 8.0e9},   {1e9, 1.21e20, 20.2e9},   {10e9, 1.23e22, 205.1e9},
    {67e9, 5.76e23, 1.5e12},   {175e9, 3.85e24, 3.7e12}, {280e9, 9.90e24, 5.9e12},
    {520e9, 3.43e25, 11.0e12}, {1e12, 1.27e26, 21.2e12}, {10e12, 1.30e28, 216.2e12},
};

static void lsq_loglog(int col, nl_powerlaw *out) {
    enum { N = sizeof table3 / sizeof table3[0] };
    double x[N], y[N];
    for (size_t i = 0; i < N; i++) {
        x[i] = log(table3[i][1]);
        y[i] = log(table3[i][col]);
    }
    nl_linfit f = {0};
    nl_linfit_fit(x, y, NULL, N, &f); /* fixed table: the FLOPs spread, the fit cannot fail */
    out->a = f.slope;
    out->k = exp(f.intercept);
}

void nl_scaling_approach1(nl_powerlaw *n_of_c, nl_powerlaw *d_of_c) {
    lsq_loglog(0, n_of_c);
    lsq_loglog(2, d_of_c);
}

double nl_scaling_kaplan_params(double flops) {
    return 1.3e9 * pow(flops / 8.64e19, 0.73); /* C in PF-days: 1 PF-day = 8.64e19 FLOPs */
}

void nl_scaling_rule(double ratio, double flops, double *n, double *d) {
    *n = sqrt(flops / (6.0 * ratio));
    *d = ratio * *n;
}

nl_status nl_scaling_overtrain(const nl_chinchilla *l, double n, double d, double ratio, nl_overtrain *o) {
    memset(o, 0, sizeof *o);
    if (!(n > 0) || !(d > 0) || !isfinite(n) || !isfinite(d))
        return nl_fail(NL_ERR_INVALID, "overtrain: params and tokens must be positive, got %g and %g", n, d);
    o->tokens_per_param = d / n;
    o->multiple_of_rule = o->tokens_per_param / ratio;
    o->loss = nl_scaling_loss(l, n, d);
    o->flops = 6 * n * d;
    /* The compute-optimal frontier L*(C) falls monotonically: bisect log C for L*(C) = loss. */
    double lo = log(1e10), hi = log(1e40);
    for (int i = 0; i < 200; i++) {
        double mid = 0.5 * (lo + hi), nn, dd;
        nl_scaling_optimal_law(l, exp(mid), &nn, &dd);
        if (nl_scaling_loss(l, nn, dd) > o->loss)
            lo = mid;
        else
            hi = mid;
    }
    o->opt_flops = exp(0.5 * (lo + hi));
    nl_scaling_optimal_law(l, o->opt_flops, &o->opt_params, &o->opt_tokens);
    o->extra_flops_frac = o->flops / o->opt_flops - 1;
    /* Serving a token costs ~2N FLOPs: the smaller model repays its extra training after
     * (C - C*) / (2 (N* - N)) tokens. A model larger than the optimum never repays. */
    o->breakeven_tokens = o->opt_params > n ? fmax(0, o->flops - o->opt_flops) / (2 * (o->opt_params - n)) : INFINITY;
    return NL_OK;
}

nl_status nl_scaling_svg_frontier(const char *path, const nl_chinchilla *l, double lo, double hi, double mark) {
    if (!(lo > 0) || !(hi > lo)) return nl_fail(NL_ERR_INVALID, "frontier: need 0 < flops_lo < flops_hi");
    enum { K = 60 };
    double x[K], y3[K], y20[K], mx[1], my[1];
    for (int i = 0; i < K; i++) {
        double c = exp(log(lo) + (log(hi) - log(lo)) * i / (K - 1)), n, d;
        x[i] = c;
        nl_scaling_optimal_law(l, c, &n, &d);
        y3[i] = nl_scaling_loss(l, n, d);
        nl_scaling_rule(20, c, &n, &d);
        y20[i] = nl_scaling_loss(l, n, d);
    }
    nl_svg_series s[3] = {{"approach 3 optimum", x, y3, K, NULL, 0}, {"20 tokens/param", x, y20, K, NULL, 0}};
    size_t ns = 2;
    if (mark > 0) {
        double n, d;
        nl_scaling_optimal_law(l, mark, &n, &d);
        mx[0] = mark;
        my[0] = nl_scaling_loss(l, n, d);
        s[2] = (nl_svg_series){"this budget", mx, my, 1, NULL, 1};
        ns = 3;
    }
    nl_svg_plot_opts o = {.title = "Chinchilla frontier: predicted loss at the compute-optimal size",
                          .xlabel = "training compute C (FLOPs)",
                          .ylabel = "loss (nats/token)",
                          .logx = 1};
    return nl_svg_plot(path, &o, s, ns);
}
