/* Shared helpers of the NanoLM commands (see cli_model.h). */
#include "cli_model.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "nanolm/checkpoint.h"
#include "nanolm/hf.h"

/* 1 when path ends in ".json" (a tokenizer.json rather than a llama2.c tokenizer.bin). */
static int is_json(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && !strcmp(path + n - 5, ".json");
}

nl_status nl_cli_load_model(const char *ckpt, const char *tok_path, nl_model *m, nl_tokenizer *tok) {
    memset(tok, 0, sizeof *tok);
    char kind[64] = "hf";
    char folder_tok[4096] = "";
    if (nl_hf_is_folder(ckpt)) {
        NL_TRY(nl_hf_load_model(ckpt, NL_CLI_MAX_SEQ, m));
        struct stat st;
        snprintf(folder_tok, sizeof folder_tok, "%s/tokenizer.json", ckpt);
        if (stat(folder_tok, &st) != 0) folder_tok[0] = 0;
    } else {
        NL_TRY(nl_ckpt_load_model(ckpt, m, kind));
    }
    nl_status rc = NL_OK;
    if (tok_path) {
        rc = is_json(tok_path) ? nl_tokenizer_load_json(tok, tok_path, (int)m->V)
                               : nl_tokenizer_load_llama2c(tok, tok_path, (int)m->V);
    } else if (folder_tok[0]) {
        rc = nl_tokenizer_load_json(tok, folder_tok, (int)m->V);
    } else if (!strcmp(kind, "byte")) {
        rc = nl_tokenizer_init_byte(tok);
        if (!rc && m->V != 256)
            rc = nl_fail(NL_ERR_FORMAT, "%s: byte tokenizer but vocab %lld", ckpt, (long long)m->V);
    } else if (!strcmp(kind, "hf")) {
        rc = nl_fail(NL_ERR_INVALID, "%s has no tokenizer.json: pass one with --tokenizer", ckpt);
    } else {
        rc = nl_fail(NL_ERR_INVALID, "%s uses the %s tokenizer: pass its file with --tokenizer", ckpt, kind);
    }
    if (rc) nl_model_free(m);
    return rc;
}
