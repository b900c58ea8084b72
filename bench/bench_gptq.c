/* GPTQ on a 4096 x 4096 layer (int4, group 128), single thread and all threads.
 *
 * Calibration as in the GPTQ paper: 128 segments ("rows") of 2048 tokens, i.e. X has
 * 128 * 2048 = 262,144 token columns of 4096 features. The two costs are timed separately:
 *  - the Hessian H = 2/N X X^T (double-precision syrk over every token: 8.8 TFLOP for all 128
 *    segments), timed per segment on NANOLM_BENCH_GPTQ_SEGS segments (default 2) and projected
 *    linearly to 128 (set NANOLM_BENCH_GPTQ_SEGS=128 to run them all);
 *  - the GPTQ solve (dampening, factorization of H^-1, the column loop with lazy 128-blocks),
 *    which does not depend on the number of tokens, timed in full (median of
 *    NANOLM_BENCH_GPTQ_REPS, default 3).
 * Baseline measured in the same run: cblas_dgemm 4096^3. The solve's column loop is
 * rows * cols^2 / 2 multiply-adds plus ~cols^3 / 3 for the factorization, i.e. ~0.83 of that
 * dgemm's work, so "solve / dgemm" near 1 means the solve runs near BLAS speed.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>

#include "nanolm/base.h"
#include "nanolm/gptq.h"

enum { N = 4096, SEG = 2048, SEGS_PAPER = 128 };

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : dflt;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    (void)argc;
    nl_runtime_reexec(argv); /* its sgemm baseline on OpenBLAS's fastest kernels for this CPU */
    int segs = env_int("NANOLM_BENCH_GPTQ_SEGS", 2), reps = env_int("NANOLM_BENCH_GPTQ_REPS", 3);
    if (segs > SEGS_PAPER) segs = SEGS_PAPER;
    int all = nl_threads();
    nl_rng rng;
    nl_rng_seed(&rng, 7);
    float *w = nl_malloc((size_t)N * N * sizeof(float), "bench weight");
    float *x = nl_malloc((size_t)SEG * N * sizeof(float), "bench segment");
    double *a = nl_malloc((size_t)N * N * sizeof(double), "bench dgemm A");
    double *c = nl_malloc((size_t)N * N * sizeof(double), "bench dgemm C");
    float *wq = nl_malloc((size_t)N * N * sizeof(float), "bench w_hat");
    if (!w || !x || !a || !c || !wq) {
        fprintf(stderr, "bench_gptq: %s\n", nl_last_error());
        return 1;
    }
    for (size_t i = 0; i < (size_t)N * N; i++) {
        w[i] = (float)(0.02 * nl_rng_normal(&rng));
        a[i] = nl_rng_double(&rng) - 0.5;
    }
    printf("bench_gptq: W 4096x4096, int4 group 128, block 128; calibration 128 segments x 2048 tokens\n");
    printf("  (X = 262,144 tokens x 4096 features); Hessian timed on %d segment(s) and projected to 128;\n", segs);
    printf("  solve = median of %d; baseline cblas_dgemm 4096^3 in the same run\n", reps);
    printf("%-8s %12s %14s %16s %12s %12s %12s\n", "threads", "dgemm_s", "hessian_s/seg", "hessian_128seg_s", "solve_s",
           "solve/dgemm", "total_s");
    int tcounts[2] = {1, all};
    for (int ti = 0; ti < (all > 1 ? 2 : 1); ti++) {
        int th = tcounts[ti];
        nl_set_threads(th);
        double td[3];
        for (int r = 0; r < 3; r++) {
            double t0 = nl_time_s();
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0, a, N, a, N, 0.0, c, N);
            td[r] = nl_time_s() - t0;
        }
        double t_dgemm = median(td, 3);
        nl_gptq_hessian hs;
        if (nl_gptq_hessian_init(&hs, N) != NL_OK) {
            fprintf(stderr, "bench_gptq: %s\n", nl_last_error());
            return 1;
        }
        double *th_seg = malloc(sizeof(double) * segs);
        for (int s = 0; s < segs; s++) {
            /* a fresh segment each time (generation not timed) */
            for (size_t i = 0; i < (size_t)SEG * N; i++) x[i] = (float)nl_rng_normal(&rng);
            double t0 = nl_time_s();
            if (nl_gptq_hessian_add(&hs, x, SEG) != NL_OK) {
                fprintf(stderr, "bench_gptq: %s\n", nl_last_error());
                return 1;
            }
            th_seg[s] = nl_time_s() - t0;
        }
        double t_seg = median(th_seg, segs);
        double *ts = malloc(sizeof(double) * reps);
        nl_gptq_opts o = nl_gptq_defaults();
        for (int r = 0; r < reps; r++) {
            double t0 = nl_time_s();
            if (nl_gptq_quantize(w, N, N, hs.h, &o, NULL, NULL, NULL, wq, NULL) != NL_OK) {
                fprintf(stderr, "bench_gptq: %s\n", nl_last_error());
                return 1;
            }
            ts[r] = nl_time_s() - t0;
        }
        double t_solve = median(ts, reps);
        double t_h128 = t_seg * SEGS_PAPER;
        printf("%-8d %12.3f %14.3f %15.1f%s %12.3f %12.2f %12.1f\n", th, t_dgemm, t_seg, t_h128,
               segs < SEGS_PAPER ? "*" : " ", t_solve, t_solve / t_dgemm, t_h128 + t_solve);
        fflush(stdout);
        free(th_seg);
        free(ts);
        nl_gptq_hessian_free(&hs);
    }
    if (segs < SEGS_PAPER)
        printf("  * projected: median of %d timed segment(s) x 128 (NANOLM_BENCH_GPTQ_SEGS=128 runs all)\n", segs);
    nl_free(w);
    nl_free(x);
    nl_free(a);
    nl_free(c);
    nl_free(wq);
    return 0;
}
