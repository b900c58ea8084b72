/*
 * nanolm quant: absmax (symmetric) and affine quantization per tensor, per channel and per
 * block, int4 codes packed two per byte, and dequantization for every scheme.
 *
 * The grid step is `scale` in the sense of the course and of PyTorch: x ~ q * scale for
 * symmetric codes and x ~ (q - zero_point) * scale for affine ones. Rounding is to nearest
 * with ties to even, computed as round(x * (1/scale)) in fp32 exactly like PyTorch's
 * quantize_per_tensor / quantize_per_channel.
 *
 * A tensor is a row-major (rows, cols) matrix of fp32; a 1-D vector is (1, n). "Per channel"
 * means one scale per row (a 2-D weight (out, in) has one per output channel); "per block"
 * means one scale per run of `block` consecutive values inside a row (the last block of a
 * row may be shorter).
 *
 * Every quantizer rejects NaN or inf with an error naming the first bad index, bits outside
 * 2..8 and block size 0. An all-zero tensor, row or block gets codes 0 and a finite scale.
 */
#ifndef NANOLM_QUANT_H
#define NANOLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_quant_kind {
    NL_QUANT_SYMMETRIC = 0, /* absmax: scale = max|x| / (2^(b-1) - 1), codes in +-(2^(b-1) - 1) */
    NL_QUANT_AFFINE = 1,    /* min/max with a zero point (PyTorch MinMaxObserver, affine) */
    NL_QUANT_MX = 2         /* OCP Microscaling: blocks of 32 with a shared E8M0 scale */
} nl_quant_kind;

typedef enum nl_quant_granularity {
    NL_QUANT_PER_TENSOR = 0,
    NL_QUANT_PER_CHANNEL = 1, /* one scale per row */
    NL_QUANT_PER_BLOCK = 2    /* one scale per `block` consecutive values of a row */
} nl_quant_granularity;

/* MX element formats (OCP Microscaling v1.0, table 1). */
typedef enum nl_mx_elem {
    NL_MX_E4M3 = 0, /* MXFP8 */
    NL_MX_E5M2 = 1, /* MXFP8 */
    NL_MX_E3M2 = 2, /* MXFP6 */
    NL_MX_E2M3 = 3, /* MXFP6 */
    NL_MX_E2M1 = 4, /* MXFP4 */
    NL_MX_INT8 = 5  /* MXINT8: two's complement with an implicit scale 2^-6 */
} nl_mx_elem;

/* What to do with an element that falls exactly half-way between two grid points (MX only;
 * the integer quantizers always round ties to even as PyTorch does). */
typedef enum nl_mx_ties { NL_MX_TIES_EVEN = 0, NL_MX_TIES_AWAY = 1 } nl_mx_ties;

/* A quantization scheme. Build one with nl_quant_spec_parse or fill it by hand. */
typedef struct nl_quant_spec {
    nl_quant_kind kind;
    nl_quant_granularity gran;
    int bits;           /* integer kinds: 2..8; MX: bits of one element (filled by the parser) */
    int64_t block;      /* PER_BLOCK: values per block (> 0); MX: 32 */
    int is_unsigned;    /* AFFINE: codes 0..2^b-1 (quint8) instead of -2^(b-1)..2^(b-1)-1 */
    nl_mx_elem mx_elem; /* MX: element format */
    nl_mx_ties mx_ties; /* MX: tie rule (default even) */
} nl_quant_spec;

/* A quantized (rows, cols) tensor: codes plus one scale (and zero point) per group. */
typedef struct nl_qtensor {
    nl_quant_spec spec;
    int64_t rows, cols;
    int64_t group_cols;     /* values per scale along a row: block (PER_BLOCK, MX) or cols */
    int64_t groups_per_row; /* ceil(cols / group_cols); 1 for per tensor and per channel */
    int64_t n_scales;       /* 1 (tensor), rows (channel), rows * groups_per_row (block, MX) */
    int64_t row_bytes;      /* bytes of codes per row: cols, or ceil(cols / 2) for <= 4-bit codes */
    uint8_t *codes;         /* (rows, row_bytes): int8/uint8 one per byte, or 4-bit nibbles
                               (even column in the low nibble, two's complement when signed) */
    float *scales;          /* (n_scales) grid step; MX: the decoded power of two */
    int32_t *zero_points;   /* (n_scales) AFFINE only, else NULL */
    uint8_t *scale_e8m0;    /* (n_scales) MX only: the shared exponents as E8M0 codes, else NULL */
} nl_qtensor;

