/* A (quantized) model's mean loss and greedy tokens, compared with a reference run
 * (nanolm/quant_eval.h). */
#include <string.h>

#include "nanolm/quant_eval.h"
#include "nanolm/train.h"

/* Greedy continuation of the prompt through decode state st: the first n_gen generated tokens. */
static nl_status greedy_with(const nl_model *m, nl_decode_state *st, const nl_tokenizer *tok, const int *ids,
                             int64_t n_prompt, int n_gen, nl_quant_eval *r) {
    nl_rng rng; /* unused by greedy decoding, but never NULL */
    nl_rng_seed(&rng, 1);
    int token = ids[0];
    size_t tl = 0;
    r->n_gen = 0;
    r->text[0] = 0;
    for (int64_t pos = 0; pos < m->arch.seq_len && r->n_gen < n_gen; pos++) {
        float *logits = nl_model_step(m, st, token, pos);
        if (!logits) return NL_ERR_INVALID;
        int next = pos < n_prompt - 1 ? ids[pos + 1] : nl_model_sample(logits, m->V, 0.0f, &rng);
        if (pos >= n_prompt - 1) r->gen[r->n_gen++] = next;
        size_t len;
        const char *piece = nl_tokenizer_piece(tok, token, next, &len);
        if (piece && pos >= n_prompt - 1 && nl_tokenizer_piece_printable(piece, len) && tl + len + 1 < sizeof r->text) {
            memcpy(r->text + tl, piece, len);
            tl += len;
            r->text[tl] = 0;
        }
        token = next;
    }
    return NL_OK;
}

static nl_status greedy(const nl_model *m, const nl_tokenizer *tok, const int *ids, int64_t n_prompt, int n_gen,
                        nl_quant_eval *r) {
    nl_decode_state st;
    NL_TRY(nl_decode_state_init(&st, m, NL_KV_FP32));
    nl_status rc = greedy_with(m, &st, tok, ids, n_prompt, n_gen, r);
    nl_decode_state_free(&st);
    return rc;
}

nl_status nl_quant_eval_run(nl_model *m, const nl_tokenizer *tok, const int *ids, int64_t n, int64_t B, int64_t T,
                            const int *pids, int64_t np, int n_gen, nl_quant_eval *r) {
    int64_t scored;
    if (n_gen > NL_QEVAL_MAX_GEN) n_gen = NL_QEVAL_MAX_GEN;
    NL_TRY(nl_eval_loss_tokens(m, ids, n, B, T, &r->loss, &scored));
    return greedy(m, tok, pids, np, n_gen, r);
}


void nl_quant_eval_shared(nl_quant_eval *rows, int n) {
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < rows[i].n_gen && k < rows[0].n_gen && rows[i].gen[k] == rows[0].gen[k]) k++;
        rows[i].shared = k;
    }
}
