/* OpenBLAS inside OpenMP regions (private to src/model).
 *
 * Where OpenMP threads each run their own small sgemm calls side by side (attention: one task
 * per (batch, head)), OpenBLAS must not start its own threads as well: a 256 x 256 x 64 head
 * GEMM (the `small` preset) is above OpenBLAS's threading threshold, and two pools on the same
 * cores would oversubscribe them. nl_blas_serial_begin sets OpenBLAS to one thread for such a
 * region and returns the previous count; nl_blas_serial_end restores it, so the linear layers'
 * large GEMMs outside these regions keep OpenBLAS's threads. Setting the count is a store of an
 * integer when it does not grow past the threads OpenBLAS has already started.
 */
#ifndef NANOLM_MODEL_BLAS_SERIAL_H
#define NANOLM_MODEL_BLAS_SERIAL_H

#include <cblas.h>

static inline int nl_blas_serial_begin(void) {
    int n = openblas_get_num_threads();
    if (n > 1) openblas_set_num_threads(1);
    return n;
}

static inline void nl_blas_serial_end(int n) {
    if (n > 1) openblas_set_num_threads(n);
}

#endif
