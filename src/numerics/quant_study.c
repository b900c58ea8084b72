/* Two small studies of absmax quantization (nanolm/quant_study.h): the course's four-value
 * example and the damage one outlier row does per tensor, per channel and per block. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nanolm/quant_study.h"

void nl_quant_demo_free(nl_quant_demo *d) {
    for (int s = 0; s < 3; s++) nl_qtensor_free(&d->st[s].q);
}

nl_status nl_quant_demo_run(nl_quant_demo *d) {
    memset(d, 0, sizeof *d);
    const nl_quant_demo_step st[3] = {
        {"int8 absmax per tensor", {0.3f, -0.5f, 0.12f, 1.5f}, 0, {.spec = {0}}, {0}},
        {"outlier 30 instead of 1.5", {0.3f, -0.5f, 0.12f, 30.0f}, 0, {.spec = {0}}, {0}},
        {"blocks of 2, one scale each", {0.3f, -0.5f, 0.12f, 30.0f}, 2, {.spec = {0}}, {0}},
    };
    memcpy(d->st, st, sizeof st);
    for (int s = 0; s < 3; s++) {
        nl_quant_demo_step *x = &d->st[s];
        nl_status rc =
            x->block ? nl_quant_blockwise(x->x, 1, 4, 8, x->block, &x->q) : nl_quant_symmetric(x->x, 1, 4, 8, 0, &x->q);
        if (!rc) rc = nl_quant_dequantize(&x->q, x->back);
        if (rc) {
            nl_quant_demo_free(d);
            return rc;
        }
    }
    for (int q = -127; q <= 127; q++)
        if (fabsf((float)q * d->st[1].q.scales[0]) <= 0.5f) {
            if (!d->levels) d->lo = q;
            d->hi = q;
            d->levels++;
        }
    return NL_OK;
}

/* Quantizes w (rows, cols) with each scheme and measures the error; y is scratch of the same size. */
static nl_status outliers_run(const float *w, float *y, int64_t rows, int64_t cols, int bits, int64_t orow,
                              nl_quant_outlier_row *sch, int ns) {
    size_t n = (size_t)(rows * cols);
    for (int s = 0; s < ns; s++) {
        nl_qtensor q;
        NL_TRY(sch[s].g == NL_QUANT_PER_BLOCK
                   ? nl_quant_blockwise(w, rows, cols, bits, sch[s].block, &q)
                   : nl_quant_symmetric(w, rows, cols, bits, sch[s].g == NL_QUANT_PER_CHANNEL, &q));
        nl_status st = nl_quant_dequantize(&q, y);
        sch[s].bytes = nl_qtensor_bytes(&q);
        nl_qtensor_free(&q);
        NL_TRY(st);
        sch[s].mse = nl_quant_mse(w, y, n);
        sch[s].sqnr = nl_quant_sqnr_db(w, y, n);
        /* Error on the ordinary rows only: what the outlier did to its neighbours. */
        double e = 0;
        for (int64_t i = 0; i < rows; i++)
            if (i != orow) e += nl_quant_mse(w + i * cols, y + i * cols, (size_t)cols) * (double)cols;
        sch[s].mse_rest = e / (double)((rows - 1) * cols);
    }
    return NL_OK;
}

nl_status nl_quant_outlier_study(int64_t rows, int64_t cols, int bits, double factor, uint64_t seed,
                                 nl_quant_outlier_row out[NL_QUANT_OUTLIER_SCHEMES]) {
    const int64_t orow = NL_QUANT_OUTLIER_ROW;
    if (rows <= orow || cols < 1)
        return nl_fail(NL_ERR_INVALID, "quant outliers: a (%lld, %lld) matrix has no row %lld", (long long)rows,
                       (long long)cols, (long long)orow);
    const nl_quant_outlier_row sch[NL_QUANT_OUTLIER_SCHEMES] = {{"per tensor", NL_QUANT_PER_TENSOR, 0, 0, 0, 0, 0},
                                                                {"per channel", NL_QUANT_PER_CHANNEL, 0, 0, 0, 0, 0},
                                                                {"per block 32", NL_QUANT_PER_BLOCK, 32, 0, 0, 0, 0},
                                                                {"per block 64", NL_QUANT_PER_BLOCK, 64, 0, 0, 0, 0},
                                                                {"per block 128", NL_QUANT_PER_BLOCK, 128, 0, 0, 0, 0}};
    memcpy(out, sch, sizeof sch);
    size_t n = (size_t)(rows * cols);
    float *w = nl_malloc(n * sizeof(float), "weight matrix"), *y = nl_malloc(n * sizeof(float), "reconstruction");
    nl_status st = w && y ? NL_OK : NL_ERR_NOMEM;
    if (!st) {
        nl_rng r;
        nl_rng_seed(&r, seed);
        for (size_t i = 0; i < n; i++) w[i] = (float)(0.02 * nl_rng_normal(&r));
        for (int64_t j = 0; j < cols; j++) w[orow * cols + j] *= (float)factor;
        st = outliers_run(w, y, rows, cols, bits, orow, out, NL_QUANT_OUTLIER_SCHEMES);
    }
    nl_free(w);
    nl_free(y);
    return st;
}

nl_status nl_quant_values_spec(const char *name, int64_t block, nl_quant_spec *spec) {
    char full[64];
    int bits;
    char tail;
    if (!strcmp(name, "affine")) {
        if (block) return nl_fail(NL_ERR_INVALID, "--block needs an absmax scheme (int8, int4, ...), not affine");
        snprintf(full, sizeof full, "affine-uint8-tensor");
    } else if (sscanf(name, "int%d%c", &bits, &tail) == 1) {
        if (block)
            snprintf(full, sizeof full, "int%d-b%lld", bits, (long long)block);
        else
            snprintf(full, sizeof full, "int%d-tensor", bits);
    } else {
        if (block) return nl_fail(NL_ERR_INVALID, "--block goes with int8, int4 or intB, not '%s'", name);
        snprintf(full, sizeof full, "%s", name);
    }
    if (nl_quant_spec_parse(full, spec)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nl_last_error());
        return nl_fail(NL_ERR_INVALID, "--scheme %s: %s", name, msg);
    }
    return NL_OK;
}

nl_status nl_quant_values_run(const float *x, int64_t n, const nl_quant_spec *spec, nl_quant_values *v) {
    memset(v, 0, sizeof *v);
    v->back = nl_malloc((size_t)n * sizeof *v->back, "dequantized values");
    if (!v->back) return NL_ERR_NOMEM;
    NL_TRY(nl_quant_tensor(x, 1, n, spec, &v->q));
    NL_TRY(nl_quant_dequantize(&v->q, v->back));
    for (int64_t i = 0; i < n; i++) v->max_err = fmax(v->max_err, fabs((double)x[i] - (double)v->back[i]));
    return NL_OK;
}

void nl_quant_values_free(nl_quant_values *v) {
    nl_qtensor_free(&v->q);
    nl_free(v->back);
    v->back = NULL;
}
