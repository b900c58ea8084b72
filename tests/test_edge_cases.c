/* Numeric edge cases across the numerics: one table of inputs (NaN, +-inf, -0, subnormals,
 * all-zero and constant blocks, huge dynamic range, lengths 0 and 1, shapes that do not divide
 * the block) run through every format (scalar and bulk round/encode/decode), every quantization
 * scheme family (absmax per tensor/channel/block, affine signed/unsigned, MX element formats)
 * and the FP8 recipes (tensor/block/MX scaling, and a 1 x K x 1 GEMM). Each must give a defined
 * result (checked against the documented rule and an error bound that follows from the format)
 * or a clear error (NL_ERR_INVALID with a message naming the bad input). */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/formats.h"
#include "nanolm/fp8.h"
#include "nanolm/quant.h"

#define MAXV 512

typedef struct edge_case {
    const char *name;
    int rows, cols; /* the tensor shape (rows * cols values) */
    float v[MAXV];  /* first values; see fill() for the generated rows */
    int n_given;    /* how many of v are given literally (the rest are generated) */
    int gen;        /* 0: literal only; 1: constant = v[0]; 2: pseudo-random in [-1, 1) */
} edge_case;

static edge_case cases[] = {
    {"nan", 1, 6, {1.0f, -2.0f, 0.5f, NAN, 3.0f, -NAN}, 6, 0},
    {"+inf", 1, 5, {0.25f, 1.0f, -1.0f, 2.0f, INFINITY}, 5, 0},
    {"-inf", 2, 3, {0.25f, 1.0f, -1.0f, -INFINITY, 3.0f, 0.0f}, 6, 0},
    {"-0", 1, 4, {-0.0f, -0.0f, 0.0f, -0.0f}, 4, 0},
    {"subnormals", 1, 5, {FLT_TRUE_MIN, -3 * FLT_TRUE_MIN, FLT_MIN / 2, -FLT_MIN / 1024, 0.0f}, 5, 0},
    {"tiny-amax",
     2,
     4,
     {7 * FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f, 2 * FLT_TRUE_MIN, -5 * FLT_TRUE_MIN, 0.0f, 0.0f, FLT_TRUE_MIN},
     8,
     0},
    {"all-zero", 2, 64, {0.0f}, 1, 1},
    {"constant", 3, 40, {3.25f}, 1, 1},
    {"negative-constant", 1, 32, {-1e-3f}, 1, 1},
    {"huge-range", 1, 8, {3e38f, -3.4e38f, 1e-38f, 1e-30f, 1.0f, -FLT_MAX, 1e-45f, 65504.0f}, 8, 0},
    {"max-finite", 1, 2, {FLT_MAX, -FLT_MAX}, 2, 0},
    {"one-sided-huge", 1, 3, {FLT_MAX, FLT_MAX / 2, 1.0f}, 3, 0},
    {"len0", 1, 0, {0.0f}, 0, 0},
    {"len1", 1, 1, {0.7f}, 1, 0},
    {"ragged-33", 1, 33, {0.0f}, 0, 2},
    {"ragged-129x3", 3, 129, {0.0f}, 0, 2},
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static int64_t numel(const edge_case *c) { return (int64_t)c->rows * c->cols; }

static void fill(const edge_case *c, float *x) {
    uint32_t s = 12345;
    for (int64_t i = 0; i < numel(c); i++) {
        if (i < c->n_given)
            x[i] = c->v[i];
        else if (c->gen == 1)
            x[i] = c->v[0];
        else if (c->gen == 2) {
            s = s * 1664525u + 1013904223u;
            x[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
        } else
            x[i] = 0.0f;
    }
}

static int has_nonfinite(const float *x, int64_t n, int64_t *first) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            *first = i;
            return 1;
        }
    return 0;
}
static int same_bits(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub;
}

/* A clear error: the expected code and a message that names the first bad value, by its flat
 * index or as [row][col] of the (rows, cols) tensor (bad_index < 0: no index to check). */
