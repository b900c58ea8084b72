/* nanolm generate: continue a prompt token by token with the KV cache (llama2.c's `run`). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_model.h"

int nl_cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'}, {"prompt", required_argument, 0, 'p'},
        {"steps", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 't'},
        {"seed", required_argument, 0, 's'}, {"tokenizer", required_argument, 0, 'k'},
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {"kv-cache", required_argument, 0, 'v'},
        {0, 0, 0, 0}};
    const char *ckpt = NULL, *prompt = "", *tok_path = NULL;
    int64_t steps = 256, seed = 1337;
    double temperature = 1.0;
    int json = 0, c, kv = NL_KV_FP32;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'n': if (nl_cli_int("--steps", optarg, 1, 1 << 24, &steps)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--seed", optarg, 0, INT64_MAX, &seed)) return NL_EXIT_USAGE; break;
        case 't':
            if (nl_cli_double("--temperature", optarg, &temperature)) return NL_EXIT_USAGE;
            if (temperature < 0) return nl_cli_usage_error("--temperature must be >= 0, got %s", optarg);
            break;
        case 'j': json = 1; break;
        case 'v':
            if (!strcmp(optarg, "fp32")) kv = NL_KV_FP32;
            else if (!strcmp(optarg, "int8")) kv = NL_KV_INT8;
            else return nl_cli_usage_error("generate: unknown --kv-cache '%s' (known: fp32, int8)", optarg);
            break;
        case 'h':
            printf("usage: nanolm generate --ckpt F --prompt TEXT [--steps N] [--temperature T] [--seed S]\n"
                   "                       [--tokenizer tok512.bin] [--kv-cache fp32|int8] [--json]\n"
                   "  --steps counts positions including the prompt (as llama2.c's run), at most seq_len.\n"
                   "  --temperature 0 is greedy. --tokenizer is needed for llama2.c .bin checkpoints.\n"
                   "  --kv-cache int8: K and V stored as int8 per head and token (absmax, fp16 scales).\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("generate", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("generate: unexpected argument '%s'", argv[optind]);
    if (!ckpt) return nl_cli_usage_error("generate: --ckpt F is required");
    nl_model m;
    nl_tokenizer tok;
    if (nl_cli_load_model(ckpt, tok_path, &m, &tok)) return nl_cli_fail("generate");
    int rcode = NL_EXIT_OK;
    int *ids = NULL;
    int64_t n = 0;
    cJSON *out_tokens = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    if (nl_tokenizer_encode(&tok, prompt, strlen(prompt), 1, 0, &ids, &n)) { rcode = nl_cli_fail("generate"); goto done; }
    if (n < 1) { rcode = nl_cli_usage_error("generate: --prompt is empty (the byte tokenizer needs at least one byte)"); goto done; }
    if (n > m.arch.seq_len) {
        rcode = nl_cli_usage_error("generate: the prompt is %lld tokens, longer than the model's seq_len %lld", (long long)n,
                                   (long long)m.arch.seq_len);
        goto done;
    }
    if (steps > m.arch.seq_len) steps = m.arch.seq_len;
    if (nl_model_alloc_kv_dtype(&m, (nl_kv_dtype)kv)) { rcode = nl_cli_fail("generate"); goto done; }
    nl_rng rng;
    nl_rng_seed(&rng, (uint64_t)seed);
    if (json) out_tokens = cJSON_CreateArray();
    int token = ids[0];
    if (tok.bos_id < 0) { /* no BOS (byte-level): the first prompt token is text too */
        size_t len;
        const char *piece = nl_tokenizer_piece(&tok, -1, token, &len);
        if (json && out_tokens) cJSON_AddItemToArray(out_tokens, cJSON_CreateNumber(token));
        if (piece && !json) nl_tokenizer_print_piece(stdout, piece, len);
        if (piece && json) {
            text_cap = len + 256;
            text = nl_malloc(text_cap, "generated text");
            if (!text) { rcode = nl_cli_fail("generate"); goto done; }
            memcpy(text, piece, len);
            text_len = len;
            text[len] = 0;
        }
    }
    double t0 = nl_time_s();
    int64_t pos = 0, generated = 0;
    while (pos < steps) {
        float *logits = nl_model_step(&m, token, pos);
        int next;
        if (pos < n - 1) next = ids[pos + 1];
        else {
            next = nl_model_sample(logits, m.V, (float)temperature, &rng);
            generated++;
        }
        pos++;
        if (tok.bos_id >= 0 && next == tok.bos_id) break;
        size_t len;
        const char *piece = nl_tokenizer_piece(&tok, token, next, &len);
        if (!piece) { rcode = nl_cli_fail("generate"); goto done; }
        if (json) {
            cJSON_AddItemToArray(out_tokens, cJSON_CreateNumber(next));
            if (nl_tokenizer_piece_printable(piece, len)) {
                if (text_len + len + 1 > text_cap) {
                    text_cap = 2 * (text_len + len + 1) + 256;
                    char *nt = nl_malloc(text_cap, "generated text");
                    if (!nt) { rcode = nl_cli_fail("generate"); goto done; }
                    if (text) memcpy(nt, text, text_len);
                    nl_free(text);
                    text = nt;
                }
                memcpy(text + text_len, piece, len);
                text_len += len;
                text[text_len] = 0;
            }
        } else {
            nl_tokenizer_print_piece(stdout, piece, len);
            fflush(stdout);
        }
        token = next;
    }
    double dt = nl_time_s() - t0;
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON *pt = cJSON_AddArrayToObject(d, "prompt_tokens");
        for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(pt, cJSON_CreateNumber(ids[i]));
        cJSON_AddItemToObject(d, "tokens", out_tokens);
        out_tokens = NULL;
        cJSON_AddStringToObject(d, "text", text ? text : "");
        cJSON_AddNumberToObject(d, "generated", (double)generated);
        cJSON_AddNumberToObject(d, "tokens_per_s", dt > 0 ? (double)pos / dt : 0);
        cJSON_AddStringToObject(d, "kv_cache", kv == NL_KV_INT8 ? "int8" : "fp32");
        cJSON_AddNumberToObject(d, "kv_cache_bytes", (double)m.kv_bytes);
        nl_cli_print_json(d);
    } else {
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "generate: %lld positions, %.1f tokens/s, %s KV cache %zu bytes\n", (long long)pos,
                dt > 0 ? (double)pos / dt : 0.0, kv == NL_KV_INT8 ? "int8" : "fp32", m.kv_bytes);
    }
done:
    cJSON_Delete(out_tokens);
    nl_free(text);
    nl_free(ids);
    nl_tokenizer_free(&tok);
    nl_model_free(&m);
    return rcode;
}
