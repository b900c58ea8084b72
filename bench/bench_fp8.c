/*
 * Emulated FP8 GEMM speed, one thread: the limited (14-bit, promote 128, block scales)
 * accumulator through its kernels (fastest built = AVX-512 where available, portable C,
 * scalar reference) as a ratio to the fp32-accumulation path of the same call (quantization +
 * cblas_sgemm), measured in the same run, interleaved, median of repetitions. Shapes: the
 * training GEMMs of the shakespeare-char preset (768 tokens x 128 -> 384, and its wgrad with
 * K = 768) and a square-ish 256 x 256 x 2048.
 */
#include <stdio.h>
#include <stdlib.h>

#include "nanolm/base.h"
#include "nanolm/fp8.h"
#include "bench_util.h"

#define REPS 7

static int run_shape(int64_t M, int64_t N, int64_t K, int with_reference) {
    float *A = nl_malloc((size_t)(M * K) * sizeof(float), "bench A");
    float *B = nl_malloc((size_t)(K * N) * sizeof(float), "bench B");
    float *C = nl_malloc((size_t)(M * N) * sizeof(float), "bench C");
    if (!A || !B || !C) {
        fprintf(stderr, "bench_fp8: %s\n", nl_last_error());
        return 1;
    }
    nl_rng r;
    nl_rng_seed(&r, 1);
    for (int64_t i = 0; i < M * K; i++) A[i] = (float)nl_rng_normal(&r);
    for (int64_t i = 0; i < K * N; i++) B[i] = (float)nl_rng_normal(&r);
    const char *names[4] = {"fp32 accumulation (sgemm)", "14-bit, fastest kernel", "14-bit, portable C kernel",
                            "14-bit, scalar reference"};
    const int njobs = with_reference ? 4 : 3;
    double t[4][REPS];
    for (int rep = 0; rep < REPS; rep++)
        for (int j = 0; j < njobs; j++) {
            if (j == 3 && rep >= 3) {
                t[j][rep] = t[j][rep % 3];
                continue;
            } /* slow: 3 repetitions */
            nl_fp8_gemm_opts o;
            nl_fp8_gemm_opts_default(&o); /* block scaling, 14 bits, groups of 32, promote 128 */
            if (j == 0) o.acc.bits = 0;
            o.reference = j == 3 ? 1 : j == 2 ? 2 : 0;
            const double t0 = nl_time_s();
            if (nl_fp8_gemm(&o, M, N, K, A, B, C, NULL)) {
                fprintf(stderr, "bench_fp8: %s\n", nl_last_error());
                return 1;
            }
            t[j][rep] = nl_time_s() - t0;
        }
    printf("M=%lld N=%lld K=%lld (%.2e products)\n", (long long)M, (long long)N, (long long)K, (double)(M * N * K));
    const double base = median(t[0], REPS);
    for (int j = 0; j < njobs; j++) {
        const double m = median(t[j], REPS);
        printf("  %-28s %9.3f ms  %.2e products/s  %6.2fx the fp32-accumulation time\n", names[j], m * 1e3,
               (double)(M * N * K) / m, m / base);
    }
    nl_free(A);
    nl_free(B);
    nl_free(C);
    return 0;
}

int main(int argc, char **argv) {
    (void)argc;
    nl_runtime_reexec(argv); /* its sgemm baseline on OpenBLAS's fastest kernels for this CPU */
    nl_set_threads(1);
    printf("emulated FP8 GEMM, block scaling, E4M3, one thread (median of %d)\n", REPS);
    if (run_shape(768, 384, 128, 1)) return 1;
    if (run_shape(384, 128, 768, 1)) return 1;
    if (run_shape(256, 256, 2048, 0)) return 1;
    return 0;
}
