/*
 * One place that turns a checkpoint path into a model and its tokenizer, whatever the format:
 *
 *   a directory                   a Hugging Face model folder (nanolm/hf.h)
 *   a file starting with "GGUF"   llama.cpp's GGUF (nanolm/gguf_model.h)
 *   safetensors with nanolm.quant a checkpoint written by `quant model --out` (nanolm/quantize_model.h:
 *                                 the model holds the dequantized weights)
 *   safetensors                   a NanoLM checkpoint (nanolm/checkpoint.h's layout)
 *   anything else                 llama2.c's legacy .bin (nanolm/llama2c.h)
 *
 * The CLI's model commands and the serving engine both call nl_model_load; the format is decided
 * here only.
 */
#ifndef NANOLM_MODEL_LOAD_H
#define NANOLM_MODEL_LOAD_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/chat_template.h"
#include "nanolm/model.h"
#include "nanolm/safetensors.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_ckpt_format {
    NL_CKPT_HF = 0,
    NL_CKPT_GGUF,
    NL_CKPT_QUANTIZED,
    NL_CKPT_SAFETENSORS,
    NL_CKPT_LLAMA2C
} nl_ckpt_format;

/* What nl_model_load found. */
typedef struct nl_model_source {
    nl_ckpt_format format;
    char tokenizer[64];   /* the checkpoint's tokenizer kind ("byte", "tok512", "hf", "gguf") */
    int int8_per_channel; /* a quantized checkpoint of symmetric int8 per-channel codes */
    uint32_t gguf_type;   /* GGUF: the type of the linears (nanolm/gguf.h nl_ggml_type) */
} nl_model_source;


/* Loads the model at `ckpt` (see above; max_seq > 0 caps the context of a folder or GGUF) and,
 * when tok is not NULL, its tokenizer: `tok_path` when given (a tokenizer.json when it ends in
 * .json, else a llama2.c tokenizer.bin), else the folder's tokenizer.json, the GGUF's own, or the
 * checkpoint's kind ("byte"). src may be NULL. Errors name the file; on error *m (and *tok) are
 * zeroed. */
nl_status nl_model_load(const char *ckpt, const char *tok_path, int64_t max_seq, nl_model *m, nl_tokenizer *tok,
                        nl_model_source *src);

/* The model of a NanoLM safetensors checkpoint or a llama2.c .bin (nl_ckpt_load_model of
 * nanolm/checkpoint.h is this): tokenizer (64 bytes, may be NULL) receives its kind. */
nl_status nl_model_load_ckpt(const char *path, nl_model *m, char *tokenizer);

/* Reads every model tensor named prefix + its HF name from an opened safetensors file into dst
 * (m's layout; F32, BF16 or F16, shapes checked): the weights, or optimizer moments. */
nl_status nl_model_load_st_params(const nl_st_file *f, const nl_model *m, const char *prefix, float *dst);

/* The shape only (the planner's arch): config.json of a folder, GGUF metadata, or the model a
 * checkpoint holds. */
nl_status nl_model_load_arch(const char *ckpt, nl_arch *a);

/* The chat template to serve the model at `ckpt` with: the Jinja file `path` when given (NULL:
 * none), else the model's own, a Hugging Face folder's or a GGUF file's (*out NULL when it has none
 * or ckpt is another kind of file: the chat endpoint then answers 400). A template from `path`
 * takes bos_token / eos_token from the model's own template, else the BOS / EOS pieces of tok when
 * it is a Hugging Face tokenizer (tok may be NULL). Errors: the model's own template unreadable
 * (when path is NULL), path unreadable or not a template; *out is NULL then. */
nl_status nl_model_load_chat_template(nl_chat_template **out, const char *ckpt, const char *path,
                                      const nl_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
