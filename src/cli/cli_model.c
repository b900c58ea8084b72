/* Shared helpers of the NanoLM commands (see cli_model.h). */
#include "cli_model.h"

#include "nanolm/model_load.h"

nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok) {
    return nl_model_load(ckpt, tok_path, NL_CLI_MAX_SEQ, m, tok, NULL);
}
