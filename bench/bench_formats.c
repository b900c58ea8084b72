/*
 * Bulk fp32 -> bf16 / fp16 / E4M3 / E5M2 conversion rate, single thread, as a ratio to
 * memcpy of the same input bytes measured in the same run (median of repetitions, the
 * conversions and memcpy interleaved in every repetition so that both see the same machine).
 * Two sizes: an array that stays in L2 and one that streams from memory.
 * Targets (issue 2): >= 0.5x memcpy for bf16 and fp16, >= 0.25x for E4M3 and E5M2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/formats.h"
#include "bench_util.h"

#define REPS 15

typedef struct job {
    nl_format f;
    nl_fmt_kernel k;
    double target;
    double t[REPS];
} job;

static int run_size(size_t n, int inner) {
    float *x = nl_malloc(n * sizeof(float), "bench input");
    float *copy = nl_malloc(n * sizeof(float), "bench memcpy target");
    void *codes = nl_malloc(n * sizeof(float), "bench codes");
    if (!x || !copy || !codes) {
        fprintf(stderr, "bench_formats: %s\n", nl_last_error());
        return 1;
    }
    nl_rng r;
    nl_rng_seed(&r, 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)(nl_rng_normal(&r) * ldexp(1.0, (int)nl_rng_below(&r, 16) - 8));
    memset(copy, 0, n * sizeof(float));
    memset(codes, 0, n * sizeof(float));
    job jobs[16];
    int nj = 0;
    const nl_format fs[] = {NL_FMT_BF16, NL_FMT_FP16, NL_FMT_E4M3, NL_FMT_E5M2};
    for (int i = 0; i < 4; i++) {
        double target = fs[i] == NL_FMT_BF16 || fs[i] == NL_FMT_FP16 ? 0.5 : 0.25;
        jobs[nj++] = (job){fs[i], NL_FMT_KERNEL_AUTO, target, {0}};
        if (nl_fmt_kernel_auto(fs[i]) != NL_FMT_KERNEL_PORTABLE)
            jobs[nj++] = (job){fs[i], NL_FMT_KERNEL_PORTABLE, 0, {0}};
    }
    double tm[REPS];
    volatile unsigned sink = 0;
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = nl_time_s();
        for (int it = 0; it < inner; it++) {
            memcpy(copy, x, n * sizeof(float));
            sink += ((unsigned char *)copy)[it % n];
        }
        tm[rep] = (nl_time_s() - t0) / inner;
        for (int j = 0; j < nj; j++) {
            t0 = nl_time_s();
            for (int it = 0; it < inner; it++) {
                if (nl_fmt_encode_array_kernel(jobs[j].f, jobs[j].k, x, n, codes) != NL_OK) {
                    fprintf(stderr, "bench_formats: %s\n", nl_last_error());
                    return 1;
                }
                sink += ((unsigned char *)codes)[it % n];
            }
            jobs[j].t[rep] = (nl_time_s() - t0) / inner;
        }
    }
    double t_memcpy = median(tm, REPS);
    printf("%zu values (%.1f MiB of fp32), median of %d repetitions x %d, single thread\n", n, n * 4.0 / (1 << 20),
           REPS, inner);
    printf("  %-14s %-11s %12s %10s %8s\n", "conversion", "kernel", "Gvalues/s", "x memcpy", "target");
    printf("  %-14s %-11s %12.3f %10s\n", "memcpy (fp32)", "libc", n / t_memcpy * 1e-9, "1.00");
    for (int j = 0; j < nj; j++) {
        double t = median(jobs[j].t, REPS);
        char name[32], tg[32] = "";
        snprintf(name, sizeof name, "fp32->%s", nl_fmt_name(jobs[j].f));
        nl_fmt_kernel k = jobs[j].k == NL_FMT_KERNEL_AUTO ? nl_fmt_kernel_auto(jobs[j].f) : jobs[j].k;
        double ratio = t_memcpy / t;
        if (jobs[j].target > 0)
            snprintf(tg, sizeof tg, ">=%.2f %s", jobs[j].target, ratio >= jobs[j].target ? "ok" : "MISSED");
        printf("  %-14s %-11s %12.3f %10.2f%s%s\n", name, nl_fmt_kernel_name(k), n / t * 1e-9, ratio, *tg ? "  " : "",
               tg);
    }
    (void)sink;
    nl_free(x);
    nl_free(copy);
    nl_free(codes);
    return 0;
}

int main(void) {
    printf("bench_formats: bulk fp32 -> code conversion vs memcpy of the same input bytes\n");
    int rc = run_size((size_t)1 << 16, 200); /* 256 KiB: stays in L2 */
    rc |= run_size((size_t)1 << 24, 3);      /* 64 MiB: streams from memory */
    return rc;
}
