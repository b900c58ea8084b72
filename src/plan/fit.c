/* Fitting L(N, D) = E + A/N^alpha + B/D^beta the way Hoffmann et al. 2022 (sec. 3.3 and
 * appendix D.2) did: minimise sum_i Huber_delta(LSE(a - alpha log N_i, b - beta log D_i, e)
 * - log L_i) with A = e^a, B = e^b, E = e^e, by L-BFGS (Nocedal 1980) from a grid of starts;
 * standard errors from a bootstrap over observations. */
#include "nanolm/scaling.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { NP = 5 }; /* a, b, e, alpha, beta */

typedef struct fit_data {
    const double *logn, *logd, *logl;
    const size_t *idx; /* rows used (bootstrap), n of them */
    size_t n;
    double delta;
} fit_data;

/* Objective and gradient. */
static double objective(const fit_data *d, const double *th, double *g) {
    double f = 0;
    if (g) memset(g, 0, NP * sizeof *g);
    for (size_t k = 0; k < d->n; k++) {
        size_t i = d->idx[k];
        double t1 = th[0] - th[3] * d->logn[i], t2 = th[1] - th[4] * d->logd[i], t3 = th[2];
        double mx = fmax(t1, fmax(t2, t3));
        double e1 = exp(t1 - mx), e2 = exp(t2 - mx), e3 = exp(t3 - mx), s = e1 + e2 + e3;
        double r = mx + log(s) - d->logl[i];
        double ar = fabs(r);
        f += ar <= d->delta ? 0.5 * r * r : d->delta * (ar - 0.5 * d->delta);
        if (g) {
            double dr = ar <= d->delta ? r : (r > 0 ? d->delta : -d->delta);
            double w1 = e1 / s, w2 = e2 / s, w3 = e3 / s;
            g[0] += dr * w1;
            g[1] += dr * w2;
            g[2] += dr * w3;
            g[3] -= dr * w1 * d->logn[i];
            g[4] -= dr * w2 * d->logd[i];
        }
    }
    return f;
}

static double dot(const double *a, const double *b) {
    double s = 0;
    for (int i = 0; i < NP; i++) s += a[i] * b[i];
    return s;
}

/* L-BFGS with memory 8 and a backtracking (Armijo) line search. Returns the final objective. */
static double lbfgs(const fit_data *d, double *x, int max_iter) {
    enum { M = 8 };
    double S[M][NP], Y[M][NP], rho[M], alpha[M];
    int head = 0, count = 0;
    double g[NP], gn[NP], xn[NP], p[NP];
    double f = objective(d, x, g);
    int stall = 0;
    for (int it = 0; it < max_iter; it++) {
        /* Two-loop recursion: p = -H g. */
        double q[NP];
        memcpy(q, g, sizeof q);
        for (int k = 0; k < count; k++) {
            int j = (head - 1 - k + M) % M;
            alpha[j] = rho[j] * dot(S[j], q);
            for (int i = 0; i < NP; i++) q[i] -= alpha[j] * Y[j][i];
        }
        double gamma = 1;
        if (count > 0) {
            int j = (head - 1 + M) % M;
            gamma = dot(S[j], Y[j]) / dot(Y[j], Y[j]);
        } else {
            double gg = sqrt(dot(g, g));
            gamma = gg > 0 ? 1e-2 / gg : 1;
        }
        for (int i = 0; i < NP; i++) q[i] *= gamma;
        for (int k = count - 1; k >= 0; k--) {
            int j = (head - 1 - k + M) % M;
            double beta = rho[j] * dot(Y[j], q);
            for (int i = 0; i < NP; i++) q[i] += S[j][i] * (alpha[j] - beta);
        }
        for (int i = 0; i < NP; i++) p[i] = -q[i];
        double gp = dot(g, p);
        if (gp >= 0) { /* not a descent direction: restart from steepest descent */
            count = 0;
            double gg = sqrt(dot(g, g));
            if (gg == 0) break;
            for (int i = 0; i < NP; i++) p[i] = -g[i] * 1e-2 / gg;
            gp = dot(g, p);
        }
        double step = 1, fn = f;
        int ok = 0;
        for (int ls = 0; ls < 40; ls++) {
            for (int i = 0; i < NP; i++) xn[i] = x[i] + step * p[i];
            fn = objective(d, xn, gn);
            if (isfinite(fn) && fn <= f + 1e-4 * step * gp) {
                ok = 1;
                break;
            }
            step *= 0.5;
        }
        if (!ok) break;
        double s[NP], y[NP];
        for (int i = 0; i < NP; i++) {
            s[i] = xn[i] - x[i];
            y[i] = gn[i] - g[i];
        }
        double sy = dot(s, y);
        if (sy > 1e-300) {
            memcpy(S[head], s, sizeof s);
            memcpy(Y[head], y, sizeof y);
            rho[head] = 1 / sy;
            head = (head + 1) % M;
            if (count < M) count++;
        }
        double df = f - fn;
        memcpy(x, xn, sizeof xn);
        memcpy(g, gn, sizeof gn);
        f = fn;
        /* Converged when the objective stops moving (relative 1e-11 three times running). */
        stall = df <= 1e-11 * fabs(f) ? stall + 1 : 0;
        if (stall >= 3 || sqrt(dot(g, g)) < 1e-14) break;
    }
    return f;
}

