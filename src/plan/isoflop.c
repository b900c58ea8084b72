/* IsoFLOP fits: approach 2 per budget, and the study of a sweep's runs (see nanolm/isoflop.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/isoflop.h"
#include "nanolm/linfit.h"
#include "nanolm/svg.h"

/* ---- approach 2 ---------------------------------------------------------------------------- */

/* Least-squares parabola y = c0 + c1 x + c2 x^2 (x centred for conditioning). 0 on success. */
static int parabola(const double *x, const double *y, int n, double *c0, double *c1, double *c2) {
    double xm = 0;
    for (int i = 0; i < n; i++) xm += x[i];
    xm /= n;
    double s[5] = {0}, t[3] = {0};
    for (int i = 0; i < n; i++) {
        double u = x[i] - xm, p = 1;
        for (int k = 0; k < 5; k++) {
            s[k] += p;
            if (k < 3) t[k] += p * y[i];
            p *= u;
        }
    }
    /* normal equations [s0 s1 s2; s1 s2 s3; s2 s3 s4] b = t, by Cramer's rule */
    double M[3][3] = {{s[0], s[1], s[2]}, {s[1], s[2], s[3]}, {s[2], s[3], s[4]}};
#define DET3(A)                                                                                                        \
    (A[0][0] * (A[1][1] * A[2][2] - A[1][2] * A[2][1]) - A[0][1] * (A[1][0] * A[2][2] - A[1][2] * A[2][0]) +           \
     A[0][2] * (A[1][0] * A[2][1] - A[1][1] * A[2][0]))
    double det = DET3(M);
    if (!(fabs(det) > 1e-12 * (fabs(s[0] * s[2] * s[4]) + 1e-300))) return 1;
    double b[3];
    for (int c = 0; c < 3; c++) {
        double A[3][3];
        memcpy(A, M, sizeof A);
        for (int r = 0; r < 3; r++) A[r][c] = t[r];
        b[c] = DET3(A) / det;
    }
#undef DET3
    /* un-centre: y = b0 + b1 (x - xm) + b2 (x - xm)^2 */
    *c2 = b[2];
    *c1 = b[1] - 2 * b[2] * xm;
    *c0 = b[0] - b[1] * xm + b[2] * xm * xm;
    return 0;
}

static int fit_budget(const double *x, const double *y, int n, nl_isoflop_budget *b) {
    b->n_points = n;
    b->outside = 0;
    b->n_opt = b->loss_opt = NAN;
    if (n < 3 || parabola(x, y, n, &b->c0, &b->c1, &b->c2)) return 1;
    if (!(b->c2 > 0)) return 1;
    double xs = -b->c1 / (2 * b->c2), lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fmin(lo, x[i]);
        hi = fmax(hi, x[i]);
    }
    b->n_opt = exp(xs);
    if (xs < lo || xs > hi) {
        b->outside = 1;
        return 1;
    } /* the sizes do not bracket the minimum */
    b->loss_opt = b->c0 + b->c1 * xs + b->c2 * xs * xs;
    return 0;
}

