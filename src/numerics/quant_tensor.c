/* Quantized-tensor plumbing: allocation, code access, int4 packing, input checks, scheme
 * names, error metrics. The quantizers themselves are in quant.c (course) and quant_mx.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nanolm/quant.h"

int nl_quant_spec_nibbles(const nl_quant_spec *spec) {
    if (spec->kind == NL_QUANT_MX) return spec->mx_elem == NL_MX_E2M1;
    return spec->bits <= 4;
}

nl_status nl_quant_check_spec(const nl_quant_spec *spec) {
    if (spec->kind == NL_QUANT_MX) {
        if ((int)spec->mx_elem < 0 || spec->mx_elem > NL_MX_INT8)
            return nl_fail(NL_ERR_INVALID, "unknown MX element format %d", (int)spec->mx_elem);
        return NL_OK;
    }
    if (spec->kind != NL_QUANT_SYMMETRIC && spec->kind != NL_QUANT_AFFINE)
        return nl_fail(NL_ERR_INVALID, "unknown quantization kind %d", (int)spec->kind);
    if (spec->bits < 2 || spec->bits > 8) return nl_fail(NL_ERR_INVALID, "bits must be 2..8, got %d", spec->bits);
    if (spec->gran == NL_QUANT_PER_BLOCK && spec->block <= 0)
        return nl_fail(NL_ERR_INVALID, "block size must be > 0, got %lld", (long long)spec->block);
    if (spec->gran != NL_QUANT_PER_TENSOR && spec->gran != NL_QUANT_PER_CHANNEL && spec->gran != NL_QUANT_PER_BLOCK)
        return nl_fail(NL_ERR_INVALID, "unknown quantization granularity %d", (int)spec->gran);
    if (spec->kind == NL_QUANT_AFFINE && spec->gran == NL_QUANT_PER_BLOCK)
        return nl_fail(NL_ERR_UNSUPPORTED, "affine quantization is per tensor or per channel, not per block");
    return NL_OK;
}

nl_status nl_qtensor_alloc(nl_qtensor *q, const nl_quant_spec *spec, int64_t rows, int64_t cols) {
    memset(q, 0, sizeof *q);
    NL_TRY(nl_quant_check_spec(spec));
    if (rows <= 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "tensor shape must be positive, got (%lld, %lld)", (long long)rows,
                       (long long)cols);
    q->spec = *spec;
    q->rows = rows;
    q->cols = cols;
    if (spec->kind == NL_QUANT_MX) {
        q->spec.block = 32;
        q->spec.gran = NL_QUANT_PER_BLOCK;
        q->spec.bits = nl_mx_elem_bits(spec->mx_elem);
    }
    switch (q->spec.gran) {
    case NL_QUANT_PER_TENSOR:
        q->group_cols = cols;
        q->groups_per_row = 1;
        q->n_scales = 1;
        break;
    case NL_QUANT_PER_CHANNEL:
        q->group_cols = cols;
        q->groups_per_row = 1;
        q->n_scales = rows;
        break;
    default:
        q->group_cols = q->spec.block;
        q->groups_per_row = (cols + q->spec.block - 1) / q->spec.block;
        q->n_scales = rows * q->groups_per_row;
    }
    q->row_bytes = nl_quant_spec_nibbles(&q->spec) ? (cols + 1) / 2 : cols;
    size_t code_bytes;
    if (nl_mul_overflows((size_t)rows, (size_t)q->row_bytes, &code_bytes))
        return nl_fail(NL_ERR_NOMEM, "quantized tensor (%lld, %lld) too large", (long long)rows, (long long)cols);
    /* Every quantizer writes every code; only nibble rows need a zeroed spare half byte. */
    q->codes = nl_quant_spec_nibbles(&q->spec) ? nl_calloc(code_bytes, 1, "quantized codes")
                                               : nl_malloc(code_bytes, "quantized codes");
    q->scales = nl_calloc((size_t)q->n_scales, sizeof(float), "quantization scales");
    if (q->spec.kind == NL_QUANT_AFFINE)
        q->zero_points = nl_calloc((size_t)q->n_scales, sizeof(int32_t), "quantization zero points");
    if (q->spec.kind == NL_QUANT_MX) q->scale_e8m0 = nl_calloc((size_t)q->n_scales, 1, "MX scales");
    if (!q->codes || !q->scales || (q->spec.kind == NL_QUANT_AFFINE && !q->zero_points) ||
        (q->spec.kind == NL_QUANT_MX && !q->scale_e8m0)) {
        nl_qtensor_free(q);
        return NL_ERR_NOMEM;
    }
    return NL_OK;
}

void nl_qtensor_free(nl_qtensor *q) {
    if (!q) return;
    nl_free(q->codes);
    nl_free(q->scales);
    nl_free(q->zero_points);
    nl_free(q->scale_e8m0);
    q->codes = NULL;
    q->scales = NULL;
    q->zero_points = NULL;
    q->scale_e8m0 = NULL;
}