/* Hoffmann's grid (appendix D.2): alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1},
 * a, b in {0, 5, ..., 25}: 4,500 starts. The objective is evaluated at all of them and L-BFGS
 * runs from the best `keep` (all of them would cost seconds for the same optimum). */
static double fit_from_grid(const fit_data *d, int keep, double *best) {
    enum { G = 5 * 5 * 5 * 6 * 6 };
    static double starts[G][NP];
    double fv[G];
    int n = 0;
    for (int ia = 0; ia < 6; ia++)
        for (int ib = 0; ib < 6; ib++)
            for (int ie = 0; ie < 5; ie++)
                for (int ial = 0; ial < 5; ial++)
                    for (int ibe = 0; ibe < 5; ibe++) {
                        double th[NP] = {5.0 * ia, 5.0 * ib, -1 + 0.5 * ie, 0.5 * ial, 0.5 * ibe};
                        memcpy(starts[n], th, sizeof th);
                        fv[n++] = objective(d, th, NULL);
                    }
    /* Pick the `keep` best starts (partial selection). */
    int chosen[64];
    if (keep > 64) keep = 64;
    for (int k = 0; k < keep; k++) {
        int bi = -1;
        for (int i = 0; i < G; i++)
            if (isfinite(fv[i]) && (bi < 0 || fv[i] < fv[bi])) bi = i;
        chosen[k] = bi;
        if (bi >= 0) fv[bi] = INFINITY;
    }
    double bf = INFINITY;
    for (int k = 0; k < keep; k++) {
        if (chosen[k] < 0) continue;
        double x[NP];
        memcpy(x, starts[chosen[k]], sizeof x);
        double f = lbfgs(d, x, 1000);
        if (f < bf) {
            bf = f;
            memcpy(best, x, sizeof x);
        }
    }
    return bf;
}

static void set_law(const double *th, nl_chinchilla *l) {
    l->A = exp(th[0]);
    l->B = exp(th[1]);
    l->E = exp(th[2]);
    l->alpha = th[3];
    l->beta = th[4];
}

