/* libFuzzer target: NanoLM checkpoint loading (nl_ckpt_load_model, then nl_ckpt_load_state) on
 * arbitrary bytes: safetensors with nanolm's JSON metadata (arch, training state), or anything
 * else, which goes to the llama2.c reader. Arch sizes are capped by the available memory check;
 * libFuzzer's -malloc_limit_mb keeps accepted models small. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/checkpoint.h"
#include "nanolm/model.h"
#include "nanolm/train.h"

#include "fuzz_targets.h"

int nl_fuzz_checkpoint(const uint8_t *data, size_t size) {
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    nl_model m;
    char tok[64];
    if (nl_ckpt_load_model(path, &m, tok) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    if (memchr(tok, '\0', sizeof tok) == NULL) abort();
    nl_adamw opt;
    if (nl_adamw_init(&opt, &m, 0.9f, 0.95f, 1e-8f, 0.1f) == NL_OK) {
        nl_ckpt_state st;
        memset(&st, 0, sizeof st);
        st.opt = &opt;
        if (nl_ckpt_load_state(path, &m, &st) != NL_OK && nl_last_error()[0] == '\0') abort();
        nl_adamw_free(&opt);
    }
    nl_model_free(&m);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_checkpoint(data, size); }
#endif
