/*
 * Post-training quantization methods applied to a whole NanoLM model: round-to-nearest (RTN),
 * GPTQ, AWQ (weight-only, int2..8 with groups), SmoothQuant W8A8, plain W8A8 and LLM.int8()
 * mixed decomposition. The per-layer algorithms live in numerics/ (gptq.h, awq.h,
 * smoothquant.h, llmint8.h, qgrid.h); this module walks the model, captures each linear
 * layer's calibration inputs and folds scales into the preceding operation.
 *
 * Linear sites per transformer layer (the model's fused matmuls): QKV (input: attention
 * RMSNorm output), O (attention output), GATE_UP (FFN RMSNorm output), DOWN (silu(gate)*up).
 * Embeddings, norms and the classifier stay fp32.
 *
 * Weight-only schemes replace each linear weight by its dequantized value (fake quantization:
 * the loss is exactly that of the int model), and count bytes as packed codes plus one fp32
 * scale and one uint8 zero point per group. GPTQ and AWQ calibrate layer by layer: the
 * inputs of layer l are captured from the model whose layers < l are already quantized.
 * AWQ folds 1/s into the RMSNorm gain (QKV, GATE_UP), into v_proj's rows (O, only when
 * n_heads == n_kv_heads; with GQA the O site gets plain RTN) and into up_proj's rows (DOWN).
 * W8A8 schemes install a linear hook that runs nl_llmint8_forward (per-token int8
 * activations, per-channel int8 weights, int32 accumulation; outlier dims in fp32 for
 * int8-outlier); SmoothQuant folds its factors into the RMSNorm gains of QKV and GATE_UP.
 */
#ifndef NANOLM_QUANT_METHODS_H
#define NANOLM_QUANT_METHODS_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_qm_method {
    NL_QM_FP32,
    NL_QM_RTN,
    NL_QM_GPTQ,
    NL_QM_AWQ,
    NL_QM_SMOOTHQUANT,
    NL_QM_W8A8,
    NL_QM_LLMINT8
} nl_qm_method;

typedef struct nl_qm_scheme {
    char name[48];
    nl_qm_method method;
    int bits;     /* weight bits */
    int group;    /* weight-only: columns per group (0 = per row); W8A8: 0 (per row) */
    int act_bits; /* 8 for W8A8 schemes, 32 otherwise */
    double param; /* smoothquant: alpha (0.5); int8-outlier: threshold (6) */
} nl_qm_scheme;

/* Parses a scheme name: fp32, rtn-intB-gG, gptq-intB-gG, awq-intB-gG (B 2..8, G 0 = per row,
 * or 32/64/128/...), smoothquant-w8a8[-aALPHA], w8a8, int8-outlierT (e.g. int8-outlier6).
 * NL_ERR_INVALID naming the scheme otherwise. */
nl_status nl_qm_parse(const char *name, nl_qm_scheme *s);

/* Calibration: `n` tokens, used in windows of (B, T). */
typedef struct nl_qm_calib {
    const int32_t *tokens;
    int64_t n, B, T;
} nl_qm_calib;

enum { NL_QM_SITES = 4 }; /* QKV, O, GATE_UP, DOWN */

/* What applying a scheme leaves behind: the linear hook of W8A8 schemes (installed in the model
 * until nl_qm_runtime_free) and the LLM.int8() outlier report. */
typedef struct nl_qm_runtime {
    nl_model *m;
    nl_linear_ops ops;
    float threshold;           /* INFINITY for plain W8A8 */
    int8_t **codes;            /* [L * NL_QM_SITES] (rows, cols) */
    float **scales;            /* [L * NL_QM_SITES] (rows) */
    int *calib_outliers;       /* [L * NL_QM_SITES] outlier dims in the calibration inputs */
    int *eval_outliers_max;    /* [L * NL_QM_SITES] most outlier dims in one forward call */
    int site_dim[NL_QM_SITES]; /* input features per site */
    double awq_alpha_mean;     /* mean chosen alpha over AWQ sites (AWQ only) */
} nl_qm_runtime;

/* Applies scheme s to the model in place. GPTQ, AWQ, SmoothQuant and LLM.int8() calibrate on c
 * (windows of (c->B, c->T) tokens, within the model's activation buffers); fp32, RTN and W8A8
 * ignore it (c may be NULL). rt is filled (zeroed first) and must be released with
 * nl_qm_runtime_free, which also uninstalls the linear hook of the W8A8 schemes.
 * Errors: NL_ERR_INVALID (missing or too large calibration windows), NL_ERR_NOMEM, and those
 * of the per-layer methods (non-finite weights or activations). */
nl_status nl_qm_apply(nl_model *m, const nl_qm_scheme *s, const nl_qm_calib *c, nl_qm_runtime *rt);
void nl_qm_runtime_free(nl_qm_runtime *rt);

/* Exact bytes of the model's parameters under scheme s (linear layers quantized as described
 * above, everything else fp32; a tied classifier counted once). */
int64_t nl_qm_model_bytes(const nl_model *m, const nl_qm_scheme *s);

/* Name of a site ("qkv", "o", "gate_up", "down"). */
const char *nl_qm_site_name(int site);
/* The name of a method: fp32, rtn, gptq, awq, smoothquant, w8a8, llm.int8 ("?" out of range). */
const char *nl_qm_method_name(nl_qm_method m);

#ifdef __cplusplus
}
#endif
#endif