nl_status nl_scaling_fit(const nl_scaling_obs *obs, size_t n, const nl_scaling_fit_opts *opts,
                         nl_scaling_fit_result *out) {
    memset(out, 0, sizeof *out);
    if (n < 5) return nl_fail(NL_ERR_INVALID, "scaling fit: need at least 5 observations for 5 parameters, got %zu", n);
    for (size_t i = 0; i < n; i++)
        if (!(obs[i].n_params > 0) || !(obs[i].n_tokens > 0) || !(obs[i].loss > 0) || !isfinite(obs[i].n_params) ||
            !isfinite(obs[i].n_tokens) || !isfinite(obs[i].loss))
            return nl_fail(NL_ERR_INVALID, "scaling fit: row %zu: N, D and loss must be positive and finite", i + 1);
    double delta = opts && opts->huber_delta > 0 ? opts->huber_delta : 1e-3;
    double *buf = nl_malloc(3 * n * sizeof *buf, "scaling fit data");
    size_t *idx = nl_malloc(n * sizeof *idx, "scaling fit rows");
    if (!buf || !idx) {
        nl_free(buf);
        nl_free(idx);
        return NL_ERR_NOMEM;
    }
    double *ln = buf, *ld = buf + n, *ll = buf + 2 * n;
    for (size_t i = 0; i < n; i++) {
        ln[i] = log(obs[i].n_params);
        ld[i] = log(obs[i].n_tokens);
        ll[i] = log(obs[i].loss);
        idx[i] = i;
    }
    fit_data d = {ln, ld, ll, idx, n, delta};
    double th[NP];
    out->objective = fit_from_grid(&d, 32, th);
    out->n_starts = 32;
    out->n_obs = (int)n;
    set_law(th, &out->law);
    out->log_a = th[0];
    out->log_b = th[1];
    out->log_e = th[2];

    int nb = opts ? opts->bootstrap : 0;
    if (nb > 1) {
        nl_rng rng;
        nl_rng_seed(&rng, opts->seed ? opts->seed : 1);
        double s1[NP + 3] = {0}, s2[NP + 3] = {0};
        for (int b = 0; b < nb; b++) {
            for (size_t i = 0; i < n; i++) idx[i] = (size_t)nl_rng_below(&rng, n);
            double x[NP], y[NP];
            memcpy(x, th, sizeof x);
            double f1 = lbfgs(&d, x, 1000);
            double f2 = fit_from_grid(&d, 2, y);
            if (f2 < f1) memcpy(x, y, sizeof x);
            double v[NP + 3] = {x[0], x[1], x[2], x[3], x[4], exp(x[2]), exp(x[0]), exp(x[1])};
            for (int k = 0; k < NP + 3; k++) {
                s1[k] += v[k];
                s2[k] += v[k] * v[k];
            }
        }
        double sd[NP + 3];
        for (int k = 0; k < NP + 3; k++) {
            double mean = s1[k] / nb;
            sd[k] = sqrt(fmax(0, (s2[k] - nb * mean * mean) / (nb - 1)));
        }
        out->se_log_a = sd[0];
        out->se_log_b = sd[1];
        out->se_log_e = sd[2];
        out->se_alpha = sd[3];
        out->se_beta = sd[4];
        out->se_E = sd[5];
        out->se_A = sd[6];
        out->se_B = sd[7];
    }
    nl_free(buf);
    nl_free(idx);
    return NL_OK;
}

/* ---- CSV --------------------------------------------------------------------------------- */
/* Which quantity a header names: 1 N, 2 D, 3 FLOPs, 4 loss, 0 none. Names the user gave come
 * first; a quantity the user did not name keeps its usual names. */
