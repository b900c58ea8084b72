/* libFuzzer target: a tokenizer.json (nl_tokenizer_load_json) and a text to encode with it, from
 * one input: 2 bytes little-endian n, then n bytes of tokenizer.json, then the text. An accepted
 * tokenizer encodes the text (special tokens off and on) to ids inside its vocabulary, or refuses
 * it with a message; the ids decode. Normalizers that lengthen text (NFC, Replace) once
 * overflowed the id buffer here. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/base.h"
#include "nanolm/tokenizer.h"

#include "fuzz_targets.h"

int nl_fuzz_tokenizer_json(const uint8_t *data, size_t size) {
    size_t n = (size_t)fz_take(&data, &size, 2);
    if (n > size) n = size;
    const char *path = fz_memfile(data, n);
    if (!path) return 0;
    const char *text = (const char *)data + n;
    size_t text_n = size - n;
    nl_tokenizer t;
    if (nl_tokenizer_load_json(&t, path, 0) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    for (int special = 0; special < 2; special++) {
        int *ids = NULL;
        int64_t m = 0;
        if (nl_tokenizer_encode_special(&t, text, text_n, 1, 1, special, &ids, &m) != NL_OK) {
            if (nl_last_error()[0] == '\0' || ids) abort();
            continue;
        }
        for (int64_t i = 0; i < m; i++)
            if (ids[i] < 0 || ids[i] >= t.vocab_size) abort();
        char *out = NULL;
        size_t out_n = 0;
        if (nl_tokenizer_decode(&t, ids, m, &out, &out_n) == NL_OK) nl_free(out);
        nl_free(ids);
    }
    nl_tokenizer_free(&t);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_tokenizer_json(data, size); }
#endif