nl_status nl_isoflop_fit_run(const double *n_params, const double *flops, const double *loss, int n, int bootstrap,
                             uint64_t seed, nl_isoflop_fit *out) {
    memset(out, 0, sizeof *out);
    out->a = out->a_lo = out->a_hi = out->se_a = NAN;
    /* group by budget */
    double cs[NL_ISOFLOP_MAX_BUDGETS];
    int nb = 0;
    int *grp = nl_malloc((size_t)(n > 0 ? n : 1) * sizeof(int), "isoflop groups");
    if (!grp) return NL_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        if (!(n_params[i] > 0 && flops[i] > 0 && isfinite(loss[i]))) {
            nl_free(grp);
            return nl_fail(NL_ERR_INVALID, "approach 2: row %d has N %g, C %g, loss %g", i, n_params[i], flops[i],
                           loss[i]);
        }
        int g = -1;
        for (int k = 0; k < nb; k++)
            if (fabs(flops[i] / cs[k] - 1) < 1e-6) g = k;
        if (g < 0) {
            if (nb == NL_ISOFLOP_MAX_BUDGETS) {
                nl_free(grp);
                return nl_fail(NL_ERR_INVALID, "approach 2: more than %d budgets", NL_ISOFLOP_MAX_BUDGETS);
            }
            cs[nb] = flops[i];
            g = nb++;
        }
        grp[i] = g;
    }
    /* sort budgets ascending */
    for (int a = 0; a < nb; a++)
        for (int b = a + 1; b < nb; b++)
            if (cs[b] < cs[a]) {
                double t = cs[a];
                cs[a] = cs[b];
                cs[b] = t;
                for (int i = 0; i < n; i++) grp[i] = grp[i] == a ? b : grp[i] == b ? a : grp[i];
            }
    double *x = nl_malloc((size_t)(2 * n + 2) * sizeof(double), "isoflop points");
    double *lc = nl_malloc((size_t)(2 * NL_ISOFLOP_MAX_BUDGETS) * sizeof(double), "isoflop minima");
    double *boot = nl_malloc((size_t)(bootstrap > 0 ? bootstrap : 1) * sizeof(double), "bootstrap");
    if (!x || !lc || !boot) {
        nl_free(grp);
        nl_free(x);
        nl_free(lc);
        nl_free(boot);
        return NL_ERR_NOMEM;
    }
    double *y = x + n + 1;
    out->n_budgets = nb;
    int nv = 0, valid[NL_ISOFLOP_MAX_BUDGETS] = {0};
    double *ln_c = lc, *ln_n = lc + NL_ISOFLOP_MAX_BUDGETS;
    for (int k = 0; k < nb; k++) {
        int m = 0;
        for (int i = 0; i < n; i++)
            if (grp[i] == k) {
                x[m] = log(n_params[i]);
                y[m] = loss[i];
                m++;
            }
        out->b[k].flops = cs[k];
        if (!fit_budget(x, y, m, &out->b[k])) {
            valid[k] = 1;
            ln_c[nv] = log(cs[k]);
            ln_n[nv] = log(out->b[k].n_opt);
            nv++;
        }
    }
    nl_status rc = NL_OK;
    nl_linfit lf;
    if (nv < 2 || nl_linfit_fit(ln_c, ln_n, NULL, (size_t)nv, &lf)) {
        rc = nl_fail(NL_ERR_INVALID,
                     "approach 2: only %d of %d budgets have a loss minimum (a parabola opening upwards over >= 3 "
                     "sizes); need 2",
                     nv, nb);
        goto done;
    }
    out->a = lf.slope;
    out->log_k = lf.intercept;
    nl_rng rng;
    nl_rng_seed(&rng, seed);
    int used = 0;
    for (int r = 0; r < bootstrap; r++) {
        int ok = 0;
        for (int attempt = 0; attempt < 50 && !ok; attempt++) {
            int nv2 = 0;
            for (int k = 0; k < nb; k++) {
                int idx[256], cnt = 0;
                for (int i = 0; i < n && cnt < 256; i++)
                    if (grp[i] == k) idx[cnt++] = i;
                if (!valid[k]) continue;
                int m = 0, distinct = 0;
                for (int j = 0; j < cnt; j++) {
                    int i = idx[nl_rng_below(&rng, (uint64_t)cnt)];
                    x[m] = log(n_params[i]);
                    y[m] = loss[i];
                    int seen = 0;
                    for (int q = 0; q < m; q++) seen |= x[q] == x[m];
                    distinct += !seen;
                    m++;
                }
                nl_isoflop_budget bb;
                if (distinct >= 3 && !fit_budget(x, y, m, &bb)) {
                    ln_c[nv2] = log(cs[k]);
                    ln_n[nv2] = log(bb.n_opt);
                    nv2++;
                }
            }
            nl_linfit bl;
            if (nv2 == nv && !nl_linfit_fit(ln_c, ln_n, NULL, (size_t)nv2, &bl)) {
                boot[used++] = bl.slope;
                ok = 1;
            }
        }
    }
    out->boot_used = used;
    if (used >= 10) {
        double mean = 0, ss = 0;
        for (int i = 0; i < used; i++) mean += boot[i];
        mean /= used;
        for (int i = 0; i < used; i++) ss += (boot[i] - mean) * (boot[i] - mean);
        out->se_a = sqrt(ss / (used - 1));
        nl_sort_doubles(boot, (size_t)used);
        out->a_lo = boot[(int)floor(0.025 * (used - 1))];
        out->a_hi = boot[(int)ceil(0.975 * (used - 1))];
    }
