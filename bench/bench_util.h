/* Helpers shared by the benchmarks: medians of repeated timings. */
#ifndef NANOLM_BENCH_UTIL_H
#define NANOLM_BENCH_UTIL_H

#include <stdlib.h>

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v in place). */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
