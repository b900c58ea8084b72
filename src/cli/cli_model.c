/* Shared helpers of the NanoLM commands (see cli_model.h). */
#include "cli_model.h"

#include <string.h>

#include "nanolm/checkpoint.h"
#include "nanolm/hf.h"
#include "nanolm/quantize_model.h"

nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    char kind[64] = "hf";
    if (nl_hf_is_folder(ckpt)) {
        NL_TRY(nl_hf_load_model(ckpt, NL_CLI_MAX_SEQ, m));
    } else if (nl_qmodel_is_quantized(ckpt)) {
        /* a checkpoint written by `quant model --out`: the model holds the dequantized weights
         * (what the codes say); the quantized forward itself is the serving engine's */
        nl_qmodel qm;
        NL_TRY(nl_qmodel_load(ckpt, m, &qm, kind));
        nl_qmodel_free(&qm);
    } else {
        NL_TRY(nl_ckpt_load_model(ckpt, m, kind));
    }
    nl_status rc = nl_hf_load_tokenizer(ckpt, kind, tok_path, m->V, tok);
    if (rc) nl_model_free(m);
    return rc;
}
