/* Shared helpers of the NanoLM commands (see cli_model.h). */
#include "cli_model.h"

#include <string.h>

#include "nanolm/checkpoint.h"

nl_status nl_cli_load_text_split(const char *path, nl_tokens *train, nl_tokens *val) {
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    char *text;
    size_t bytes;
    NL_TRY(nl_read_file(path, &text, &bytes));
    if (bytes == 0) {
        nl_free(text);
        return nl_fail(NL_ERR_INVALID, "%s is empty", path);
    }
    int64_t n = (int64_t)bytes, n_train = n - n / 10;
    train->ids = nl_malloc((size_t)n_train * sizeof(int32_t), "training tokens");
    val->ids = nl_malloc((size_t)(n - n_train + 1) * sizeof(int32_t), "validation tokens");
    if (!train->ids || !val->ids) {
        nl_free(text);
        nl_cli_tokens_free(train);
        nl_cli_tokens_free(val);
        return NL_ERR_NOMEM;
    }
    for (int64_t i = 0; i < n_train; i++) train->ids[i] = (unsigned char)text[i];
    for (int64_t i = n_train; i < n; i++) val->ids[i - n_train] = (unsigned char)text[i];
    train->n = n_train;
    val->n = n - n_train;
    nl_free(text);
    return NL_OK;
}

void nl_cli_tokens_free(nl_tokens *t) {
    nl_free(t->ids);
    memset(t, 0, sizeof *t);
}

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
