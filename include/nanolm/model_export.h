/*
 * A model's weights in llama2.c's legacy .bin format (nanolm/llama2c.h holds the file I/O):
 * the per-layer tensors of each kind stacked into one (L, out, in) array.
 */
#ifndef NANOLM_MODEL_EXPORT_H
#define NANOLM_MODEL_EXPORT_H

#include "nanolm/base.h"
#include "nanolm/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes m as a llama2.c checkpoint (atomically). The format records neither rope_theta nor
 * norm_eps (readers assume 10000 and 1e-5), biases, RoPE scaling, a head_dim other than
 * dim / n_heads, nor experts: a model that has any of them is refused (NL_ERR_INVALID naming
 * the field) rather than written as a different model. Errors: NL_ERR_IO naming the file,
 * NL_ERR_NOMEM. */
nl_status nl_model_save_llama2c(const char *path, const nl_model *m);

#ifdef __cplusplus
}
#endif
#endif