done:
    nl_free(grp);
    nl_free(x);
    nl_free(lc);
    nl_free(boot);
    return rc;
}

/* ---- the study ----------------------------------------------------------------------------- */

static int same_budget(double a, double b) { return fabs(a / b - 1) < 1e-6; }

/* Approach 3's best loss at budget C: the law's compute-optimal point. */
static double law_best_loss(const nl_chinchilla *law, double C) {
    double n, d;
    nl_scaling_optimal_law(law, C, &n, &d);
    return nl_scaling_loss(law, n, d);
}

/* Approach 2's extrapolation: the budgets' minima as a power law in C (a line in log-log), at c. */
static double minima_power_law(const nl_isoflop_fit *f2, double c) {
    double lx[NL_ISOFLOP_MAX_BUDGETS], ly[NL_ISOFLOP_MAX_BUDGETS];
    int m = 0;
    for (int k = 0; k < f2->n_budgets; k++)
        if (isfinite(f2->b[k].loss_opt)) {
            lx[m] = log(f2->b[k].flops);
            ly[m] = log(f2->b[k].loss_opt);
            m++;
        }
    nl_linfit lf;
    if (m < 2 || nl_linfit_fit(lx, ly, NULL, (size_t)m, &lf)) return NAN;
    return exp(lf.intercept + lf.slope * log(c));
}

/* The extrapolation check: fit all but the largest budget, predict its best loss. */
static void extrapolate(nl_isoflop_study *s, const double *N, const double *D, const double *C, const double *L,
                        nl_scaling_obs *small, double *sN, double *sC, double *sL) {
    s->cmax = 0;
    for (int i = 0; i < s->n; i++) s->cmax = fmax(s->cmax, C[i]);
    s->meas_best = INFINITY, s->pred3 = NAN, s->pred2 = NAN, s->meas_parab = NAN;
    int n_small = 0, n_budgets = 0;
    for (int i = 0; i < s->n; i++) {
        if (same_budget(C[i], s->cmax)) {
            s->meas_best = fmin(s->meas_best, L[i]);
        } else {
            small[n_small] = (nl_scaling_obs){N[i], D[i], L[i]};
            sN[n_small] = N[i], sC[n_small] = C[i], sL[n_small] = L[i];
            n_small++;
        }
        int first = 1;
        for (int k = 0; k < i; k++) first &= !same_budget(C[k], C[i]);
        n_budgets += first;
    }
    const nl_isoflop_fit *f2 = &s->f2;
    if (s->have2 && f2->n_budgets >= 3 && isfinite(f2->b[f2->n_budgets - 1].loss_opt))
        s->meas_parab = f2->b[f2->n_budgets - 1].loss_opt;
    nl_scaling_fit_result fs;
    nl_scaling_fit_opts fso = {1e-3, 0, 1};
    if (n_budgets >= 3 && n_small >= 5 && nl_scaling_fit(small, (size_t)n_small, &fso, &fs) == NL_OK)
        s->pred3 = law_best_loss(&fs.law, s->cmax);
    nl_isoflop_fit fs2;
    if (s->have2 && f2->n_budgets >= 3 && nl_isoflop_fit_run(sN, sC, sL, n_small, 0, 1, &fs2) == NL_OK)
        s->pred2 = minima_power_law(&fs2, s->cmax);
}