static void expect_error(nl_status want, nl_status rc, const char *what, const edge_case *c, int64_t bad_index) {
    if (rc != want) fail_msg("%s on %s: expected error %d, got %d (%s)", what, c->name, want, rc, nl_last_error());
    const char *msg = nl_last_error();
    assert_true(msg[0] != '\0');
    if (bad_index >= 0) {
        char idx[32], rc_idx[64];
        snprintf(idx, sizeof idx, "%lld", (long long)bad_index);
        snprintf(rc_idx, sizeof rc_idx, "[%lld][%lld]", (long long)(bad_index / (c->cols ? c->cols : 1)),
                 (long long)(bad_index % (c->cols ? c->cols : 1)));
        if (!strstr(msg, idx) && !strstr(msg, rc_idx))
            fail_msg("%s on %s: message names neither index %s nor %s: %s", what, c->name, idx, rc_idx, msg);
    }
}
static void expect_clear_error(nl_status rc, const char *what, const edge_case *c, int64_t bad_index) {
    expect_error(NL_ERR_INVALID, rc, what, c, bad_index);
}

/* ---- formats ------------------------------------------------------------------------------- */

/* The documented rounding of one value into format f (nl_fmt_round), checked against the rules:
 * NaN stays NaN; -0 keeps its sign where the format has one; +-inf saturate or stay inf per the
 * default overflow policy; a finite value stays within the largest finite value (or becomes inf
 * in an IEEE-overflow format) and lands within half a spacing of x when x is in range. */
static void check_round_value(nl_format f, float x, float r, const char *cname) {
    const nl_format_info *fi = nl_fmt_info(f);
    const char *fn = fi->name;
    if (isnan(x)) {
        if (!isnan(r)) fail_msg("%s %s: NaN rounded to %g", fn, cname, (double)r);
        return;
    }
    if (fi->kind == NL_FMT_KIND_SCALE && x <= 0) {
        if (!isnan(r)) fail_msg("%s %s: %g <= 0 into E8M0 must give NaN, got %g", fn, cname, (double)x, (double)r);
        return;
    }
    if (isinf(x)) {
        double want = fi->saturate_by_default || !fi->has_inf ? fi->max_finite : INFINITY;
        if (fi->kind == NL_FMT_KIND_INT) want = signbit(x) ? fi->max_finite + 1 : fi->max_finite; /* -128..127 */
        if ((double)fabsf(r) != want || signbit(r) != signbit(x))
            fail_msg("%s %s: %g rounded to %g, expected %s%g", fn, cname, (double)x, (double)r, signbit(x) ? "-" : "",
                     want);
        return;
    }
    if (x == 0.0f) {
        if (r != 0.0f) fail_msg("%s %s: zero rounded to %g", fn, cname, (double)r);
        if (fi->kind == NL_FMT_KIND_FLOAT && fi->has_sign && signbit(x) != signbit(r))
            fail_msg("%s %s: the sign of %s0 was lost", fn, cname, signbit(x) ? "-" : "+");
        return;
    }
    if (isinf(r)) {
        if (fi->saturate_by_default || !fi->has_inf || fabs((double)x) <= fi->max_finite)
            fail_msg("%s %s: finite %g rounded to inf", fn, cname, (double)x);
        return;
    }
    double lowest = fi->kind == NL_FMT_KIND_INT ? -(fi->max_finite + 1) : -fi->max_finite; /* int8: -128 */
    if (!isfinite(r) || (double)r > fi->max_finite || (double)r < lowest)
        fail_msg("%s %s: %g rounded to %g, beyond max %g", fn, cname, (double)x, (double)r, fi->max_finite);
    if (fabs((double)x) <= fi->max_finite &&
        fabs((double)x) >= (fi->kind == NL_FMT_KIND_SCALE ? fi->min_subnormal : 0)) {
        double below, above;
        assert_int_equal(nl_fmt_neighbors(f, x, &below, &above), NL_OK);
        double gap = above - below;
        if (fabs((double)r - (double)x) > 0.5 * gap * (1 + 1e-12) && (double)r != below && (double)r != above)
            fail_msg("%s %s: %g rounded to %g, not a neighbour (%g, %g)", fn, cname, (double)x, (double)r, below,
                     above);
    }
}

