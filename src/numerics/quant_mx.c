/* OCP Microscaling (MX) v1.0 block formats: MXFP8 (E4M3, E5M2), MXFP6 (E3M2, E2M3), MXFP4
 * (E2M1) and MXINT8. Each block of 32 consecutive values of a row shares one scale
 * X = 2^(floor(log2(amax)) - emax_elem) stored as E8M0; each element is x / X rounded to the
 * element format (ties to even, or away from zero as microsoft/microxcaling does by default)
 * and saturated to the element's largest finite value. The element and scale codes come from
 * the formats module (nl_fmt_encode / nl_fmt_decode). */
#include <math.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/quant.h"

#define MX_BLOCK 32

static const char *const NAMES[] = {"e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8"};
static const nl_format FMT[] = {NL_FMT_E4M3, NL_FMT_E5M2, NL_FMT_E3M2, NL_FMT_E2M3, NL_FMT_E2M1, NL_FMT_INT8};
/* emax_elem: exponent of the largest power of two of the element format (OCP MX v1.0 table 1). */
static const int EMAX[] = {8, 15, 4, 2, 2, 0};
/* MXINT8 elements are two's complement with an implicit scale 2^-6 (values -2 .. 1 63/64);
 * like microxcaling we keep them symmetric, +-127 * 2^-6. */
#define MXINT8_SHIFT 6

static int valid(nl_mx_elem e) { return (unsigned)e <= NL_MX_INT8; }

const char *nl_mx_elem_name(nl_mx_elem e) { return valid(e) ? NAMES[e] : "?"; }
int nl_mx_elem_bits(nl_mx_elem e) { return valid(e) ? nl_fmt_info(FMT[e])->bits : 0; }
int nl_mx_elem_emax(nl_mx_elem e) { return valid(e) ? EMAX[e] : 0; }
double nl_mx_elem_max(nl_mx_elem e) {
    if (!valid(e)) return 0.0;
    if (e == NL_MX_INT8) return 127.0 / (1 << MXINT8_SHIFT);
    return nl_fmt_info(FMT[e])->max_finite;
}

float nl_mx_elem_decode(nl_mx_elem e, uint32_t code) {
    if (!valid(e)) return NAN;
    float v = nl_fmt_decode(FMT[e], code);
    return e == NL_MX_INT8 ? ldexpf(v, -MXINT8_SHIFT) : v;
}

/* One element: v = x / X already computed; returns its code. */
static uint32_t encode_elem(nl_mx_elem e, float v, nl_rounding r) {
    uint32_t code = 0;
    if (e == NL_MX_INT8) {
        v = ldexpf(v, MXINT8_SHIFT);
        v = fminf(fmaxf(v, -127.0f), 127.0f);
    }
    /* Cannot fail: v is finite and saturation is requested. */
    (void)nl_fmt_encode(FMT[e], v, r, NL_OVERFLOW_SATURATE, 0, &code);
    return code;
}

nl_status nl_quant_mx(const float *x, int64_t rows, int64_t cols, nl_mx_elem elem, nl_mx_ties ties, nl_qtensor *out) {
    nl_quant_spec spec = {
        .kind = NL_QUANT_MX, .gran = NL_QUANT_PER_BLOCK, .block = MX_BLOCK, .mx_elem = elem, .mx_ties = ties};
    memset(out, 0, sizeof *out);
    if (!valid(elem)) return nl_fail(NL_ERR_INVALID, "unknown MX element format %d", (int)elem);
    if (ties != NL_MX_TIES_EVEN && ties != NL_MX_TIES_AWAY)
        return nl_fail(NL_ERR_INVALID, "unknown MX tie rule %d", (int)ties);
    spec.bits = nl_mx_elem_bits(elem);
    if (!x || rows <= 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "tensor shape must be positive, got (%lld, %lld)", (long long)rows,
                       (long long)cols);
    NL_TRY(nl_quant_check_finite(x, (size_t)rows * (size_t)cols, "MX quantize input"));
    NL_TRY(nl_qtensor_alloc(out, &spec, rows, cols));
    const nl_rounding rnd = ties == NL_MX_TIES_AWAY ? NL_ROUND_NEAREST_AWAY : NL_ROUND_NEAREST_EVEN;
    const int emax = EMAX[elem];
    nl_qtensor *q = out;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g = 0; g < q->groups_per_row; g++) {
            int64_t c0 = g * MX_BLOCK, n = cols - c0 < MX_BLOCK ? cols - c0 : MX_BLOCK;
            const float *xb = x + r * cols + c0;
            float amax = 0.0f;
            for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(xb[i]));
            int shared = -127; /* a zero block: smallest scale, all elements 0 */
            if (amax > 0.0f) {
                int e2;
                (void)frexpf(amax, &e2); /* amax = m * 2^e2, m in [0.5, 1): floor(log2 amax) = e2 - 1 */
                shared = e2 - 1 - emax;
                if (shared < -127) shared = -127;
                if (shared > 127) shared = 127;
            }
            uint8_t scode = (uint8_t)(shared + 127);
            q->scale_e8m0[r * q->groups_per_row + g] = scode;
            q->scales[r * q->groups_per_row + g] = nl_fmt_decode(NL_FMT_E8M0, scode);
            for (int64_t i = 0; i < n; i++)
                nl_qtensor_set_code(q, r, c0 + i, (int32_t)encode_elem(elem, ldexpf(xb[i], -shared), rnd));
        }
    }
    return NL_OK;
}
