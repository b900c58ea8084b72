/*
 * Data loader over one text file: the file is tokenized once (llama2.c tokenizer: one BOS and
 * the dummy prefix at the start of the file; byte-level: one token per byte), then split into
 * train = the first 90% of the tokens and validation = the last 10% (n_train = floor(0.9 n),
 * as nanoGPT splits tinyshakespeare).
 *
 * Training batches are B random windows of T+1 consecutive tokens of a split; inputs are the
 * first T tokens of each window and targets the last T, so targets[b][t] = inputs[b][t+1] within
 * a window. A batch is a pure function of (seed, step, rank, world, B, T): no hidden state, so a
 * run resumed at step k sees the same batches as an uninterrupted one, and data-parallel rank r
 * of R gets windows r*B .. r*B+B-1 of the global batch of B*R windows drawn for that step. The
 * union of the R rank batches is exactly the batch one process of batch B*R gets.
 *
 * Evaluation walks a split in order with windows that start every T tokens, so each token after
 * the first is a target exactly once; a last partial window is dropped. A data-parallel
 * evaluation gives rank r the windows r, r+R, r+2R, ...
 *
 * Token buffers are int (B, T) row-major.
 */
#ifndef NANOLM_DATA_H
#define NANOLM_DATA_H

#include <stdint.h>

#include "nanolm/base.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nl_data_split {
    NL_DATA_TRAIN = 0, /* tokens [0, n_train) */
    NL_DATA_VAL = 1,   /* tokens [n_train, n_tokens) */
    NL_DATA_ALL = 2    /* tokens [0, n_tokens): e.g. evaluating a pretrained model on a file */
} nl_data_split;

typedef struct nl_data {
    char *path;  /* the file (or name) the tokens came from, for messages */
    int *tokens; /* (n_tokens,) the whole file */
    int64_t n_tokens;
    int64_t n_train;    /* floor(0.9 * n_tokens) */
    int vocab_size;     /* of the tokenizer; every token is < vocab_size */
    int64_t text_bytes; /* size of the file */
} nl_data;

/* Reads and tokenizes `path`. Errors: NL_ERR_IO "cannot open PATH: ..." (missing file),
 * NL_ERR_INVALID "PATH is empty", NL_ERR_NOMEM. On error *d is zeroed. */
nl_status nl_data_open(nl_data *d, const char *path, const nl_tokenizer *tok);
/* Builds a loader over tokens already in memory (copied); `name` is used in messages.
 * Errors: NL_ERR_INVALID for no tokens or a token outside 0..vocab_size-1 (named by position). */
nl_status nl_data_from_tokens(nl_data *d, const char *name, const int *tokens, int64_t n_tokens, int vocab_size);
/* Frees the tokens (safe on a zeroed struct). */
void nl_data_free(nl_data *d);

/* Number of tokens in a split; its first token is at tokens + nl_data_split_begin(). */
int64_t nl_data_split_tokens(const nl_data *d, nl_data_split split);
int64_t nl_data_split_begin(const nl_data *d, nl_data_split split);
/* "train", "val", "all". */
const char *nl_data_split_name(nl_data_split split);

/* Checks that the train and validation splits each hold at least one window of T+1 tokens.
 * Error NL_ERR_INVALID naming the file and the sizes, e.g. "FILE: 120 tokens; the validation
 * split (last 10%, 12 tokens) is shorter than one window of T+1 = 65 tokens". */
nl_status nl_data_check_window(const nl_data *d, int T);

/* Rank `rank` of `world`'s training batch for `step`: B random windows of the split, drawn from
 * `seed` (see above). inputs, targets: (B, T). Errors: NL_ERR_INVALID for B < 1, T < 1, rank
 * outside 0..world-1, or a split shorter than T+1 tokens (message as nl_data_check_window). */
nl_status nl_data_batch(const nl_data *d, nl_data_split split, uint64_t seed, int64_t step, int rank, int world, int B,
                        int T, int *inputs, int *targets);

/* Number of evaluation windows of T tokens in a split: (split_tokens - 1) / T. */
int64_t nl_data_eval_windows(const nl_data *d, nl_data_split split, int T);
/* Fills up to B evaluation windows starting at window `first` (rows of inputs/targets (B, T)),
 * sets *n_windows to how many (0 past the end). Errors: NL_ERR_INVALID for B < 1, T < 1,
 * first < 0. */
nl_status nl_data_eval_batch(const nl_data *d, nl_data_split split, int64_t first, int B, int T, int *inputs,
                             int *targets, int *n_windows);

#ifdef __cplusplus
}
#endif
#endif
