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
 *                    loss scaler, RNG state (4 x u64 as decimal strings), precision, and "run":
 *                    what else defines the run (muP base width, loss scaling, QAT scheme, FP8
 *                    recipe, schedule and warmup), checked when the run is resumed.
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

/* What defines a run besides the model's shape and the precision; a resumed run must match. */
typedef struct nl_ckpt_run {
    int64_t mup_base_dim; /* muP base width (0: standard parametrisation) */
    int loss_scaling;     /* fp16: 1 dynamic loss scaling (GradScaler), 0 fixed at 1 */
    char qat[48];         /* QAT scheme ("" without QAT) */
    char fp8[96];         /* FP8 linears' recipe ("" without FP8) */
    char schedule[16];    /* learning-rate schedule: "cosine" */
    int64_t warmup;       /* warmup steps (-1: not recorded, older checkpoints) */
} nl_ckpt_run;

/* Training state saved next to the weights for a bit-exact resume. */
typedef struct nl_ckpt_state {
    int64_t step;          /* completed training steps */
    nl_rng rng;            /* the data sampler's RNG after `step` steps */
    nl_adamw *opt;         /* moments and t (NULL: weights only) */
    nl_loss_scaler scaler; /* fp16 dynamic loss scaling */
    nl_precision precision;
    nl_ckpt_run run;
} nl_ckpt_state;

/* The name of a precision as checkpoints store it: "fp32", "bf16", "fp16". */
const char *nl_precision_name(nl_precision p);

/* Parses and validates the training-state JSON (the nanolm.train metadata; `src` names its file
 * in messages) into st (st->opt, when not NULL, receives t; moments are not touched). Every
 * field is checked: step an integer in [0, 2^53], rng four decimal u64 not all zero, a known
 * precision, AdamW t in [0, step] with betas in [0, 1), eps > 0 and weight decay >= 0 finite,
 * the loss scale finite and positive, scaler counters in [0, step], and the run block (known
 * schedule name, sizes in range). Errors: NL_ERR_FORMAT naming the field. */
nl_status nl_ckpt_state_parse(const char *src, const char *json, nl_ckpt_state *st);

/* Writes model weights (+ state when st != NULL and st->opt != NULL) to `path` atomically.
 * tokenizer: "byte" or "tok512". Errors: NL_ERR_IO naming the file, NL_ERR_NOMEM. */
nl_status nl_ckpt_save(const char *path, const nl_model *m, const char *tokenizer, const nl_ckpt_state *st);

/* Opens a checkpoint and builds the model it holds: reads the arch from the metadata, calls
 * nl_model_init and loads every tensor (validating names, shapes and dtypes). tokenizer
 * (may be NULL) receives the tokenizer kind (64 bytes). Accepts llama2.c's legacy .bin files too
 * (tokenizer "tok512"). Errors: NL_ERR_IO, NL_ERR_FORMAT naming the file and the tensor. */
nl_status nl_ckpt_load_model(const char *path, nl_model *m, char *tokenizer);

/* Restores training state from a checkpoint written with state: st->opt must be initialised
 * for the model (nl_adamw_init) and is filled. The state is validated (nl_ckpt_state_parse) and
 * the moments must be finite (exp_avg_sq >= 0). Errors: NL_ERR_FORMAT when the file has no
 * training state, a field is out of range or its sizes do not match. */
nl_status nl_ckpt_load_state(const char *path, const nl_model *m, nl_ckpt_state *st);

#ifdef __cplusplus
}
#endif
#endif
