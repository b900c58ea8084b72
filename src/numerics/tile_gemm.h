/* Small GEMM tiles for the attention of training, up to 6 rows x 16 columns of the output at a time
 * in AVX2 registers (private to the library).
 *
 * A (T, T) attention block at head size 32 is a few hundred thousand multiply-adds: OpenBLAS's
 * packing and its zeroing of C (sgemm_beta) cost as much as the product, and the full square it
 * computes is twice the causal half. These tiles read A through any two strides (a transposed
 * operand costs nothing: its elements are broadcast one at a time) and B by rows, so the
 * attention can run each product on exactly the row blocks and k ranges that its causal mask
 * leaves, without packing. Each output element is a k-ordered chain of FMAs, then times alpha.
 * The path: AVX2 + FMA when nl_isa_has(NL_ISA_AVX2), else a scalar loop with the same sums (a
 * reference, slower than OpenBLAS: the attention keeps its OpenBLAS path where
 * nl_tile_gemm_avx2() is 0). */
#ifndef NANOLM_NUMERICS_TILE_GEMM_H
#define NANOLM_NUMERICS_TILE_GEMM_H

#include <stdint.h>

/* 1 when nl_tile_gemm and nl_tile_transpose take the AVX2 + FMA path (under NANOLM_ISA's cap). */
int nl_tile_gemm_avx2(void);

enum { NL_TILE_MR = 6 }; /* the most rows one call computes in registers */

/* Rows 0..m-1 of C, columns 0..n-1 (n a multiple of 16; m <= NL_TILE_MR for the AVX2 path, any m
 * on the scalar one):
 *   C[i][j] = alpha * sum_{k < kc} a[i*ars + k*acs] * b[k*brs + j]   (acc = 0)
 *   C[i][j] += that                                                 (acc = 1)
 * with C[i][j] at c[i*crs + j]. */
void nl_tile_gemm(float *c, int64_t crs, int64_t m, const float *a, int64_t ars, int64_t acs, const float *b,
                  int64_t brs, int64_t n, int64_t kc, float alpha, int acc);

/* xt (cols, rows) = x (rows, cols; row stride ld) transposed (8 x 8 blocks in AVX2 registers when
 * rows and cols are multiples of 8). */
void nl_tile_transpose(float *xt, const float *x, int64_t rows, int64_t cols, int64_t ld);

#endif
