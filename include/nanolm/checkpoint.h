/*
 * NanoLM checkpoints as safetensors files (written atomically through nanolm/safetensors.h).
 *
 * Tensors: every model parameter under its Hugging Face Llama name, fp32
 * (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ...; lm_head.weight only
 * when untied). With training state: optimizer.exp_avg.<name> and optimizer.exp_avg_sq.<name>.
 * __metadata__:
 *   format           "pt"
 *   nanolm.arch      JSON object with every nl_arch field
 *   nanolm.tokenizer "byte" or "tok512" (how text becomes tokens)
 *   nanolm.train     JSON (only with training state): step, AdamW hyper-parameters and t,
 *                    loss scaler, RNG state (4 x u64 as decimal strings), precision.
 * q_proj/k_proj keep the interleaved-pair RoPE layout of llama2.c/Meta (not HF's rotate_half
 * permutation); see docs/nanolm.md.
 */
#ifndef NANOLM_CHECKPOINT_H
#define NANOLM_CHECKPOINT_H

#include "nanolm/model.h"
#include "nanolm/train.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Training state saved next to the weights for a bit-exact resume. */
typedef struct nl_ckpt_state {
    int64_t step;             /* completed training steps */
    nl_rng rng;               /* the data sampler's RNG after `step` steps */
    nl_adamw *opt;            /* moments and t (NULL: weights only) */
    nl_loss_scaler scaler;    /* fp16 dynamic loss scaling */
    nl_precision precision;
} nl_ckpt_state;

/* Writes model weights (+ state when st != NULL and st->opt != NULL) to `path` atomically.
 * tokenizer: "byte" or "tok512". Errors: NL_ERR_IO naming the file, NL_ERR_NOMEM. */
nl_status nl_ckpt_save(const char *path, const nl_model *m, const char *tokenizer, const nl_ckpt_state *st);

/* Opens a checkpoint and builds the model it holds: reads the arch from the metadata, calls
 * nl_model_init and loads every tensor (validating names, shapes and dtypes). tokenizer
 * (may be NULL) receives the tokenizer kind (64 bytes). Accepts llama2.c's legacy .bin files too
 * (tokenizer "tok512"). Errors: NL_ERR_IO, NL_ERR_FORMAT naming the file and the tensor. */
nl_status nl_ckpt_load_model(const char *path, nl_model *m, char *tokenizer);

/* Restores training state from a checkpoint written with state: st->opt must be initialised
 * for the model (nl_adamw_init) and is filled. Errors: NL_ERR_FORMAT when the file has no
 * training state or its sizes do not match. */
nl_status nl_ckpt_load_state(const char *path, const nl_model *m, nl_ckpt_state *st);

#ifdef __cplusplus
}
#endif
#endif
