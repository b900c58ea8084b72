/*
 * Declarations internal to the model layer (src/model/), as SQLite keeps sqliteInt.h: what the
 * files of the model share with each other and with the tests, and no other layer calls. The
 * contracts other layers use are in include/nanolm/ (model.h, infer.h, moe.h).
 */
#ifndef NANOLM_MODEL_INTERNAL_H
#define NANOLM_MODEL_INTERNAL_H

#include <stdint.h>

#include "nanolm/model.h"

/* nl_linear_forward with the bf16/fp16 rounded input written into lp (n * in_dim floats) instead
 * of the training activations' scratch: the decode step passes its own state's buffer, so that
 * several decode states can run over one model. */
void nl_linear_forward_lp(const nl_model *m, const nl_linear_site *site, float *out, const float *in, const float *w,
                          int64_t n, int64_t in_dim, int64_t out_dim, float *lp);

#endif
