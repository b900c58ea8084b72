/* Threading of the model's matmuls (private to src/model).
 *
 * The model's matrices are small (shakespeare-char: 768 x 128 activations against 128 x 704
 * weights), so the step is a few hundred sgemm calls and short elementwise loops. Two thread
 * pools for that (OpenMP for the loops, OpenBLAS's own pthreads for the GEMMs) cost more than
 * they give on a few cores: OpenBLAS's idle threads spin in sched_yield while the OpenMP loops
 * run, and every handover wakes a sleeping pool. So the model runs ONE pool, OpenMP: a GEMM is
 * split into blocks of output rows, one per OpenMP thread, and each block is a single-threaded
 * cblas_sgemm. OpenBLAS is set to one thread around such a region (nl_blas_serial_begin/end)
 * and restored afterwards, so other code keeps its OpenBLAS threads.
 *
 * K is never split (each element of C is one thread's dot product) and the row split depends
 * only on the thread count, so results are deterministic for a given thread count.
 */
#ifndef NANOLM_MODEL_GEMM_H
#define NANOLM_MODEL_GEMM_H

#include <cblas.h>
#include <omp.h>
#include <stdint.h>

/* GEMMs with fewer multiply-adds than this run as one call on the calling thread (a parallel
 * region costs a few microseconds; OpenBLAS runs such sizes single-threaded anyway). */
#define NL_GEMM_PAR_MIN_MACS (1 << 17)

/* Sets OpenBLAS to one thread for a region where OpenMP threads call sgemm side by side;
 * returns the previous count for nl_blas_serial_end. */
static inline int nl_blas_serial_begin(void) {
    int n = openblas_get_num_threads();
    if (n > 1) openblas_set_num_threads(1);
    return n;
}

static inline void nl_blas_serial_end(int n) {
    if (n > 1) openblas_set_num_threads(n);
}

/* Part `part` of `nparts` of C (M, N) = alpha op(A) op(B) + beta C (row-major, op(A) (M, K),
 * op(B) (K, N)): the rows [m0, m1) of C, with m0, m1 multiples of 16 (OpenBLAS's row tile)
 * except at the end. Call it from each thread of a team with part = thread number. */
static inline void nl_gemm_rows(int part, int nparts, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M,
                                int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                                int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t per = ((M + nparts - 1) / nparts + 15) / 16 * 16;
    int64_t m0 = part * per, m1 = m0 + per < M ? m0 + per : M;
    if (m0 >= m1) return;
    /* row m of op(A) is row m of A, or column m of A when transposed */
    const float *Am = ta == CblasNoTrans ? A + m0 * lda : A + m0;
    cblas_sgemm(CblasRowMajor, ta, tb, (int)(m1 - m0), (int)N, (int)K, alpha, Am, (int)lda, B, (int)ldb, beta,
                C + m0 * ldc, (int)ldc);
}

/* Whether a GEMM of M*N*K multiply-adds is worth an OpenMP region of its own. */
static inline int nl_gemm_parallel(int64_t M, int64_t N, int64_t K) {
    return M * N * K >= NL_GEMM_PAR_MIN_MACS && omp_get_max_threads() > 1 && !omp_in_parallel();
}

#endif
