/* libFuzzer target: llama2.c legacy checkpoint reader (nl_llama2c_read) on arbitrary bytes. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/llama2c.h"

#include "fuzz_targets.h"

int nl_fuzz_llama2c(const uint8_t *data, size_t size) {
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    nl_llama2c m;
    if (nl_llama2c_read(&m, path) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    /* An accepted file: every array lies inside the one allocation and is readable. */
    int64_t total = 0;
    volatile float sink = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const nl_llama2c_tensor *t = &m.tensors[i];
        if (nl_llama2c_find(&m, t->name) != t) abort();
        if (t->data != m.weights + total) abort();
        total += t->numel;
        if (t->numel > 0) sink += t->data[0] + t->data[t->numel - 1];
    }
    if (total != m.n_weights) abort();
    (void)sink;
    nl_llama2c_free(&m);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_llama2c(data, size); }
#endif
