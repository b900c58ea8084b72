/*
 * nanolm quant_eval: one (quantized) model measured the way `nanolm quant model` compares
 * schemes: mean loss on a token stream and the first greedy tokens after a prompt, and how many
 * of those each run shares with the first run (the fp32 reference).
 */
#ifndef NANOLM_QUANT_EVAL_H
#define NANOLM_QUANT_EVAL_H

#include "nanolm/model.h"
#include "nanolm/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { NL_QEVAL_MAX_GEN = 256 };

typedef struct nl_quant_eval {
    char scheme[64];
    const char *mode;
    size_t linear_bytes, model_bytes;
    double loss;               /* mean over the tokens */
    int gen[NL_QEVAL_MAX_GEN]; /* the greedy tokens after the prompt */
    int n_gen, shared;         /* shared: leading tokens equal to the first run's */
    char text[2048];           /* their printable pieces */
} nl_quant_eval;

/* Mean loss of m on ids (n) in windows of (B, T) (activations allocated by the caller), then
 * the first n_gen (<= NL_QEVAL_MAX_GEN) greedy tokens after the prompt pids (np) through the KV
 * cache (allocated when missing). */
nl_status nl_quant_eval_run(nl_model *m, const nl_tokenizer *tok, const int *ids, int64_t n, int64_t B, int64_t T,
                            const int *pids, int64_t np, int n_gen, nl_quant_eval *r);

/* Sets rows[i].shared against rows[0]. */
void nl_quant_eval_shared(nl_quant_eval *rows, int n);

#ifdef __cplusplus
}
#endif

#endif
