/* nl_vexpf over arrays, 8 lanes at a time where the CPU has AVX2 (private to the library).
 *
 * GCC does not vectorize a loop that calls nl_vexpf (its clamps and NaN select are "control
 * flow" under -ftrapping-math), so the softmax and SwiGLU loops ran one lane at a time. These
 * kernels do the same operations in the same order on 8 lanes (no FMA contraction: each step
 * of vexp.h is a separate multiply and add, as the scalar code compiles), so every element
 * has the bits of nl_vexpf. Elements that do not fill a vector go through nl_vexpf.
 * The path: AVX2 when nl_isa_has(NL_ISA_AVX2) (the CPU's sets under NANOLM_ISA's cap). */
#ifndef NANOLM_NUMERICS_VEXP_SIMD_H
#define NANOLM_NUMERICS_VEXP_SIMD_H

#include <stdint.h>

/* e[i] = nl_vexpf(x[i] - c), i < n. e may equal x. */
void nl_vexp_shift(float *e, const float *x, float c, int64_t n);
/* e[i] = nl_vexpf(-x[i]), i < n. e may equal x. */
void nl_vexp_neg(float *e, const float *x, int64_t n);
/* Softmax in place of a[0..n) (0 < n <= len), and a[n..len) = 0. On the AVX2 path (len a multiple
 * of 8) the max and the sum go 8 lanes at a time (the sum in lanes, then across), so its bits
 * differ from a sum in order; every element of a[0..len) may be read. */
void nl_vsoftmax_prefix(float *a, int64_t n, int64_t len);
/* 1 when the AVX2 path is in use. */
int nl_vexp_simd_avx2(void);

#endif