/* ---- the course's functions (src/numerics/quant.c; exercises/quant.c is the skeleton) ---- */

/* quantize_symmetric: absmax with `bits` bits per tensor (per_channel = 0) or per row
 * (per_channel = 1): scale = max|x| / (2^(bits-1) - 1), q = round_half_even(x / scale) clamped
 * to +-(2^(bits-1) - 1). Fills *out (free with nl_qtensor_free). x is (rows, cols).
 * Errors: NL_ERR_INVALID for NaN/inf (names the first bad index), bits outside 2..8, a bad
 * shape; NL_ERR_NOMEM. */
nl_status nl_quant_symmetric(const float *x, int64_t rows, int64_t cols, int bits, int per_channel, nl_qtensor *out);

/* The MinMaxObserver affine rule for one group: the range [min, max] is widened to include 0,
 * scale = (max - min) / (qmax - qmin) (at least FLT_EPSILON), zero_point = qmin - round(min /
 * scale) clamped to [qmin, qmax], all in fp32 as PyTorch computes it. NL_ERR_INVALID for a
 * non-finite bound or qmin >= qmax. */
nl_status nl_quant_affine_params(float min, float max, int qmin, int qmax, float *scale, int32_t *zero_point);

/* Codes for a given scale and zero point, as torch.quantize_per_tensor computes them:
 * q[i] = clamp(zero_point + round_half_even(x[i] * (1/scale)), qmin, qmax). NL_ERR_INVALID for
 * NaN/inf in x (names the index), scale <= 0 or non-finite, qmin >= qmax. */
nl_status nl_quant_affine_codes(const float *x, size_t n, float scale, int32_t zero_point, int qmin, int qmax,
                                int32_t *q);

/* quantize_affine: asymmetric codes with a zero point per tensor or per row; signed codes
 * -2^(b-1)..2^(b-1)-1 or unsigned 0..2^b-1. 0.0 is always exactly representable.
 * Errors as nl_quant_symmetric. */
nl_status nl_quant_affine(const float *x, int64_t rows, int64_t cols, int bits, int is_unsigned, int per_channel,
                          nl_qtensor *out);

/* quantize_blockwise: absmax per block of `block` consecutive values of each row (the last
 * block of a row may be partial). Errors as nl_quant_symmetric, plus block <= 0. */
nl_status nl_quant_blockwise(const float *x, int64_t rows, int64_t cols, int bits, int64_t block, nl_qtensor *out);

/* Re-quantizes x, of the same shape, into q, an absmax tensor from nl_quant_symmetric /
 * nl_quant_blockwise (or nl_qtensor_alloc with a symmetric spec), without allocating: for
 * tensors quantized again and again (activations, benchmarks). Errors as nl_quant_symmetric. */
nl_status nl_quant_absmax_into(const float *x, nl_qtensor *q);

/* Dequantizes any nl_qtensor (symmetric, affine, blockwise, MX) into out (rows, cols). */
nl_status nl_quant_dequantize(const nl_qtensor *q, float *out);

/* ---- MX block formats (src/numerics/quant_mx.c) ------------------------------------------- */

/* OCP MX: blocks of 32 consecutive values of a row share the scale 2^(floor(log2(amax)) -
 * emax_elem), stored as E8M0; elements are x / scale rounded to the element format (ties as
 * given) and saturated to its largest finite value. A zero block gets E8M0 code 0 (2^-127).
 * Errors as nl_quant_symmetric. */
