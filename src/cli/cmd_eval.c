/* nanolm eval: mean loss, perplexity and tokens of a model on a text file. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "cli_opt.h"
#include "nanolm/lossstat.h"
#include "nanolm/train.h"
#include "report.h"

/* What eval measured (nanolm/lossstat.h) and what it measured it on. */
typedef struct eval_result {
    const char *ckpt, *path;
    nl_data_split split;
    int64_t T;
    int kv; /* -1: batched eval; else the nl_kv_dtype of the cache */
    double target_se;
    nl_eval_summary e;
} eval_result;

/* The result, once: the table and its lines in the text form, the values in the JSON. */
static int print_eval(const eval_result *x, const nl_model *m, int json) {
    const nl_eval_summary *r = &x->e;
    const long long kv_fp32 = (long long)(m->L * 2 * m->arch.seq_len * m->KVH * m->hd * 4), kv_fp16 = kv_fp32 / 2;
    nl_report *rep = nl_report_new("eval");
    nl_report_str(rep, "checkpoint", "", x->ckpt);
    nl_report_str(rep, "data", "", x->path);
    nl_report_str(rep, "split", "", nl_data_split_name(x->split));
    nl_report_num(rep, "mean_loss", "", r->loss, NULL, NULL);
    nl_report_num(rep, "perplexity", "", exp(r->loss), NULL, NULL);
    nl_report_int(rep, "tokens", "", (long long)r->scored, NULL);
    nl_report_int(rep, "seq", "", (long long)x->T, NULL);
    if (x->kv >= 0) {
        nl_report_str(rep, "kv_cache", "", x->kv == NL_KV_INT8 ? "int8" : "fp32");
        nl_report_int(rep, "kv_cache_bytes", "", (long long)r->kv_bytes, NULL);
        nl_report_int(rep, "kv_cache_bytes_fp16_basis", "", kv_fp16, NULL);
    } else {
        nl_report_num(rep, "se", "", r->st.se, NULL, NULL);
        nl_report_num(rep, "se_iid", "", r->st.se_iid, NULL, NULL);
        nl_report_num(rep, "ci95_lo", "", r->st.ci_lo, NULL, NULL);
        nl_report_num(rep, "ci95_hi", "", r->st.ci_hi, NULL, NULL);
        nl_report_int(rep, "se_batch_tokens", "", (long long)r->st.batch, NULL);
        nl_report_int(rep, "se_tokens_used", "", (long long)r->st.n, NULL);
        if (r->show_fb) {
            nl_report_int(rep, "non_ascii_byte_tokens", "", (long long)r->n_fb, NULL);
            nl_report_num(rep, "non_ascii_byte_mean_loss", "", r->fb_mean, NULL, NULL);
            nl_report_num(rep, "other_tokens_mean_loss", "", r->rest_mean, NULL, NULL);
        }
        if (x->target_se > 0) {
            nl_report_num(rep, "target_se", "", x->target_se, NULL, NULL);
            nl_report_num(rep, "tokens_for_target_se", "", r->need, NULL, NULL);
        }
    }
    nl_report_table(rep, NULL, NULL, 5,
                    (const nl_report_col[]){{NULL, "checkpoint", NULL},
                                            {NULL, "data", NULL},
                                            {NULL, "tokens", NULL},
                                            {NULL, "mean loss (nats/token)", "%-.4f"},
                                            {NULL, "perplexity", "%-.3f"}});
    char tokens[32];
    snprintf(tokens, sizeof tokens, "%lld", (long long)r->scored);
    nl_report_cell_str(rep, x->ckpt);
    nl_report_cell_str(rep, x->path);
    nl_report_cell_str(rep, tokens);
    nl_report_cell_num(rep, r->loss);
    nl_report_cell_num(rep, exp(r->loss));
    nl_report_row_end(rep);
    if (x->kv >= 0)
        nl_report_note(rep, "KV cache %s: %zu bytes allocated for %lld positions (fp32 would be %lld, fp16 %lld)",
                       x->kv == NL_KV_INT8 ? "int8" : "fp32", r->kv_bytes, (long long)m->arch.seq_len, kv_fp32,
                       kv_fp16);
    else
        nl_report_note(rep,
                       "standard error %.4f (i.i.d. formula %.4f; correlation costs x%.1f tokens), 95%% interval "
                       "[%.4f, %.4f]\n  batch means over %lld batches of %lld tokens",
                       r->st.se, r->st.se_iid, r->st.ess_factor, r->st.ci_lo, r->st.ci_hi, (long long)r->st.n_batches,
                       (long long)r->st.batch);
    if (r->show_fb)
        nl_report_note(rep,
                       "non-ASCII byte-fallback targets (<0x80>..<0xFF>): %lld of %lld (%.2f%%), mean loss %.4f, "
                       "adding %.4f nats/token to the mean; the other tokens: mean loss %.4f",
                       (long long)r->n_fb, (long long)r->scored, 100.0 * (double)r->n_fb / (double)r->scored,
                       r->fb_mean, r->sum_fb / (double)r->scored, r->rest_mean);
    if (x->target_se > 0) nl_report_note(rep, "tokens for standard error %g: %.0f", x->target_se, r->need);
    return nl_report_print(rep, json);
}

