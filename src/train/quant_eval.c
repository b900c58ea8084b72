/* A (quantized) model's mean loss and greedy tokens, compared with a reference run
 * (nanolm/quant_eval.h). */
#include <stdio.h>
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

/* Mean loss of m on the text, then the greedy tokens after the prompt. */
static nl_status measure(nl_model *m, const nl_tokenizer *tok, const nl_qeval_input *in, nl_quant_eval *r) {
    int64_t scored;
    NL_TRY(nl_eval_loss_tokens(m, in->ids, in->n, in->B, in->T, &r->loss, &scored));
    return greedy(m, tok, in->pids, in->np, in->n_gen > NL_QEVAL_MAX_GEN ? NL_QEVAL_MAX_GEN : in->n_gen, r);
}

nl_status nl_qeval_input_load(const nl_tokenizer *tok, const char *data, const char *prompt, int64_t max_tokens,
                              nl_qeval_input *in) {
    size_t bytes = 0;
    NL_TRY(nl_read_file(data, &in->text, &bytes));
    NL_TRY(nl_tokenizer_encode(tok, in->text, bytes, 1, 0, &in->ids, &in->n));
    NL_TRY(nl_tokenizer_encode(tok, prompt, strlen(prompt), 1, 0, &in->pids, &in->np));
    if (max_tokens && in->n > max_tokens) in->n = max_tokens;
    if (in->n < 2)
        return nl_fail(NL_ERR_INVALID, "%s has %lld tokens; evaluation needs at least 2", data, (long long)in->n);
    return NL_OK;
}

void nl_qeval_input_free(nl_qeval_input *in) {
    nl_free(in->text);
    nl_free(in->ids);
    nl_free(in->pids);
    in->text = NULL, in->ids = in->pids = NULL;
}

nl_status nl_quant_eval_loaded(nl_model *m, const nl_qmodel *lq, const nl_tokenizer *tok, const nl_qeval_input *in,
                               nl_quant_eval *r) {
    char sn[64];
    snprintf(r->scheme, sizeof r->scheme, lq ? "%s (loaded)" : "fp32",
             lq ? nl_quant_spec_name(&lq->spec, sn, sizeof sn) : "");
    r->mode = !lq ? "fp32" : lq->mode == NL_QLINEAR_W8A8 ? "w8a8" : "weight-only";
    r->model_bytes = nl_qmodel_size_bytes(m, lq, &r->linear_bytes);
    return measure(m, tok, in, r);
}

nl_status nl_quant_eval_scheme(nl_model *m, const nl_quant_spec *spec, nl_qlinear_mode mode, const nl_tokenizer *tok,
                               const nl_qeval_input *in, const char *out, const char *tkind, nl_quant_eval *r) {
    nl_qmodel qm;
    const nl_qlinear_mode md = nl_qmodel_w8a8_ok(spec) ? mode : NL_QLINEAR_WEIGHT_ONLY;
    NL_TRY(nl_qmodel_quantize(&qm, m, spec, md));
    nl_quant_spec_name(spec, r->scheme, sizeof r->scheme);
    r->mode = md == NL_QLINEAR_W8A8 ? "w8a8" : "weight-only";
    r->model_bytes = nl_qmodel_size_bytes(m, &qm, &r->linear_bytes);
    nl_status rc = measure(m, tok, in, r);
    if (!rc && out) rc = nl_qmodel_save(&qm, out, tkind);
    nl_qmodel_free(&qm);
    return rc;
}


void nl_quant_eval_shared(nl_quant_eval *rows, int n) {
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < rows[i].n_gen && k < rows[0].n_gen && rows[i].gen[k] == rows[0].gen[k]) k++;
        rows[i].shared = k;
    }
}
