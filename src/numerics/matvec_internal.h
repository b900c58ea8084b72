/*
 * The layouts and tiles of the decode kernels (matvec.c), internal to numerics/: what
 * include/nanolm/matvec.h promises (formats, exact bits on every path) does not depend on them.
 *
 * Batch 1 reads W once. On every SIMD path (AVX-512, AVX2, NEON) fp32 and bf16 weights are stored
 * in panels of NL_MV_PANEL (48) rows, column by column, and a tile walks one panel (or, for few
 * tokens, two adjacent ones: two sequential streams) front to back against the tokens held in
 * registers (AVX-512: up to 8 tokens against a whole panel; AVX2: up to 2 against a panel or 6
 * against a slice of 16 rows), so a small batch still reads W once from memory; OpenMP threads
 * take two whole panels at a time. int8 on AVX-512 VNNI reads panels too; int8 elsewhere and int4
 * stream W row by row. Portable C reads the rows, in tiles of 4 rows x 4 tokens.
 *
 * The panels of nl_mv_weight (rows past N zero; matvec.c panel_copy and the comment above it):
 *   f32_panels   FP32 on a SIMD path: for each column the 48 rows' values side by side (column 0,
 *                then column 1, ...): a copy beside the borrowed or owned original, read by that
 *                path's kernels instead of f32.
 *   bf16_panels  BF16 on a SIMD path: by pairs of columns, for each pair the 48 rows' two values
 *                side by side (a last odd column's partner zero); the bf16 weight lives here only.
 *   q8_panels    INT8 on the AVX-512 path with VNNI: the codes (k_pad columns) by groups of 4
 *                columns, for each group the 48 rows' 4 codes side by side; the codes live here
 *                only (q8.w NULL).
 * nl_mv_weight_set_path moves panels back into rows for a path without them.
 *
 * INT4 codes (q4): each row holds groups * 16 bytes, byte i of a group holding column i in its
 * low nibble and column i + 16 in its high nibble (code + 8); the bytes of 16 groups are
 * interleaved 4 at a time (chunks of 16 groups cut in 4 slices of 4 bytes per group: matvec.c
 * q4_byte_at) so that one 64-byte load puts each group in its own 32-bit lane, and one chain of
 * dpbusd sums a whole group without a horizontal add. AVX-512 VNNI (dpbusd on the unsigned
 * nibbles against the signed activation codes, minus 8 x the group's activation sum), AVX2 (the
 * same 8 lanes at a time with vpmaddubsw / vpmaddwd) and portable C (also on ARM) sum in the
 * order matvec.h defines. nl_mv_act's q4x holds a token's codes in the same load order: per 128
 * columns, the first 16 of each of the 4 groups, then their last 16.
 */
#ifndef NANOLM_MATVEC_INTERNAL_H
#define NANOLM_MATVEC_INTERNAL_H

/* Rows per panel (f32_panels, bf16_panels, q8_panels). */
#define NL_MV_PANEL 48

/* Columns per INT4 scale. */
#define NL_MV_INT4_GROUP 32

#endif