size_t nl_qtensor_bytes(const nl_qtensor *q) {
    size_t b = (size_t)q->rows * (size_t)q->row_bytes;
    if (q->spec.kind == NL_QUANT_MX) return b + (size_t)q->n_scales; /* one E8M0 byte per block */
    b += (size_t)q->n_scales * sizeof(float);
    if (q->spec.kind == NL_QUANT_AFFINE) b += (size_t)q->n_scales * sizeof(int32_t);
    return b;
}

int64_t nl_qtensor_group(const nl_qtensor *q, int64_t r, int64_t c) {
    switch (q->spec.gran) {
    case NL_QUANT_PER_TENSOR: return 0;
    case NL_QUANT_PER_CHANNEL: return r;
    default: return r * q->groups_per_row + c / q->group_cols;
    }
}

static int codes_signed(const nl_quant_spec *s) {
    if (s->kind == NL_QUANT_AFFINE) return !s->is_unsigned;
    return s->kind == NL_QUANT_SYMMETRIC || (s->kind == NL_QUANT_MX && s->mx_elem == NL_MX_INT8);
}

int32_t nl_qtensor_code(const nl_qtensor *q, int64_t r, int64_t c) {
    const uint8_t *row = q->codes + r * q->row_bytes;
    if (nl_quant_spec_nibbles(&q->spec)) {
        int v = (row[c >> 1] >> ((c & 1) * 4)) & 0xF;
        if (codes_signed(&q->spec) && v >= 8) v -= 16;
        return v;
    }
    return codes_signed(&q->spec) ? (int32_t)(int8_t)row[c] : (int32_t)row[c];
}

void nl_qtensor_set_code(nl_qtensor *q, int64_t r, int64_t c, int32_t v) {
    uint8_t *row = q->codes + r * q->row_bytes;
    if (nl_quant_spec_nibbles(&q->spec)) {
        int sh = (int)(c & 1) * 4;
        row[c >> 1] = (uint8_t)((row[c >> 1] & ~(0xF << sh)) | ((v & 0xF) << sh));
    } else {
        row[c] = (uint8_t)v;
    }
}

void nl_quant_pack_int4(const int8_t *v, size_t n, uint8_t *packed) {
    for (size_t i = 0; i < n / 2; i++) packed[i] = (uint8_t)((v[2 * i] & 0xF) | ((v[2 * i + 1] & 0xF) << 4));
    if (n & 1) packed[n / 2] = (uint8_t)(v[n - 1] & 0xF);
}

void nl_quant_unpack_int4(const uint8_t *packed, size_t n, int8_t *v) {
    for (size_t i = 0; i < n; i++) {
        int x = (packed[i >> 1] >> ((i & 1) * 4)) & 0xF;
        v[i] = (int8_t)(x >= 8 ? x - 16 : x);
    }
}

nl_status nl_quant_check_finite(const float *x, size_t n, const char *what) {
    /* Fast pass without branches; the slow pass only runs to find the index. */
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static) if (n > (1u << 16))
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    if (!bad) return NL_OK;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return nl_fail(NL_ERR_INVALID, "%s: non-finite value %g at index %zu", what ? what : "tensor", (double)x[i],
                           i);
    return NL_OK;
}

/* ---- scheme names --------------------------------------------------------------------------- */

