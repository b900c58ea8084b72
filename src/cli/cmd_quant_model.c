/* nanolm quant model: quantize a NanoLM checkpoint's linear layers with several schemes and
 * report bytes, compression, mean loss and how many greedy tokens stay the same as fp32. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_opt.h"
#include "nanolm/quantize_model.h"
#include "nanolm/quant_eval.h"
#include "report.h"

#define MAX_SCHEMES 24

static const char *const DEFAULT_SCHEMES[] = {"int8-channel", "int8-tensor", "int8-b32",  "int8-b64", "int8-b128",
                                              "int4-b32",     "int4-b64",    "int4-b128", "mxfp8",    "mxfp4"};

typedef nl_quant_eval qrow;

/* The options of quant model, as given. */
typedef struct qm_args {
    nl_model_args model;
    const char *data, *out, *prompt;
    nl_opt_list schemes;
    nl_quant_spec specs[MAX_SCHEMES];
    int ns, json, mode_i, mode_set;
    int64_t n_gen, max_tokens, T, B;
} qm_args;

static const char qm_summary[] =
    "Quantizes q, k, v, o, w1, w2, w3 of every layer (embeddings, classifier and norms stay fp32)\n"
    "and reports bytes of the linear weights and of the model, compression, mean loss on TEXT,\n"
    "its change vs fp32, and how many of the first --gen greedy tokens after --prompt equal fp32's.\n"
    "Schemes: int<b>-channel|tensor|b<k>, affine-(u)int<b>-..., mxfp8, mxfp8-e5m2, mxfp6-e3m2,\n"
    "mxfp6-e2m3, mxfp4, mxint8. int8-channel runs W8A8 by default (--mode weight-only to dequantize\n"
    "on the fly); the others run weight-only. A quantized --ckpt is loaded and evaluated as it is.";

