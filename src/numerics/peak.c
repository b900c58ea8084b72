/*
 * The fp32 FMA peak and the sgemm rate of this machine (see nanolm/peak.h).
 *
 * Each register kernel updates independent accumulators acc = acc * a + b: every accumulator is
 * its own dependency chain, and there are more chains than FMA units x FMA latency (Zen 3 and
 * Skylake-X: 2 units, 4 cycles: 8 chains), so the units never wait for a result. a and b are
 * read from volatile memory so that nothing is folded at compile time, and the kernel returns
 * the sum of its accumulators so that nothing is dropped.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PEAK_X86 1
#endif

#include "nanolm/isa.h"
#include "nanolm/peak.h"

const char *nl_peak_path_name(nl_peak_path p) {
    switch (p) {
    case NL_PEAK_AUTO: return "auto";
    case NL_PEAK_SCALAR: return "scalar";
    case NL_PEAK_AVX2: return "avx2";
    case NL_PEAK_AVX512: return "avx512";
    default: return "?";
    }
}

/* The sets of nanolm/isa.h: the CPU's under NANOLM_ISA's cap. */
int nl_peak_available(nl_peak_path p) {
    switch (p) {
    case NL_PEAK_AUTO:
    case NL_PEAK_SCALAR: return 1;
#ifdef PEAK_X86
    case NL_PEAK_AVX2: return nl_isa_has(NL_ISA_AVX2);
    case NL_PEAK_AVX512: return nl_isa_has(NL_ISA_AVX512);
#endif
    default: return 0;
    }
}

nl_peak_path nl_peak_auto(void) {
    for (int p = NL_PEAK_AVX512; p > NL_PEAK_SCALAR; p--)
        if (nl_peak_available((nl_peak_path)p)) return (nl_peak_path)p;
    return NL_PEAK_SCALAR;
}

static int peak_lanes(nl_peak_path p) { return p == NL_PEAK_AVX512 ? 16 : p == NL_PEAK_AVX2 ? 8 : 1; }
static int peak_fma_per_iter(nl_peak_path p) { return p == NL_PEAK_AVX512 ? 16 : p == NL_PEAK_AVX2 ? 12 : 8; }

static volatile float peak_a = 0.999999f, peak_b = 1e-7f, peak_sink;

static float fma_scalar(int64_t iters) {
    float a = peak_a, b = peak_b;
    float c0 = 1, c1 = 2, c2 = 3, c3 = 4, c4 = 5, c5 = 6, c6 = 7, c7 = 8;
    for (int64_t i = 0; i < iters; i++) {
        c0 = c0 * a + b;
        c1 = c1 * a + b;
        c2 = c2 * a + b;
        c3 = c3 * a + b;
        c4 = c4 * a + b;
        c5 = c5 * a + b;
        c6 = c6 * a + b;
        c7 = c7 * a + b;
    }
    return c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
}

