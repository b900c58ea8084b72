/* nanolm generate: continue a prompt (llama2.c's `run`), as one request of the serving engine. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "nanolm/engine.h"

/* Appends a piece to the JSON text buffer. */
static int text_add(char **text, size_t *len, size_t *cap, const char *piece, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = 2 * (*len + n + 1) + 256;
        char *t = nl_malloc(nc, "generated text");
        if (!t) return 1;
        if (*text) memcpy(t, *text, *len);
        nl_free(*text);
        *text = t;
        *cap = nc;
    }
    memcpy(*text + *len, piece, n);
    *len += n;
    (*text)[*len] = 0;
    return 0;
}

int nl_cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {
        {"ckpt", required_argument, 0, 'c'}, {"prompt", required_argument, 0, 'p'},
        {"steps", required_argument, 0, 'n'}, {"temperature", required_argument, 0, 't'},
        {"seed", required_argument, 0, 's'}, {"tokenizer", required_argument, 0, 'k'},
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {"kv-cache", required_argument, 0, 'v'},
        {"weights", required_argument, 0, 'w'}, {"top-k", required_argument, 0, 'K'},
        {"top-p", required_argument, 0, 'P'}, {"stop", required_argument, 0, 'S'},
        {"threads", required_argument, 0, 'T'}, {0, 0, 0, 0}};
    const char *ckpt = NULL, *prompt = "", *tok_path = NULL;
    int64_t steps = 256, seed = 1337, top_k = 0, threads = 0;
    double temperature = 1.0, top_p = 1.0;
    int json = 0, c;
    nl_engine_opts eo;
    nl_engine_opts_default(&eo);
    nl_sampling smp;
    nl_sampling_default(&smp);
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'p': prompt = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'n': if (nl_cli_int("--steps", optarg, 1, 1 << 24, &steps)) return NL_EXIT_USAGE; break;
        case 's': if (nl_cli_int("--seed", optarg, 0, INT64_MAX, &seed)) return NL_EXIT_USAGE; break;
        case 'K': if (nl_cli_int("--top-k", optarg, 0, 1 << 30, &top_k)) return NL_EXIT_USAGE; break;
        case 'T': if (nl_cli_int("--threads", optarg, 0, 4096, &threads)) return NL_EXIT_USAGE; break;
        case 't':
            if (nl_cli_double("--temperature", optarg, &temperature)) return NL_EXIT_USAGE;
            if (!(temperature >= 0) || !isfinite(temperature))
                return nl_cli_usage_error("--temperature must be >= 0, got %s", optarg);
            break;
        case 'P':
            if (nl_cli_double("--top-p", optarg, &top_p)) return NL_EXIT_USAGE;
            if (!(top_p > 0 && top_p <= 1)) return nl_cli_usage_error("--top-p must be in (0, 1], got %s", optarg);
            break;
        case 'S':
            if (nl_sampling_add_stop(&smp, optarg)) return nl_cli_usage_error("generate: --stop: %s", nl_last_error());
            break;
        case 'j': json = 1; break;
        case 'v':
            if (!strcmp(optarg, "fp32")) eo.kv = NL_KV_FP32;
            else if (!strcmp(optarg, "int8")) eo.kv = NL_KV_INT8;
            else return nl_cli_usage_error("generate: unknown --kv-cache '%s' (known: fp32, int8)", optarg);
            break;
        case 'w':
            if (nl_wfmt_parse(optarg, &eo.weights)) return nl_cli_usage_error("generate: --weights: %s", nl_last_error());
            break;
        case 'h':
            printf("usage: nanolm generate --ckpt F --prompt TEXT [--steps N] [--temperature T] [--seed S]\n"
                   "                       [--top-k K] [--top-p P] [--stop TEXT ...] [--tokenizer tok512.bin]\n"
                   "                       [--weights auto|fp32|bf16|int8] [--kv-cache fp32|int8] [--threads N] [--json]\n"
                   "  --steps counts positions including the prompt (as llama2.c's run), at most seq_len.\n"
                   "  --temperature 0 is greedy. --tokenizer is needed for llama2.c .bin checkpoints.\n"
                   "  Runs as one request of the serving engine (see docs/serving.md). --ckpt may be a\n"
                   "  quantized checkpoint written by `nanolm quant model --out` (int8 per channel runs on\n"
                   "  the int8 kernels). --weights: decode weight format (auto: fp32, or int8 for such a\n"
                   "  checkpoint). --kv-cache int8: K and V stored as int8 per head and token (absmax, fp16\n"
                   "  scales). --stop ends the text before the first occurrence of TEXT (up to 4).\n");
            return NL_EXIT_OK;
        default: return nl_cli_bad_option("generate", argv);
        }
    }
    if (optind < argc) return nl_cli_usage_error("generate: unexpected argument '%s'", argv[optind]);
    if (!ckpt) return nl_cli_usage_error("generate: --ckpt F is required");
    eo.max_batch = 1;
    eo.max_waiting = 1;
    eo.threads = (int)threads;
    nl_engine *e = NULL;
    /* the pool holds one whole context (the contiguous cache's size) */
    eo.kv_blocks = 0;
    if (nl_engine_open(&e, ckpt, tok_path, &eo)) return nl_cli_fail("generate");
    const nl_tokenizer *tok = nl_engine_tokenizer(e);
    const nl_arch *arch = nl_engine_arch(e);
    int rcode = NL_EXIT_OK;
    int32_t *ids = NULL;
    int64_t n = 0;
    cJSON *out_tokens = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    uint64_t id = 0;
    if (nl_engine_encode(e, prompt, strlen(prompt), &ids, &n)) { rcode = nl_cli_fail("generate"); goto done; }
    if (n < 1) { rcode = nl_cli_usage_error("generate: --prompt is empty (the byte tokenizer needs at least one byte)"); goto done; }
    if (n > arch->seq_len) {
        rcode = nl_cli_usage_error("generate: the prompt is %lld tokens, longer than the model's seq_len %lld", (long long)n,
                                   (long long)arch->seq_len);
        goto done;
    }
    if (steps > arch->seq_len) steps = arch->seq_len;
    if (json) out_tokens = cJSON_CreateArray();
    /* The text: the prompt's tokens after the first (all of them without BOS), up to --steps
     * positions, then what the engine generates: steps - n + 1 tokens, the last position's
     * sample included (llama2.c's run prints steps tokens after the first). */
    for (int64_t i = tok->bos_id < 0 ? 0 : 1; i < n && i <= steps; i++) {
        size_t len;
        const char *piece = nl_tokenizer_piece(tok, i > 0 ? ids[i - 1] : -1, ids[i], &len);
        if (!piece) { rcode = nl_cli_fail("generate"); goto done; }
        if (json) {
            cJSON_AddItemToArray(out_tokens, cJSON_CreateNumber(ids[i]));
            if (nl_tokenizer_piece_printable(piece, len) && text_add(&text, &text_len, &text_cap, piece, len)) {
                rcode = nl_cli_fail("generate");
                goto done;
            }
        } else {
            nl_tokenizer_print_piece(stdout, piece, len);
        }
    }
    if (!json) fflush(stdout);
    int32_t prev = ids[n - 1];
    double t0 = nl_time_s();
    int64_t generated = 0, positions = steps < n ? steps : 0;
    if (steps >= n) {
        smp.temperature = (float)temperature;
        smp.top_k = (int)top_k;
        smp.top_p = (float)top_p;
        smp.seed = (uint64_t)seed;
        smp.max_tokens = steps - n + 1;
        smp.ignore_eos = 1; /* llama2.c models end a story with BOS */
        if (nl_engine_submit(e, ids, n, &smp, &id)) { rcode = nl_cli_fail("generate"); goto done; }
        nl_finish fin = NL_FINISH_NONE;
        while (fin == NL_FINISH_NONE) {
            if (nl_engine_step(e, NULL)) { rcode = nl_cli_fail("generate"); goto done; }
            nl_engine_output o;
            if (nl_engine_read(e, id, 0, &o)) { rcode = nl_cli_fail("generate"); goto done; }
            fin = o.finish;
            generated += o.n_tokens;
            for (int64_t i = 0; i < o.n_tokens; i++) {
                int32_t next = o.tokens[i];
                if (tok->bos_id >= 0 && next == tok->bos_id) break;
                size_t len;
                const char *piece = nl_tokenizer_piece(tok, (int)prev, next, &len);
                if (!piece) break;
                if (json) {
                    cJSON_AddItemToArray(out_tokens, cJSON_CreateNumber(next));
                    if (nl_tokenizer_piece_printable(piece, len)) text_add(&text, &text_len, &text_cap, piece, len);
                } else {
                    nl_tokenizer_print_piece(stdout, piece, len);
                }
                prev = next;
            }
            if (!json) fflush(stdout);
            if (fin == NL_FINISH_ERROR) {
                if (!json) printf("\n");
                fflush(stdout);
                nl_fail(NL_ERR_NUMERIC, "%s: %s", ckpt, o.error);
                nl_engine_output_free(&o);
                rcode = nl_cli_fail("generate");
                goto done;
            }
            nl_engine_output_free(&o);
        }
        positions = n - 1 + generated;
    }
    double dt = nl_time_s() - t0;
    nl_engine_stats st;
    nl_engine_stats_get(e, &st);
    size_t kv_bytes = (size_t)st.kv_blocks_total * st.kv_block_bytes;
    const char *kvname = eo.kv == NL_KV_INT8 ? "int8" : "fp32";
    if (json) {
        cJSON *d = cJSON_CreateObject();
        cJSON *pt = cJSON_AddArrayToObject(d, "prompt_tokens");
        for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(pt, cJSON_CreateNumber(ids[i]));
        cJSON_AddItemToObject(d, "tokens", out_tokens);
        out_tokens = NULL;
        cJSON_AddStringToObject(d, "text", text ? text : "");
        cJSON_AddNumberToObject(d, "generated", (double)generated);
        cJSON_AddNumberToObject(d, "tokens_per_s", dt > 0 ? (double)positions / dt : 0);
        cJSON_AddStringToObject(d, "weights", nl_wfmt_name(nl_engine_weights(e)));
        cJSON_AddNumberToObject(d, "weight_bytes", (double)st.weight_bytes);
        cJSON_AddStringToObject(d, "kv_cache", kvname);
        cJSON_AddNumberToObject(d, "kv_cache_bytes", (double)kv_bytes);
        nl_cli_print_json(d);
    } else {
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "generate: %lld positions, %.1f tokens/s, %s weights, %s KV cache %zu bytes\n", (long long)positions,
                dt > 0 ? (double)positions / dt : 0.0, nl_wfmt_name(nl_engine_weights(e)), kvname, kv_bytes);
    }
done:
    cJSON_Delete(out_tokens);
    nl_free(text);
    nl_free(ids);
    nl_engine_close(e);
    return rcode;
}