static int qm_parse(int argc, char **argv, qm_args *a) {
    memset(a, 0, sizeof *a);
    a->prompt = "Once upon a time";
    a->n_gen = 20;
    a->B = 4;
    nl_opt model[3];
    int nmodel = nl_cli_model_opts(model, &a->model, 0);
    nl_opt opts[] = {
        NL_OPT_STR("data", &a->data, "TEXT", "text the loss is measured on (required)"),
        NL_OPT_LIST("scheme", &a->schemes, "S",
                    "a scheme (repeat; default int8-channel int8-tensor int8-b32/64/128 int4-b32/64/128 mxfp8 mxfp4)"),
        {"mode", NL_OPT_T_CHOICE, &a->mode_i, 0, 0, "w8a8|weight-only", NULL, "how int8-channel runs (default w8a8)",
         NULL, &a->mode_set},
        NL_OPT_STR("out", &a->out, "Q.safetensors", "write the (single) quantized scheme as safetensors"),
        NL_OPT_STR("prompt", &a->prompt, "TEXT", "prompt of the greedy comparison (default 'Once upon a time')"),
        NL_OPT_INT("gen", &a->n_gen, 1, NL_QEVAL_MAX_GEN, "N", "greedy tokens compared (default 20)"),
        NL_OPT_INT("max-tokens", &a->max_tokens, 2, 9.2e18, "N", "evaluate only the first N tokens of TEXT"),
        NL_OPT_INT("seq", &a->T, 1, 1 << 20, "T", "tokens per window (default: the model's seq_len)"),
        NL_OPT_INT("batch", &a->B, 1, 4096, "B", "windows per forward pass (default 4)"),
        NL_OPT_FLAG("json", &a->json, "print the result as JSON"),
    };
    nl_optgroup groups[] = {{"model", model, nmodel}, {"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "quant model", "nanolm quant model --ckpt F --data TEXT [--scheme S ...] [options]", qm_summary, groups, 2, 0};
    int rc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (rc) return rc;
    if (a->schemes.n > MAX_SCHEMES) return nl_cli_usage_error("quant model: at most %d --scheme", MAX_SCHEMES);
    for (int i = 0; i < a->schemes.n; i++)
        if (nl_quant_spec_parse(a->schemes.v[i], &a->specs[a->ns++]))
            return nl_cli_usage_error("quant model: --scheme: %s", nl_last_error());
    if (!a->model.ckpt || !a->data) return nl_cli_usage_error("quant model: --ckpt F and --data TEXT are required");
    if (a->out && a->ns != 1) return nl_cli_usage_error("quant model: --out needs exactly one --scheme");
    if (a->out && nl_check_writable(a->out, "--out")) return nl_cli_fail("quant model"); /* before any work */
    if (a->ns == 0)
        for (size_t i = 0; i < sizeof DEFAULT_SCHEMES / sizeof DEFAULT_SCHEMES[0]; i++) {
            nl_quant_spec_parse(DEFAULT_SCHEMES[i], &a->specs[a->ns]);
            a->schemes.v[a->ns++] = DEFAULT_SCHEMES[i];
        }
    return 0;
}

static int qm_print(const qm_args *a, const qrow *rows, int nrows, int64_t n, size_t fp32_linear) {
    nl_report *r = nl_report_new("quant model");
    nl_report_str(r, "checkpoint", "", a->model.ckpt);
    nl_report_str(r, "data", "", a->data);
    nl_report_int(r, "tokens", "", n, NULL);
    nl_report_str(r, "prompt", "", a->prompt);
    nl_report_int(r, "fp32_linear_bytes", "", (long long)fp32_linear, NULL);
    if (a->out) nl_report_str(r, "out", "", a->out);
    nl_report_note(r, "%s on %s (%lld tokens); greedy: first %lld tokens after \"%s\"", a->model.ckpt, a->data,
                   (long long)n, (long long)a->n_gen, a->prompt);
    nl_report_table(r, "schemes", NULL, 13,
                    (const nl_report_col[]){{"scheme", "scheme", NULL},
                                            {"mode", "mode", NULL},
                                            {"linear_bytes", "linear bytes", "%-.0f"},
                                            {"model_bytes", "model bytes", "%-.0f"},
                                            {"linear_compression", "linear x smaller", "%-.2f"},
                                            {"mean_loss", "mean loss", "%-.4f"},
                                            {"delta_loss", "d loss", "%-+.4f"},
                                            {"delta_loss_rel", "", NULL},
                                            {NULL, "d loss %", "%-+.2f"},
                                            {"greedy_tokens", "", NULL},
                                            {"greedy_shared_with_first", "", NULL},
                                            {NULL, "greedy same", NULL},
                                            {"greedy_text", "", NULL}});
    for (int i = 0; i < nrows; i++) {
        const qrow *q = &rows[i];
        double gen[NL_QEVAL_MAX_GEN];
        char same[32];
        for (int k = 0; k < q->n_gen; k++) gen[k] = q->gen[k];
        snprintf(same, sizeof same, "%d/%d", q->shared, q->n_gen);
        nl_report_cell_str(r, q->scheme);
        nl_report_cell_str(r, q->mode);
        nl_report_cell_int(r, (long long)q->linear_bytes);
        nl_report_cell_int(r, (long long)q->model_bytes);
        nl_report_cell_num(r, (double)fp32_linear / (double)q->linear_bytes);
        nl_report_cell_num(r, q->loss);
        nl_report_cell_num(r, q->loss - rows[0].loss);
        nl_report_cell_num(r, (q->loss - rows[0].loss) / rows[0].loss);
        nl_report_cell_num(r, 100.0 * (q->loss - rows[0].loss) / rows[0].loss);
        nl_report_cell_nums(r, gen, q->n_gen);
        nl_report_cell_int(r, q->shared);
        nl_report_cell_str(r, same);
        nl_report_cell_str(r, q->text);
        nl_report_row_end(r);
    }
    nl_report_note(r, "%s", "");
    for (int i = 0; i < nrows; i++) nl_report_note(r, "%-14s %s|%s", rows[i].scheme, a->prompt, rows[i].text);
    if (a->out) nl_report_note(r, "\nwrote %s", a->out);
    return nl_report_print(r, a->json);
}

int nl_cmd_quant_model(int argc, char **argv) {
    qm_args a;
    int rcode = qm_parse(argc, argv, &a);
    if (rcode) return rcode == NL_CLI_HELP ? NL_EXIT_OK : rcode;
    nl_model m;
    nl_tokenizer tok;
    nl_qmodel lq;
    int loaded_q;
    char tkind[64];
    if (nl_qmodel_open(a.model.ckpt, a.model.tokenizer, NL_CLI_MAX_SEQ, &m, &tok, &lq, &loaded_q, tkind))
        return nl_cli_fail("quant model");
    nl_qeval_input in = {.B = a.B, .T = a.T ? a.T : m.arch.seq_len, .n_gen = (int)a.n_gen};
    const nl_qlinear_mode mode = a.mode_i ? NL_QLINEAR_WEIGHT_ONLY : NL_QLINEAR_W8A8;
    qrow *rows = nl_calloc((size_t)a.ns + 1, sizeof(qrow), "result rows");
    if (!rows) {
        rcode = nl_cli_fail("quant model");
        goto done;
    }
    if (in.T > m.arch.seq_len) {
        rcode = nl_cli_usage_error("quant model: --seq %lld exceeds the model's seq_len %lld", (long long)in.T,
                                   (long long)m.arch.seq_len);
        goto done;
    }
    for (int s = 0; s < a.ns && !loaded_q; s++)
        if (a.mode_set && mode == NL_QLINEAR_W8A8 && !nl_qmodel_w8a8_ok(&a.specs[s])) {
            rcode = nl_cli_usage_error("quant model: --mode w8a8 needs --scheme int8-channel, not %s", a.schemes.v[s]);
            goto done;
        }
    if (nl_qeval_input_load(&tok, a.data, a.prompt, a.max_tokens, &in)) {
        rcode = nl_cli_fail("quant model");
        goto done;
    }
    if (in.np < 1 || in.np >= m.arch.seq_len) {
        rcode = nl_cli_usage_error("quant model: --prompt must be 1..seq_len-1 tokens");
        goto done;
    }
    int nrows = 0;
    /* Row 0: the model as loaded (fp32, or the quantized checkpoint). */
    if (nl_model_alloc_acts(&m, a.B, in.T) ||
        nl_quant_eval_loaded(&m, loaded_q ? &lq : NULL, &tok, &in, &rows[nrows++])) {
        rcode = nl_cli_fail("quant model");
        goto done;
    }
    size_t fp32_linear = 0;
    nl_qmodel_size_bytes(&m, NULL, &fp32_linear);
    for (int s = 0; s < a.ns && !loaded_q; s++)
        if (nl_quant_eval_scheme(&m, &a.specs[s], mode, &tok, &in, a.out, tkind, &rows[nrows++])) {
            rcode = nl_cli_fail("quant model");
            goto done;
        }
    nl_quant_eval_shared(rows, nrows);
    rcode = qm_print(&a, rows, nrows, in.n, fp32_linear);
done:
    nl_free(rows);
    nl_qeval_input_free(&in);
    nl_tokenizer_free(&tok);
    nl_qmodel_free(&lq);
    nl_model_free(&m);
    return rcode;
}
