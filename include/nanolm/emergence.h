/*
 * Emergence as a metric artefact (Schaeffer et al. 2023): a model's per-token loss and accuracy
 * improve smoothly, but an all-or-nothing metric (exact match of the next k tokens) stays near
 * zero and then jumps. If each token is right with probability p, independently, exact match
 * of k tokens is p^k: the jump is the metric's, not the model's.
 */
#ifndef NANOLM_EMERGENCE_H
#define NANOLM_EMERGENCE_H

#include <stdint.h>

#include "nanolm/data.h"
#include "nanolm/model.h"

#define NL_EMERGENCE_KMAX 32

typedef struct nl_emergence {
    double mean_loss; /* nats/token over all scored tokens */
    double accuracy;  /* p: argmax == next token, over all scored tokens */
    int64_t tokens;   /* scored tokens */
    int64_t starts;   /* start positions for exact match: per window t in [0, T - kmax] */
    int kmax;
    double exact[NL_EMERGENCE_KMAX + 1]; /* exact[k]: the next k tokens all argmax-correct
                                            (teacher forcing = greedy decoding while correct) */
    double p_after_correct;              /* q = P(token t right | token t-1 right), within windows: errors
                               come in runs when q > p, and exact match of k tokens is then
                               closer to p q^(k-1) (a first-order chain) than to p^k */
} nl_emergence;

/* Evaluates m on the first `windows` windows of T tokens of a split of d (B windows per
 * forward; m must have activations for (B, T)). kmax in 1..NL_EMERGENCE_KMAX and < T.
 * Errors: NL_ERR_INVALID for kmax out of range or a split without a window. */
nl_status nl_emergence_eval(nl_model *m, const nl_data *d, nl_data_split split, int64_t B, int64_t T, int64_t windows,
                            int kmax, nl_emergence *out);

/* The same for a model file (nl_model_load: checkpoint, GGUF, model folder, llama2.c .bin) and
 * a text, tokenized with the file's tokenizer, in batches of 8 windows of the model's context;
 * k = the longest exact match the context allows (at most NL_EMERGENCE_KMAX). *kmax becomes the
 * smaller of itself and k. Errors name the file. */
nl_status nl_emergence_eval_file(const char *ckpt, const char *text, nl_data_split split, int64_t windows, int *kmax,
                                 nl_emergence *out);

#endif
