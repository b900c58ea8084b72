/* A set of checkpoints scored on one text and ordered by accuracy (emergence_set.h). */
#include "nanolm/emergence_set.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/svg.h"

static int by_accuracy(const void *a, const void *b) {
    double x = ((const nl_emergence_row *)a)->e.accuracy, y = ((const nl_emergence_row *)b)->e.accuracy;
    return (x > y) - (x < y);
}

nl_status nl_emergence_eval_set(const char *const *paths, int n, const char *text, nl_data_split split, int64_t windows,
                                int *kmax, nl_emergence_row *rows, nl_emergence_progress progress, void *user) {
    for (int i = 0; i < n; i++) {
        NL_TRY(nl_emergence_eval_file(paths[i], text, split, windows, kmax, &rows[i].e));
        const char *base = strrchr(paths[i], '/');
        snprintf(rows[i].name, sizeof rows[i].name, "%.255s", base ? base + 1 : paths[i]);
        if (progress) progress(user, &rows[i]);
    }
    qsort(rows, (size_t)n, sizeof *rows, by_accuracy);
    return NL_OK;
}

const int nl_emergence_ks[NL_EMERGENCE_NKS] = {1, 2, 4, 8, 16, 32};

int nl_emergence_nks(int kmax) {
    int n = 0;
    while (n < NL_EMERGENCE_NKS && nl_emergence_ks[n] <= kmax) n++;
    return n;
}

nl_status nl_emergence_svg(const char *path, nl_emergence_scale scale, const nl_emergence_row *rows, int n, int kmax) {
    if (n < 1) return nl_fail(NL_ERR_INVALID, "%s: no checkpoints to plot", path);
    const int nks = nl_emergence_nks(kmax);
    double *px = nl_malloc((size_t)n * (1 + 2 * NL_EMERGENCE_NKS) * sizeof *px, "emergence plot");
    if (!px) return NL_ERR_NOMEM;
    nl_svg_series s[2 * NL_EMERGENCE_NKS];
    char nm[2 * NL_EMERGENCE_NKS][32];
    for (int i = 0; i < n; i++) px[i] = rows[i].e.accuracy;
    int ns = 0;
    for (int q = 0; q < nks; q++) {
        double *ey = px + (size_t)n * (1 + 2 * q), *py = ey + n;
        for (int i = 0; i < n; i++) {
            ey[i] = rows[i].e.exact[nl_emergence_ks[q]];
            py[i] = pow(rows[i].e.accuracy, nl_emergence_ks[q]);
            /* log scale: p^k far below one hit among the start positions would only stretch the axis */
            if (scale == NL_EMERGENCE_LOG && py[i] < 0.1 / (double)rows[i].e.starts) py[i] = NAN;
        }
        if (scale == NL_EMERGENCE_RELATIVE) {
            if (nl_emergence_ks[q] > 8) break; /* longer answers have a handful of hits at most here: noise */
            double me = 0, mp = 0;
            for (int i = 0; i < n; i++) me = fmax(me, ey[i]), mp = fmax(mp, py[i]);
            for (int i = 0; i < n; i++) {
                ey[i] = me > 0 ? ey[i] / me : NAN;
                py[i] = mp > 0 ? py[i] / mp : NAN;
            }
        }
        snprintf(nm[2 * q], 32, "exact match k=%d", nl_emergence_ks[q]);
        snprintf(nm[2 * q + 1], 32, "p^%d", nl_emergence_ks[q]);
        s[ns++] = (nl_svg_series){nm[2 * q], px, ey, (size_t)n, nl_svg_color((size_t)q), 1};
        s[ns++] = (nl_svg_series){nm[2 * q + 1], px, py, (size_t)n, nl_svg_color((size_t)q), 0};
    }
    nl_svg_plot_opts o = {"Per-token accuracy is smooth; exact match of k tokens jumps",
                          "per-token accuracy p",
                          scale == NL_EMERGENCE_RELATIVE ? "exact match (points) and p^k (lines) / their largest value"
                                                         : "exact match of the next k tokens",
                          0,
                          scale == NL_EMERGENCE_LOG,
                          0,
                          0};
    nl_status rc = nl_svg_plot(path, &o, s, (size_t)ns);
    nl_free(px);
    return rc;
}