nl_status nl_quant_mx(const float *x, int64_t rows, int64_t cols, nl_mx_elem elem, nl_mx_ties ties, nl_qtensor *out);
/* Element format facts: name ("e4m3", ...), bits, emax (exponent of the largest power of two),
 * largest finite value. */
const char *nl_mx_elem_name(nl_mx_elem e);
int nl_mx_elem_bits(nl_mx_elem e);
int nl_mx_elem_emax(nl_mx_elem e);
double nl_mx_elem_max(nl_mx_elem e);
/* Value of element code `code` (without the shared scale). */
float nl_mx_elem_decode(nl_mx_elem e, uint32_t code);

/* ---- helpers (src/numerics/quant_tensor.c) -------------------------------------------------- */

/* Allocates codes and scales of *q for `spec` and shape (rows, cols); 8-bit codes are left
 * uninitialised (every quantizer writes them all), nibble codes and scales are zeroed. Checks bits,
 * block and shape (NL_ERR_INVALID naming the bad value) and memory (NL_ERR_NOMEM). */
nl_status nl_qtensor_alloc(nl_qtensor *q, const nl_quant_spec *spec, int64_t rows, int64_t cols);
void nl_qtensor_free(nl_qtensor *q);
/* Exact bytes the tensor occupies as stored: codes + fp32 scales (1-byte E8M0 for MX) +
 * int32 zero points (affine). */
size_t nl_qtensor_bytes(const nl_qtensor *q);
/* Index into scales / zero_points of element (r, c). */
int64_t nl_qtensor_group(const nl_qtensor *q, int64_t r, int64_t c);
/* Code of element (r, c) as a signed or unsigned integer (4-bit nibbles sign-extended when the
 * codes are signed). */
int32_t nl_qtensor_code(const nl_qtensor *q, int64_t r, int64_t c);
/* Stores code v of element (r, c) (only its low `bits` bits for nibble codes). Not thread safe
 * for two columns of the same byte. */
void nl_qtensor_set_code(nl_qtensor *q, int64_t r, int64_t c, int32_t v);
/* True when the codes of this spec are stored two per byte (<= 4 bits). */
int nl_quant_spec_nibbles(const nl_quant_spec *spec);

/* Packs n signed 4-bit values (each in -8..7) two per byte, element 2i in the low nibble of
 * byte i; ceil(n/2) bytes. Unpack sign-extends. */
void nl_quant_pack_int4(const int8_t *v, size_t n, uint8_t *packed);
void nl_quant_unpack_int4(const uint8_t *packed, size_t n, int8_t *v);

/* Checks x[0..n) for NaN/inf: NL_ERR_INVALID naming `what` and the first bad index. */
nl_status nl_quant_check_finite(const float *x, size_t n, const char *what);
/* Checks bits (2..8) and block (> 0 when per block). */
nl_status nl_quant_check_spec(const nl_quant_spec *spec);

/* Parses a scheme name: "int8-tensor", "int8-channel", "int<b>-b<k>" (symmetric, b = 2..8,
 * block k), "affine-int8-tensor", "affine-uint8-channel" (affine), "mxfp8" (= mxfp8-e4m3),
 * "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "mxint8"; an MX name may end in "-away"
 * for ties away from zero. NL_ERR_INVALID with a message listing the forms for anything else. */
nl_status nl_quant_spec_parse(const char *name, nl_quant_spec *out);
/* Canonical name of a spec into buf (always NUL-terminated); returns buf. */
const char *nl_quant_spec_name(const nl_quant_spec *spec, char *buf, size_t n);
/* Quantizes with any spec (dispatches to the functions above). */
nl_status nl_quant_tensor(const float *x, int64_t rows, int64_t cols, const nl_quant_spec *spec, nl_qtensor *out);

/* Error metrics of a reconstruction: mean squared error and SQNR in dB (10 log10(sum x^2 /
 * sum (x - y)^2); +inf when exact). */
double nl_quant_mse(const float *x, const float *y, size_t n);
double nl_quant_sqnr_db(const float *x, const float *y, size_t n);

#ifdef __cplusplus
}
#endif
#endif
