/* Data loader: tokenize a file once, 90/10 split, stateless random windows, eval windows. */
#include "nanolm/data.h"
#include "nanolm/resources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void nl_data_free(nl_data *d) {
    if (!d) return;
    nl_free(d->tokens);
    free(d->path);
    memset(d, 0, sizeof *d);
}

static void set_split(nl_data *d) { d->n_train = d->n_tokens * 9 / 10; }

nl_status nl_data_open(nl_data *d, const char *path, const nl_tokenizer *tok) {
    memset(d, 0, sizeof *d);
    char *text;
    size_t n;
    NL_TRY(nl_read_file(path, &text, &n));
    if (n == 0) {
        nl_free(text);
        return nl_fail(NL_ERR_INVALID, "%s is empty: nothing to train or evaluate on", path);
    }
    int *tokens;
    int64_t m;
    char what[600];
    snprintf(what, sizeof what, "%s: the tokens of its %zu bytes", path, n);
    nl_status rc = nl_mem_require(((uint64_t)n + 2) * sizeof(int), what); /* at most one token per byte + BOS */
    if (rc) {
        nl_free(text);
        return rc;
    }
    rc = nl_tokenizer_encode(tok, text, n, 1, 0, &tokens, &m);
    nl_free(text);
    if (rc) return rc;
    if (!(d->path = strdup(path))) {
        nl_free(tokens);
        return nl_fail(NL_ERR_NOMEM, "out of memory opening %s", path);
    }
    d->tokens = tokens;
    d->n_tokens = m;
    d->vocab_size = tok->vocab_size;
    d->text_bytes = (int64_t)n;
    set_split(d);
    return NL_OK;
}

nl_status nl_data_from_tokens(nl_data *d, const char *name, const int *tokens, int64_t n_tokens, int vocab_size) {
    memset(d, 0, sizeof *d);
    if (!name) name = "(tokens)";
    if (n_tokens <= 0) return nl_fail(NL_ERR_INVALID, "%s: no tokens", name);
    for (int64_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab_size)
            return nl_fail(NL_ERR_INVALID, "%s: token %d at position %lld is outside the vocabulary (0..%d)", name,
                           tokens[i], (long long)i, vocab_size - 1);
    d->tokens = nl_malloc((size_t)n_tokens * sizeof(int), name);
    d->path = strdup(name);
    if (!d->tokens || !d->path) {
        nl_data_free(d);
        return nl_fail(NL_ERR_NOMEM, "out of memory copying %lld tokens of %s", (long long)n_tokens, name);
    }
    memcpy(d->tokens, tokens, (size_t)n_tokens * sizeof(int));
    d->n_tokens = n_tokens;
    d->vocab_size = vocab_size;
    set_split(d);
    return NL_OK;
}

const char *nl_data_split_name(nl_data_split s) {
    return s == NL_DATA_TRAIN ? "train" : s == NL_DATA_VAL ? "val" : s == NL_DATA_ALL ? "all" : "?";
}

int64_t nl_data_split_begin(const nl_data *d, nl_data_split s) { return s == NL_DATA_VAL ? d->n_train : 0; }

int64_t nl_data_split_tokens(const nl_data *d, nl_data_split s) {
    switch (s) {
    case NL_DATA_TRAIN: return d->n_train;
    case NL_DATA_VAL: return d->n_tokens - d->n_train;
    case NL_DATA_ALL: return d->n_tokens;
    }
    return 0;
}

static nl_status too_short(const nl_data *d, nl_data_split s, int T) {
    const char *what = s == NL_DATA_TRAIN ? "the training split (first 90%"
                       : s == NL_DATA_VAL ? "the validation split (last 10%"
                                          : "the text (all";
    return nl_fail(NL_ERR_INVALID, "%s: %lld tokens; %s, %lld tokens) is shorter than one window of T+1 = %lld tokens",
                   d->path, (long long)d->n_tokens, what, (long long)nl_data_split_tokens(d, s), (long long)T + 1);
}

nl_status nl_data_check_window(const nl_data *d, int T) {
    if (T < 1) return nl_fail(NL_ERR_INVALID, "sequence length T must be >= 1, got %d", T);
    if (nl_data_split_tokens(d, NL_DATA_TRAIN) < (int64_t)T + 1) return too_short(d, NL_DATA_TRAIN, T);
    if (nl_data_split_tokens(d, NL_DATA_VAL) < (int64_t)T + 1) return too_short(d, NL_DATA_VAL, T);
    return NL_OK;
}

/* Copies window [start, start+T+1) of the split into one row of inputs/targets. */
static void copy_window(const int *src, int T, int *in, int *tg) {
    memcpy(in, src, (size_t)T * sizeof(int));
    memcpy(tg, src + 1, (size_t)T * sizeof(int));
}

nl_status nl_data_batch(const nl_data *d, nl_data_split split, uint64_t seed, int64_t step, int rank, int world, int B,
                        int T, int *inputs, int *targets) {
    if (B < 1 || T < 1)
        return nl_fail(NL_ERR_INVALID, "batch size B and sequence length T must be >= 1, got B=%d T=%d", B, T);
    if (world < 1 || rank < 0 || rank >= world)
        return nl_fail(NL_ERR_INVALID, "rank %d is outside 0..world-1 (world %d)", rank, world);
    int64_t n = nl_data_split_tokens(d, split);
    if (n < (int64_t)T + 1) return too_short(d, split, T);
    const int *base = d->tokens + nl_data_split_begin(d, split);
    /* One stream per (seed, step): every rank draws the same global batch of B*world starts
     * and keeps its own B of them. */
    nl_rng r;
    nl_rng_seed(&r, seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(step + 1)) ^ ((uint64_t)split << 62));
    uint64_t n_starts = (uint64_t)(n - T); /* starts 0 .. n-T-1 keep T+1 tokens inside */
    for (int64_t g = 0; g < (int64_t)rank * B; g++) nl_rng_below(&r, n_starts);
    for (int b = 0; b < B; b++) {
        int64_t start = (int64_t)nl_rng_below(&r, n_starts);
        copy_window(base + start, T, inputs + (int64_t)b * T, targets + (int64_t)b * T);
    }
    return NL_OK;
}

int64_t nl_data_eval_windows(const nl_data *d, nl_data_split split, int T) {
    int64_t n = nl_data_split_tokens(d, split);
    return T < 1 || n < 1 ? 0 : (n - 1) / T;
}

nl_status nl_data_eval_batch(const nl_data *d, nl_data_split split, int64_t first, int B, int T, int *inputs,
                             int *targets, int *n_windows) {
    *n_windows = 0;
    if (B < 1 || T < 1 || first < 0)
        return nl_fail(NL_ERR_INVALID, "eval batch needs B >= 1, T >= 1, first >= 0 (got B=%d T=%d first=%lld)", B, T,
                       (long long)first);
    int64_t count = nl_data_eval_windows(d, split, T);
    const int *base = d->tokens + nl_data_split_begin(d, split);
    int k = 0;
    for (; k < B && first + k < count; k++)
        copy_window(base + (first + k) * T, T, inputs + (int64_t)k * T, targets + (int64_t)k * T);
    *n_windows = k;
    return NL_OK;
}