int nl_cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *path = NULL, *tok_path = NULL;
    int64_t B = 4, T = 0, se_batch = 0, max_windows = 0;
    int kv = -1; /* -1: batched forward; else nl_kv_dtype, token by token through the KV cache */
    int kv_choice = 0, kv_given = 0, split_choice = 0, tse_given = 0;
    double target_se = 0;
    int json = 0;
    nl_opt opts[] = {
        NL_OPT_STR("ckpt", &ckpt, "F",
                   "checkpoint: safetensors from train, a GGUF file, a model folder or a llama2.c .bin (required)"),
        NL_OPT_STR("data", &path, "FILE", "text to evaluate (required)"),
        NL_OPT_STR("tokenizer", &tok_path, "FILE", "llama2.c tokenizer (tok512.bin), needed for .bin checkpoints"),
        NL_OPT_INT("batch", &B, 1, 4096, "B", "windows per forward pass (default 4)"),
        NL_OPT_INT("seq", &T, 1, 1 << 20, "T", "tokens per window (default: the model's seq_len)"),
        NL_OPT_CHOICE("split", &split_choice, "all|train|val",
                      "which tokens: all (default), or the train / val split of nanolm train (last 10%: val)"),
        NL_OPT_DBL("target-se", &target_se, 0, INFINITY, "X", "also report the tokens needed for SE = X (> 0)"),
        NL_OPT_INT("se-batch", &se_batch, 1, INT64_MAX, "TOKENS",
                   "tokens per batch mean of the SE (default sqrt(tokens))"),
        NL_OPT_CHOICE("kv-cache", &kv_choice, "fp32|int8", "token by token through a KV cache of this type instead"),
        NL_OPT_INT("max-windows", &max_windows, 1, INT64_MAX, "N", "only the first N windows"),
        NL_OPT_FLAG("json", &json, "print the result as JSON"),
    };
    opts[6].given = &tse_given;
    opts[8].given = &kv_given;
    nl_optgroup groups[] = {{"options", opts, NL_NOPTS(opts)}};
    nl_cmdspec spec = {
        "eval",
        "nanolm eval --ckpt F --data FILE [options]",
        "Mean cross-entropy (nats/token) over the whole file (tokenized once, BOS first) in consecutive\n"
        "windows of --seq tokens; a last partial window is dropped. Standard error by batch means: the token\n"
        "stream is cut into consecutive batches of --se-batch tokens whose means are nearly independent,\n"
        "so the SE and 95% interval account for correlated neighbouring tokens. With a llama2.c tokenizer\n"
        "the batched eval also splits the mean between non-ASCII byte-fallback targets (<0x80>..<0xFF>:\n"
        "UTF-8 bytes no piece covers, e.g. mis-encoded text such as 'â€™') and the rest. --kv-cache runs\n"
        "the generation path instead: token by token, each window from an empty cache; it prints the\n"
        "bytes of the cache as allocated (no standard error).",
        groups,
        1,
        0};
    int prc = nl_cli_parse(&spec, argc, argv, NULL, NULL);
    if (prc) return prc == NL_CLI_HELP ? NL_EXIT_OK : prc;
    static const nl_data_split splits[] = {NL_DATA_ALL, NL_DATA_TRAIN, NL_DATA_VAL};
    nl_data_split split = splits[split_choice];
    if (kv_given) kv = kv_choice == 0 ? NL_KV_FP32 : NL_KV_INT8;
    if (tse_given && !(target_se > 0)) return nl_cli_usage_error("eval: --target-se must be > 0, got %g", target_se);
    if (!ckpt || !path) return nl_cli_usage_error("eval: --ckpt F and --data FILE are required");
    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) return nl_cli_fail("eval");
    int rcode = NL_EXIT_OK;
    nl_data data;
    memset(&data, 0, sizeof data);
    if (T == 0 || T > m.arch.seq_len) T = T == 0 ? m.arch.seq_len : T;
    if (T > m.arch.seq_len) {
        rcode = nl_cli_usage_error("eval: --seq %lld exceeds the model's seq_len %lld", (long long)T,
                                   (long long)m.arch.seq_len);
        goto done;
    }
    if (kv >= 0 && (se_batch || target_se > 0)) {
        rcode = nl_cli_usage_error("eval: --se-batch/--target-se apply to the batched eval, not --kv-cache");
        goto done;
    }
    eval_result res = {ckpt, path, split, T, kv, target_se, {0}};
    if (nl_data_open(&data, path, &tok) || nl_eval_summary_run(&m, &data, tok.kind == NL_TOKENIZER_LLAMA2C, split, B, T,
                                                               kv, max_windows, se_batch, target_se, &res.e)) {
        rcode = nl_cli_fail("eval");
        goto done;
    }
    rcode = print_eval(&res, &m, json);
done:
    nl_data_free(&data);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return rcode;
}
