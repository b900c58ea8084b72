/* nanolm eval: mean loss, perplexity and tokens of a model on a text file. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"
#include "nanolm/lossstat.h"
#include "nanolm/train.h"

int nl_cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'}, {"data", required_argument, 0, 'd'},
        {"tokenizer", required_argument, 0, 'k'}, {"batch", required_argument, 0, 'b'},
        {"seq", required_argument, 0, 's'}, {"split", required_argument, 0, 'p'}, {"target-se", required_argument, 0, 't'}, {"se-batch", required_argument, 0, 'w'}, {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
        {"kv-cache", required_argument, 0, 'v'}, {"max-windows", required_argument, 0, 'x'}, {0, 0, 0, 0}};
    const char *ckpt = NULL, *path = NULL, *tok_path = NULL;
    int64_t B = 4, T = 0, se_batch = 0, max_windows = 0;
    int kv = -1; /* -1: batched forward; else nl_kv_dtype, token by token through the KV cache */
    double target_se = 0;
    int json = 0, c;
    nl_data_split split = NL_DATA_ALL;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': path = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'b': if (nl_cli_int("--batch", optarg, 1, 4096, &B)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--seq", optarg, 1, 1 << 20, &T)) return NL_EXIT_USAGE; break;
        case 'p':
            if (!strcmp(optarg, "all")) split = NL_DATA_ALL;
            else if (!strcmp(optarg, "train")) split = NL_DATA_TRAIN;
            else if (!strcmp(optarg, "val")) split = NL_DATA_VAL;
            else return nl_cli_usage_error("eval: unknown --split '%s' (known: all, train, val)", optarg);
            break;
        case 't':
            if (nl_cli_double("--target-se", optarg, &target_se)) return NL_EXIT_USAGE;
            if (!(target_se > 0)) return nl_cli_usage_error("eval: --target-se must be > 0, got '%s'", optarg);
            break;
        case 'w': if (nl_cli_int("--se-batch", optarg, 1, INT64_MAX, &se_batch)) return NL_EXIT_USAGE; break;
        case 'j': json = 1; break;
        case 'v':
            if (!strcmp(optarg, "fp32")) kv = NL_KV_FP32;
            else if (!strcmp(optarg, "int8")) kv = NL_KV_INT8;
            else return nl_cli_usage_error("eval: unknown --kv-cache '%s' (known: fp32, int8)", optarg);
            break;
        case 'x': if (nl_cli_int("--max-windows", optarg, 1, INT64_MAX, &max_windows)) return NL_EXIT_USAGE; break;
        case 'h':
            printf("usage: nanolm eval --ckpt F --data FILE [--tokenizer tok512.bin] [--batch B] [--seq T]\n"
                   "                   [--split all|train|val] [--target-se X] [--se-batch TOKENS] [--json]\n"
                   "                   [--kv-cache fp32|int8] [--max-windows N]\n"
                   "  Mean cross-entropy (nats/token) over the whole file (tokenized once, BOS first) in\n"
                   "  consecutive windows of --seq tokens; a last partial window is dropped. --split val: only\n"
                   "  the last 10%% of the tokens (the validation split of nanolm train).\n"
                   "  --seq defaults to the model's seq_len. --tokenizer is needed for llama2.c .bin checkpoints.\n"
                   "  Standard error by batch means: the token stream is cut into consecutive batches of\n"
                   "  --se-batch tokens (default sqrt(tokens)) whose means are nearly independent, so the SE\n"
                   "  and 95%% interval account for correlated neighbouring tokens. --target-se X: tokens needed\n"
                   "  for SE = X (same per-token long-run variance).\n"
                   "  With a llama2.c tokenizer the batched eval also splits the mean between non-ASCII\n"
                   "  byte-fallback targets (<0x80>..<0xFF>: UTF-8 bytes no piece covers, e.g. mis-encoded\n"
                   "  text such as 'â€™') and the rest.\n"
                   "  --kv-cache runs the generation path instead: token by token through a KV cache of fp32 or\n"
                   "  int8 (per head, per token absmax, fp16 scales), each window from an empty cache; prints the\n"
                   "  bytes of the cache as allocated (no standard error). --max-windows N: only the first N windows.\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("eval", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("eval: unexpected argument '%s'", argv[optind]);
    if (!ckpt || !path) return nl_cli_usage_error("eval: --ckpt F and --data FILE are required");
    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) return nl_cli_fail("eval");
    int rcode = NL_EXIT_OK;
    nl_data data;
    memset(&data, 0, sizeof data);
    int64_t scored = 0;
    double loss = 0;
    float *tl = NULL;
    nl_loss_stats st;
    memset(&st, 0, sizeof st);
    if (T == 0 || T > m.arch.seq_len) T = T == 0 ? m.arch.seq_len : T;
    if (T > m.arch.seq_len) {
        rcode = nl_cli_usage_error("eval: --seq %lld exceeds the model's seq_len %lld", (long long)T, (long long)m.arch.seq_len);
        goto done;
    }
    if (kv >= 0 && (se_batch || target_se > 0)) {
        rcode = nl_cli_usage_error("eval: --se-batch/--target-se apply to the batched eval, not --kv-cache");
        goto done;
    }
    if (kv >= 0 ? (nl_data_open(&data, path, &tok) || nl_model_alloc_kv_dtype(&m, (nl_kv_dtype)kv) ||
                   nl_eval_loss_kv(&m, &data, split, T, max_windows, &loss, &scored))
                : (nl_data_open(&data, path, &tok) || nl_model_alloc_acts(&m, B, T) ||
                   nl_eval_token_losses(&m, &data, split, B, T, max_windows, &tl, &scored) ||
                   nl_loss_stats_compute(tl, scored, se_batch, &st))) {
        rcode = nl_cli_fail("eval");
        goto done;
    }
    /* Non-ASCII byte-fallback targets (llama2.c pieces <0x80>..<0xFF>, ids 3+128..258; ASCII
     * fallbacks such as <0x0A> for a newline are ordinary text): loss i predicts token
     * split_begin + i + 1 (window w covers tokens wT .. wT+T of the split). */
    int64_t n_fb = 0;
    double sum_fb = 0, sum_all = 0;
    if (kv < 0) {
        const int *tgt = data.tokens + nl_data_split_begin(&data, split) + 1;
        for (int64_t i = 0; i < scored; i++) {
            sum_all += tl[i];
            if (tok.kind == NL_TOKENIZER_LLAMA2C && tgt[i] >= 3 + 128 && tgt[i] <= 258) {
                n_fb++;
                sum_fb += tl[i];
            }
        }
        loss = sum_all / (double)scored; /* all tokens; st.mean drops a last partial SE batch */
    }
    int show_fb = kv < 0 && tok.kind == NL_TOKENIZER_LLAMA2C;
    double fb_mean = n_fb ? sum_fb / (double)n_fb : 0;
    double rest_mean = scored > n_fb ? (sum_all - sum_fb) / (double)(scored - n_fb) : 0;
    double need = target_se > 0 ? nl_loss_stats_tokens_for_se(&st, target_se) : 0;
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "checkpoint", ckpt);
        cJSON_AddStringToObject(d, "data", path);
        cJSON_AddStringToObject(d, "split", nl_data_split_name(split));
        cJSON_AddNumberToObject(d, "mean_loss", loss);
        cJSON_AddNumberToObject(d, "perplexity", exp(loss));
        cJSON_AddNumberToObject(d, "tokens", (double)scored);
        cJSON_AddNumberToObject(d, "seq", (double)T);
        if (kv >= 0) {
            cJSON_AddStringToObject(d, "kv_cache", kv == NL_KV_INT8 ? "int8" : "fp32");
            cJSON_AddNumberToObject(d, "kv_cache_bytes", (double)m.kv_bytes);
            cJSON_AddNumberToObject(d, "kv_cache_bytes_fp16_basis", (double)(m.L * 2 * m.arch.seq_len * m.KVH * m.hd * 2));
        } else {
        cJSON_AddNumberToObject(d, "se", st.se);
        cJSON_AddNumberToObject(d, "se_iid", st.se_iid);
        cJSON_AddNumberToObject(d, "ci95_lo", st.ci_lo);
        cJSON_AddNumberToObject(d, "ci95_hi", st.ci_hi);
        cJSON_AddNumberToObject(d, "se_batch_tokens", (double)st.batch);
        cJSON_AddNumberToObject(d, "se_tokens_used", (double)st.n);
        if (show_fb) {
            cJSON_AddNumberToObject(d, "non_ascii_byte_tokens", (double)n_fb);
            cJSON_AddNumberToObject(d, "non_ascii_byte_mean_loss", fb_mean);
            cJSON_AddNumberToObject(d, "other_tokens_mean_loss", rest_mean);
        }
        if (target_se > 0) {
            cJSON_AddNumberToObject(d, "target_se", target_se);
            cJSON_AddNumberToObject(d, "tokens_for_target_se", need);
        }
        }
        nl_cli_print_json(d);
    } else {
        const char *hdr[] = {"checkpoint", "data", "tokens", "mean loss (nats/token)", "perplexity"};
        nl_table tb;
        nl_table_init(&tb, 5, hdr);
        nl_table_rowf(&tb, "%s|%s|%lld|%.4f|%.3f", ckpt, path, (long long)scored, loss, exp(loss));
        nl_table_print(&tb, stdout);
        nl_table_free(&tb);
        if (kv >= 0)
            printf("KV cache %s: %zu bytes allocated for %lld positions (fp32 would be %lld, fp16 %lld)\n",
                   kv == NL_KV_INT8 ? "int8" : "fp32", m.kv_bytes, (long long)m.arch.seq_len,
                   (long long)(m.L * 2 * m.arch.seq_len * m.KVH * m.hd * 4), (long long)(m.L * 2 * m.arch.seq_len * m.KVH * m.hd * 2));
        else
        printf("standard error %.4f (i.i.d. formula %.4f; correlation costs x%.1f tokens), 95%% interval [%.4f, %.4f]\n"
               "  batch means over %lld batches of %lld tokens\n",
               st.se, st.se_iid, st.ess_factor, st.ci_lo, st.ci_hi, (long long)st.n_batches, (long long)st.batch);
        if (show_fb)
            printf("non-ASCII byte-fallback targets (<0x80>..<0xFF>): %lld of %lld (%.2f%%), mean loss %.4f, adding %.4f "
                   "nats/token to the mean; the other tokens: mean loss %.4f\n",
                   (long long)n_fb, (long long)scored, 100.0 * (double)n_fb / (double)scored, fb_mean,
                   sum_fb / (double)scored, rest_mean);
        if (target_se > 0) printf("tokens for standard error %g: %.0f\n", target_se, need);
    }
done:
    nl_free(tl);
    nl_data_free(&data);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return rcode;
}
