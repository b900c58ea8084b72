/*
 * nanolm sampler: picks the next token from a row of logits for one request (temperature,
 * top-k, top-p, a seeded generator per request), and matches stop strings in the text.
 */
#ifndef NANOLM_SAMPLER_H
#define NANOLM_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "nanolm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NL_SAMPLING_MAX_STOP     4  /* stop strings per request (OpenAI allows 4) */
#define NL_SAMPLING_MAX_STOP_LEN 64 /* bytes of one stop string */

/* What a request asks of the sampler. */
typedef struct nl_sampling {
    float temperature;  /* 0: greedy (argmax, lowest id on ties); default 1 */
    float top_p;        /* nucleus: keep the smallest set of tokens with mass >= top_p; 1 = off */
    int top_k;          /* keep the k most likely tokens; 0 = off */
    uint64_t seed;      /* of the request's generator (same seed, same tokens) */
    int64_t max_tokens; /* tokens to generate at most; <= 0: until the context is full */
    int n_stop;         /* stop strings: generation ends before the first occurrence */
    char stop[NL_SAMPLING_MAX_STOP][NL_SAMPLING_MAX_STOP_LEN + 1];
    int ignore_eos; /* 1: neither EOS nor BOS (which ends a llama2.c story) ends the request */
} nl_sampling;

/* temperature 1, top_p 1, top_k 0, seed 0, max_tokens 16 (OpenAI's default), no stop strings. */
void nl_sampling_default(nl_sampling *s);
/* Checks the fields: temperature finite and >= 0, top_p in (0, 1], top_k >= 0, stop strings
 * non-empty and at most NL_SAMPLING_MAX_STOP_LEN bytes. NL_ERR_INVALID naming the field. */
nl_status nl_sampling_check(const nl_sampling *s);
/* Adds a stop string (copied). NL_ERR_INVALID when empty, too long or too many. */
nl_status nl_sampling_add_stop(nl_sampling *s, const char *stop);

/* The next token from logits (V) (modified in place). Greedy when temperature == 0; with top_k
 * == 0 and top_p == 1 exactly nl_model_sample's draw (one nl_rng_double per token); otherwise
 * softmax(logits / T) restricted to the top_k most likely and then to the top_p nucleus, one
 * draw. scratch holds V int32 (top-k/top-p only; may be NULL otherwise). NL_ERR_NUMERIC naming
 * the index when a logit is NaN or infinite (*token untouched). */
nl_status nl_sampler_next(const nl_sampling *s, nl_rng *rng, float *logits, int64_t V, int32_t *scratch,
                          int32_t *token);

/* The distribution nl_sampler_next draws from, as V probabilities (summing to 1): softmax(logits
 * / T) restricted to the top_k most likely and then to the top_p nucleus, renormalized; one-hot at
 * the argmax (lowest id on ties) when temperature == 0. NL_ERR_NUMERIC as nl_sampler_next,
 * NL_ERR_NOMEM. */
nl_status nl_sampler_probs(const nl_sampling *s, const float *logits, int64_t V, float *probs);

/* Speculative decoding's verification (rejection sampling of Leviathan et al. 2023 and Chen et
 * al. 2023). logits: (k + 1, V) the target's logits at the position of the last token and at
 * those of the k drafted tokens draft[0..k) (modified). q: (k, V) the drafter's distribution at
 * each draft, or NULL for a deterministic drafter (prompt lookup: all mass on the draft). The
 * accepted drafts draft[0..a) and then one more token go to out; *n_out = a + 1 (1 .. k + 1).
 * Greedy (temperature 0): a draft is accepted when it is the argmax, and the last token is the
 * argmax of its row: exactly the tokens of greedy decoding without drafts. Sampled: draft j is
 * accepted with probability min(1, p(d) / q(d)) (p: nl_sampler_probs of row j), a rejection
 * draws from the residual max(0, p - q) renormalized, and when all k are accepted the last token
 * is drawn from row k: each token out is distributed as the target's p, exactly. probs: scratch
 * of V floats. Errors as nl_sampler_next. */
nl_status nl_sampler_verify(const nl_sampling *s, nl_rng *rng, float *logits, int64_t V, const int32_t *draft,
                            const float *q, int64_t k, float *probs, int32_t *out, int64_t *n_out);

/* Prompt lookup drafting (Saxena 2023): the longest suffix of toks[0..n) of at most ngram_max
 * tokens (and at least 1) that occurred earlier in toks, at its latest earlier occurrence: the k
 * tokens that followed it go to out (where they reach the end of toks, the copy reads on in out,
 * so that a text repeating with a short period drafts k tokens of it). Returns k, or 0 when no
 * suffix occurred before. */
int64_t nl_sampler_ngram_draft(const int32_t *toks, int64_t n, int ngram_max, int64_t k, int32_t *out);

/* Stop-string matching on a growing text. Returns the offset of the earliest occurrence of
 * any stop string that ends at or after `from` (the text before `from` was checked already),
 * or -1. *hold receives how many trailing bytes of text could still be the start of a stop
 * string (not yet safe to send to a client). */
int64_t nl_sampler_find_stop(const nl_sampling *s, const char *text, size_t len, size_t from, size_t *hold);

#ifdef __cplusplus
}
#endif
#endif
