/* libFuzzer target: llama2.c tokenizer loading (nl_tokenizer_load_llama2c) on arbitrary bytes;
 * an accepted vocabulary then encodes fixed texts and the input's own tail, and decodes them. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/base.h"
#include "nanolm/tokenizer.h"

#include "fuzz_targets.h"

static void roundtrip(const nl_tokenizer *t, const char *text, size_t n) {
    int *tok = NULL;
    int64_t m = 0;
    if (nl_tokenizer_encode(t, text, n, 1, 1, &tok, &m) != NL_OK) return;
    for (int64_t i = 0; i < m; i++)
        if (tok[i] < 0 || tok[i] >= t->vocab_size) abort();
    char *out = NULL;
    size_t out_n = 0;
    if (nl_tokenizer_decode(t, tok, m, &out, &out_n) == NL_OK) nl_free(out);
    for (int64_t i = 0; i < m; i++) {
        size_t len;
        const char *p = nl_tokenizer_piece(t, i ? tok[i - 1] : -1, tok[i], &len);
        if (!p) abort();
        (void)nl_tokenizer_piece_printable(p, len);
    }
    nl_free(tok);
}

int nl_fuzz_tokenizer(const uint8_t *data, size_t size) {
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    nl_tokenizer t;
    if (nl_tokenizer_load_llama2c(&t, path, 0) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    static const char *texts[] = {"", "Once upon a time", "Zoo", "  two  spaces\n\ttab",
                                  "\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xff\xfe bad utf-8 \xc3"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) roundtrip(&t, texts[i], strlen(texts[i]));
    size_t tail = size < 256 ? size : 256;
    roundtrip(&t, (const char *)data + size - tail, tail);
    (void)nl_tokenizer_lookup(&t, " ");
    nl_tokenizer_free(&t);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_tokenizer(data, size); }
#endif
