/* libFuzzer target: the data loader on arbitrary file bytes. The first 8 input bytes choose
 * the batch geometry (B, T, rank/world, step, split); the rest is the text file, tokenized
 * byte-level by nl_data_open, then drawn from with nl_data_batch and nl_data_eval_batch. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "nanolm/data.h"

#include "fuzz_targets.h"

int nl_fuzz_data(const uint8_t *data, size_t size) {
    static nl_tokenizer tok;
    static int have_tok;
    if (!have_tok) {
        if (nl_tokenizer_init_byte(&tok) != NL_OK) abort();
        have_tok = 1;
    }
    int B = (int)fz_take(&data, &size, 1) % 5;  /* 0..4: 0 must be refused */
    int T = (int)fz_take(&data, &size, 1) % 70; /* 0..69 */
    int world = 1 + (int)fz_take(&data, &size, 1) % 4;
    int rank = (int)fz_take(&data, &size, 1) % 5;         /* may be >= world: must be refused */
    int64_t step = (int64_t)fz_take(&data, &size, 3) - 4; /* a few negative steps too */
    nl_data_split split = (nl_data_split)(fz_take(&data, &size, 1) % 3);
    const char *path = fz_memfile(data, size);
    if (!path) return 0;
    nl_data d;
    if (nl_data_open(&d, path, &tok) != NL_OK) {
        if (nl_last_error()[0] == '\0') abort();
        return 0;
    }
    if (d.n_tokens != (int64_t)size) abort(); /* byte-level: one token per byte */
    size_t cells = (size_t)(B ? B : 1) * (size_t)(T ? T : 1);
    int *in = malloc(cells * sizeof(int)), *tg = malloc(cells * sizeof(int));
    if (in && tg) {
        (void)nl_data_check_window(&d, T);
        if (nl_data_batch(&d, split, 1234, step, rank, world, B, T, in, tg) == NL_OK) {
            for (size_t i = 0; i < cells; i++)
                if (in[i] < 0 || in[i] >= d.vocab_size || tg[i] < 0 || tg[i] >= d.vocab_size) abort();
            for (int b = 0; b < B; b++)
                for (int t = 0; t + 1 < T; t++)
                    if (tg[b * T + t] != in[b * T + t + 1]) abort(); /* targets are inputs shifted */
        }
        int64_t nw = nl_data_eval_windows(&d, split, T ? T : 1);
        int got = 0;
        for (int64_t first = nw > 2 ? nw - 2 : 0; first <= nw; first++)
            if (nl_data_eval_batch(&d, split, first, B, T, in, tg, &got) == NL_OK && got > B) abort();
    }
    free(in);
    free(tg);
    nl_data_free(&d);
    return 0;
}

#ifndef NL_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return nl_fuzz_data(data, size); }
#endif
