/* A set of checkpoints scored on one text and ordered by accuracy (emergence_set.h). */
#include "nanolm/emergence_set.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
