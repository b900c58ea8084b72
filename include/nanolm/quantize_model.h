/*
 * nanolm qmodel: the course's quantize_model and model_size_bytes on a NanoLM model.
 *
 * nl_qmodel_quantize replaces every transformer linear layer (q, k, v, o, w1, w3, w2 of every
 * layer) by a quantized one and installs itself as the model's linear hook; the embedding, the
 * classifier and the norms stay fp32, and so do the model's own fp32 weights (the master copy):
 * freeing the qmodel restores the fp32 model. Execution:
 *   int8 per channel   QuantizedLinear (W8A8: int8 x int8 -> int32; or weight-only)
 *   any other scheme   weight-only: the layer's codes are dequantized on the fly, fp32 GEMM
 * The quantized model is for inference (forward, eval, generate); backward uses the fp32 weights.
 *
 * Quantized checkpoints are safetensors: fp32 tensors under their HF names, and for each linear
 * weight NAME: NAME.qcodes (I8 or U8, (rows, bytes per row); int4/fp4 codes two per byte, even
 * column in the low nibble), NAME.qscale (F32, one per group) or NAME.qscale_e8m0 (U8, MX),
 * NAME.qzero (I32, affine); metadata nanolm.arch, nanolm.tokenizer, nanolm.quant.scheme,
 * nanolm.quant.mode.
 */
#ifndef NANOLM_QUANTIZE_MODEL_H
#define NANOLM_QUANTIZE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"
#include "nanolm/qlinear.h"
#include "nanolm/tokenizer.h"
#include "nanolm/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NL_QMODEL_PER_LAYER 7 /* wq, wk, wv, wo, w1, w3, w2 (memory order) */

typedef struct nl_qmodel {
    nl_model *model; /* borrowed; model->linear_ops == &ops while installed */
    nl_quant_spec spec;
    nl_qlinear_mode mode; /* W8A8 only for int8 per channel */
    int64_t L;
    nl_qtensor *qt;             /* (L, 7) quantized linear weights */
    const nl_param_info **info; /* (L, 7) the model's table entry of each */
    nl_qlinear *lin;            /* (L, 4) sites qkv, o, gate_up, down (int8 per channel), else NULL */
    float *scratch;             /* one site's dequantized weights (weight-only, other schemes) */
    nl_linear_ops ops;
} nl_qmodel;

/* quantize_model: quantizes the 7 linear weights of every layer of m with `spec` and installs
 * the quantized forward in m (qm must stay at its address while installed). mode W8A8 needs
 * int8 per channel (NL_ERR_UNSUPPORTED otherwise). Errors: bad spec, NaN/inf in a weight
 * (the message names the tensor), NL_ERR_NOMEM. */
nl_status nl_qmodel_quantize(nl_qmodel *qm, nl_model *m, const nl_quant_spec *spec, nl_qlinear_mode mode);
/* 1 when spec's weights can run W8A8 (symmetric int8 per channel), else 0. */
int nl_qmodel_w8a8_ok(const nl_quant_spec *spec);
/* Uninstalls the hook (m runs fp32 again) and frees everything; safe on a zeroed struct. */
void nl_qmodel_free(nl_qmodel *qm);

/* model_size_bytes: exact bytes of m's parameters as stored, with the linear weights of qm
 * (codes + scales + zero points) when qm != NULL, else fp32. *linear_bytes (may be NULL) gets
 * the bytes of the linear weights alone. A tied classifier is counted once. */
size_t nl_qmodel_size_bytes(const nl_model *m, const nl_qmodel *qm, size_t *linear_bytes);

/* Writes the quantized model to `path` (atomic). tokenizer: the tokenizer kind for metadata
 * ("byte", "llama2c"). Errors: NL_ERR_IO naming the file, NL_ERR_NOMEM. */
nl_status nl_qmodel_save(const nl_qmodel *qm, const char *path, const char *tokenizer);
/* 1 if `path` is a safetensors file with nanolm.quant.scheme metadata, else 0 (no error). */
int nl_qmodel_is_quantized(const char *path);
/* Loads a quantized checkpoint: builds m (its fp32 linear weights hold the dequantized values)
 * and qm installed on it. tokenizer (may be NULL) receives the tokenizer kind (64 bytes).
 * Errors: NL_ERR_IO, NL_ERR_FORMAT naming the file and the tensor, NL_ERR_NOMEM. */
nl_status nl_qmodel_load(const char *path, nl_model *m, nl_qmodel *qm, char *tokenizer);

/* A model as `quant model` takes it: a quantized checkpoint (nl_qmodel_load; *quantized = 1, qm
 * installed on m) with the byte tokenizer, or tok_path's llama2.c tokenizer when given; else any
 * checkpoint nl_model_load reads (max_seq caps a folder's context; *quantized = 0, qm zeroed).
 * tkind (64 bytes) receives the tokenizer's kind: "byte", "tok512" with tok_path, or what the
 * quantized checkpoint records. A quantized checkpoint of another tokenizer without tok_path is
 * NL_ERR_INVALID naming it. On error everything is freed. */
nl_status nl_qmodel_open(const char *ckpt, const char *tok_path, int64_t max_seq, nl_model *m, nl_tokenizer *tok,
                         nl_qmodel *qm, int *quantized, char *tkind);

#ifdef __cplusplus
}
#endif
#endif
