/* LLM.int8() mixed-precision decomposition (see include/nanolm/llmint8.h). */
#include "nanolm/llmint8.h"

#include <math.h>
#include <string.h>

#include "nanolm/qgrid.h"

static int8_t q8(float x, float inv_scale) {
    float q = nearbyintf(x * inv_scale);
    if (q > 127.f) q = 127.f;
    if (q < -127.f) q = -127.f;
    return (int8_t)q;
}

nl_status nl_llmint8_quantize_weight(const float *w, int rows, int cols, int8_t *codes, float *scales) {
    if (rows <= 0 || cols <= 0) return nl_fail(NL_ERR_INVALID, "llm.int8: bad weight shape (%d, %d)", rows, cols);
    int64_t bad = nl_qgrid_first_nonfinite(w, (int64_t)rows * cols);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "llm.int8: weight row %lld col %lld is not finite", (long long)(bad / cols),
                       (long long)(bad % cols));
    for (int r = 0; r < rows; r++) {
        const float *wr = w + (int64_t)r * cols;
        float amax = 0.f;
        for (int j = 0; j < cols; j++) amax = fmaxf(amax, fabsf(wr[j]));
        float s = amax / 127.f;
        scales[r] = s;
        float inv = s > 0.f ? 1.f / s : 0.f;
        for (int j = 0; j < cols; j++) codes[(int64_t)r * cols + j] = q8(wr[j], inv);
    }
    return NL_OK;
}

nl_status nl_llmint8_outlier_dims(const float *x, int64_t tokens, int cols, float threshold, uint8_t *is_outlier,
                                  int *n_outliers) {
    if (tokens < 0 || cols <= 0)
        return nl_fail(NL_ERR_INVALID, "llm.int8: bad input shape (%lld, %d)", (long long)tokens, cols);
    int count = 0;
    for (int j = 0; j < cols; j++) {
        int o = 0;
        for (int64_t t = 0; t < tokens && !o; t++) o = fabsf(x[t * cols + j]) > threshold;
        if (is_outlier) is_outlier[j] = (uint8_t)o;
        count += o;
    }
    if (n_outliers) *n_outliers = count;
    return NL_OK;
}

nl_status nl_llmint8_forward(const float *x, int64_t tokens, int cols, const int8_t *w_codes, const float *w_scales,
                             int rows, float threshold, float *y, int *n_outliers) {
    if (tokens < 0 || cols <= 0 || rows <= 0)
        return nl_fail(NL_ERR_INVALID, "llm.int8: bad shapes (tokens %lld, cols %d, rows %d)", (long long)tokens, cols,
                       rows);
    int64_t bad = nl_qgrid_first_nonfinite(x, tokens * cols);
    if (bad >= 0)
        return nl_fail(NL_ERR_INVALID, "llm.int8: input token %lld feature %lld is not finite", (long long)(bad / cols),
                       (long long)(bad % cols));
    uint8_t *out = nl_malloc((size_t)cols, "llm.int8 outlier mask");
    int *idx = nl_malloc((size_t)cols * sizeof(int), "llm.int8 outlier index");
    if (!out || !idx) {
        nl_free(out);
        nl_free(idx);
        return NL_ERR_NOMEM;
    }
    int n_out = 0;
    nl_llmint8_outlier_dims(x, tokens, cols, threshold, out, &n_out);
    for (int j = 0, k = 0; j < cols; j++)
        if (out[j]) idx[k++] = j;
    nl_status rc = NL_OK;
#pragma omp parallel
    {
        int8_t *xq = nl_malloc((size_t)cols, "llm.int8 token codes");
        if (!xq) {
#pragma omp atomic write
            rc = NL_ERR_NOMEM;
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            if (!xq) continue;
            const float *xt = x + t * cols;
            float amax = 0.f;
            for (int j = 0; j < cols; j++)
                if (!out[j]) amax = fmaxf(amax, fabsf(xt[j]));
            float sx = amax / 127.f, inv = sx > 0.f ? 1.f / sx : 0.f;
            for (int j = 0; j < cols; j++) xq[j] = out[j] ? 0 : q8(xt[j], inv);
            for (int r = 0; r < rows; r++) {
                const int8_t *wr = w_codes + (int64_t)r * cols;
                int32_t acc = 0;
                for (int j = 0; j < cols; j++) acc += (int32_t)xq[j] * (int32_t)wr[j];
                float yo = 0.f; /* fp32 outlier part with the dequantized weight columns */
                for (int k = 0; k < n_out; k++) yo += xt[idx[k]] * (float)wr[idx[k]];
                y[t * rows + r] = ((float)acc * sx + yo) * w_scales[r];
            }
        }
        nl_free(xq);
    }
    nl_free(out);
    nl_free(idx);
    if (rc != NL_OK) return nl_fail(rc, "llm.int8: out of memory for token codes");
    if (n_outliers) *n_outliers = n_out;
    return NL_OK;
}
