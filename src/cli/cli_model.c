/* Shared helpers of the NanoLM commands (see cli_model.h). */
#include "cli_model.h"

#include <string.h>

#include "nanolm/checkpoint.h"

nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    char kind[64];
    NL_TRY(nl_ckpt_load_model(ckpt, m, kind));
    nl_status rc = NL_OK;
    if (tok_path) {
        rc = nl_tokenizer_load_llama2c(tok, tok_path, (int)m->V);
    } else if (!strcmp(kind, "byte")) {
        rc = nl_tokenizer_init_byte(tok);
        if (!rc && m->V != 256)
            rc = nl_fail(NL_ERR_FORMAT, "%s: byte tokenizer but vocab %lld", ckpt, (long long)m->V);
    } else {
        rc = nl_fail(NL_ERR_INVALID, "%s uses the %s tokenizer: pass its file with --tokenizer", ckpt, kind);
    }
    if (rc) nl_model_free(m);
    return rc;
}
