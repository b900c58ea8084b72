/* Shared helpers of the NanoLM commands (train, eval, generate): text -> tokens, model files. */
#ifndef NANOLM_CLI_MODEL_H
#define NANOLM_CLI_MODEL_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/hf.h"
#include "nanolm/model.h"
#include "nanolm/tokenizer.h"

/* Context cap for Hugging Face folders (nanolm/hf.h). */
#define NL_CLI_MAX_SEQ NL_HF_DEFAULT_MAX_SEQ

/* Loads a model, and its tokenizer, through nl_model_load (nanolm/model_load.h): a Hugging Face
 * model folder (its tokenizer.json unless tok_path is given), a GGUF file, a safetensors
 * checkpoint or a llama2.c .bin. The
 * tokenizer is `tok_path` when given (tokenizer.json when it ends in .json, else a llama2.c
 * tokenizer.bin), else the folder's tokenizer.json, else the checkpoint's kind ("byte").
 * Errors name the file. */
nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok);

#endif