static void test_formats(void **state) {
    (void)state;
    float x[MAXV], r[MAXV], bulk[MAXV], dec[MAXV];
    uint32_t codes[MAXV];
    int checked = 0;
    for (int ci = 0; ci < NCASES; ci++) {
        const edge_case *c = &cases[ci];
        int64_t n = numel(c);
        fill(c, x);
        for (int f = 0; f < NL_FMT_COUNT; f++) {
            const nl_format_info *fi = nl_fmt_info((nl_format)f);
            for (int64_t i = 0; i < n; i++) {
                r[i] = nl_fmt_round((nl_format)f, x[i]);
                check_round_value((nl_format)f, x[i], r[i], c->name);
                checked++;
            }
            /* Bulk rounding is the scalar rounding, element for element (n = 0 included). */
            memcpy(bulk, x, (size_t)n * sizeof(float));
            assert_int_equal(nl_fmt_round_array((nl_format)f, bulk, (size_t)n), NL_OK);
            for (int64_t i = 0; i < n; i++)
                if (!same_bits(bulk[i], r[i]))
                    fail_msg("%s %s[%lld]: round_array %g != round %g", fi->name, c->name, (long long)i,
                             (double)bulk[i], (double)r[i]);
            /* Bulk encode: NaN into a format without NaN is a clear error naming the index; else
             * decoding the codes gives the rounded values (E8M0 of x <= 0 has no code at all). */
            nl_status rc = nl_fmt_encode_array((nl_format)f, x, (size_t)n, codes);
            int64_t first_nan = -1;
            for (int64_t i = 0; i < n && first_nan < 0; i++)
                if (isnan(x[i])) first_nan = i;
            if (first_nan >= 0 && !fi->has_nan) {
                expect_clear_error(rc, fi->name, c, first_nan);
                continue;
            }
            int nonpositive = 0;
            for (int64_t i = 0; i < n; i++) nonpositive |= fi->kind == NL_FMT_KIND_SCALE && !(x[i] > 0);
            if (nonpositive) {
                /* E8M0 has no code for zero or negatives: a range error naming the value. */
                expect_error(NL_ERR_RANGE, rc, fi->name, c, -1);
                continue;
            }
            if (rc != NL_OK) fail_msg("%s %s: encode_array failed: %s", fi->name, c->name, nl_last_error());
            assert_int_equal(nl_fmt_decode_array((nl_format)f, codes, (size_t)n, dec), NL_OK);
            for (int64_t i = 0; i < n; i++)
                if (!same_bits(dec[i], r[i]) && !(fi->kind == NL_FMT_KIND_INT && dec[i] == r[i]))
                    fail_msg("%s %s[%lld]: decode(encode(%g)) = %g but round = %g", fi->name, c->name, (long long)i,
                             (double)x[i], (double)dec[i], (double)r[i]);
        }
    }
    print_message("formats: %d (case, format, value) roundings checked over %d cases x %d formats\n", checked, NCASES,
                  (int)NL_FMT_COUNT);
}

/* ---- quantization schemes ---------------------------------------------------------------------- */

static const char *schemes[] = {"int8-tensor",        "int8-channel",         "int4-b32", "int2-b16",
                                "affine-int8-tensor", "affine-uint8-channel", "mxfp8",    "mxfp8-e5m2",
                                "mxfp6-e3m2",         "mxfp6-e2m3",           "mxfp4",    "mxint8"};
#define NSCHEMES (int)(sizeof schemes / sizeof schemes[0])

/* Mantissa bits of an MX element (the relative error bound 2^-m of a block's largest value). */
static int mx_man_bits(nl_mx_elem e) {
    switch (e) {
    case NL_MX_E4M3: return 3;
    case NL_MX_E5M2: return 2;
    case NL_MX_E3M2: return 2;
    case NL_MX_E2M3: return 3;
    case NL_MX_E2M1: return 1;
    case NL_MX_INT8: return 6;
    }
    return 0;
}

