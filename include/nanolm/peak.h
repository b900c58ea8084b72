/*
 * The machine's own fp32 ceilings, for model FLOPs utilisation (MFU) on a CPU:
 *  - the FMA peak: a kernel that keeps its operands in registers and issues nothing but
 *    independent fused multiply-adds (12 vector accumulators for AVX2, 16 for AVX-512, 8 scalar
 *    ones), so its rate is what the FMA units can do at this clock: 2 FLOPs x lanes per FMA;
 *  - the sgemm rate: OpenBLAS cblas_sgemm on square fp32 matrices, the rate a large GEMM
 *    reaches on this machine, with the rows split over the threads and each thread a
 *    single-threaded sgemm, as the training's linear layers call it.
 * Both are timed on the CPU clock (the threads' CPU time), so that other processes sharing the
 * cores do not lower them: they are what the cores can do, not what they did while shared.
 * The path (scalar, avx2, avx512) is chosen at run time from what the CPU has, capped by
 * NANOLM_ISA=auto|avx512|avx2|scalar.
 */
#ifndef NANOLM_PEAK_H
#define NANOLM_PEAK_H

#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The side of the square sgemm whose rate `nanolm bench machine` and `nanolm train` report. */
#define NL_PEAK_SGEMM_N 1024

typedef enum nl_peak_path { NL_PEAK_AUTO = 0, NL_PEAK_SCALAR, NL_PEAK_AVX2, NL_PEAK_AVX512 } nl_peak_path;

const char *nl_peak_path_name(nl_peak_path p);
/* 1 when this CPU can run path p (NL_PEAK_AUTO and NL_PEAK_SCALAR: always). */
int nl_peak_available(nl_peak_path p);
/* The widest path this CPU has, capped by NANOLM_ISA (an unknown value is treated as auto). */
nl_peak_path nl_peak_auto(void);

/* Runs the register kernel of path p for `iters` iterations; returns a value derived from every
 * accumulator (so that the work cannot be optimised away). */
float nl_peak_fma_kernel(nl_peak_path p, int64_t iters);

/* The fp32 FMA peak in FLOP/s of path p (NL_PEAK_AUTO: nl_peak_auto()) on `threads` OpenMP
 * threads (<= 0: the OpenMP default), each running the kernel at once: the sum of each thread's
 * FLOPs over its CPU time, best of `repeats` timings of at least min_time_s each. NL_ERR_INVALID for a path the CPU lacks or bad counts. */
nl_status nl_peak_fma(nl_peak_path p, int threads, double min_time_s, int repeats, double *flops);

/* OpenBLAS cblas_sgemm of (n, n) x (n, n) on `threads` OpenMP threads (<= 0: the OpenMP
 * default; row blocks, one single-threaded sgemm each), 2 n^3 FLOPs per call over the process's CPU time / threads, best of `repeats` timings
 * of at least min_time_s each, in FLOP/s.
 * NL_ERR_INVALID for n < 16, NL_ERR_NOMEM naming the buffers. */
nl_status nl_peak_sgemm(int64_t n, int threads, double min_time_s, int repeats, double *flops);

/* The ceilings of training's model FLOPs utilisation as `nanolm bench machine` reports them: the
 * fp32 FMA peak of the widest path (nl_peak_auto) and the sgemm rate of NL_PEAK_SGEMM_N, each on
 * one thread and on `threads`. */
typedef struct nl_peak_ceilings {
    nl_peak_path path;
    double fma_1t, fma_nt, sgemm_1t, sgemm_nt; /* FLOP/s */
} nl_peak_ceilings;
nl_status nl_peak_ceilings_measure(int threads, double min_time_s, int repeats, nl_peak_ceilings *out);

#ifdef __cplusplus
}
#endif
#endif