static const char *const MX_NAMES[] = {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e3m2", "mxfp6-e2m3", "mxfp4", "mxint8"};

static nl_status bad_name(const char *name) {
    return nl_fail(NL_ERR_INVALID,
                   "unknown quantization scheme '%s' (valid: int<b>-tensor, int<b>-channel, int<b>-b<block> "
                   "with b = 2..8; affine-int<b>-tensor|channel, affine-uint<b>-tensor|channel; mxfp8 "
                   "(= mxfp8-e4m3), mxfp8-e5m2, mxfp6-e3m2, mxfp6-e2m3, mxfp4, mxint8, each optionally "
                   "ending in -away)",
                   name);
}

/* Parses "<bits>-<gran>" after the "int"/"uint" prefix. */
static nl_status parse_int_tail(const char *name, const char *s, nl_quant_spec *o) {
    char *end;
    long b = strtol(s, &end, 10);
    if (end == s || *end != '-') return bad_name(name);
    if (b < 2 || b > 8) return nl_fail(NL_ERR_INVALID, "scheme '%s': bits must be 2..8, got %ld", name, b);
    o->bits = (int)b;
    const char *g = end + 1;
    if (!strcmp(g, "tensor"))
        o->gran = NL_QUANT_PER_TENSOR;
    else if (!strcmp(g, "channel"))
        o->gran = NL_QUANT_PER_CHANNEL;
    else if (g[0] == 'b' && g[1] >= '0' && g[1] <= '9') {
        long long k = strtoll(g + 1, &end, 10);
        if (*end) return bad_name(name);
        if (k <= 0) return nl_fail(NL_ERR_INVALID, "scheme '%s': block size must be > 0, got %lld", name, k);
        o->gran = NL_QUANT_PER_BLOCK;
        o->block = k;
    } else
        return bad_name(name);
    return NL_OK;
}

nl_status nl_quant_spec_parse(const char *name, nl_quant_spec *out) {
    nl_quant_spec o;
    memset(&o, 0, sizeof o);
    if (!name) return nl_fail(NL_ERR_INVALID, "quantization scheme name is missing");
    if (!strncmp(name, "mx", 2)) {
        char base[32];
        size_t len = strlen(name);
        o.kind = NL_QUANT_MX;
        o.gran = NL_QUANT_PER_BLOCK;
        o.block = 32;
        if (len >= sizeof base) return bad_name(name);
        memcpy(base, name, len + 1);
        if (len > 5 && !strcmp(base + len - 5, "-away")) {
            o.mx_ties = NL_MX_TIES_AWAY;
            base[len - 5] = '\0';
        }
        if (!strcmp(base, "mxfp8")) strcpy(base, "mxfp8-e4m3");
        for (int e = 0; e <= NL_MX_INT8; e++)
            if (!strcmp(base, MX_NAMES[e])) {
                o.mx_elem = (nl_mx_elem)e;
                o.bits = nl_mx_elem_bits(o.mx_elem);
                *out = o;
                return NL_OK;
            }
        return bad_name(name);
    }
    if (!strncmp(name, "affine-", 7)) {
        const char *s = name + 7;
        o.kind = NL_QUANT_AFFINE;
        if (!strncmp(s, "uint", 4)) {
            o.is_unsigned = 1;
            s += 4;
        } else if (!strncmp(s, "int", 3))
            s += 3;
        else
            return bad_name(name);
        NL_TRY(parse_int_tail(name, s, &o));
        if (o.gran == NL_QUANT_PER_BLOCK)
            return nl_fail(NL_ERR_INVALID, "scheme '%s': affine is per tensor or per channel", name);
        *out = o;
        return NL_OK;
    }
    if (!strncmp(name, "int", 3)) {
        o.kind = NL_QUANT_SYMMETRIC;
        NL_TRY(parse_int_tail(name, name + 3, &o));
        *out = o;
        return NL_OK;
    }
    return bad_name(name);
}

const char *nl_quant_spec_name(const nl_quant_spec *s, char *buf, size_t n) {
    if (!n) return buf;
    if (s->kind == NL_QUANT_MX) {
        const char *b = (int)s->mx_elem >= 0 && s->mx_elem <= NL_MX_INT8 ? MX_NAMES[s->mx_elem] : "mx?";
        snprintf(buf, n, "%s%s", b, s->mx_ties == NL_MX_TIES_AWAY ? "-away" : "");
        return buf;
    }
    char g[32];
    if (s->gran == NL_QUANT_PER_TENSOR)
        snprintf(g, sizeof g, "tensor");
    else if (s->gran == NL_QUANT_PER_CHANNEL)
        snprintf(g, sizeof g, "channel");
    else
        snprintf(g, sizeof g, "b%lld", (long long)s->block);
    if (s->kind == NL_QUANT_AFFINE)
        snprintf(buf, n, "affine-%s%d-%s", s->is_unsigned ? "uint" : "int", s->bits, g);
    else
        snprintf(buf, n, "int%d-%s", s->bits, g);
    return buf;
}

nl_status nl_quant_tensor(const float *x, int64_t rows, int64_t cols, const nl_quant_spec *spec, nl_qtensor *out) {
    NL_TRY(nl_quant_check_spec(spec));
    switch (spec->kind) {
    case NL_QUANT_MX: return nl_quant_mx(x, rows, cols, spec->mx_elem, spec->mx_ties, out);
    case NL_QUANT_AFFINE:
        return nl_quant_affine(x, rows, cols, spec->bits, spec->is_unsigned, spec->gran == NL_QUANT_PER_CHANNEL, out);
    default:
        if (spec->gran == NL_QUANT_PER_BLOCK) return nl_quant_blockwise(x, rows, cols, spec->bits, spec->block, out);
        return nl_quant_symmetric(x, rows, cols, spec->bits, spec->gran == NL_QUANT_PER_CHANNEL, out);
    }
}

double nl_quant_mse(const float *x, const float *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        s += d * d;
    }
    return n ? s / (double)n : 0.0;
}

double nl_quant_sqnr_db(const float *x, const float *y, size_t n) {
    double sig = 0, err = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        sig += (double)x[i] * x[i];
        err += d * d;
    }
    if (err == 0) return INFINITY;
    return 10.0 * log10(sig / err);
}
