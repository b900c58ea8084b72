/* Sorting and medians of doubles (base.h): the one comparator the timing and fitting code shares. */
#include <math.h>
#include <stdlib.h>

#include "nanolm/base.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void nl_sort_doubles(double *v, size_t n) {
    if (n > 1) qsort(v, n, sizeof *v, cmp_double);
}

double nl_median(double *v, size_t n) {
    if (n == 0) return NAN;
    nl_sort_doubles(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
