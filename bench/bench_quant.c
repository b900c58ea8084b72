/* bench_quant: (1) quantize throughput (int8 per channel, int8 blockwise-32) on a 4096 x 4096
 * fp32 matrix as a ratio to memcpy of the same 64 MiB in the same run; (2) QuantizedLinear
 * W8A8 forward against OpenBLAS cblas_sgemm on the same shapes (M = 1, 16, 64, 256;
 * K = N = 1024, 4096), one thread and all threads. Medians of several repetitions.
 * Targets: quantize >= 0.5x memcpy; W8A8 >= 2x sgemm at M >= 64 and >= 3x at M = 1. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/base.h"
#include "nanolm/qlinear.h"
#include "nanolm/quant.h"
#include "bench_util.h"

#define REPS 7

static volatile float sink;

static int bench_quantize(int threads) {
    const int64_t R = 4096, C = 4096;
    const size_t n = (size_t)(R * C);
    float *x = nl_malloc(n * sizeof(float), "bench input"), *dst = nl_malloc(n * sizeof(float), "memcpy target");
    if (!x || !dst) return 1;
    nl_rng r;
    nl_rng_seed(&r, 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)nl_rng_normal(&r);
    memcpy(dst, x, n * sizeof(float)); /* fault in the target pages */
    nl_set_threads(threads);
    /* Outputs allocated once (as the memcpy target is): we time quantization, not page faults. */
    nl_qtensor qc, qb;
    if (nl_quant_symmetric(x, R, C, 8, 1, &qc) || nl_quant_blockwise(x, R, C, 8, 32, &qb)) return 1;
    double tm[REPS], tc[REPS], tb[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = nl_time_s();
        memcpy(dst, x, n * sizeof(float));
        tm[rep] = nl_time_s() - t0;
        sink = dst[rep];
        t0 = nl_time_s();
        if (nl_quant_absmax_into(x, &qc)) return 1;
        tc[rep] = nl_time_s() - t0;
        sink = (float)qc.codes[rep];
        t0 = nl_time_s();
        if (nl_quant_absmax_into(x, &qb)) return 1;
        tb[rep] = nl_time_s() - t0;
        sink = (float)qb.codes[rep];
    }
    nl_qtensor_free(&qc);
    nl_qtensor_free(&qb);
    double m = median(tm, REPS), c = median(tc, REPS), b = median(tb, REPS);
    double gib = (double)(n * sizeof(float)) / (1 << 30);
    printf("%-26s %7d %10.2f %10.2f %8.2fx   (target >= 0.5x)\n", "int8 per channel", threads, m * 1e3, c * 1e3, m / c);
    printf("%-26s %7d %10.2f %10.2f %8.2fx   (target >= 0.5x)\n", "int8 blockwise-32", threads, m * 1e3, b * 1e3,
           m / b);
    printf("%-26s %7d  memcpy %.1f GiB/s, per channel %.1f GiB/s of fp32 input\n", "", threads, gib / m, gib / c);
    nl_free(x);
    nl_free(dst);
    return 0;
}

static int bench_linear(int64_t M, int64_t K, int threads) {
    const int64_t N = K;
    float *w = nl_malloc((size_t)(N * K) * sizeof(float), "weights");
    float *x = nl_malloc((size_t)(M * K) * sizeof(float), "activations");
    float *y = nl_malloc((size_t)(M * N) * sizeof(float), "output");
    if (!w || !x || !y) return 1;
    nl_rng r;
    nl_rng_seed(&r, 2);
    for (int64_t i = 0; i < N * K; i++) w[i] = 0.02f * (float)nl_rng_normal(&r);
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)nl_rng_normal(&r);
    nl_qlinear l;
    if (nl_qlinear_init(&l, w, N, K, NL_QLINEAR_W8A8)) return 1;
    nl_set_threads(threads);
    /* warm-up both */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x, (int)K, w, (int)K, 0.0f, y,
                (int)N);
    if (nl_qlinear_forward(&l, x, M, y)) return 1;
    double ts[REPS], tq[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        double t0 = nl_time_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, x, (int)K, w, (int)K, 0.0f,
                    y, (int)N);
        ts[rep] = nl_time_s() - t0;
        t0 = nl_time_s();
        if (nl_qlinear_forward(&l, x, M, y)) return 1;
        tq[rep] = nl_time_s() - t0;
    }
    double s = median(ts, REPS), q = median(tq, REPS);
    const char *target = M == 1 ? ">= 3x" : M >= 64 ? ">= 2x" : "-";
    printf("%5lld %5lld %5lld %7d %11.3f %11.3f %8.2fx  %s\n", (long long)M, (long long)K, (long long)N, threads,
           s * 1e3, q * 1e3, s / q, target);
    nl_qlinear_free(&l);
    nl_free(w);
    nl_free(x);
    nl_free(y);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    nl_runtime_reexec(argv); /* its sgemm baseline on OpenBLAS's fastest kernels for this CPU */
    const int all = omp_get_num_procs();
    printf("bench_quant: %d threads available, int8 kernel path %s\n\n", all, nl_qdot_path_name(nl_qdot_auto()));
    printf("(1) quantize a 4096 x 4096 fp32 matrix vs memcpy of the same 64 MiB (medians of %d)\n", REPS);
    printf("%-26s %7s %10s %10s %9s\n", "scheme", "threads", "memcpy ms", "quant ms", "ratio");
    int rc = 0;
    rc |= bench_quantize(1);
    if (all > 1) rc |= bench_quantize(all);
    printf("\n(2) QuantizedLinear W8A8 forward vs cblas_sgemm, y (M, N) = x (M, K) W^T (medians of %d)\n", REPS);
    printf("%5s %5s %5s %7s %11s %11s %9s  %s\n", "M", "K", "N", "threads", "sgemm ms", "w8a8 ms", "speedup", "target");
    const int64_t Ms[] = {1, 16, 64, 256}, Ks[] = {1024, 4096};
    int tcount = all > 1 ? 2 : 1;
    for (int ti = 0; ti < tcount; ti++)
        for (int ki = 0; ki < 2; ki++)
            for (int mi = 0; mi < 4; mi++) rc |= bench_linear(Ms[mi], Ks[ki], ti ? all : 1);
    if (rc) fprintf(stderr, "bench_quant: %s\n", nl_last_error());
    return rc;
}