#ifdef PEAK_X86
__attribute__((target("avx2,fma"))) static float fma_avx2(int64_t iters) {
    __m256 a = _mm256_set1_ps(peak_a), b = _mm256_set1_ps(peak_b);
    __m256 c[12];
    for (int j = 0; j < 12; j++) c[j] = _mm256_set1_ps((float)(j + 1));
    for (int64_t i = 0; i < iters; i++) {
        c[0] = _mm256_fmadd_ps(c[0], a, b);
        c[1] = _mm256_fmadd_ps(c[1], a, b);
        c[2] = _mm256_fmadd_ps(c[2], a, b);
        c[3] = _mm256_fmadd_ps(c[3], a, b);
        c[4] = _mm256_fmadd_ps(c[4], a, b);
        c[5] = _mm256_fmadd_ps(c[5], a, b);
        c[6] = _mm256_fmadd_ps(c[6], a, b);
        c[7] = _mm256_fmadd_ps(c[7], a, b);
        c[8] = _mm256_fmadd_ps(c[8], a, b);
        c[9] = _mm256_fmadd_ps(c[9], a, b);
        c[10] = _mm256_fmadd_ps(c[10], a, b);
        c[11] = _mm256_fmadd_ps(c[11], a, b);
    }
    __m256 s = c[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, c[j]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

__attribute__((target("avx512f,fma"))) static float fma_avx512(int64_t iters) {
    __m512 a = _mm512_set1_ps(peak_a), b = _mm512_set1_ps(peak_b);
    __m512 c[16];
    for (int j = 0; j < 16; j++) c[j] = _mm512_set1_ps((float)(j + 1));
    for (int64_t i = 0; i < iters; i++) {
        c[0] = _mm512_fmadd_ps(c[0], a, b);
        c[1] = _mm512_fmadd_ps(c[1], a, b);
        c[2] = _mm512_fmadd_ps(c[2], a, b);
        c[3] = _mm512_fmadd_ps(c[3], a, b);
        c[4] = _mm512_fmadd_ps(c[4], a, b);
        c[5] = _mm512_fmadd_ps(c[5], a, b);
        c[6] = _mm512_fmadd_ps(c[6], a, b);
        c[7] = _mm512_fmadd_ps(c[7], a, b);
        c[8] = _mm512_fmadd_ps(c[8], a, b);
        c[9] = _mm512_fmadd_ps(c[9], a, b);
        c[10] = _mm512_fmadd_ps(c[10], a, b);
        c[11] = _mm512_fmadd_ps(c[11], a, b);
        c[12] = _mm512_fmadd_ps(c[12], a, b);
        c[13] = _mm512_fmadd_ps(c[13], a, b);
        c[14] = _mm512_fmadd_ps(c[14], a, b);
        c[15] = _mm512_fmadd_ps(c[15], a, b);
    }
    __m512 s = c[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_ps(s, c[j]);
    return _mm512_reduce_add_ps(s);
}
#endif

float nl_peak_fma_kernel(nl_peak_path p, int64_t iters) {
    if (p == NL_PEAK_AUTO) p = nl_peak_auto();
#ifdef PEAK_X86
    if (p == NL_PEAK_AVX512 && nl_peak_available(p)) return fma_avx512(iters);
    if (p == NL_PEAK_AVX2 && nl_peak_available(p)) return fma_avx2(iters);
#endif
    return fma_scalar(iters);
}

/* Seconds of CPU time used by this thread / by the whole process. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double process_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* FLOP/s of `threads` threads each running `iters` iterations at once: each thread's FLOPs over
 * its own CPU time, added up. On a machine shared with other processes, a thread's wall time
 * counts the time it waited for a core; its CPU time does not. */
static double fma_run(nl_peak_path p, int threads, int64_t iters) {
    double per = 2.0 * peak_lanes(p) * peak_fma_per_iter(p) * (double)iters, rate = 0;
    float s = 0;
#pragma omp parallel num_threads(threads) reduction(+ : s, rate)
    {
        double t0 = thread_cpu_s();
        s += nl_peak_fma_kernel(p, iters);
        double dt = thread_cpu_s() - t0;
        rate += per / (dt > 1e-9 ? dt : 1e-9);
    }
    peak_sink = s;
    return rate;
}

nl_status nl_peak_fma(nl_peak_path p, int threads, double min_time_s, int repeats, double *flops) {
    if (p == NL_PEAK_AUTO) p = nl_peak_auto();
    if (!nl_peak_available(p))
        return nl_fail(NL_ERR_INVALID, "FMA peak: this CPU has no %s path", nl_peak_path_name(p));
    if (threads <= 0) threads = nl_threads();
    if (!(min_time_s > 0) || repeats < 1)
        return nl_fail(NL_ERR_INVALID, "FMA peak: time %g s and repeats %d must be positive", min_time_s, repeats);
    /* iterations for min_time_s on one thread, from a timing of at least a millisecond */
    int64_t iters = 1 << 12;
    double dt;
    for (;;) {
        double t0 = thread_cpu_s();
        peak_sink = nl_peak_fma_kernel(p, iters);
        dt = thread_cpu_s() - t0;
        if (dt >= 1e-3 || iters >= ((int64_t)1 << 40)) break;
        iters *= 2;
    }
    if (dt < min_time_s) iters = (int64_t)((double)iters * min_time_s / dt) + 1;
    double best = 0;
    for (int r = 0; r < repeats; r++) {
        double f = fma_run(p, threads, iters);
        if (f > best) best = f;
    }
    *flops = best;
    return NL_OK;
}

nl_status nl_peak_sgemm(int64_t n, int threads, double min_time_s, int repeats, double *flops) {
    if (n < 16 || n > 8192) return nl_fail(NL_ERR_INVALID, "sgemm rate: size %lld outside [16, 8192]", (long long)n);
    if (!(min_time_s > 0) || repeats < 1)
        return nl_fail(NL_ERR_INVALID, "sgemm rate: time %g s and repeats %d must be positive", min_time_s, repeats);
    if (threads <= 0) threads = nl_threads();
    size_t nn = (size_t)(n * n);
    float *a = nl_malloc(3 * nn * sizeof(float), "sgemm rate matrices");
    if (!a) return NL_ERR_NOMEM;
    float *b = a + nn, *c = b + nn;
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)((i * 7 + 3) % 17) * 0.0625f - 0.5f;
        b[i] = (float)((i * 5 + 1) % 13) * 0.0625f - 0.375f;
    }
    /* rows split over the OpenMP threads, each a single-threaded sgemm, as the training's linears
     * run (model.c); OpenBLAS's own threads stay off (under an address-space limit they cannot
     * start: nl_blas_guard) */
    int saved = openblas_get_num_threads();
    if (saved > 1) openblas_set_num_threads(1);
    int calls = 1;
    double best = 0;
    for (int r = -1; r < repeats; r++) { /* r = -1: warm-up and the number of calls per timing */
        double t0 = process_cpu_s();
        for (int k = 0; k < calls; k++) {
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1)
            for (int i = 0; i < threads; i++) {
                int64_t r0 = n * i / threads, r1 = n * (i + 1) / threads;
                if (r1 > r0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(r1 - r0), (int)n, (int)n, 1.0f,
                                a + r0 * n, (int)n, b, (int)n, 0.0f, c + r0 * n, (int)n);
            }
        }
        double dt = (process_cpu_s() - t0) / threads; /* the CPU time of `threads` cores */
        if (r < 0) {
            calls = dt >= min_time_s ? 1 : (int)(min_time_s / (dt > 1e-7 ? dt : 1e-7)) + 1;
            continue;
        }
        double f = 2.0 * (double)n * (double)n * (double)n * calls / dt;
        if (f > best) best = f;
    }
    if (saved > 1) openblas_set_num_threads(saved);
    nl_free(a);
    *flops = best;
    return NL_OK;
}

nl_status nl_peak_ceilings_measure(int threads, double min_time_s, int repeats, nl_peak_ceilings *out) {
    out->path = nl_peak_auto();
    NL_TRY(nl_peak_fma(out->path, 1, min_time_s, repeats, &out->fma_1t));
    NL_TRY(nl_peak_fma(out->path, threads, min_time_s, repeats, &out->fma_nt));
    NL_TRY(nl_peak_sgemm(NL_PEAK_SGEMM_N, 1, min_time_s, repeats, &out->sgemm_1t));
    return nl_peak_sgemm(NL_PEAK_SGEMM_N, threads, min_time_s, repeats, &out->sgemm_nt);
}
