/* Shared helpers of the NanoLM commands (train, eval, generate): text -> tokens, model files. */
#ifndef NANOLM_CLI_MODEL_H
#define NANOLM_CLI_MODEL_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/model.h"
#include "nanolm/tokenizer.h"

/* Loads a model from a safetensors checkpoint or a llama2.c .bin, and its tokenizer: the
 * checkpoint's kind, or the llama2.c tokenizer file `tok_path` (required for .bin files).
 * Errors name the file. */
nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok);

#endif