static int col_kind(const char *h, const nl_scaling_cols *names) {
    const char *nm[5] = {NULL, names ? names->n : NULL, names ? names->d : NULL, names ? names->flops : NULL,
                         names ? names->loss : NULL};
    for (int k = 1; k < 5; k++)
        if (nm[k] && !strcasecmp(h, nm[k])) return k;
    int k = 0;
    if (!strcasecmp(h, "n") || !strcasecmp(h, "params") || !strcasecmp(h, "n_params"))
        k = 1;
    else if (!strcasecmp(h, "d") || !strcasecmp(h, "tokens") || !strcasecmp(h, "n_tokens"))
        k = 2;
    else if (!strcasecmp(h, "c") || !strcasecmp(h, "flops"))
        k = 3;
    else if (!strcasecmp(h, "loss") || !strcasecmp(h, "l"))
        k = 4;
    return k && !nm[k] ? k : 0;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

nl_status nl_scaling_read_csv(const char *path, nl_scaling_obs **obs, size_t *n) {
    return nl_scaling_read_csv_cols(path, NULL, obs, n);
}

nl_status nl_scaling_read_csv_cols(const char *path, const nl_scaling_cols *names, nl_scaling_obs **obs, size_t *n) {
    *obs = NULL;
    *n = 0;
    char *text = NULL;
    size_t bytes = 0;
    NL_TRY(nl_read_file(path, &text, &bytes));
    enum { MAXC = 256 };
    int cols[MAXC], ncols = 0, have[5] = {0};
    size_t cap = 64, cnt = 0;
    nl_scaling_obs *o = malloc(cap * sizeof *o); /* grown with realloc; nl_free (= free) releases it */
    if (!o) {
        nl_free(text);
        return nl_fail(NL_ERR_NOMEM, "%s: out of memory", path);
    }
    nl_status rc = NL_OK;
    int line = 0;
    char *save = NULL;
    for (char *ln = strtok_r(text, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        line++;
        char *l = trim(ln);
        if (!*l || *l == '#') continue;
        if (ncols == 0) {
            char *s2 = NULL;
            for (char *f = strtok_r(l, ",", &s2); f; f = strtok_r(NULL, ",", &s2)) {
                if (ncols == MAXC) {
                    rc = nl_fail(NL_ERR_FORMAT, "%s:%d: more than %d columns", path, line, MAXC);
                    goto out;
                }
                cols[ncols] = col_kind(trim(f), names);
                if (cols[ncols] && have[cols[ncols]]) {
                    rc = nl_fail(NL_ERR_FORMAT, "%s:%d: two columns are read as the same quantity ('%s')", path, line,
                                 trim(f));
                    goto out;
                }
                have[cols[ncols]] = 1;
                ncols++;
            }
            if (!have[1] || !have[4] || (!have[2] && !have[3])) {
                if (names && (names->n || names->d || names->flops || names->loss))
                    rc = nl_fail(NL_ERR_FORMAT,
                                 "%s:%d: the header lacks a named column (N '%s', D '%s', FLOPs '%s', loss '%s')", path,
                                 line, names->n ? names->n : "N", names->d ? names->d : "D",
                                 names->flops ? names->flops : "FLOPs", names->loss ? names->loss : "loss");
                else
                    rc = nl_fail(NL_ERR_FORMAT,
                                 "%s:%d: header must name N, loss and D or FLOPs columns "
                                 "(or name yours with --n-col, --d-col, --flops-col, --loss-col)",
                                 path, line);
                goto out;
            }
            continue;
        }
        double v[5] = {0};
        int c = 0;
        char *s2 = NULL;
        for (char *f = strtok_r(l, ",", &s2); f; f = strtok_r(NULL, ",", &s2), c++) {
            if (c >= ncols) {
                rc = nl_fail(NL_ERR_FORMAT, "%s:%d: more fields than the header", path, line);
                goto out;
            }
            if (!cols[c]) continue; /* a column the fit does not use: ignored, whatever it holds */
            char *end;
            f = trim(f);
            double x = strtod(f, &end);
            if (end == f || *end) {
                rc = nl_fail(NL_ERR_FORMAT, "%s:%d: '%s' is not a number", path, line, f);
                goto out;
            }
            v[cols[c]] = x;
        }
        if (c != ncols) {
            rc = nl_fail(NL_ERR_FORMAT, "%s:%d: %d fields, header has %d", path, line, c, ncols);
            goto out;
        }
        if (cnt == cap) {
            cap *= 2;
            nl_scaling_obs *no = realloc(o, cap * sizeof *no);
            if (!no) {
                rc = nl_fail(NL_ERR_NOMEM, "%s: out of memory", path);
                goto out;
            }
            o = no;
        }
        double d = have[2] ? v[2] : v[3] / (6 * v[1]);
        if (!(v[1] > 0) || !(d > 0) || !(v[4] > 0) || !isfinite(v[1]) || !isfinite(d) || !isfinite(v[4])) {
            rc = nl_fail(NL_ERR_FORMAT, "%s:%d: N, D (or FLOPs) and loss must be positive", path, line);
            goto out;
        }
        o[cnt++] = (nl_scaling_obs){v[1], d, v[4]};
    }
    if (ncols == 0) rc = nl_fail(NL_ERR_FORMAT, "%s: empty file", path);
out:
    nl_free(text);
    if (rc) {
        free(o);
        return rc;
    }
    *obs = o;
    *n = cnt;
    return NL_OK;
}