static void test_quant(void **state) {
    (void)state;
    static float x[MAXV], y[MAXV];
    static double gmax[MAXV];
    int ok = 0, refused = 0;
    for (int ci = 0; ci < NCASES; ci++) {
        const edge_case *c = &cases[ci];
        int64_t n = numel(c), bad = -1;
        fill(c, x);
        int nonfinite = has_nonfinite(x, n, &bad);
        for (int si = 0; si < NSCHEMES; si++) {
            nl_quant_spec spec;
            assert_int_equal(nl_quant_spec_parse(schemes[si], &spec), NL_OK);
            nl_qtensor q;
            memset(&q, 0, sizeof q);
            nl_status rc = nl_quant_tensor(x, c->rows, c->cols, &spec, &q);
            if (n == 0) { /* an empty tensor is a clear error naming the shape */
                expect_clear_error(rc, schemes[si], c, -1);
                assert_non_null(strstr(nl_last_error(), "shape"));
                refused++;
                continue;
            }
            if (nonfinite) {
                expect_clear_error(rc, schemes[si], c, bad);
                nl_qtensor_free(&q);
                refused++;
                continue;
            }
            /* Affine: a range (0 included) wider than FLT_MAX has no finite fp32 scale. */
            double lo = 0, hi = 0;
            for (int64_t i = 0; i < n; i++) {
                lo = fmin(lo, x[i]);
                hi = fmax(hi, x[i]);
            }
            if (spec.kind == NL_QUANT_AFFINE && hi - lo > FLT_MAX) {
                expect_clear_error(rc, schemes[si], c, -1);
                assert_non_null(strstr(nl_last_error(), "wider than fp32"));
                nl_qtensor_free(&q);
                refused++;
                continue;
            }
            if (rc != NL_OK) fail_msg("%s on %s: %s", schemes[si], c->name, nl_last_error());
            assert_int_equal(nl_quant_dequantize(&q, y), NL_OK);
            for (int64_t g = 0; g < q.n_scales; g++) {
                if (!(q.scales[g] > 0) || !isfinite(q.scales[g]))
                    fail_msg("%s on %s: scale %lld is %g", schemes[si], c->name, (long long)g, (double)q.scales[g]);
                gmax[g] = 0;
            }
            for (int64_t r = 0; r < c->rows; r++)
                for (int64_t k = 0; k < c->cols; k++) {
                    int64_t g = nl_qtensor_group(&q, r, k);
                    if (fabs((double)x[r * c->cols + k]) > gmax[g]) gmax[g] = fabs((double)x[r * c->cols + k]);
                }
            for (int64_t r = 0; r < c->rows; r++)
                for (int64_t k = 0; k < c->cols; k++) {
                    int64_t i = r * c->cols + k, g = nl_qtensor_group(&q, r, k);
                    double xv = x[i], yv = y[i], s = q.scales[g], bound;
                    if (!isfinite(yv))
                        fail_msg("%s on %s[%lld]: dequantized %g", schemes[si], c->name, (long long)i, yv);
                    if (xv == 0 && yv != 0)
                        fail_msg("%s on %s[%lld]: zero came back as %g", schemes[si], c->name, (long long)i, yv);
                    /* MX: 2^-m of the block's largest value, or half the element grid's smallest
                     * step (<= 0.5) when the E8M0 scale was clamped at 2^-127 (tiny blocks). */
                    if (spec.kind == NL_QUANT_MX)
                        bound = fmax(gmax[g] * ldexp(1.0, -mx_man_bits(spec.mx_elem)), 0.5 * s);
                    else
                        bound = 0.5 * s;
                    /* fp32 rounding of x * (1/scale) and of code * scale: a few ulps of the values. */
                    bound = bound * (1 + 1e-6) + 4 * FLT_EPSILON * fmax(fabs(xv), gmax[g]) + FLT_TRUE_MIN;
                    if (fabs(yv - xv) > bound)
                        fail_msg("%s on %s[%lld]: %g came back as %g (error %g > bound %g, scale %g)", schemes[si],
                                 c->name, (long long)i, xv, yv, fabs(yv - xv), bound, s);
                }
            nl_qtensor_free(&q);
            ok++;
        }
    }
    print_message("quant: %d (case, scheme) pairs quantized within bounds, %d refused with a clear error\n", ok,
                  refused);
}

/* ---- FP8 ------------------------------------------------------------------------------------------ */