nl_status nl_isoflop_study_run(const double *n_params, const double *n_tokens, const double *flops, const double *loss,
                               int n, int bootstrap, uint64_t seed, nl_isoflop_study *out) {
    memset(out, 0, sizeof *out);
    if (n < 1) return nl_fail(NL_ERR_INVALID, "isoflop study: no runs");
    out->n = n > NL_ISOFLOP_STUDY_MAX_RUNS ? NL_ISOFLOP_STUDY_MAX_RUNS : n;
    nl_scaling_obs *obs = nl_malloc((size_t)out->n * 2 * sizeof *obs, "isoflop study points");
    double *sx = nl_malloc((size_t)out->n * 3 * sizeof *sx, "isoflop study points");
    if (!obs || !sx) {
        nl_free(obs);
        nl_free(sx);
        return NL_ERR_NOMEM;
    }
    for (int i = 0; i < out->n; i++) obs[i] = (nl_scaling_obs){n_params[i], n_tokens[i], loss[i]};
    out->have2 = nl_isoflop_fit_run(n_params, flops, loss, out->n, bootstrap, seed, &out->f2) == NL_OK;
    if (!out->have2) snprintf(out->why2, sizeof out->why2, "%s", nl_last_error());
    nl_scaling_fit_opts fo = {1e-3, bootstrap, seed};
    out->have3 = out->n >= 5 && nl_scaling_fit(obs, (size_t)out->n, &fo, &out->f3) == NL_OK;
    if (!out->have3) snprintf(out->why3, sizeof out->why3, "%s", out->n >= 5 ? nl_last_error() : "needs >= 5 runs");
    if (out->have3) {
        const nl_chinchilla *law = &out->f3.law;
        out->a3 = law->beta / (law->alpha + law->beta);
        for (int i = 0; i < out->n; i++) {
            int dup = 0;
            for (int k = 0; k < out->n_opt3; k++) dup |= same_budget(flops[i], out->opt3_flops[k]);
            if (dup) continue;
            double nn, dd;
            nl_scaling_optimal_law(law, flops[i], &nn, &dd);
            out->opt3_flops[out->n_opt3] = flops[i];
            out->opt3_n[out->n_opt3] = nn;
            out->opt3_tokens_per_param[out->n_opt3] = dd / nn;
            out->n_opt3++;
        }
    }
    extrapolate(out, n_params, n_tokens, flops, loss, obs + out->n, sx, sx + out->n, sx + 2 * out->n);
    nl_free(obs);
    nl_free(sx);
    return NL_OK;
}

nl_status nl_isoflop_svg(const char *path, const double *n_params, const double *flops, const double *loss, int n,
                         const nl_isoflop_fit *f2) {
    enum { PTS = 64 };
    nl_svg_series s[2 * NL_ISOFLOP_MAX_BUDGETS + 1];
    double px[NL_ISOFLOP_MAX_BUDGETS][PTS], py[NL_ISOFLOP_MAX_BUDGETS][PTS], cx[NL_ISOFLOP_MAX_BUDGETS][PTS],
        cy[NL_ISOFLOP_MAX_BUDGETS][PTS];
    double fx[NL_ISOFLOP_MAX_BUDGETS], fy[NL_ISOFLOP_MAX_BUDGETS];
    char names[NL_ISOFLOP_MAX_BUDGETS][48];
    size_t ns = 0, nf = 0;
    for (int k = 0; k < f2->n_budgets; k++) {
        const nl_isoflop_budget *b = &f2->b[k];
        size_t m = 0;
        double lo = INFINITY, hi = 0;
        for (int i = 0; i < n && m < PTS; i++)
            if (same_budget(flops[i], b->flops)) {
                px[k][m] = n_params[i];
                py[k][m] = loss[i];
                lo = fmin(lo, px[k][m]);
                hi = fmax(hi, px[k][m]);
                m++;
            }
        snprintf(names[k], sizeof names[k], "C = %.2g FLOPs", b->flops);
        s[ns++] = (nl_svg_series){names[k], px[k], py[k], m, nl_svg_color((size_t)k), 1};
        if (isfinite(b->n_opt)) {
            for (int j = 0; j < PTS; j++) {
                double x = log(lo) + (log(hi) - log(lo)) * j / (PTS - 1.0);
                cx[k][j] = exp(x);
                cy[k][j] = b->c0 + b->c1 * x + b->c2 * x * x;
            }
            s[ns++] = (nl_svg_series){NULL, cx[k], cy[k], PTS, nl_svg_color((size_t)k), 0};
            fx[nf] = b->n_opt;
            fy[nf] = b->loss_opt;
            nf++;
        }
    }
    if (nf) s[ns++] = (nl_svg_series){"frontier (parabola minima)", fx, fy, nf, "#000000", 1};
    nl_svg_plot_opts o = {"IsoFLOP profiles of NanoLM (approach 2)",
                          "non-embedding parameters N",
                          "validation loss (nats/token)",
                          1,
                          0,
                          0,
                          0};
    return nl_svg_plot(path, &o, s, ns);
}
