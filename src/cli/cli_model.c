/* Shared helpers of the NanoLM commands (see cli_model.h). */
#include "cli_model.h"

#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/quantize_model.h"

nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    char kind[64];
    if (nl_qmodel_is_quantized(ckpt)) {
        /* a checkpoint written by `quant model --out`: the model holds the dequantized weights
         * (what the codes say); the quantized forward itself is the serving engine's */
        nl_qmodel qm;
        NL_TRY(nl_qmodel_load(ckpt, m, &qm, kind));
        nl_qmodel_free(&qm);
    } else {
        NL_TRY(nl_ckpt_load_model(ckpt, m, kind));
    }
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