static void test_fp8(void **state) {
    (void)state;
    static float x[MAXV], y[MAXV], ones[MAXV];
    static double ref[4];
    const nl_format fmts[2] = {NL_FMT_E4M3, NL_FMT_E5M2};
    const nl_fp8_scaling scalings[3] = {NL_FP8_SCALE_TENSOR, NL_FP8_SCALE_BLOCK, NL_FP8_SCALE_MX};
    int ok = 0, refused = 0;
    for (int i = 0; i < MAXV; i++) ones[i] = 1.0f;
    for (int ci = 0; ci < NCASES; ci++) {
        const edge_case *c = &cases[ci];
        int64_t n = numel(c), bad = -1;
        fill(c, x);
        int nonfinite = has_nonfinite(x, n, &bad);
        double amax = 0;
        for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs((double)x[i]));
        for (int fi = 0; fi < 2; fi++)
            for (int si = 0; si < 3; si++) {
                char what[64];
                snprintf(what, sizeof what, "fp8 %s/%s", nl_fmt_name(fmts[fi]), nl_fp8_scaling_name(scalings[si]));
                nl_fp8_operand_stats st;
                nl_status rc = nl_fp8_quantize(fmts[fi], scalings[si], NULL, c->rows, c->cols, 1, x, y, &st);
                if (n == 0 || nonfinite) {
                    expect_clear_error(rc, what, c, n == 0 ? -1 : bad);
                    refused++;
                } else {
                    if (rc != NL_OK) fail_msg("%s on %s: %s", what, c->name, nl_last_error());
                    int m = nl_fmt_info(fmts[fi])->man_bits;
                    for (int64_t i = 0; i < n; i++) {
                        double xv = x[i], yv = y[i];
                        if (!isfinite(yv))
                            fail_msg("%s on %s[%lld]: %g became %g", what, c->name, (long long)i, xv, yv);
                        if (xv == 0 && yv != 0)
                            fail_msg("%s on %s[%lld]: zero became %g", what, c->name, (long long)i, yv);
                        /* 2^-m of the largest value, or half the smallest FP8 step after scaling
                         * when the scale could not grow enough (MX's E8M0 stops at 2^127). */
                        double step0 = nl_fmt_info(fmts[fi])->min_subnormal / st.scale_min;
                        double bound = fmax(amax * ldexp(1.0, -m), 0.5 * step0) * (1 + 1e-6) + FLT_TRUE_MIN;
                        if (fabs(yv - xv) > bound)
                            fail_msg("%s on %s[%lld]: %g became %g (error %g > %g)", what, c->name, (long long)i, xv,
                                     yv, fabs(yv - xv), bound);
                    }
                    if (scalings[si] != NL_FP8_SCALE_MX && st.saturated != 0)
                        fail_msg("%s on %s: %lld values saturated under current-amax scaling", what, c->name,
                                 (long long)st.saturated);
                    ok++;
                }
                /* The GEMM: each row of x times a vector of ones, (1, K) . (K, 1), K = cols. */
                if (c->rows < 1 || c->cols > MAXV) continue;
                nl_fp8_gemm_opts o;
                nl_fp8_gemm_opts_default(&o);
                o.fmt_a = o.fmt_b = fmts[fi];
                o.scaling = scalings[si];
                float out = -1.0f;
                rc = nl_fp8_gemm(&o, 1, 1, c->cols, x, ones, &out, NULL);
                int64_t bad_row0 = -1;
                if (c->cols == 0) {
                    expect_clear_error(rc, what, c, -1);
                } else if (has_nonfinite(x, c->cols, &bad_row0)) {
                    expect_clear_error(rc, what, c, -1);
                    assert_true(out == -1.0f); /* C untouched on error */
                } else {
                    if (rc != NL_OK) fail_msg("%s GEMM on %s: %s", what, c->name, nl_last_error());
                    nl_fp8_gemm_ref_f64(1, 1, c->cols, x, ones, ref);
                    if (fabs(ref[0]) < FLT_MAX / 2 && !isfinite(out))
                        fail_msg("%s GEMM on %s: sum %g came out as %g", what, c->name, ref[0], (double)out);
                }
            }
    }
    print_message("fp8: %d (case, format, scaling) quantizations within bounds, %d refused with a clear error\n", ok,
                  refused);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_quant),
        cmocka_unit_test(test_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
