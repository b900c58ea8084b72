/*
 * NanoLM decoding of one sequence, one token at a time with a KV cache (llama2.c's `forward`).
 *
 * As llama2.c keeps its weights (TransformerWeights) apart from its run state (RunState), the
 * model (nanolm/model.h) holds the weights and an nl_decode_state holds everything the decoding
 * of one sequence writes: its KV cache (fp32, or int8 codes with fp16 scales) and the one-token
 * buffers. nl_model_step reads the model and writes only the state, so several sequences decode
 * over one model, each with its own state. (With the default linears the step writes nothing of
 * the model; an installed nl_linear_ops hook is called as during training and must itself allow
 * being shared.) The serving engine (nanolm/engine.h) batches many sequences over a paged cache
 * instead; this is the reference it is checked against.
 */
#ifndef NANOLM_INFER_H
#define NANOLM_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of a KV cache. INT8: per head and per token absmax, 8-bit codes
 * q = round_half_even(x / s) in [-127, 127] with s = fp16(max|x| / 127) (the scale stored as
 * fp16); attention dequantizes on the fly: score = s_k * (q_vec . codes_k), out += p s_v codes_v. */
typedef enum nl_kv_dtype { NL_KV_FP32 = 0, NL_KV_INT8 = 1 } nl_kv_dtype;

/* The state of one sequence's decoding. */
typedef struct nl_decode_state {
    /* the shape it was made for (nl_model_step refuses a model of another shape) */
    int64_t L, seq_len, C, NH, KVH, hd, H, V, QKV;
    nl_kv_dtype kv_dtype;
    size_t kv_bytes;     /* bytes of the K/V storage as allocated (codes + scales, or fp32) */
    float *kv_cache;     /* fp32 cache: (L, 2, seq_len, KVH*hd) K and V; NULL with an int8 cache */
    int8_t *kv_codes;    /* int8 cache: (L, 2, seq_len, KVH*hd) codes, then the scales */
    uint16_t *kv_scales; /* int8 cache: (L, 2, seq_len, KVH) fp16 absmax step per head and token */
    /* one-token buffers */
    float *x;      /* (C) residual stream */
    float *xb;     /* (C) normed input / matmul output */
    float *q;      /* (QKV) q | k | v of this token (q and k rotated) */
    float *att;    /* (NH, seq_len) scores */
    float *hb;     /* (NH*hd) attention output, then (2H) gate | up and (H) SwiGLU */
    float *logits; /* (V) */
    float *lp;     /* (max(C, NH*hd, H)) a matmul input rounded to bf16/fp16 (m->precision) */
    float *mem;    /* the one allocation: the fp32 cache (if any), then the buffers */
} nl_decode_state;

/* Allocates a zeroed decode state (an empty cache of element type dt, seq_len positions) for
 * model m's shape. Errors: NL_ERR_INVALID (unknown dt), NL_ERR_UNSUPPORTED (mixture-of-experts
 * layers, or a model part without embedding or classifier), NL_ERR_NOMEM; *st is then zeroed. */
nl_status nl_decode_state_init(nl_decode_state *st, const nl_model *m, nl_kv_dtype dt);
/* Frees what nl_decode_state_init allocated; safe on a zeroed struct. */
void nl_decode_state_free(nl_decode_state *st);

/* Runs one token at position pos (0-based, < seq_len) of the sequence st decodes: writes its K
 * and V at pos and attends over positions 0..pos (the earlier positions must have been stepped
 * with this state). Returns the logits (V), in st (valid until the next step), or NULL with the
 * error set for a token outside the vocabulary, a position outside [0, seq_len) or a state made
 * for another shape. */
float *nl_model_step(const nl_model *m, nl_decode_state *st, int32_t token, int64_t pos);

/* The int8 KV format of one token: per head absmax of x (KVH, hd) into codes (KVH*hd) and fp16
 * scales (KVH), as described at nl_kv_dtype (shared by this cache and the serving engine's). */
void nl_kv_quantize_token(int8_t *codes, uint16_t *scales, const float *x, int64_t KVH, int64_t hd);
/* Picks the next token from logits (V): argmax when temperature == 0, else samples from
 * softmax(logits / temperature) with rng. Modifies logits. */
int32_t nl_model_sample(float *logits, int64_t V, float temperature, nl_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
