/*
 * nanolm quant_eval: one (quantized) model measured the way `nanolm quant model` compares
 * schemes: mean loss on a token stream and the first greedy tokens after a prompt, and how many
 * of those each run shares with the first run (the fp32 reference).
 */
#ifndef NANOLM_QUANT_EVAL_H
#define NANOLM_QUANT_EVAL_H

#include "nanolm/model.h"
#include "nanolm/quantize_model.h"
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

/* What every run is measured on: the evaluation text and the prompt as tokens, and how. */
typedef struct nl_qeval_input {
    char *text;      /* the text as read */
    int *ids, *pids; /* the text's tokens (BOS first) and the prompt's */
    int64_t n, np;
    int64_t B, T; /* the mean loss in windows of (B, T) (activations allocated by the caller) */
    int n_gen;    /* greedy tokens after the prompt (<= NL_QEVAL_MAX_GEN), through the KV cache */
} nl_qeval_input;

/* Reads `data` and encodes it (BOS first) and `prompt` with tok, the text cut to its first
 * max_tokens (0: all); B, T and n_gen are the caller's. NL_ERR_INVALID naming the file when the
 * text has fewer than 2 tokens; the errors of reading and encoding. Free with
 * nl_qeval_input_free (also after an error). */
nl_status nl_qeval_input_load(const nl_tokenizer *tok, const char *data, const char *prompt, int64_t max_tokens,
                              nl_qeval_input *in);
void nl_qeval_input_free(nl_qeval_input *in);

/* The model as loaded, measured into r: "fp32", or with lq (the quantized checkpoint installed
 * on m) "SCHEME (loaded)" in its mode; with the bytes of its weights. */
nl_status nl_quant_eval_loaded(nl_model *m, const nl_qmodel *lq, const nl_tokenizer *tok, const nl_qeval_input *in,
                               nl_quant_eval *r);
/* m quantized with spec (int8 per channel in `mode`, every other scheme weight-only), measured
 * into r, and written to `out` (tokenizer kind tkind) when out is not NULL; m runs fp32 again
 * after. */
nl_status nl_quant_eval_scheme(nl_model *m, const nl_quant_spec *spec, nl_qlinear_mode mode, const nl_tokenizer *tok,
                               const nl_qeval_input *in, const char *out, const char *tkind, nl_quant_eval *r);

/* Sets rows[i].shared against rows[0]. */
void nl_quant_eval_shared(nl_quant_eval *rows, int n);

#ifdef __cplusplus
}
#endif

#endif
